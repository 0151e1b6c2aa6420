//! Waiting through the public API is first come, first served on a store with a fair
//! queue, under tokio's paused clock.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::sleep;

use crate::timing_tests::settings;
use crate::{Acquired, Election, Lease, LeaseSpec, MemoryStore};

fn spec(store: &MemoryStore, owner: &str) -> LeaseSpec {
    LeaseSpec::new("fair", owner, Arc::new(store.clone()), settings()).unwrap()
}

/// `owner` waits for the lease (`acquire_wait`) in a task of its own and reports its name
/// once granted.
async fn waiter(
    store: &MemoryStore,
    owner: &'static str,
    granted: mpsc::UnboundedSender<&'static str>,
) -> Lease {
    let lease = Lease::start(spec(store, owner)).await.unwrap();
    let waiting = lease.clone();
    tokio::spawn(async move {
        // A waiter released while waiting is answered `Cancelled` and reports nothing.
        if waiting.acquire_wait().await.is_ok() {
            let _ = granted.send(owner);
        }
    });
    lease
}

/// The line of the first and third tests: `holder` holds the lease, `first` waits from 0 s
/// and `second` from 1 s (now is 1 s). Returns `holder`, `first`, `second` and where the
/// waiters report their grants.
async fn line_up(
    store: &MemoryStore,
) -> (Lease, Lease, Lease, mpsc::UnboundedReceiver<&'static str>) {
    let holder = Lease::start(spec(store, "holder")).await.unwrap();
    assert!(matches!(
        holder.acquire().await.unwrap(),
        Acquired::Granted { .. }
    ));
    let (tx, granted) = mpsc::unbounded_channel();
    let first = waiter(store, "first", tx.clone()).await;
    sleep(Duration::from_secs(1)).await;
    let second = waiter(store, "second", tx).await;
    (holder, first, second, granted)
}

#[tokio::test(start_paused = true)]
async fn the_waiter_that_came_first_is_granted_first() {
    let store = MemoryStore::new();
    // Retrying every 2 s, `second` (waiting from 1 s) would look again at 3 s, before
    // `first` (from 0 s) at 4 s, and take the lease released at 2.5 s.
    let (holder, first, _second, mut granted) = line_up(&store).await;
    sleep(Duration::from_millis(1500)).await;
    assert!(holder.release().await.unwrap());
    assert_eq!(granted.recv().await, Some("first"));
    assert!(first.check_lease());
    assert!(first.release().await.unwrap());
    assert_eq!(granted.recv().await, Some("second"));
}

#[tokio::test(start_paused = true)]
async fn the_candidate_that_came_first_is_elected_first() {
    let store = MemoryStore::new();
    let leader = Election::start(spec(&store, "leader")).await.unwrap();
    leader.campaign("leader").await.unwrap();
    let (tx, mut elected) = mpsc::unbounded_channel();
    let mut candidates = Vec::new();
    for (i, name) in ["first", "second"].into_iter().enumerate() {
        if i > 0 {
            sleep(Duration::from_secs(1)).await;
        }
        let candidate = Arc::new(Election::start(spec(&store, name)).await.unwrap());
        let (c, tx) = (candidate.clone(), tx.clone());
        tokio::spawn(async move {
            c.campaign(name).await.unwrap();
            let _ = tx.send(name);
        });
        candidates.push(candidate);
    }
    sleep(Duration::from_millis(1500)).await;
    assert!(leader.resign().await.unwrap());
    assert_eq!(elected.recv().await, Some("first"));
    assert!(candidates[0].resign().await.unwrap());
    assert_eq!(elected.recv().await, Some("second"));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_released_while_in_line_leaves_the_line() {
    let store = MemoryStore::new();
    let (holder, first, _second, mut granted) = line_up(&store).await;
    sleep(Duration::from_secs(1)).await;
    // Giving up (a release while waiting) must not leave `first`'s place holding the line.
    assert!(!first.release().await.unwrap());
    assert!(holder.release().await.unwrap());
    assert_eq!(granted.recv().await, Some("second"));
}
