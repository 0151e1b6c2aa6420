//! Sharding fail-over: SIGKILL of a node → the last of its shards serving again on another
//! node, on a 3-node harness cluster with 100 shards and every node driving increments
//! (shard lease ttl 3 s, renewed every 500 ms, retried every 300 ms; member lease ttl 3 s).
//! The victim rotates over the nodes; a killed node comes back as the youngest, so every
//! run kills the oldest node, which hosts the coordinator: each run fails the coordinator
//! over too, the slower case. Times come from the history (host CLOCK_BOOTTIME): `killed`
//! → the latest `shard_started` among the victim's shards. Every run's history is checked.
//!
//! `cargo bench -p tenure-cli --bench sharding_failover` (runs: TENURE_BENCH_RUNS, default 10).

use std::time::Duration;
use tenure_lease_kit::bench::knob;
use tenure_lease_kit::report::Report;

use tenure_cli::check::{ActionRule, check_with, read_history};
use tenure_test_kit::cli::cluster::percentile;
use tenure_test_kit::cli::lives::shard_lives;
use tenure_test_kit::cli::shards::{
    last_kill, live_shards, loaded_shards, sharded_cluster, shards_at,
};

fn main() {
    tenure_lease_kit::bench::answer_test_runner();
    let runs = knob("TENURE_BENCH_RUNS", 10, 1) as usize;
    let mut report = Report::new(
        "sharding_failover",
        "cargo bench -p tenure-cli --all-features --bench sharding_failover",
        &["what", "runs", "p50", "p99", "max"],
    );
    let mut c = sharded_cluster();
    let mut times = Vec::new();
    let mut moved_counts = Vec::new();
    for run in 0..runs {
        let victim = run % c.nodes.len();
        let from = c.nodes[victim].addr.clone();
        c.kill(victim);
        let history = c.history();
        let killed = last_kill(&history);
        let moved = shards_at(&history, &from, killed);
        let mut last = 0;
        c.wait_until(
            "the victim's shards serve elsewhere",
            Duration::from_secs(60),
            |c| {
                let lives = shard_lives(&c.history());
                let starts: Option<Vec<i64>> = moved
                    .iter()
                    .map(|shard| {
                        lives
                            .iter()
                            .find(|l| {
                                l.subject == *shard
                                    && l.node != from
                                    && l.start > killed
                                    && l.end.is_none()
                            })
                            .map(|l| l.start)
                    })
                    .collect();
                match starts {
                    Some(s) => {
                        last = s.into_iter().max().unwrap_or(killed);
                        true
                    }
                    None => false,
                }
            },
        );
        let ms = (last - killed) as f64 / 1e6;
        println!(
            "run {run}: SIGKILL of {from} ({} shards) -> all serving elsewhere in {ms:.0} ms",
            moved.len()
        );
        times.push(ms);
        moved_counts.push(moved.len());
        c.spawn(victim);
        c.wait_converged(Duration::from_secs(30));
        c.wait_until(
            "every loaded shard runs again",
            Duration::from_secs(60),
            |c| live_shards(&c.history()).len() == loaded_shards().len(),
        );
    }
    let events = read_history(&c.history).expect("read the history");
    let rule = ActionRule {
        resume_grace: Duration::from_secs(3),
    };
    if let Some(v) = check_with(&events, rule).violations.first() {
        panic!("tenure check: {v}");
    }
    let per_victim = moved_counts.iter().sum::<usize>() as f64 / runs as f64;
    println!(
        "SIGKILL -> last of the node's shards serving elsewhere, {runs} runs ({per_victim:.0} shards per victim on average): \
         p50 {:.0} ms, p99 {:.0} ms (shard lease ttl 3000 ms, member lease ttl 3000 ms, retry 300 ms)",
        percentile(&mut times, 0.5),
        percentile(&mut times, 0.99)
    );
    report.row([
        format!("SIGKILL of the oldest node (the coordinator's) → the last of its shards ({per_victim:.0} on average) serving elsewhere"),
        runs.to_string(),
        format!("{:.0} ms", percentile(&mut times, 0.5)),
        format!("{:.0} ms", percentile(&mut times, 0.99)),
        format!("{:.0} ms", percentile(&mut times, 1.0)),
    ]);
    report.note("3-node harness cluster, 100 shards, every node driving increments: shard lease ttl 3000 ms, renewed every 500 ms, retried every 300 ms; member lease ttl 3000 ms; goal ttl + 1 s = 4000 ms. `tenure check` passed on the run's history.");
    report.finish().expect("the report");
}
