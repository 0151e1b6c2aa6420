//! Faults of single links in a 3-node cluster, at the timings of the CLI's test harness
//! (`tenure_cli::demo::cluster`: heartbeats every 250 ms, unreachable after 1.5 s, member
//! leases of 3 s renewed every 500 ms and listed every 300 ms, stable-after 1.5 s,
//! lease-majority with a minority delay of 1 s): a partial partition, one-way loss, and a
//! link flapping faster and slower than a decision. What the split brain resolver and the
//! failure detector decide about them is protocol, checked here on many seeds in
//! milliseconds where real processes took 25 s a fault.

use std::time::Duration;

use super::{Network, Outcome, Sim, Timings, seed_from_env};
use crate::sbr::{SbrConfig, SbrSettings, StrategyName};

/// How long a fault lasts (the real tests' window).
const FAULT: Duration = Duration::from_secs(20);

/// How often the tests look at the nodes (virtual time).
const STEP: Duration = Duration::from_millis(50);

/// The harness's cluster timings.
fn harness_timings() -> Timings {
    Timings {
        heartbeat_interval: Duration::from_millis(250),
        unreachable_after: Duration::from_millis(1500),
        membership_interval: Duration::from_millis(300),
        member_lease_interval: Duration::from_millis(500),
        member_lease_ttl: Duration::from_secs(3),
        ..Timings::default()
    }
}

/// The harness's resolver: lease-majority (the default strategy), `stable_after`, a
/// minority delay of 1 s, the resolver lease released after 10 s.
fn harness_resolver(stable_after: Duration) -> Option<SbrSettings> {
    let mut config = SbrConfig {
        active_strategy: StrategyName::LeaseMajority,
        stable_after,
        ..SbrConfig::default()
    };
    config.lease_majority.acquire_lease_delay_for_minority = Duration::from_secs(1);
    config.lease_majority.release_after = Duration::from_secs(10);
    config.resolve().ok().flatten()
}

/// Three nodes at the harness's timings, converged and settled.
fn three_nodes(seed: u64, stable_after: Duration) -> Sim {
    let mut sim = Sim::new(
        3,
        seed,
        harness_timings(),
        Network::default(),
        harness_resolver(stable_after),
    );
    let converged = sim.run_until(STEP, Duration::from_secs(30), Sim::converged);
    assert!(
        converged.is_some(),
        "seed {seed}: the cluster never converged"
    );
    sim.run_for(Duration::from_secs(2));
    sim
}

/// Whether node `i` downed itself (its outcome says so).
fn went(sim: &Sim, i: usize) -> bool {
    matches!(sim.outcome(i), Some(Outcome::DownedSelf(_)))
}

/// What every node decided, for failure messages.
fn story(sim: &Sim) -> String {
    (0..sim.len())
        .map(|i| format!("node {i}: up {} outcome {:?}", sim.is_up(i), sim.outcome(i)))
        .chain([format!("at {:?}", sim.elapsed())])
        .collect::<Vec<_>>()
        .join("; ")
}

/// Both sides agree: every node that is up sees every other node that is up as a member
/// and has downed none of them; every node that is not up (downed itself) is gone from
/// every up node's view.
fn assert_agreed(sim: &Sim, seed: u64, what: &str) {
    let up: Vec<usize> = (0..sim.len()).filter(|i| sim.is_up(*i)).collect();
    assert!(
        !up.is_empty(),
        "seed {seed}: {what}: nobody up: {}",
        story(sim)
    );
    for &i in &up {
        for j in (0..sim.len()).filter(|j| *j != i) {
            if sim.is_up(j) {
                assert!(
                    !sim.downed(i, j) && sim.sees(i, j).is_some(),
                    "seed {seed}: {what}: node {j} is up but node {i} downed it or lost it: {}",
                    story(sim)
                );
            } else {
                assert!(
                    sim.sees(i, j).is_none(),
                    "seed {seed}: {what}: node {j} is down but node {i} still has it: {}",
                    story(sim)
                );
            }
        }
    }
}

/// After the fault is lifted, every node that downed itself comes back as a new life and
/// the three converge: each is up and sees the others up and reachable.
fn assert_healed(sim: &mut Sim, seed: u64, what: &str) {
    for i in 0..sim.len() {
        if !sim.is_alive(i) {
            sim.restart(i);
        }
    }
    let converged = sim.run_until(STEP, Duration::from_secs(30), Sim::converged);
    assert!(
        converged.is_some(),
        "seed {seed}: {what}: no convergence after healing: {}",
        story(sim)
    );
}

/// The fixed seeds, and one at random (printed; replay one with `TENURE_SIM_SEED`).
fn seeds() -> Vec<u64> {
    if let Some(seed) = seed_from_env() {
        println!("{}={seed} (from the environment)", super::SEED_VAR);
        return vec![seed];
    }
    let random = fastrand::u64(..);
    println!("random seed: {}={random}", super::SEED_VAR);
    vec![1, 2, 3, 4, random]
}

/// Runs `sim` for `d`, checking `invariant` at every step.
fn run_checking(sim: &mut Sim, d: Duration, mut invariant: impl FnMut(&Sim)) {
    let mut left = d;
    while !left.is_zero() {
        let step = STEP.min(left);
        sim.run_for(step);
        invariant(sim);
        left -= step;
    }
}

/// 0 and 2 cannot hear each other, 1 hears both: 0 and 2 are indirectly connected and
/// each downs itself once the observations held still for stable-after; the middle
/// downs the ends it cannot count on (lease-majority, alone on its side). Once one end
/// is down the other's table is whole again, so either both ends go or the one that
/// decided later stays and serves with the middle; the middle never goes.
#[test]
fn a_partial_partition_downs_an_end_of_the_cut_link_and_the_middle_stays() {
    for seed in seeds() {
        let what = "partial partition (0-2 cut, 1 hears both)";
        let mut sim = three_nodes(seed, Duration::from_millis(1500));
        sim.cut_link(0, 2);
        run_checking(&mut sim, FAULT, |sim| {
            assert!(
                sim.is_up(1),
                "seed {seed}: {what}: the middle went: {}",
                story(sim)
            );
        });
        assert!(
            went(&sim, 0) || went(&sim, 2),
            "seed {seed}: {what}: no end of the cut link went: {}",
            story(&sim)
        );
        assert_agreed(&sim, seed, what);
        sim.heal_link(0, 2);
        assert_healed(&mut sim, seed, what);
    }
}

/// What node 2 sends node 0 is lost; node 2 still hears node 0, node 1 hears both: node
/// 2, the one not heard, downs itself (alone on its side, it waits the minority's delay
/// and finds the resolver lease held by the other side); 0 and 1 stay, rid of it.
#[test]
fn one_way_loss_downs_the_node_that_is_not_heard() {
    for seed in seeds() {
        let what = "one-way loss (2 -> 0)";
        let mut sim = three_nodes(seed, Duration::from_millis(1500));
        sim.lose_one_way(2, 0);
        run_checking(&mut sim, FAULT, |sim| {
            assert!(
                sim.is_up(0) && sim.is_up(1),
                "seed {seed}: {what}: node 0 or 1 went: {}",
                story(sim)
            );
        });
        assert!(
            went(&sim, 2),
            "seed {seed}: {what}: node 2 never downed itself: {}",
            story(&sim)
        );
        assert_agreed(&sim, seed, what);
        sim.heal_link(2, 0);
        assert_healed(&mut sim, seed, what);
    }
}

/// Flaps the link between nodes 0 and 1 for the fault: cut for `cut`, then flowing for
/// `flow`, again and again (node 2 hears both throughout), checking `invariant` at every
/// step; `on_heal` runs at each heal.
fn flap(
    sim: &mut Sim,
    cut: Duration,
    flow: Duration,
    mut on_heal: impl FnMut(&mut Sim),
    mut invariant: impl FnMut(&Sim),
) {
    let mut left = FAULT;
    while left > cut {
        sim.cut_link(0, 1);
        run_checking(sim, cut, &mut invariant);
        sim.heal_link(0, 1);
        on_heal(sim);
        let flowing = flow.min(left - cut);
        run_checking(sim, flowing, &mut invariant);
        left -= cut + flowing;
    }
}

/// The link 0-1 is cut long enough to be seen unreachable (unreachable-after 1.5 s) and
/// heals before the observations can hold still for stable-after (3 s, as in the real
/// test): no decision, no down-all-when-unstable, nobody downed.
#[test]
fn a_link_flapping_faster_than_a_decision_downs_nobody() {
    for seed in seeds() {
        let what = "flapping link (0-1 cut 2.5 s, flowing 1.5 s)";
        let mut sim = three_nodes(seed, Duration::from_secs(3));
        let mut seen_unreachable = false;
        flap(
            &mut sim,
            Duration::from_millis(2500),
            Duration::from_millis(1500),
            |_| {},
            |sim| {
                seen_unreachable |= sim.sees(0, 1) == Some(false) || sim.sees(1, 0) == Some(false);
                for i in 0..sim.len() {
                    assert!(
                        sim.is_up(i) && sim.outcome(i).is_none(),
                        "seed {seed}: {what}: node {i} was downed or decided: {}",
                        story(sim)
                    );
                }
            },
        );
        // The cuts were seen: the property is not that nothing happened.
        assert!(
            seen_unreachable,
            "seed {seed}: {what}: no end ever saw the other unreachable"
        );
        assert_agreed(&sim, seed, what);
        assert_healed(&mut sim, seed, what);
    }
}

/// Each cut of the link 0-1 outlasts unreachable-after + stable-after: the ends are
/// indirectly connected and an end goes (both, or the one that decided first), and comes
/// back as a new life while the link flows; node 2, which hears everyone, never goes,
/// however often the ends come back.
#[test]
fn a_link_flapping_slower_than_a_decision_never_downs_the_node_that_hears_everyone() {
    for seed in seeds() {
        let what = "flapping link (0-1 cut 4.5 s, flowing 1 s)";
        let mut sim = three_nodes(seed, Duration::from_millis(1500));
        let mut ends_went = 0;
        flap(
            &mut sim,
            Duration::from_millis(4500),
            Duration::from_millis(1000),
            |sim| {
                assert_agreed(sim, seed, what);
                for end in [0, 1] {
                    if went(sim, end) {
                        ends_went += 1;
                        sim.restart(end);
                    }
                }
            },
            |sim| {
                assert!(
                    sim.is_up(2) && !went(sim, 2),
                    "seed {seed}: {what}: node 2 went: {}",
                    story(sim)
                );
            },
        );
        assert!(
            ends_went >= 2,
            "seed {seed}: {what}: an end went in fewer than two of the cuts ({ends_went}): {}",
            story(&sim)
        );
        assert_healed(&mut sim, seed, what);
    }
}
