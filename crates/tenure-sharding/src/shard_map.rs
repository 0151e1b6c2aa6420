//! The shard map of an entity type as one node knows it: Akka's
//! `ShardRegion.GetShardRegionState` (the shards this node hosts, with their entity ids)
//! and `GetClusterShardingStats` (shards per node) in one answer, asked through
//! [`ShardRegion::shard_map`](crate::ShardRegion::shard_map). A management endpoint serves
//! it as JSON and the CLI reads it back, so both show the same thing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tenure_lease::FencingToken;

use crate::messages::Allocation;

/// One entity type's shards as the node `node` knows them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMap {
    /// The entity type.
    pub type_name: String,
    /// The node whose region answered (`host:port`).
    pub node: String,
    /// Whether the homes come from the coordinator's allocation. `false`: no coordinator
    /// answered in time (it is moving, or the cluster has none up), and the homes are what
    /// this node's region last learned, which may be stale or incomplete.
    pub from_coordinator: bool,
    /// Every shard allocated so far (shards are allocated at their first message), by id.
    pub shards: Vec<ShardEntry>,
    /// Shards per node, every region the coordinator may allocate to included.
    pub regions: Vec<RegionShards>,
}

/// One shard: where it lives, and what runs of it on the answering node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    /// The shard id.
    pub shard: String,
    /// The node it is allocated to (`None`: not known here).
    pub home: Option<String>,
    /// Its instance on the answering node, if one runs there (normally only on its home;
    /// also on its old home while it hands off).
    pub hosted: Option<HostedShard>,
}

/// A shard running on the answering node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostedShard {
    /// The fencing token of the shard lease grant it serves under; `None` while it waits
    /// for the lease (it then keeps its messages).
    pub token: Option<FencingToken>,
    /// Ids of its running entities, sorted.
    pub entities: Vec<String>,
    /// Messages waiting for the lease or for a passivating entity.
    pub waiting: usize,
}

/// How many shards a node is home to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionShards {
    /// The node (`host:port`).
    pub node: String,
    /// Shards allocated to it.
    pub shards: usize,
}

impl ShardMap {
    /// Puts the map together from the coordinator's allocation (or, without one, the homes
    /// the region knows) and the shards running on `node`.
    pub(crate) fn build(
        type_name: &str,
        node: &str,
        allocation: Option<Allocation>,
        known_homes: Vec<(String, String)>,
        hosted: BTreeMap<String, HostedShard>,
    ) -> ShardMap {
        let from_coordinator = allocation.is_some();
        let (homes, regions) = match allocation {
            Some(a) => (a.homes, a.regions),
            None => (known_homes, Vec::new()),
        };
        let mut homes: BTreeMap<String, Option<String>> = homes
            .into_iter()
            .map(|(shard, home)| (shard, Some(home)))
            .collect();
        for shard in hosted.keys() {
            homes.entry(shard.clone()).or_insert(None);
        }
        let mut per_node: BTreeMap<String, usize> = regions.into_iter().map(|r| (r, 0)).collect();
        for home in homes.values().flatten() {
            *per_node.entry(home.clone()).or_default() += 1;
        }
        let mut hosted = hosted;
        let mut shards: Vec<ShardEntry> = homes
            .into_iter()
            .map(|(shard, home)| ShardEntry {
                hosted: hosted.remove(&shard),
                shard,
                home,
            })
            .collect();
        // Numeric ids (the default shard function's) in numeric order, others after.
        shards.sort_by(|a, b| shard_order(&a.shard).cmp(&shard_order(&b.shard)));
        ShardMap {
            type_name: type_name.to_string(),
            node: node.to_string(),
            from_coordinator,
            shards,
            regions: per_node
                .into_iter()
                .map(|(node, shards)| RegionShards { node, shards })
                .collect(),
        }
    }

    /// The shards this node hosts.
    pub fn hosted(&self) -> impl Iterator<Item = (&ShardEntry, &HostedShard)> {
        self.shards
            .iter()
            .filter_map(|e| e.hosted.as_ref().map(|h| (e, h)))
    }
}

fn shard_order(id: &str) -> (u8, u64, &str) {
    match id.parse::<u64>() {
        Ok(n) => (0, n, id),
        Err(_) => (1, 0, id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosted(token: u64, entities: &[&str]) -> HostedShard {
        HostedShard {
            token: Some(FencingToken::new(token)),
            entities: entities.iter().map(|e| e.to_string()).collect(),
            waiting: 0,
        }
    }

    #[test]
    fn the_allocation_gives_homes_and_counts_and_local_shards_their_entities() {
        let allocation = Allocation {
            homes: vec![
                ("10".into(), "a:1".into()),
                ("2".into(), "b:2".into()),
                ("3".into(), "a:1".into()),
            ],
            regions: vec!["a:1".into(), "b:2".into(), "c:3".into()],
        };
        let local = BTreeMap::from([
            ("3".to_string(), hosted(7, &["x"])),
            ("10".to_string(), hosted(9, &[])),
        ]);
        let map = ShardMap::build("t", "a:1", Some(allocation), Vec::new(), local);
        assert!(map.from_coordinator);
        let ids: Vec<&str> = map.shards.iter().map(|s| s.shard.as_str()).collect();
        assert_eq!(ids, ["2", "3", "10"]);
        assert_eq!(map.shards[1].hosted, Some(hosted(7, &["x"])));
        assert_eq!(map.shards[0].hosted, None);
        let counts: Vec<(&str, usize)> = map
            .regions
            .iter()
            .map(|r| (r.node.as_str(), r.shards))
            .collect();
        assert_eq!(counts, [("a:1", 2), ("b:2", 1), ("c:3", 0)]);
        assert_eq!(map.hosted().count(), 2);
    }

    #[test]
    fn without_a_coordinator_the_region_s_homes_and_local_shards_are_shown() {
        let local = BTreeMap::from([("5".to_string(), hosted(1, &["k"]))]);
        let map = ShardMap::build("t", "a:1", None, vec![("4".into(), "b:2".into())], local);
        assert!(!map.from_coordinator);
        assert_eq!(map.shards.len(), 2);
        assert_eq!(map.shards[1].home, None);
        assert!(map.shards[1].hosted.is_some());
    }
}
