//! Failure detection and the split brain resolver's input, as a pure machine: the ring of
//! monitors ([`crate::ring`]), heartbeats and what they carry, indirect probes, the verdict
//! on each member's reachability ([`crate::reachability`]), the shared reachability table
//! spread as deltas with a digest repair ([`crate::sbr::Spread`]), and the resolver's step
//! ([`crate::sbr::Resolver`]).
//!
//! The machine takes its inputs (a tick, a heartbeat, a probe, a hello, this node's
//! membership coming up or ending) with the clock reading and the node's view, and answers
//! what to send and which view events happened; it never reads a clock, sends or spawns.
//! The agent drives it over UDP and ractor sessions; the simulator ([`crate::sim`]) drives
//! many of them over a simulated network in one thread.
//!
//! A node heartbeats and watches its neighbours on the ring (passing over unreachable
//! members, which it watches too: [`crate::ring::neighbours_passing`]), and also every peer that is
//! not on the ring (a node that said hello but is not a member in this view, a node that
//! downed itself and waits to rejoin): such a node watches every peer, since it must hear
//! them all again. Whether a member it does not watch is reachable, a node takes from the
//! reachability table: unreachable while some observer's row says so.

mod monitor;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;

pub(crate) use monitor::Monitor;

use crate::identity::{Incarnation, NodeAddr};
use crate::member::{ClusterEvent, Member, MemberStatus, Membership};
use crate::protocol::{Heartbeat, Probe, ProbeStep};
use crate::reachability::Reachability;
use crate::sbr::{
    Carrier, Decision, Life, Partition, ReachTable, Resolver, SbrSettings, SharedRow, Step,
};

/// How many members outside its ring a node sends a heartbeat to, each round, while it has
/// reachability rows that changed lately: flooding the ring alone takes a row `n / k` hops
/// around a cluster of `n`, so that each observation of a partition of a thousand nodes
/// would reach the far side of the ring in some fifty rounds, long past `stable-after`.
/// With a few random contacts (SWIM's gossip) a change reaches every member in about
/// `log(n)` rounds, and a cluster with nothing to tell sends none.
pub(crate) const GOSSIP_FANOUT: usize = 3;

/// The settings the machine decides with (from [`crate::ClusterSettings`]).
#[derive(Debug, Clone)]
pub(crate) struct DetectorSettings {
    /// `monitored-by-nr-of-members`.
    pub monitored_by: usize,
    /// `indirect-probes`.
    pub indirect_probes: usize,
    /// `unreachable-after`.
    pub unreachable_after: Duration,
    /// `reachability-sync-interval`.
    pub sync_interval: Duration,
    /// `peer-heartbeat-interval`.
    pub heartbeat_interval: Duration,
}

/// The resolver's side of the machine (present unless `active-strategy = "off"`).
#[derive(Debug)]
struct Sbr {
    resolver: Resolver,
    table: ReachTable,
    /// When a heartbeat last came from each node, and when one last said it hears this node.
    heard: HashMap<NodeAddr, Instant>,
    hears_me: HashMap<NodeAddr, Instant>,
    /// When this node's current membership came up: until it has had unreachable-after to
    /// hear its peers, its row says it reaches them all (a node back from a pause or a lost
    /// member lease reconnects first; its old life's silences are no observation).
    up_since: Instant,
    /// The partition of the last step and what it was built from (the generations of the
    /// view and the table): an unchanged view and table make the same partition, and
    /// building one sorts every member.
    partition: Option<((u64, u64), Partition)>,
    /// The counted members of the view of one generation, for the partition.
    members: Option<(u64, std::sync::Arc<[Member]>)>,
    /// Members this node downed while its own row listed them (their lives and ages): the
    /// row goes on listing them while their member leases are held and they stay unheard.
    /// Leaving this node's view is no sign that this node hears them again, and the members
    /// that have not downed them yet decide on this row: cleared, it would tell them the
    /// partition healed before they acted on it, and leave them to the downed member's next
    /// observations.
    downed_unheard: BTreeMap<NodeAddr, (Incarnation, u64)>,
}

/// One heartbeat to send: to `to`'s life `incarnation`, as a datagram, and on the session
/// too when `session_copy`.
#[derive(Debug, Clone)]
pub(crate) struct Outbound {
    pub to: NodeAddr,
    pub incarnation: Incarnation,
    pub heartbeat: Heartbeat,
    pub session_copy: bool,
}

/// What a tick asks of the driver.
#[derive(Debug, Default)]
pub(crate) struct TickOut {
    /// Heartbeats to send.
    pub heartbeats: Vec<Outbound>,
    /// Probe requests to send (helper, probe).
    pub probes: Vec<(NodeAddr, Probe)>,
    /// What changed in the view.
    pub events: Vec<ClusterEvent>,
    /// Watched peers silent for 3 x `unreachable-after`: their sessions are probably
    /// half-open.
    pub silent: Vec<NodeAddr>,
}

/// Failure detection of one node (see the module's doc).
#[derive(Debug)]
pub(crate) struct Detector {
    me: NodeAddr,
    incarnation: Incarnation,
    s: DetectorSettings,
    /// When each member was last heard.
    pub reach: Reachability,
    /// The ring of monitors, the rows to spread and the probes.
    pub monitor: Monitor,
    sbr: Option<Sbr>,
    /// The ring of the view of one generation ([`Membership::generation`]).
    ring: Ring,
    /// What the last verdict on the members it does not watch was taken from: the
    /// generations of the view and the table, and the watched set (unchanged, the verdicts
    /// are too).
    verdicts_of: Option<(u64, u64)>,
}

/// The ring of monitors of one generation of the view, kept while the view holds still (a
/// tick of a thousand-member view would hash every member otherwise).
#[derive(Debug, Default)]
struct Ring {
    generation: Option<u64>,
    members: Vec<(NodeAddr, Incarnation)>,
    addrs: BTreeSet<NodeAddr>,
    /// This node's neighbours on it while it is on it.
    neighbours: BTreeSet<NodeAddr>,
}

/// Members that sit on the ring: those joining, up or leaving.
fn on_ring(m: &Member) -> bool {
    matches!(
        m.status,
        MemberStatus::Joining | MemberStatus::Up | MemberStatus::Leaving
    )
}

/// Members the resolver counts: up or leaving (joining members have no say yet).
pub(crate) fn counted(m: &Member) -> bool {
    matches!(m.status, MemberStatus::Up | MemberStatus::Leaving)
}

/// The members on the ring in `view`, with their lives.
fn ring_members(view: &Membership) -> Vec<(NodeAddr, Incarnation)> {
    view.members()
        .into_iter()
        .filter(on_ring)
        .map(|m| (m.addr, m.incarnation))
        .collect()
}

impl Detector {
    /// The machine of `me`'s life `incarnation`, with a resolver when `sbr` is set, as of
    /// `now`.
    pub(crate) fn new(
        me: NodeAddr,
        incarnation: Incarnation,
        s: DetectorSettings,
        sbr: Option<SbrSettings>,
        now: Instant,
    ) -> Detector {
        Detector {
            me,
            incarnation,
            monitor: Monitor::new(
                s.sync_interval,
                s.heartbeat_interval * crate::sbr::REPEAT as u32,
            ),
            s,
            reach: Reachability::default(),
            ring: Ring::default(),
            verdicts_of: None,
            sbr: sbr.map(|settings| Sbr {
                resolver: Resolver::new(settings, now),
                table: ReachTable::default(),
                heard: HashMap::new(),
                hears_me: HashMap::new(),
                up_since: now,
                partition: None,
                members: None,
                downed_unheard: BTreeMap::new(),
            }),
        }
    }

    /// Brings the ring up to `view`'s generation.
    fn refresh_ring(&mut self, view: &Membership) {
        if self.ring.generation == Some(view.generation()) {
            return;
        }
        let members = ring_members(view);
        self.ring.neighbours = crate::ring::neighbours_passing(
            (&self.me, self.incarnation),
            members.iter().cloned(),
            self.s.monitored_by,
            |a| view.get(a).is_none_or(|m| m.reachable),
        );
        self.ring.addrs = members.iter().map(|(a, _)| a.clone()).collect();
        self.ring.members = members;
        self.ring.generation = Some(view.generation());
    }

    /// The peers this node heartbeats and watches, with `view`, the peers it has sessions
    /// with (`peers`), and whether it downed itself (see the module's doc).
    fn watch_set(
        &mut self,
        view: &Membership,
        peers: &BTreeMap<NodeAddr, Incarnation>,
        downed: bool,
    ) -> BTreeSet<NodeAddr> {
        self.refresh_ring(view);
        let me_on_ring = on_ring(view.me()) && !downed;
        let mut out = if me_on_ring {
            self.ring.neighbours.clone()
        } else {
            view.peers().cloned().collect()
        };
        // Both in address order: one pass over each, where a lookup per peer in a cluster
        // of a thousand would be most of a tick.
        let mut on_ring = self.ring.addrs.iter().peekable();
        for p in peers.keys() {
            while on_ring.next_if(|a| *a < p).is_some() {}
            if on_ring.peek() != Some(&p) {
                out.insert(p.clone());
            }
        }
        out.remove(&self.me);
        out
    }

    /// Every `peer-heartbeat-interval`, at `now`: the heartbeats to the watched peers (numbered
    /// `seq`), the verdict on every member, and the probes of late ones. `peers` are the
    /// peer lives this node has sessions with (only they get heartbeats and probes);
    /// `downed`: this node downed itself and waits to rejoin; `rng` picks probe helpers.
    pub(crate) fn tick(
        &mut self,
        now: Instant,
        seq: u64,
        view: &mut Membership,
        peers: &BTreeMap<NodeAddr, Incarnation>,
        downed: bool,
        rng: &mut fastrand::Rng,
    ) -> TickOut {
        let mut out = TickOut::default();
        let watched = self.watch_set(view, peers, downed);
        let same_watch = watched == self.monitor.watched;
        // A newly watched member gets a full timeout from now, unless the view already
        // holds it unreachable (the table lists it): this node passes over unreachable
        // members on the ring, so a partition uncovers the other side to it a few members
        // at a time, and a fresh timeout made each one reachable here again for
        // `unreachable-after`, which moved this node's ring and row once more: the
        // partition a thousand-node side saw kept changing past `stable-after`.
        for peer in watched.difference(&self.monitor.watched) {
            if view.get(peer).is_none_or(|m| m.reachable) {
                self.reach.rewatch(peer, now);
            }
        }
        self.monitor.watched = watched.clone();
        let age = if view.me().status == MemberStatus::Up {
            view.me().age
        } else {
            0
        };
        if let Some(d) = self.sbr.as_ref() {
            self.monitor.spread.next_round(&d.table);
        }
        let digest = self.sbr.as_ref().map_or(0, |d| d.table.digest());
        let timeout = self.s.unreachable_after;
        let window = timeout / 2;
        for peer in &watched {
            let Some(incarnation) = peers.get(peer).copied() else {
                continue;
            };
            let reach = match self.sbr.as_ref() {
                Some(d) => self.monitor.spread.rows_for(&d.table, peer),
                None => Vec::new(),
            };
            let want_table = self.monitor.take_want_table(peer);
            let heartbeat = self.heartbeat(peer, (seq, age, digest), reach, want_table, now);
            let session_copy = self.monitor.session_copy_due(peer, now, window, timeout);
            out.heartbeats.push(Outbound {
                to: peer.clone(),
                incarnation,
                heartbeat,
                session_copy,
            });
        }
        if let Some(d) = self
            .sbr
            .as_ref()
            .filter(|_| self.monitor.spread.has_changes())
        {
            let mut others: Vec<&NodeAddr> =
                peers.keys().filter(|p| !watched.contains(*p)).collect();
            for _ in 0..GOSSIP_FANOUT.min(others.len()) {
                let peer = others.swap_remove(rng.usize(..others.len())).clone();
                let rows = self.monitor.spread.recent_rows(&d.table);
                if rows.is_empty() {
                    break;
                }
                let Some(incarnation) = peers.get(&peer).copied() else {
                    continue;
                };
                let heartbeat = self.heartbeat(&peer, (seq, age, digest), rows, false, now);
                out.heartbeats.push(Outbound {
                    to: peer,
                    incarnation,
                    heartbeat,
                    session_copy: false,
                });
            }
        }
        // The members this node does not watch: unreachable while another observer's row
        // lists them. Unchanged view, table and watched set, unchanged verdicts.
        let table_generation = self.sbr.as_ref().map_or(0, |d| d.table.generation());
        let basis = (view.generation(), table_generation);
        if !same_watch || self.verdicts_of != Some(basis) {
            // Listed by a row other than this node's own: counted by the table, less this
            // node's own row.
            let listed: BTreeSet<&NodeAddr> = self.sbr.as_ref().map_or_else(BTreeSet::new, |d| {
                let own = d.table.own(&self.me);
                d.table
                    .listed()
                    .iter()
                    .filter(|(subject, n)| **n > usize::from(own.contains(subject)))
                    .map(|(subject, _)| subject)
                    .collect()
            });
            let changed: Vec<(NodeAddr, bool)> = self
                .reach
                .peers()
                .filter(|addr| !watched.contains(*addr))
                .map(|addr| (addr, !listed.contains(addr)))
                .filter(|(addr, reachable)| {
                    view.get(addr).is_some_and(|m| m.reachable != *reachable)
                })
                .map(|(addr, reachable)| (addr.clone(), reachable))
                .collect();
            for (addr, reachable) in changed {
                out.events.extend(view.set_reachable(&addr, reachable));
            }
            self.verdicts_of = Some((view.generation(), table_generation));
        }
        // In address order: the probes' helpers come from `rng`, so the order is part of a
        // replay.
        for addr in &watched {
            let Some(silence) = self.reach.silence(addr, now) else {
                continue;
            };
            if self.s.indirect_probes > 0
                && crate::reachability::probe_due(
                    silence,
                    self.monitor.last_probe(addr, now),
                    timeout,
                )
            {
                let probes = self.probe(addr, now, view, peers, rng);
                out.probes.extend(probes);
            }
            let vouched = self.monitor.vouched(addr, now);
            let reachable = crate::reachability::judge(silence, vouched, timeout);
            out.events.extend(view.set_reachable(addr, reachable));
            if silence > timeout * 3 {
                out.silent.push(addr.clone());
            }
        }
        out
    }

    /// A probe round for `target`: to up to `indirect-probes` helpers among the peers this
    /// node has sessions with and hears, those that watch the target first.
    fn probe(
        &mut self,
        target: &NodeAddr,
        now: Instant,
        view: &Membership,
        peers: &BTreeMap<NodeAddr, Incarnation>,
        rng: &mut fastrand::Rng,
    ) -> Vec<(NodeAddr, Probe)> {
        let Some(incarnation) = view.get(target).map(|m| m.incarnation) else {
            return Vec::new();
        };
        self.refresh_ring(view);
        let its_watchers = crate::ring::neighbours(
            (target, incarnation),
            self.ring.members.iter().cloned(),
            self.s.monitored_by,
        );
        let mut candidates: Vec<&NodeAddr> = peers
            .keys()
            .filter(|p| *p != target && view.get(p).is_some_and(|m| on_ring(m) && m.reachable))
            .collect();
        rng.shuffle(&mut candidates);
        candidates.sort_by_key(|p| !its_watchers.contains(*p));
        let helpers: Vec<NodeAddr> = candidates
            .into_iter()
            .take(self.s.indirect_probes)
            .cloned()
            .collect();
        let id = self.monitor.start_probe(target, now);
        if !helpers.is_empty() {
            tracing::debug!(peer = %target, ?helpers, "heartbeats late: probing through other members");
        }
        helpers
            .into_iter()
            .map(|helper| {
                let probe = Probe {
                    id,
                    origin: self.me.clone(),
                    target: target.clone(),
                    incarnation,
                    step: ProbeStep::Request,
                };
                (helper, probe)
            })
            .collect()
    }

    /// This tick's heartbeat to `peer`: numbered, aged and with the digest of `stamp`
    /// (sequence number, this node's age, its table's digest), carrying `reach`.
    fn heartbeat(
        &self,
        peer: &NodeAddr,
        (seq, age, digest): (u64, u64, u64),
        reach: Vec<SharedRow>,
        want_table: bool,
        now: Instant,
    ) -> Heartbeat {
        let timeout = self.s.unreachable_after;
        Heartbeat {
            node: self.me.clone(),
            incarnation: self.incarnation,
            seq,
            age,
            reach,
            digest,
            want_table,
            hears_you: self.hears(peer, now, timeout),
            your_datagrams_arrive: self.monitor.datagrams_arrive(peer, now, timeout / 2),
        }
    }

    /// One step of an indirect probe, at `now`: as helper (pass the request to the target,
    /// its answer to the origin), as target (answer), or as origin (the target is alive).
    /// Answers where to pass it on, if anywhere.
    pub(crate) fn on_probe(
        &mut self,
        probe: Probe,
        now: Instant,
        view: &Membership,
        peers: &BTreeMap<NodeAddr, Incarnation>,
    ) -> Option<(NodeAddr, Probe)> {
        match probe.step.clone() {
            ProbeStep::Request => {
                let live = peers.get(&probe.target) == Some(&probe.incarnation);
                live.then(|| {
                    let step = ProbeStep::Ping {
                        helper: self.me.clone(),
                    };
                    (probe.target.clone(), Probe { step, ..probe })
                })
            }
            ProbeStep::Ping { helper } => {
                (probe.target == self.me && probe.incarnation == self.incarnation).then(|| {
                    let step = ProbeStep::Ack {
                        helper: helper.clone(),
                    };
                    (helper, Probe { step, ..probe })
                })
            }
            ProbeStep::Ack { helper } => {
                if probe.origin == self.me {
                    let same_life = view
                        .get(&probe.target)
                        .is_some_and(|m| m.incarnation == probe.incarnation);
                    if same_life && self.monitor.answered(&probe.target, probe.id, now) {
                        tracing::debug!(peer = %probe.target, %helper, "a late peer answered a probe through another member");
                    }
                    None
                } else if helper == self.me {
                    Some((probe.origin.clone(), probe))
                } else {
                    None
                }
            }
        }
    }

    /// A fresh heartbeat from a known peer life, counted as numbered `seq`, arrived at `now`
    /// (`via_datagram`: as a datagram, else on the session). `ceiling` says how far each
    /// observer's row numbers may be believed ([`crate::clocks`]). Answers what changed in
    /// the view.
    pub(crate) fn on_heartbeat(
        &mut self,
        hb: Heartbeat,
        seq: u64,
        via_datagram: bool,
        now: Instant,
        view: &mut Membership,
        ceiling: impl Fn(&NodeAddr, Incarnation) -> Option<u64>,
    ) -> Vec<ClusterEvent> {
        self.monitor
            .heard(&hb.node, via_datagram, hb.your_datagrams_arrive, now);
        if let Some(d) = self.sbr.as_mut() {
            d.heard.insert(hb.node.clone(), now);
            if hb.hears_you {
                d.hears_me.insert(hb.node.clone(), now);
            }
        }
        self.merge_rows(&hb.node, seq, hb.reach, view, ceiling);
        if hb.want_table {
            self.monitor.spread.owe_full(&hb.node);
        }
        if let Some(d) = self.sbr.as_ref() {
            let ours = d.table.digest();
            self.monitor.compare(&hb.node, hb.digest, ours, now);
        }
        self.reach.heard(&hb.node, now);
        if self.monitor.watched.contains(&hb.node)
            && view.get(&hb.node).is_some_and(|m| !m.reachable)
        {
            return view.set_reachable(&hb.node, true);
        }
        Vec::new()
    }

    /// Rows relayed in heartbeat `seq` of `from`; each observer's row is believed up to
    /// how far its clock can have gone (`ceiling`).
    fn merge_rows(
        &mut self,
        from: &NodeAddr,
        seq: u64,
        rows: Vec<SharedRow>,
        view: &Membership,
        ceiling: impl Fn(&NodeAddr, Incarnation) -> Option<u64>,
    ) {
        let Some(d) = self.sbr.as_mut() else {
            return;
        };
        // Asked only of the rows newer than those held (see `ReachTable::merge`).
        let life = |a: &NodeAddr| {
            let incarnation = view.get(a).filter(|m| counted(m))?.incarnation;
            Some(Life {
                incarnation,
                ceiling: ceiling(a, incarnation),
            })
        };
        let carrier = Carrier { node: from, seq };
        let refused = d.table.merge(&self.me, carrier, rows, life);
        if refused > 0 {
            tracing::debug!(peer = %from, refused, "reachability rows numbered beyond their observer's clock refused");
        }
    }

    /// `peer` said hello at `now` (a new session or life, which may have missed any delta of
    /// the reachability table: it gets the rows that list someone next, and the rest from
    /// the digest repair; see [`crate::sbr::Spread::owe_observations`]).
    pub(crate) fn on_hello(&mut self, peer: &NodeAddr, now: Instant) {
        self.monitor.spread.owe_observations(peer);
        self.reach.heard(peer, now);
    }

    /// Something other than a heartbeat arrived from `peer` at `now`.
    pub(crate) fn heard(&mut self, peer: &NodeAddr, now: Instant) {
        self.reach.heard(peer, now);
    }

    /// A change of the view at `now`: a member that joins or comes up is watched (with a
    /// full timeout), a removed one forgotten.
    pub(crate) fn on_event(&mut self, event: &ClusterEvent, now: Instant) {
        match event {
            ClusterEvent::MemberJoined(m) | ClusterEvent::MemberUp(m) if m.addr != self.me => {
                self.reach.watch(&m.addr, now);
            }
            ClusterEvent::MemberRemoved(m) if m.addr != self.me => {
                self.reach.forget(&m.addr);
                self.monitor.forget(&m.addr);
                if let Some(d) = self.sbr.as_mut()
                    && m.status == MemberStatus::Down
                    && d.table.own(&self.me).contains(&m.addr)
                {
                    d.downed_unheard
                        .insert(m.addr.clone(), (m.incarnation, m.age));
                }
            }
            _ => {}
        }
    }

    /// The resolver's settings (`None` when it is off).
    pub(crate) fn resolver_settings(&self) -> Option<&SbrSettings> {
        self.sbr.as_ref().map(|d| d.resolver.settings())
    }

    /// This node is up under a new membership at `now`: its row starts settling and the
    /// resolver starts a new situation.
    pub(crate) fn membership_up(&mut self, now: Instant) {
        if let Some(d) = self.sbr.as_mut() {
            d.up_since = now;
            d.resolver.restart(now);
        }
    }

    /// This node's membership ended at `now` without the resolver: the next life starts
    /// without its observations.
    pub(crate) fn membership_ended(&mut self, now: Instant) {
        if let Some(d) = self.sbr.as_mut() {
            d.resolver.restart(now);
        }
    }

    /// Whether a heartbeat came from `peer` within `window` before `now`.
    pub(crate) fn hears(&self, peer: &NodeAddr, now: Instant, window: Duration) -> bool {
        self.sbr.as_ref().is_some_and(|d| {
            d.heard
                .get(peer)
                .is_some_and(|t| now.saturating_duration_since(*t) < window)
        })
    }

    /// Whether this node and `peer` heard each other within `window` before `now`.
    pub(crate) fn mutual(&self, peer: &NodeAddr, now: Instant, window: Duration) -> bool {
        self.sbr.as_ref().is_some_and(|d| {
            let recent = |m: &HashMap<NodeAddr, Instant>| {
                m.get(peer)
                    .is_some_and(|t| now.saturating_duration_since(*t) < window)
            };
            recent(&d.heard) && recent(&d.hears_me)
        })
    }

    /// When a heartbeat last came from `peer`.
    pub(crate) fn last_heard(&self, peer: &NodeAddr) -> Option<Instant> {
        self.sbr.as_ref().and_then(|d| d.heard.get(peer).copied())
    }

    /// Every tick with a resolver, at `now`: this node's own row (stamped `stamp`) lists the
    /// counted members it watches and finds unreachable, and the members it downed while
    /// listing them as long as their member leases are held and they stay unheard (none
    /// while its membership settles); rows of observers no longer counted are dropped.
    pub(crate) fn update_own_row(&mut self, now: Instant, stamp: u64, view: &Membership) {
        let Some(d) = self.sbr.as_mut() else {
            return;
        };
        let window = self.s.unreachable_after;
        let heard = &d.heard;
        d.downed_unheard.retain(|addr, (incarnation, age)| {
            view.downed_but_listed(addr, *incarnation, *age)
                && heard
                    .get(addr)
                    .is_none_or(|t| now.saturating_duration_since(*t) >= window)
        });
        let settling = now.saturating_duration_since(d.up_since) < self.s.unreachable_after;
        let own: BTreeSet<NodeAddr> = if settling {
            BTreeSet::new()
        } else {
            // Only what this node observes itself: the reachability of members it does not
            // watch comes from other rows, which its own must not echo.
            self.monitor
                .watched
                .iter()
                .filter(|a| {
                    **a != self.me && view.get(a).is_some_and(|m| counted(m) && !m.reachable)
                })
                .chain(d.downed_unheard.keys())
                .cloned()
                .collect()
        };
        d.table.set_own(&self.me, self.incarnation, own, stamp);
        let (me, incarnation) = (&self.me, self.incarnation);
        let dropped = d.table.retain(|a| {
            if a == me {
                return Some(incarnation);
            }
            view.get(a).filter(|m| counted(m)).map(|m| m.incarnation)
        });
        // The members that only the dropped rows listed (see
        // `Resolver::unlisted_by_departures`).
        let listed = d.table.listed();
        let unlisted: Vec<NodeAddr> = dropped
            .iter()
            .flat_map(|row| row.unreachable.iter())
            .filter(|s| !listed.contains_key(*s) && view.get(s).is_some_and(counted))
            .cloned()
            .collect();
        d.resolver.unlisted_by_departures(unlisted);
    }

    /// The resolver's step at `now` for an up node: a decision once the partition in the
    /// table held still for `stable-after` (see [`Resolver::step`]).
    pub(crate) fn decide(&mut self, now: Instant, view: &Membership) -> Option<Decision> {
        let d = self.sbr.as_mut()?;
        if view.me().status != MemberStatus::Up {
            return None;
        }
        let basis = (view.generation(), d.table.generation());
        let partition = match d.partition.take() {
            Some((of, partition)) if of == basis => partition,
            _ => {
                // The members even when the table has no records (a whole cluster): the
                // resolver tells members that left the view from members heard again by
                // whether they are still members.
                let members = match d.members.take() {
                    Some((generation, members)) if generation == view.generation() => members,
                    _ => view
                        .members()
                        .into_iter()
                        .filter(counted)
                        .collect::<Vec<Member>>()
                        .into(),
                };
                d.members = Some((view.generation(), members.clone()));
                Partition::of_table(members, &d.table)
            }
        };
        let step = d.resolver.step(&self.me, &partition, now);
        d.partition = Some((basis, partition));
        match step {
            Step::Decide(decision) => Some(decision),
            Step::Wait => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member::Listed;
    use crate::sbr::SbrConfig;

    const UNREACHABLE_AFTER: Duration = Duration::from_millis(1500);

    fn a(p: u16) -> NodeAddr {
        NodeAddr::parse("t", &format!("127.0.0.1:{p}")).unwrap()
    }

    /// Node `p`'s member lease (life `p`, age `p`).
    fn lease(p: u16) -> Listed {
        Listed {
            addr: a(p),
            incarnation: Incarnation(p as u64),
            age: p as u64,
            roles: Vec::new(),
            app_version: Default::default(),
        }
    }

    fn heartbeat(p: u16, seq: u64) -> Heartbeat {
        Heartbeat {
            node: a(p),
            incarnation: Incarnation(p as u64),
            seq,
            age: p as u64,
            reach: Vec::new(),
            digest: 0,
            want_table: false,
            hears_you: true,
            your_datagrams_arrive: true,
        }
    }

    /// Node 1 of a 3-node cluster at `t0`, with its view (every member up) and its peers.
    fn node_1(t0: Instant) -> (Detector, Membership, BTreeMap<NodeAddr, Incarnation>) {
        let settings = DetectorSettings {
            monitored_by: 9,
            indirect_probes: 0,
            unreachable_after: UNREACHABLE_AFTER,
            sync_interval: Duration::from_secs(5),
            heartbeat_interval: Duration::from_millis(250),
        };
        let sbr = SbrConfig::default().resolve().unwrap();
        let mut d = Detector::new(a(1), Incarnation(1), settings, sbr, t0);
        let mut view = Membership::new(a(1), Incarnation(1), Vec::new());
        view.self_granted(1);
        d.membership_up(t0);
        for e in view.listed(&[lease(1), lease(2), lease(3)]) {
            d.on_event(&e, t0);
        }
        let peers = (2..=3).map(|p| (a(p), Incarnation(p as u64))).collect();
        // The first tick starts watching the peers.
        d.tick(
            t0,
            0,
            &mut view,
            &peers,
            false,
            &mut fastrand::Rng::with_seed(7),
        );
        (d, view, peers)
    }

    /// Node 1 hears node 2 and not node 3 for longer than unreachable-after: its row lists
    /// node 3. Answers the instant.
    fn node_3_unheard(
        d: &mut Detector,
        view: &mut Membership,
        peers: &BTreeMap<NodeAddr, Incarnation>,
        t0: Instant,
    ) -> Instant {
        let mut rng = fastrand::Rng::with_seed(7);
        let t = t0 + UNREACHABLE_AFTER + Duration::from_millis(500);
        d.on_heartbeat(heartbeat(2, 1), 1, true, t, view, |_, _| None);
        d.tick(t, 1, view, peers, false, &mut rng);
        d.update_own_row(t, 1, view);
        assert_eq!(d.sbr.as_ref().unwrap().table.own(&a(1)), [a(3)]);
        t
    }

    fn own_row(d: &Detector) -> Vec<NodeAddr> {
        d.sbr.as_ref().unwrap().table.own(&a(1)).to_vec()
    }

    /// A node that downs a member it cannot hear keeps saying so in its row: the members
    /// that have not downed it yet (they hear it, and learnt of the partition from this
    /// row) must not take the member's going from this view for a healed partition.
    #[test]
    fn a_member_downed_unheard_stays_in_the_row_while_its_lease_is_held_and_it_is_unheard() {
        let t0 = Instant::now();
        let (mut d, mut view, peers) = node_1(t0);
        let t = node_3_unheard(&mut d, &mut view, &peers, t0);
        for e in view.down(&a(3)) {
            d.on_event(&e, t);
        }
        let t = t + Duration::from_millis(250);
        d.update_own_row(t, 2, &view);
        assert_eq!(own_row(&d), [a(3)], "downed here, still unheard");
        // Its member lease is still listed: still in the row.
        view.listed(&[lease(1), lease(2), lease(3)]);
        d.update_own_row(t + Duration::from_millis(250), 3, &view);
        assert_eq!(own_row(&d), [a(3)]);
        // It downed itself (released its member lease): no member anywhere, out of the row.
        view.listed(&[lease(1), lease(2)]);
        d.update_own_row(t + Duration::from_millis(500), 4, &view);
        assert!(own_row(&d).is_empty());

        // Heard again (the link healed) while its member lease is still held: out of the
        // row too.
        let (mut d, mut view, peers) = node_1(t0);
        let t = node_3_unheard(&mut d, &mut view, &peers, t0);
        for e in view.down(&a(3)) {
            d.on_event(&e, t);
        }
        d.update_own_row(t, 2, &view);
        assert_eq!(own_row(&d), [a(3)]);
        let t = t + Duration::from_millis(250);
        d.on_heartbeat(heartbeat(3, 9), 9, true, t, &mut view, |_, _| None);
        d.update_own_row(t, 3, &view);
        assert!(own_row(&d).is_empty());

        // A member downed while this node heard it was never in the row: it stays out.
        let (mut d, mut view, _) = node_1(t0);
        let t = t0 + UNREACHABLE_AFTER * 2;
        d.update_own_row(t, 1, &view);
        for e in view.down(&a(2)) {
            d.on_event(&e, t);
        }
        d.update_own_row(t, 2, &view);
        assert!(own_row(&d).is_empty());
    }
}
