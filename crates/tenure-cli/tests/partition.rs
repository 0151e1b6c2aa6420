//! Availability during partitions, with the split brain resolver at its default
//! (lease-majority): 3 or 2 `tenure node` processes host the example sharded counter and
//! the ticker singleton, every node asks every key at a fixed rate (open loop) and probes
//! the singleton through its proxy every second. Service is judged *during* the fault, key
//! by key and node by node, from the requests recorded in the history; every history must
//! pass `tenure check`. The time from the fault to full service is printed (the partition
//! bench reports it over many runs); the tests assert service within the fault window.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::cluster::{Cluster, TestCluster};
use common::lives::shard_lives;
use common::shards::{live_shards, load_requests, open_loop_options};
use serde_json::Value;
use tenure_cli::availability::Request;

/// One cluster at a time: two clusters with load at once starve a 2-core machine.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const SHARDS: usize = 12;
const KEYS: usize = 16;
/// Asks per key per node per second, and how long each ask waits.
const RATE: u64 = 2;
const ASK_TIMEOUT_NS: i64 = 2_000_000_000;
/// How long a fault lasts. The harness's timing (unreachable-after 1.5 s, stable-after
/// 1.5 s, minority delay 1 s, member ttl 3 s) puts full service back within about 6 s; the
/// second half of the fault is where every key must be served.
const FAULT: Duration = Duration::from_secs(20);
const SERVED_FROM_NS: i64 = 10_000_000_000;

fn now_ns() -> i64 {
    tenure::clock::boottime_now_ns()
}

/// `n` nodes with the counter (no rebalancing during the test) and the singleton `s1`,
/// once every key is answered on every node and every node's proxy reaches the singleton.
fn loaded_cluster(n: usize) -> Cluster {
    let mut options = open_loop_options(SHARDS, KEYS, RATE, "2s", "rebalance-interval = \"600s\"");
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
            c.nodes.iter().all(|n| {
                served_keys(&load_requests(&h), &n.addr, since, i64::MAX).len() == KEYS
                    && proxy_replies(&h, &n.addr, since).next().is_some()
            })
        },
    );
    c
}

/// The keys with a request issued through `node` in `[from, to)` and acknowledged.
fn served_keys(requests: &[Request], node: &str, from: i64, to: i64) -> BTreeSet<String> {
    requests
        .iter()
        .filter(|r| r.node == node && r.issued >= from && r.issued < to && r.acked())
        .map(|r| r.entity.clone())
        .collect()
}

/// The singleton's answers to `node`'s proxy after `from`: the node that answered.
fn proxy_replies<'a>(
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
fn full_service_after(requests: &[Request], nodes: &[String], fault: i64, end: i64) -> Option<f64> {
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

/// Waits out the fault and the asks issued in it, then judges service during the fault:
/// every key through every node in `survivors`, in the second half of the fault, and the
/// singleton through their proxies, answered from a survivor.
fn assert_served_during(c: &Cluster, survivors: &[usize], fault: i64, what: &str) {
    let history = c.history();
    let requests = load_requests(&history);
    let end = fault + FAULT.as_nanos() as i64;
    let nodes: Vec<String> = survivors.iter().map(|i| c.nodes[*i].addr.clone()).collect();
    let back = full_service_after(&requests, &nodes, fault, end);
    eprintln!(
        "{what}: every key served from every surviving node again {back:?} s after the fault"
    );
    for addr in &nodes {
        let served = served_keys(
            &requests,
            addr,
            fault + SERVED_FROM_NS,
            end - ASK_TIMEOUT_NS,
        );
        let missing: Vec<String> = (0..KEYS)
            .map(|i| format!("key-{i}"))
            .filter(|k| !served.contains(k))
            .collect();
        assert!(
            missing.is_empty(),
            "{what}: keys never answered through {addr} in the second half of the fault: {missing:?}"
        );
        let answered: Vec<&str> = proxy_replies(&history, addr, fault + SERVED_FROM_NS).collect();
        assert!(
            answered.iter().any(|from| nodes.iter().any(|n| n == from)),
            "{what}: the singleton did not answer {addr}'s proxy from a surviving node in the second half of the fault: {answered:?}"
        );
    }
}

#[test]
fn the_oldest_node_cut_off_downs_itself_and_the_others_serve_every_key_and_the_singleton() {
    let _serial = serial();
    let c = loaded_cluster(3);
    // Node 0 is the oldest: it hosts the singleton and the coordinator.
    c.set_link(0, 1, true);
    c.set_link(0, 2, true);
    let fault = now_ns();
    std::thread::sleep(FAULT + Duration::from_nanos(ASK_TIMEOUT_NS as u64));
    assert_served_during(&c, &[1, 2], fault, "oldest node cut off");
    let history = c.history();
    assert!(
        history
            .iter()
            .any(|e| e["event"] == "sbr_down_self" && e["node"] == c.nodes[0].addr.as_str()),
        "the cut-off node recorded that it downed itself"
    );
    c.set_link(0, 1, false);
    c.set_link(0, 2, false);
    c.wait_converged(Duration::from_secs(30));
    let healed = now_ns();
    c.wait_until(
        "after healing, every key is answered through the rejoined node too",
        Duration::from_secs(30),
        |c| {
            served_keys(
                &load_requests(&c.history()),
                &c.nodes[0].addr,
                healed,
                i64::MAX,
            )
            .len()
                == KEYS
        },
    );
    common::assert_checked(&c.history);
}

#[test]
fn a_two_node_cluster_keeps_the_survivor_and_its_shards_when_the_oldest_crashes() {
    let _serial = serial();
    let mut c = loaded_cluster(2);
    let survivor = c.nodes[1].addr.clone();
    let before: Vec<(String, u64)> = live_shards(&c.history())
        .into_iter()
        .filter(|l| l.node == survivor)
        .map(|l| (l.subject, l.token))
        .collect();
    assert!(!before.is_empty(), "node 1 hosts shards before the crash");
    c.kill(0);
    let fault = now_ns();
    std::thread::sleep(FAULT + Duration::from_nanos(ASK_TIMEOUT_NS as u64));
    assert_served_during(&c, &[1], fault, "2-node cluster, oldest killed");
    // The survivor kept its own shards throughout: none of their lives ended.
    let lives = shard_lives(&c.history());
    for (shard, token) in &before {
        let life = lives
            .iter()
            .find(|l| l.subject == *shard && l.token == *token && l.node == survivor)
            .expect("the life seen before");
        assert!(
            life.end.is_none(),
            "shard {shard} on the survivor stopped after the crash: {life:?}"
        );
    }
    assert!(
        !c.history().iter().any(|e| e["event"] == "sbr_down_self"),
        "nobody downed itself"
    );
    common::assert_checked(&c.history);
}
