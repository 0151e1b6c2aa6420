//! Fair acquire (first come, first served; cancellation and session expiry)
//! against a real etcd.

mod support;
use support::EtcdStores;

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use tenure_lease::{AcquireOutcome, FairQueue, LeaseStore};
use tenure_lease_kit::conformance::{granted_token, owner_request};

use tenure_test_kit::etcd::{Etcd, PREFIX};
use tenure_test_kit::eventually_async;

async fn raw(etcd: &Etcd) -> Client {
    Client::connect(etcd.endpoints(), None)
        .await
        .expect("client")
}

/// The waiter keys in line for any lease.
async fn waiters(c: &mut Client) -> Vec<(String, i64)> {
    c.get(
        format!("{PREFIX}waiters/"),
        Some(GetOptions::new().with_prefix()),
    )
    .await
    .expect("get waiters")
    .kvs()
    .iter()
    .map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.lease()))
    .collect()
}

async fn until_waiters(c: &mut Client, n: usize) {
    let what = format!("{n} waiters in line");
    eventually_async(&what, Duration::from_secs(5), async || {
        let line = waiters(c).await;
        if line.len() == n { Ok(()) } else { Err(line) }
    })
    .await
}

/// Waiters are granted in the order they queued; each grant is what `read` and
/// `try_acquire` see; the line is empty afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_are_granted_in_order() {
    let etcd = Etcd::single().await;
    let mut c = raw(&etcd).await;
    let ttl = Duration::from_secs(5);
    let holder = etcd.store().await;
    let first = granted_token(
        &holder
            .try_acquire(&owner_request("fair", "a", ttl))
            .await
            .expect("acquire"),
    );
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut stores = Vec::new();
    for (i, owner) in ["b", "c", "d"].into_iter().enumerate() {
        let store: Arc<dyn FairQueue> = Arc::new(etcd.store().await);
        stores.push(store.clone());
        let tx = tx.clone();
        tokio::spawn(async move {
            let got = store
                .acquire_fair(&owner_request("fair", owner, ttl), Duration::from_secs(60))
                .await;
            tx.send((owner, got)).expect("report");
        });
        until_waiters(&mut c, i + 1).await;
    }
    assert!(holder.release("fair", "a", first).await.expect("release"));
    let mut last = first;
    for (expected, store) in ["b", "c", "d"].into_iter().zip(&stores) {
        let (owner, got) = rx.recv().await.expect("a grant");
        let t = granted_token(&got.expect("fair acquire"));
        assert_eq!(owner, expected, "granted out of order");
        assert!(t > last);
        last = t;
        let rec = holder.read("fair").await.expect("read").expect("held");
        assert_eq!((rec.owner.as_str(), rec.token), (owner, t));
        match holder
            .try_acquire(&owner_request("fair", "z", ttl))
            .await
            .expect("acquire")
        {
            AcquireOutcome::Held(r) => assert_eq!(r.owner, owner),
            AcquireOutcome::Granted(_) => panic!("try_acquire granted while {owner} holds"),
        }
        assert!(store.release("fair", owner, t).await.expect("release"));
    }
    assert!(waiters(&mut c).await.is_empty());
}

/// A fair acquire that times out answers Held and leaves the line; one that is cancelled
/// (future dropped) leaves it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_timeout_and_cancel_leave_the_line() {
    let etcd = Etcd::single().await;
    let mut c = raw(&etcd).await;
    let ttl = Duration::from_secs(5);
    let holder = etcd.store().await;
    granted_token(
        &holder
            .try_acquire(&owner_request("busy", "a", ttl))
            .await
            .expect("acquire"),
    );
    let b = etcd.store().await;
    match b
        .acquire_fair(&owner_request("busy", "b", ttl), Duration::from_millis(300))
        .await
        .expect("fair acquire")
    {
        AcquireOutcome::Held(r) => assert_eq!(r.owner, "a"),
        AcquireOutcome::Granted(_) => panic!("granted while a holds"),
    }
    until_waiters(&mut c, 0).await;
    let cancelled = tokio::spawn(async move {
        b.acquire_fair(&owner_request("busy", "b", ttl), Duration::from_secs(60))
            .await
    });
    until_waiters(&mut c, 1).await;
    cancelled.abort();
    assert!(cancelled.await.expect_err("aborted").is_cancelled());
    until_waiters(&mut c, 0).await;
}

/// A waiter cancelled after the server put its key but before the answer reached it: the
/// key must still leave the line, or every later waiter would queue behind it for as long
/// as the cancelled waiter's session lives. The proxy holds the server's answers back, so
/// the cancel always falls in that window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cancelled_before_its_join_is_answered_leaves_the_line() {
    let etcd = Etcd::single().await;
    let mut c = raw(&etcd).await;
    let ttl = Duration::from_secs(30);
    let holder = etcd.store().await;
    let t = granted_token(
        &holder
            .try_acquire(&owner_request("answer", "a", ttl))
            .await
            .expect("acquire"),
    );
    let (waiter, proxy) = etcd.store_via_proxy().await;
    // The waiter's session opens while answers flow.
    granted_token(
        &waiter
            .try_acquire(&owner_request("other", "w", ttl))
            .await
            .expect("acquire"),
    );
    // Shorter than the client's request timeout: the answer does reach the waiter's client.
    proxy.set_delay(Some(Duration::from_millis(700)));
    let cancelled = tokio::spawn(async move {
        waiter
            .acquire_fair(&owner_request("answer", "w", ttl), Duration::from_secs(60))
            .await
    });
    until_waiters(&mut c, 1).await;
    cancelled.abort();
    assert!(cancelled.await.expect_err("aborted").is_cancelled());
    proxy.set_delay(None);
    until_waiters(&mut c, 0).await;
    let later = etcd.store().await;
    let granted = tokio::spawn(async move {
        later
            .acquire_fair(&owner_request("answer", "b", ttl), Duration::from_secs(60))
            .await
    });
    until_waiters(&mut c, 1).await;
    assert!(holder.release("answer", "a", t).await.expect("release"));
    granted_token(&granted.await.expect("task").expect("fair acquire"));
}

/// A waiter whose session ends while it is queued gets an error, never a grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiter_whose_session_ends_gets_an_error() {
    let etcd = Etcd::single().await;
    let mut c = raw(&etcd).await;
    let ttl = Duration::from_secs(5);
    let holder = etcd.store().await;
    let t = granted_token(
        &holder
            .try_acquire(&owner_request("revoked", "a", ttl))
            .await
            .expect("acquire"),
    );
    let b = etcd.store().await;
    let waiting = tokio::spawn(async move {
        b.acquire_fair(&owner_request("revoked", "b", ttl), Duration::from_secs(60))
            .await
    });
    until_waiters(&mut c, 1).await;
    let session = waiters(&mut c).await[0].1;
    c.lease_revoke(session)
        .await
        .expect("revoke the waiter's session");
    assert!(holder.release("revoked", "a", t).await.expect("release"));
    let got = waiting.await.expect("task");
    assert!(got.is_err(), "waiter without a session: {got:?}");
    assert_eq!(holder.read("revoked").await.expect("read"), None);
}
