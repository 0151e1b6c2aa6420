//! Coordinated shutdown (Akka's CoordinatedShutdown): one ordered sequence for every way a
//! node ends gracefully (SIGTERM, [`Node::leave`](crate::Node::leave), the management
//! endpoint's leave route), in phases with a timeout each, into which the program adds
//! its own tasks.
//!
//! The order: readiness off (before anything else), then
//! [`Phase::ServiceUnbind`] (stop taking new work), [`Phase::ServiceRequestsDone`] (the
//! requests already taken are answered: the program's tasks, and every ask sent through
//! this node's sharding regions), [`Phase::ServiceStop`], [`Phase::BeforeClusterShutdown`];
//! then the node hands its shards and singletons off (bounded by `cluster.leave-timeout`),
//! answers what was asked meanwhile, leaves the cluster and releases its member lease;
//! then [`Phase::BeforeExit`]. A task that overruns its phase's timeout is logged and
//! dropped (its future is not polled again) and the sequence goes on: no task can hold the
//! node, and so its leases, past the phase's bound, and the leases' own deadlines hold
//! whatever a task does.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;

/// A phase of the shutdown that takes the program's tasks, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Stop taking new work: close listeners, stop producers (readiness is off already).
    ServiceUnbind,
    /// Let the requests already taken finish; the node also waits here for every ask sent
    /// through its sharding regions to be answered.
    ServiceRequestsDone,
    /// Stop the services.
    ServiceStop,
    /// Last step before the node hands off its shards and singletons.
    BeforeClusterShutdown,
    /// After the node left the cluster and released its member lease.
    BeforeExit,
}

impl Phase {
    /// Every phase, in order.
    pub const ALL: [Phase; 5] = [
        Phase::ServiceUnbind,
        Phase::ServiceRequestsDone,
        Phase::ServiceStop,
        Phase::BeforeClusterShutdown,
        Phase::BeforeExit,
    ];

    /// The phase's key in `[cluster.coordinated-shutdown]`, e.g. `service-unbind`.
    pub fn key(self) -> &'static str {
        match self {
            Phase::ServiceUnbind => "service-unbind",
            Phase::ServiceRequestsDone => "service-requests-done",
            Phase::ServiceStop => "service-stop",
            Phase::BeforeClusterShutdown => "before-cluster-shutdown",
            Phase::BeforeExit => "before-exit",
        }
    }
}

/// `[cluster.coordinated-shutdown]`: the timeout of each phase.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
#[non_exhaustive]
pub struct ShutdownConfig {
    /// `service-unbind`.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub service_unbind: Duration,
    /// `service-requests-done`.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub service_requests_done: Duration,
    /// `service-stop`.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub service_stop: Duration,
    /// `before-cluster-shutdown`.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub before_cluster_shutdown: Duration,
    /// `before-exit`.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub before_exit: Duration,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig {
            service_unbind: Duration::from_secs(5),
            service_requests_done: Duration::from_secs(10),
            service_stop: Duration::from_secs(5),
            before_cluster_shutdown: Duration::from_secs(5),
            before_exit: Duration::from_secs(5),
        }
    }
}

impl ShutdownConfig {
    /// The timeout of `phase`.
    pub fn timeout(&self, phase: Phase) -> Duration {
        match phase {
            Phase::ServiceUnbind => self.service_unbind,
            Phase::ServiceRequestsDone => self.service_requests_done,
            Phase::ServiceStop => self.service_stop,
            Phase::BeforeClusterShutdown => self.before_cluster_shutdown,
            Phase::BeforeExit => self.before_exit,
        }
    }
}

type Task = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// Requests taken and not answered yet (asks through this node's regions); cloneable.
#[derive(Debug, Clone, Default)]
pub struct Requests(Arc<RequestsInner>);

#[derive(Debug, Default)]
struct RequestsInner {
    /// The number the next request gets, and the numbers of those in flight.
    open: Mutex<(u64, BTreeSet<u64>)>,
    done: tokio::sync::Notify,
}

/// One request in flight: counted until dropped.
#[derive(Debug)]
pub struct RequestGuard(Requests, u64);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.lock().1.remove(&self.1);
        self.0.0.done.notify_waiters();
    }
}

impl Requests {
    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, BTreeSet<u64>)> {
        self.0.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a request until the guard is dropped.
    pub fn start(&self) -> RequestGuard {
        let mut open = self.lock();
        let n = open.0;
        open.0 += 1;
        open.1.insert(n);
        RequestGuard(self.clone(), n)
    }

    /// How many requests are in flight.
    pub fn open(&self) -> usize {
        self.lock().1.len()
    }

    /// Completes once every request in flight now (when this is called, not when the
    /// future is first polled) has been answered or given up; those started later are not
    /// waited for, so that a steady stream of new requests cannot hold a shutdown.
    pub fn drained(&self) -> impl Future<Output = ()> + Send + 'static {
        let mark = self.lock().0;
        let requests = self.clone();
        async move {
            loop {
                let done = requests.0.done.notified();
                if requests.lock().1.first().is_none_or(|first| *first >= mark) {
                    return;
                }
                done.await;
            }
        }
    }
}

/// A node's coordinated shutdown: add tasks to its phases; the node runs them when it
/// leaves. Cloneable (a program's components each add their own).
#[derive(Clone)]
pub struct CoordinatedShutdown {
    config: ShutdownConfig,
    tasks: Arc<Mutex<Vec<(Phase, String, Task)>>>,
    requests: Requests,
}

impl std::fmt::Debug for CoordinatedShutdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoordinatedShutdown")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl CoordinatedShutdown {
    /// A shutdown with the phase timeouts of `config` and no task yet.
    pub fn new(config: ShutdownConfig) -> Self {
        CoordinatedShutdown {
            config,
            tasks: Arc::default(),
            requests: Requests::default(),
        }
    }

    /// Runs `task` in `phase` when the node shuts down, alongside the phase's other tasks;
    /// `name` names it in the logs. A task still running when the phase's timeout passes
    /// is logged and dropped. Tasks added once the shutdown ran never run.
    pub fn add_task<F>(
        &self,
        phase: Phase,
        name: impl Into<String>,
        task: impl FnOnce() -> F + Send + 'static,
    ) where
        F: Future<Output = ()> + Send + 'static,
    {
        let task: Task = Box::new(move || Box::pin(task()));
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((phase, name.into(), task));
    }

    /// The requests in flight that [`Phase::ServiceRequestsDone`] waits for.
    pub fn requests(&self) -> &Requests {
        &self.requests
    }

    /// The phase timeouts.
    pub fn config(&self) -> &ShutdownConfig {
        &self.config
    }

    /// Runs the tasks of `phase` (taking them: each runs once) concurrently, bounded by the
    /// phase's timeout; in [`Phase::ServiceRequestsDone`] also waits for the requests in
    /// flight. Answers the names of the tasks skipped for overrunning (each logged).
    pub async fn run_phase(&self, phase: Phase) -> Vec<String> {
        let tasks: Vec<(String, Task)> = {
            let mut all = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
            let (mine, rest) = std::mem::take(&mut *all)
                .into_iter()
                .partition(|(p, _, _)| *p == phase);
            *all = rest;
            mine.into_iter()
                .map(|(_, name, task)| (name, task))
                .collect()
        };
        let mut running: Vec<(String, tokio::task::JoinHandle<()>)> = tasks
            .into_iter()
            .map(|(name, task)| (name, tokio::spawn(task())))
            .collect();
        if phase == Phase::ServiceRequestsDone {
            running.push((
                "requests in flight".to_string(),
                tokio::spawn(self.requests.drained()),
            ));
        }
        let timeout = self.config.timeout(phase);
        let deadline = tokio::time::Instant::now() + timeout;
        let mut skipped = Vec::new();
        for (name, mut handle) in running {
            if tokio::time::timeout_at(deadline, &mut handle)
                .await
                .is_err()
            {
                handle.abort();
                tracing::warn!(phase = phase.key(), task = %name, ?timeout,
                    "shutdown task overran its phase: skipped");
                skipped.push(name);
            }
        }
        skipped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ShutdownConfig {
        ShutdownConfig {
            service_unbind: Duration::from_secs(1),
            service_requests_done: Duration::from_secs(2),
            ..ShutdownConfig::default()
        }
    }

    /// Tasks run in their phase, an overrunning one is skipped at the phase's timeout
    /// (the next phase then starts on time), and each task runs once.
    #[tokio::test(start_paused = true)]
    async fn phases_run_their_tasks_and_skip_those_that_overrun() {
        let shutdown = CoordinatedShutdown::new(config());
        let log = Arc::new(Mutex::new(Vec::new()));
        let note = |what: &'static str| {
            let log = log.clone();
            move || async move { log.lock().unwrap().push(what) }
        };
        shutdown.add_task(Phase::ServiceStop, "stop", note("stop"));
        shutdown.add_task(Phase::ServiceUnbind, "unbind", note("unbind"));
        shutdown.add_task(Phase::ServiceUnbind, "stuck", std::future::pending);
        let started = tokio::time::Instant::now();
        assert!(
            shutdown
                .run_phase(Phase::ServiceRequestsDone)
                .await
                .is_empty()
        );
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "nothing in flight: no wait"
        );
        assert_eq!(shutdown.run_phase(Phase::ServiceUnbind).await, ["stuck"]);
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(1),
            "bounded by its timeout"
        );
        assert_eq!(*log.lock().unwrap(), ["unbind"]);
        assert!(shutdown.run_phase(Phase::ServiceStop).await.is_empty());
        assert!(shutdown.run_phase(Phase::ServiceStop).await.is_empty());
        assert_eq!(
            *log.lock().unwrap(),
            ["unbind", "stop"],
            "each task runs once"
        );
    }

    /// ServiceRequestsDone waits for the requests in flight, up to its timeout.
    #[tokio::test(start_paused = true)]
    async fn requests_done_waits_for_the_requests_in_flight() {
        let shutdown = CoordinatedShutdown::new(config());
        let request = shutdown.requests().start();
        let started = tokio::time::Instant::now();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            drop(request);
        });
        assert!(
            shutdown
                .run_phase(Phase::ServiceRequestsDone)
                .await
                .is_empty()
        );
        assert_eq!(started.elapsed(), Duration::from_millis(700));
        let _stuck = shutdown.requests().start();
        assert_eq!(
            shutdown.run_phase(Phase::ServiceRequestsDone).await,
            ["requests in flight"]
        );
        assert_eq!(started.elapsed(), Duration::from_millis(2700));
    }

    /// Only the requests in flight when the wait began are waited for: a steady stream of
    /// new ones cannot hold the shutdown.
    #[tokio::test(start_paused = true)]
    async fn requests_started_after_the_wait_began_are_not_waited_for() {
        let requests = Requests::default();
        let first = requests.start();
        let waiting = tokio::spawn(requests.drained());
        let later = requests.start();
        drop(first);
        waiting.await.unwrap();
        assert_eq!(requests.open(), 1, "the later one is still in flight");
        drop(later);
        requests.drained().await;
    }
}
