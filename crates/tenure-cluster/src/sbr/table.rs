//! Reachability observations shared in heartbeats: each node's row says which members it
//! cannot hear. Rows travel with every heartbeat and are relayed, so that every node of a
//! connected part of the cluster ends up with the same table, and a node that some peers
//! hear and others do not (a partial or one-way partition) is seen as such everywhere.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::identity::{Incarnation, NodeAddr};

/// What one node (`observer`, in its life `incarnation`) cannot hear, in its `version`th
/// observation (higher is newer within one life).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReachRow {
    /// The node that observed.
    pub observer: NodeAddr,
    /// The observer's incarnation (its life).
    pub incarnation: Incarnation,
    /// The observation's number, higher is newer within one life.
    pub version: u64,
    /// The members the observer cannot hear.
    pub unreachable: Vec<NodeAddr>,
}

/// The newest row of every observer that is a member.
#[derive(Debug, Clone, Default)]
pub struct ReachTable {
    rows: BTreeMap<NodeAddr, ReachRow>,
}

impl ReachTable {
    /// Sets this node's own row; `true` when it changed (its version then goes up).
    pub fn set_own(
        &mut self,
        me: &NodeAddr,
        incarnation: Incarnation,
        unreachable: BTreeSet<NodeAddr>,
    ) -> bool {
        let unreachable: Vec<NodeAddr> = unreachable.into_iter().collect();
        match self.rows.get_mut(me) {
            Some(row) if row.incarnation == incarnation && row.unreachable == unreachable => false,
            Some(row) if row.incarnation == incarnation => {
                row.version += 1;
                row.unreachable = unreachable;
                true
            }
            _ => {
                self.rows.insert(
                    me.clone(),
                    ReachRow {
                        observer: me.clone(),
                        incarnation,
                        version: 1,
                        unreachable,
                    },
                );
                true
            }
        }
    }

    /// Takes the rows a peer relayed, keeping for each observer the newest row of its
    /// current life (`life` gives the incarnation of a current member, `None` for a node
    /// that is not one). This node's own row is never taken from others.
    pub fn merge(
        &mut self,
        me: &NodeAddr,
        rows: Vec<ReachRow>,
        life: impl Fn(&NodeAddr) -> Option<Incarnation>,
    ) {
        for row in rows {
            if row.observer == *me || life(&row.observer) != Some(row.incarnation) {
                continue;
            }
            match self.rows.get(&row.observer) {
                Some(known)
                    if known.incarnation == row.incarnation && known.version >= row.version => {}
                _ => {
                    self.rows.insert(row.observer.clone(), row);
                }
            }
        }
    }

    /// Drops the rows of observers that are no longer members in that life.
    pub fn retain(&mut self, life: impl Fn(&NodeAddr) -> Option<Incarnation>) {
        self.rows.retain(|o, row| life(o) == Some(row.incarnation));
    }

    /// Every row, to send with a heartbeat.
    pub fn rows(&self) -> Vec<ReachRow> {
        self.rows.values().cloned().collect()
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

    #[test]
    fn newer_rows_of_the_current_life_win_and_own_rows_stay_own() {
        let mut t = ReachTable::default();
        assert!(t.set_own(&a(1), Incarnation(1), [a(3)].into()));
        assert!(
            !t.set_own(&a(1), Incarnation(1), [a(3)].into()),
            "unchanged"
        );
        let life = |n: &NodeAddr| Some(Incarnation(n.port as u64));
        let row = |o: u16, v: u64, s: &[u16]| ReachRow {
            observer: a(o),
            incarnation: Incarnation(o as u64),
            version: v,
            unreachable: s.iter().map(|p| a(*p)).collect(),
        };
        t.merge(&a(1), vec![row(2, 5, &[3]), row(1, 99, &[])], life);
        assert_eq!(t.own(&a(1)), [a(3)], "a relayed copy of my row is ignored");
        t.merge(&a(1), vec![row(2, 4, &[])], life);
        let recs: Vec<_> = t.records().map(|(o, s)| (o.port, s.port)).collect();
        assert_eq!(
            recs,
            [(1, 3), (2, 3)],
            "an older row does not replace a newer one"
        );
        t.merge(&a(1), vec![row(2, 6, &[])], life);
        assert_eq!(t.records().count(), 1);
        // A row of another life of node 2, or of a non-member, is not taken.
        let mut stale = row(2, 9, &[1]);
        stale.incarnation = Incarnation(77);
        t.merge(&a(1), vec![stale, row(4, 1, &[1])], |n| {
            (n.port != 4).then_some(Incarnation(n.port as u64))
        });
        assert_eq!(t.records().count(), 1);
        t.retain(|n| (n.port == 1).then_some(Incarnation(1)));
        assert_eq!(t.rows().len(), 1, "rows of members gone are dropped");
    }
}
