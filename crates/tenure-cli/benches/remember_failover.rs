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
//!
//! **Durable** (`TENURE_BENCH_PART=durable`): the same with the counter a durable entity
//! (`--durable-counter`, its journal in a SQLite file of its own beside the lease file
//! (`--journal-file`), a snapshot every 50 events):
//! the load increments every key until each has `TENURE_BENCH_EVENTS` events (default
//! 100), and each run times from the `killed` event to the last of the entities recovered
//! on the survivor (`entity_recovered`: its snapshot loaded and the events after it
//! replayed), against the goal of ttl + 2 s. The history and the journal are
//! checked (`tenure check --journal`).

use std::collections::BTreeMap;
use std::time::Duration;

use tenure_cli::check::{ActionRule, check_journal, check_with, read_history, read_journal};
use tenure_lease_kit::bench::knob;
use tenure_lease_kit::report::Report;
use tenure_test_kit::cli::cluster::{Cluster, Options, TestCluster, percentile};
use tenure_test_kit::cli::lives::{Life, live_entities};
use tenure_test_kit::cli::shards::SHARDING;

const TYPE: &str = "counter";

/// The shard lease ttl of the harness's configuration.
const TTL_MS: f64 = 3000.0;

fn main() {
    tenure_lease_kit::bench::answer_test_runner();
    let durable = std::env::var("TENURE_BENCH_PART").is_ok_and(|p| p == "durable");
    let entities = knob("TENURE_BENCH_ENTITIES", 1000, 50) as usize;
    let runs = knob("TENURE_BENCH_RUNS", 5, 1) as usize;
    let events = knob("TENURE_BENCH_EVENTS", 100, 100);
    let mut report = Report::new(
        "remember_failover",
        "cargo bench -p tenure-cli --all-features --bench remember_failover",
        &["what", "runs", "p50", "max"],
    );
    let host = if durable {
        "--durable-counter"
    } else {
        "--sharded-counter"
    };
    let options = Options {
        node_args: vec![host.to_string()],
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
    // The hosts' journal in a file of its own: appends then never hold the lease file's
    // write lock, which the nodes' shard renewals need.
    let journal_file = c.dir.path().join("journal.sqlite");
    if durable {
        for node in &mut c.nodes[..2] {
            node.args.extend([
                "--journal-file".to_string(),
                journal_file.display().to_string(),
            ]);
        }
    }
    c.spawn(0);
    c.spawn(2);
    c.wait_converged(Duration::from_secs(30));
    c.wait_until(
        &format!("the {entities} entities run"),
        Duration::from_secs(120),
        |c| live_entities(&c.history(), TYPE).len() == entities,
    );
    if durable {
        // A durable counter's acknowledged value is its event's sequence number.
        let started = std::time::Instant::now();
        loop {
            let mut top: BTreeMap<String, u64> = BTreeMap::new();
            for e in c.history().iter().filter(|e| e["event"] == "ack") {
                let (Some(key), Some(v)) = (e["entity"].as_str(), e["value"].as_u64()) else {
                    continue;
                };
                let t = top.entry(key.to_string()).or_default();
                *t = (*t).max(v);
            }
            let done = top.values().filter(|v| **v >= events).count();
            eprintln!(
                "{done} of {entities} entities have {events} events ({:.0} s)",
                started.elapsed().as_secs_f64()
            );
            if done == entities {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(1800),
                "the load did not give every entity {events} events in 30 minutes"
            );
            std::thread::sleep(Duration::from_secs(5));
        }
    }
    c.stop(2);
    c.spawn(1);
    c.wait_converged(Duration::from_secs(30));

    let (mut to_first, mut to_last, mut spread) = (Vec::new(), Vec::new(), Vec::new());
    let mut to_recovered = Vec::new();
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
        if durable {
            let mut recovered: BTreeMap<String, i64> = BTreeMap::new();
            c.wait_until(
                &format!("the {entities} entities of {from} recovered on {to}"),
                Duration::from_secs(120),
                |c| {
                    recovered = c
                        .history()
                        .iter()
                        .filter(|e| {
                            e["event"] == "entity_recovered"
                                && e["node"] == to.as_str()
                                && e["t"].as_i64().is_some_and(|t| t > killed)
                        })
                        .filter_map(|e| Some((e["entity"].as_str()?.to_string(), e["t"].as_i64()?)))
                        .collect();
                    recovered.len() == entities
                },
            );
            let last = recovered.values().max().copied().unwrap_or(killed);
            let ms = (last - killed) as f64 / 1e6;
            println!(
                "run {run}: SIGKILL of {from} -> all {entities} durable entities recovered on {to} in {ms:.0} ms ({:.2}x ttl + 2 s)",
                ms / (TTL_MS + 2000.0)
            );
            to_recovered.push(ms);
        }
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
    if durable {
        let journal = journal_file.display().to_string();
        let held = read_journal(&journal, "tenure").expect("read the journal");
        let replay = |_: &str, e: &[tenure_cli::check::JournalEvent]| {
            tenure_cli::demo::counter::replay_counter(e)
        };
        let found = check_journal(&events, &held, Some(&replay));
        if let Some(v) = found.violations.first() {
            panic!("tenure check --journal: {v}");
        }
        let per_entity = held.len() as f64 / entities as f64;
        report.row([
            format!("SIGKILL → all {entities} durable entities ({per_entity:.0} events each on average, a snapshot every 50) recovered on the survivor"),
            runs.to_string(),
            format!("{:.0} ms ({:.2}x of the goal)", percentile(&mut to_recovered, 0.5), percentile(&mut to_recovered, 0.5) / (TTL_MS + 2000.0)),
            format!("{:.0} ms ({:.2}x of the goal)", percentile(&mut to_recovered, 1.0), percentile(&mut to_recovered, 1.0) / (TTL_MS + 2000.0)),
        ]);
        report.note(format!(
            "Durable: goal ttl + 2 s = {:.0} ms; `tenure check --journal` passed ({} recoveries, {} states replayed); SQLite journal in a file of its own.",
            TTL_MS + 2000.0,
            found.recoveries,
            found.states_compared
        ));
        println!(
            "SIGKILL -> all {entities} durable entities ({per_entity:.0} events each on average, a snapshot every 50, remember-entities on) recovered on the survivor, {runs} runs: \
             p50 {:.0} ms, max {:.0} ms = {:.2}x / {:.2}x of the goal ttl + 2 s = {:.0} ms \
             (journal checked: {} recoveries, {} states replayed; shard lease ttl 3000 ms, SQLite store, SQLite journal in a file of its own)",
            percentile(&mut to_recovered, 0.5),
            percentile(&mut to_recovered, 1.0),
            percentile(&mut to_recovered, 0.5) / (TTL_MS + 2000.0),
            percentile(&mut to_recovered, 1.0) / (TTL_MS + 2000.0),
            TTL_MS + 2000.0,
            found.recoveries,
            found.states_compared,
        );
    }
    let ms = |v: f64| format!("{v:.0} ms");
    report.row([
        format!("SIGKILL → all {entities} remembered entities running on the survivor"),
        runs.to_string(),
        ms(percentile(&mut to_last, 0.5)),
        ms(percentile(&mut to_last, 1.0)),
    ]);
    report.row([
        "SIGKILL → the first of them running".to_string(),
        runs.to_string(),
        ms(percentile(&mut to_first, 0.5)),
        ms(percentile(&mut to_first, 1.0)),
    ]);
    report.row([
        "first to last running".to_string(),
        runs.to_string(),
        ms(percentile(&mut spread, 0.5)),
        ms(percentile(&mut spread, 1.0)),
    ]);
    report.note("Shard lease ttl 3000 ms, member lease ttl 3000 ms, unreachable after 1500 ms, retry 300 ms, SQLite store; `tenure check` passed on the run's history.");
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
    report.finish().expect("the report");
}
