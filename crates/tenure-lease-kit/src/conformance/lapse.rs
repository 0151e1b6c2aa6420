//! Unknown outcomes lapse, sessions recover: an `Err` means "maybe granted", and such a
//! grant lapses after its ttl on every store, however its owner's other leases live on; a
//! holder whose session ended (or whose grant an operator released) acquires again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{Instant, sleep, timeout};

use super::{
    Harness, granted_token, lease_on, lease_with, poll_until_granted, request, test_settings,
};
use tenure_lease::FencingToken;
use tenure_lease::{
    Acquired, HeldLease, LeaseError, LeaseSettings, LeaseStore, LostReason, Renewal, StoreError,
};

/// How late answers come while a client's answers are delayed: past the operation timeout.
fn late() -> Duration {
    test_settings().lease_operation_timeout + Duration::from_millis(300)
}

/// When each renewal was answered, and its answer (`Err(Elapsed)`: none within the
/// operation timeout).
type RenewLog = Arc<
    Mutex<
        Vec<(
            Instant,
            Result<Result<Vec<Renewal>, StoreError>, tokio::time::error::Elapsed>,
        )>,
    >,
>;

/// Renews `lease` of `owner` through `store` every 300 ms (each call bounded by the
/// operation timeout), logging when each answer came and what it was, until `stop`.
fn keep_renewing(
    store: Arc<dyn LeaseStore>,
    owner: &'static str,
    lease: HeldLease,
    ttl: Duration,
    stop: Arc<AtomicBool>,
) -> (RenewLog, tokio::task::JoinHandle<()>) {
    let log = RenewLog::default();
    let l = log.clone();
    let task = tokio::spawn(async move {
        while !stop.load(Ordering::SeqCst) {
            let limit = test_settings().lease_operation_timeout;
            let answer =
                timeout(limit, store.renew(owner, std::slice::from_ref(&lease), ttl)).await;
            l.lock().unwrap().push((Instant::now(), answer));
            sleep(Duration::from_millis(300)).await;
        }
    });
    (log, task)
}

/// An acquire and a release whose answers are lost (the store applied them, the caller had
/// given up past its operation timeout) leave at most grants that lapse after their ttl,
/// although their owner keeps renewing another lease through the same client (on the same
/// session, where the store has sessions): another owner is granted both leases, with
/// higher tokens, while the owner's renewals of its other lease go on.
pub async fn lost_answers_lapse(h: &dyn Harness) {
    let (slow, delay) = h.delayed_client().await;
    let other = h.client().await;
    // Long enough for the kept lease to outlive the time its renewals are late.
    let ttl = Duration::from_secs(4);
    let limit = test_settings().lease_operation_timeout;
    let kept = granted_token(
        &slow
            .try_acquire(&request("kept", "a", ttl))
            .await
            .expect("acquire"),
    );
    let unreleased = granted_token(
        &slow
            .try_acquire(&request("unreleased", "a", ttl))
            .await
            .expect("acquire"),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let held = HeldLease {
        name: "kept".into(),
        token: kept,
    };
    let (renewals, renewer) = keep_renewing(slow.clone(), "a", held, ttl, stop.clone());
    delay.set(Some(late()));
    let lost_answer = request("lost-answer", "a", ttl);
    let (acquire, release) = tokio::join!(
        timeout(limit, slow.try_acquire(&lost_answer)),
        timeout(limit, slow.release("unreleased", "a", unreleased)),
    );
    delay.set(None);
    assert!(
        !matches!(acquire, Ok(Ok(_))),
        "the acquire was answered although its answer was late: {acquire:?}"
    );
    assert!(
        !matches!(release, Ok(Ok(_))),
        "the release was answered although its answer was late: {release:?}"
    );
    let (lost_at, _) = poll_until_granted(&*other, "lost-answer", "b", ttl).await;
    let (unreleased_at, after) = poll_until_granted(&*other, "unreleased", "b", ttl).await;
    assert!(after > unreleased);
    // The owner's renewals of the kept lease went on past both grants to b.
    let since = lost_at.max(unreleased_at);
    let renewed_after = |log: &RenewLog| {
        log.lock().unwrap().iter().any(|(at, r)| {
            *at > since && matches!(r, Ok(Ok(v)) if v.first().is_some_and(Renewal::is_renewed))
        })
    };
    let started = Instant::now();
    while !renewed_after(&renewals) {
        assert!(
            started.elapsed() < ttl,
            "a's renewals of its kept lease stopped: {:?}",
            renewals.lock().unwrap()
        );
        sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::SeqCst);
    renewer.await.expect("renewer");
    let rec = other.read("kept").await.expect("read").expect("kept held");
    assert_eq!((rec.owner.as_str(), rec.token), ("a", kept));
}

/// A reentrant acquire whose answer is lost (past the operation timeout) does not end the
/// grant its holder goes on renewing: no loss, the same token, still held in the store.
pub async fn lost_reentrant_answer_keeps_the_grant(h: &dyn Harness) {
    let (slow, delay) = h.delayed_client().await;
    // Renewals are late too meanwhile: the validity outlasts that.
    let settings = LeaseSettings {
        heartbeat_timeout: Duration::from_secs(4),
        heartbeat_interval: Duration::from_millis(400),
        safety_margin: Duration::from_millis(500),
        ..test_settings()
    };
    let lease = lease_with(slow, "reentered", "a", settings).await;
    let losses: Arc<Mutex<Vec<LostReason>>> = Arc::default();
    let l = losses.clone();
    let Acquired::Granted { token } = lease
        .acquire_with_lost(move |lost| l.lock().unwrap().push(lost.reason))
        .await
        .expect("acquire")
    else {
        panic!("the free lease was not granted")
    };
    sleep(settings.heartbeat_interval * 2).await;
    delay.set(Some(late()));
    let again = lease.acquire().await;
    delay.set(None);
    assert!(
        again.is_err(),
        "the reentrant acquire was answered although its answer was late: {again:?}"
    );
    // Renewals resume; the grant stays, for more than a ttl.
    sleep(settings.heartbeat_timeout + settings.heartbeat_interval * 3).await;
    assert_eq!(*losses.lock().unwrap(), [], "the holder lost its grant");
    assert!(lease.check_lease());
    assert_eq!(
        lease.acquire().await.expect("acquire"),
        Acquired::Granted { token }
    );
    let rec = h
        .client()
        .await
        .read("reentered")
        .await
        .expect("read")
        .expect("held");
    assert_eq!((rec.owner.as_str(), rec.token), ("a", token));
    assert!(lease.release().await.expect("release"));
}

/// After an operator released the holder's grant, the holder's next acquire is granted a
/// new token (the loss of the old one announced first), and acquiring again re-enters that
/// grant: the same token every time, across renewals.
pub async fn reentry_after_an_operator_release(h: &dyn Harness) {
    let operator = h.client().await;
    let lease = lease_on(h.client().await, "operator-released", "a").await;
    let losses: Arc<Mutex<Vec<(FencingToken, LostReason)>>> = Arc::default();
    let l = losses.clone();
    let Acquired::Granted { token: t1 } = lease
        .acquire_with_lost(move |lost| l.lock().unwrap().push((lost.token, lost.reason)))
        .await
        .expect("acquire")
    else {
        panic!("the free lease was not granted")
    };
    assert!(
        operator
            .release("operator-released", "a", t1)
            .await
            .expect("release as an operator")
    );
    let Acquired::Granted { token: t2 } = lease.acquire().await.expect("acquire") else {
        panic!("not granted after the operator's release")
    };
    assert!(t2 > t1);
    for _ in 0..4 {
        assert_eq!(
            lease.acquire().await.expect("acquire"),
            Acquired::Granted { token: t2 },
            "a reentrant acquire minted a new token"
        );
        sleep(test_settings().heartbeat_interval).await;
    }
    assert_eq!(*losses.lock().unwrap(), [(t1, LostReason::NotHeld)]);
    assert!(lease.check_lease());
    let rec = operator
        .read("operator-released")
        .await
        .expect("read")
        .expect("held");
    assert_eq!((rec.owner.as_str(), rec.token), ("a", t2));
    assert!(lease.release().await.expect("release"));
}

/// The holder's sessions end under it ([`Harness::expire_sessions`]), then its answers are
/// late, so that its client's calls in flight (a keep-alive among them) are cut short: the
/// holder announces the loss once, another owner can be granted the lease, and the same
/// handle is granted it again afterwards (on a new session), and keeps it.
pub async fn session_expiry_recovers(h: &dyn Harness) {
    let (slow, delay) = h.delayed_client().await;
    let ttl = test_settings().heartbeat_timeout;
    let lease = lease_on(slow, "expiring-session", "a").await;
    let losses: Arc<Mutex<Vec<FencingToken>>> = Arc::default();
    let l = losses.clone();
    let Acquired::Granted { token: t1 } = lease
        .acquire_with_lost(move |lost| l.lock().unwrap().push(lost.token))
        .await
        .expect("acquire")
    else {
        panic!("the free lease was not granted")
    };
    // A few renewals first (stores with sessions keep a keep-alive stream open).
    sleep(test_settings().heartbeat_interval * 3).await;
    h.expire_sessions("a").await;
    delay.set(Some(late()));
    let started = Instant::now();
    while lease.check_lease() {
        assert!(
            started.elapsed() < ttl * 2,
            "the holder never lost the lease"
        );
        sleep(Duration::from_millis(20)).await;
    }
    delay.set(None);
    let other = h.client().await;
    let (_, t2) = poll_until_granted(&*other, "expiring-session", "b", ttl).await;
    assert!(t2 > t1);
    assert!(
        other
            .release("expiring-session", "b", t2)
            .await
            .expect("release")
    );
    // Long enough for every client-side estimate of the old session's life to run out, so
    // that the next acquire has to ask the server about it.
    sleep(ttl * 2).await;
    let started = Instant::now();
    let t3 = loop {
        let answer = lease.acquire().await;
        match answer {
            Ok(Acquired::Granted { token }) => break token,
            Ok(Acquired::NotGranted { .. })
            | Err(LeaseError::Timeout { .. } | LeaseError::Store { .. }) => {
                assert!(
                    started.elapsed() < ttl * 10,
                    "the owner never acquired again after its session ended: {answer:?}"
                );
                sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("acquire: {e}"),
        }
    };
    assert!(t3 > t2);
    sleep(ttl * 2).await;
    assert!(lease.check_lease(), "the new grant is renewed");
    assert_eq!(
        *losses.lock().unwrap(),
        [t1],
        "one loss, of the ended grant"
    );
    assert!(lease.release().await.expect("release"));
}
