//! Conformance cases for priorities and cooperative preemption: the store operations
//! ([`PreemptionRequests`](tenure_lease::PreemptionRequests)), and Apache Helix's priority-lock
//! scenarios through the Lease API, each recording a history that is checked for
//! overlapping holders and token order. A store runs them when its
//! [`conformance_tests!`](crate::conformance_tests) lists `preemption_requests`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, sleep};

use super::{
    Harness, granted_token, poll_until_granted, preemption_requests_of, request, test_settings,
};
use tenure_history::check::{Hold, HoldEnd, Violation, ViolationKind, check};
use tenure_history::{Entry, Recorder};
use tenure_lease::FencingToken;
use tenure_lease::{
    AcquireOptions, AcquireOutcome, AcquireRequest, Acquired, EMERGENCY_PRIORITY, HeldLease, Lease,
    LeaseError, LeaseEvent, LeaseEventSink, LeaseObserver, LeaseSpec, LeaseStore, LostReason,
    PreemptAnswer, PreemptionRequest, Renewal,
};

/// A client of the store, asserting it keeps priorities and preemption requests.
async fn preempting_client(h: &dyn Harness) -> Arc<dyn LeaseStore> {
    let store = h.client().await;
    preemption_requests_of(&*store);
    store
}

fn prioritized(name: &str, owner: &str, ttl: Duration, priority: u64) -> AcquireRequest {
    AcquireRequest {
        priority,
        ..request(name, owner, ttl)
    }
}

fn ask(by: &str, priority: u64, forceful: bool) -> PreemptionRequest {
    PreemptionRequest {
        by: by.into(),
        instance: format!("{by}-instance"),
        priority,
        forceful,
        note: Some(format!("{by} needs it")),
    }
}

fn recorded_by(answer: &PreemptAnswer) -> Option<&str> {
    match answer {
        PreemptAnswer::Recorded(r) => r.request.as_ref().map(|q| q.by.as_str()),
        other => panic!("expected Recorded, got {other:?}"),
    }
}

fn refused(answer: PreemptAnswer) -> tenure_lease::LeaseRecord {
    match answer {
        PreemptAnswer::Refused(r) => r,
        other => panic!("expected Refused, got {other:?}"),
    }
}

/// The store records, shows, overtakes, refuses and withdraws requests by the rules of
/// [`PreemptionRequest::may_replace`]; renewals show the pending request; a request on a
/// grant that is not current answers `Gone`.
pub async fn preemption_requests(h: &dyn Harness) {
    let a = preempting_client(h).await;
    let b = h.client().await;
    let ttl = Duration::from_secs(5);
    let grant = AcquireRequest {
        cleanup_timeout: Duration::from_secs(3),
        note: Some("a at work".into()),
        ..prioritized("prio", "a", ttl, 2)
    };
    let t = granted_token(&a.try_acquire(&grant).await.expect("acquire"));
    let held = match b
        .try_acquire(&prioritized("prio", "b", ttl, 9))
        .await
        .expect("acquire")
    {
        AcquireOutcome::Held(r) => r,
        AcquireOutcome::Granted(_) => panic!("a higher priority alone takes nothing"),
    };
    assert_eq!(
        (held.priority, held.cleanup_timeout, held.note.as_deref()),
        (2, Duration::from_secs(3), Some("a at work"))
    );
    let call = |q: PreemptionRequest, token: FencingToken| {
        let b = b.clone();
        async move {
            preemption_requests_of(&*b)
                .request_preemption("prio", token, &q)
                .await
                .expect("request preemption")
        }
    };
    // Not above the holder's priority: refused.
    let r = refused(call(ask("low", 2, false), t).await);
    assert_eq!((r.priority, r.request), (2, None));
    assert_eq!(recorded_by(&call(ask("c", 5, false), t).await), Some("c"));
    let renewed = a
        .renew(
            "a",
            &[HeldLease {
                name: "prio".into(),
                token: t,
            }],
            ttl,
        )
        .await
        .expect("renew");
    assert_eq!(
        renewed,
        [Renewal::Renewed {
            request: Some(ask("c", 5, false))
        }]
    );
    // A lower or equal request of another owner does not replace c's.
    let r = refused(call(ask("d", 5, false), t).await);
    assert_eq!(r.request.map(|q| q.by), Some("c".into()));
    // A higher one overtakes it; c can then neither update nor withdraw it.
    assert_eq!(recorded_by(&call(ask("e", 9, false), t).await), Some("e"));
    let r = refused(call(ask("c", 5, true), t).await);
    assert_eq!(r.request.map(|q| q.by), Some("e".into()));
    assert!(
        !preemption_requests_of(&*b)
            .withdraw_preemption("prio", t, "c")
            .await
            .expect("withdraw")
    );
    let listed = b.list("prio").await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].request, Some(ask("e", 9, false)));
    assert!(
        preemption_requests_of(&*b)
            .withdraw_preemption("prio", t, "e")
            .await
            .expect("withdraw")
    );
    let rec = b.read("prio").await.expect("read").expect("held");
    assert_eq!(
        (rec.token, rec.request),
        (t, None),
        "a request never moves the token"
    );
    // Not the current grant: gone.
    assert_eq!(
        call(ask("c", 5, false), FencingToken::new(t.get() + 1000)).await,
        PreemptAnswer::Gone
    );
    // Released: the request goes with the grant.
    assert_eq!(recorded_by(&call(ask("c", 5, false), t).await), Some("c"));
    assert!(a.release("prio", "a", t).await.expect("release"));
    assert_eq!(call(ask("c", 5, false), t).await, PreemptAnswer::Gone);
    let next = granted_token(
        &b.try_acquire(&prioritized("prio", "c", ttl, 5))
            .await
            .expect("acquire"),
    );
    let rec = b.read("prio").await.expect("read").expect("held");
    assert_eq!((rec.token, rec.priority, rec.request), (next, 5, None));
}

/// After a forceful request, the holder's renewals are refused and not extended, neither
/// it nor another instance of its owner can renew it by acquiring, and the requester is
/// granted (new token, no request) only once the holder's last write has expired.
pub async fn forceful_preemption_refuses_renewals(h: &dyn Harness) {
    let a = preempting_client(h).await;
    let b = h.client().await;
    let ttl = Duration::from_millis(1200);
    let sent = Instant::now();
    let t = granted_token(
        &a.try_acquire(&prioritized("forced", "a", ttl, 1))
            .await
            .expect("acquire"),
    );
    let q = ask("b", 4, true);
    assert_eq!(
        recorded_by(
            &preemption_requests_of(&*b)
                .request_preemption("forced", t, &q)
                .await
                .expect("request")
        ),
        Some("b")
    );
    let held = [HeldLease {
        name: "forced".into(),
        token: t,
    }];
    assert_eq!(
        a.renew("a", &held, ttl).await.expect("renew"),
        [Renewal::Refused(q.clone())]
    );
    for instance in ["a-instance", "a-successor"] {
        let again = AcquireRequest {
            instance: instance.into(),
            ..prioritized("forced", "a", ttl, 1)
        };
        assert!(
            matches!(
                a.try_acquire(&again).await.expect("acquire"),
                AcquireOutcome::Held(_)
            ),
            "{instance} extended or replaced an ending grant"
        );
    }
    let (granted_at, t2) = poll_until_granted(&*b, "forced", "b", ttl).await;
    assert!(t2 > t);
    assert!(
        granted_at >= sent + ttl,
        "granted {:?} after a's only write, ttl {ttl:?}",
        granted_at - sent
    );
    let rec = b.read("forced").await.expect("read").expect("held");
    assert_eq!((rec.owner.as_str(), rec.request), ("b", None));
    assert_eq!(
        a.renew("a", &held, ttl).await.expect("renew"),
        [Renewal::NotHeld]
    );
}

/// An emergency request (maximum priority) takes a lower grant over at once with a new
/// token; the old holder's renewals and release then fail. Emergency is ignored below the
/// maximum priority and does not take over an equal one.
pub async fn emergency_takeover(h: &dyn Harness) {
    let a = preempting_client(h).await;
    let b = h.client().await;
    let ttl = Duration::from_secs(5);
    let t = granted_token(
        &a.try_acquire(&prioritized("emergency", "a", ttl, 10))
            .await
            .expect("acquire"),
    );
    let not_max = AcquireRequest {
        emergency: true,
        ..prioritized("emergency", "x", ttl, EMERGENCY_PRIORITY - 1)
    };
    assert!(matches!(
        b.try_acquire(&not_max).await.expect("acquire"),
        AcquireOutcome::Held(_)
    ));
    let emergency = |owner: &str| AcquireRequest {
        emergency: true,
        ..prioritized("emergency", owner, ttl, EMERGENCY_PRIORITY)
    };
    let t2 = granted_token(&b.try_acquire(&emergency("op")).await.expect("acquire"));
    assert!(t2 > t);
    let held = [HeldLease {
        name: "emergency".into(),
        token: t,
    }];
    assert_eq!(
        a.renew("a", &held, ttl).await.expect("renew"),
        [Renewal::NotHeld]
    );
    assert!(!a.release("emergency", "a", t).await.expect("release"));
    match b.try_acquire(&emergency("op2")).await.expect("acquire") {
        AcquireOutcome::Held(r) => {
            assert_eq!((r.owner.as_str(), r.priority), ("op", EMERGENCY_PRIORITY))
        }
        AcquireOutcome::Granted(_) => panic!("emergency took over an equal priority"),
    }
}

/// A case's history, recorded as the one history type ([`Entry`]) from every party's
/// LeaseActor traces and judged by the one checker ([`check`]), as `tenure check` judges
/// a cluster's. Each party is its own node and incarnation, named by its owner.
#[derive(Clone)]
pub struct History {
    recorder: Recorder,
}

impl Default for History {
    fn default() -> Self {
        History {
            recorder: Recorder::new("conformance", "conformance"),
        }
    }
}

impl History {
    /// An observer recording the lease events of `owner`'s LeaseActor: each trace emitted
    /// again, as the lease core's history emitter emits it, into this history.
    pub fn observer(&self, owner: &str) -> LeaseObserver {
        let recorder = self.recorder.clone();
        let owner = owner.to_string();
        LeaseObserver::new(move |lease, holder, trace| {
            recorder.record_as(&owner, &owner, || {
                tenure_lease::history::emit(lease, holder, trace)
            })
        })
    }

    /// `lease`'s holder stops acting on its grant and releases it (its LeaseActor records
    /// the end of its belief before it asks the store).
    pub async fn release(&self, lease: &Lease) -> bool {
        lease.release().await.expect("release")
    }

    /// Checks the history with the one checker and returns the holds of its one lease in
    /// grant order. Safe means no violation at all, except that a grant to
    /// `emergency_owner` may overlap the grant it took over (fencing tokens order them).
    pub fn check(&self, emergency_owner: Option<&str>) -> Vec<Hold> {
        let unknown = self.recorder.unknown_events();
        assert_eq!(
            unknown.count(),
            0,
            "events no history knows: {:?}",
            unknown.reasons()
        );
        judge(self.recorder.entries(), emergency_owner)
    }
}

/// The holds of the one lease of `entries` in grant order, asserting that the checker finds
/// no violation but those [`History::check`] allows.
fn judge(mut entries: Vec<Entry>, emergency_owner: Option<&str>) -> Vec<Hold> {
    entries.sort_by_key(|e| e.t);
    let verdict = check(&entries);
    let unexpected: Vec<&Violation> = verdict
        .violations
        .iter()
        .filter(|v| {
            !(v.kind == ViolationKind::Overlap && emergency_owner == Some(v.second.node.as_str()))
        })
        .collect();
    assert!(
        unexpected.is_empty(),
        "unsafe history:\n{}",
        unexpected
            .iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let mut holds = verdict.holds.into_values();
    let one = holds.next().unwrap_or_default();
    assert!(holds.next().is_none(), "a case has one lease");
    one
}

struct Party {
    lease: Lease,
    events: mpsc::UnboundedReceiver<LeaseEvent>,
}

async fn party(
    h: &dyn Harness,
    history: &History,
    name: &str,
    owner: &str,
    options: AcquireOptions,
) -> Party {
    let (tx, events) = mpsc::unbounded_channel();
    let store = preempting_client(h).await;
    let spec = LeaseSpec::new(name, owner, store, test_settings())
        .expect("valid spec")
        .with_note(format!("{owner} at work"))
        .with_options(options)
        .expect("valid options");
    let spec = spec.with_observer(history.observer(owner));
    let sink = LeaseEventSink::new(move |event| {
        let _ = tx.send(event);
    });
    let lease = Lease::start_with_events(spec, sink)
        .await
        .expect("lease actor starts");
    Party { lease, events }
}

fn options(priority: u64, cleanup_ms: u64) -> AcquireOptions {
    AcquireOptions::with_priority(priority).cleanup_timeout(Duration::from_millis(cleanup_ms))
}

async fn must_grant(lease: &Lease) -> FencingToken {
    match lease.acquire().await.expect("acquire") {
        Acquired::Granted { token } => token,
        other => panic!("{} not granted: {other:?}", lease.owner()),
    }
}

/// Waits (at most 10 s) for the next preemption request event.
async fn next_request(p: &mut Party) -> tenure_lease::PreemptionRequested {
    let wait = async {
        while let Some(e) = p.events.recv().await {
            if let LeaseEvent::PreemptionRequested(r) = e {
                return r;
            }
        }
        panic!("{}: event stream ended", p.lease.owner())
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap_or_else(|_| panic!("{} was never asked to give up", p.lease.owner()))
}

/// Helix: a lower (or equal) priority requester is not granted; it is told the holder and
/// its priority, and the holder keeps the lease.
pub async fn helix_lower_priority_rejected(h: &dyn Harness) {
    let history = History::default();
    let holder = party(h, &history, "helix-lower", "holder", options(5, 1000)).await;
    must_grant(&holder.lease).await;
    for p in [1, 5] {
        let other = party(h, &history, "helix-lower", &format!("r{p}"), options(p, 0)).await;
        assert_eq!(
            other.lease.acquire().await.expect("acquire"),
            Acquired::NotGranted {
                holder: Some("holder".into()),
                priority: 5
            }
        );
    }
    sleep(Duration::from_millis(600)).await;
    assert!(holder.lease.check_lease());
    assert_eq!(history.check(None).len(), 1);
}

/// Helix: a higher-priority requester asks; the holder is told (with a cleanup deadline),
/// cleans up within its cleanup timeout and releases; the requester is granted a higher token.
pub async fn helix_cleanup_in_time(h: &dyn Harness) {
    let history = History::default();
    let mut holder = party(h, &history, "helix-cleanup", "holder", options(1, 3000)).await;
    let t1 = must_grant(&holder.lease).await;
    let requester = party(h, &history, "helix-cleanup", "requester", options(7, 0)).await;
    let waiting = tokio::spawn(async move {
        let answer = requester.lease.acquire().await;
        (answer, requester)
    });
    let asked = next_request(&mut holder).await;
    assert_eq!(
        (asked.by.as_str(), asked.priority, asked.token),
        ("requester", 7, t1)
    );
    assert_eq!(asked.note.as_deref(), Some("requester at work"));
    sleep(Duration::from_millis(300)).await; // cleaning up
    assert!(history.release(&holder.lease).await);
    let (answer, requester) = waiting.await.expect("requester task");
    let Ok(Acquired::Granted { token }) = answer else {
        panic!("requester not granted: {answer:?}")
    };
    assert!(token > t1);
    let spans = history.check(None);
    assert_eq!(spans.len(), 2, "{spans:#?}");
    assert!(history.release(&requester.lease).await);
}

/// Helix: the holder does not finish cleanup in time and the requester is not forceful:
/// it gets `CleanupTimedOut` and nothing changes (same holder, same token, no request).
pub async fn helix_cleanup_timeout(h: &dyn Harness) {
    let history = History::default();
    let holder = party(h, &history, "helix-slow", "holder", options(0, 800)).await;
    let t1 = must_grant(&holder.lease).await;
    let requester = party(h, &history, "helix-slow", "requester", options(3, 0)).await;
    match requester.lease.acquire().await {
        Err(LeaseError::CleanupTimedOut {
            holder: who,
            cleanup_timeout,
            ..
        }) => assert_eq!(
            (who.as_str(), cleanup_timeout),
            ("holder", Duration::from_millis(800))
        ),
        other => panic!("expected CleanupTimedOut, got {other:?}"),
    }
    sleep(Duration::from_millis(600)).await;
    assert_eq!(holder.lease.token(), Some(t1), "the holder keeps its grant");
    let rec = h
        .client()
        .await
        .read("helix-slow")
        .await
        .expect("read")
        .expect("held");
    assert_eq!((rec.token, rec.request), (t1, None));
    assert_eq!(history.check(None).len(), 1);
}

/// Helix: the holder does not finish cleanup in time and the requester is forceful: the
/// holder loses the lease (Preempted) before the requester is granted; never two holders.
pub async fn helix_forceful(h: &dyn Harness) {
    let history = History::default();
    let mut holder = party(h, &history, "helix-force", "holder", options(0, 500)).await;
    let t1 = must_grant(&holder.lease).await;
    let forceful = options(3, 0).forceful(true);
    let requester = party(h, &history, "helix-force", "requester", forceful).await;
    let t2 = must_grant(&requester.lease).await;
    assert!(t2 > t1);
    let spans = history.check(None);
    assert_eq!(spans.len(), 2, "{spans:#?}");
    assert_eq!(
        spans[0].end,
        HoldEnd::Lost(LostReason::Preempted.kind().to_string()),
        "{spans:#?}"
    );
    assert!(!holder.lease.check_lease());
    // The holder was told (the request, then the loss), in that order.
    let mut told = Vec::new();
    while let Ok(e) = holder.events.try_recv() {
        told.push(e);
    }
    let requested = told
        .iter()
        .position(|e| matches!(e, LeaseEvent::PreemptionRequested(p) if p.by == "requester"));
    let lost = told.iter().position(|e| matches!(e, LeaseEvent::Lost(_)));
    assert!(
        requested.is_some() && requested < lost,
        "holder events: {told:?}"
    );
}

/// Helix: a third requester with an even higher priority overtakes a waiting one, which is
/// told so; the holder releases for the highest, which is granted.
pub async fn helix_overtaken(h: &dyn Harness) {
    let history = History::default();
    let mut holder = party(h, &history, "helix-overtake", "holder", options(0, 5000)).await;
    let t1 = must_grant(&holder.lease).await;
    let low = party(h, &history, "helix-overtake", "low", options(3, 0)).await;
    let low_waiting = tokio::spawn(async move { (low.lease.acquire().await, low) });
    assert_eq!(next_request(&mut holder).await.by, "low");
    let high = party(h, &history, "helix-overtake", "high", options(8, 0)).await;
    let high_waiting = tokio::spawn(async move { (high.lease.acquire().await, high) });
    let (answer, _low) = low_waiting.await.expect("low task");
    match answer {
        Err(LeaseError::Overtaken { by, priority, .. }) => {
            assert_eq!((by.as_str(), priority), ("high", 8))
        }
        other => panic!("expected Overtaken, got {other:?}"),
    }
    assert_eq!(next_request(&mut holder).await.by, "high");
    assert!(history.release(&holder.lease).await);
    let (answer, high) = high_waiting.await.expect("high task");
    let Ok(Acquired::Granted { token }) = answer else {
        panic!("high not granted: {answer:?}")
    };
    assert!(token > t1);
    assert_eq!(history.check(None).len(), 2);
    assert!(history.release(&high.lease).await);
}

/// Helix's emergency priority: granted at once over a lower holder with a higher token; the
/// old holder gives up at its next renewal or local deadline at the latest. Only here may
/// beliefs overlap, and the tokens order them.
pub async fn helix_emergency(h: &dyn Harness) {
    let history = History::default();
    let holder = party(
        h,
        &history,
        "helix-emergency",
        "holder",
        options(100, 60_000),
    )
    .await;
    let t1 = must_grant(&holder.lease).await;
    let emergency = options(EMERGENCY_PRIORITY, 0).emergency(true);
    let operator = party(h, &history, "helix-emergency", "operator", emergency).await;
    let t2 = must_grant(&operator.lease).await;
    assert!(
        t2 > t1,
        "fencing orders the emergency grant after the old one"
    );
    let ttl = test_settings().heartbeat_timeout;
    let started = Instant::now();
    while holder.lease.check_lease() {
        assert!(started.elapsed() < ttl * 4, "the old holder never gave up");
        sleep(Duration::from_millis(20)).await;
    }
    let spans = history.check(Some("operator"));
    assert_eq!(spans.len(), 2, "{spans:#?}");
    assert_ne!(spans[0].end, HoldEnd::Unknown, "{spans:#?}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure_history::Event;

    /// Owner `owner` granted `token` at `from` (valid until `from + 100`), ending at `until`
    /// (lost) when given.
    fn history(spans: &[(&str, u64, i64, Option<i64>)]) -> Vec<Entry> {
        let mut entries = Vec::new();
        for &(owner, token, from, until) in spans {
            let lease = "l".to_string();
            let granted = Event::LeaseGranted {
                lease: lease.clone(),
                owner: owner.into(),
                token,
                valid_until: from + 100,
            };
            entries.push(Entry::new(from, owner, owner, granted));
            if let Some(until) = until {
                let lost = Event::LeaseLost {
                    lease,
                    owner: owner.into(),
                    token,
                    reason: "expired".into(),
                };
                entries.push(Entry::new(until, owner, owner, lost));
            }
        }
        entries
    }

    #[test]
    fn disjoint_beliefs_with_increasing_tokens_pass() {
        judge(history(&[("a", 1, 0, Some(10)), ("b", 2, 10, None)]), None);
    }

    #[test]
    #[should_panic(expected = "overlapping holders")]
    fn overlapping_beliefs_fail() {
        judge(history(&[("a", 1, 0, Some(11)), ("b", 2, 10, None)]), None);
    }

    #[test]
    #[should_panic(expected = "overlapping holders")]
    fn a_belief_never_ended_lasts_until_its_deadline() {
        judge(history(&[("a", 1, 0, None), ("b", 2, 99, Some(120))]), None);
    }

    #[test]
    fn only_the_emergency_owner_may_overlap() {
        let h = history(&[("a", 1, 0, Some(15)), ("op", 2, 10, None)]);
        judge(h.clone(), Some("op"));
        let result = std::panic::catch_unwind(|| judge(h, Some("other")));
        assert!(result.is_err());
    }

    #[test]
    #[should_panic(expected = "token not increasing")]
    fn tokens_out_of_grant_order_fail() {
        judge(history(&[("a", 2, 0, Some(5)), ("b", 1, 10, None)]), None);
    }
}
