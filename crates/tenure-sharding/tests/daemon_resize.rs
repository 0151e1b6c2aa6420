//! A sharded daemon resized at run time, on a one-node cluster (memory store): up from 3
//! workers to 5 and down to 2, every worker of the old count stopping before any of the
//! new count starts (never two workers of different counts at once); the count survives a
//! coordinator fail-over (its instance stopped, the singleton starts it again under a new
//! grant); a message to a worker of an earlier count starts none; and a count of 0 or above the maximum is refused, naming the daemon and the
//! count.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::ActorProcessingErr;
use tenure_sharding::daemon::{
    DaemonCount, DaemonWorker, KeepAlive, ShardedDaemon, start_daemon, worker_id,
};
use tenure_sharding::{EntityContext, ShardingError};
use tokio::sync::mpsc;

const TIMEOUT: Duration = Duration::from_secs(30);

/// What happened to the workers, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    Started { index: usize, count: usize },
    Stopped { index: usize, count: usize },
}

/// Records each start and stop, and every start while a worker of another count runs.
#[derive(Clone, Default)]
struct Log {
    lives: Arc<Mutex<Vec<Life>>>,
    running: Arc<Mutex<BTreeSet<(usize, usize)>>>,
    overlaps: Arc<Mutex<Vec<String>>>,
}

struct Probe {
    log: Log,
    changed: mpsc::UnboundedSender<()>,
}

impl DaemonWorker for Probe {
    type State = ();

    async fn start(
        &self,
        index: usize,
        count: usize,
        _: &EntityContext,
    ) -> Result<(), ActorProcessingErr> {
        let mut running = self.log.running.lock().unwrap();
        if let Some(other) = running.iter().find(|(_, c)| *c != count) {
            self.log.overlaps.lock().unwrap().push(format!(
                "worker {index} of {count} started while worker {} of {} runs",
                other.0, other.1
            ));
        }
        running.insert((index, count));
        self.log
            .lives
            .lock()
            .unwrap()
            .push(Life::Started { index, count });
        let _ = self.changed.send(());
        Ok(())
    }

    async fn stop(&self, index: usize, count: usize, _: &EntityContext, _: &mut ()) {
        self.log.running.lock().unwrap().remove(&(index, count));
        self.log
            .lives
            .lock()
            .unwrap()
            .push(Life::Stopped { index, count });
        let _ = self.changed.send(());
    }
}

/// Waits until exactly the workers `0..count` of `count` run.
async fn until_running(log: &Log, changed: &mut mpsc::UnboundedReceiver<()>, count: usize) {
    let want: BTreeSet<(usize, usize)> = (0..count).map(|i| (i, count)).collect();
    loop {
        if *log.running.lock().unwrap() == want {
            return;
        }
        tokio::time::timeout(TIMEOUT, changed.recv())
            .await
            .unwrap_or_else(|_| {
                panic!("{count} workers never ran: {:?}", log.lives.lock().unwrap())
            })
            .expect("channel open");
    }
}

/// Every worker of `old` started before stopped, and stopped before the first of `new`
/// started.
fn old_stopped_before_new_started(log: &Log, old: usize, new: usize) {
    let lives = log.lives.lock().unwrap().clone();
    let first_new = lives
        .iter()
        .position(|l| matches!(l, Life::Started { count, .. } if *count == new))
        .expect("a worker of the new count started");
    let old_stops_after = lives[first_new..]
        .iter()
        .any(|l| matches!(l, Life::Stopped { count, .. } if *count == old));
    assert!(
        !old_stops_after,
        "a worker of {old} stopped after one of {new} started: {lives:?}"
    );
    for index in 0..old {
        assert!(
            lives[..first_new].contains(&Life::Stopped { index, count: old }),
            "worker {index} of {old} was not stopped first: {lives:?}"
        );
    }
}

/// Asks every worker of `count` at `revision`: each has finished starting and handles
/// messages, so that the resize that follows stops workers that are running. (A worker
/// stopped while its start is still returning may not get its stop hook run, which this
/// probe would take for a worker still running.)
async fn serving(daemon: &ShardedDaemon, count: usize, revision: u64) {
    for i in 0..count {
        let id = worker_id(i, count, revision, 8);
        daemon
            .region()
            .ask::<KeepAlive, ()>(&id, &KeepAlive, TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("worker {id}: {e}"));
    }
}

async fn settled(daemon: &ShardedDaemon) -> DaemonCount {
    loop {
        if let Some(c) = daemon.current_count(TIMEOUT).await.unwrap()
            && !c.stopping
        {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The pg groups of the coordinator instances of `type_name` (one per grant).
fn coordinator_groups(scope: &str, type_name: &str) -> Vec<String> {
    let prefix =
        tenure_singleton::instance_group_prefix(&tenure_sharding::coordinator_name(type_name));
    ractor::pg::which_scoped_groups(&scope.to_string())
        .into_iter()
        .filter(|g| g.starts_with(&prefix))
        .collect()
}

/// Stops the coordinator instance running under the current grant and waits until the
/// singleton manager started another under a new grant (which reads the store).
async fn fail_over_coordinator(scope: &str, type_name: &str) {
    let groups = coordinator_groups(scope, type_name);
    assert_eq!(groups.len(), 1, "one coordinator instance: {groups:?}");
    for cell in ractor::pg::get_scoped_members(&scope.to_string(), &groups[0]) {
        cell.stop(Some("test: coordinator fail-over".into()));
    }
    loop {
        let now = coordinator_groups(scope, type_name);
        if now.len() == 1 && now != groups {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_resized_up_and_down_stops_every_old_worker_before_a_new_one_starts() {
    let (node, provider) = common::one_node(
        "daemon-resize-test-0123456789abcdef",
        "[sharding]\nretry-interval = \"100ms\"\nrebalance-interval = \"1h\"\n\
         [sharding.daemon-resized]\nnumber-of-shards = 8\n",
    )
    .await;
    let (tx, mut changed) = mpsc::unbounded_channel();
    let log = Log::default();
    let probe = Probe {
        log: log.clone(),
        changed: tx,
    };
    let daemon = start_daemon(
        &node,
        &provider,
        "resized",
        3,
        probe,
        Duration::from_millis(100),
    )
    .await
    .unwrap();
    until_running(&log, &mut changed, 3).await;
    serving(&daemon, 3, 0).await;

    // Up.
    assert!(daemon.resize(5, TIMEOUT).await.unwrap());
    until_running(&log, &mut changed, 5).await;
    old_stopped_before_new_started(&log, 3, 5);
    assert_eq!(
        settled(&daemon).await,
        DaemonCount {
            revision: 1,
            count: 5,
            stopping: false
        }
    );
    assert_eq!(daemon.worker_ids().len(), 5);
    serving(&daemon, 5, 1).await;

    // Down.
    assert!(daemon.resize(2, TIMEOUT).await.unwrap());
    until_running(&log, &mut changed, 2).await;
    old_stopped_before_new_started(&log, 5, 2);
    assert!(
        !daemon.resize(2, TIMEOUT).await.unwrap(),
        "it runs 2 already"
    );
    // A keep-alive of the previous count (one a node sent before it heard of the resize)
    // starts no worker: worker 0 of 5 would own index 0 next to worker 0 of 2.
    let stale = worker_id(0, 5, 1, 8);
    let refused = daemon
        .region()
        .ask::<KeepAlive, ()>(&stale, &KeepAlive, TIMEOUT)
        .await
        .unwrap_err();
    assert!(
        matches!(refused, ShardingError::Failed { .. }) && refused.to_string().contains(&stale),
        "{refused}"
    );
    assert_eq!(
        log.overlaps.lock().unwrap().clone(),
        Vec::<String>::new(),
        "workers of two counts at once"
    );

    // The coordinator fails over: the new one keeps the count.
    let before = settled(&daemon).await;
    fail_over_coordinator(
        &tenure_cluster::scope(&node.settings().system),
        "daemon-resized",
    )
    .await;
    let after = settled(&daemon).await;
    assert_eq!(after, before, "the count after a coordinator fail-over");

    // Bad counts, refused naming the daemon and the count.
    for bad in [0, 9] {
        let err = daemon.resize(bad, TIMEOUT).await.unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, ShardingError::WorkerCount { count, maximum: 8, .. } if count == bad)
                && text.contains("`resized`")
                && text.contains(&format!("{bad} workers")),
            "{text}"
        );
    }
    daemon.stop().await;
    node.leave().await.unwrap();
}
