//! Where shards go: a pluggable strategy, and the default that gives a new shard to the
//! region with the fewest and moves shards from the most to the least loaded.

use std::collections::{BTreeMap, BTreeSet};

/// The regions that may host shards, each with the shards it hosts now (`host:port` →
/// shard ids).
pub type Regions = BTreeMap<String, Vec<String>>;

/// Decides allocation and rebalancing; the coordinator applies its answers.
pub trait AllocationStrategy: Send + Sync + 'static {
    /// The region to host `shard` (`None` when `regions` is empty).
    fn allocate(&self, shard: &str, regions: &Regions) -> Option<String>;

    /// Shards to move now, as `(shard, from, to)`, at most `room` of them. `in_progress`:
    /// shards still moving from an earlier decision; `regions` counts them nowhere.
    fn rebalance(
        &self,
        regions: &Regions,
        in_progress: &BTreeSet<String>,
        room: usize,
    ) -> Vec<(String, String, String)>;
}

/// Akka's least-shard strategy: allocate to the region with the fewest shards; rebalance
/// while the most loaded has at least `threshold` more than the least, and (as Akka's since
/// 2.6.10) not while an earlier rebalance is still moving shards: the counts are right only
/// once those have arrived, and deciding earlier moves more shards than needed (then moves
/// some back).
#[derive(Debug, Clone, Copy)]
pub struct LeastShards {
    /// How many more shards the most loaded region must have than the least to rebalance.
    pub threshold: usize,
}

impl AllocationStrategy for LeastShards {
    fn allocate(&self, _shard: &str, regions: &Regions) -> Option<String> {
        regions
            .iter()
            .min_by(|a, b| (a.1.len(), a.0).cmp(&(b.1.len(), b.0)))
            .map(|(r, _)| r.clone())
    }

    fn rebalance(
        &self,
        regions: &Regions,
        in_progress: &BTreeSet<String>,
        room: usize,
    ) -> Vec<(String, String, String)> {
        if !in_progress.is_empty() {
            return Vec::new();
        }
        let mut counts: BTreeMap<String, Vec<String>> = regions.clone();
        let mut moves = Vec::new();
        while moves.len() < room {
            let Some(most) = counts
                .iter()
                .max_by(|a, b| (a.1.len(), b.0).cmp(&(b.1.len(), a.0)))
                .map(|(r, _)| r.clone())
            else {
                break;
            };
            let Some(least) = self.allocate("", &counts) else {
                break;
            };
            let (hi, lo) = (counts[&most].len(), counts[&least].len());
            if most == least || hi < lo + self.threshold.max(1) || hi <= lo + 1 {
                break;
            }
            let Some(shard) = counts.get_mut(&most).and_then(|s| s.pop()) else {
                break;
            };
            counts.entry(least.clone()).or_default().push(shard.clone());
            moves.push((shard, most, least));
        }
        moves
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regions(spec: &[(&str, usize)]) -> Regions {
        let mut n = 0;
        spec.iter()
            .map(|(r, k)| {
                let shards = (0..*k)
                    .map(|_| {
                        n += 1;
                        n.to_string()
                    })
                    .collect();
                (r.to_string(), shards)
            })
            .collect()
    }

    #[test]
    fn allocates_to_the_least_loaded_region() {
        let s = LeastShards { threshold: 2 };
        assert_eq!(s.allocate("x", &Regions::new()), None);
        let r = regions(&[("a:1", 3), ("b:1", 1), ("c:1", 1)]);
        assert_eq!(
            s.allocate("x", &r).as_deref(),
            Some("b:1"),
            "ties go to the lower address"
        );
    }

    #[test]
    fn rebalances_from_most_to_least_within_room() {
        let s = LeastShards { threshold: 2 };
        let r = regions(&[("a:1", 10), ("b:1", 0), ("c:1", 2)]);
        let none = BTreeSet::new();
        let moves = s.rebalance(&r, &none, 3);
        assert_eq!(moves.len(), 3);
        assert!(moves.iter().all(|(_, from, _)| from == "a:1"));
        assert_eq!(moves[0].2, "b:1");
        // Balanced enough: nothing moves; a difference of one never moves.
        assert!(
            s.rebalance(&regions(&[("a:1", 4), ("b:1", 3)]), &none, 3)
                .is_empty()
        );
        assert!(
            s.rebalance(&regions(&[("a:1", 2), ("b:1", 1)]), &none, 3)
                .is_empty()
        );
        assert!(s.rebalance(&r, &none, 0).is_empty());
        // Moves never overshoot: 6/0 becomes 3/3.
        let moves = s.rebalance(&regions(&[("a:1", 6), ("b:1", 0)]), &none, 10);
        assert_eq!(moves.len(), 3);
    }

    #[test]
    fn no_rebalance_while_shards_still_move() {
        let s = LeastShards { threshold: 2 };
        // 4/4/4/0 decided 3 moves to d; one arrived, two are still moving (counted
        // nowhere): the counts look like 3/3/3/1, but once they arrive it is 3/3/3/3.
        let r = regions(&[("a:1", 3), ("b:1", 3), ("c:1", 3), ("d:1", 1)]);
        let moving: BTreeSet<String> = ["20", "21"].map(String::from).into();
        assert!(s.rebalance(&r, &moving, 1).is_empty());
        assert_eq!(s.rebalance(&r, &BTreeSet::new(), 1).len(), 1);
    }
}
