//! The ring of monitors: which peers a node heartbeats and watches.
//!
//! Every node places the members on one ring, sorted by a stable hash of each member's
//! address and incarnation (the same on every node and every build), and exchanges
//! heartbeats with its `d = ceil(k / 2)` next and `d` previous members on it, where `k` is
//! `cluster.monitored-by-nr-of-members` (Akka's setting). The relation is symmetric: a node
//! watches exactly the peers that watch it, so each member is watched by `min(n - 1, 2d)`
//! others (at least `k`, or every other member in a cluster of up to `2d + 1`), and each
//! pair that exchanges heartbeats can tell the other whether its datagrams arrive.
//!
//! A new life of a node (another incarnation) lands elsewhere on the ring, and a join or a
//! departure changes the neighbours of at most `2d` members, by one neighbour each.

use std::collections::BTreeSet;

use crate::identity::{Incarnation, NodeAddr};

/// A member's place on the ring: FNV-1a (64 bits) over its address, a separator and its
/// incarnation. Stable across processes, platforms and releases, unlike std's hasher.
pub fn position(addr: &NodeAddr, incarnation: Incarnation) -> u64 {
    let mut h = Fnv::default();
    h.addr(addr);
    h.bytes(b"#");
    h.u64(incarnation.0);
    h.finish()
}

/// FNV-1a, 64 bits: a hash that is the same on every node and release.
#[derive(Debug, Clone, Copy)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    /// Takes `bytes`.
    pub fn bytes(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// Takes a node address (host bytes, then the port, little-endian).
    pub fn addr(&mut self, addr: &NodeAddr) {
        self.bytes(addr.host.as_bytes());
        self.bytes(&addr.port.to_le_bytes());
    }

    /// Takes a number, little-endian.
    pub fn u64(&mut self, n: u64) {
        self.bytes(&n.to_le_bytes());
    }

    /// The hash of what was taken.
    pub fn finish(self) -> u64 {
        self.0
    }
}

/// The peers `me` heartbeats and watches among `members` (which may or may not list `me`;
/// duplicates and order do not matter): its `ceil(k / 2)` next and previous members on the
/// ring. With `k = 0` nobody; with `2 * ceil(k / 2) + 1` members or fewer, every other one.
pub fn neighbours(
    me: (&NodeAddr, Incarnation),
    members: impl IntoIterator<Item = (NodeAddr, Incarnation)>,
    k: usize,
) -> BTreeSet<NodeAddr> {
    neighbours_passing(me, members, k, |_| true)
}

/// As [`neighbours`], with the members `reachable` says are not reachable passed over
/// without counting (Akka's heartbeat ring does the same): `me` watches its `ceil(k / 2)`
/// next and previous *reachable* members and every unreachable one between them, so that
/// a member that is unreachable stays watched by reachable ones when its own watchers go
/// (downed, or cut off with it), and is not taken for reachable for want of an observer.
pub fn neighbours_passing(
    me: (&NodeAddr, Incarnation),
    members: impl IntoIterator<Item = (NodeAddr, Incarnation)>,
    k: usize,
    reachable: impl Fn(&NodeAddr) -> bool,
) -> BTreeSet<NodeAddr> {
    let mut ring: Vec<(u64, NodeAddr, Incarnation)> = members
        .into_iter()
        .filter(|(a, _)| a != me.0)
        .map(|(a, i)| (position(&a, i), a, i))
        .collect();
    ring.push((position(me.0, me.1), me.0.clone(), me.1));
    ring.sort();
    ring.dedup();
    let n = ring.len();
    let d = k.div_ceil(2);
    let Some(at) = ring.iter().position(|(_, a, i)| a == me.0 && *i == me.1) else {
        return BTreeSet::new();
    };
    let mut out = BTreeSet::new();
    for forward in [true, false] {
        let mut counted = 0;
        for step in 1..n {
            if counted == d {
                break;
            }
            let j = if forward {
                (at + step) % n
            } else {
                (at + n - step) % n
            };
            let addr = &ring[j].1;
            out.insert(addr.clone());
            if reachable(addr) {
                counted += 1;
            }
        }
    }
    out.remove(me.0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn a(p: u16) -> NodeAddr {
        NodeAddr::parse("t", &format!("10.0.0.{}:{}", p % 250 + 1, 2000 + p)).unwrap()
    }

    fn cluster(ports: &BTreeSet<u16>) -> Vec<(NodeAddr, Incarnation)> {
        ports
            .iter()
            .map(|p| (a(*p), Incarnation(u64::from(*p) * 7919)))
            .collect()
    }

    #[test]
    fn positions_are_stable_across_builds() {
        // A changed hash would split a cluster under a rolling upgrade into two rings.
        let addr = NodeAddr::parse("t", "127.0.0.1:2552").unwrap();
        assert_eq!(position(&addr, Incarnation(1)), 0x92da_f45e_56c4_2227);
        assert_ne!(
            position(&addr, Incarnation(1)),
            position(&addr, Incarnation(2)),
            "a new life lands elsewhere"
        );
    }

    #[test]
    fn small_clusters_watch_everyone_and_k_zero_nobody() {
        let members = cluster(&(0..10).collect());
        let (addr, inc) = members[3].clone();
        let all = neighbours((&addr, inc), members.clone(), 9);
        assert_eq!(all.len(), 9, "2 x 5 + 1 >= 10 members: every other one");
        assert!(neighbours((&addr, inc), members, 0).is_empty());
    }

    #[test]
    fn unreachable_members_are_passed_over_and_still_watched() {
        let members = cluster(&(0..40).collect());
        let (addr, inc) = members[7].clone();
        let plain = neighbours((&addr, inc), members.clone(), 9);
        assert_eq!(
            neighbours_passing((&addr, inc), members.clone(), 9, |_| true),
            plain,
            "all reachable: the same ring"
        );
        let cut: BTreeSet<NodeAddr> = plain.iter().take(3).cloned().collect();
        let passing = neighbours_passing((&addr, inc), members, 9, |a| !cut.contains(a));
        assert!(passing.is_superset(&plain), "the unreachable stay watched");
        assert_eq!(
            passing.iter().filter(|a| !cut.contains(*a)).count(),
            10,
            "and 2 x 5 reachable ones besides"
        );
    }

    proptest! {
        #[test]
        fn the_ring_is_symmetric_bounded_and_covers_every_member(
            ports in proptest::collection::btree_set(0u16..500, 1..80),
            k in 1usize..12,
        ) {
            let members = cluster(&ports);
            let n = members.len();
            let d = k.div_ceil(2);
            let sets: Vec<BTreeSet<NodeAddr>> = members
                .iter()
                .map(|(addr, inc)| neighbours((addr, *inc), members.iter().rev().cloned(), k))
                .collect();
            for (i, (addr, _)) in members.iter().enumerate() {
                prop_assert_eq!(sets[i].len(), (n - 1).min(2 * d));
                prop_assert!(!sets[i].contains(addr));
                let watchers = sets.iter().filter(|s| s.contains(addr)).count();
                prop_assert_eq!(watchers, sets[i].len(), "watched by as many as it watches");
                prop_assert!(watchers >= (n - 1).min(k));
                for peer in &sets[i] {
                    let j = members.iter().position(|(x, _)| x == peer).unwrap();
                    prop_assert!(sets[j].contains(addr), "symmetric");
                }
            }
        }

        #[test]
        fn a_join_changes_few_neighbour_sets_by_one(
            ports in proptest::collection::btree_set(0u16..500, 2..60),
            newcomer in 500u16..600,
            k in 1usize..12,
        ) {
            let before = cluster(&ports);
            let mut after = before.clone();
            after.push((a(newcomer), Incarnation(u64::from(newcomer) * 7919)));
            let d = k.div_ceil(2);
            let mut changed = 0;
            for (addr, inc) in &before {
                let old = neighbours((addr, *inc), before.clone(), k);
                let new = neighbours((addr, *inc), after.clone(), k);
                if old != new {
                    changed += 1;
                    prop_assert!(old.difference(&new).count() <= 1);
                    prop_assert!(new.difference(&old).count() <= 1);
                }
            }
            prop_assert!(changed <= 2 * d);
        }
    }
}
