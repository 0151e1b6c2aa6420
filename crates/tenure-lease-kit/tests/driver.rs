//! The lease core's driver fed from a handle's caller (`tenure_lease`'s `driver.rs`): a caller that gives up
//! cancels nothing, a release queued by a drop is fed before the next command, and a slow
//! store call (a handle's or the actor's) delays no renewal.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep, timeout};

use tenure_lease::{
    Acquired, Fault, FencingToken, Lease, LeaseMsg, LeaseSettings, LeaseSpec, LeaseStore,
    MemoryStore,
};
use tenure_lease_kit::conformance::FaultyClient;

/// ttl 10 s, renewals every 1 s, margin 1 s, operations bounded by 500 ms.
fn settings() -> LeaseSettings {
    let mut s = LeaseSettings::with_timeout(Duration::from_secs(10));
    s.heartbeat_interval = Duration::from_secs(1);
    s.safety_margin = Duration::from_secs(1);
    s.lease_operation_timeout = Duration::from_millis(500);
    s.lease_retry_interval = Duration::from_secs(2);
    s
}

async fn lease(store: &MemoryStore, owner: &str) -> Lease {
    let store: Arc<dyn LeaseStore> = Arc::new(store.clone());
    Lease::start(LeaseSpec::new("driven", owner, store, settings()).unwrap())
        .await
        .unwrap()
}

async fn holder(store: &MemoryStore) -> Option<(String, tenure_lease::FencingToken)> {
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
        Err(tenure_lease::LeaseError::ActorStopped { .. })
    ));
    assert!(matches!(
        lease.release().await,
        Err(tenure_lease::LeaseError::ActorStopped { .. })
    ));
    assert_eq!(
        holder(&store).await,
        None,
        "nothing acquired after the stop"
    );
}

/// Store calls that may take many renewal intervals (up to 30 s) while the lease renews
/// every second.
fn slow_call_settings() -> tenure_lease::LeaseSettings {
    let mut s = settings();
    s.lease_operation_timeout = Duration::from_secs(30);
    s
}

type Losses = Arc<std::sync::Mutex<Vec<tenure_lease::LeaseLost>>>;

/// A holder of lease "driven" whose acquires can be held back: renewals go to the store.
async fn slow_holder(store: &MemoryStore) -> (Lease, Arc<FaultyClient>, FencingToken, Losses) {
    let client = FaultyClient::new(Arc::new(store.clone()));
    let spec = LeaseSpec::new("driven", "a", client.clone(), slow_call_settings()).unwrap();
    let lease = Lease::start(spec).await.unwrap();
    let losses: Losses = Arc::default();
    let l = losses.clone();
    let Acquired::Granted { token } = lease
        .acquire_with_lost(move |lost| l.lock().unwrap().push(lost))
        .await
        .unwrap()
    else {
        panic!("not granted")
    };
    (lease, client, token, losses)
}

/// While one call is held back for 15 s (one and a half ttls, fifteen renewal intervals),
/// the lease keeps being renewed every interval and stays held throughout.
async fn renewals_go_on_while(store: &MemoryStore, client: &FaultyClient, lease: &Lease) {
    while client.held_acquires() == 0 {
        sleep(Duration::from_millis(10)).await;
    }
    let renewed_before = store.renew_calls();
    for _ in 0..150 {
        sleep(Duration::from_millis(100)).await;
        assert!(lease.check_lease(), "the held call stopped the renewals");
    }
    let renewals = store.renew_calls() - renewed_before;
    assert!(renewals >= 14, "{renewals} renewals in 15 s");
}

#[tokio::test(start_paused = true)]
async fn a_slow_handle_call_delays_no_renewal() {
    let store = MemoryStore::new();
    let (lease, client, token, losses) = slow_holder(&store).await;
    client.set_acquires_held(true);
    let slow = tokio::spawn({
        let lease = lease.clone();
        async move { lease.acquire().await }
    });
    renewals_go_on_while(&store, &client, &lease).await;
    client.set_acquires_held(false);
    assert_eq!(slow.await.unwrap().unwrap(), Acquired::Granted { token });
    assert!(losses.lock().unwrap().is_empty(), "{losses:?}");
    assert!(lease.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_slow_command_in_the_actors_mailbox_delays_no_renewal() {
    let store = MemoryStore::new();
    let (lease, client, token, losses) = slow_holder(&store).await;
    client.set_acquires_held(true);
    let slow = tokio::spawn({
        let actor = lease.actor().clone();
        async move { ractor::call!(actor, LeaseMsg::TryAcquire) }
    });
    renewals_go_on_while(&store, &client, &lease).await;
    client.set_acquires_held(false);
    let (acquired, _) = slow.await.unwrap().unwrap().unwrap();
    assert_eq!(acquired, Acquired::Granted { token });
    assert!(losses.lock().unwrap().is_empty(), "{losses:?}");
    assert!(lease.release().await.unwrap());
}
