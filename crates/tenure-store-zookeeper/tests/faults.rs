//! Real faults against a real ZooKeeper server: the server stopped, restarted, a session
//! ended under its owner, a ttl the server cannot honour.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure_lease::store::bounded;
use tenure_lease::{
    AcquireOutcome, AcquireRequest, Acquired, FencingToken, HeldLease, Lease, LeaseSpec,
    LeaseStore, LostReason, Renewal, StoreError,
};
use tenure_lease_kit::conformance::{granted_token, test_settings};
use tokio::time::{Instant, sleep};

fn request(name: &str, owner: &str, instance: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest {
        name: name.into(),
        owner: owner.into(),
        instance: instance.into(),
        ttl,
        note: None,
        ..AcquireRequest::default()
    }
}

/// Server stopped: store calls fail within the operation timeout (errors, never "not
/// granted"), and a holder signals the loss (once, reason Expired) before anyone else
/// can be granted the lease once the server is back; the new token is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_stopped_then_restarted() {
    let shared = common::exclusive().await;
    let settings = test_settings();
    let ttl = settings.heartbeat_timeout;
    let op = settings.lease_operation_timeout;
    let store: Arc<dyn LeaseStore> = Arc::new(shared.store(ttl, op));
    let holder = Lease::start(LeaseSpec::new("stopped", "a", store.clone(), settings).unwrap())
        .await
        .unwrap();
    let lost: Arc<Mutex<Vec<(Instant, LostReason)>>> = Arc::default();
    let l = lost.clone();
    let got = holder
        .acquire_with_lost(move |ev| l.lock().unwrap().push((Instant::now(), ev.reason)))
        .await
        .expect("acquire");
    let Acquired::Granted { token } = got else {
        panic!("not granted: {got:?}")
    };
    sleep(Duration::from_millis(700)).await;
    assert!(holder.check_lease(), "renewals keep it");

    let server = shared.server.clone();
    tokio::task::spawn_blocking(move || server.stop())
        .await
        .unwrap();
    let other: Arc<dyn LeaseStore> = Arc::new(shared.store(ttl, op));
    let acquire = bounded(
        "stopped",
        "acquire",
        op,
        other.try_acquire(&request("stopped", "b", "b-1", ttl)),
    )
    .await;
    assert!(
        acquire.is_err(),
        "acquire with the server down: {acquire:?}"
    );
    let read = bounded("stopped", "read", op, store.read("stopped")).await;
    assert!(read.is_err(), "read with the server down: {read:?}");

    // The holder gives up on its own (its renewals fail).
    let waited = Instant::now();
    while lost.lock().unwrap().is_empty() {
        assert!(waited.elapsed() < ttl * 10, "no loss signalled");
        sleep(Duration::from_millis(20)).await;
    }
    assert!(!holder.check_lease());

    shared.restart().await;
    let contender = shared.store(ttl, op);
    let started = Instant::now();
    let (granted_at, later) = loop {
        match contender
            .try_acquire(&request("stopped", "b", "b-1", ttl))
            .await
        {
            Ok(AcquireOutcome::Granted(r)) => break (Instant::now(), r.token),
            Ok(AcquireOutcome::Held(_)) | Err(_) => sleep(Duration::from_millis(20)).await,
        }
        assert!(started.elapsed() < ttl * 20, "the old session never ended");
    };
    let events = lost.lock().unwrap().clone();
    assert_eq!(events.len(), 1, "one loss signal: {events:?}");
    assert_eq!(events[0].1, LostReason::Expired);
    assert!(
        events[0].0 <= granted_at,
        "loss signalled after the takeover"
    );
    assert!(
        later > token,
        "token {later} after restart not above {token}"
    );
}

/// Tokens (czxids) keep increasing across server restarts on the same data directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_across_restarts() {
    let shared = common::exclusive().await;
    let ttl = Duration::from_secs(2);
    let mut last = FencingToken::new(0);
    for round in 0..3 {
        let store = shared.store(ttl, Duration::from_secs(2));
        for (i, name) in ["t-one", "t-two"].iter().enumerate() {
            let t = granted_token(
                &store
                    .try_acquire(&request(name, "a", &format!("{round}-{i}"), ttl))
                    .await
                    .expect("acquire"),
            );
            assert!(t > last, "round {round}: token {t} not above {last}");
            last = t;
            assert!(store.release(name, "a", t).await.expect("release"));
        }
        drop(store);
        shared.restart().await;
    }
}

/// The owner's session ends under it (closed from elsewhere, as an expiry would): the
/// next renewal reports every lease of that session not held, and the next acquire opens
/// a new session and is granted with a new token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_end_reports_not_held_and_reconnects() {
    let shared = common::exclusive().await;
    let ttl = Duration::from_secs(2);
    let store = shared.store(ttl, Duration::from_secs(2));
    let mut held = Vec::new();
    for i in 0..3 {
        let name = format!("s-{i}");
        let token = granted_token(
            &store
                .try_acquire(&request(&name, "a", "a-1", ttl))
                .await
                .expect("acquire"),
        );
        held.push(HeldLease { name, token });
    }
    assert_eq!(
        store.renew("a", &held, ttl).await.expect("renew"),
        vec![Renewal::plain(true); 3]
    );
    let session = store.session_of("a").await.expect("a has a session");
    // Another client takes the session over and closes it: the server deletes its nodes.
    shared.end_session(&session).await;
    let started = Instant::now();
    loop {
        match store.renew("a", &held, ttl).await {
            Ok(answers) if answers == vec![Renewal::NotHeld; 3] => break,
            Ok(answers) => assert_eq!(
                answers,
                vec![Renewal::plain(true); 3],
                "all or nothing: one session"
            ),
            Err(StoreError::Unavailable { .. }) => {}
            Err(e) => panic!("renew: {e}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "session never ended"
        );
        sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(store.read("s-0").await.expect("read"), None);
    let again = granted_token(
        &store
            .try_acquire(&request("s-0", "a", "a-1", ttl))
            .await
            .expect("acquire on a new session"),
    );
    assert!(again > held[0].token);
    let new_session = store.session_of("a").await.expect("a new session");
    assert_ne!(new_session.id(), session.id());
}

/// A ttl above what the server negotiated is refused (the server could end the session
/// before the holder's deadline), naming both values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_above_negotiated_session_timeout_is_an_error() {
    let shared = common::exclusive().await;
    // The test server allows at most 20 ticks = 5 s.
    let ttl = Duration::from_secs(10);
    let store = shared.store(ttl, Duration::from_secs(2));
    let err = store
        .try_acquire(&request("too-long", "a", "a-1", ttl))
        .await
        .expect_err("ttl above the server's maxSessionTimeout");
    let text = err.to_string();
    assert!(
        text.contains("10s") && text.contains("5s") && text.contains("maxSessionTimeout"),
        "{text}"
    );
    assert_eq!(store.read("too-long").await.expect("read"), None);
}
