//! Host suspend: holder deadlines count it (`CLOCK_BOOTTIME` on Linux). A manual
//! [`HolderClock`] under tokio's paused clock makes the host "sleep" deterministically: the
//! holder clock jumps while tokio's clock, and the memory store's expiry on it, stand still
//! (as a store on another host would keep counting, and a monotonic timer would not).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{Instant, sleep};

use crate::{
    Acquired, HolderClock, LeaseActor, LeaseEvent, LeaseEventSink, LeaseMsg, LeaseSettings,
    LeaseSpec, LeaseStore, LostReason, MemoryStore, RenewalBatcher, SuspendControl,
};

fn settings() -> LeaseSettings {
    let mut s = LeaseSettings::with_timeout(Duration::from_secs(10));
    s.heartbeat_interval = Duration::from_secs(1);
    s.safety_margin = Duration::from_secs(1);
    s.lease_operation_timeout = Duration::from_millis(500);
    s
}

type Log = Arc<Mutex<Vec<(Instant, LeaseEvent)>>>;

/// A granted lease on a manual clock, with its event log.
async fn held() -> (crate::LeaseView, SuspendControl, Log, MemoryStore) {
    let store = MemoryStore::new();
    let shared: Arc<dyn LeaseStore> = Arc::new(store.clone());
    let (clock, control) = HolderClock::manual();
    let batcher = RenewalBatcher::with_clock(shared.clone(), "node-1".into(), settings(), clock);
    let spec = LeaseSpec::with_batcher("a", "node-1", shared, settings(), batcher).unwrap();
    let log: Log = Arc::default();
    let l = log.clone();
    let sink = LeaseEventSink::new(move |e| l.lock().unwrap().push((Instant::now(), e)));
    let (actor, view) = LeaseActor::start(spec, sink, None).await.unwrap();
    let answer = ractor::call!(actor, LeaseMsg::TryAcquire).unwrap().unwrap();
    assert!(matches!(answer.0, Acquired::Granted { .. }));
    (view, control, log, store)
}

fn losses(log: &Log) -> Vec<(Instant, LostReason)> {
    log.lock()
        .unwrap()
        .iter()
        .filter_map(|(t, e)| match e {
            LeaseEvent::Lost(l) => Some((*t, l.reason)),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_suspend_past_the_deadline_ends_the_belief_at_resume() {
    let (view, control, log, store) = held().await;
    sleep(Duration::from_millis(2500)).await;
    assert!(view.check_lease());
    let resumed = Instant::now();
    control.suspend(Duration::from_secs(60));
    // The store (on tokio's clock here, on another host in real life) still holds the grant
    // for a moment, or has expired it long ago: either way the holder must not believe.
    assert!(store.read("a").await.unwrap().is_some());
    assert!(!view.check_lease(), "check_lease reads the holder clock");
    for _ in 0..100 {
        if !losses(&log).is_empty() {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(
        losses(&log),
        vec![(resumed, LostReason::Expired)],
        "the loss is announced at resume, not at the monotonic deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn a_short_suspend_shortens_the_belief_and_renewals_go_on() {
    let (view, control, log, _store) = held().await;
    sleep(Duration::from_millis(2500)).await;
    let before = view.deadline().unwrap();
    control.suspend(Duration::from_secs(3));
    assert_eq!(view.deadline().unwrap(), before - Duration::from_secs(3));
    assert!(view.check_lease());
    sleep(Duration::from_secs(30)).await;
    assert!(view.check_lease(), "renewed after the suspend");
    assert!(losses(&log).is_empty());
}
