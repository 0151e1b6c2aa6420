//! Preemption cases for stores whose holders share one session (or connection) for all
//! their leases, and across store restarts: a forcefully preempted grant must end although
//! the holder's client stays alive and busy renewing its other leases, and a pending
//! forceful request must survive a restart of the store. Invoke with
//! [`preemption_fault_tests!`](crate::preemption_fault_tests) next to
//! [`conformance_tests!`](crate::conformance_tests).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::{
    Harness, granted_token, poll_until_granted, preemption_requests_of, request, test_settings,
};
use tenure_lease::FencingToken;
use tenure_lease::{
    AcquireOutcome, AcquireRequest, HeldLease, LeaseStore, PreemptAnswer, PreemptionRequest,
};

/// Acquires `name` for `owner` at priority 1 with the test ttl.
async fn grant(store: &dyn LeaseStore, name: &str, owner: &str) -> FencingToken {
    let req = AcquireRequest {
        priority: 1,
        ..request(name, owner, test_settings().heartbeat_timeout)
    };
    granted_token(&store.try_acquire(&req).await.expect("acquire"))
}

/// Records `by`'s forceful request (priority 2) on grant `token` of `name`.
async fn force(store: &dyn LeaseStore, name: &str, token: FencingToken, by: &str) {
    let q = PreemptionRequest {
        by: by.into(),
        instance: format!("{by}-instance"),
        priority: 2,
        forceful: true,
        note: None,
    };
    let answer = preemption_requests_of(store)
        .request_preemption(name, token, &q)
        .await
        .expect("request preemption");
    assert!(
        matches!(answer, PreemptAnswer::Recorded(_)),
        "not recorded: {answer:?}"
    );
}

fn held(leases: &[(&str, FencingToken)]) -> Vec<HeldLease> {
    leases
        .iter()
        .map(|(name, token)| HeldLease {
            name: name.to_string(),
            token: *token,
        })
        .collect()
}

/// The holder's client renews a forcefully preempted lease together with another lease,
/// back to back, so its session (etcd lease, ZooKeeper session, connection) never idles:
/// the forced grant is never renewed, yet ends, and a contender is granted it (higher
/// token) only at least one ttl after the holder SENT its last renewal answered
/// `Renewed`; the other lease stays renewed throughout.
pub async fn forced_grant_ends_while_holder_renews_others(h: &dyn Harness) {
    let ttl = test_settings().heartbeat_timeout;
    let (a, b) = (h.client().await, h.client().await);
    let t = grant(&*a, "forced-busy", "a").await;
    let other = grant(&*a, "forced-busy-other", "a").await;
    let last_renewed = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let stop = Arc::new(AtomicBool::new(false));
    let renewer = {
        let (a, last, stop) = (a.clone(), last_renewed.clone(), stop.clone());
        tokio::spawn(async move {
            let batch = held(&[("forced-busy", t), ("forced-busy-other", other)]);
            while !stop.load(Ordering::SeqCst) {
                let sent = Instant::now();
                let answers = a.renew("a", &batch, ttl).await.expect("renew");
                if answers[0].is_renewed() {
                    *last.lock().unwrap_or_else(|e| e.into_inner()) = Some(sent);
                }
                assert!(answers[1].is_renewed(), "the other lease: {answers:?}");
            }
        })
    };
    sleep(ttl / 4).await;
    force(&*b, "forced-busy", t, "b").await;
    let (granted_at, t2) = poll_until_granted(&*b, "forced-busy", "b", ttl).await;
    stop.store(true, Ordering::SeqCst);
    renewer.await.expect("the other lease stayed renewed");
    let last = last_renewed
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .expect("renewed before the request");
    assert!(t2 > t, "token {t2} after {t}");
    assert!(
        granted_at >= last + ttl,
        "granted {:?} before the last renewal's ttl ran out",
        last + ttl - granted_at
    );
    let answers = a
        .renew("a", &held(&[("forced-busy", t)]), ttl)
        .await
        .expect("renew");
    assert!(!answers[0].is_renewed(), "{answers:?}");
}

/// A forceful request pending while the store restarts still ends the grant: the holder
/// keeps trying to renew (errors while the store is down, never a renewal), and the
/// contender is granted, with a higher token, only at least one ttl after the holder sent
/// its last successful renewal.
pub async fn forceful_request_survives_restart(h: &dyn Harness) {
    let ttl = test_settings().heartbeat_timeout;
    let (a, b) = (h.client().await, h.client().await);
    let t = grant(&*a, "forced-restart", "a").await;
    let batch = held(&[("forced-restart", t)]);
    let sent = Instant::now();
    let answers = a.renew("a", &batch, ttl).await.expect("renew");
    assert!(answers[0].is_renewed(), "{answers:?}");
    force(&*b, "forced-restart", t, "b").await;
    h.restart().await;
    let contender = AcquireRequest {
        priority: 2,
        ..request("forced-restart", "b", ttl)
    };
    let started = Instant::now();
    let (granted_at, t2) = loop {
        if let Ok(answers) = a.renew("a", &batch, ttl).await {
            assert!(!answers[0].is_renewed(), "renewed after the request");
        }
        match b.try_acquire(&contender).await {
            Ok(AcquireOutcome::Granted(r)) => break (Instant::now(), r.token),
            Ok(AcquireOutcome::Held(r)) => assert_eq!(r.token, t),
            Err(_) => {}
        }
        assert!(started.elapsed() < ttl * 20, "the forced grant never ended");
        sleep(Duration::from_millis(50)).await;
    };
    assert!(t2 > t, "token {t2} after {t}");
    assert!(
        granted_at >= sent + ttl,
        "granted before the holder's last renewal expired"
    );
}

/// Defines one `#[tokio::test]` per case of this module, for stores with capability
/// `preemption`. `$harness` is an async expression giving a fresh [`Harness`] per test.
#[macro_export]
macro_rules! preemption_fault_tests {
    ($harness:expr) => {
        $crate::preemption_fault_tests!(@case $harness;
            forced_grant_ends_while_holder_renews_others, forceful_request_survives_restart);
    };
    (@case $harness:expr; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness = $harness.await;
                $crate::conformance::preemption_faults::$case(&harness).await;
            }
        )*
    };
}
