//! Time from SIGKILL of a node to every other node marking it down, over repeated runs on a
//! 3-node harness cluster (member lease ttl 3 s, renewed every 500 ms, listed every 300 ms).
//! Times come from the nodes' histories (host CLOCK_BOOTTIME), so they measure the nodes'
//! own detection, not the polling of this program.
//!
//! `cargo bench -p tenure-cli --bench failover` (runs: TENURE_BENCH_RUNS, default 20).

use std::time::Duration;
use tenure_lease_kit::bench::knob;
use tenure_lease_kit::report::Report;

use tenure_test_kit::cli::cluster::{
    Cluster, MEMBER_TTL, TestCluster, UNREACHABLE_AFTER, percentile,
};

fn history_ns() -> i64 {
    tenure::clock::boottime_now_ns()
}

fn main() {
    tenure_lease_kit::bench::answer_test_runner();
    let runs = knob("TENURE_BENCH_RUNS", 20, 1) as usize;
    let mut report = Report::new(
        "failover",
        "cargo bench -p tenure-cli --all-features --bench failover",
        &["what", "runs", "p50", "p99", "max"],
    );
    let mut c = Cluster::start(3);
    let victim = 2;
    let addr = c.nodes[victim].addr.clone();
    let observers: Vec<String> = (0..2).map(|i| c.nodes[i].addr.clone()).collect();
    let (mut all_down, mut unreachable, mut first_down) = (vec![], vec![], vec![]);
    for run in 0..runs {
        let seen_before = c.history().len();
        let t0 = history_ns();
        c.kill(victim);
        let mut downs: Vec<i64> = vec![];
        let mut unreach: Vec<i64> = vec![];
        c.wait_until(
            "both observers mark the victim down",
            Duration::from_secs(30),
            |c| {
                let h = c.history();
                let new = &h[seen_before.min(h.len())..];
                let at = |event: &str| -> Vec<i64> {
                    observers
                        .iter()
                        .filter_map(|o| {
                            new.iter()
                                .find(|e| {
                                    e["node"] == o.as_str()
                                        && e["event"] == event
                                        && e["member"] == addr.as_str()
                                })
                                .and_then(|e| e["t"].as_i64())
                        })
                        .collect()
                };
                downs = at("member_down");
                unreach = at("unreachable");
                downs.len() == observers.len()
            },
        );
        let ms = |t: i64| (t - t0) as f64 / 1e6;
        let last = downs.iter().copied().max().map(ms).unwrap_or_default();
        let first = downs.iter().copied().min().map(ms).unwrap_or_default();
        all_down.push(last);
        first_down.push(first);
        if let Some(u) = unreach.iter().copied().max() {
            unreachable.push(ms(u));
        }
        println!("run {run}: down on every observer after {last:.0} ms (first {first:.0} ms)");
        c.spawn(victim);
        c.wait_converged(Duration::from_secs(30));
    }
    let mut add = |what: &str, times: &mut Vec<f64>| {
        let ms = |q: f64, times: &mut Vec<f64>| {
            if times.is_empty() {
                "none".to_string()
            } else {
                format!("{:.0} ms", percentile(times, q))
            }
        };
        report.row([
            what.to_string(),
            times.len().to_string(),
            ms(0.5, times),
            ms(0.99, times),
            ms(1.0, times),
        ]);
    };
    add(
        "SIGKILL of a node → marked down by every other node",
        &mut all_down,
    );
    add(
        "SIGKILL → marked down by the first observer",
        &mut first_down,
    );
    add(
        "SIGKILL → unreachable on every observer (runs where it was seen before down)",
        &mut unreachable,
    );
    report.note(format!(
        "3-node harness cluster: member-lease-ttl {} ms, membership-interval 300 ms (bound ttl + interval = {} ms), unreachable-after {} ms. Times from the nodes' histories (CLOCK_BOOTTIME).",
        MEMBER_TTL.as_millis(),
        MEMBER_TTL.as_millis() + 300,
        UNREACHABLE_AFTER.as_millis()
    ));
    report.finish().expect("the report");
}
