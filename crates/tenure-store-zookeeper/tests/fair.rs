//! Fair acquire against a real ZooKeeper server: first come, first served; timeouts and
//! cancellation remove the waiter's node; try_acquire agrees with the queue on the holder.

mod common;

use std::sync::Arc;
use std::time::Duration;

use tenure_lease::{AcquireOutcome, AcquireRequest, FairQueue, LeaseStore};
use tenure_lease_kit::conformance::{granted_token, owner_request};
use tenure_store_zookeeper::zookeeper_client as zk;
use tenure_test_kit::eventually_async;
use tokio::time::sleep;

const TTL: Duration = Duration::from_secs(3);

fn request(name: &str, owner: &str) -> AcquireRequest {
    owner_request(name, owner, TTL)
}

/// Number of queued waiter nodes of lease `name`.
async fn waiters(shared: &common::Shared, client: &zk::Client, name: &str) -> usize {
    client
        .list_children(&format!("{}/{name}", shared.root))
        .await
        .map(|c| c.iter().filter(|c| c.starts_with("wait-")).count())
        .unwrap_or(0)
}

/// Polls until `name` has `n` waiter nodes (bounded).
async fn until_waiters(shared: &common::Shared, client: &zk::Client, name: &str, n: usize) {
    let what = format!("{n} waiter nodes of {name}");
    eventually_async(&what, Duration::from_secs(20), async || {
        let queued = waiters(shared, client, name).await;
        if queued == n { Ok(()) } else { Err(queued) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_arrival_order() {
    let shared = common::exclusive().await;
    let observer = zk::Client::connect(&shared.server.connect_string())
        .await
        .unwrap();
    let holder = shared.store(TTL, Duration::from_secs(2));
    let first = granted_token(&holder.try_acquire(&request("fifo", "h")).await.unwrap());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for (i, owner) in ["w1", "w2", "w3"].into_iter().enumerate() {
        let store: Arc<dyn FairQueue> = Arc::new(shared.store(TTL, Duration::from_secs(2)));
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let outcome = store
                .acquire_fair(&request("fifo", owner), Duration::from_secs(30))
                .await
                .expect("fair acquire");
            let token = granted_token(&outcome);
            tx.send((owner, token)).unwrap();
            // Hold a moment, so that a barging order would show, then release.
            sleep(Duration::from_millis(50)).await;
            assert!(store.release("fifo", owner, token).await.unwrap());
        }));
        until_waiters(&shared, &observer, "fifo", i + 1).await;
    }
    // While they queue, try_acquire sees the same holder the queue waits for.
    let other = shared.store(TTL, Duration::from_secs(2));
    match other.try_acquire(&request("fifo", "x")).await.unwrap() {
        AcquireOutcome::Held(r) => assert_eq!((r.owner.as_str(), r.token), ("h", first)),
        AcquireOutcome::Granted(_) => panic!("granted while h holds it"),
    }
    assert!(holder.release("fifo", "h", first).await.unwrap());
    let mut order = Vec::new();
    let mut last = first;
    for _ in 0..3 {
        let (owner, token) = rx.recv().await.unwrap();
        assert!(token > last, "{owner}: token {token} after {last}");
        last = token;
        order.push(owner);
    }
    assert_eq!(order, ["w1", "w2", "w3"]);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(waiters(&shared, &observer, "fifo").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_reports_the_holder_and_leaves_the_queue() {
    let shared = common::exclusive().await;
    let observer = zk::Client::connect(&shared.server.connect_string())
        .await
        .unwrap();
    let holder = shared.store(TTL, Duration::from_secs(2));
    let token = granted_token(&holder.try_acquire(&request("timed", "h")).await.unwrap());
    let waiter = shared.store(TTL, Duration::from_secs(2));
    match waiter
        .acquire_fair(&request("timed", "w"), Duration::from_millis(300))
        .await
        .unwrap()
    {
        AcquireOutcome::Held(r) => assert_eq!((r.owner.as_str(), r.token), ("h", token)),
        AcquireOutcome::Granted(_) => panic!("granted while h holds it"),
    }
    assert_eq!(waiters(&shared, &observer, "timed").await, 0);
    // Reentrant fair acquire by the holder: same token, no queueing.
    assert_eq!(
        granted_token(
            &holder
                .acquire_fair(&request("timed", "h"), Duration::from_millis(300))
                .await
                .unwrap()
        ),
        token
    );
}

/// A waiter cancelled after the server created its node but before the answer (and the
/// node's name) reached it: the node must still leave the queue, or every later waiter
/// would queue behind it for as long as the cancelled waiter's session lives. The proxy
/// holds the server's answers back, so the cancel always falls in that window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cancelled_before_its_create_is_answered_leaves_the_queue() {
    let shared = common::exclusive().await;
    let observer = zk::Client::connect(&shared.server.connect_string())
        .await
        .unwrap();
    let holder = shared.store(TTL, Duration::from_secs(2));
    granted_token(&holder.try_acquire(&request("answer", "h")).await.unwrap());
    let (waiter, proxy) = shared.store_via_proxy(TTL, Duration::from_secs(2));
    let waiter = Arc::new(waiter);
    // The waiter's session opens (and the lease node is known) while answers flow.
    granted_token(&waiter.try_acquire(&request("other", "w")).await.unwrap());
    let w: Arc<dyn FairQueue> = waiter.clone();
    proxy.set_delay(Some(Duration::from_millis(1000)));
    let task = tokio::spawn(async move {
        w.acquire_fair(&request("answer", "w"), Duration::from_secs(60))
            .await
    });
    until_waiters(&shared, &observer, "answer", 1).await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    proxy.set_delay(None);
    until_waiters(&shared, &observer, "answer", 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiter_leaves_the_queue() {
    let shared = common::exclusive().await;
    let observer = zk::Client::connect(&shared.server.connect_string())
        .await
        .unwrap();
    let holder = shared.store(TTL, Duration::from_secs(2));
    let token = granted_token(&holder.try_acquire(&request("cancel", "h")).await.unwrap());
    let waiter: Arc<dyn FairQueue> = Arc::new(shared.store(TTL, Duration::from_secs(2)));
    let w = waiter.clone();
    let task = tokio::spawn(async move {
        w.acquire_fair(&request("cancel", "w"), Duration::from_secs(60))
            .await
    });
    until_waiters(&shared, &observer, "cancel", 1).await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    until_waiters(&shared, &observer, "cancel", 0).await;
    // The cancelled waiter never takes the lease: released, it is free for anyone.
    assert!(holder.release("cancel", "h", token).await.unwrap());
    sleep(Duration::from_millis(100)).await;
    assert_eq!(waiter.read("cancel").await.unwrap(), None);
}
