//! Remember-entities fail-over: SIGKILL of the node running every remembered entity of the
//! example counter → the last of them running again on the surviving node, with no message
//! sent to any. `TENURE_BENCH_ENTITIES` entities (default 1,000; 50 in a smoke run) over
//! 100 shards, with `[sharding.counter] remember-entities = true`, on a harness cluster with
//! the SQLite lease store (shard lease ttl 3 s, renewed every 500 ms, retried every 300 ms;
//! member lease ttl 3 s; unreachable after 1.5 s).
//!
//! Setup: one node hosts the counter while a proxy-only node increments every key once
//! around (so each entity starts and is remembered), then leaves: from then on no request
//! is sent. A second host joins (no rebalance: `rebalance-threshold` is out of reach). Each
//! run kills the node hosting everything, which also runs the coordinator, and times, from
//! the `killed` event (host CLOCK_BOOTTIME, as every history event):
//!
//! - the first and the last of the entities started on the survivor, after their shards'
//!   leases lapsed and the new coordinator allocated the shards (read from the store);
//! - first → last: starting N remembered entities once their shards are granted.
//!
//! Then the victim starts again, as the next run's survivor. Every run's history is
//! checked (`tenure check`).
//!
//! `cargo bench -p tenure-cli --bench remember_failover` (runs: TENURE_BENCH_RUNS,
//! default 5).

use std::collections::BTreeMap;
use std::time::Duration;

use tenure_cli::check::{ActionRule, check_with, read_history};
use tenure_lease_kit::bench::knob;
use tenure_test_kit::cli::cluster::{Cluster, Options, TestCluster, percentile};
use tenure_test_kit::cli::lives::{Life, live_entities};
use tenure_test_kit::cli::shards::SHARDING;

const TYPE: &str = "counter";

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let entities = knob("TENURE_BENCH_ENTITIES", 1000, 50) as usize;
    let runs = knob("TENURE_BENCH_RUNS", 5, 1) as usize;
    let options = Options {
        node_args: vec!["--sharded-counter".to_string()],
        tail: format!(
            "{SHARDING}rebalance-threshold = 1000000\n\
             [sharding.counter]\nremember-entities = true\n"
        ),
        ..Options::default()
    };
    // Nodes 0 and 1 host the counter; node 2 only drives the load.
    let mut c = Cluster::with_options(3, &options);
    c.nodes[2].args = [
        "--load-keys",
        &entities.to_string(),
        "--load-interval",
        "1ms",
    ]
    .map(String::from)
    .to_vec();
    c.spawn(0);
    c.spawn(2);
    c.wait_converged(Duration::from_secs(30));
    c.wait_until(
        &format!("the {entities} entities run"),
        Duration::from_secs(120),
        |c| live_entities(&c.history(), TYPE).len() == entities,
    );
    c.stop(2);
    c.spawn(1);
    c.wait_converged(Duration::from_secs(30));

    let (mut to_first, mut to_last, mut spread) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs {
        let live = live_entities(&c.history(), TYPE);
        let victim = (0..2)
            .find(|&i| live.values().all(|l| l.node == c.nodes[i].addr))
            .expect("one node runs every entity");
        let survivor = 1 - victim;
        let (from, to) = (c.nodes[victim].addr.clone(), c.nodes[survivor].addr.clone());
        c.kill(victim);
        let killed = c
            .history()
            .iter()
            .filter(|e| e["event"] == "killed")
            .filter_map(|e| e["t"].as_i64())
            .max()
            .expect("the kill is in the history");
        let mut starts: Vec<i64> = Vec::new();
        c.wait_until(
            &format!("the {entities} entities of {from} run on {to}"),
            Duration::from_secs(120),
            |c| {
                let live: BTreeMap<String, Life> = live_entities(&c.history(), TYPE);
                starts = live
                    .values()
                    .filter(|l| l.node == to && l.start > killed)
                    .map(|l| l.start)
                    .collect();
                starts.len() == entities
            },
        );
        let first = starts.iter().min().copied().unwrap_or(killed);
        let last = starts.iter().max().copied().unwrap_or(killed);
        let ms = |ns: i64| ns as f64 / 1e6;
        println!(
            "run {run}: SIGKILL of {from} ({entities} remembered entities) -> first running on {to} in {:.0} ms, last in {:.0} ms ({:.0} ms first to last)",
            ms(first - killed),
            ms(last - killed),
            ms(last - first)
        );
        to_first.push(ms(first - killed));
        to_last.push(ms(last - killed));
        spread.push(ms(last - first));
        c.restart(victim);
        c.wait_converged(Duration::from_secs(30));
    }
    let failed = c.stop_all(Duration::from_secs(30));
    assert!(failed.is_empty(), "nodes {failed:?} did not leave cleanly");
    let events = read_history(&c.history).expect("read the history");
    let rule = ActionRule {
        resume_grace: Duration::from_secs(3),
    };
    if let Some(v) = check_with(&events, rule).violations.first() {
        panic!("tenure check: {v}");
    }
    println!(
        "SIGKILL -> all {entities} remembered entities running on the survivor, {runs} runs: \
         p50 {:.0} ms, max {:.0} ms (first entity: p50 {:.0} ms; first to last: p50 {:.0} ms, max {:.0} ms) \
         (shard lease ttl 3000 ms, member lease ttl 3000 ms, unreachable after 1500 ms, retry 300 ms, SQLite store)",
        percentile(&mut to_last, 0.5),
        percentile(&mut to_last, 1.0),
        percentile(&mut to_first, 0.5),
        percentile(&mut spread, 0.5),
        percentile(&mut spread, 1.0),
    );
}
