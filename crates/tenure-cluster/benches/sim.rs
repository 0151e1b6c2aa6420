//! The cluster layer simulated ([`tenure_cluster::sim`]): what failure detection costs per
//! node at 50 and 1,000 nodes, how long a cluster takes to converge after its nodes join
//! and after one is killed, and whether both sides of a 500/500 and a 700/300 partition
//! decide alike under every strategy of the split brain resolver.
//!
//! `cargo bench -p tenure-cluster --bench sim` runs the full sizes (release, one thread,
//! virtual time); `cargo test -p tenure-cluster --bench sim` a smoke run (20 and 60 nodes,
//! partitions of 20). The seed is printed; `TENURE_SIM_SEED=<seed>` replays it.

use std::time::{Duration, Instant};

use tenure_cluster::sim::{self, STRATEGIES};
use tenure_lease_kit::bench::{knob, size, smoke};
use tenure_lease_kit::report::Report;

fn main() {
    tenure_lease_kit::bench::answer_test_runner();
    let seed = sim::seed_from_env().unwrap_or_else(|| fastrand::u64(..));
    println!("{}={seed}", sim::SEED_VAR);
    let mut report = Report::new(
        "sim",
        "cargo bench -p tenure-cluster --bench sim",
        &[
            "nodes",
            "seed",
            "joins converged",
            "messages / node / s",
            "of which datagrams",
            "rows / node / s",
            "store requests / node / s",
            "false unreachables",
            "kill: unreachable everywhere",
            "kill: removed everywhere",
            "wall time",
        ],
    );
    let secs = |d: Option<Duration>| {
        d.map_or("never".to_string(), |d| format!("{:.1} s", d.as_secs_f64()))
    };
    let (small, large) = (size(50, 20), size(1_000, 60));
    let idle = Duration::from_secs(size(30, 5) as u64);
    let mut reports = Vec::new();
    // `TENURE_SIM_SCALE=0` skips the joins-and-kill runs (to time the partitions alone).
    let scale = knob("TENURE_SIM_SCALE", 1, 1) != 0;
    for n in [small, large].into_iter().filter(|_| scale) {
        let wall = Instant::now();
        let r = sim::scale_run(n, seed, idle);
        println!(
            "{n:>5} nodes: join converged {:?}; idle per node per s: {:.2} messages ({:.2} heartbeat datagrams), {:.2} rows, {:.2} store requests; {} false unreachables; kill: unreachable everywhere after {:?}, removed after {:?}; others intact: {} ({:.1} s wall)",
            r.join_converged,
            r.messages_per_node_per_sec,
            r.heartbeats_per_node_per_sec,
            r.rows_per_node_per_sec,
            r.store_requests_per_node_per_sec,
            r.false_unreachables,
            r.kill_unreachable,
            r.kill_removed,
            r.others_intact,
            wall.elapsed().as_secs_f64(),
        );
        assert!(
            r.join_converged.is_some() && r.kill_removed.is_some() && r.others_intact,
            "{r:?}"
        );
        report.row([
            n.to_string(),
            seed.to_string(),
            secs(r.join_converged),
            format!("{:.2}", r.messages_per_node_per_sec),
            format!("{:.2}", r.heartbeats_per_node_per_sec),
            format!("{:.2}", r.rows_per_node_per_sec),
            format!("{:.2}", r.store_requests_per_node_per_sec),
            r.false_unreachables.to_string(),
            secs(r.kill_unreachable),
            secs(r.kill_removed),
            format!("{:.1} s", wall.elapsed().as_secs_f64()),
        ]);
        reports.push(r);
    }
    if let [small_r, large_r] = reports.as_slice() {
        let ratio = large_r.messages_per_node_per_sec / small_r.messages_per_node_per_sec;
        println!(
            "messages per node per second, {large} nodes / {small} nodes: {ratio:.3} (goal: at most 1.3)"
        );
        report.note(format!(
            "Messages per node per second, {large} nodes / {small} nodes: {ratio:.3}x (goal: at most 1.3x)."
        ));
    }
    let mut partitions = Vec::new();
    // `TENURE_SIM_PARTITION_NODES` sets the partitioned cluster's size.
    let n = knob("TENURE_SIM_PARTITION_NODES", 1_000, 20) as usize;
    // `TENURE_SIM_STRATEGY=KeepOldest` (a name as printed) runs that strategy only.
    let only = std::env::var("TENURE_SIM_STRATEGY").ok();
    for strategy in STRATEGIES
        .into_iter()
        .filter(|s| only.as_ref().is_none_or(|o| *o == format!("{s:?}")))
    {
        // `TENURE_SIM_FIRST=<nodes>` runs only the split with that many on the first side.
        let first_only = knob("TENURE_SIM_FIRST", 0, 0) as usize;
        for first in [n / 2, n * 7 / 10]
            .into_iter()
            .filter(|f| first_only == 0 || *f == first_only)
        {
            let wall = Instant::now();
            let r = sim::partition_run(n, first, strategy, seed);
            let [a, b] = &r.sides;
            for (name, side) in ["A", "B"].iter().zip(&r.sides) {
                println!(
                    "  side {name}: went because {:?}; undecided nodes {:?}",
                    side.reasons, side.undecided_nodes
                );
            }
            println!(
                "{strategy:?} {first}/{}: agreed {}; survivor side {:?}; side A {}+{} survived, {} down, {} undecided; side B {}+{} survived, {} down, {} undecided; every node decided after {:?}; per node per s meanwhile: {:.2} messages, {:.2} rows ({:.1} s wall)",
                n - first,
                r.agreed(),
                r.survivor().map(|s| if s == 0 { "A" } else { "B" }),
                a.survived,
                a.survived_wrongly,
                a.downed_self,
                a.undecided,
                b.survived,
                b.survived_wrongly,
                b.downed_self,
                b.undecided,
                r.decided_after,
                r.messages_per_node_per_sec,
                r.rows_per_node_per_sec,
                wall.elapsed().as_secs_f64(),
            );
            partitions.push(format!(
                "{strategy:?} {first}/{}: {} after {}, {:.2} messages and {:.2} rows per node per s meanwhile ({:.1} s wall)",
                n - first,
                if r.agreed() {
                    "decided alike"
                } else {
                    "did NOT decide alike"
                },
                secs(r.decided_after),
                r.messages_per_node_per_sec,
                r.rows_per_node_per_sec,
                wall.elapsed().as_secs_f64()
            ));
            assert!(r.agreed(), "{r:?}");
        }
    }
    report.note(format!(
        "Partitions of {n} nodes, seed {seed}, each side deciding as one: {}.",
        partitions.join("; ")
    ));
    report.finish().expect("the report");
    if smoke() {
        println!("(smoke run: `cargo bench -p tenure-cluster --bench sim` for the full sizes)");
    }
}
