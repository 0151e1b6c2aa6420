//! Service of the example load, judged key by key and node by node from a history: a
//! loaded cluster with the counter and the ticker singleton, the keys answered through a
//! node in a span, the singleton's answers to a node's proxy, and when full service came
//! back after a fault. Shared by the partition tests and the partition bench.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;
use tenure_cli::availability::Request;

use super::cluster::{Cluster, TestCluster};
use super::shards::{live_shards, load_requests, open_loop_options};

/// Shards of the counter in the loaded cluster.
pub const SHARDS: usize = 12;
/// Keys of the load.
pub const KEYS: usize = 16;
/// Asks per key per node per second, and how long each ask waits.
pub const RATE: u64 = 2;
/// How long each ask waits, in ns.
pub const ASK_TIMEOUT_NS: i64 = 2_000_000_000;

/// Now, in ns of `CLOCK_BOOTTIME` (the clock of history `t`).
pub fn now_ns() -> i64 {
    tenure::clock::boottime_now_ns()
}

/// `n` nodes with the counter (rebalanced every second while every member is up and
/// reachable) and the singleton `s1`, once every node hosts shards, every key is answered
/// on every node and every node's proxy reaches the singleton.
pub fn loaded_cluster(n: usize) -> Cluster {
    loaded_cluster_with(n, &[])
}

/// [`loaded_cluster`] with `overrides` of the harness's config lines (see
/// [`Options::overrides`]).
pub fn loaded_cluster_with(n: usize, overrides: &[(&str, &str)]) -> Cluster {
    let mut options = open_loop_options(SHARDS, KEYS, RATE, "2s", "rebalance-interval = \"1s\"");
    options.overrides.extend(
        overrides
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    // A bench run being traced keeps its history.
    options.history = std::env::var_os("TENURE_BENCH_HISTORY").map(Into::into);
    options
        .node_args
        .extend(["--singleton", "s1", "--tick", "100ms"].map(String::from));
    let c = Cluster::start_with(n, &options);
    c.wait_converged(Duration::from_secs(30));
    c.wait_until(
        "every key is answered on every node and every proxy reaches the singleton",
        Duration::from_secs(60),
        |c| {
            let h = c.history();
            let since = now_ns() - 3_000_000_000;
            let live = live_shards(&h);
            c.nodes.iter().all(|n| {
                live.iter().any(|l| l.node == n.addr)
                    && served_keys(&load_requests(&h), &n.addr, since, i64::MAX).len() == KEYS
                    && proxy_replies(&h, &n.addr, since).next().is_some()
            })
        },
    );
    c
}

/// The keys with a request issued through `node` in `[from, to)` and acknowledged.
pub fn served_keys(requests: &[Request], node: &str, from: i64, to: i64) -> BTreeSet<String> {
    requests
        .iter()
        .filter(|r| r.node == node && r.issued >= from && r.issued < to && r.acked())
        .map(|r| r.entity.clone())
        .collect()
}

/// The singleton's answers to `node`'s proxy after `from`: the node that answered.
pub fn proxy_replies<'a>(
    history: &'a [Value],
    node: &'a str,
    from: i64,
) -> impl Iterator<Item = &'a str> + 'a {
    history
        .iter()
        .filter(move |e| {
            e["event"] == "proxy_reply"
                && e["node"] == node
                && e["t"].as_i64().is_some_and(|t| t >= from)
        })
        .filter_map(|e| e["from"].as_str())
}

/// From `fault`, the first instant after which every key was acknowledged through every
/// node of `nodes` in every following second up to `end` (how long service took to
/// come back), or None.
pub fn full_service_after(
    requests: &[Request],
    nodes: &[String],
    fault: i64,
    end: i64,
) -> Option<f64> {
    let second = 1_000_000_000;
    let mut back = None;
    let mut t = fault;
    while t + second <= end {
        let all = nodes
            .iter()
            .all(|n| served_keys(requests, n, t, t + second).len() == KEYS);
        match (all, back) {
            (true, None) => back = Some(t),
            (false, _) => back = None,
            _ => {}
        }
        t += second / 4;
    }
    back.map(|b| (b - fault) as f64 / 1e9)
}

/// When, after `fault`, every key was served again through every node of `survivors` (as
/// [`full_service_after`]) and each of their singleton proxies was answered from one of
/// them: the later of the two, in seconds; None if either never happened before `end`.
pub fn recovered_after(
    history: &[Value],
    survivors: &[String],
    fault: i64,
    end: i64,
) -> Option<f64> {
    let keys = full_service_after(&load_requests(history), survivors, fault, end)?;
    let mut singleton: f64 = 0.0;
    for node in survivors {
        let first = history
            .iter()
            .filter(|e| {
                e["event"] == "proxy_reply"
                    && e["node"] == node.as_str()
                    && e["from"]
                        .as_str()
                        .is_some_and(|f| survivors.iter().any(|s| s == f))
            })
            .filter_map(|e| e["t"].as_i64())
            .filter(|t| *t >= fault && *t < end)
            .min()?;
        singleton = singleton.max((first - fault) as f64 / 1e9);
    }
    Some(keys.max(singleton))
}

/// Waits until every running node answered every key with a request issued after `since`.
pub fn wait_all_keys_served(c: &Cluster, since: i64, what: &str, limit: Duration) {
    c.wait_until(what, limit, |c| {
        let requests = load_requests(&c.history());
        (0..c.nodes.len())
            .filter(|i| c.is_running(*i))
            .all(|i| served_keys(&requests, &c.nodes[i].addr, since, i64::MAX).len() == KEYS)
    });
}
