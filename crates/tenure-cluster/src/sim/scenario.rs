//! The simulator's scenarios: a cluster joining, idling and losing a node (what it costs
//! per node and how long it takes to converge), and a partition that each side decides
//! (whether both sides reach the same decision).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::{Network, Outcome, Sim, Timings};
use crate::sbr::{SbrConfig, SbrSettings, StrategyName};

/// The environment variable that replays one seed of the simulator's tests and benches.
pub const SEED_VAR: &str = "TENURE_SIM_SEED";

/// The seed in [`SEED_VAR`], if set (a number, decimal or `0x` hexadecimal).
pub fn seed_from_env() -> Option<u64> {
    let text = std::env::var(SEED_VAR).ok()?;
    let text = text.trim();
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// How often the scenarios look whether what they wait for happened (virtual time): the
/// granularity of the times they report.
const STEP: Duration = Duration::from_millis(100);

/// The longest a scenario waits for anything (virtual time).
const LIMIT: Duration = Duration::from_secs(120);

/// What a cluster of `nodes` costs and how fast it converges.
#[derive(Debug, Clone)]
pub struct ScaleReport {
    /// Nodes simulated.
    pub nodes: usize,
    /// The seed of the run.
    pub seed: u64,
    /// From the start (every node joining within the first membership interval) until
    /// every node sees every other one up and reachable.
    pub join_converged: Option<Duration>,
    /// Messages between nodes per node per second, idle (heartbeats, session copies,
    /// probes).
    pub messages_per_node_per_sec: f64,
    /// Heartbeat datagrams per node per second, idle.
    pub heartbeats_per_node_per_sec: f64,
    /// Reachability rows carried per node per second, idle.
    pub rows_per_node_per_sec: f64,
    /// Store requests per node per second, idle.
    pub store_requests_per_node_per_sec: f64,
    /// Members marked unreachable while idle (none is down).
    pub false_unreachables: u64,
    /// From killing a node until every other node sees it unreachable (or gone).
    pub kill_unreachable: Option<Duration>,
    /// From killing a node until every other node removed it from its view.
    pub kill_removed: Option<Duration>,
    /// Whether, after the kill, every other node still runs and sees all the others.
    pub others_intact: bool,
}

/// The resolver's settings for `strategy` in a cluster of `n` (static-quorum's quorum: a
/// majority of `n`).
pub fn strategy_settings(strategy: StrategyName, n: usize) -> Option<SbrSettings> {
    let mut config = SbrConfig {
        active_strategy: strategy,
        ..SbrConfig::default()
    };
    config.static_quorum.quorum_size = Some(n / 2 + 1);
    config.resolve().ok().flatten()
}

/// Every strategy the resolver has.
pub const STRATEGIES: [StrategyName; 5] = [
    StrategyName::KeepMajority,
    StrategyName::LeaseMajority,
    StrategyName::StaticQuorum,
    StrategyName::KeepOldest,
    StrategyName::DownAll,
];

/// `nodes` join, idle for `idle`, then one is killed (with the default strategy,
/// lease-majority, on the default network).
pub fn scale_run(nodes: usize, seed: u64, idle: Duration) -> ScaleReport {
    let sbr = strategy_settings(StrategyName::LeaseMajority, nodes);
    let mut sim = Sim::new(nodes, seed, Timings::default(), Network::default(), sbr);
    let join_converged = sim.run_until(STEP, LIMIT, Sim::converged);
    // A few rounds for the tables and digests to settle after the joins.
    sim.run_for(Duration::from_secs(5));
    let before = sim.counters().clone();
    sim.run_for(idle);
    let idle_counts = sim.counted_since(&before);
    let per = |n: u64| n as f64 / nodes as f64 / idle.as_secs_f64();
    let victim = nodes / 3;
    sim.kill(victim);
    let others = |sim: &Sim| -> Vec<usize> {
        (0..sim.len())
            .filter(|i| *i != victim && sim.is_alive(*i))
            .collect()
    };
    let kill_unreachable = sim.run_until(STEP, LIMIT, |sim| {
        others(sim)
            .into_iter()
            .all(|i| sim.sees(i, victim) != Some(true))
    });
    let since_unreachable = sim.run_until(STEP, LIMIT, |sim| {
        others(sim)
            .into_iter()
            .all(|i| sim.sees(i, victim).is_none())
    });
    let kill_removed = kill_unreachable.zip(since_unreachable).map(|(a, b)| a + b);
    let others_intact = others(&sim).len() == nodes - 1 && sim.converged();
    ScaleReport {
        nodes,
        seed,
        join_converged,
        messages_per_node_per_sec: per(idle_counts.messages()),
        heartbeats_per_node_per_sec: per(idle_counts.datagrams),
        rows_per_node_per_sec: per(idle_counts.rows),
        store_requests_per_node_per_sec: per(idle_counts.store_requests),
        false_unreachables: idle_counts.unreachable_events,
        kill_unreachable,
        kill_removed,
        others_intact,
    }
}

/// What one side of a partition did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SideOutcome {
    /// Its nodes.
    pub nodes: usize,
    /// Nodes whose side survived, having downed only nodes of the other side, and seeing
    /// none of them at the end.
    pub survived: usize,
    /// Nodes whose side survived, having downed a node of their own side or still seeing
    /// one of the other.
    pub survived_wrongly: usize,
    /// Nodes that downed themselves.
    pub downed_self: usize,
    /// Nodes that decided nothing.
    pub undecided: usize,
    /// Why its nodes went (the reason each gave), with how many gave it.
    pub reasons: BTreeMap<String, usize>,
    /// The nodes (by index) that decided nothing.
    pub undecided_nodes: Vec<usize>,
}

impl SideOutcome {
    /// Whether every node of the side survived.
    pub fn all_survived(&self) -> bool {
        self.survived == self.nodes
    }

    /// Whether every node of the side downed itself.
    pub fn all_went(&self) -> bool {
        self.downed_self == self.nodes
    }
}

/// The reason a node gave for going, shortened to what it has in common with the others
/// that gave it: the strategy or rule's name, and "downed by a survivor" for the notice of
/// a member that downed it (which names that member).
fn reason(why: &str) -> String {
    if why.starts_with("member ") && why.contains(" downed this node") {
        return "downed by a survivor".into();
    }
    why.split(':').next().unwrap_or(why).to_string()
}

/// Both sides of a partition, as decided.
#[derive(Debug, Clone)]
pub struct PartitionReport {
    /// The strategy.
    pub strategy: StrategyName,
    /// The seed of the run.
    pub seed: u64,
    /// The side of `sides[0].nodes` nodes, and the other.
    pub sides: [SideOutcome; 2],
    /// From the cut until every node had decided.
    pub decided_after: Option<Duration>,
    /// Messages between nodes per node per second, from the cut until every node decided
    /// (or the wait ended).
    pub messages_per_node_per_sec: f64,
    /// Reachability rows carried per node per second, over the same time.
    pub rows_per_node_per_sec: f64,
}

impl PartitionReport {
    /// Whether both sides reached the same decision: each side as one, at most one side
    /// surviving, and a surviving side rid of the other.
    pub fn agreed(&self) -> bool {
        let [a, b] = &self.sides;
        let whole = |s: &SideOutcome| s.all_survived() || s.all_went();
        whole(a) && whole(b) && !(a.all_survived() && b.all_survived())
    }

    /// Which side survived (0, 1), or none.
    pub fn survivor(&self) -> Option<usize> {
        self.sides.iter().position(SideOutcome::all_survived)
    }
}

/// A cluster of `nodes` deciding with `strategy` is cut in two, `first` nodes (chosen at
/// random) on one side: what each side decided.
pub fn partition_run(
    nodes: usize,
    first: usize,
    strategy: StrategyName,
    seed: u64,
) -> PartitionReport {
    let sbr = strategy_settings(strategy, nodes);
    let mut sim = Sim::new(nodes, seed, Timings::default(), Network::default(), sbr);
    sim.run_until(STEP, LIMIT, Sim::converged);
    sim.run_for(Duration::from_secs(2));
    let mut order: Vec<usize> = (0..nodes).collect();
    fastrand::Rng::with_seed(seed ^ 0x5eed).shuffle(&mut order);
    let side_a: BTreeSet<usize> = order[..first].iter().copied().collect();
    let in_a = side_a.clone();
    sim.partition(move |i| in_a.contains(&i));
    let before = sim.counters().clone();
    let cut_at = sim.elapsed();
    let decided_after = sim.run_until(STEP, LIMIT, |sim| {
        (0..sim.len()).all(|i| sim.outcome(i).is_some())
    });
    let during = sim.counted_since(&before);
    let secs = (sim.elapsed() - cut_at)
        .as_secs_f64()
        .max(f64::MIN_POSITIVE);
    let per = |n: u64| n as f64 / nodes as f64 / secs;
    // Later decisions (a second round) would show here.
    sim.run_for(Duration::from_secs(10));
    let side = |members: &BTreeSet<usize>| {
        let others: BTreeSet<usize> = (0..nodes).filter(|i| !members.contains(i)).collect();
        let mut out = SideOutcome {
            nodes: members.len(),
            ..SideOutcome::default()
        };
        for &i in members {
            match sim.outcome(i) {
                // The other side's nodes that downed themselves left the view on their own.
                Some(Outcome::Survived(downed))
                    if downed.is_subset(&others)
                        && others.iter().all(|j| sim.sees(i, *j).is_none()) =>
                {
                    out.survived += 1
                }
                Some(Outcome::Survived(_)) => out.survived_wrongly += 1,
                Some(Outcome::DownedSelf(why)) => {
                    out.downed_self += 1;
                    *out.reasons.entry(reason(why)).or_default() += 1;
                }
                None => {
                    out.undecided += 1;
                    out.undecided_nodes.push(i);
                }
            }
        }
        out
    };
    let side_b: BTreeSet<usize> = (0..nodes).filter(|i| !side_a.contains(i)).collect();
    PartitionReport {
        strategy,
        seed,
        sides: [side(&side_a), side(&side_b)],
        decided_after,
        messages_per_node_per_sec: per(during.messages()),
        rows_per_node_per_sec: per(during.rows),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seeds every run tries, and one more at random (printed; replay it with
    /// `TENURE_SIM_SEED`).
    fn seeds() -> Vec<u64> {
        if let Some(seed) = seed_from_env() {
            println!("{SEED_VAR}={seed} (from the environment)");
            return vec![seed];
        }
        let random = fastrand::u64(..);
        println!("random seed: {SEED_VAR}={random}");
        vec![1, random]
    }

    #[test]
    fn a_cluster_converges_after_joins_and_a_kill_at_a_cost_flat_in_n() {
        for seed in seeds() {
            let small = scale_run(20, seed, Duration::from_secs(5));
            let large = scale_run(60, seed, Duration::from_secs(5));
            for r in [&small, &large] {
                println!("{r:?}");
                assert!(r.join_converged.is_some(), "seed {seed}: {r:?}");
                assert_eq!(r.false_unreachables, 0, "seed {seed}: {r:?}");
                assert!(r.kill_removed.is_some(), "seed {seed}: {r:?}");
                assert!(r.others_intact, "seed {seed}: {r:?}");
            }
            let ratio = large.messages_per_node_per_sec / small.messages_per_node_per_sec;
            assert!(ratio <= 1.3, "seed {seed}: {ratio} x the messages per node");
        }
    }

    /// At 60 nodes, the nodes of a side do not all decide at once: those whose last new
    /// observation came later decide later, after others of their side went. The rows of
    /// the members that went leave the tables with them, and with those rows the other
    /// side's members only they listed: a late node saw them turn reachable again, waited
    /// anew, and once its side's observers were all gone found the partition whole and
    /// stayed up alone (down-all), or counted them on its own side and survived
    /// (keep-majority), or went by `down-all-when-unstable`. A resolver that takes that
    /// unlisting for a heal fails seed 1 (down-all: four nodes of one side undecided;
    /// keep-majority: two nodes unstable); one that only starts no new wait for it counts
    /// those members on its own side (`Resolver`'s own test shows both without the
    /// simulator).
    #[test]
    fn a_node_that_decides_after_its_side_went_decides_as_its_side_did() {
        for seed in seeds() {
            for strategy in [StrategyName::DownAll, StrategyName::KeepMajority] {
                let r = partition_run(60, 30, strategy, seed);
                println!("{r:?}");
                assert!(r.agreed(), "seed {seed}: {r:?}");
                for side in &r.sides {
                    assert!(
                        !side.reasons.contains_key("down-all-when-unstable"),
                        "seed {seed}: a node found the partition unstable: {r:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn both_sides_of_a_partition_decide_alike_under_every_strategy() {
        for seed in seeds() {
            for strategy in STRATEGIES {
                for first in [10, 14] {
                    let r = partition_run(20, first, strategy, seed);
                    println!("{r:?}");
                    assert!(r.agreed(), "seed {seed}: {r:?}");
                }
            }
        }
    }
}
