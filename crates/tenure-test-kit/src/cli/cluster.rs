//! The multi-process cluster harness (`tenure_cli::demo::cluster`) with this build's
//! `tenure` binary, for tests: [`Cluster`] wraps the harness's cluster and panics, with the
//! harness's error (which names the node and what failed), where the harness answers `Err`.
//! `Cluster::start(n)`, `Cluster::start_with(n, &options)` and friends.

use std::ops::{Deref, DerefMut};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use serde_json::Value;
use tenure::history::Event;
pub use tenure_cli::demo::cluster::*;

pub use super::TENURE;

/// A harness cluster of this build's `tenure` nodes whose operations panic on failure (the
/// harness's own [`tenure_cli::demo::cluster::Cluster`] answers `Err`); dropping it kills
/// every node still running.
pub struct Cluster(tenure_cli::demo::cluster::Cluster);

impl Deref for Cluster {
    type Target = tenure_cli::demo::cluster::Cluster;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

/// The value of `result`, or a panic with its error.
fn ok<T>(result: Result<T, HarnessError>) -> T {
    result.unwrap_or_else(|e| panic!("{e}"))
}

/// `n` distinct loopback ports, each held until dropped (panics when there are not so many
/// free).
pub fn hold_ports(n: usize) -> Vec<PortHold> {
    ok(tenure_cli::demo::cluster::hold_ports(n))
}

impl Cluster {
    /// Writes configs for `n` nodes of `binary` with `options` without starting them.
    pub fn configure(binary: &std::path::Path, n: usize, options: &Options) -> Cluster {
        Cluster(ok(tenure_cli::demo::cluster::Cluster::configure(
            binary, n, options,
        )))
    }

    /// Adds (without starting) a node with `seed` and `options`; its index.
    pub fn add_node(&mut self, seed: &str, options: &Options) -> usize {
        ok(self.0.add_node(seed, options))
    }

    /// Starts every configured node, one after the other.
    pub fn start_all(&mut self) {
        ok(self.0.start_all())
    }

    /// Starts (or restarts) node `i` and waits for its "started" line.
    pub fn spawn(&mut self, i: usize) {
        ok(self.0.spawn(i))
    }

    /// Appends a harness event about node `i` to the shared history.
    pub fn record(&self, i: usize, event: Event) {
        ok(self.0.record(i, event))
    }

    /// Appends a harness event about `addr` to the shared history.
    pub fn record_about(&self, addr: &str, event: Event) {
        ok(self.0.record_about(addr, event))
    }

    /// SIGKILL node `i` and reap it.
    pub fn kill(&mut self, i: usize) {
        ok(self.0.kill(i))
    }

    /// Starts node `i` again after a kill or a stop.
    pub fn restart(&mut self, i: usize) {
        ok(self.0.restart(i))
    }

    /// SIGSTOP node `i`.
    pub fn pause(&self, i: usize) {
        ok(self.0.pause(i))
    }

    /// SIGCONT node `i`.
    pub fn resume(&self, i: usize) {
        ok(self.0.resume(i))
    }

    /// SIGTERM node `i` and wait (20 s at most) for its exit status.
    pub fn stop(&mut self, i: usize) -> ExitStatus {
        ok(self.0.stop(i))
    }

    /// Reaps node `i` if its process ended by itself (recorded as `terminated`): how it
    /// ended; `None` while it runs.
    pub fn reap_ended(&mut self, i: usize) -> Option<ExitStatus> {
        ok(self.0.reap_ended(i))
    }

    /// Waits up to `limit` for node `i` to exit by itself; past it, kills it: `None`.
    pub fn wait_exit(&mut self, i: usize, limit: Duration) -> Option<ExitStatus> {
        ok(self.0.wait_exit(i, limit))
    }

    /// SIGTERM every running node at once and wait up to `limit`; the nodes that exited with
    /// a non-zero status or were killed.
    pub fn stop_all(&mut self, limit: Duration) -> Vec<usize> {
        ok(self.0.stop_all(limit))
    }

    /// Stalls (or resumes) the traffic between nodes `a` and `b`, on both sides.
    pub fn set_link(&self, a: usize, b: usize, cut: bool) {
        ok(self.0.set_link(a, b, cut))
    }

    /// Drops the traffic between `a` and `b`, on both sides.
    pub fn drop_link(&self, a: usize, b: usize) {
        ok(self.0.drop_link(a, b))
    }

    /// Loses what `from` sends `to`, while `to`'s traffic to `from` flows.
    pub fn cut_one_way(&self, from: usize, to: usize) {
        ok(self.0.cut_one_way(from, to))
    }

    /// Stalls the sessions between `a` and `b` while their heartbeat datagrams flow.
    pub fn stall_session(&self, a: usize, b: usize) {
        ok(self.0.stall_session(a, b))
    }

    /// Stalls (or resumes) the traffic between node `i` and every other node.
    pub fn isolate(&self, i: usize, cut: bool) {
        ok(self.0.isolate(i, cut))
    }

    /// The shared history, one JSON object per line.
    pub fn history(&self) -> Vec<Value> {
        ok(self.0.read_history())
    }

    /// Waits until `check` holds, polling; panics with `what` and every view on timeout,
    /// and at once (with how it ended and its log's tail) when a node's process ended by
    /// itself and `check` still does not hold: a node that is gone never serves again.
    /// A test that expects a node to end reaps it first ([`Cluster::wait_exit`],
    /// [`Cluster::reap_ended`]).
    pub fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&Cluster) -> bool,
    ) {
        let deadline = Instant::now() + timeout;
        loop {
            // Looked at before `check`: whatever a node wrote before it ended is seen by
            // this `check`, so a condition its last words meet still holds.
            let ended = self.0.check_none_ended();
            if check(self) {
                return;
            }
            if let Err(e) = ended {
                panic!("gave up waiting for: {what}: {e}");
            }
            if Instant::now() > deadline {
                let views: Vec<String> = (0..self.nodes.len())
                    .filter(|i| self.is_running(*i))
                    .map(|i| format!("node {i} {}: {:?}", self.nodes[i].addr, self.members(i)))
                    .collect();
                panic!(
                    "timed out after {timeout:?} waiting for: {what}\n{}",
                    views.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until every running node sees every running node up; panics with every view
    /// on timeout.
    pub fn wait_converged(&self, timeout: Duration) {
        self.wait_until(
            "every running node sees every running node up",
            timeout,
            |c| c.converged(),
        );
    }
}

/// Constructors of harness clusters running this build's `tenure` binary.
pub trait TestCluster {
    /// Writes configs for `n` nodes (seed: node 0) without starting them.
    fn new(n: usize) -> Self;
    /// Writes configs for `n` nodes with `options` without starting them.
    fn with_options(n: usize, options: &Options) -> Self;
    /// Starts `n` nodes and waits until every node sees all of them up.
    fn start(n: usize) -> Self;
    /// Starts `n` nodes with `options` and waits until they converge.
    fn start_with(n: usize, options: &Options) -> Self;
}

impl TestCluster for Cluster {
    fn new(n: usize) -> Cluster {
        Cluster::configure(&TENURE, n, &Options::default())
    }

    fn with_options(n: usize, options: &Options) -> Cluster {
        Cluster::configure(&TENURE, n, options)
    }

    fn start(n: usize) -> Cluster {
        Cluster::start_with(n, &Options::default())
    }

    fn start_with(n: usize, options: &Options) -> Cluster {
        let mut c = Cluster::configure(&TENURE, n, options);
        c.start_all();
        c.wait_converged(Duration::from_secs(30));
        c
    }
}
