//! Reachability observations shared in heartbeats: each node's row says which members it
//! cannot hear. Rows travel with every heartbeat and are relayed, so that every node of a
//! connected part of the cluster ends up with the same table, and a node that some peers
//! hear and others do not (a partial or one-way partition) is seen as such everywhere.
//!
//! A row's version is a stamp of its observer's clock (see [`crate::clocks`]), so a relayed
//! row can be checked against what the receiver knows of that clock: a version further
//! ahead than the observer can have stamped is refused, and one that got in anyway (from a
//! relay while the observer was never heard) is replaced as soon as the observer itself is
//! heard, since no row it sent can be newer than the heartbeat carrying it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::identity::{Incarnation, NodeAddr};

/// What one node (`observer`, in its life `incarnation`) cannot hear, as of `version` (a
/// stamp of its clock: higher is newer within one life).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReachRow {
    /// The node that observed.
    pub observer: NodeAddr,
    /// The observer's incarnation (its life).
    pub incarnation: Incarnation,
    /// When the observer made the observation, as a stamp of its clock: higher is newer
    /// within one life.
    pub version: u64,
    /// The members the observer cannot hear.
    pub unreachable: Vec<NodeAddr>,
}

/// A row as tables and heartbeats hold it: shared, never copied. A row is immutable once
/// made (a change is a new row with a new version), so every heartbeat that carries it and
/// every table that takes it (a relay's, or, in the simulator, a thousand nodes') holds the
/// same allocation: carrying a row costs a reference count, whatever it lists.
pub type SharedRow = Arc<ReachRow>;

/// The newest row of every observer that is a member.
#[derive(Debug, Clone, Default)]
pub struct ReachTable {
    rows: BTreeMap<NodeAddr, SharedRow>,
    /// Counts the changes of `rows` (see [`ReachTable::generation`]).
    generation: u64,
    /// Per member listed: by how many rows other than its own (kept as rows come and go, so
    /// that the partition and the verdicts on unwatched members are read from the members
    /// listed, not rebuilt from every (observer, subject) record at each change).
    listed: BTreeMap<NodeAddr, usize>,
    /// The digest of `rows` ([`ReachTable::digest`]), kept as rows come and go: a table of
    /// a thousand observers changes many times a round while members join, and every
    /// heartbeat in and out carries or compares the digest.
    digest: u64,
}

/// The share of one row in a table's digest: a mixed hash of (observer, life, version) for
/// a row that lists someone, nothing for one that lists nobody. The digest is the wrapping
/// sum of the shares, so a row's coming and going costs one addition, whatever the size of
/// the table.
///
/// A row that lists nobody says no more than no row: both leave the observer out of every
/// partition. Such rows are kept, to shadow the older rows of their observer, but they are
/// no difference between two tables (and [`crate::sbr::Spread`] does not carry a first one),
/// so that a thousand members joining, each with a new empty row, change no digest.
fn share(row: &ReachRow) -> u64 {
    if row.unreachable.is_empty() {
        return 0;
    }
    let mut h = crate::ring::Fnv::default();
    h.addr(&row.observer);
    h.u64(row.incarnation.0);
    h.u64(row.version);
    // FNV's last bytes move few bits; a sum of shares needs each to look random
    // (splitmix64's finaliser).
    let mut z = h.finish();
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What a receiver knows of an observer when it merges rows: its current life, and the
/// highest stamp it can have issued by now (`None` when unknown: never heard directly).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Life {
    /// The observer's current incarnation.
    pub incarnation: Incarnation,
    /// The highest version believable from it now.
    pub ceiling: Option<u64>,
}

/// Who sent the rows being merged: the heartbeat's sender and its sequence number (a stamp
/// of the same clock as its own row's version, issued after it).
#[derive(Debug, Clone, Copy)]
pub struct Carrier<'a> {
    /// The node whose heartbeat carried the rows.
    pub node: &'a NodeAddr,
    /// The heartbeat's sequence number.
    pub seq: u64,
}

impl ReachTable {
    /// Sets this node's own row, stamped `stamp` (from this node's clock, which never
    /// repeats a stamp) if it changed; `true` when it changed.
    pub fn set_own(
        &mut self,
        me: &NodeAddr,
        incarnation: Incarnation,
        unreachable: BTreeSet<NodeAddr>,
        stamp: u64,
    ) -> bool {
        let unreachable: Vec<NodeAddr> = unreachable.into_iter().collect();
        let version = match self.rows.get(me) {
            Some(row) if row.incarnation == incarnation && row.unreachable == unreachable => {
                return false;
            }
            Some(row) if row.incarnation == incarnation => stamp.max(row.version.saturating_add(1)),
            _ => stamp,
        };
        self.put(Arc::new(ReachRow {
            observer: me.clone(),
            incarnation,
            version,
            unreachable,
        }));
        true
    }

    /// Stores `row` as its observer's, in place of any other.
    fn put(&mut self, row: SharedRow) {
        self.digest = self.digest.wrapping_add(share(&row));
        self.count(&row, true);
        if let Some(old) = self.rows.insert(row.observer.clone(), row) {
            self.digest = self.digest.wrapping_sub(share(&old));
            self.count(&old, false);
        }
        self.generation += 1;
    }

    /// Counts the members `row` lists in `listed` (`add`), or stops counting them.
    fn count(&mut self, row: &ReachRow, add: bool) {
        for s in row.unreachable.iter().filter(|s| **s != row.observer) {
            if add {
                match self.listed.get_mut(s) {
                    Some(n) => *n += 1,
                    None => {
                        self.listed.insert(s.clone(), 1);
                    }
                }
            } else if let Some(n) = self.listed.get_mut(s) {
                *n -= 1;
                if *n == 0 {
                    self.listed.remove(s);
                }
            }
        }
    }

    /// Every member some row other than its own lists, with by how many rows.
    pub fn listed(&self) -> &BTreeMap<NodeAddr, usize> {
        &self.listed
    }

    /// Drops the row of `observer`, if any.
    fn drop_row(&mut self, observer: &NodeAddr) {
        if let Some(old) = self.rows.remove(observer) {
            self.digest = self.digest.wrapping_sub(share(&old));
            self.count(&old, false);
            self.generation += 1;
        }
    }

    /// A number that changes whenever the rows change (and only then).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Takes the rows of a heartbeat from `sender`, keeping for each observer the newest row
    /// of its current life (`life` says what is known of a current member, `None` for a
    /// node that is not one). This node's own row is never taken from others. Refused, and
    /// counted in the result: a row further ahead than its observer's ceiling, and a row of
    /// the sender newer than the heartbeat carrying it. A row of the sender's stored here
    /// with such an impossible version (taken from a relay before the sender was heard) is
    /// replaced by the sender's own row, or dropped.
    ///
    /// A row no newer than the one held costs one lookup (`life` is asked only about rows
    /// that would replace one): in a partition's first seconds most rows a heartbeat
    /// carries are already known, and a merge costs what is new in it.
    pub fn merge(
        &mut self,
        me: &NodeAddr,
        sender: Carrier<'_>,
        rows: Vec<SharedRow>,
        life: impl Fn(&NodeAddr) -> Option<Life>,
    ) -> usize {
        let mut refused = 0;
        let impossible = |row: &ReachRow| row.observer == *sender.node && row.version > sender.seq;
        for row in rows {
            if row.observer == *me {
                continue;
            }
            if self.rows.get(&row.observer).is_some_and(|known| {
                known.incarnation == row.incarnation
                    && known.version >= row.version
                    && !impossible(known)
            }) {
                continue;
            }
            let Some(l) = life(&row.observer).filter(|l| l.incarnation == row.incarnation) else {
                continue;
            };
            if l.ceiling.is_some_and(|c| row.version > c) || impossible(&row) {
                refused += 1;
                continue;
            }
            self.put(row);
        }
        if self.rows.get(sender.node).is_some_and(|r| impossible(r)) {
            self.drop_row(sender.node);
        }
        refused
    }

    /// Drops the rows of observers that are no longer members in that life; answers the
    /// rows it dropped.
    pub fn retain(&mut self, life: impl Fn(&NodeAddr) -> Option<Incarnation>) -> Vec<SharedRow> {
        let gone: Vec<SharedRow> = self
            .rows
            .iter()
            .filter(|(o, row)| life(o) != Some(row.incarnation))
            .map(|(_, row)| row.clone())
            .collect();
        for row in &gone {
            self.drop_row(&row.observer);
        }
        gone
    }

    /// Every row, to send with a heartbeat.
    pub fn rows(&self) -> Vec<SharedRow> {
        self.rows.values().cloned().collect()
    }

    /// A digest of which row of each observer this table holds (observer, life, version),
    /// of the rows that list someone: two tables with the same digest hold the same such
    /// rows, but for a hash collision, and so make the same partition. Kept up to date as
    /// rows change: reading it costs nothing.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// Every row, by observer.
    pub fn rows_by_observer(&self) -> &BTreeMap<NodeAddr, SharedRow> {
        &self.rows
    }

    /// Every (observer, subject) pair: `observer` cannot hear `subject`.
    pub fn records(&self) -> impl Iterator<Item = (&NodeAddr, &NodeAddr)> {
        self.rows
            .values()
            .flat_map(|r| r.unreachable.iter().map(move |s| (&r.observer, s)))
    }

    /// The subjects of this node's own row.
    pub fn own(&self, me: &NodeAddr) -> &[NodeAddr] {
        self.rows.get(me).map_or(&[], |r| r.unreachable.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(p: u16) -> NodeAddr {
        NodeAddr::parse("t", &format!("127.0.0.1:{p}")).unwrap()
    }

    fn row(o: u16, v: u64, s: &[u16]) -> SharedRow {
        Arc::new(ReachRow {
            observer: a(o),
            incarnation: Incarnation(o as u64),
            version: v,
            unreachable: s.iter().map(|p| a(*p)).collect(),
        })
    }

    /// Every observer a member in the life its port names, with no ceiling known.
    fn unknown(n: &NodeAddr) -> Option<Life> {
        Some(Life {
            incarnation: Incarnation(n.port as u64),
            ceiling: None,
        })
    }

    /// A heartbeat from node `p` with sequence number `seq`.
    fn from(p: &NodeAddr, seq: u64) -> Carrier<'_> {
        Carrier { node: p, seq }
    }

    #[test]
    fn newer_rows_of_the_current_life_win_and_own_rows_stay_own() {
        let mut t = ReachTable::default();
        assert!(t.set_own(&a(1), Incarnation(1), [a(3)].into(), 10));
        assert!(
            !t.set_own(&a(1), Incarnation(1), [a(3)].into(), 11),
            "unchanged"
        );
        let relay = a(5);
        t.merge(
            &a(1),
            from(&relay, 100),
            vec![row(2, 5, &[3]), row(1, 99, &[])],
            unknown,
        );
        assert_eq!(t.own(&a(1)), [a(3)], "a relayed copy of my row is ignored");
        t.merge(&a(1), from(&relay, 100), vec![row(2, 4, &[])], unknown);
        let recs: Vec<_> = t.records().map(|(o, s)| (o.port, s.port)).collect();
        assert_eq!(
            recs,
            [(1, 3), (2, 3)],
            "an older row does not replace a newer one"
        );
        t.merge(&a(1), from(&relay, 100), vec![row(2, 6, &[])], unknown);
        assert_eq!(t.records().count(), 1);
        // A row of another life of node 2, or of a non-member, is not taken.
        let mut stale = row(2, 9, &[1]);
        Arc::make_mut(&mut stale).incarnation = Incarnation(77);
        t.merge(
            &a(1),
            from(&relay, 100),
            vec![stale, row(4, 1, &[1])],
            |n| (n.port != 4).then(|| unknown(n)).flatten(),
        );
        assert_eq!(t.records().count(), 1);
        t.retain(|n| (n.port == 1).then_some(Incarnation(1)));
        assert_eq!(t.rows().len(), 1, "rows of members gone are dropped");
    }

    #[test]
    fn rows_that_list_nobody_make_no_difference_and_the_digest_follows_every_change() {
        let relay = a(5);
        let mut joined = ReachTable::default();
        let empty = joined.digest();
        joined.merge(
            &a(1),
            from(&relay, 100),
            (2..40).map(|o| row(o, 7, &[])).collect(),
            unknown,
        );
        assert_eq!(joined.digest(), empty, "members joining change no digest");
        joined.merge(&a(1), from(&relay, 100), vec![row(2, 8, &[3])], unknown);
        let listing = joined.digest();
        assert_ne!(listing, empty, "an observation is a difference");
        // The same rows, reached in another order and without the empty ones: the same
        // digest as a table built from scratch.
        let mut direct = ReachTable::default();
        direct.merge(&a(9), from(&relay, 100), vec![row(2, 8, &[3])], unknown);
        assert_eq!(direct.digest(), listing);
        joined.merge(&a(1), from(&relay, 100), vec![row(2, 9, &[])], unknown);
        assert_eq!(joined.digest(), empty, "cleared, as if never listed");
        joined.retain(|_| None);
        assert_eq!(joined.digest(), empty);
    }

    #[test]
    fn own_versions_are_stamps_and_always_go_up() {
        let mut t = ReachTable::default();
        t.set_own(&a(1), Incarnation(1), [a(3)].into(), 500);
        assert_eq!(t.rows()[0].version, 500);
        t.set_own(&a(1), Incarnation(1), [].into(), 400);
        assert_eq!(t.rows()[0].version, 501, "never lower than before");
        t.set_own(&a(1), Incarnation(1), [a(2)].into(), 900);
        assert_eq!(t.rows()[0].version, 900);
    }

    /// A forged row with the largest version, relayed: refused where the observer's clock
    /// is known; where it is not, taken until the observer itself is heard, and then
    /// replaced by its own row. Either way the observer's later rows are taken again.
    #[test]
    fn a_forged_row_with_a_huge_version_does_not_pin_the_table() {
        let me = a(1);
        let relay = a(3);
        let observer = a(2);
        let known = |n: &NodeAddr| {
            Some(Life {
                incarnation: Incarnation(n.port as u64),
                ceiling: Some(10_000),
            })
        };
        let mut t = ReachTable::default();
        t.merge(&me, from(&relay, 9_000), vec![row(2, 5_000, &[3])], known);
        let refused = t.merge(
            &me,
            from(&relay, 9_100),
            vec![row(2, u64::MAX - 1, &[])],
            known,
        );
        assert_eq!(refused, 1);
        assert_eq!(t.rows()[0].version, 5_000, "refused above the ceiling");
        t.merge(&me, from(&relay, 9_200), vec![row(2, 6_000, &[])], known);
        assert_eq!(
            t.rows()[0].version,
            6_000,
            "the observer's next row is taken"
        );

        // No ceiling known for the observer (never heard directly): the forgery gets in...
        let mut t = ReachTable::default();
        t.merge(
            &me,
            from(&relay, 9_000),
            vec![row(2, u64::MAX - 1, &[1])],
            unknown,
        );
        assert_eq!(t.records().count(), 1);
        // ...until the observer's own heartbeat, stamped 7_000, carries its row (6_900).
        t.merge(
            &me,
            from(&observer, 7_000),
            vec![row(2, 6_900, &[])],
            unknown,
        );
        assert_eq!(t.rows()[0].version, 6_900);
        assert_eq!(t.records().count(), 0);
        // A heartbeat of the observer without its row drops the impossible one too.
        t.merge(
            &me,
            from(&relay, 9_000),
            vec![row(2, u64::MAX - 1, &[1])],
            unknown,
        );
        t.merge(&me, from(&observer, 7_100), vec![], unknown);
        assert!(t.rows().is_empty());
        // A row of the sender newer than its own heartbeat is refused.
        let refused = t.merge(
            &me,
            from(&observer, 7_200),
            vec![row(2, 7_300, &[1])],
            unknown,
        );
        assert_eq!(refused, 1);
        assert!(t.rows().is_empty());
    }
}
