//! The driver fed from a handle's caller (see `crate::driver`): a caller that gives up
//! cancels nothing, and a release queued by a drop is fed before the next command.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep, timeout};

use crate::timing_tests::settings;
use crate::{Acquired, Fault, Lease, LeaseSpec, LeaseStore, MemoryStore};

async fn lease(store: &MemoryStore, owner: &str) -> Lease {
    let store: Arc<dyn LeaseStore> = Arc::new(store.clone());
    Lease::start(LeaseSpec::new("driven", owner, store, settings()).unwrap())
        .await
        .unwrap()
}

async fn holder(store: &MemoryStore) -> Option<(String, crate::FencingToken)> {
    store
        .read("driven")
        .await
        .unwrap()
        .map(|r| (r.owner, r.token))
}

#[tokio::test(start_paused = true)]
async fn an_acquire_whose_caller_gave_up_goes_on_and_its_grant_is_believed() {
    let store = MemoryStore::new();
    let lease = lease(&store, "a").await;
    store.set_fault(Fault::Delay(Duration::from_millis(300)));
    assert!(
        timeout(Duration::from_millis(100), lease.acquire())
            .await
            .is_err(),
        "the caller gives up before the store answers"
    );
    // The store call goes on without its caller and its answer is fed to the machine.
    sleep(Duration::from_millis(400)).await;
    store.set_fault(Fault::None);
    let (owner, token) = holder(&store).await.expect("granted in the store");
    assert_eq!(owner, "a");
    assert!(
        lease.check_lease(),
        "the grant the caller never saw is believed"
    );
    assert_eq!(lease.token(), Some(token));
    // The machine is not left waiting for an answer: the next acquire re-enters at once.
    let again = timeout(Duration::from_secs(5), lease.acquire())
        .await
        .expect("the next acquire is answered")
        .unwrap();
    assert_eq!(again, Acquired::Granted { token });
    assert!(lease.release().await.unwrap());
    assert_eq!(holder(&store).await, None);
}

#[tokio::test(start_paused = true)]
async fn a_release_whose_caller_gave_up_before_its_turn_is_still_carried_out() {
    let store = MemoryStore::new();
    let lease = lease(&store, "a").await;
    store.set_fault(Fault::Delay(Duration::from_millis(300)));
    let acquiring = tokio::spawn({
        let lease = lease.clone();
        async move { lease.acquire().await }
    });
    sleep(Duration::from_millis(50)).await;
    // The acquire holds the turn until the store answers; this caller gives up first.
    assert!(
        timeout(Duration::from_millis(50), lease.release())
            .await
            .is_err()
    );
    let Acquired::Granted { .. } = acquiring.await.unwrap().unwrap() else {
        panic!("not granted")
    };
    sleep(Duration::from_secs(1)).await;
    assert_eq!(holder(&store).await, None, "the release was carried out");
    assert!(!lease.check_lease());
}

#[tokio::test(start_paused = true)]
async fn a_release_queued_by_a_dropped_grant_comes_before_the_next_acquire() {
    let store = MemoryStore::new();
    let lease = lease(&store, "a").await;
    let grant = lease.hold().await.unwrap();
    let first = grant.token();
    drop(grant);
    // Asked right after the drop: fed after its release, so a new grant that stays held.
    let Acquired::Granted { token } = lease.acquire().await.unwrap() else {
        panic!("not granted")
    };
    assert!(
        token > first,
        "a new grant after the release, not the old one re-entered"
    );
    sleep(Duration::from_millis(100)).await;
    assert!(
        lease.check_lease(),
        "the later acquire's grant is still held"
    );
    assert_eq!(holder(&store).await, Some(("a".to_string(), token)));
}

#[tokio::test(start_paused = true)]
async fn after_the_actor_stopped_a_handle_is_refused() {
    let store = MemoryStore::new();
    let lease = lease(&store, "a").await;
    let Acquired::Granted { .. } = lease.acquire().await.unwrap() else {
        panic!("not granted")
    };
    lease.actor().stop_and_wait(None, None).await.unwrap();
    assert_eq!(holder(&store).await, None, "the stop released the grant");
    assert!(matches!(
        lease.acquire().await,
        Err(crate::LeaseError::ActorStopped { .. })
    ));
    assert!(matches!(
        lease.release().await,
        Err(crate::LeaseError::ActorStopped { .. })
    ));
    assert_eq!(
        holder(&store).await,
        None,
        "nothing acquired after the stop"
    );
}
