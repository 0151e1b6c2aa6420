//! Sharding rebalances under open-loop load, in two cases (`TENURE_BENCH_CASE` = `join` or
//! `grow` runs one of them; both by default). Figures come from the history of each run
//! (host CLOCK_MONOTONIC), which is checked (shard stays, tokens, fenced writes,
//! acknowledged increments); `TENURE_BENCH_HISTORY=FILE` keeps it.
//!
//! **join**: 3 harness nodes host the example counter (`TENURE_BENCH_SHARDS` shards,
//! default 12) and each asks every key of the load (`TENURE_BENCH_KEYS`, default 65: enough
//! to reach all 12 shards) `TENURE_BENCH_RATE` times a second (default 2; open loop, 2 s
//! timeout per ask; keep the offered load well below what the one SQLite counter file
//! takes, or queues grow without bound). In each of `TENURE_BENCH_ROUNDS` rounds (default
//! 3), after a steady period (`TENURE_BENCH_STEADY_SECS`, default 10) a 4th node without
//! load joins, and the coordinator moves k = shards/4 shards to it in one rebalance round
//! (`rebalance-absolute-limit` = k, `rebalance-relative-limit` = 1, `rebalance-interval`
//! 3 s: the rebalance comes 0-3 s after the join); then the 4th node leaves again.
//! Reported:
//!
//! - acknowledgements per second across each rebalance, and the seconds without any;
//! - p99 latency of the requests issued during the rebalances (from the coordinator's
//!   first `shard_moving` to the last moved shard started on the new node) against the
//!   steady state (the requests issued in the steady periods before the joins), as a ratio;
//!   the same from the start of each rebalance to one second after it (more samples, and
//!   the first messages of regions that learn a moved shard's home only then);
//! - the latency of the requests to the moving shards, and the requests that got no
//!   answer;
//! - for information, the requests without an answer while the 4th node leaves.
//!
//! **grow**: `TENURE_BENCH_GROW_FROM` nodes (default 6) host the counter with
//! `TENURE_BENCH_GROW_SHARDS` shards (default 600), all of them allocated by the load of
//! node 0 (`TENURE_BENCH_GROW_KEYS` keys, default 4,200, reaching all but about one of
//! the 600 shards, asked `TENURE_BENCH_GROW_RPS` times a second in all, default 400, each
//! ask given 5 s); then `TENURE_BENCH_GROW_BY` nodes (default 3) without load join at once,
//! with the reference rebalance settings (`rebalance-interval` 10 s, a tenth of the shards
//! a round, threshold 1). Reported: the time from the last join until every node runs a
//! balanced share (the most and the fewest shards differ by at most 1), in rebalance
//! intervals; the rounds (shards moved between the first `shard_moving` and balance); and
//! the requests issued from the join until 5 s after balance that got no answer (the goal:
//! none, and balance within 3 rebalance intervals).
//!
//! `cargo bench -p tenure-cli --all-features --bench sharding_rebalance`

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;
use tenure_cli::availability::{Request, acks_per_second, issued_in, latency_quantile};
use tenure_cli::check::{ActionRule, check_with, read_history};
use tenure_lease_kit::bench::{knob, size};
use tenure_lease_kit::report::Report;
use tenure_test_kit::cli::cluster::{Cluster, TestCluster};
use tenure_test_kit::cli::lives::shard_lives;
use tenure_test_kit::cli::shards::{
    check_acks, idle_host, live_shards, load_requests, open_loop_options,
};

/// Checks the history of `c` (`tenure check`'s rules, acknowledged increments kept).
fn check_history(c: &Cluster) {
    let events = read_history(&c.history).expect("read the history");
    let rule = ActionRule {
        resume_grace: Duration::from_secs(3),
    };
    if let Some(v) = check_with(&events, rule).violations.first() {
        panic!("tenure check: {v}");
    }
    let counter = tenure_cli::demo::FencedCounter::open(&c.counter_file()).expect("open counter");
    check_acks(&c.history(), |key| {
        counter
            .get(&tenure_cli::demo::counter::counter_name(key))
            .expect("read the counter")
            .map(|(v, _)| v)
            .unwrap_or(0)
    });
}

fn now_ns() -> i64 {
    tenure::clock::monotonic_now_ns()
}

fn times(history: &[Value], event: &str) -> Vec<(String, i64, Value)> {
    history
        .iter()
        .filter(|e| e["event"] == event)
        .map(|e| {
            (
                e["shard"].as_str().unwrap_or_default().to_string(),
                e["t"].as_i64().unwrap_or_default(),
                e.clone(),
            )
        })
        .collect()
}

fn p99(rs: &[&Request]) -> f64 {
    latency_quantile(rs, 0.99).unwrap_or(f64::NAN)
}

fn main() {
    tenure_lease_kit::bench::answer_test_runner();
    let case = std::env::var("TENURE_BENCH_CASE").unwrap_or_default();
    let mut report = Report::new(
        "sharding_rebalance",
        "cargo bench -p tenure-cli --all-features --bench sharding_rebalance",
        &["case", "figure", "result"],
    );
    if case != "grow" {
        join(&mut report);
    }
    if case != "join" {
        grow(&mut report);
    }
    report.finish().expect("the report");
}

/// The `join` case (see the crate doc).
fn join(report: &mut Report) {
    let shards = knob("TENURE_BENCH_SHARDS", 12, 12) as usize;
    let keys = knob("TENURE_BENCH_KEYS", 65, 65) as usize;
    let rate = knob("TENURE_BENCH_RATE", 2, 2);
    let steady_secs = knob("TENURE_BENCH_STEADY_SECS", 10, 1) as i64;
    let rounds = knob("TENURE_BENCH_ROUNDS", 3, 1) as usize;
    assert!(
        shards.is_multiple_of(12),
        "TENURE_BENCH_SHARDS must be a multiple of 12 (3 then 4 equal shares)"
    );
    let k = shards / 4;
    let mut options = open_loop_options(
        shards,
        keys,
        rate,
        "2s",
        // The rebalance comes 0-3 s after a join, mostly after the joining node's own
        // start-up (which slows every shard for a few hundred ms on 2 cores).
        &format!(
            "rebalance-interval = \"3s\"\nrebalance-absolute-limit = {k}\nrebalance-relative-limit = 1.0"
        ),
    );
    options.history = std::env::var_os("TENURE_BENCH_HISTORY").map(Into::into);
    let mut c = Cluster::with_options(4, &options);
    // The 4th node hosts shards but drives no load: the offered load stays the same.
    idle_host(&mut c, 3);
    for i in 0..3 {
        c.spawn(i);
    }
    c.wait_converged(Duration::from_secs(30));
    let share = |c: &Cluster, n: usize, each: usize| {
        let live = live_shards(&c.history());
        live.len() == shards
            && c.nodes[..n]
                .iter()
                .all(|node| live.iter().filter(|l| l.node == node.addr).count() == each)
    };
    c.wait_until(
        "every shard runs, 1/3 on each node",
        Duration::from_secs(60),
        |c| share(c, 3, shards / 3),
    );
    // Warm-up: the first seconds of a cluster are slower (connections, first entities); a
    // smoke run measures nothing and only proves the path works.
    std::thread::sleep(Duration::from_secs(size(5, 1) as u64));
    let mut spans = Vec::new();
    for round in 0..rounds {
        std::thread::sleep(Duration::from_secs(steady_secs as u64));
        let joined = now_ns();
        if round == 0 {
            c.spawn(3);
        } else {
            c.restart(3);
        }
        c.wait_until(
            "the shards are rebalanced, 1/4 on each node",
            Duration::from_secs(60),
            |c| share(c, 4, k),
        );
        // The tail after the rebalance, longer than an ask's timeout (2 s), so that every
        // request issued before the end of the report has ended.
        std::thread::sleep(Duration::from_secs(size(5, 3) as u64));
        let left = now_ns();
        // The 4th node leaves (its shards go back to the others) for the next round.
        let status = c.stop(3);
        assert!(status.success(), "node 3 left with {status:?}");
        c.wait_until(
            "every shard runs, 1/3 on each node",
            Duration::from_secs(60),
            |c| share(c, 3, shards / 3),
        );
        spans.push((joined, left, now_ns()));
    }
    // Every request of the last leave has ended.
    std::thread::sleep(Duration::from_secs(3));
    let failed = c.stop_all(Duration::from_secs(20));
    assert!(failed.is_empty(), "nodes {failed:?} did not leave cleanly");

    let history = c.history();
    check_history(&c);
    let lives = shard_lives(&history);
    let all = load_requests(&history);
    let newcomer = c.nodes[3].addr.clone();
    let (mut steady, mut during, mut during_moved) = (Vec::new(), Vec::new(), Vec::new());
    let (mut after, mut joining) = (Vec::new(), Vec::new());
    let mut empty_seconds = 0;
    for (round, (joined, left, back)) in spans.into_iter().enumerate() {
        let moving: Vec<_> = times(&history, "shard_moving")
            .into_iter()
            .filter(|(_, t, _)| *t > joined && *t < left)
            .collect();
        let moved: BTreeSet<String> = moving.iter().map(|(s, _, _)| s.clone()).collect();
        assert_eq!(
            moved.len(),
            k,
            "round {round}: one rebalance moves k shards to the new node: {moving:?}"
        );
        let began = moving.iter().map(|(_, t, _)| *t).min().expect("a move");
        let ended = moved
            .iter()
            .filter_map(|shard| {
                lives
                    .iter()
                    .find(|l| &l.subject == shard && l.node == newcomer && l.start > began)
                    .map(|l| l.start)
            })
            .max()
            .expect("the moved shards started on the new node");
        let round_during = issued_in(&all, began, ended);
        let round_moved: Vec<&Request> = round_during
            .iter()
            .copied()
            .filter(|r| moved.contains(&r.shard))
            .collect();
        let report_from = joined - 3_000_000_000;
        // Whole seconds only: a last partial one would look like a dip.
        let whole = (left - report_from) / 1_000_000_000 * 1_000_000_000;
        let per_second = acks_per_second(&all, report_from, report_from + whole);
        empty_seconds += per_second.iter().filter(|n| **n == 0).count();
        let span = issued_in(&all, joined - steady_secs * 1_000_000_000, left);
        let unanswered: Vec<&&Request> = span.iter().filter(|r| !r.acked()).collect();
        println!(
            "round {round}: {k} shards moved in {:.1} ms (first shard_moving -> last moved shard started on the new node); \
             {} requests issued during it ({} to the moving shards, p99 {:.2} ms)\n  \
             acks per second from 3 s before the join (rebalance at {:.2} s): {per_second:?}\n  \
             unanswered requests from the steady period to the end of the round: {} of {}",
            (ended - began) as f64 / 1e6,
            round_during.len(),
            round_moved.len(),
            p99(&round_moved),
            (began - report_from) as f64 / 1e9,
            unanswered.len(),
            span.len()
        );
        for r in unanswered.iter().take(3) {
            println!(
                "  {} {} (shard {}): {}",
                r.node,
                r.entity,
                r.shard,
                r.failure.as_deref().unwrap_or_default()
            );
        }
        report.row([
            "join".to_string(),
            format!("round {round}: time to move {k} shards; requests unanswered from the steady period to the round's end"),
            format!(
                "{:.1} ms; {} of {}",
                (ended - began) as f64 / 1e6,
                unanswered.len(),
                span.len()
            ),
        ]);
        let leave = issued_in(&all, left, back);
        println!(
            "  then node 3 left (its shards back on the others in {:.0} ms): {} of {} requests issued meanwhile unanswered",
            (back - left) as f64 / 1e6,
            leave.iter().filter(|r| !r.acked()).count(),
            leave.len()
        );
        steady.extend(issued_in(
            &all,
            joined - steady_secs * 1_000_000_000,
            joined,
        ));
        during.extend(round_during);
        // Regions that sent nothing to a moved shard during its move learn its new home at
        // their next message: the second after the move shows what that costs.
        after.extend(issued_in(&all, began, ended + 1_000_000_000));
        joining.extend(issued_in(&all, joined, began));
        during_moved.extend(round_moved);
    }
    let (p99_steady, p99_during) = (p99(&steady), p99(&during));
    println!(
        "rebalance of {k} shards (of {shards}) to a joining node, {rounds} rounds, {keys} keys x {rate}/s from each of 3 nodes (open loop): \
         seconds without acknowledgements: {empty_seconds}; p99 latency steady {p99_steady:.2} ms ({} requests), \
         during the rebalances {p99_during:.2} ms ({} requests): {:.2}x steady; \
         requests to the moving shards during them: p99 {:.2} ms, max {:.2} ms ({} requests); \
         from the start of each rebalance to 1 s after it: p99 {:.2} ms ({} requests): {:.2}x steady; \
         for comparison, from each join to its rebalance (the new node starting): p99 {:.2} ms ({} requests): {:.2}x steady",
        steady.len(),
        during.len(),
        p99_during / p99_steady,
        p99(&during_moved),
        latency_quantile(&during_moved, 1.0).unwrap_or(f64::NAN),
        during_moved.len(),
        p99(&after),
        after.len(),
        p99(&after) / p99_steady,
        p99(&joining),
        joining.len(),
        p99(&joining) / p99_steady,
    );
    let join_rows = [
        (
            format!(
                "{k} of {shards} shards to a joining node, {rounds} rounds, {keys} keys × {rate}/s from each of 3 nodes (open loop): seconds without acknowledgements"
            ),
            empty_seconds.to_string(),
        ),
        (
            "p99 latency from each rebalance's start to 1 s after, against steady state"
                .to_string(),
            format!(
                "{:.2} ms against {p99_steady:.2} ms: {:.2}x ({} requests; goal 2x)",
                p99(&after),
                p99(&after) / p99_steady,
                after.len()
            ),
        ),
        (
            "p99 over the moves alone, against steady state".to_string(),
            format!(
                "{p99_during:.2} ms: {:.2}x ({} requests)",
                p99_during / p99_steady,
                during.len()
            ),
        ),
        (
            "requests to the moving shards during the moves: p99, max".to_string(),
            format!(
                "{:.2} ms, {:.2} ms ({} requests)",
                p99(&during_moved),
                latency_quantile(&during_moved, 1.0).unwrap_or(f64::NAN),
                during_moved.len()
            ),
        ),
        (
            "p99 from each join to its rebalance (the new node starting), against steady state"
                .to_string(),
            format!(
                "{:.2}x ({} requests)",
                p99(&joining) / p99_steady,
                joining.len()
            ),
        ),
    ];
    for (figure, result) in join_rows {
        report.row(["join".to_string(), figure, result]);
    }
}

/// The `grow` case (see the crate doc).
fn grow(report: &mut Report) {
    let from = knob("TENURE_BENCH_GROW_FROM", 6, 2) as usize;
    let by = knob("TENURE_BENCH_GROW_BY", 3, 1) as usize;
    let shards = knob("TENURE_BENCH_GROW_SHARDS", 600, 12) as usize;
    let keys = knob("TENURE_BENCH_GROW_KEYS", 4_200, 65) as usize;
    let rps = knob("TENURE_BENCH_GROW_RPS", 400, 65);
    let interval_secs = knob("TENURE_BENCH_GROW_INTERVAL_SECS", 10, 2) as i64;
    // How long after balance the requests issued are judged, and an ask's timeout: a smoke
    // run only proves the path, so it judges a shorter span with a shorter timeout.
    let judged_secs = size(5, 1) as i64;
    let ask_secs = size(5, 2) as u64;
    let mut options = open_loop_options(
        shards,
        keys,
        1,
        &format!("{ask_secs}s"),
        &format!("rebalance-interval = \"{interval_secs}s\""),
    );
    // Requests per second per key, so that the keys together are asked `rps` times a second.
    let rate = rps as f64 / keys as f64;
    let at = options
        .node_args
        .iter()
        .position(|a| a == "--load-rate")
        .expect("an open-loop load");
    options.node_args[at + 1] = rate.to_string();
    options.history = std::env::var_os("TENURE_BENCH_HISTORY").map(Into::into);
    let mut c = Cluster::with_options(from + by, &options);
    for i in 1..from + by {
        idle_host(&mut c, i);
    }
    for i in 0..from {
        c.spawn(i);
    }
    c.wait_converged(Duration::from_secs(60));
    let reached: BTreeSet<String> = (0..keys)
        .map(|i| tenure::sharding::shard_of(&format!("key-{i}"), shards))
        .collect();
    let allocated = reached.len();
    // Balanced over the first `n` nodes: every shard the load reaches runs, and the nodes'
    // counts differ by at most 1.
    let balanced = |c: &Cluster, n: usize| {
        let live = live_shards(&c.history());
        let counts: Vec<usize> = c.nodes[..n]
            .iter()
            .map(|node| live.iter().filter(|l| l.node == node.addr).count())
            .collect();
        live.len() == allocated
            && counts.iter().max().unwrap_or(&0) - counts.iter().min().unwrap_or(&0) <= 1
    };
    c.wait_until(
        &format!("the {allocated} shards the load reaches run, balanced over {from} nodes"),
        Duration::from_secs(300),
        |c| balanced(c, from),
    );
    // Warm-up: every entity started, connections made (a smoke run measures nothing).
    std::thread::sleep(Duration::from_secs(size(5, 1) as u64));
    let joining = now_ns();
    for i in from..from + by {
        c.spawn(i);
    }
    c.wait_converged(Duration::from_secs(60));
    let joined = now_ns();
    c.wait_until(
        &format!("the shards are balanced over {} nodes", from + by),
        Duration::from_secs(300),
        |c| balanced(c, from + by),
    );
    let done = now_ns();
    // Every request issued until `judged_secs` after balance has ended (answered or timed
    // out).
    std::thread::sleep(Duration::from_secs(judged_secs as u64 + ask_secs + 1));
    let failed = c.stop_all(Duration::from_secs(60));
    assert!(failed.is_empty(), "nodes {failed:?} did not leave cleanly");
    let history = c.history();
    check_history(&c);
    let moving: Vec<i64> = times(&history, "shard_moving")
        .into_iter()
        .map(|(_, t, _)| t)
        .filter(|t| *t > joining && *t < done)
        .collect();
    let requests = load_requests(&history);
    let span = issued_in(&requests, joining, done + judged_secs * 1_000_000_000);
    let unanswered: Vec<&&Request> = span.iter().filter(|r| !r.acked()).collect();
    let interval = interval_secs as f64;
    let secs = |ns: i64| ns as f64 / 1e9;
    println!(
        "grow: {by} nodes joined {from} hosting {allocated} shards under {rps} requests/s: \
         balanced {:.1} s after the last node was up ({:.2} rebalance intervals of {interval_secs} s; \
         {:.1} s after the joins began); {} shards moved, the first {:.1} s after the last node was up, \
         the last move decided {:.1} s after the first; \
         requests issued from the joins to {judged_secs} s after balance: {} unanswered of {}",
        secs(done - joined),
        secs(done - joined) / interval,
        secs(done - joining),
        moving.len(),
        moving.iter().min().map_or(f64::NAN, |t| secs(t - joined)),
        match (moving.iter().min(), moving.iter().max()) {
            (Some(a), Some(b)) => secs(b - a),
            _ => f64::NAN,
        },
        unanswered.len(),
        span.len()
    );
    report.row([
        "grow".to_string(),
        format!("{by} nodes join {from} hosting {allocated} shards under {rps} requests/s: balanced after the last node was up"),
        format!(
            "{:.1} s ({:.2} rebalance intervals of {interval_secs} s); {} shards moved",
            secs(done - joined),
            secs(done - joined) / interval,
            moving.len()
        ),
    ]);
    report.row([
        "grow".to_string(),
        format!("requests issued from the joins to {judged_secs} s after balance, unanswered"),
        format!("{} of {}", unanswered.len(), span.len()),
    ]);
    for r in unanswered.iter().take(5) {
        println!(
            "  {} {} (shard {}): {}",
            r.node,
            r.entity,
            r.shard,
            r.failure.as_deref().unwrap_or_default()
        );
    }
}
