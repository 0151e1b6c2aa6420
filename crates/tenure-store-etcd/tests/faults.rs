//! Real faults against real etcd members: the server killed and restarted, the leader of
//! a 3-member cluster killed. Assertions are about order and safety, never speed.

mod support;
use support::EtcdStores;

use std::sync::Arc;
use std::time::Duration;

use tenure_lease::store::bounded;
use tenure_lease::{
    AcquireOutcome, FencingToken, HeldLease, Lease, LeaseSettings, LeaseSpec, LeaseStore,
};
use tenure_lease_kit::conformance::{
    Losses, acquire_recording_losses, owner_request, test_settings,
};
use tokio::time::{Instant, sleep};

use tenure_test_kit::etcd::Etcd;

async fn hold(
    store: Arc<dyn LeaseStore>,
    name: &str,
    owner: &str,
    s: LeaseSettings,
) -> (Lease, FencingToken, Losses) {
    let lease = Lease::start(LeaseSpec::new(name, owner, store, s).expect("spec"))
        .await
        .expect("lease actor");
    let (token, lost) = acquire_recording_losses(&lease).await;
    (lease, token, lost)
}

/// Polls `try_acquire` until granted; returns when the grant arrived and its token.
async fn poll_until_granted(
    store: &dyn LeaseStore,
    name: &str,
    owner: &str,
) -> (Instant, FencingToken) {
    let ttl = test_settings().heartbeat_timeout;
    for _ in 0..2000 {
        if let Ok(AcquireOutcome::Granted(r)) = bounded(
            name,
            "acquire",
            Duration::from_secs(1),
            store.try_acquire(&owner_request(name, owner, ttl)),
        )
        .await
        {
            return (Instant::now(), r.token);
        }
        sleep(Duration::from_millis(10)).await;
    }
    panic!("{name}: never granted to {owner}");
}

/// etcd killed: every operation fails (never "not granted"/"not held") within the
/// operation timeout, and the holder signals the loss once, before anyone is granted the
/// lease after etcd is back; tokens keep increasing across the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_stopped_then_restarted() {
    let etcd = Etcd::single().await;
    let (holder, token, lost) = hold(
        Arc::new(etcd.store().await),
        "stopped",
        "a",
        test_settings(),
    )
    .await;
    let other = etcd.store().await;
    etcd.kill(0);
    let timeout = test_settings().lease_operation_timeout;
    let ttl = test_settings().heartbeat_timeout;
    let acquire = bounded(
        "stopped",
        "acquire",
        timeout,
        other.try_acquire(&owner_request("stopped", "b", ttl)),
    )
    .await;
    assert!(acquire.is_err(), "acquire while etcd is down: {acquire:?}");
    let renew = bounded(
        "stopped",
        "renew",
        timeout,
        other.renew(
            "b",
            &[HeldLease {
                name: "stopped".into(),
                token,
            }],
            ttl,
        ),
    )
    .await;
    // b holds nothing through this client: certain without asking the store.
    assert_eq!(
        renew.expect("renew of nothing held"),
        vec![tenure_lease::Renewal::NotHeld]
    );
    let release = bounded(
        "stopped",
        "release",
        timeout,
        other.release("stopped", "a", token),
    )
    .await;
    assert!(release.is_err(), "release while etcd is down: {release:?}");
    let read = bounded("stopped", "read", timeout, other.read("stopped")).await;
    assert!(read.is_err(), "read while etcd is down: {read:?}");
    // The holder gives up on its own clock while etcd is down.
    for _ in 0..100 {
        if !lost.lock().unwrap().is_empty() {
            break;
        }
        sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !holder.check_lease(),
        "holder still believes after its deadline"
    );
    etcd.start(0).await;
    let (granted_at, later) = poll_until_granted(&other, "stopped", "b").await;
    assert!(later > token, "token {later} after restart, was {token}");
    let events = lost.lock().unwrap().clone();
    assert_eq!(events.len(), 1, "one loss signal: {events:?}");
    assert!(events[0].0 <= granted_at, "loss signalled after b's grant");
}

/// Tokens keep increasing across SIGKILL and restart of etcd, and a grant made before the
/// crash is still held after it (its session survives the restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_across_crash_restart() {
    let etcd = Etcd::single().await;
    let store = etcd.store().await;
    let long = Duration::from_secs(30);
    let mut last = FencingToken::new(0);
    for round in 0..3 {
        let t = match store
            .try_acquire(&owner_request("crash", "a", long))
            .await
            .expect("acquire")
        {
            AcquireOutcome::Granted(r) => r.token,
            AcquireOutcome::Held(r) => panic!("round {round}: held by {}", r.owner),
        };
        assert!(t > last, "round {round}: token {t} after {last}");
        last = t;
        let kept = match store
            .try_acquire(&owner_request("kept", "k", long))
            .await
            .expect("acquire")
        {
            AcquireOutcome::Granted(r) => r.token,
            AcquireOutcome::Held(r) => panic!("kept held by {}", r.owner),
        };
        assert!(store.release("crash", "a", t).await.expect("release"));
        etcd.kill(0);
        etcd.start(0).await;
        let fresh = etcd.store().await;
        let rec = fresh
            .read("kept")
            .await
            .expect("read")
            .expect("kept survives the crash");
        assert_eq!((rec.owner.as_str(), rec.token), ("k", kept));
    }
}

/// A 3-member cluster loses its leader: the holder keeps its lease through the election
/// (no loss signal), and no contender is granted it meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_no_two_holders() {
    let etcd = Etcd::cluster(3).await;
    let settings = LeaseSettings {
        heartbeat_timeout: Duration::from_secs(6),
        heartbeat_interval: Duration::from_millis(500),
        lease_operation_timeout: Duration::from_secs(1),
        lease_retry_interval: Duration::from_millis(100),
        safety_margin: Duration::from_secs(1),
        lock_delay: Duration::ZERO,
    };
    let (holder, token, lost) = hold(Arc::new(etcd.store().await), "leader", "a", settings).await;
    let contender = etcd.store().await;
    let leader = etcd.leader(0).await;
    let started = Instant::now();
    let mut killed = false;
    let mut answers = 0;
    while started.elapsed() < Duration::from_secs(5) {
        if !killed && started.elapsed() > Duration::from_millis(500) {
            etcd.kill(leader);
            killed = true;
        }
        let r = bounded(
            "leader",
            "acquire",
            Duration::from_secs(1),
            contender.try_acquire(&owner_request("leader", "b", Duration::from_secs(6))),
        )
        .await;
        match r {
            Ok(AcquireOutcome::Granted(g)) => {
                panic!("b granted (token {}) while a holds {token}", g.token)
            }
            Ok(AcquireOutcome::Held(h)) => {
                assert_eq!((h.owner.as_str(), h.token), ("a", token));
                answers += 1;
            }
            Err(_) => {} // unknown during the election
        }
        sleep(Duration::from_millis(50)).await;
    }
    assert!(answers > 0, "the contender never got an answer");
    assert!(
        lost.lock().unwrap().is_empty(),
        "holder lost its lease: {:?}",
        lost.lock().unwrap()
    );
    assert!(holder.check_lease());
    let survivor = (0..3).find(|i| *i != leader).expect("a survivor");
    let rec = etcd
        .store_on(vec![etcd.endpoint(survivor)])
        .await
        .read("leader")
        .await
        .expect("read")
        .expect("held");
    assert_eq!((rec.owner.as_str(), rec.token), ("a", token));
    assert!(holder.release().await.expect("release"));
}

/// A snapshot taken while `a` held the lease, restored without bumping revisions: `a`'s key
/// comes back with revisions that `b` saw long before the restore. Judged by when `b` first
/// saw those revisions, `a`'s live grant would look expired and be taken over; `b` refuses
/// instead, naming the cause, and never takes it over while `a` may believe in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revisions_gone_back_never_make_a_live_grant_look_expired() {
    let etcd = Etcd::single().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let snapshot = dir.path().join("snapshot.db");
    let ttl = test_settings().heartbeat_timeout;
    let b: Arc<dyn LeaseStore> = Arc::new(etcd.store().await);
    let (a, _, a_lost) = hold(Arc::new(etcd.store().await), "kept", "a", test_settings()).await;
    let held = |o: AcquireOutcome| matches!(o, AcquireOutcome::Held(r) if r.owner == "a");
    assert!(held(
        b.try_acquire(&owner_request("kept", "b", ttl))
            .await
            .unwrap()
    ));
    etcd.snapshot(0, &snapshot);
    // Renewals move the revision on; b sees the later revisions too, more than a ttl after
    // the snapshot's (and before its own idle session expires).
    sleep(ttl + Duration::from_millis(500)).await;
    assert!(held(
        b.try_acquire(&owner_request("kept", "b", ttl))
            .await
            .unwrap()
    ));
    assert!(a.check_lease());
    etcd.restore(&snapshot).await;
    let restored = Instant::now();
    let mut refusals = Vec::new();
    while restored.elapsed() < ttl * 3 {
        match b.try_acquire(&owner_request("kept", "b", ttl)).await {
            Ok(AcquireOutcome::Granted(r)) => {
                let a_lost = a_lost.lock().unwrap().first().copied();
                assert!(
                    a_lost.is_some(),
                    "b took a's grant over (token {}) while a believed in it",
                    r.token
                );
            }
            Ok(AcquireOutcome::Held(_)) => {}
            Err(e) => refusals.push(e.to_string()),
        }
        sleep(Duration::from_millis(20)).await;
    }
    assert!(
        refusals
            .iter()
            .any(|e| e.contains("revision went back") && e.contains("--bump-revision")),
        "{:?}",
        refusals.first()
    );
}
