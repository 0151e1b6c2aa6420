//! Where shards go: a pluggable strategy, the regions it decides over (kept by the
//! coordinator one allocation at a time), and the default, Akka's least-shard strategy: a new
//! shard goes to the region with the fewest, and a rebalance moves shards from the most to
//! the least loaded regions, a bounded share per round, until they are balanced.
//!
//! During a rolling update the regions run different application versions
//! (`cluster.app-version`): a strategy is shown only the regions of the newest version
//! among those that may be given shards, so that new and moved shards go to the newest
//! version and a rebalance never moves a shard onto an older one; the shards of older
//! regions stay where they are until those nodes leave.

use std::collections::{BTreeMap, BTreeSet};

use tenure_cluster::AppVersion;

use crate::settings::ShardingSettings;

/// Where every known shard lives (`host:port` of its region), indexed both ways, and which
/// regions may be given shards now (allocatable: registered, available, up and reachable).
///
/// A strategy sees the allocatable regions, each with the shards it hosts
/// ([`iter`](Self::iter)); the coordinator updates the map one allocation at a time, so
/// nothing is rebuilt per allocation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Regions {
    /// Shard → region.
    homes: BTreeMap<String, String>,
    /// Region → its shards: every region with a shard, and every allocatable one.
    hosted: BTreeMap<String, BTreeSet<String>>,
    allocatable: BTreeSet<String>,
    /// The application version of each region that set one (others run the default).
    versions: BTreeMap<String, AppVersion>,
    /// The allocatable regions of the newest version among them: those a strategy sees.
    newest: BTreeSet<String>,
}

static NO_SHARDS: BTreeSet<String> = BTreeSet::new();

impl Regions {
    /// No region, no shard.
    pub fn new() -> Self {
        Regions::default()
    }

    /// The regions that may be given shards, in address order, each with the shards it
    /// hosts: those registered, available, up and reachable, and of the newest application
    /// version among these.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &BTreeSet<String>)> {
        self.newest
            .iter()
            .map(|r| (r.as_str(), self.hosted.get(r).unwrap_or(&NO_SHARDS)))
    }

    /// How many regions may be given shards.
    pub fn len(&self) -> usize {
        self.newest.len()
    }

    /// Whether no region may be given shards.
    pub fn is_empty(&self) -> bool {
        self.newest.is_empty()
    }

    /// Whether `region` may be given shards.
    pub fn is_allocatable(&self, region: &str) -> bool {
        self.newest.contains(region)
    }

    /// The application version of `region` (the default when it set none).
    pub fn version(&self, region: &str) -> AppVersion {
        self.versions.get(region).cloned().unwrap_or_default()
    }

    /// Records that `region` runs application `version`; true when that changed.
    pub(crate) fn set_version(&mut self, region: &str, version: AppVersion) -> bool {
        let changed = self.versions.get(region) != Some(&version);
        if changed {
            self.versions.insert(region.to_string(), version);
            self.pick_newest();
        }
        changed
    }

    /// Recomputes the allocatable regions of the newest version.
    fn pick_newest(&mut self) {
        let newest = self.allocatable.iter().map(|r| self.version(r)).max();
        self.newest = self
            .allocatable
            .iter()
            .filter(|r| newest.as_ref() == Some(&self.version(r)))
            .cloned()
            .collect();
    }

    /// How many shards the allocatable regions host.
    pub fn allocated(&self) -> usize {
        self.iter().map(|(_, shards)| shards.len()).sum()
    }

    /// The region `shard` lives on (allocatable or not), if it has a home.
    pub fn home(&self, shard: &str) -> Option<&str> {
        self.homes.get(shard).map(String::as_str)
    }

    /// Every shard with a home, in shard order, with its region.
    pub fn homes(&self) -> impl Iterator<Item = (&str, &str)> {
        self.homes.iter().map(|(s, r)| (s.as_str(), r.as_str()))
    }

    /// How many shards have a home.
    pub fn shards(&self) -> usize {
        self.homes.len()
    }

    /// The shards homed on `region` (allocatable or not).
    pub fn hosted_by(&self, region: &str) -> &BTreeSet<String> {
        self.hosted.get(region).unwrap_or(&NO_SHARDS)
    }

    /// The regions that are home to at least one shard.
    pub(crate) fn home_regions(&self) -> impl Iterator<Item = &str> {
        self.hosted
            .iter()
            .filter(|(_, shards)| !shards.is_empty())
            .map(|(r, _)| r.as_str())
    }

    /// Makes `region` the home of `shard`; the home it had before.
    pub(crate) fn set_home(&mut self, shard: &str, region: &str) -> Option<String> {
        let before = self.remove_home(shard);
        self.homes.insert(shard.to_string(), region.to_string());
        self.hosted
            .entry(region.to_string())
            .or_default()
            .insert(shard.to_string());
        before
    }

    /// Forgets the home of `shard`; the home it had.
    pub(crate) fn remove_home(&mut self, shard: &str) -> Option<String> {
        let region = self.homes.remove(shard)?;
        if let Some(shards) = self.hosted.get_mut(&region) {
            shards.remove(shard);
            if shards.is_empty() && !self.allocatable.contains(&region) {
                self.hosted.remove(&region);
            }
        }
        Some(region)
    }

    /// Whether `region` may be given shards from now on (before the newest-version filter);
    /// true when that changed.
    pub(crate) fn set_allocatable(&mut self, region: &str, allocatable: bool) -> bool {
        let changed = if allocatable {
            self.hosted.entry(region.to_string()).or_default();
            self.allocatable.insert(region.to_string())
        } else if self.allocatable.remove(region) {
            if self.hosted.get(region).is_some_and(BTreeSet::is_empty) {
                self.hosted.remove(region);
            }
            true
        } else {
            false
        };
        if changed {
            self.pick_newest();
        }
        changed
    }
}

/// Every region named, allocatable, with the shards named with it.
impl<R, S> FromIterator<(R, S)> for Regions
where
    R: Into<String>,
    S: IntoIterator,
    S::Item: Into<String>,
{
    fn from_iter<I: IntoIterator<Item = (R, S)>>(iter: I) -> Self {
        let mut regions = Regions::new();
        for (region, shards) in iter {
            let region = region.into();
            regions.set_allocatable(&region, true);
            for shard in shards {
                regions.set_home(&shard.into(), &region);
            }
        }
        regions
    }
}

/// Decides allocation and rebalancing; the coordinator applies its answers.
pub trait AllocationStrategy: Send + Sync + 'static {
    /// The region to host `shard`, one of `regions`' allocatable ones (`None` when there is
    /// none).
    fn allocate(&self, shard: &str, regions: &Regions) -> Option<String>;

    /// Shards to move now, as `(shard, from, to)`, `from` and `to` allocatable regions of
    /// `regions`. `in_progress`: shards still moving from an earlier decision, counted in no
    /// region of `regions`. The coordinator asks every `rebalance-interval`, and again as
    /// soon as every shard of a round has moved.
    fn rebalance(
        &self,
        regions: &Regions,
        in_progress: &BTreeSet<String>,
    ) -> Vec<(String, String, String)>;
}

/// Akka's least-shard strategy (its algorithm since 2.6.10): a new shard goes to the region
/// with the fewest shards; a rebalance moves shards one at a time from the most loaded
/// region to the least loaded while they differ by more than `threshold`, at most
/// [`limit`](Self::limit) shards in one round, and decides nothing while shards of the last
/// round still move (the counts are right only once those have arrived; deciding earlier
/// would move more shards than needed, then some back). Each move narrows the gap between
/// the most and the least loaded, so no shard moves twice and no more move than needed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeastShards {
    /// The regions are balanced when the most loaded has at most this many shards more
    /// than the least (`rebalance-threshold`, at least 1).
    pub threshold: usize,
    /// Share of the allocated shards one round may move (`rebalance-relative-limit`).
    pub relative_limit: f64,
    /// Most shards one round may move (`rebalance-absolute-limit`).
    pub absolute_limit: usize,
}

impl LeastShards {
    /// The strategy with an entity type's `rebalance-threshold`,
    /// `rebalance-relative-limit` and `rebalance-absolute-limit`.
    pub fn from_settings(settings: &ShardingSettings) -> Self {
        LeastShards {
            threshold: settings.rebalance_threshold,
            relative_limit: settings.rebalance_relative_limit,
            absolute_limit: settings.rebalance_absolute_limit,
        }
    }

    /// How many shards one round may move when `allocated` shards are allocated: the
    /// relative share (rounded down), capped by the absolute limit, and at least one.
    pub fn limit(&self, allocated: usize) -> usize {
        // Truncation is the rounding down wanted; the share of a usize count fits a usize.
        let share = (self.relative_limit * allocated as f64) as usize;
        share.min(self.absolute_limit).max(1)
    }
}

impl AllocationStrategy for LeastShards {
    fn allocate(&self, _shard: &str, regions: &Regions) -> Option<String> {
        regions
            .iter()
            .min_by_key(|(r, shards)| (shards.len(), *r))
            .map(|(r, _)| r.to_string())
    }

    fn rebalance(
        &self,
        regions: &Regions,
        in_progress: &BTreeSet<String>,
    ) -> Vec<(String, String, String)> {
        if !in_progress.is_empty() || regions.len() < 2 {
            return Vec::new();
        }
        let limit = self.limit(regions.allocated());
        let threshold = self.threshold.max(1);
        // (count, region) in order: the least loaded first, the most loaded last.
        let mut load: BTreeSet<(usize, &str)> = regions.iter().map(|(r, s)| (s.len(), r)).collect();
        // What each region gives, from its highest shard id down.
        let mut giving: BTreeMap<&str, _> =
            regions.iter().map(|(r, s)| (r, s.iter().rev())).collect();
        let mut moves = Vec::new();
        while moves.len() < limit {
            let (Some(&(lo, least)), Some(&(hi, most))) = (load.first(), load.last()) else {
                break;
            };
            if hi - lo <= threshold {
                break;
            }
            let Some(shard) = giving.get_mut(most).and_then(Iterator::next) else {
                break;
            };
            load.remove(&(hi, most));
            load.remove(&(lo, least));
            load.insert((hi - 1, most));
            load.insert((lo + 1, least));
            moves.push((shard.clone(), most.to_string(), least.to_string()));
        }
        moves
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn regions(spec: &[(&str, usize)]) -> Regions {
        let mut n = 0;
        spec.iter()
            .map(|(r, k)| {
                let shards: Vec<String> = (0..*k)
                    .map(|_| {
                        n += 1;
                        n.to_string()
                    })
                    .collect();
                (r.to_string(), shards)
            })
            .collect()
    }

    fn strategy(threshold: usize, relative_limit: f64, absolute_limit: usize) -> LeastShards {
        LeastShards {
            threshold,
            relative_limit,
            absolute_limit,
        }
    }

    /// The regions after `moves`.
    fn apply(regions: &mut Regions, moves: &[(String, String, String)]) {
        for (shard, from, to) in moves {
            assert_eq!(
                regions.home(shard),
                Some(from.as_str()),
                "{shard} is not on {from}"
            );
            regions.set_home(shard, to);
        }
    }

    fn spread(regions: &Regions) -> (usize, usize) {
        let counts: Vec<usize> = regions.iter().map(|(_, s)| s.len()).collect();
        let min = counts.iter().copied().min().unwrap_or(0);
        (min, counts.iter().copied().max().unwrap_or(0))
    }

    /// The fewest moves that leave at most `threshold` between the most and the least
    /// loaded region: over every band [low, low + threshold] the counts can all fit in, the
    /// shards above it must leave and those below must be filled, whichever is more (the
    /// rest comes from or goes to regions inside the band, which have room).
    fn fewest_moves(counts: &[usize], threshold: usize) -> usize {
        let (n, total) = (counts.len(), counts.iter().sum::<usize>());
        (0..=total / n)
            .filter(|low| total <= n * (low + threshold))
            .map(|low| {
                let above: usize = counts
                    .iter()
                    .map(|c| c.saturating_sub(low + threshold))
                    .sum();
                let below: usize = counts.iter().map(|c| low.saturating_sub(*c)).sum();
                above.max(below)
            })
            .min()
            .unwrap_or(0)
    }

    #[test]
    fn allocates_to_the_least_loaded_region() {
        let s = strategy(1, 0.1, 100);
        assert_eq!(s.allocate("x", &Regions::new()), None);
        let r = regions(&[("a:1", 3), ("b:1", 1), ("c:1", 1)]);
        assert_eq!(
            s.allocate("x", &r).as_deref(),
            Some("b:1"),
            "ties go to the lower address"
        );
        let mut r = r;
        r.set_allocatable("b:1", false);
        assert_eq!(
            s.allocate("x", &r).as_deref(),
            Some("c:1"),
            "b:1 may not be given shards"
        );
        assert_eq!(r.home("4"), Some("b:1"), "its shards keep their home");
    }

    /// A rolling update from 1.9.0 to 1.10.0 over a, b, c: once a node of the newer version
    /// may take shards, new shards go to it alone and a rebalance moves shards only among
    /// the newer version's nodes, never onto an older one.
    #[test]
    fn new_and_moved_shards_go_to_the_newest_version_present() {
        let s = strategy(1, 1.0, 100);
        let none = BTreeSet::new();
        let mut r = regions(&[("a:1", 4), ("b:1", 4), ("c:1", 4)]);
        for region in ["a:1", "b:1", "c:1"] {
            r.set_version(region, AppVersion::new("1.9.0"));
        }
        assert_eq!(r.len(), 3, "one version: every region");
        // c restarted as 1.10.0 (numerically newer than 1.9.0), with no shards yet.
        r.set_allocatable("c:1", false);
        r.remove_home("9");
        r.remove_home("10");
        r.remove_home("11");
        r.remove_home("12");
        assert_eq!(
            s.allocate("9", &r).as_deref(),
            Some("a:1"),
            "c is gone: the old version is the newest present"
        );
        r.set_version("c:1", AppVersion::new("1.10.0"));
        r.set_allocatable("c:1", true);
        assert_eq!(r.len(), 1, "mixed: only the newest version is offered");
        assert!(!r.is_allocatable("a:1") && r.is_allocatable("c:1"));
        for shard in ["9", "10", "11", "12"] {
            assert_eq!(s.allocate(shard, &r).as_deref(), Some("c:1"));
            r.set_home(shard, "c:1");
        }
        assert!(
            s.rebalance(&r, &none).is_empty(),
            "4/4/4 across versions: nothing moves back to 1.9.0"
        );
        // b restarts as 1.10.0 too: a rebalance evens out c and b only; a keeps its own.
        r.set_allocatable("b:1", false);
        for shard in ["5", "6", "7", "8"] {
            r.remove_home(shard);
            assert_eq!(s.allocate(shard, &r).as_deref(), Some("c:1"));
            r.set_home(shard, "c:1");
        }
        r.set_version("b:1", AppVersion::new("1.10.0"));
        r.set_allocatable("b:1", true);
        let moves = s.rebalance(&r, &none);
        assert_eq!(moves.len(), 4, "8/0 becomes 4/4: {moves:?}");
        assert!(
            moves
                .iter()
                .all(|(_, from, to)| from == "c:1" && to == "b:1"),
            "{moves:?}"
        );
        assert_eq!(
            r.hosted_by("a:1").len(),
            4,
            "the old node's shards stay put"
        );
    }

    #[test]
    fn the_limit_is_a_share_of_the_allocated_shards_capped_and_at_least_one() {
        let s = strategy(1, 0.1, 100);
        assert_eq!(s.limit(600), 60);
        assert_eq!(s.limit(5_000), 100, "the absolute cap");
        assert_eq!(s.limit(9), 1, "a share below one shard still moves one");
        assert_eq!(s.limit(0), 1);
    }

    #[test]
    fn moves_from_the_most_to_the_least_loaded_within_the_limit() {
        let s = strategy(1, 0.25, 100);
        let none = BTreeSet::new();
        // 12 shards: a round moves at most 3.
        let r = regions(&[("a:1", 10), ("b:1", 0), ("c:1", 2)]);
        let moves = s.rebalance(&r, &none);
        assert_eq!(moves.len(), 3);
        assert!(moves.iter().all(|(_, from, _)| from == "a:1"));
        assert_eq!(moves[0].2, "b:1");
        assert_eq!(
            moves[0].0, "9",
            "the last shard id (in id order) of the most loaded"
        );
        // Balanced: nothing moves.
        assert!(
            s.rebalance(&regions(&[("a:1", 4), ("b:1", 3)]), &none)
                .is_empty()
        );
        assert!(
            strategy(2, 1.0, 100)
                .rebalance(&regions(&[("a:1", 5), ("b:1", 3)]), &none)
                .is_empty(),
            "within a threshold of 2"
        );
        // Never more than needed: 6/0 becomes 3/3.
        let moves = strategy(1, 1.0, 100).rebalance(&regions(&[("a:1", 6), ("b:1", 0)]), &none);
        assert_eq!(moves.len(), 3);
    }

    #[test]
    fn no_rebalance_while_shards_still_move() {
        let s = strategy(1, 1.0, 100);
        // 4/4/4/0 decided 3 moves to d; one arrived, two are still moving (counted
        // nowhere): the counts look like 3/3/3/1, but once they arrive it is 3/3/3/3.
        let r = regions(&[("a:1", 3), ("b:1", 3), ("c:1", 3), ("d:1", 1)]);
        let moving: BTreeSet<String> = ["20", "21"].map(String::from).into();
        assert!(s.rebalance(&r, &moving).is_empty());
        assert_eq!(s.rebalance(&r, &BTreeSet::new()).len(), 1);
    }

    /// Growing 6 nodes of 100 shards each by 3 empty ones, with the reference limits: 198
    /// shards must move (6 nodes keep 67, 3 get 66), 60 a round, so 4 rounds.
    #[test]
    fn three_nodes_join_six_with_600_shards_in_four_rounds_of_the_reference_limits() {
        let s = strategy(1, 0.1, 100);
        let mut spec: Vec<(String, usize)> = (0..6).map(|i| (format!("n:{i}"), 100)).collect();
        spec.extend((6..9).map(|i| (format!("n:{i}"), 0)));
        let spec: Vec<(&str, usize)> = spec.iter().map(|(r, n)| (r.as_str(), *n)).collect();
        let mut r = regions(&spec);
        let mut rounds = Vec::new();
        loop {
            let moves = s.rebalance(&r, &BTreeSet::new());
            if moves.is_empty() {
                break;
            }
            rounds.push(moves.len());
            apply(&mut r, &moves);
        }
        assert_eq!(rounds, [60, 60, 60, 18]);
        assert_eq!(spread(&r), (66, 67));
    }

    proptest! {
        /// For random loads: one round moves at most the limit and never overshoots (no
        /// region that receives ends above one that gives, the gap never widens); rounds
        /// repeated reach max - min <= threshold in ceil(fewest / limit) rounds, moving
        /// exactly the fewest shards needed, each at most once.
        #[test]
        fn rounds_converge_within_the_limits_and_never_overshoot(
            counts in prop::collection::vec(0usize..60, 1..12),
            threshold in 1usize..4,
            relative_limit in 0.01f64..1.0,
            absolute_limit in 1usize..50,
        ) {
            let s = strategy(threshold, relative_limit, absolute_limit);
            let names: Vec<String> = (0..counts.len()).map(|i| format!("r:{i:02}")).collect();
            let spec: Vec<(&str, usize)> =
                names.iter().map(String::as_str).zip(counts.iter().copied()).collect();
            let mut r = regions(&spec);
            let limit = s.limit(r.allocated());
            let fewest = fewest_moves(&counts, threshold);
            let mut moved = BTreeSet::new();
            let mut rounds = 0;
            loop {
                let (lo, hi) = spread(&r);
                let moves = s.rebalance(&r, &BTreeSet::new());
                if moves.is_empty() {
                    prop_assert!(hi - lo <= threshold, "stopped at {lo}..{hi}");
                    break;
                }
                rounds += 1;
                prop_assert!(moves.len() <= limit, "{} moves, limit {limit}", moves.len());
                let moving: BTreeSet<String> = [moves[0].0.clone()].into();
                prop_assert!(s.rebalance(&r, &moving).is_empty(), "decided while a shard moves");
                let givers: BTreeSet<&str> = moves.iter().map(|m| m.1.as_str()).collect();
                let takers: BTreeSet<&str> = moves.iter().map(|m| m.2.as_str()).collect();
                prop_assert!(givers.is_disjoint(&takers), "a region gave and took: {moves:?}");
                apply(&mut r, &moves);
                let (lo2, hi2) = spread(&r);
                prop_assert!(lo2 >= lo && hi2 <= hi, "{lo}..{hi} became {lo2}..{hi2}");
                let min_giver = givers.iter().map(|g| r.hosted_by(g).len()).min().unwrap_or(0);
                let max_taker = takers.iter().map(|t| r.hosted_by(t).len()).max().unwrap_or(0);
                prop_assert!(max_taker <= min_giver, "overshoot: {moves:?}");
                for (shard, ..) in &moves {
                    prop_assert!(moved.insert(shard.clone()), "shard {shard} moved twice");
                }
            }
            prop_assert_eq!(moved.len(), fewest, "shards moved against the fewest needed");
            prop_assert_eq!(rounds, fewest.div_ceil(limit));
        }
    }
}
