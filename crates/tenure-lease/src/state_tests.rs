//! The lease's third state: held, suspended while renewals fail before the deadline, lost
//! after it; under tokio's paused clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{Instant, sleep};

use crate::{
    Fault, Lease, LeaseEvent, LeaseEventSink, LeaseSettings, LeaseSpec, LeaseState, MemoryStore,
};

fn settings() -> LeaseSettings {
    let mut s = LeaseSettings::with_timeout(Duration::from_secs(10));
    s.heartbeat_interval = Duration::from_secs(1);
    s.safety_margin = Duration::from_secs(1);
    s.lease_operation_timeout = Duration::from_millis(500);
    s.lease_retry_interval = Duration::from_secs(2);
    s
}

type Log = Arc<Mutex<Vec<(Instant, LeaseEvent)>>>;

async fn lease(store: &MemoryStore) -> (Lease, Log) {
    let log: Log = Arc::default();
    let l = log.clone();
    let sink = LeaseEventSink::new(move |e| l.lock().unwrap().push((Instant::now(), e)));
    let spec = LeaseSpec::new("a", "node-1", Arc::new(store.clone()), settings()).unwrap();
    (Lease::start_with_events(spec, sink).await.unwrap(), log)
}

/// The kinds of the events logged so far, in order.
fn kinds(log: &Log) -> Vec<&'static str> {
    log.lock()
        .unwrap()
        .iter()
        .map(|(_, e)| match e {
            LeaseEvent::Granted(_) => "granted",
            LeaseEvent::Lost(_) => "lost",
            LeaseEvent::Suspended(_) => "suspended",
            LeaseEvent::Resumed(_) => "resumed",
            LeaseEvent::PreemptionRequested(_) => "preemption requested",
            LeaseEvent::PreemptionWithdrawn(_) => "preemption withdrawn",
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn failing_renewals_suspend_the_grant_until_its_deadline_then_it_is_lost() {
    let store = MemoryStore::new();
    let (lease, log) = lease(&store).await;
    assert_eq!(lease.state(), LeaseState::NotHeld);
    let mut states = lease.watch_state();
    let token = lease.acquire_wait().await.unwrap();
    assert_eq!(lease.state(), LeaseState::Held);
    let deadline = lease.deadline().unwrap();
    store.set_fault(Fault::FailRenewals);
    states
        .wait_for(|s| *s == LeaseState::Suspended)
        .await
        .unwrap();
    let suspended_at = Instant::now();
    assert!(suspended_at < deadline, "suspended before the deadline");
    // Still ours until the deadline: check_lease and the token stay.
    assert!(lease.check_lease());
    assert_eq!(lease.token(), Some(token));
    states.wait_for(|s| *s == LeaseState::Lost).await.unwrap();
    assert!(Instant::now() <= deadline);
    assert!(!lease.check_lease());
    // One suspension for the whole stretch of failures, then the loss.
    assert_eq!(kinds(&log), ["granted", "suspended", "lost"]);
    let suspended = log.lock().unwrap()[1].1.clone();
    let LeaseEvent::Suspended(s) = suspended else {
        panic!()
    };
    assert_eq!((s.name.as_str(), s.token), ("a", token));
    assert!(!s.error.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_renewal_that_succeeds_again_resumes_the_same_grant() {
    let store = MemoryStore::new();
    let (lease, log) = lease(&store).await;
    let mut states = lease.watch_state();
    let token = lease.acquire_wait().await.unwrap();
    store.set_fault(Fault::FailRenewals);
    states
        .wait_for(|s| *s == LeaseState::Suspended)
        .await
        .unwrap();
    // Two more failed renewals: still one suspension.
    sleep(Duration::from_secs(2)).await;
    store.set_fault(Fault::None);
    states.wait_for(|s| *s == LeaseState::Held).await.unwrap();
    assert_eq!(lease.token(), Some(token));
    sleep(Duration::from_secs(20)).await;
    assert_eq!(lease.state(), LeaseState::Held);
    assert_eq!(kinds(&log), ["granted", "suspended", "resumed"]);
    assert!(lease.release().await.unwrap());
    assert_eq!(lease.state(), LeaseState::NotHeld);
}

#[tokio::test(start_paused = true)]
async fn hanging_renewals_suspend_too() {
    let store = MemoryStore::new();
    let (lease, log) = lease(&store).await;
    let mut states = lease.watch_state();
    lease.acquire_wait().await.unwrap();
    let deadline = lease.deadline().unwrap();
    store.set_fault(Fault::HangRenewals);
    states
        .wait_for(|s| *s == LeaseState::Suspended)
        .await
        .unwrap();
    assert!(Instant::now() < deadline);
    states.wait_for(|s| *s == LeaseState::Lost).await.unwrap();
    assert_eq!(kinds(&log), ["granted", "suspended", "lost"]);
}
