//! Remember-entities across processes: `tenure demo node` processes host the example
//! sharded counter with `[sharding.counter] remember-entities = true` (SQLite lease store),
//! while a proxy-only node drives increments of a few keys, then leaves, so that no traffic
//! reaches any entity afterwards. A node is SIGKILLed (the oldest, so the coordinator fails
//! over too): every entity it ran starts again on another node with no message; a node
//! that joins takes shards over in a rebalance: their entities start there, again with no
//! message; and a cluster whose nodes all left and came back starts every remembered
//! entity. Every run's history must pass `tenure check`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tenure_test_kit::cli;

use cli::cluster::{Cluster, Options, TestCluster};
use cli::lives::{Life, live_entities};
use cli::shards::SHARDING;

/// Keys the proxy-only node increments (key-0 .. key-39).
const KEYS: usize = 40;

const TYPE: &str = "counter";

fn now_ns() -> i64 {
    tenure::clock::boottime_now_ns() as i64
}

/// `hosts` nodes hosting the counter with remember-entities, and one more, the last, that
/// only drives increments (configured, not started).
fn remembering_cluster(hosts: usize, sharding: &str) -> Cluster {
    let options = Options {
        node_args: vec!["--sharded-counter".to_string()],
        tail: format!("{SHARDING}{sharding}\n[sharding.counter]\nremember-entities = true\n"),
        ..Options::default()
    };
    let mut c = Cluster::with_options(hosts + 1, &options);
    c.nodes[hosts].args = ["--load-keys", &KEYS.to_string(), "--load-interval", "5ms"]
        .map(String::from)
        .to_vec();
    c
}

/// Waits until every key's entity runs, then stops the load node (graceful leave) and
/// returns when it was gone: no request is issued after that.
fn warm_then_quiet(c: &mut Cluster, load: usize) -> (i64, BTreeMap<String, Life>) {
    c.wait_until(
        &format!("the {KEYS} entities of the load run"),
        Duration::from_secs(60),
        |c| live_entities(&c.history(), TYPE).len() == KEYS,
    );
    c.stop(load);
    let quiet = now_ns();
    (quiet, live_entities(&c.history(), TYPE))
}

/// No increment was issued after `quiet` (the load node had left).
fn assert_no_traffic_after(c: &Cluster, quiet: i64) {
    let late: Vec<_> = c
        .history()
        .into_iter()
        .filter(|e| {
            matches!(e["event"].as_str(), Some("ack" | "no_ack"))
                && e["issued"].as_i64().unwrap_or(i64::MAX) > quiet
        })
        .collect();
    assert!(late.is_empty(), "requests after the load left: {late:?}");
}

/// Waits until each of `entities` runs on a node other than `from`, started after `after`.
fn wait_started_elsewhere(c: &Cluster, entities: &BTreeSet<String>, from: &str, after: i64) {
    c.wait_until(
        &format!("the {} entities of {from} run elsewhere", entities.len()),
        Duration::from_secs(60),
        |c| {
            let live = live_entities(&c.history(), TYPE);
            entities.iter().all(|e| {
                live.get(e)
                    .is_some_and(|l| l.node != from && l.start > after)
            })
        },
    );
}

#[test]
fn a_killed_nodes_remembered_entities_run_elsewhere_with_no_traffic() {
    let mut c = remembering_cluster(3, "");
    c.start_all();
    c.wait_converged(Duration::from_secs(30));
    let (quiet, live) = warm_then_quiet(&mut c, 3);
    // The oldest node: it also runs the coordinator, whose successor must find the shards
    // with remembered entities even if their leases lapsed before it listed them.
    let victim = 0;
    let from = c.nodes[victim].addr.clone();
    let moved: BTreeSet<String> = live
        .values()
        .filter(|l| l.node == from)
        .map(|l| l.subject.clone())
        .collect();
    assert!(!moved.is_empty(), "{from} runs no entity: {live:?}");
    c.kill(victim);
    let killed = now_ns();
    wait_started_elsewhere(&c, &moved, &from, killed);
    let now = live_entities(&c.history(), TYPE);
    let last = moved
        .iter()
        .filter_map(|e| now.get(e))
        .map(|l| l.start)
        .max();
    eprintln!(
        "the {} entities of {from} (killed at {killed}) run elsewhere {} ms later: {:?}",
        moved.len(),
        last.map_or(0, |l| (l - killed) / 1_000_000),
        moved
            .iter()
            .filter_map(|e| Some((e.as_str(), now.get(e)?.node.as_str())))
            .collect::<Vec<_>>()
    );
    assert_eq!(now.len(), KEYS, "every entity runs: {now:?}");
    assert_no_traffic_after(&c, quiet);
    cli::assert_checked(&c.history);
}

#[test]
fn a_rebalance_starts_the_moved_shards_entities_on_the_new_node_with_no_traffic() {
    // Two hosting nodes configured; only the first (and the load node) start.
    let mut c = remembering_cluster(2, "rebalance-threshold = 1\n");
    c.spawn(0);
    c.spawn(2);
    c.wait_converged(Duration::from_secs(30));
    let (quiet, live) = warm_then_quiet(&mut c, 2);
    let first = c.nodes[0].addr.clone();
    assert!(live.values().all(|l| l.node == first), "{live:?}");
    // A second host joins: the coordinator moves shards to it (hand-offs).
    c.spawn(1);
    let joined = now_ns();
    let second = c.nodes[1].addr.clone();
    c.wait_until(
        "shards moved to the new node with their entities",
        Duration::from_secs(60),
        |c| {
            live_entities(&c.history(), TYPE)
                .values()
                .any(|l| l.node == second)
        },
    );
    // Every entity runs, and each one on the new node started there after it joined, with
    // no message: the moved shards' entities came back by themselves.
    c.wait_until(
        "every entity runs after the rebalance",
        Duration::from_secs(60),
        |c| live_entities(&c.history(), TYPE).len() == KEYS,
    );
    let now = live_entities(&c.history(), TYPE);
    let on_second: Vec<&Life> = now.values().filter(|l| l.node == second).collect();
    assert!(!on_second.is_empty());
    assert!(on_second.iter().all(|l| l.start > joined), "{on_second:?}");
    assert_no_traffic_after(&c, quiet);
    let failed = c.stop_all(Duration::from_secs(20));
    assert!(failed.is_empty(), "nodes {failed:?} did not leave cleanly");
    cli::assert_checked(&c.history);
}

#[test]
fn a_restarted_cluster_starts_the_remembered_entities_with_no_traffic() {
    let mut c = remembering_cluster(2, "");
    c.start_all();
    c.wait_converged(Duration::from_secs(30));
    let (quiet, _) = warm_then_quiet(&mut c, 2);
    // Every node leaves: the shards hand off, their leases are released, nothing runs.
    let failed = c.stop_all(Duration::from_secs(20));
    assert!(failed.is_empty(), "nodes {failed:?} did not leave cleanly");
    assert!(live_entities(&c.history(), TYPE).is_empty());
    // A new coordinator finds no shard lease held: it learns from the remembered ids which
    // shards to start.
    c.restart(0);
    c.restart(1);
    let restarted = now_ns();
    c.wait_until(
        &format!("the {KEYS} remembered entities run again"),
        Duration::from_secs(60),
        |c| {
            let live = live_entities(&c.history(), TYPE);
            live.len() == KEYS && live.values().all(|l| l.start > restarted)
        },
    );
    assert_no_traffic_after(&c, quiet);
    let failed = c.stop_all(Duration::from_secs(20));
    assert!(failed.is_empty(), "nodes {failed:?} did not leave cleanly");
    cli::assert_checked(&c.history);
}
