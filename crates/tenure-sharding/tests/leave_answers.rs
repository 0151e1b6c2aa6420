//! A leaving node answers the asks it already took before it hands off: asks queued at a
//! slow entity of a one-node cluster (memory store) when the node leaves are all answered,
//! none dropped; and a program's shutdown task runs before the hand-off.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Echo;
use tenure_cluster::Phase;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asks_taken_before_a_leave_are_answered() {
    let (node, provider) = common::one_node(
        "leave-answers-test-0123456789abcdef",
        "[sharding]\nretry-interval = \"100ms\"\n",
    )
    .await;
    let (started, mut handled) = tokio::sync::mpsc::unbounded_channel();
    let region = tenure_sharding::start_on_node(
        &node,
        &provider,
        "slow",
        Some(tenure_sharding::entity_factory(Echo::slow(
            started,
            Duration::from_millis(200),
        ))),
    )
    .await
    .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let log = order.clone();
    node.shutdown()
        .add_task(Phase::ServiceUnbind, "note", move || async move {
            log.lock().unwrap().push("service-unbind");
        });
    let asks: Vec<_> = (0..5u64)
        .map(|n| {
            let region = region.clone();
            tokio::spawn(async move {
                region
                    .ask::<u64, u64>("one", &n, Duration::from_secs(30))
                    .await
            })
        })
        .collect();
    // The entity took the first: every ask was sent (taken) before the leave.
    handled.recv().await.unwrap();
    node.leave().await.unwrap();
    for (n, ask) in asks.into_iter().enumerate() {
        let answer = ask.await.unwrap();
        assert!(answer.is_ok(), "ask {n}: {answer:?}");
    }
    assert_eq!(*order.lock().unwrap(), ["service-unbind"]);
}
