//! The sharded daemon process on a one-node cluster (memory store): every worker starts
//! with no traffic but the keep-alives, each under its own shard's lease, and a worker that
//! fails to start is started again by the next keep-alive; a daemon of no workers is
//! refused, naming it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ractor::ActorProcessingErr;
use tenure_lease::FencingToken;
use tenure_sharding::EntityContext;
use tenure_sharding::daemon::{DaemonWorker, start_daemon, worker_id};
use tokio::sync::mpsc;

/// Reports each start (index, shard, token); worker 2 fails its first start.
struct Probe {
    started: mpsc::UnboundedSender<(usize, String, FencingToken)>,
    failed_once: Arc<AtomicBool>,
}

impl DaemonWorker for Probe {
    type State = ();

    async fn start(
        &self,
        index: usize,
        _count: usize,
        ctx: &EntityContext,
    ) -> Result<(), ActorProcessingErr> {
        if index == 2 && !self.failed_once.swap(true, Ordering::SeqCst) {
            return Err("worker 2 fails its first start".into());
        }
        let _ = self.started.send((index, ctx.shard_id.clone(), ctx.token));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_worker_runs_in_its_own_shard_with_no_traffic_but_keep_alives() {
    let (node, provider) =
        tenure_test_kit::node::one_node("daemon-test-0123456789abcdef01234", "").await;
    let (tx, mut started) = mpsc::unbounded_channel();
    let probe = || Probe {
        started: tx.clone(),
        failed_once: Arc::new(AtomicBool::new(false)),
    };
    let Err(refused) =
        start_daemon(&node, &provider, "none", 0, probe(), Duration::from_secs(1)).await
    else {
        panic!("a daemon of no workers started");
    };
    assert!(refused.to_string().contains("daemon-none"), "{refused}");
    let count = 4;
    let daemon = start_daemon(
        &node,
        &provider,
        "probe",
        count,
        probe(),
        Duration::from_millis(200),
    )
    .await
    .unwrap();
    // The type's shards are `number-of-shards` (100 by default): worker `i` lives in
    // shard `i` of them.
    assert_eq!(
        daemon.worker_ids(),
        (0..count)
            .map(|i| worker_id(i, count, 0, 100))
            .collect::<Vec<_>>()
    );
    let mut runs = BTreeMap::new();
    while runs.len() < count {
        let (index, shard, token) = tokio::time::timeout(Duration::from_secs(30), started.recv())
            .await
            .expect("every worker starts within 30 s")
            .expect("channel open");
        assert_eq!(
            shard,
            index.to_string(),
            "worker {index} runs in shard {index}"
        );
        runs.insert(index, token);
    }
    assert_eq!(runs.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    daemon.stop().await;
    node.leave().await.unwrap();
}
