//! The lease's third state: held, suspended while renewals fail before the deadline, lost
//! after it; under tokio's paused clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{Instant, sleep};

use crate::timing_tests::settings;
use crate::{Fault, Lease, LeaseEvent, LeaseEventSink, LeaseSpec, LeaseState, MemoryStore};

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

/// A metric's name, labels and value.
type Metric = (
    String,
    Vec<(String, String)>,
    metrics_util::debugging::DebugValue,
);

fn metrics_of(snapshotter: &metrics_util::debugging::Snapshotter) -> Vec<Metric> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| {
            let key = k.key();
            let labels = key
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            (key.name().to_string(), labels, v)
        })
        .collect()
}

/// The value of metric `name` (with `label`, when given) in `map`.
fn value<'a>(
    map: &'a [Metric],
    name: &str,
    label: Option<(&str, &str)>,
) -> Option<&'a metrics_util::debugging::DebugValue> {
    map.iter()
        .find(|(n, labels, _)| {
            n == name && label.is_none_or(|(l, v)| labels.iter().any(|(k, x)| k == l && x == v))
        })
        .map(|(_, _, v)| v)
}

/// The metrics after a grant, a suspension and its loss, then a new grant released:
/// counted from the same transitions as the events.
#[test]
fn metrics_count_grants_losses_suspensions_and_store_errors() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let during = metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let store = MemoryStore::new();
            let (lease, _) = lease(&store).await;
            let mut states = lease.watch_state();
            lease.acquire_wait().await.unwrap();
            store.set_fault(Fault::FailRenewals);
            states
                .wait_for(|s| *s == LeaseState::Suspended)
                .await
                .unwrap();
            let during = metrics_of(&snapshotter);
            states.wait_for(|s| *s == LeaseState::Lost).await.unwrap();
            store.set_fault(Fault::None);
            lease.acquire_wait().await.unwrap();
            sleep(Duration::from_secs(3)).await;
            assert!(lease.release().await.unwrap());
            during
        })
    });
    // A snapshot drains what it reports: every value after it counts from it on, so the
    // gauges' levels at the end are the sums of both snapshots (1 - 1 = 0).
    let after = metrics_of(&snapshotter);
    let suspended = "tenure_leases_suspended";
    let held = "tenure_leases_held";
    let grants = "tenure_lease_grants_total";
    assert_eq!(
        value(&during, suspended, None),
        Some(&DebugValue::Gauge(1.0.into()))
    );
    assert_eq!(
        value(&during, held, None),
        Some(&DebugValue::Gauge(1.0.into()))
    );
    assert_eq!(value(&during, grants, None), Some(&DebugValue::Counter(1)));
    assert!(matches!(
        value(&during, "tenure_lease_store_errors_total", Some(("operation", "renew"))),
        Some(DebugValue::Counter(n)) if *n >= 1
    ));
    assert_eq!(value(&after, grants, None), Some(&DebugValue::Counter(1)));
    assert_eq!(
        value(
            &after,
            "tenure_lease_losses_total",
            Some(("reason", "expired"))
        ),
        Some(&DebugValue::Counter(1))
    );
    assert_eq!(
        value(&after, held, None),
        Some(&DebugValue::Gauge((-1.0).into()))
    );
    assert_eq!(
        value(&after, suspended, None),
        Some(&DebugValue::Gauge((-1.0).into()))
    );
    assert!(matches!(
        value(&after, "tenure_lease_renewal_seconds", Some(("store", "memory"))),
        Some(DebugValue::Histogram(h)) if !h.is_empty()
    ));
}
