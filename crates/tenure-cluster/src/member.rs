//! The membership view of one node, as a pure state machine: member leases listed from the
//! store, hellos and leave notices from peers, and reachability go in; ordered
//! [`ClusterEvent`]s come out.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::app_version::AppVersion;
use crate::identity::{Incarnation, NodeAddr};
use crate::subscribe::HandOver;

/// Where a member is in its life, as this node sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MemberStatus {
    /// Connected and greeted, but its member lease is not (yet) seen in the store; for this
    /// node itself: its member lease is not granted yet.
    Joining,
    /// Holds its member lease.
    Up,
    /// Announced a graceful leave; still holds its member lease while it hands over.
    Leaving,
    /// Its member lease expired or was lost without a leave: it crashed, froze or was cut
    /// off. For this node itself: it cannot renew its lease and is out of the cluster.
    Down,
    /// Gone from the view (after leaving, or after being down).
    Removed,
}

impl MemberStatus {
    /// The status as histories and the management endpoint spell it, e.g. `up`.
    pub fn as_str(self) -> &'static str {
        match self {
            MemberStatus::Joining => "joining",
            MemberStatus::Up => "up",
            MemberStatus::Leaving => "leaving",
            MemberStatus::Down => "down",
            MemberStatus::Removed => "removed",
        }
    }
}

/// A member as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Its cluster address.
    pub addr: NodeAddr,
    /// Its incarnation: new at each process start, so a restarted node is a new member.
    pub incarnation: Incarnation,
    /// Age order: the join ticket of its membership (lower = joined earlier); 0 while
    /// joining.
    pub age: u64,
    /// Where it is in its life.
    pub status: MemberStatus,
    /// Whether heartbeats from it arrive (always true for this node itself).
    pub reachable: bool,
    /// Its `cluster.roles` (singletons and shards may be limited to a role).
    pub roles: Vec<String>,
    /// Its `cluster.app-version` (the default while it is joining: a member's version is
    /// read with its member lease).
    pub app_version: AppVersion,
}

impl Member {
    /// Whether it has `role` (`None`: any member qualifies).
    pub fn has_role(&self, role: Option<&str>) -> bool {
        role.is_none_or(|role| self.roles.iter().any(|r| r == role))
    }
}

impl Member {
    /// Whether this member joined before `other` (ties broken by address).
    pub fn is_older_than(&self, other: &Member) -> bool {
        (self.age, &self.addr) < (other.age, &other.addr)
    }
}

/// What a node tells its subscribers, in the order it happened.
#[derive(Debug, Clone)]
pub enum ClusterEvent {
    /// First event after subscribing: every member currently in the view (this node
    /// included), oldest first.
    CurrentMembers(Vec<Member>),
    /// It is joining: connected and greeted, its member lease not yet seen.
    MemberJoined(Member),
    /// It is up: its member lease is held.
    MemberUp(Member),
    /// It is leaving gracefully.
    MemberLeaving(Member),
    /// Its lease lapsed without a leave (crash, freeze, partition from the store).
    MemberDown(Member),
    /// Dropped from the view; `status` tells whether it left (`Leaving`) or went `Down`.
    MemberRemoved(Member),
    /// Its heartbeats stopped arriving (it may still hold its lease).
    Unreachable(Member),
    /// Its heartbeats arrive again.
    Reachable(Member),
    /// This node lost its member lease: it is out of the cluster until granted again. Stop
    /// what it hosts now (their own leases will lapse too).
    SelfDown,
    /// This node is leaving: hand over what it hosts, then drop the [`HandOver`] guard.
    SelfLeaving(HandOver),
}

/// A member lease as listed from the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The member's cluster address.
    pub addr: NodeAddr,
    /// The member's incarnation.
    pub incarnation: Incarnation,
    /// The member's join ticket (its age).
    pub age: u64,
    /// Its `cluster.roles`.
    pub roles: Vec<String>,
    /// Its `cluster.app-version`.
    pub app_version: AppVersion,
}

/// The view: this node and the members it knows, keyed by address.
#[derive(Debug, Clone)]
pub struct Membership {
    me: Member,
    others: BTreeMap<NodeAddr, Member>,
    /// Lives known to be over (a newer incarnation of the address was seen): their member
    /// leases, still listed until they expire, must not bring them back.
    retired: BTreeSet<(NodeAddr, Incarnation)>,
    /// Memberships (address, life, age) downed by the split brain resolver: their member
    /// leases, still listed until released or expired, must not bring them back; a new
    /// membership of the same life (a new age) may.
    downed: BTreeSet<(NodeAddr, Incarnation, u64)>,
    /// The memberships of `downed` whose member leases the last listing still showed (or
    /// downed since): other members may still count them.
    downed_listed: BTreeSet<(NodeAddr, Incarnation, u64)>,
    /// See [`Membership::generation`].
    generation: u64,
}

impl Membership {
    /// A view holding only this node, joining.
    pub fn new(addr: NodeAddr, incarnation: Incarnation, roles: Vec<String>) -> Membership {
        Membership {
            me: Member {
                addr,
                incarnation,
                age: 0,
                status: MemberStatus::Joining,
                reachable: true,
                roles,
                app_version: AppVersion::default(),
            },
            others: BTreeMap::new(),
            retired: BTreeSet::new(),
            downed: BTreeSet::new(),
            downed_listed: BTreeSet::new(),
            generation: 0,
        }
    }

    /// This view, with this node running `version` (`cluster.app-version`).
    pub fn with_app_version(mut self, version: AppVersion) -> Membership {
        self.me.app_version = version;
        self
    }

    /// A number that changes whenever a member (this node included) changes: joins, comes
    /// up, leaves, goes or changes reachability. Equal numbers, equal members.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn touched(&mut self, events: &[ClusterEvent]) {
        if !events.is_empty() {
            self.generation += 1;
        }
    }

    /// This node's member lease was granted, for a membership with join ticket `age`.
    pub fn self_granted(&mut self, age: u64) -> Vec<ClusterEvent> {
        let events = self.self_granted_inner(age);
        self.touched(&events);
        events
    }

    /// This node lost its member lease.
    pub fn self_lost(&mut self) -> Vec<ClusterEvent> {
        let events = self.self_lost_inner();
        self.touched(&events);
        events
    }

    /// This node starts leaving.
    pub fn self_leaving(&mut self, hand_over: HandOver) -> Vec<ClusterEvent> {
        let events = self.self_leaving_inner(hand_over);
        self.touched(&events);
        events
    }

    /// A peer greeted us: a member we do not know yet is joining.
    pub fn hello(
        &mut self,
        addr: &NodeAddr,
        incarnation: Incarnation,
        roles: &[String],
    ) -> Vec<ClusterEvent> {
        let events = self.hello_inner(addr, incarnation, roles);
        self.touched(&events);
        events
    }

    /// A peer announced it is leaving.
    pub fn leaving(&mut self, addr: &NodeAddr, incarnation: Incarnation) -> Vec<ClusterEvent> {
        let events = self.leaving_inner(addr, incarnation);
        self.touched(&events);
        events
    }

    /// The member leases listed from the store now (unexpired grants only).
    pub fn listed(&mut self, listing: &[Listed]) -> Vec<ClusterEvent> {
        let events = self.listed_inner(listing);
        self.touched(&events);
        events
    }

    /// The split brain resolver downed this member: it leaves the view (`MemberDown`, then
    /// `MemberRemoved`) and its current membership never comes back.
    pub fn down(&mut self, addr: &NodeAddr) -> Vec<ClusterEvent> {
        let events = self.down_inner(addr);
        self.touched(&events);
        events
    }

    /// A peer that only greeted us (never seen in the store) went away.
    pub fn session_closed(&mut self, addr: &NodeAddr) -> Vec<ClusterEvent> {
        let events = self.session_closed_inner(addr);
        self.touched(&events);
        events
    }

    /// Marks a peer unreachable (`false`) or reachable again (`true`).
    pub fn set_reachable(&mut self, addr: &NodeAddr, reachable: bool) -> Vec<ClusterEvent> {
        let events = self.set_reachable_inner(addr, reachable);
        self.touched(&events);
        events
    }

    /// This node.
    pub fn me(&self) -> &Member {
        &self.me
    }

    /// The member at `addr` (this node included).
    pub fn get(&self, addr: &NodeAddr) -> Option<&Member> {
        if *addr == self.me.addr {
            Some(&self.me)
        } else {
            self.others.get(addr)
        }
    }

    /// Every member, oldest first (joining members last).
    pub fn members(&self) -> Vec<Member> {
        let mut all: Vec<Member> = std::iter::once(self.me.clone())
            .chain(self.others.values().cloned())
            .collect();
        all.sort_by(|a, b| (a.age == 0, a.age, &a.addr).cmp(&(b.age == 0, b.age, &b.addr)));
        all
    }

    /// Every member, this node first, the others in address order (unlike
    /// [`Membership::members`], nothing is copied or sorted).
    pub fn iter(&self) -> impl Iterator<Item = &Member> {
        std::iter::once(&self.me).chain(self.others.values())
    }

    /// The addresses of the other members.
    pub fn peers(&self) -> impl Iterator<Item = &NodeAddr> {
        self.others.keys()
    }

    fn self_granted_inner(&mut self, age: u64) -> Vec<ClusterEvent> {
        if self.me.status == MemberStatus::Leaving {
            return Vec::new();
        }
        self.me.age = age;
        self.me.status = MemberStatus::Up;
        vec![ClusterEvent::MemberUp(self.me.clone())]
    }

    fn self_lost_inner(&mut self) -> Vec<ClusterEvent> {
        if matches!(self.me.status, MemberStatus::Down | MemberStatus::Removed) {
            return Vec::new();
        }
        let leaving = self.me.status == MemberStatus::Leaving;
        self.me.status = MemberStatus::Down;
        let mut events = vec![ClusterEvent::MemberDown(self.me.clone())];
        if !leaving {
            events.push(ClusterEvent::SelfDown);
        }
        events
    }

    fn self_leaving_inner(&mut self, hand_over: HandOver) -> Vec<ClusterEvent> {
        self.me.status = MemberStatus::Leaving;
        vec![
            ClusterEvent::MemberLeaving(self.me.clone()),
            ClusterEvent::SelfLeaving(hand_over),
        ]
    }

    fn hello_inner(
        &mut self,
        addr: &NodeAddr,
        incarnation: Incarnation,
        roles: &[String],
    ) -> Vec<ClusterEvent> {
        if *addr == self.me.addr || self.retired.contains(&(addr.clone(), incarnation)) {
            return Vec::new();
        }
        let mut events = Vec::new();
        if let Some(known) = self.others.get(addr) {
            if known.incarnation == incarnation {
                return events;
            }
            // A new life at the same address: its previous life is over.
            self.retire(addr.clone(), known.incarnation);
            events.extend(self.remove(addr, MemberStatus::Down));
        }
        let m = Member {
            addr: addr.clone(),
            incarnation,
            age: 0,
            status: MemberStatus::Joining,
            reachable: true,
            roles: roles.to_vec(),
            app_version: AppVersion::default(),
        };
        self.others.insert(addr.clone(), m.clone());
        events.push(ClusterEvent::MemberJoined(m));
        events
    }

    fn leaving_inner(&mut self, addr: &NodeAddr, incarnation: Incarnation) -> Vec<ClusterEvent> {
        match self.others.get_mut(addr) {
            Some(m) if m.incarnation == incarnation && m.status != MemberStatus::Leaving => {
                m.status = MemberStatus::Leaving;
                vec![ClusterEvent::MemberLeaving(m.clone())]
            }
            _ => Vec::new(),
        }
    }

    fn listed_inner(&mut self, listing: &[Listed]) -> Vec<ClusterEvent> {
        let mut events = Vec::new();
        let mut present: BTreeMap<&NodeAddr, &Listed> = BTreeMap::new();
        self.downed_listed = listing
            .iter()
            .map(|l| (l.addr.clone(), l.incarnation, l.age))
            .filter(|m| self.downed.contains(m))
            .collect();
        for l in listing {
            if l.addr != self.me.addr
                && !self.retired.contains(&(l.addr.clone(), l.incarnation))
                && !self
                    .downed
                    .contains(&(l.addr.clone(), l.incarnation, l.age))
            {
                present.insert(&l.addr, l);
            }
        }
        // Gone from the store: left or down.
        let gone: Vec<NodeAddr> = self
            .others
            .iter()
            .filter(|(addr, m)| {
                m.status != MemberStatus::Joining
                    && present
                        .get(addr)
                        .is_none_or(|l| l.incarnation != m.incarnation || l.age != m.age)
            })
            .map(|(a, _)| a.clone())
            .collect();
        for addr in gone {
            events.extend(self.remove(&addr, MemberStatus::Down));
        }
        for (addr, l) in present {
            match self.others.get_mut(addr) {
                Some(m) if m.incarnation == l.incarnation && m.status == MemberStatus::Joining => {
                    m.age = l.age;
                    m.roles = l.roles.clone();
                    m.app_version = l.app_version.clone();
                    m.status = MemberStatus::Up;
                    events.push(ClusterEvent::MemberUp(m.clone()));
                }
                Some(m) if m.incarnation == l.incarnation => {}
                Some(m) => {
                    let old = m.incarnation;
                    self.retire(addr.clone(), old);
                    events.extend(self.remove(addr, MemberStatus::Down));
                    events.push(self.insert_up(l));
                }
                None => events.push(self.insert_up(l)),
            }
        }
        events
    }

    fn retire(&mut self, addr: NodeAddr, incarnation: Incarnation) {
        // Bounded: an old life's lease lapses within one ttl, long before 4096 restarts.
        if self.retired.len() >= 4096 {
            self.retired.pop_first();
        }
        self.retired.insert((addr, incarnation));
    }

    fn insert_up(&mut self, l: &Listed) -> ClusterEvent {
        let m = Member {
            addr: l.addr.clone(),
            incarnation: l.incarnation,
            age: l.age,
            status: MemberStatus::Up,
            reachable: true,
            roles: l.roles.clone(),
            app_version: l.app_version.clone(),
        };
        self.others.insert(l.addr.clone(), m.clone());
        ClusterEvent::MemberUp(m)
    }

    /// Drops a member: `Down` first unless it was leaving (or only joining), then `Removed`.
    fn remove(&mut self, addr: &NodeAddr, unless_leaving: MemberStatus) -> Vec<ClusterEvent> {
        let Some(mut m) = self.others.remove(addr) else {
            return Vec::new();
        };
        let mut events = Vec::new();
        if m.status == MemberStatus::Up {
            m.status = unless_leaving;
            events.push(ClusterEvent::MemberDown(m.clone()));
        }
        events.push(ClusterEvent::MemberRemoved(m));
        events
    }

    fn down_inner(&mut self, addr: &NodeAddr) -> Vec<ClusterEvent> {
        let Some(m) = self.others.get(addr) else {
            return Vec::new();
        };
        if self.downed.len() >= 4096 {
            self.downed.pop_first();
        }
        self.downed.insert((m.addr.clone(), m.incarnation, m.age));
        // Listed as of the last listing, since it was in the view.
        self.downed_listed
            .insert((m.addr.clone(), m.incarnation, m.age));
        let mut events = self.remove(addr, MemberStatus::Down);
        // A leaving member downed is down all the same.
        for e in &mut events {
            if let ClusterEvent::MemberRemoved(m) = e {
                m.status = MemberStatus::Down;
            }
        }
        events
    }

    /// Whether the split brain resolver downed this membership.
    pub fn was_downed(&self, addr: &NodeAddr, incarnation: Incarnation, age: u64) -> bool {
        self.downed.contains(&(addr.clone(), incarnation, age))
    }

    /// Whether this view downed the membership (address, life, age) and its member lease is
    /// still held as of the last listing: members that did not down it still count it.
    pub fn downed_but_listed(&self, addr: &NodeAddr, incarnation: Incarnation, age: u64) -> bool {
        self.downed_listed
            .contains(&(addr.clone(), incarnation, age))
    }

    fn session_closed_inner(&mut self, addr: &NodeAddr) -> Vec<ClusterEvent> {
        match self.others.get(addr) {
            Some(m) if m.status == MemberStatus::Joining => self.remove(addr, MemberStatus::Down),
            _ => Vec::new(),
        }
    }

    fn set_reachable_inner(&mut self, addr: &NodeAddr, reachable: bool) -> Vec<ClusterEvent> {
        match self.others.get_mut(addr) {
            Some(m) if m.reachable != reachable => {
                m.reachable = reachable;
                let m = m.clone();
                vec![if reachable {
                    ClusterEvent::Reachable(m)
                } else {
                    ClusterEvent::Unreachable(m)
                }]
            }
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(p: u16) -> NodeAddr {
        NodeAddr::parse("t", &format!("127.0.0.1:{p}")).unwrap()
    }
    fn listed(p: u16, inc: u64, token: u64) -> Listed {
        Listed {
            addr: addr(p),
            incarnation: Incarnation(inc),
            age: token,
            roles: Vec::new(),
            app_version: AppVersion::default(),
        }
    }
    fn kinds(events: &[ClusterEvent]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                ClusterEvent::MemberJoined(m) => format!("joined {}", m.addr.port),
                ClusterEvent::MemberUp(m) => format!("up {}", m.addr.port),
                ClusterEvent::MemberLeaving(m) => format!("leaving {}", m.addr.port),
                ClusterEvent::MemberDown(m) => format!("down {}", m.addr.port),
                ClusterEvent::MemberRemoved(m) => {
                    format!("removed {} {}", m.addr.port, m.status.as_str())
                }
                ClusterEvent::Unreachable(m) => format!("unreachable {}", m.addr.port),
                ClusterEvent::Reachable(m) => format!("reachable {}", m.addr.port),
                ClusterEvent::SelfDown => "self-down".into(),
                ClusterEvent::SelfLeaving(_) => "self-leaving".into(),
                ClusterEvent::CurrentMembers(_) => "current".into(),
            })
            .collect()
    }

    #[test]
    fn members_come_up_from_the_store_and_are_ordered_by_age() {
        let mut v = Membership::new(addr(1), Incarnation(1), Vec::new());
        assert_eq!(kinds(&v.self_granted(5)), ["up 1"]);
        assert_eq!(kinds(&v.hello(&addr(3), Incarnation(3), &[])), ["joined 3"]);
        assert_eq!(
            kinds(&v.listed(&[listed(1, 1, 5), listed(2, 2, 2), listed(3, 3, 9)])),
            ["up 2", "up 3"]
        );
        let order: Vec<u16> = v.members().iter().map(|m| m.addr.port).collect();
        assert_eq!(order, [2, 1, 3]);
        assert!(
            kinds(&v.listed(&[listed(2, 2, 2), listed(3, 3, 9)])).is_empty(),
            "no change, no event"
        );
    }

    /// A member's application version comes with its member lease: a joining member has
    /// the default until its lease is listed; this node has its own from the start.
    #[test]
    fn a_member_s_app_version_comes_with_its_member_lease() {
        let v2 = AppVersion::new("2.0.0");
        let mut v =
            Membership::new(addr(1), Incarnation(1), Vec::new()).with_app_version(v2.clone());
        assert_eq!(v.me().app_version.as_str(), "2.0.0");
        v.hello(&addr(2), Incarnation(2), &[]);
        assert_eq!(v.get(&addr(2)).unwrap().app_version, AppVersion::default());
        let up = v.listed(&[
            Listed {
                app_version: v2.clone(),
                ..listed(2, 2, 2)
            },
            Listed {
                app_version: AppVersion::new("1.0.0"),
                ..listed(3, 3, 3)
            },
        ]);
        let versions: Vec<(u16, String)> = up
            .iter()
            .map(|e| match e {
                ClusterEvent::MemberUp(m) => (m.addr.port, m.app_version.to_string()),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(versions, [(2, "2.0.0".into()), (3, "1.0.0".into())]);
    }

    #[test]
    fn a_vanished_lease_is_down_then_removed_and_a_leaver_only_removed() {
        let mut v = Membership::new(addr(1), Incarnation(1), Vec::new());
        v.listed(&[listed(2, 2, 2), listed(3, 3, 3)]);
        assert_eq!(kinds(&v.leaving(&addr(3), Incarnation(3))), ["leaving 3"]);
        assert_eq!(
            kinds(&v.listed(&[])),
            ["down 2", "removed 2 down", "removed 3 leaving"]
        );
        assert!(v.get(&addr(2)).is_none());
    }

    #[test]
    fn a_restarted_node_is_a_new_member() {
        let mut v = Membership::new(addr(1), Incarnation(1), Vec::new());
        v.listed(&[listed(2, 20, 2)]);
        assert_eq!(
            kinds(&v.hello(&addr(2), Incarnation(21), &[])),
            ["down 2", "removed 2 down", "joined 2"]
        );
        assert_eq!(kinds(&v.listed(&[listed(2, 21, 7)])), ["up 2"]);
        assert_eq!(v.get(&addr(2)).unwrap().incarnation, Incarnation(21));
        // Same incarnation re-granted after it lost its lease: a new membership too.
        assert_eq!(
            kinds(&v.listed(&[listed(2, 21, 8)])),
            ["down 2", "removed 2 down", "up 2"]
        );
    }

    #[test]
    fn a_restart_before_the_old_lease_lapsed_never_revives_the_old_life() {
        let mut v = Membership::new(addr(1), Incarnation(1), Vec::new());
        v.listed(&[listed(2, 20, 2)]);
        // The new life greets while the old life's lease is still listed.
        assert_eq!(
            kinds(&v.hello(&addr(2), Incarnation(21), &[])),
            ["down 2", "removed 2 down", "joined 2"]
        );
        assert!(
            kinds(&v.listed(&[listed(2, 20, 2)])).is_empty(),
            "the old lease does not bring the old life back"
        );
        assert_eq!(v.get(&addr(2)).unwrap().incarnation, Incarnation(21));
        assert!(
            v.hello(&addr(2), Incarnation(20), &[]).is_empty(),
            "a late hello of the old life is ignored"
        );
        assert_eq!(kinds(&v.listed(&[listed(2, 21, 9)])), ["up 2"]);
        assert_eq!(v.get(&addr(2)).unwrap().age, 9);
    }

    #[test]
    fn self_down_and_leave() {
        let mut v = Membership::new(addr(1), Incarnation(1), Vec::new());
        v.self_granted(4);
        assert_eq!(kinds(&v.self_lost()), ["down 1", "self-down"]);
        assert!(v.self_lost().is_empty());
        assert_eq!(kinds(&v.self_granted(6)), ["up 1"]);
        assert_eq!(v.me().age, 6);
        let (guard, _wait) = HandOver::new();
        assert_eq!(kinds(&v.self_leaving(guard)), ["leaving 1", "self-leaving"]);
        assert!(
            v.self_granted(7).is_empty(),
            "a leaving node does not come back up"
        );
    }

    #[test]
    fn reachability_changes_are_reported_once() {
        let mut v = Membership::new(addr(1), Incarnation(1), Vec::new());
        v.listed(&[listed(2, 2, 2)]);
        assert_eq!(kinds(&v.set_reachable(&addr(2), false)), ["unreachable 2"]);
        assert!(v.set_reachable(&addr(2), false).is_empty());
        assert_eq!(kinds(&v.set_reachable(&addr(2), true)), ["reachable 2"]);
        assert!(v.set_reachable(&addr(9), false).is_empty());
    }

    #[test]
    fn a_downed_membership_stays_down_and_a_new_one_comes_up() {
        let mut v = Membership::new(addr(1), Incarnation(1), Vec::new());
        v.listed(&[listed(2, 2, 2), listed(3, 3, 3)]);
        assert_eq!(kinds(&v.down(&addr(2))), ["down 2", "removed 2 down"]);
        assert!(v.down(&addr(2)).is_empty());
        assert!(
            kinds(&v.listed(&[listed(2, 2, 2), listed(3, 3, 3)])).is_empty(),
            "its lease, still listed, does not bring it back"
        );
        assert_eq!(
            kinds(&v.listed(&[listed(2, 2, 7), listed(3, 3, 3)])),
            ["up 2"],
            "the same process rejoining under a new ticket is a new member"
        );
    }

    #[test]
    fn a_greeter_never_listed_is_removed_when_its_session_closes() {
        let mut v = Membership::new(addr(1), Incarnation(1), Vec::new());
        v.hello(&addr(2), Incarnation(2), &[]);
        assert_eq!(kinds(&v.session_closed(&addr(2))), ["removed 2 joining"]);
    }
}
