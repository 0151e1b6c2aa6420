//! Singleton hand-over time on graceful leave (SIGTERM of the host → the next oldest has
//! started the instance) and fail-over time after SIGKILL of the host, on a 3-node harness
//! cluster (singleton lease ttl 3 s, renewed every 500 ms, retried every 300 ms;
//! hand-over retry 200 ms). Times come from the histories (host CLOCK_BOOTTIME).
//!
//! `cargo bench -p tenure-cli --bench singleton_failover` (runs: TENURE_BENCH_RUNS, default 20).

use std::time::Duration;
use tenure_lease_kit::bench::knob;
use tenure_lease_kit::report::Report;

use serde_json::Value;
use tenure_test_kit::cli::cluster::{Cluster, Options, TestCluster, percentile};

/// (node, token, t) of the latest `singleton_started`, and whether it is still running.
fn latest(history: &[Value]) -> Option<(String, u64, i64)> {
    let started = history
        .iter()
        .filter(|e| e["event"] == "singleton_started")
        .max_by_key(|e| e["t"].as_i64())?;
    Some((
        started["node"].as_str()?.to_string(),
        started["token"].as_u64()?,
        started["t"].as_i64()?,
    ))
}

fn fault_and_measure(c: &mut Cluster, kill: bool) -> f64 {
    let (node, token, _) = latest(&c.history()).expect("running");
    let host = c.nodes.iter().position(|n| n.addr == node).expect("host");
    let t0 = tenure::clock::boottime_now_ns();
    if kill {
        c.kill(host);
    } else {
        assert!(c.stop(host).success());
    }
    let mut started = 0;
    c.wait_until(
        "a new instance",
        Duration::from_secs(30),
        |c| match latest(&c.history()) {
            Some((_, t, at)) if t > token => {
                started = at;
                true
            }
            _ => false,
        },
    );
    c.spawn(host);
    c.wait_converged(Duration::from_secs(30));
    (started - t0) as f64 / 1e6
}

fn main() {
    tenure_lease_kit::bench::answer_test_runner();
    let runs = knob("TENURE_BENCH_RUNS", 20, 1) as usize;
    let mut report = Report::new(
        "singleton_failover",
        "cargo bench -p tenure-cli --all-features --bench singleton_failover",
        &["what", "runs", "p50", "p99", "max"],
    );
    let options = Options {
        node_args: ["--singleton", "s1", "--tick", "100ms"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        ..Options::default()
    };
    let mut c = Cluster::start_with(3, &options);
    c.wait_until("the singleton runs", Duration::from_secs(15), |c| {
        latest(&c.history()).is_some()
    });
    let (mut leave, mut kill) = (vec![], vec![]);
    for run in 0..runs {
        let l = fault_and_measure(&mut c, false);
        let k = fault_and_measure(&mut c, true);
        println!("run {run}: hand-over on leave {l:.0} ms, fail-over after SIGKILL {k:.0} ms");
        leave.push(l);
        kill.push(k);
    }
    for (what, times) in [
        (
            "graceful leave (SIGTERM of the host) → started on the next oldest",
            &mut leave,
        ),
        (
            "SIGKILL of the host → started on the next oldest",
            &mut kill,
        ),
    ] {
        report.row([
            what.to_string(),
            runs.to_string(),
            format!("{:.0} ms", percentile(times, 0.5)),
            format!("{:.0} ms", percentile(times, 0.99)),
            format!("{:.0} ms", percentile(times, 1.0)),
        ]);
    }
    report.note("3-node harness cluster: singleton lease ttl 3000 ms, renewed every 500 ms, retry interval 300 ms, hand-over retry 200 ms; goal after SIGKILL ttl + retry + 1 s = 4300 ms. Times from the nodes' histories (CLOCK_BOOTTIME).");
    report.finish().expect("the report");
}
