//! The downing decision: from the members and who cannot hear whom, which side survives.
//! Every node computes it from the same shared table, so the sides agree without talking
//! (Akka's split brain resolver strategies, decided per node instead of by a leader).

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::identity::NodeAddr;
use crate::member::Member;

/// `active-strategy` and its options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Strategy {
    /// The side with more members (of the role) survives; on a tie, the side with the
    /// lowest address.
    KeepMajority,
    /// The side with at least `quorum_size` members (of the role) survives; with none (or
    /// both), every node goes.
    StaticQuorum {
        /// The least number of members (of the role) a surviving side has.
        quorum_size: usize,
    },
    /// The side with the oldest member (of the role) survives; with `down_if_alone`, an
    /// oldest member alone on its side goes and the other side survives.
    KeepOldest {
        /// Whether an oldest member alone on its side goes, so that the other side survives.
        down_if_alone: bool,
    },
    /// Every node goes.
    DownAll,
    /// The side whose leader acquires the `<system>-sbr` lease survives; the side that
    /// keep-majority would down waits `acquire_delay_for_minority` before trying. The winner
    /// holds the lease `release_after`, long enough for the other side to see it held.
    LeaseMajority {
        /// How long the side keep-majority would down waits before it tries to acquire.
        acquire_delay_for_minority: Duration,
        /// How long the winner holds the resolver lease.
        release_after: Duration,
    },
}

impl Strategy {
    /// The name used in `active-strategy`.
    pub fn name(&self) -> &'static str {
        match self {
            Strategy::KeepMajority => "keep-majority",
            Strategy::StaticQuorum { .. } => "static-quorum",
            Strategy::KeepOldest { .. } => "keep-oldest",
            Strategy::DownAll => "down-all",
            Strategy::LeaseMajority { .. } => "lease-majority",
        }
    }
}

/// The cluster as one node sees it when members cannot hear each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// Up and leaving members (this node included); joining members do not count. Shared:
    /// a node rebuilds its partition as its table changes, its members far less often.
    pub members: Arc<[Member]>,
    /// Members some member cannot hear, and that are not indirectly connected.
    pub unreachable: BTreeSet<NodeAddr>,
    /// Members that cannot hear some member and are not heard by some member: the ends of
    /// a broken link in a partial or one-way partition. They are always downed.
    pub indirect: BTreeSet<NodeAddr>,
}

impl Partition {
    /// Builds the partition from (observer, subject) records: `observer` cannot hear
    /// `subject`. Records naming a non-member are ignored.
    pub fn new<'a>(
        members: impl Into<Arc<[Member]>>,
        records: impl Iterator<Item = (&'a NodeAddr, &'a NodeAddr)>,
    ) -> Partition {
        let members = members.into();
        let known: BTreeSet<&NodeAddr> = members.iter().map(|m| &m.addr).collect();
        let mut observers = BTreeSet::new();
        let mut subjects = BTreeSet::new();
        for (o, s) in records {
            if o != s && known.contains(o) && known.contains(s) {
                observers.insert(o.clone());
                subjects.insert(s.clone());
            }
        }
        let indirect: BTreeSet<NodeAddr> = observers.intersection(&subjects).cloned().collect();
        let unreachable = subjects.difference(&indirect).cloned().collect();
        Partition {
            members,
            unreachable,
            indirect,
        }
    }

    /// The partition of `table`, as [`Partition::new`] builds it from the table's records,
    /// read from its rows and the members they list ([`ReachTable::listed`]): a member
    /// listed by some other row is a subject, an observer is a row that lists some member
    /// other than itself. O(rows + members listed) where [`Partition::new`] is
    /// O(records): a thousand members' rows of a partition's first seconds list ten
    /// thousand (observer, subject) pairs, and the table changes every round.
    pub fn of_table(members: Arc<[Member]>, table: &super::ReachTable) -> Partition {
        let known: HashSet<&NodeAddr> = members.iter().map(|m| &m.addr).collect();
        let rows = table.rows_by_observer();
        // The count of a member listed includes rows of observers that are no members (a
        // table between a change of the view and its next retain): those records are
        // left out one by one.
        if rows.keys().any(|o| !known.contains(o)) {
            return Partition::new(members.clone(), table.records());
        }
        let observers: BTreeSet<&NodeAddr> = rows
            .values()
            .filter(|r| {
                r.unreachable
                    .iter()
                    .any(|s| *s != r.observer && known.contains(s))
            })
            .map(|r| &r.observer)
            .collect();
        let subjects: BTreeSet<&NodeAddr> = table
            .listed()
            .keys()
            .filter(|s| known.contains(s))
            .collect();
        let indirect: BTreeSet<NodeAddr> = observers
            .intersection(&subjects)
            .map(|a| (*a).clone())
            .collect();
        let unreachable = subjects
            .into_iter()
            .filter(|s| !indirect.contains(*s))
            .cloned()
            .collect();
        Partition {
            members,
            unreachable,
            indirect,
        }
    }

    /// Whether every member hears every member.
    pub fn is_whole(&self) -> bool {
        self.unreachable.is_empty() && self.indirect.is_empty()
    }
}

/// What the resolver decided for this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// This node's side survives: down these members (the other side).
    Survive {
        /// The members to down.
        down: Vec<NodeAddr>,
    },
    /// This node's side goes: it downs itself.
    DownSelf {
        /// Why, for logs and the history.
        why: String,
    },
    /// lease-majority: this node's side survives if its leader holds the resolver lease.
    Lease {
        /// The members of this node's side.
        side: Vec<NodeAddr>,
        /// Who acquires for the side (its lowest address).
        leader: NodeAddr,
        /// Wait before acquiring (the side keep-majority would down).
        delay: Duration,
        /// Members to down when the side wins.
        down_if_won: Vec<NodeAddr>,
    },
}

/// Decides for node `me`. `role` limits the members counted (not those downed).
pub fn decide(strategy: &Strategy, role: Option<&str>, me: &NodeAddr, p: &Partition) -> Decision {
    if p.indirect.contains(me) {
        return Decision::DownSelf {
            why: "indirectly connected: some members cannot hear this node, or it cannot hear them, while others can".into(),
        };
    }
    let live: Vec<&Member> = p
        .members
        .iter()
        .filter(|m| !p.indirect.contains(&m.addr))
        .collect();
    let (reachable, unreachable): (Vec<&Member>, Vec<&Member>) =
        live.iter().partition(|m| !p.unreachable.contains(&m.addr));
    let mine_is_reachable = !p.unreachable.contains(me);
    let (mine, theirs) = if mine_is_reachable {
        (reachable, unreachable)
    } else {
        (unreachable, reachable)
    };
    let addrs = |side: &[&Member]| side.iter().map(|m| m.addr.clone()).collect::<Vec<_>>();
    let others: Vec<NodeAddr> = p
        .members
        .iter()
        .map(|m| m.addr.clone())
        .filter(|a| !mine.iter().any(|m| m.addr == *a))
        .collect();
    let survive = || Decision::Survive {
        down: others.clone(),
    };
    let lose = |why: &str| Decision::DownSelf { why: why.into() };
    let count = |side: &[&Member]| side.iter().filter(|m| m.has_role(role)).count();
    let (n_mine, n_theirs) = (count(&mine), count(&theirs));
    // Keep-majority's choice, also lease-majority's head start.
    let majority = n_mine > n_theirs
        || (n_mine == n_theirs && {
            let lowest = |side: &[&Member]| {
                side.iter()
                    .filter(|m| n_mine + n_theirs == 0 || m.has_role(role))
                    .map(|m| m.addr.clone())
                    .min()
            };
            match (lowest(&mine), lowest(&theirs)) {
                (Some(a), Some(b)) => a < b,
                (Some(_), None) => true,
                _ => false,
            }
        });
    match strategy {
        Strategy::KeepMajority if majority => survive(),
        Strategy::KeepMajority => lose(
            "keep-majority: this side is the smaller one (or the tie is lost by the side without the lowest address)",
        ),
        Strategy::StaticQuorum { quorum_size } => {
            let q = *quorum_size;
            if n_mine >= q && n_theirs < q {
                survive()
            } else if n_mine >= q {
                lose(
                    "static-quorum: both sides reach the quorum (the cluster grew beyond 2 x quorum-size - 1): every node goes",
                )
            } else {
                lose("static-quorum: this side is below quorum-size")
            }
        }
        Strategy::KeepOldest { down_if_alone } => {
            let oldest = live
                .iter()
                .filter(|m| m.has_role(role))
                .min_by(|a, b| (a.age, &a.addr).cmp(&(b.age, &b.addr)));
            let Some(oldest) = oldest else {
                return lose("keep-oldest: no member with the role is left");
            };
            let oldest_here = mine.iter().any(|m| m.addr == oldest.addr);
            let alone = |n: usize, other: usize| *down_if_alone && n == 1 && other > 0;
            let keep = if oldest_here {
                !alone(n_mine, n_theirs)
            } else {
                alone(n_theirs, n_mine)
            };
            if keep {
                survive()
            } else {
                lose("keep-oldest: the oldest member is on the other side (or alone on this one)")
            }
        }
        Strategy::DownAll => lose("down-all: every node goes"),
        Strategy::LeaseMajority {
            acquire_delay_for_minority,
            ..
        } => {
            let side = addrs(&mine);
            let leader = side.iter().min().cloned().unwrap_or_else(|| me.clone());
            Decision::Lease {
                side,
                leader,
                delay: if majority {
                    Duration::ZERO
                } else {
                    *acquire_delay_for_minority
                },
                down_if_won: others,
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::identity::Incarnation;
    use crate::member::MemberStatus;

    pub(in crate::sbr) fn a(p: u16) -> NodeAddr {
        NodeAddr::parse("t", &format!("127.0.0.1:{p}")).unwrap()
    }
    /// Members 1..=n, node 1 the oldest; `roles` gives node i's role when listed.
    fn members(n: u16, with_role: &[u16]) -> Vec<Member> {
        (1..=n)
            .map(|p| Member {
                addr: a(p),
                incarnation: Incarnation(p as u64),
                age: p as u64,
                status: MemberStatus::Up,
                reachable: true,
                app_version: Default::default(),
                roles: if with_role.contains(&p) {
                    vec!["r".into()]
                } else {
                    Vec::new()
                },
            })
            .collect()
    }
    proptest::proptest! {
        /// The partition read from a table's listing counts is the one built from its
        /// records, whatever the rows (members listing themselves, members gone, rows
        /// replaced and dropped, observers that are no members).
        #[test]
        fn the_partition_of_a_table_is_the_partition_of_its_records(
            rows in proptest::collection::vec(
                (1u16..10, proptest::collection::vec(1u16..12, 0..4)),
                0..30,
            ),
            members_n in 1u16..10,
        ) {
            use crate::sbr::{Carrier, Life, ReachRow, ReachTable};
            let me = a(100);
            let mut t = ReachTable::default();
            for (version, (o, subjects)) in rows.iter().enumerate() {
                let observer = a(*o);
                let row = std::sync::Arc::new(ReachRow {
                    observer: observer.clone(),
                    incarnation: Incarnation(1),
                    version: version as u64,
                    unreachable: subjects.iter().map(|s| a(*s)).collect(),
                });
                let carrier = Carrier { node: &observer, seq: u64::MAX };
                t.merge(&me, carrier, vec![row], |_| {
                    Some(Life { incarnation: Incarnation(1), ceiling: None })
                });
                let all = members(members_n, &[]);
                let built = Partition::new(all.clone(), t.records());
                proptest::prop_assert_eq!(Partition::of_table(all.into(), &t), built);
            }
            t.retain(|o| (o.port <= members_n / 2).then_some(Incarnation(1)));
            let all = members(members_n, &[]);
            let built = Partition::new(all.clone(), t.records());
            proptest::prop_assert_eq!(Partition::of_table(all.into(), &t), built);
        }
    }

    pub(in crate::sbr) fn part(n: u16, cut: &[(u16, u16)]) -> Partition {
        let recs: Vec<(NodeAddr, NodeAddr)> = cut.iter().map(|(o, s)| (a(*o), a(*s))).collect();
        Partition::new(members(n, &[]), recs.iter().map(|(o, s)| (o, s)))
    }
    /// Who survives a partition: the nodes whose own decision is Survive.
    fn survivors(s: &Strategy, p: &Partition) -> Vec<u16> {
        p.members
            .iter()
            .filter(|m| matches!(decide(s, None, &m.addr, p), Decision::Survive { .. }))
            .map(|m| m.addr.port)
            .collect()
    }
    /// The view of one side of a clean cut: its own observations only.
    fn side_view(n: u16, side: &[u16]) -> Partition {
        let mut cut = Vec::new();
        for o in side {
            for s in 1..=n {
                if !side.contains(&s) {
                    cut.push((*o, s));
                }
            }
        }
        part(n, &cut)
    }

    #[test]
    fn keep_majority_keeps_the_larger_side_and_breaks_ties_by_lowest_address() {
        let s = Strategy::KeepMajority;
        // Oldest (1) isolated from 2 and 3: each side decides from its own view.
        let minority = side_view(3, &[1]);
        assert!(matches!(
            decide(&s, None, &a(1), &minority),
            Decision::DownSelf { .. }
        ));
        let majority = side_view(3, &[2, 3]);
        assert_eq!(
            decide(&s, None, &a(2), &majority),
            Decision::Survive { down: vec![a(1)] }
        );
        // A 2-node cluster is a tie: the side with the lowest address (node 1) survives,
        // so under keep-majority the crash of node 1 takes node 2 down too.
        let two = side_view(2, &[2]);
        assert!(matches!(
            decide(&s, None, &a(2), &two),
            Decision::DownSelf { .. }
        ));
        let two = side_view(2, &[1]);
        assert_eq!(
            decide(&s, None, &a(1), &two),
            Decision::Survive { down: vec![a(2)] }
        );
    }

    #[test]
    fn lease_majority_gives_the_minority_a_delay_and_the_side_one_leader() {
        let s = Strategy::LeaseMajority {
            acquire_delay_for_minority: Duration::from_secs(2),
            release_after: Duration::from_secs(40),
        };
        // 2-node cluster, the oldest (1) crashed: the survivor tries, after the delay.
        match decide(&s, None, &a(2), &side_view(2, &[2])) {
            Decision::Lease {
                side,
                leader,
                delay,
                down_if_won,
            } => {
                assert_eq!((side, leader), (vec![a(2)], a(2)));
                assert_eq!(delay, Duration::from_secs(2));
                assert_eq!(down_if_won, vec![a(1)]);
            }
            other => panic!("{other:?}"),
        }
        match decide(&s, None, &a(3), &side_view(3, &[2, 3])) {
            Decision::Lease { leader, delay, .. } => {
                assert_eq!((leader, delay), (a(2), Duration::ZERO));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_partial_partition_downs_both_ends_of_the_broken_link() {
        // 1 and 3 cannot hear each other; 2 hears both. Everyone shares the table.
        let p = part(3, &[(1, 3), (3, 1)]);
        assert_eq!(p.indirect, [a(1), a(3)].into());
        assert_eq!(survivors(&Strategy::KeepMajority, &p), [2]);
        assert_eq!(
            decide(&Strategy::KeepMajority, None, &a(2), &p),
            Decision::Survive {
                down: vec![a(1), a(3)]
            }
        );
    }

    #[test]
    fn one_way_loss_downs_the_side_nobody_hears() {
        // 1 cannot hear 3, 3 hears 1, 2 hears both: 3 is unreachable (not indirect).
        let p = part(3, &[(1, 3)]);
        assert!(p.indirect.is_empty());
        assert_eq!(survivors(&Strategy::KeepMajority, &p), [1, 2]);
        assert!(matches!(
            decide(&Strategy::KeepMajority, None, &a(3), &p),
            Decision::DownSelf { .. }
        ));
    }

    #[test]
    fn static_quorum_keep_oldest_and_down_all() {
        // Each side decides from its own view; both views give the same survivors.
        let q = Strategy::StaticQuorum { quorum_size: 2 };
        assert_eq!(survivors(&q, &side_view(3, &[2, 3])), [2, 3]);
        assert_eq!(survivors(&q, &side_view(3, &[1])), [2, 3]);
        assert!(
            survivors(&q, &side_view(4, &[1, 2])).is_empty(),
            "both halves reach the quorum of a 4-node cluster: nobody is kept"
        );
        let oldest = Strategy::KeepOldest {
            down_if_alone: false,
        };
        assert_eq!(survivors(&oldest, &side_view(3, &[1])), [1]);
        assert_eq!(survivors(&oldest, &side_view(3, &[2, 3])), [1]);
        let alone = Strategy::KeepOldest {
            down_if_alone: true,
        };
        assert_eq!(survivors(&alone, &side_view(3, &[1])), [2, 3]);
        assert_eq!(survivors(&alone, &side_view(3, &[2, 3])), [2, 3]);
        assert!(survivors(&Strategy::DownAll, &side_view(3, &[2, 3])).is_empty());
    }

    #[test]
    fn roles_count_only_members_with_the_role() {
        // Nodes 1 and 2 have the role; 1 is cut off from 2, 3, 4.
        let mut cut = Vec::new();
        for s in 2..=4 {
            cut.push((1, s));
        }
        let recs: Vec<(NodeAddr, NodeAddr)> = cut.iter().map(|(o, s)| (a(*o), a(*s))).collect();
        let p = Partition::new(members(4, &[1, 2]), recs.iter().map(|(o, s)| (o, s)));
        // 1 role member on each side: the tie goes to the lowest address (node 1).
        assert_eq!(
            decide(&Strategy::KeepMajority, Some("r"), &a(1), &p),
            Decision::Survive {
                down: vec![a(2), a(3), a(4)]
            }
        );
    }
}
