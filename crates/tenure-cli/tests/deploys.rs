//! Deploys under open-loop load: every node of a harness cluster asks every key of the
//! example sharded counter several times a second (the load sends only while its node is
//! ready, as a load balancer would, and stops when the node's shutdown unbinds its
//! services) and probes the ticker singleton through its proxy; then each node in turn is
//! sent SIGTERM and started again. Judged from the history: no request of any node went
//! unanswered (the leaving node's own included: an ask still open when a node exits is
//! recorded as unanswered), every node answered every key in every second it was sending,
//! and `tenure check` passes. A rolling update (each node restarted with a newer
//! `cluster.app-version`) must also never place a shard on an older node while the
//! coordinator can give it to a newer one (judged from each coordinator's own view, its
//! `region_allocatable` events), and move the singleton at most twice.

use tenure_test_kit::cli;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cli::cluster::Cluster;
use cli::endpoints::{endpoint_of, request, start_with_endpoints};
use cli::lives::{shard_lives, singleton_lives};
use cli::service::{KEYS, SHARDS, now_ns, proxy_replies, served_keys, wait_all_keys_served};
use cli::shards::{live_shards, load_requests, open_loop_options};
use serde_json::Value;
use tenure_test_kit::eventually;

/// Asks per key per node per second, for 3 nodes (6 nodes ask half as often): every ask is
/// a synchronous write to one SQLite counter file shared by all the nodes, and the offered
/// load must stay below what a loaded 2-core machine writes (above it, the entities'
/// mailboxes grow without bound and every ask times out, deploy or not).
const RATE: u64 = 2;
/// How long each ask waits, in ns.
const ASK_TIMEOUT_NS: i64 = 2_000_000_000;
const SECOND_NS: i64 = 1_000_000_000;

/// The figures of one node's restart in a rolling restart (in the order restarted).
#[derive(Debug)]
struct Step {
    /// From SIGTERM until `/health/ready` answered 503 (the probe's resolution: a few ms).
    not_ready_after: Option<Duration>,
    /// From the restart until `/health/ready` answered 200, and until the node first
    /// answered an ask from one of its shards.
    ready_after: Option<Duration>,
    first_served_after: Option<Duration>,
    /// From SIGTERM until the restarted node answered every key again.
    took: Duration,
    /// Shard lives that began during the step (a shard moved, or came back).
    shards_moved: usize,
}

/// `n` nodes hosting the counter (rebalanced every second) and the singleton `s1`, each
/// node driving the open-loop load; `app_version` is every node's `cluster.app-version`.
/// Returns once every node answers every key and reaches the singleton.
fn loaded(n: usize, app_version: &str) -> Cluster {
    let rate = (RATE * 3 / n as u64).max(1);
    let mut options = open_loop_options(SHARDS, KEYS, rate, "2s", "rebalance-interval = \"1s\"");
    options.cluster_extra = format!("app-version = \"{app_version}\"");
    options
        .node_args
        .extend(["--singleton", "s1", "--tick", "100ms"].map(String::from));
    let c = start_with_endpoints(n, &options, "");
    wait_loaded(c)
}

/// Polls `GET /health/ready` of one endpoint every few milliseconds from a thread of its
/// own, keeping each change of the answer (200 or not) with its instant (ns of the
/// history's clock), until dropped.
struct ReadyProbe {
    changes: Arc<Mutex<Vec<(i64, bool)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ReadyProbe {
    fn start(endpoint: SocketAddr) -> ReadyProbe {
        let (changes, stop) = (
            Arc::<Mutex<Vec<(i64, bool)>>>::default(),
            Arc::<AtomicBool>::default(),
        );
        let (seen, stopped) = (changes.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::SeqCst) {
                let ready = ready_now(endpoint);
                let at = now_ns();
                let mut seen = seen.lock().unwrap();
                if seen.last().is_none_or(|(_, was)| *was != ready) {
                    seen.push((at, ready));
                }
                drop(seen);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        ReadyProbe {
            changes,
            stop,
            thread: Some(thread),
        }
    }

    /// The first instant at or after `from` at which the answer was `ready`.
    fn first(&self, ready: bool, from: i64) -> Option<i64> {
        self.changes
            .lock()
            .unwrap()
            .iter()
            .find(|(t, r)| *r == ready && *t >= from)
            .map(|(t, _)| *t)
    }
}

impl Drop for ReadyProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether `GET /health/ready` answers 200 now (no answer: not ready).
fn ready_now(endpoint: SocketAddr) -> bool {
    request(
        endpoint,
        "GET",
        "/health/ready",
        None,
        Duration::from_secs(2),
    )
    .is_some_and(|(status, _)| status == 200)
}

fn wait_loaded(c: Cluster) -> Cluster {
    c.wait_converged(Duration::from_secs(60));
    c.wait_until(
        "every key is answered on every node and every proxy reaches the singleton",
        Duration::from_secs(90),
        |c| {
            let h = c.history();
            let since = now_ns() - 3 * SECOND_NS;
            let requests = load_requests(&h);
            c.nodes.iter().all(|n| {
                served_keys(&requests, &n.addr, since, i64::MAX).len() == KEYS
                    && proxy_replies(&h, &n.addr, since).next().is_some()
            })
        },
    );
    c
}

/// Restarts every node in turn (SIGTERM, wait for its exit, start it again; `before_start`
/// may change its config), each once the cluster converged and every node answers every
/// key and reaches the singleton again. Returns the figures of each step.
fn roll(c: &mut Cluster, mut before_start: impl FnMut(&mut Cluster, usize)) -> Vec<Step> {
    let mut steps = Vec::new();
    for i in 0..c.nodes.len() {
        let leaving = ReadyProbe::start(endpoint_of(c, i));
        eventually(
            "the probe saw the node ready",
            Duration::from_secs(30),
            || leaving.first(true, 0).ok_or(()),
        );
        let began = now_ns();
        let clock = Instant::now();
        let status = c.stop(i);
        assert!(status.success(), "node {i} left with {status:?}");
        let not_ready_after = leaving
            .first(false, began)
            .map(|t| Duration::from_nanos((t - began).max(0) as u64));
        drop(leaving);
        before_start(c, i);
        let starting = now_ns();
        c.restart(i);
        let joining = ReadyProbe::start(endpoint_of(c, i));
        c.wait_converged(Duration::from_secs(60));
        let back = now_ns();
        wait_all_keys_served(
            c,
            back,
            &format!("after node {i}'s restart, every node answers every key"),
            Duration::from_secs(60),
        );
        let took = clock.elapsed();
        c.wait_until(
            &format!("after node {i}'s restart, every proxy reaches the singleton"),
            Duration::from_secs(60),
            |c| {
                let h = c.history();
                c.nodes
                    .iter()
                    .all(|n| proxy_replies(&h, &n.addr, back).next().is_some())
            },
        );
        let history = c.history();
        let shards_moved = shard_lives(&history)
            .iter()
            .filter(|l| l.start >= began)
            .count();
        let addr = c.nodes[i].addr.as_str();
        let since = |t: i64| Duration::from_nanos((t - starting).max(0) as u64);
        let ready_after = joining.first(true, starting).map(since);
        drop(joining);
        let first_served_after = history
            .iter()
            .filter(|e| e["event"] == "ack" && e["from"] == addr)
            .filter_map(|e| e["t"].as_i64())
            .filter(|t| *t > starting)
            .min()
            .map(since);
        eprintln!(
            "node {i} restarted: {took:?}, {shards_moved} shard starts, not ready {not_ready_after:?} after SIGTERM, ready {ready_after:?} and first served {first_served_after:?} after its start"
        );
        steps.push(Step {
            not_ready_after,
            ready_after,
            first_served_after,
            took,
            shards_moved,
        });
    }
    steps
}

/// The spans in which each node incarnation sent requests: (node, incarnation) → (first,
/// last) `issued`.
fn sending_spans(history: &[Value]) -> BTreeMap<(String, String), (i64, i64)> {
    let mut spans: BTreeMap<(String, String), (i64, i64)> = BTreeMap::new();
    for e in history {
        if e["event"] != "ack" && e["event"] != "no_ack" {
            continue;
        }
        let (Some(node), Some(inc), Some(issued)) =
            (e["node"].as_str(), e["inc"].as_str(), e["issued"].as_i64())
        else {
            continue;
        };
        let span = spans
            .entry((node.to_string(), inc.to_string()))
            .or_insert((issued, issued));
        span.0 = span.0.min(issued);
        span.1 = span.1.max(issued);
    }
    spans
}

/// Waits until every ask issued so far has ended, then judges the deploy that began at
/// `from`: no request of any node issued since went unanswered, every node answered every
/// key in every whole second of `[from, end)` in which it was sending, and the history
/// passes `tenure check`.
fn assert_served_throughout(c: &mut Cluster, from: i64) {
    let end = now_ns();
    std::thread::sleep(Duration::from_nanos((ASK_TIMEOUT_NS + SECOND_NS) as u64));
    let history = c.history();
    let requests = load_requests(&history);
    let unanswered: Vec<String> = tenure_cli::availability::issued_in(&requests, from, end)
        .into_iter()
        .filter(|r| !r.acked())
        .map(|r| {
            format!(
                "{} key {} (shard {}) issued {} ms into the deploy: {}",
                r.node,
                r.entity,
                r.shard,
                (r.issued - from) / 1_000_000,
                r.failure.as_deref().unwrap_or_default()
            )
        })
        .collect();
    assert!(
        unanswered.is_empty(),
        "{} requests issued during the deploy got no answer, e.g.:\n{}",
        unanswered.len(),
        unanswered[..unanswered.len().min(20)].join("\n")
    );
    let mut gaps = Vec::new();
    for ((node, inc), (first, last)) in sending_spans(&history) {
        let mut second = first.max(from);
        while second + SECOND_NS <= last.min(end) {
            let served = served_keys(&requests, &node, second, second + SECOND_NS);
            if served.len() != KEYS {
                gaps.push(format!(
                    "{node} (incarnation {inc}) answered {} of {KEYS} keys in the second from {} ms into the deploy",
                    served.len(),
                    (second - from) / 1_000_000
                ));
            }
            second += SECOND_NS;
        }
    }
    assert!(
        gaps.is_empty(),
        "keys went unanswered for a second:\n{}",
        gaps.join("\n")
    );
    let failed = c.stop_all(Duration::from_secs(30));
    assert!(failed.is_empty(), "nodes {failed:?} did not leave cleanly");
    cli::assert_checked(&c.history);
}

fn report(what: &str, steps: &[Step]) {
    let total: Duration = steps.iter().map(|s| s.took).sum();
    let moved: usize = steps.iter().map(|s| s.shards_moved).sum();
    let most = |f: fn(&Step) -> Option<Duration>| steps.iter().filter_map(f).max();
    eprintln!(
        "{what}: {:.1} s per node restarted (mean), {:.1} shard starts per restart (mean); \
         SIGTERM to not ready at most {:?}; start to ready at most {:?}, to the first ask \
         answered at most {:?}; steps: {steps:?}",
        total.as_secs_f64() / steps.len() as f64,
        moved as f64 / steps.len() as f64,
        most(|s| s.not_ready_after),
        most(|s| s.ready_after),
        most(|s| s.first_served_after),
    );
}

fn rolling_restart(n: usize) {
    let mut c = loaded(n, "1.0.0");
    let from = now_ns();
    let steps = roll(&mut c, |_, _| {});
    report(&format!("rolling restart of {n} nodes"), &steps);
    assert_served_throughout(&mut c, from);
}

#[test]
fn a_rolling_restart_of_3_nodes_under_open_loop_load_leaves_no_request_unanswered() {
    rolling_restart(3);
}

#[test]
fn a_rolling_restart_of_6_nodes_under_open_loop_load_leaves_no_request_unanswered() {
    rolling_restart(6);
}

/// Each node is restarted with `cluster.app-version` 2.0.0 in place of 1.0.0: it runs the
/// new version from that restart on.
#[test]
fn a_rolling_update_never_moves_a_shard_back_to_an_old_node_and_the_singleton_moves_at_most_twice()
{
    let mut c = loaded(3, "1.0.0");
    let from = now_ns();
    let steps = roll(&mut c, |c, i| {
        let config = std::fs::read_to_string(&c.nodes[i].config).expect("read the node's config");
        let bumped = config.replace("app-version = \"1.0.0\"", "app-version = \"2.0.0\"");
        assert_ne!(config, bumped, "node {i}'s config sets app-version 1.0.0");
        std::fs::write(&c.nodes[i].config, bumped).expect("write the node's config");
    });
    report("rolling update of 3 nodes", &steps);
    let history = c.history();
    assert!(
        history.iter().any(|e| e["event"] == "region_allocatable"
            && e["version"] == "2.0.0"
            && e["allocatable"] == true),
        "no coordinator ever saw a version-2 region it could give shards"
    );
    let onto_old = allocations_onto_old_versions(&history);
    assert!(
        onto_old.is_empty(),
        "shards went to version-1 nodes while a version-2 node could take them:\n{}",
        onto_old.join("\n")
    );
    let moves = singleton_lives(&history, "s1")
        .iter()
        .filter(|l| l.start > from)
        .count();
    assert!(
        moves <= 2,
        "the singleton moved {moves} times in the update: {:?}",
        singleton_lives(&history, "s1")
    );
    let hosts: BTreeSet<String> = live_shards(&history).into_iter().map(|l| l.node).collect();
    eprintln!("singleton moves: {moves}; shard hosts at the end: {hosts:?}");
    assert_served_throughout(&mut c, from);
}

/// Each allocation or move of a shard onto a version-1 node made by a coordinator that, at
/// that moment, could give shards to a version-2 node: replayed from each coordinator's own
/// `region_allocatable` events (its view, which lags the members' own by a gossip round),
/// per incarnation.
fn allocations_onto_old_versions(history: &[Value]) -> Vec<String> {
    // (node, incarnation) → region → (version, allocatable).
    let mut views: BTreeMap<(String, String), BTreeMap<String, (String, bool)>> = BTreeMap::new();
    let mut wrong = Vec::new();
    for e in history {
        let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
        let view = views.entry((s("node"), s("inc"))).or_default();
        match e["event"].as_str() {
            Some("region_allocatable") => {
                let allocatable = e["allocatable"].as_bool().unwrap_or(false);
                view.insert(s("region"), (s("version"), allocatable));
            }
            Some("shard_allocated" | "shard_moving") => {
                let to = s("to");
                let onto_old = view.get(&to).is_some_and(|(v, _)| v == "1.0.0");
                let newer = view
                    .iter()
                    .find(|(_, (v, allocatable))| *allocatable && v == "2.0.0");
                if let (true, Some((newer, _))) = (onto_old, newer) {
                    wrong.push(format!(
                        "{} of shard {} onto version-1 node {to} by the coordinator on {} while \
                         version-2 node {newer} could take it",
                        s("event"),
                        s("shard"),
                        s("node")
                    ));
                }
            }
            _ => {}
        }
    }
    wrong
}
