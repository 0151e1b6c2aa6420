//! Store-level cases of the preemption SPI (capability `preemption`): the rules of
//! [`LeaseStore::request_preemption`], forceful requests ending a grant at its expiry and
//! never before the holder's deadline, emergency take-overs, and requests dying with their
//! grant. Invoke with [`preemption_spi_tests!`](crate::preemption_spi_tests) next to
//! [`conformance_tests!`](crate::conformance_tests).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::{Harness, granted_token, poll_until_granted, request, test_settings};
use crate::{
    AcquireOutcome, AcquireRequest, EMERGENCY_PRIORITY, HeldLease, LeaseStore, PreemptAnswer,
    PreemptionRequest, Renewal,
};

fn prioritized(name: &str, owner: &str, priority: u64) -> AcquireRequest {
    AcquireRequest {
        priority,
        ..request(name, owner, test_settings().heartbeat_timeout)
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

fn held(name: &str, token: u64) -> Vec<HeldLease> {
    vec![HeldLease {
        name: name.into(),
        token,
    }]
}

async fn grant(store: &dyn LeaseStore, req: &AcquireRequest) -> u64 {
    granted_token(&store.try_acquire(req).await.expect("acquire"))
}

async fn renew_one(store: &dyn LeaseStore, owner: &str, name: &str, token: u64) -> Renewal {
    let mut answers = store
        .renew(owner, &held(name, token), test_settings().heartbeat_timeout)
        .await
        .expect("renew");
    assert_eq!(answers.len(), 1);
    answers.remove(0)
}

fn recorded(answer: PreemptAnswer) -> crate::LeaseRecord {
    match answer {
        PreemptAnswer::Recorded(r) => r,
        other => panic!("expected Recorded, got {other:?}"),
    }
}

fn refused(answer: PreemptAnswer) -> crate::LeaseRecord {
    match answer {
        PreemptAnswer::Refused(r) => r,
        other => panic!("expected Refused, got {other:?}"),
    }
}

/// Who may record a request on whom: lower or equal priority refused (the record says
/// the holder's priority); a higher one recorded and shown to the holder's renewal and to
/// readers; another owner's lower request refused, a higher one overtakes; withdrawal only
/// by the pending request's owner; a wrong token is `Gone`. The token never changes.
pub async fn preemption_rules(h: &dyn Harness) {
    let (a, b) = (h.client().await, h.client().await);
    let holder = AcquireRequest {
        note: Some("nightly report".into()),
        cleanup_timeout: Duration::from_millis(700),
        ..prioritized("prio-rules", "a", 3)
    };
    let t = grant(&*a, &holder).await;
    match b
        .try_acquire(&prioritized("prio-rules", "b", 9))
        .await
        .expect("acquire")
    {
        AcquireOutcome::Held(r) => {
            assert_eq!((r.owner.as_str(), r.priority, r.token), ("a", 3, t));
            assert_eq!(r.cleanup_timeout, Duration::from_millis(700));
            assert_eq!(r.note.as_deref(), Some("nightly report"));
            assert_eq!(r.request, None);
        }
        other => panic!("a higher priority alone does not take over: {other:?}"),
    }
    for p in [0, 3] {
        let r = refused(
            b.request_preemption("prio-rules", t, &ask("b", p, false))
                .await
                .expect("request"),
        );
        assert_eq!((r.priority, r.request.clone()), (3, None), "{r:?}");
    }
    let r = recorded(
        b.request_preemption("prio-rules", t, &ask("b", 5, false))
            .await
            .expect("request"),
    );
    assert_eq!((r.token, r.request.clone()), (t, Some(ask("b", 5, false))));
    assert_eq!(
        renew_one(&*a, "a", "prio-rules", t).await,
        Renewal::Renewed {
            request: Some(ask("b", 5, false))
        }
    );
    let read = b.read("prio-rules").await.expect("read").expect("held");
    assert_eq!((read.token, read.priority), (t, 3));
    assert_eq!(read.request, Some(ask("b", 5, false)));
    // Another owner: lower refused (the record shows b's), higher overtakes.
    let r = refused(
        b.request_preemption("prio-rules", t, &ask("c", 4, false))
            .await
            .expect("request"),
    );
    assert_eq!(r.request, Some(ask("b", 5, false)));
    recorded(
        a.request_preemption("prio-rules", t, &ask("c", 6, false))
            .await
            .expect("request"),
    );
    refused(
        b.request_preemption("prio-rules", t, &ask("b", 6, false))
            .await
            .expect("request"),
    );
    assert!(
        !b.withdraw_preemption("prio-rules", t, "b")
            .await
            .expect("withdraw")
    );
    assert!(
        b.withdraw_preemption("prio-rules", t, "c")
            .await
            .expect("withdraw")
    );
    assert_eq!(
        renew_one(&*a, "a", "prio-rules", t).await,
        Renewal::Renewed { request: None }
    );
    assert_eq!(
        b.request_preemption("prio-rules", t + 1, &ask("b", 9, false))
            .await
            .expect("request"),
        PreemptAnswer::Gone
    );
    assert!(
        !b.withdraw_preemption("prio-rules", t + 1, "b")
            .await
            .expect("withdraw")
    );
    // The same owner updates its request; the holder's reentrant acquire keeps it.
    recorded(
        b.request_preemption("prio-rules", t, &ask("b", 4, false))
            .await
            .expect("request"),
    );
    match a.try_acquire(&holder).await.expect("reacquire") {
        AcquireOutcome::Granted(r) => {
            assert_eq!((r.token, r.request), (t, Some(ask("b", 4, false))));
        }
        other => panic!("reentrant acquire: {other:?}"),
    }
    assert!(a.release("prio-rules", "a", t).await.expect("release"));
    // The request went with the grant.
    assert_eq!(
        b.request_preemption("prio-rules", t, &ask("b", 9, false))
            .await
            .expect("request"),
        PreemptAnswer::Gone
    );
    let t2 = grant(&*b, &prioritized("prio-rules", "b", 1)).await;
    assert!(t2 > t);
    let read = a.read("prio-rules").await.expect("read").expect("held");
    assert_eq!((read.owner.as_str(), read.request), ("b", None));
}

/// A forceful request: every later renewal of the grant is refused and extends nothing,
/// the holder's own reentrant acquire is `Held`, and the grant goes to a contender, with a
/// higher token, only after the holder's deadline from its last successful renewal, even
/// while the holder keeps renewing another lease on the same client (its session alive).
pub async fn forceful_request_ends_grant_at_expiry(h: &dyn Harness) {
    let settings = test_settings();
    let ttl = settings.heartbeat_timeout;
    let (a, b) = (h.client().await, h.client().await);
    let t = grant(&*a, &prioritized("prio-forced", "a", 1)).await;
    let other = grant(&*a, &prioritized("prio-forced-other", "a", 1)).await;
    let sent = Instant::now();
    assert_eq!(
        renew_one(&*a, "a", "prio-forced", t).await,
        Renewal::Renewed { request: None }
    );
    let deadline = sent + ttl - settings.safety_margin;
    let r = recorded(
        b.request_preemption("prio-forced", t, &ask("b", 2, true))
            .await
            .expect("request"),
    );
    assert_eq!(r.request, Some(ask("b", 2, true)));
    assert_eq!(
        renew_one(&*a, "a", "prio-forced", t).await,
        Renewal::Refused(ask("b", 2, true))
    );
    match a
        .try_acquire(&prioritized("prio-forced", "a", 1))
        .await
        .expect("reacquire")
    {
        AcquireOutcome::Held(r) => assert_eq!(r.token, t),
        other => panic!("a forced grant is not refreshed, even for its holder: {other:?}"),
    }
    // The holder's client stays busy: renewals of both leases every 100 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let renewer = {
        let (a, stop) = (a.clone(), stop.clone());
        tokio::spawn(async move {
            let batch = [
                HeldLease {
                    name: "prio-forced".into(),
                    token: t,
                },
                HeldLease {
                    name: "prio-forced-other".into(),
                    token: other,
                },
            ];
            while !stop.load(Ordering::SeqCst) {
                if let Ok(answers) = a.renew("a", &batch, ttl).await {
                    assert!(
                        !answers[0].is_renewed(),
                        "a forced grant was renewed: {answers:?}"
                    );
                    assert!(answers[1].is_renewed(), "the other lease: {answers:?}");
                }
                sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let (granted_at, t2) = poll_until_granted(&*b, "prio-forced", "b", ttl).await;
    stop.store(true, Ordering::SeqCst);
    renewer
        .await
        .expect("the holder's renewals never extended the forced grant");
    assert!(t2 > t, "token {t2} after {t}");
    assert!(
        granted_at >= deadline,
        "granted {:?} before the holder's deadline",
        deadline - granted_at
    );
    assert_eq!(
        renew_one(&*a, "a", "prio-forced", t).await,
        Renewal::NotHeld
    );
    assert!(
        renew_one(&*a, "a", "prio-forced-other", other)
            .await
            .is_renewed()
    );
}

/// The emergency level takes a lower-priority grant over at once with a higher token (the
/// old holder's renewals then answer `NotHeld`); it does not take an equal one, and
/// without `emergency` the same priority only gets `Held`.
pub async fn emergency_takes_over(h: &dyn Harness) {
    let (a, b, c) = (h.client().await, h.client().await, h.client().await);
    let t = grant(&*a, &prioritized("prio-emergency", "a", 7)).await;
    match b
        .try_acquire(&prioritized("prio-emergency", "b", EMERGENCY_PRIORITY))
        .await
        .expect("acquire")
    {
        AcquireOutcome::Held(r) => assert_eq!(r.token, t),
        other => panic!("without emergency: {other:?}"),
    }
    let emergency = |owner: &str| AcquireRequest {
        emergency: true,
        ..prioritized("prio-emergency", owner, EMERGENCY_PRIORITY)
    };
    let t2 = grant(&*b, &emergency("b")).await;
    assert!(t2 > t);
    assert_eq!(
        renew_one(&*a, "a", "prio-emergency", t).await,
        Renewal::NotHeld
    );
    assert!(!a.release("prio-emergency", "a", t).await.expect("release"));
    match c.try_acquire(&emergency("c")).await.expect("acquire") {
        AcquireOutcome::Held(r) => {
            assert_eq!((r.owner.as_str(), r.token, r.priority), ("b", t2, u64::MAX))
        }
        other => panic!("emergency over an equal priority: {other:?}"),
    }
    assert!(renew_one(&*b, "b", "prio-emergency", t2).await.is_renewed());
}

/// A forceful request pending across a store restart still ends the grant: the contender
/// is granted after the holder's deadline, with a higher token.
pub async fn forceful_request_survives_restart(h: &dyn Harness) {
    let settings = test_settings();
    let ttl = settings.heartbeat_timeout;
    let (a, b) = (h.client().await, h.client().await);
    let t = grant(&*a, &prioritized("prio-restart", "a", 1)).await;
    let sent = Instant::now();
    assert!(renew_one(&*a, "a", "prio-restart", t).await.is_renewed());
    let deadline = sent + ttl - settings.safety_margin;
    recorded(
        b.request_preemption("prio-restart", t, &ask("b", 2, true))
            .await
            .expect("request"),
    );
    h.restart().await;
    // The holder goes on trying: errors while the store comes back, never a renewal.
    let mut tries = 0;
    let (granted_at, t2) = loop {
        if let Ok(answers) = a.renew("a", &held("prio-restart", t), ttl).await {
            assert!(!answers[0].is_renewed(), "renewed after the request");
        }
        match b.try_acquire(&prioritized("prio-restart", "b", 2)).await {
            Ok(AcquireOutcome::Granted(r)) => break (Instant::now(), r.token),
            Ok(AcquireOutcome::Held(r)) => assert_eq!(r.token, t),
            Err(_) => {}
        }
        tries += 1;
        assert!(tries < 400, "the forced grant never ended");
        sleep(Duration::from_millis(50)).await;
    };
    assert!(t2 > t);
    assert!(
        granted_at >= deadline,
        "granted before the holder's deadline"
    );
}

/// Defines one `#[tokio::test]` per preemption SPI case, for stores with capability
/// `preemption`. `$harness` is an async expression giving a fresh [`Harness`] per test.
#[macro_export]
macro_rules! preemption_spi_tests {
    ($harness:expr) => {
        $crate::preemption_spi_tests!(@case $harness; preemption_rules,
            forceful_request_ends_grant_at_expiry, emergency_takes_over,
            forceful_request_survives_restart);
    };
    (@case $harness:expr; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness = $harness.await;
                $crate::conformance::preemption::$case(&harness).await;
            }
        )*
    };
}
