//! Cooperative preemption in the LeaseActor under tokio's paused clock: deterministic, no
//! real sleeps. The same scenarios run against every store in the conformance kit.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{Instant, sleep};

use crate::{
    AcquireOptions, Acquired, EMERGENCY_PRIORITY, FencingToken, Lease, LeaseError, LeaseEvent,
    LeaseEventSink, LeaseSettings, LeaseSpec, LeaseStore, LostReason, MemoryStore,
};

fn settings() -> LeaseSettings {
    let mut s = LeaseSettings::with_timeout(Duration::from_secs(10));
    s.heartbeat_interval = Duration::from_secs(1);
    s.safety_margin = Duration::from_secs(1);
    s.lease_operation_timeout = Duration::from_millis(500);
    s.lease_retry_interval = Duration::from_millis(200);
    s
}

type Log = Arc<Mutex<Vec<(Instant, LeaseEvent)>>>;

async fn lease(store: &MemoryStore, owner: &str, options: AcquireOptions) -> (Lease, Log) {
    let log: Log = Arc::default();
    let l = log.clone();
    let sink = LeaseEventSink::new(move |e| l.lock().unwrap().push((Instant::now(), e)));
    let store: Arc<dyn LeaseStore> = Arc::new(store.clone());
    let spec = LeaseSpec::new("job", owner, store, settings())
        .unwrap()
        .with_note(format!("{owner} at work"))
        .with_options(options)
        .unwrap();
    (Lease::start_with_events(spec, sink).await.unwrap(), log)
}

fn prio(priority: u64) -> AcquireOptions {
    AcquireOptions {
        priority,
        ..AcquireOptions::default()
    }
}

fn cleanup(priority: u64, cleanup: Duration) -> AcquireOptions {
    AcquireOptions {
        cleanup_timeout: cleanup,
        ..prio(priority)
    }
}

async fn granted(lease: &Lease) -> FencingToken {
    match lease.acquire().await.unwrap() {
        Acquired::Granted { token } => token,
        other => panic!("{}: not granted: {other:?}", lease.owner()),
    }
}

fn events(log: &Log) -> Vec<LeaseEvent> {
    log.lock().unwrap().iter().map(|(_, e)| e.clone()).collect()
}

/// The first event matching `pick`, with its instant.
fn first<T>(log: &Log, pick: impl Fn(&LeaseEvent) -> Option<T>) -> Option<(Instant, T)> {
    log.lock()
        .unwrap()
        .iter()
        .find_map(|(t, e)| pick(e).map(|x| (*t, x)))
}

#[tokio::test(start_paused = true)]
async fn lower_or_equal_priority_is_not_granted_with_the_holder_and_its_priority() {
    let store = MemoryStore::new();
    let (holder, _) = lease(&store, "h", prio(5)).await;
    granted(&holder).await;
    for p in [0, 3, 5] {
        let (other, _) = lease(&store, &format!("r{p}"), prio(p)).await;
        assert_eq!(
            other.acquire().await.unwrap(),
            Acquired::NotGranted {
                holder: Some("h".into()),
                priority: 5
            }
        );
    }
    assert!(holder.check_lease());
    let rec = store.read("job").await.unwrap().unwrap();
    assert_eq!((rec.priority, rec.request), (5, None));
}

#[tokio::test(start_paused = true)]
async fn holder_told_cleans_up_and_releases_then_requester_is_granted() {
    let store = MemoryStore::new();
    let (holder, hlog) = lease(&store, "h", cleanup(1, Duration::from_secs(5))).await;
    let t1 = granted(&holder).await;
    let (req, _) = lease(&store, "r", prio(7)).await;
    let asked = Instant::now();
    let waiting = tokio::spawn(async move { (req.acquire().await, req) });
    // The holder learns of the request at its next renewal (heartbeat every 1 s).
    let (told_at, (by, priority, deadline)) = loop {
        if let Some(found) = first(&hlog, |e| match e {
            LeaseEvent::PreemptionRequested(p) => {
                Some((p.by.clone(), p.priority, p.cleanup_deadline))
            }
            _ => None,
        }) {
            break found;
        }
        sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((by.as_str(), priority), ("r", 7));
    assert!(told_at <= asked + Duration::from_secs(2), "told late");
    assert!(
        deadline <= asked + Duration::from_secs(5),
        "deadline {deadline:?}"
    );
    sleep(Duration::from_secs(2)).await; // cleaning up
    assert!(holder.release().await.unwrap());
    let (answer, req) = waiting.await.unwrap();
    let Ok(Acquired::Granted { token }) = answer else {
        panic!("requester not granted: {answer:?}")
    };
    assert!(token > t1);
    assert!(req.check_lease());
    let rec = store.read("job").await.unwrap().unwrap();
    assert_eq!(
        (rec.owner.as_str(), rec.priority, rec.request),
        ("r", 7, None)
    );
    assert!(
        !events(&hlog)
            .iter()
            .any(|e| matches!(e, LeaseEvent::Lost(_))),
        "a release is not a loss"
    );
}

#[tokio::test(start_paused = true)]
async fn cleanup_not_finished_non_forceful_changes_nothing() {
    let store = MemoryStore::new();
    let (holder, hlog) = lease(&store, "h", cleanup(0, Duration::from_secs(3))).await;
    let t1 = granted(&holder).await;
    let (req, _) = lease(&store, "r", prio(7)).await;
    let started = Instant::now();
    let answer = req.acquire().await;
    let waited = started.elapsed();
    match answer {
        Err(LeaseError::CleanupTimedOut {
            holder: h,
            cleanup_timeout,
            ..
        }) => {
            assert_eq!((h.as_str(), cleanup_timeout), ("h", Duration::from_secs(3)));
        }
        other => panic!("expected CleanupTimedOut, got {other:?}"),
    }
    assert!(waited >= Duration::from_secs(3), "gave up after {waited:?}");
    // Nothing changed: same holder, same token, no request left; the holder keeps renewing.
    let rec = store.read("job").await.unwrap().unwrap();
    assert_eq!(
        (rec.owner.as_str(), rec.token, rec.request),
        ("h", t1, None)
    );
    sleep(Duration::from_secs(30)).await;
    assert_eq!(holder.token(), Some(t1));
    let evs = events(&hlog);
    let requested = evs
        .iter()
        .position(|e| matches!(e, LeaseEvent::PreemptionRequested(_)));
    let withdrawn = evs
        .iter()
        .position(|e| matches!(e, LeaseEvent::PreemptionWithdrawn(w) if w.by == "r"));
    assert!(requested < withdrawn && requested.is_some(), "{evs:?}");
    assert!(!evs.iter().any(|e| matches!(e, LeaseEvent::Lost(_))));
}

#[tokio::test(start_paused = true)]
async fn waiting_timeout_shorter_than_cleanup_bounds_the_wait() {
    let store = MemoryStore::new();
    let (holder, _) = lease(&store, "h", cleanup(0, Duration::from_secs(60))).await;
    granted(&holder).await;
    let options = AcquireOptions {
        waiting_timeout: Some(Duration::from_secs(2)),
        ..prio(3)
    };
    let (req, _) = lease(&store, "r", options).await;
    let started = Instant::now();
    let answer = req.acquire().await;
    assert!(
        matches!(answer, Err(LeaseError::CleanupTimedOut { .. })),
        "{answer:?}"
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(60),
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn forceful_request_ends_the_holder_before_the_requester_is_granted() {
    let store = MemoryStore::new();
    let (holder, hlog) = lease(&store, "h", cleanup(0, Duration::from_secs(3))).await;
    let t1 = granted(&holder).await;
    let options = AcquireOptions {
        forceful: true,
        ..prio(7)
    };
    let (req, rlog) = lease(&store, "r", options).await;
    let t2 = granted(&req).await;
    assert!(t2 > t1);
    let (lost_at, reason) = first(&hlog, |e| match e {
        LeaseEvent::Lost(l) => Some(l.reason),
        _ => None,
    })
    .expect("the holder lost the lease");
    assert_eq!(reason, LostReason::Preempted);
    let (granted_at, _) = first(&rlog, |e| match e {
        LeaseEvent::Granted(g) => Some(g.token),
        _ => None,
    })
    .expect("granted event");
    assert!(
        lost_at <= granted_at,
        "holder lost after the requester's grant"
    );
    assert!(!holder.check_lease());
}

#[tokio::test(start_paused = true)]
async fn without_cleanup_time_a_forceful_request_is_announced_then_the_lease_lost() {
    let store = MemoryStore::new();
    let (holder, hlog) = lease(&store, "h", prio(0)).await;
    let t1 = granted(&holder).await;
    let options = AcquireOptions {
        forceful: true,
        ..prio(1)
    };
    let (req, _) = lease(&store, "r", options).await;
    assert!(granted(&req).await > t1);
    let evs = events(&hlog);
    assert_eq!(evs.len(), 3, "{evs:?}");
    assert!(
        matches!(&evs[1], LeaseEvent::PreemptionRequested(p) if p.by == "r" && p.forceful),
        "{evs:?}"
    );
    assert!(
        matches!(&evs[2], LeaseEvent::Lost(l) if l.reason == LostReason::Preempted),
        "{evs:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_higher_requester_overtakes_a_waiting_one() {
    let store = MemoryStore::new();
    let (holder, hlog) = lease(&store, "h", cleanup(0, Duration::from_secs(30))).await;
    granted(&holder).await;
    let (low, _) = lease(&store, "r5", prio(5)).await;
    let waiting = tokio::spawn(async move { (low.acquire().await, low) });
    sleep(Duration::from_secs(2)).await;
    let (high, _) = lease(&store, "r9", prio(9)).await;
    let high_waiting = tokio::spawn(async move { (high.acquire().await, high) });
    let (answer, _low) = waiting.await.unwrap();
    match answer {
        Err(LeaseError::Overtaken { by, priority, .. }) => {
            assert_eq!((by.as_str(), priority), ("r9", 9))
        }
        other => panic!("expected Overtaken, got {other:?}"),
    }
    // The holder was told of r5, then of r9 (r5's request withdrawn).
    sleep(Duration::from_secs(2)).await;
    let asked: Vec<String> = events(&hlog)
        .iter()
        .filter_map(|e| match e {
            LeaseEvent::PreemptionRequested(p) => Some(p.by.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(asked, ["r5", "r9"]);
    assert!(holder.release().await.unwrap());
    let (answer, _high) = high_waiting.await.unwrap();
    assert!(matches!(answer, Ok(Acquired::Granted { .. })), "{answer:?}");
}

#[tokio::test(start_paused = true)]
async fn emergency_takes_over_at_once_and_only_fencing_orders_the_two() {
    let store = MemoryStore::new();
    let (holder, hlog) = lease(&store, "h", prio(100)).await;
    let t1 = granted(&holder).await;
    let options = AcquireOptions {
        emergency: true,
        ..prio(EMERGENCY_PRIORITY)
    };
    let (op, _) = lease(&store, "operator", options).await;
    let t2 = granted(&op).await;
    assert!(t2 > t1, "the emergency grant has a higher token");
    // The old holder learns at its next renewal (the store no longer holds its token).
    sleep(Duration::from_secs(2)).await;
    let (_, reason) = first(&hlog, |e| match e {
        LeaseEvent::Lost(l) => Some(l.reason),
        _ => None,
    })
    .expect("old holder lost");
    assert_eq!(reason, LostReason::NotHeld);
    // Nobody can take the lease from the emergency holder.
    let (other, _) = lease(
        &store,
        "x",
        AcquireOptions {
            emergency: true,
            ..prio(EMERGENCY_PRIORITY)
        },
    )
    .await;
    assert_eq!(
        other.acquire().await.unwrap(),
        Acquired::NotGranted {
            holder: Some("operator".into()),
            priority: EMERGENCY_PRIORITY
        }
    );
}

#[tokio::test(start_paused = true)]
async fn release_while_waiting_withdraws_the_request() {
    let store = MemoryStore::new();
    let (holder, _) = lease(&store, "h", cleanup(0, Duration::from_secs(30))).await;
    granted(&holder).await;
    let (req, _) = lease(&store, "r", prio(2)).await;
    let r = req.clone();
    let waiting = tokio::spawn(async move { r.acquire().await });
    sleep(Duration::from_secs(1)).await;
    assert_eq!(
        store
            .read("job")
            .await
            .unwrap()
            .and_then(|r| r.request)
            .map(|q| q.by),
        Some("r".into())
    );
    assert!(!req.release().await.unwrap());
    assert!(matches!(
        waiting.await.unwrap(),
        Err(LeaseError::Cancelled { .. })
    ));
    let rec = store.read("job").await.unwrap().unwrap();
    assert_eq!(rec.request, None);
}

#[tokio::test(start_paused = true)]
async fn a_killed_requester_withdraws_its_request() {
    let store = MemoryStore::new();
    let (holder, _) = lease(&store, "h", cleanup(0, Duration::from_secs(30))).await;
    granted(&holder).await;
    let (req, _) = lease(&store, "r", prio(2)).await;
    let r = req.clone();
    let waiting = tokio::spawn(async move { r.acquire().await });
    sleep(Duration::from_secs(1)).await;
    let pending = || async {
        store
            .read("job")
            .await
            .unwrap()
            .and_then(|r| r.request)
            .map(|q| q.by)
    };
    assert_eq!(pending().await, Some("r".into()));
    req.actor().kill();
    assert!(
        waiting.await.unwrap().is_err(),
        "no answer from a killed actor"
    );
    sleep(Duration::from_secs(1)).await;
    assert_eq!(pending().await, None);
}

/// A holder record with an absurd cleanup timeout (written by another process: the store
/// only keeps what it is given) must not overflow the requester's instant arithmetic.
#[tokio::test(start_paused = true)]
async fn an_absurd_cleanup_timeout_in_the_store_does_not_overflow() {
    let store = MemoryStore::new();
    let holder = crate::AcquireRequest {
        name: "job".into(),
        owner: "h".into(),
        instance: "h-1".into(),
        ttl: Duration::from_secs(600),
        cleanup_timeout: Duration::MAX,
        ..crate::AcquireRequest::default()
    };
    assert!(matches!(
        store.try_acquire(&holder).await.unwrap(),
        crate::AcquireOutcome::Granted(_)
    ));
    let options = AcquireOptions {
        waiting_timeout: Some(Duration::from_secs(3)),
        ..prio(7)
    };
    let (req, _) = lease(&store, "r", options).await;
    let answer = req.acquire().await;
    assert!(
        matches!(answer, Err(LeaseError::CleanupTimedOut { .. })),
        "{answer:?}"
    );
}
