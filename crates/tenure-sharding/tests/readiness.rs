//! Readiness means serving: a one-node cluster (memory store) is ready only once each of
//! its regions registered with its coordinator and learnt the shard homes; a region whose
//! coordinator never answers keeps the node not ready, naming the region; and a leaving
//! node is not ready before its regions are told to hand off.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure_cluster::{ClusterEvent, ClusterSubscriber, NotReady};

/// Polls `check` until it holds (at most a minute: a bounded wait, not a timing assertion).
async fn until(what: &str, check: impl Fn() -> bool) {
    tenure_test_kit::eventually_async(what, Duration::from_secs(60), async || {
        check().then_some(()).ok_or("not yet")
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_once_every_region_registered_and_not_ready_before_the_hand_off() {
    let (node, provider) = common::one_node(
        "readiness-test-0123456789abcdef012",
        "[sharding]\nretry-interval = \"100ms\"\n",
    )
    .await;
    let readiness = node.readiness().clone();
    let hosting = common::start_echo(&node, &provider).await;
    // Proxy-only, and no node hosts it: its coordinator never runs, so it never registers.
    let orphan = tenure_sharding::start_on_node(&node, &provider, "orphan", None)
        .await
        .unwrap();
    until("the hosting region registered", || {
        hosting.readiness().is_ok()
    })
    .await;
    let answer: u64 = hosting
        .ask("a", &7u64, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(answer, 7);
    let why = readiness.check().unwrap_err().reason;
    assert!(
        why.starts_with("region of `orphan`: not registered with a coordinator"),
        "{why}"
    );
    assert_eq!(orphan.readiness().unwrap_err().reason, why);

    orphan.stop().await;
    drop(orphan);
    until("the node ready without the orphan region", || {
        readiness.is_ready()
    })
    .await;

    // What the node said when the region was told to hand off.
    let at_hand_off: Arc<Mutex<Option<Result<(), NotReady>>>> = Arc::default();
    let (seen, node_ready) = (at_hand_off.clone(), readiness.clone());
    node.subscribe(ClusterSubscriber::new(move |event| {
        if let ClusterEvent::SelfLeaving(_) = event {
            *seen.lock().unwrap() = Some(node_ready.check());
        }
        true
    }))
    .unwrap();
    node.leave().await.unwrap();
    let node_then = at_hand_off
        .lock()
        .unwrap()
        .take()
        .expect("SelfLeaving seen");
    assert_eq!(
        node_then.unwrap_err().reason,
        "this node is leaving",
        "not ready before anything is handed off"
    );
    assert!(
        hosting.readiness().is_err(),
        "a leaving region is not ready"
    );
}
