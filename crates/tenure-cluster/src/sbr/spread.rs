//! Which rows of the reachability table a heartbeat carries: versioned deltas, repaired by a
//! full table on demand.
//!
//! A row travels in the heartbeats of the [`REPEAT`] rounds after it changed here (taken
//! from a peer or this node's own), so a change floods the ring of monitors hop by hop and
//! a lost datagram or two loses nothing. Every heartbeat also carries the digest of its
//! sender's table ([`ReachTable::digest`]); a receiver whose table has differed from it for
//! [`REPEAT`] heartbeats asks for the whole table in its next heartbeat back, asking one
//! peer at most per `reachability-sync-interval` (see `Monitor::compare`), and a peer gets
//! the rows that list someone in its first heartbeat after a hello. Whatever a peer missed
//! (more losses in a row, a restart) is repaired so, and a steady table costs a digest per
//! heartbeat.
//!
//! The changed rows of one heartbeat name at most [`MAX_ROW_ADDRS`] addresses (as memberlist
//! bounds its piggyback by the packet's size). In a partition's first seconds every member
//! changes its row, so each node has a row per member to tell: carried whole in every
//! heartbeat, that would be `n` rows in each of a node's heartbeats, O(n²) a round. Past the
//! bound, each heartbeat carries the next changed rows after those the previous one ended
//! with, round the changed rows in observer order, and a row stays among the changed ones
//! until it went out in [`REPEAT`] heartbeats, however long that takes: every change still
//! leaves each node that learns it [`REPEAT`] times (an epidemic: each receiver passes it
//! on), what a node sends a round is bounded whatever `n`, and what the bound delays or
//! loses the digest repair brings.
//!
//! A row that lists nobody travels only when it replaces one that listed someone: a new
//! member's first row lists nobody, and says no more than no row (the digest leaves such
//! rows out too), so a cluster of joining members has no delta to spread.
//!
//! What a receiver takes from a row is unchanged ([`ReachTable::merge`]: the newest version
//! of each observer's current life, within the bounds its clock allows), so a delta and a
//! full table merge alike and a row carried twice is harmless.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use super::table::{ReachRow, ReachTable, SharedRow};
use crate::identity::{Incarnation, NodeAddr};

/// How many rounds a changed row is carried in every heartbeat (while the changed rows fit
/// in one), and in how many heartbeats at least.
pub const REPEAT: u64 = 3;

/// At most how many addresses (each row's observer and the members it lists) the changed
/// rows of one heartbeat name; a heartbeat carries one row at least. About 40 KB encoded
/// with IP addresses, within a datagram ([`crate::transport::datagram::MAX_DATAGRAM`]; a
/// larger heartbeat goes on the session), and some two hundred rows of a partition's first
/// seconds (each node lists the few members it watches).
pub const MAX_ROW_ADDRS: usize = 2_048;

/// How many addresses `row` names in a heartbeat.
fn weight(row: &ReachRow) -> usize {
    1 + row.unreachable.len()
}

/// A changed row: the round it changed in, and how many heartbeats carried it since.
#[derive(Debug, Clone, Copy)]
struct Recent {
    round: u64,
    carried: u64,
}

/// The rows to send, round by round.
#[derive(Debug, Clone, Default)]
pub struct Spread {
    round: u64,
    /// The generation of the table at the last round ([`ReachTable::generation`]): an
    /// unchanged table has no row to note.
    generation: Option<u64>,
    /// Each observer's row as last seen here (life, version, whether it listed someone).
    seen: BTreeMap<NodeAddr, (Incarnation, u64, bool)>,
    /// Peers owed the whole table in their next heartbeat.
    owed: BTreeSet<NodeAddr>,
    /// Peers owed the rows that list someone in their next heartbeat.
    owed_observations: BTreeSet<NodeAddr>,
    /// The observers whose rows changed lately.
    recent: BTreeMap<NodeAddr, Recent>,
    /// The addresses the rows in `recent` name, as of the round's start.
    recent_weight: usize,
    /// The observer of the row the last bounded heartbeat ended with.
    cursor: Option<NodeAddr>,
}

impl Spread {
    /// Starts the next round: notes which rows of `table` changed since the last one, and
    /// drops the changes that travelled for [`REPEAT`] rounds in [`REPEAT`] heartbeats.
    pub fn next_round(&mut self, table: &ReachTable) {
        self.round += 1;
        let rows = table.rows_by_observer();
        if self.generation != Some(table.generation()) {
            self.generation = Some(table.generation());
            let round = self.round;
            self.seen.retain(|o, _| rows.contains_key(o));
            for (observer, row) in rows {
                let lists = !row.unreachable.is_empty();
                let listed = match self.seen.get_mut(observer) {
                    Some((inc, version, _))
                        if *inc == row.incarnation && *version == row.version =>
                    {
                        continue;
                    }
                    Some(seen) => {
                        let listed = seen.2;
                        *seen = (row.incarnation, row.version, lists);
                        listed
                    }
                    None => {
                        self.seen
                            .insert(observer.clone(), (row.incarnation, row.version, lists));
                        false
                    }
                };
                // A row that lists nobody travels only to clear one that did: a first empty
                // row is no news (see `ReachTable::digest`).
                if lists || listed {
                    self.recent
                        .insert(observer.clone(), Recent { round, carried: 0 });
                }
            }
        }
        let since = self.since();
        self.recent
            .retain(|o, r| rows.contains_key(o) && (r.round >= since || r.carried < REPEAT));
        self.recent_weight = self
            .recent
            .keys()
            .filter_map(|o| rows.get(o))
            .map(|r| weight(r))
            .sum();
    }

    /// The first round whose changes still travel.
    fn since(&self) -> u64 {
        self.round.saturating_sub(REPEAT - 1)
    }

    /// Whether some row changed lately and still travels.
    pub fn has_changes(&self) -> bool {
        !self.recent.is_empty()
    }

    /// `peer` gets the whole table in its next heartbeat (it asked for it).
    pub fn owe_full(&mut self, peer: &NodeAddr) {
        self.owed.insert(peer.clone());
    }

    /// `peer` gets every row that lists an unreachable member in its next heartbeat, with
    /// the rows that changed lately (it said hello: a new session or a new life, which may
    /// have missed any delta). The rows that list nobody it gets from the digest repair:
    /// while a thousand members join, each greeted by all, the whole table to each of their
    /// ring neighbours would be `k` tables of `n` rows per member, where the observations
    /// that matter to a decision are few (none in a cluster that is whole).
    pub fn owe_observations(&mut self, peer: &NodeAddr) {
        self.owed_observations.insert(peer.clone());
    }

    /// The rows of `table` for `peer`'s heartbeat of this round: the whole table when it is
    /// owed ([`Spread::owe_full`]), else the changed rows ([`Spread::recent_rows`]) and
    /// those that list someone when they are owed ([`Spread::owe_observations`]).
    pub fn rows_for(&mut self, table: &ReachTable, peer: &NodeAddr) -> Vec<SharedRow> {
        let observations = self.owed_observations.remove(peer);
        if self.owed.remove(peer) {
            return table.rows();
        }
        let mut rows = self.recent_rows(table);
        if observations {
            let recent: BTreeSet<&NodeAddr> = rows.iter().map(|r| &r.observer).collect();
            let listing: Vec<SharedRow> = table
                .rows_by_observer()
                .values()
                .filter(|r| !r.unreachable.is_empty() && !recent.contains(&r.observer))
                .cloned()
                .collect();
            rows.extend(listing);
        }
        rows
    }

    /// Forgets what `peer` was owed (it is no member any more).
    pub fn forget(&mut self, peer: &NodeAddr) {
        self.owed.remove(peer);
        self.owed_observations.remove(peer);
    }

    /// The changed rows of `table` for one heartbeat, whoever it goes to (a gossip contact
    /// off the ring gets these only: what it is owed waits for a heartbeat of its own, so
    /// that a node greeted by a thousand joining peers does not send each of its random
    /// contacts the whole table): all of them while they name at most [`MAX_ROW_ADDRS`]
    /// addresses, else the next ones after those the previous heartbeat ended with, up to
    /// that bound (see the module's doc).
    pub fn recent_rows(&mut self, table: &ReachTable) -> Vec<SharedRow> {
        let rows = table.rows_by_observer();
        let taken: Vec<SharedRow> = if self.recent_weight <= MAX_ROW_ADDRS {
            self.recent
                .keys()
                .filter_map(|o| rows.get(o).cloned())
                .collect()
        } else {
            // Round the changed rows, from the one after the cursor.
            let order: Box<dyn Iterator<Item = &NodeAddr>> = match self.cursor.as_ref() {
                Some(c) => Box::new(
                    self.recent
                        .range::<NodeAddr, _>((Bound::Excluded(c), Bound::Unbounded))
                        .chain(self.recent.range::<NodeAddr, _>(..=c))
                        .map(|(o, _)| o),
                ),
                None => Box::new(self.recent.keys()),
            };
            let mut taken = Vec::new();
            let mut named = 0;
            for observer in order {
                let Some(row) = rows.get(observer) else {
                    continue;
                };
                if !taken.is_empty() && named + weight(row) > MAX_ROW_ADDRS {
                    break;
                }
                named += weight(row);
                taken.push(row.clone());
            }
            if let Some(last) = taken.last() {
                self.cursor = Some(last.observer.clone());
            }
            taken
        };
        for row in &taken {
            if let Some(r) = self.recent.get_mut(&row.observer) {
                r.carried += 1;
            }
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sbr::{Carrier, Life, ReachRow};
    use proptest::prelude::*;

    fn a(p: u16) -> NodeAddr {
        NodeAddr::parse("t", &format!("127.0.0.1:{}", 1000 + p)).unwrap()
    }

    fn life(n: &NodeAddr) -> Option<Life> {
        Some(Life {
            incarnation: Incarnation(u64::from(n.port)),
            ceiling: None,
        })
    }

    /// The source's rows that list someone; a receiver's must end up equal to them (a row
    /// that lists nobody makes the same partition as no row).
    fn snapshot(t: &ReachTable) -> Vec<SharedRow> {
        t.rows()
            .into_iter()
            .filter(|r| !r.unreachable.is_empty())
            .collect()
    }

    /// Sets observer `o`'s row in `t` (as merged from its own heartbeat) to `subjects`.
    fn observe(t: &mut ReachTable, me: &NodeAddr, o: u16, version: u64, subjects: &[u16]) {
        let observer = a(o);
        let row = ReachRow {
            observer: observer.clone(),
            incarnation: Incarnation(u64::from(observer.port)),
            version,
            unreachable: subjects.iter().map(|s| a(*s)).collect(),
        };
        t.merge(
            me,
            Carrier {
                node: &observer,
                seq: version,
            },
            vec![std::sync::Arc::new(row)],
            life,
        );
    }

    #[test]
    fn a_steady_table_costs_nothing_and_a_change_travels_for_repeat_rounds() {
        let (me, peer) = (a(0), a(99));
        let mut t = ReachTable::default();
        let mut s = Spread::default();
        observe(&mut t, &me, 1, 10, &[2]);
        let mut carried = 0;
        for _ in 0..10 {
            s.next_round(&t);
            if !s.rows_for(&t, &peer).is_empty() {
                carried += 1;
            }
        }
        assert_eq!(
            carried, REPEAT,
            "carried in the {REPEAT} rounds after the change"
        );
        s.owe_full(&peer);
        s.next_round(&t);
        assert_eq!(s.rows_for(&t, &peer).len(), 1, "owed the whole table");
        assert!(s.rows_for(&t, &peer).is_empty(), "once");
    }

    #[test]
    fn a_first_row_that_lists_nobody_is_no_delta_and_one_that_clears_a_listing_is() {
        let (me, peer) = (a(0), a(99));
        let mut t = ReachTable::default();
        let mut s = Spread::default();
        observe(&mut t, &me, 1, 10, &[]);
        s.next_round(&t);
        assert!(!s.has_changes(), "a joining member's row");
        assert!(s.rows_for(&t, &peer).is_empty());
        observe(&mut t, &me, 1, 11, &[2]);
        s.next_round(&t);
        assert_eq!(s.rows_for(&t, &peer).len(), 1, "it lists someone");
        observe(&mut t, &me, 1, 12, &[]);
        s.next_round(&t);
        let rows = s.rows_for(&t, &peer);
        assert_eq!(rows.len(), 1, "it clears a listing");
        assert_eq!(rows[0].version, 12);
    }

    #[test]
    fn a_greeted_peer_gets_the_rows_that_list_someone_and_not_the_whole_table() {
        let (me, peer) = (a(0), a(99));
        let mut t = ReachTable::default();
        let mut s = Spread::default();
        for o in 1..=10 {
            let subjects: &[u16] = if o == 3 { &[4] } else { &[] };
            observe(&mut t, &me, o, 10, subjects);
        }
        // The change travels its rounds (a change stays until it went out REPEAT times).
        for _ in 0..REPEAT {
            s.next_round(&t);
            s.rows_for(&t, &peer);
        }
        s.next_round(&t);
        assert!(s.rows_for(&t, &peer).is_empty(), "nothing changed lately");
        s.owe_observations(&peer);
        s.next_round(&t);
        let rows = s.rows_for(&t, &peer);
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].observer, a(3));
        assert!(s.rows_for(&t, &peer).is_empty(), "once");
    }

    /// A partition's first seconds at a thousand members: every observer's row changed at
    /// once. Each heartbeat names at most `MAX_ROW_ADDRS` addresses, the rows go out round
    /// the changed ones (no row twice before every row once), and every row still goes out
    /// in `REPEAT` heartbeats before it stops travelling; the rows are the table's own, not
    /// copies.
    #[test]
    fn a_heartbeat_carries_a_bounded_share_of_many_changed_rows_and_each_goes_out_repeat_times() {
        let me = a(0);
        let mut t = ReachTable::default();
        let observers: Vec<u16> = (1..=1_000).collect();
        for &o in &observers {
            let subjects: Vec<u16> = (0..5).map(|i| 1_001 + (o + i) % 500).collect();
            observe(&mut t, &me, o, 10, &subjects);
        }
        let mut s = Spread::default();
        let peers: Vec<NodeAddr> = (2_000..2_010).map(a).collect();
        let mut carried: BTreeMap<NodeAddr, u64> = BTreeMap::new();
        let mut sent = Vec::new();
        let mut rounds = 0;
        loop {
            s.next_round(&t);
            if !s.has_changes() {
                break;
            }
            rounds += 1;
            assert!(rounds < 100, "the changed rows never stop travelling");
            for p in &peers {
                let rows = s.rows_for(&t, p);
                let named: usize = rows.iter().map(|r| weight(r)).sum();
                assert!(!rows.is_empty(), "changed rows left");
                assert!(named <= MAX_ROW_ADDRS, "{named} addresses in one heartbeat");
                for r in rows {
                    let held = &t.rows_by_observer()[&r.observer];
                    assert!(std::sync::Arc::ptr_eq(&r, held), "a copy of the row");
                    sent.push(r.observer.clone());
                    *carried.entry(r.observer.clone()).or_default() += 1;
                }
            }
        }
        let first: BTreeSet<&NodeAddr> = sent.iter().take(observers.len()).collect();
        assert_eq!(
            first.len(),
            observers.len(),
            "a row twice before another once"
        );
        assert_eq!(carried.len(), observers.len(), "every changed row went out");
        assert!(
            carried.values().all(|n| *n >= REPEAT),
            "each in {REPEAT} heartbeats at least: {:?}",
            carried.values().min()
        );
    }

    proptest! {
        /// Deltas alone keep a receiver in step while nothing is lost; whatever is lost,
        /// the digests differ until the receiver asks for the whole table, and the table
        /// it gets makes both equal.
        #[test]
        fn deltas_and_a_full_table_on_demand_converge_whatever_is_lost(
            changes in proptest::collection::vec((1u16..12, proptest::collection::vec(1u16..12, 0..3)), 1..40),
            lost in proptest::collection::vec(any::<bool>(), 1..80),
        ) {
            let (source, receiver, peer) = (a(0), a(50), a(51));
            let (mut st, mut rt, mut lossless) =
                (ReachTable::default(), ReachTable::default(), ReachTable::default());
            let mut s = Spread::default();
            let mut version = 0;
            for (round, (o, subjects)) in changes.iter().enumerate() {
                version += 1;
                observe(&mut st, &source, *o, version, subjects);
                s.next_round(&st);
                let rows = s.rows_for(&st, &peer);
                let carrier = Carrier { node: &source, seq: version + 1 };
                lossless.merge(&receiver, carrier, rows.clone(), life);
                prop_assert_eq!(snapshot(&lossless), snapshot(&st), "deltas keep up");
                prop_assert_eq!(lossless.digest(), st.digest());
                if !lost[round % lost.len()] {
                    rt.merge(&receiver, carrier, rows, life);
                }
            }
            prop_assert_eq!(rt.digest() == st.digest(), snapshot(&rt) == snapshot(&st));
            if rt.digest() != st.digest() {
                s.owe_full(&peer);
                s.next_round(&st);
                let carrier = Carrier { node: &source, seq: version + 1 };
                rt.merge(&receiver, carrier, s.rows_for(&st, &peer), life);
            }
            prop_assert_eq!(snapshot(&rt), snapshot(&st));
        }
    }
}
