//! A deterministic simulator of the cluster layer: N nodes, each the failure detection
//! machine ([`crate::detector`]) with its view ([`Membership`]), driven in one thread on
//! virtual time over a seeded network that delays, drops, duplicates and partitions (or
//! cuts single links, one way or both: [`Sim::cut_link`], [`Sim::lose_one_way`]), with
//! a simulated store holding the member leases and the resolver lease (FoundationDB's and
//! TigerBeetle's way of testing). The same seed gives the same run, event by event.
//!
//! What is modelled: heartbeats (datagram and session copy) on the ring of monitors, their
//! reachability rows and digests, hellos (a peer's clock and the rows owed after one),
//! indirect probes, the view from periodic listings of the member leases, member leases
//! renewed every `member-lease-interval` and lapsing `member-lease-ttl` after the last
//! renewal, the resolver's decisions, the resolver lease of lease-majority, acquired and
//! watched by the agent's machine ([`crate::agent::resolver_attempt`]), and the notice a node
//! sends a peer that heartbeats under a membership it downed (the agent's `YouAreDown`: the
//! peer downs itself). Sessions are taken as established with every member (the mesh's dials
//! and TLS are not simulated); a node that downs itself stops, as with `when-down = "exit"`,
//! and comes back only when [`Sim::restart`]ed as a new life (as a supervisor restarts it).

#[cfg(test)]
mod links;
mod scenario;

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::time::Duration;

use tenure_lease::{FencingToken, LeaseRecord};
use tokio::time::Instant;

pub use scenario::{
    PartitionReport, SEED_VAR, STRATEGIES, ScaleReport, SideOutcome, partition_run, scale_run,
    seed_from_env, strategy_settings,
};

use crate::agent::resolver_attempt::{self, Answer, Holder, Look, Next};
use crate::agent::resolver_lease::ResolverLeaseError;
use crate::clocks::{Freshness, NodeClock, PeerClocks};
use crate::detector::{Detector, DetectorSettings};
use crate::identity::{Incarnation, NodeAddr};
use crate::member::{ClusterEvent, Listed, MemberStatus, Membership};
use crate::protocol::{Heartbeat, Probe};
use crate::sbr::{Decision, SbrSettings, Strategy};

/// The timings of the simulated nodes (the reference configuration's by default).
#[derive(Debug, Clone)]
pub struct Timings {
    /// `peer-heartbeat-interval`.
    pub heartbeat_interval: Duration,
    /// `unreachable-after`.
    pub unreachable_after: Duration,
    /// `membership-interval`: how often a node lists the member leases.
    pub membership_interval: Duration,
    /// `member-lease-interval`: how often a node renews its member lease.
    pub member_lease_interval: Duration,
    /// `member-lease-ttl`.
    pub member_lease_ttl: Duration,
    /// `monitored-by-nr-of-members`.
    pub monitored_by: usize,
    /// `indirect-probes`.
    pub indirect_probes: usize,
    /// `reachability-sync-interval`.
    pub sync_interval: Duration,
}

impl Default for Timings {
    fn default() -> Timings {
        Timings {
            heartbeat_interval: Duration::from_millis(500),
            unreachable_after: Duration::from_secs(3),
            membership_interval: Duration::from_secs(1),
            member_lease_interval: Duration::from_secs(1),
            member_lease_ttl: Duration::from_secs(10),
            monitored_by: 9,
            indirect_probes: 3,
            sync_interval: Duration::from_secs(5),
        }
    }
}

/// The simulated network: every message is delayed uniformly within
/// `[min_delay, max_delay]`, lost with probability `drop`, delivered twice with probability
/// `duplicate`, and lost between nodes on different sides of a partition.
#[derive(Debug, Clone)]
pub struct Network {
    /// The shortest delay.
    pub min_delay: Duration,
    /// The longest delay.
    pub max_delay: Duration,
    /// The probability that a message is lost.
    pub drop: f64,
    /// The probability that a message arrives twice.
    pub duplicate: f64,
    /// How long the store takes to answer.
    pub store_delay: Duration,
}

impl Default for Network {
    fn default() -> Network {
        Network {
            min_delay: Duration::from_micros(200),
            max_delay: Duration::from_millis(20),
            drop: 0.01,
            duplicate: 0.01,
            store_delay: Duration::from_millis(2),
        }
    }
}

/// What is counted over a run.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// Heartbeat datagrams sent.
    pub datagrams: u64,
    /// Heartbeat copies sent on sessions.
    pub session_copies: u64,
    /// Probe messages sent (requests, pings and acks).
    pub probes: u64,
    /// Hellos and requests for one.
    pub hellos: u64,
    /// Reachability rows carried in heartbeats.
    pub rows: u64,
    /// Store requests (listings, renewals, resolver lease reads and acquires).
    pub store_requests: u64,
    /// `Unreachable` events, over every node's view.
    pub unreachable_events: u64,
}

impl Counters {
    /// The messages of failure detection between nodes: heartbeats (both copies) and
    /// probes (hellos come with new sessions, counted apart).
    pub fn messages(&self) -> u64 {
        self.datagrams + self.session_copies + self.probes
    }

    fn minus(&self, earlier: &Counters) -> Counters {
        Counters {
            datagrams: self.datagrams - earlier.datagrams,
            session_copies: self.session_copies - earlier.session_copies,
            probes: self.probes - earlier.probes,
            hellos: self.hellos - earlier.hellos,
            rows: self.rows - earlier.rows,
            store_requests: self.store_requests - earlier.store_requests,
            unreachable_events: self.unreachable_events - earlier.unreachable_events,
        }
    }
}

/// What a node decided and did about a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Its side survives: it downed these nodes (by index) from its view.
    Survived(BTreeSet<usize>),
    /// It downed itself.
    DownedSelf(String),
}

#[derive(Clone)]
enum Msg {
    Heartbeat {
        hb: Heartbeat,
        datagram: bool,
    },
    Probe(Probe),
    Hello {
        clock: u64,
    },
    HelloPlease,
    /// The sender downed the receiver's membership of this age.
    YouAreDown {
        age: u64,
    },
}

enum Event {
    Join(usize),
    Tick(usize),
    Poll(usize),
    Renew(usize),
    Listed(usize),
    Deliver { to: usize, from: usize, msg: Msg },
    Lease { node: usize, attempt: u64 },
}

struct Scheduled {
    at: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    // Earliest first out of std's max-heap; ties in the order scheduled.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// A lease-majority attempt under way at a node.
struct Attempt {
    id: u64,
    leader: bool,
    machine: resolver_attempt::Attempt,
    down_if_won: Vec<NodeAddr>,
}

struct Node {
    addr: NodeAddr,
    incarnation: Incarnation,
    alive: bool,
    up: bool,
    view: Membership,
    detector: Detector,
    clock: NodeClock,
    clocks: PeerClocks,
    /// The lives of the other members in the view (the sessions' peers).
    peers: BTreeMap<NodeAddr, Incarnation>,
    /// Peer lives this node said hello to.
    greeted: BTreeSet<(NodeAddr, Incarnation)>,
    rng: fastrand::Rng,
    outcome: Option<Outcome>,
    attempt: Option<Attempt>,
    attempts: u64,
    /// Its view changed since the last convergence check.
    dirty: bool,
    /// What its view held at the last convergence check: whether it was up, how many
    /// members were up and reachable, and how many members there were.
    seen: (bool, usize, usize),
    /// The number of the last listing it took.
    listing: u64,
}

impl Node {
    /// A new life of the node at `addr`, as of `now`, its random choices drawn from `rng`.
    fn new(
        addr: NodeAddr,
        timings: &Timings,
        sbr: Option<SbrSettings>,
        now: Instant,
        rng: &mut fastrand::Rng,
    ) -> Node {
        let incarnation = Incarnation(rng.u64(..));
        let settings = DetectorSettings {
            monitored_by: timings.monitored_by,
            indirect_probes: timings.indirect_probes,
            unreachable_after: timings.unreachable_after,
            sync_interval: timings.sync_interval,
            heartbeat_interval: timings.heartbeat_interval,
        };
        Node {
            view: Membership::new(addr.clone(), incarnation, Vec::new()),
            detector: Detector::new(addr.clone(), incarnation, settings, sbr, now),
            addr,
            incarnation,
            alive: true,
            up: false,
            clock: NodeClock::new(now),
            clocks: PeerClocks::new(timings.unreachable_after / 2),
            peers: BTreeMap::new(),
            greeted: BTreeSet::new(),
            rng: fastrand::Rng::with_seed(rng.u64(..)),
            outcome: None,
            attempt: None,
            attempts: 0,
            dirty: true,
            seen: (false, 0, 0),
            listing: 0,
        }
    }
}

/// The simulated store: member leases and the resolver lease.
#[derive(Default)]
struct Store {
    /// Per node: (life, age, when its lease lapses).
    members: BTreeMap<usize, (Incarnation, u64, Instant)>,
    tickets: u64,
    /// The resolver lease: holder, token, until when.
    sbr: Option<(String, u64, Instant)>,
    sbr_tokens: u64,
    /// The last listing, numbered, and until when it holds (the earliest lapse in it):
    /// nodes take a listing only when it differs from the last they took, as if they
    /// watched the store for changes, which a real node sees as the same answer.
    listing: Option<(u64, Vec<Listed>, Instant)>,
    listings: u64,
}

/// The simulator (see the module's doc).
pub struct Sim {
    timings: Timings,
    net: Network,
    sbr: Option<SbrSettings>,
    base: Instant,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Scheduled>,
    rng: fastrand::Rng,
    nodes: Vec<Node>,
    index: HashMap<NodeAddr, usize>,
    store: Store,
    /// Each node's side while partitioned.
    sides: Option<Vec<u8>>,
    /// Cut links, one direction each: what `.0` sends `.1` is lost.
    cut: BTreeSet<(usize, usize)>,
    counters: Counters,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The address of simulated node `i`.
pub fn addr(i: usize) -> NodeAddr {
    NodeAddr {
        host: format!("10.{}.{}.{}", i / 65_536, (i / 256) % 256, i % 256),
        port: 2552,
    }
}

impl Sim {
    /// `n` nodes with `timings` on `net`, deciding partitions with `sbr` (none: no
    /// resolver), every random choice drawn from `seed`. Each node joins at a random
    /// instant within the first `membership-interval`.
    pub fn new(
        n: usize,
        seed: u64,
        timings: Timings,
        net: Network,
        sbr: Option<SbrSettings>,
    ) -> Sim {
        let base = Instant::now();
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut nodes = Vec::with_capacity(n);
        let mut index = HashMap::with_capacity(n);
        for i in 0..n {
            let node = Node::new(addr(i), &timings, sbr.clone(), base, &mut rng);
            index.insert(node.addr.clone(), i);
            nodes.push(node);
        }
        let mut sim = Sim {
            timings,
            net,
            sbr,
            base,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            rng,
            nodes,
            index,
            store: Store::default(),
            sides: None,
            cut: BTreeSet::new(),
            counters: Counters::default(),
        };
        let spread = nanos(sim.timings.membership_interval).max(1);
        for i in 0..n {
            let at = sim.rng.u64(..spread);
            sim.schedule_at(at, Event::Join(i));
        }
        sim
    }

    /// The virtual time since the start.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.now)
    }

    /// What was counted so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// How many nodes are simulated.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether no node is simulated.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// What node `i` decided about a partition, if anything.
    pub fn outcome(&self, i: usize) -> Option<&Outcome> {
        self.nodes[i].outcome.as_ref()
    }

    /// Whether node `i` runs (not killed, not downed).
    pub fn is_alive(&self, i: usize) -> bool {
        self.nodes[i].alive
    }

    /// Whether node `i`'s view holds node `j`, and whether as reachable.
    pub fn sees(&self, i: usize, j: usize) -> Option<bool> {
        self.nodes[i]
            .view
            .get(&self.nodes[j].addr)
            .filter(|m| m.status == MemberStatus::Up)
            .map(|m| m.reachable)
    }

    /// Whether every running node is up and sees every other running node up and
    /// reachable, and no other member.
    pub fn converged(&mut self) -> bool {
        let alive = self.nodes.iter().filter(|n| n.alive).count();
        for node in self.nodes.iter_mut().filter(|n| n.alive) {
            // A view unchanged since the last check is judged as then: counting a thousand
            // views of a thousand members at every step would cost more than the run.
            if node.dirty {
                let good = node
                    .view
                    .iter()
                    .filter(|m| m.status == MemberStatus::Up && m.reachable)
                    .count();
                let up = node.up && node.view.me().status == MemberStatus::Up;
                node.seen = (up, good, node.view.iter().count());
                node.dirty = false;
            }
            if node.seen != (true, alive, alive) {
                return false;
            }
        }
        true
    }

    /// Kills node `i`: it stops at once (its member lease lapses unrenewed).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].alive = false;
    }

    /// Cuts the network between the nodes for which `side` is true and the others.
    pub fn partition(&mut self, side: impl Fn(usize) -> bool) {
        self.sides = Some((0..self.nodes.len()).map(|i| u8::from(side(i))).collect());
    }

    /// Cuts the link between nodes `a` and `b` both ways: every message between them is
    /// lost until [`heal_link`](Sim::heal_link), while both still reach every other node
    /// and the store (a partial partition when a third node hears both).
    pub fn cut_link(&mut self, a: usize, b: usize) {
        self.cut.insert((a, b));
        self.cut.insert((b, a));
    }

    /// Loses every message node `from` sends node `to`, while what `to` sends `from`
    /// arrives (one-way loss), until [`heal_link`](Sim::heal_link).
    pub fn lose_one_way(&mut self, from: usize, to: usize) {
        self.cut.insert((from, to));
    }

    /// Lets messages between nodes `a` and `b` through again, both ways (messages lost
    /// while the link was cut stay lost). A link flaps when a test cuts and heals it in
    /// turn, with [`run_for`](Sim::run_for) between.
    pub fn heal_link(&mut self, a: usize, b: usize) {
        self.cut.remove(&(a, b));
        self.cut.remove(&(b, a));
    }

    /// Whether node `i` runs and its view has it up (a member of the cluster).
    pub fn is_up(&self, i: usize) -> bool {
        let node = &self.nodes[i];
        node.alive && node.up && node.view.me().status == MemberStatus::Up
    }

    /// Whether node `i`'s view downed node `j`'s current membership (its life and age).
    pub fn downed(&self, i: usize, j: usize) -> bool {
        let them = self.nodes[j].view.me();
        them.age != 0
            && self.nodes[i]
                .view
                .was_downed(&them.addr, them.incarnation, them.age)
    }

    /// Starts node `i` again as a new life (a new incarnation that joins as the youngest
    /// member), as a supervisor restarts a node that stopped: what its old life had
    /// scheduled is dropped, messages on their way to it still arrive. Its member lease, if
    /// still held, lapses unrenewed.
    pub fn restart(&mut self, i: usize) {
        let mine = |e: &Event| match e {
            Event::Join(j)
            | Event::Tick(j)
            | Event::Poll(j)
            | Event::Renew(j)
            | Event::Listed(j)
            | Event::Lease { node: j, .. } => *j == i,
            Event::Deliver { .. } => false,
        };
        self.queue.retain(|s| !mine(&s.event));
        let now = self.at();
        let addr = self.nodes[i].addr.clone();
        self.nodes[i] = Node::new(addr, &self.timings, self.sbr.clone(), now, &mut self.rng);
        self.schedule(Duration::ZERO, Event::Join(i));
    }

    /// Runs the events due within `d` of virtual time.
    pub fn run_for(&mut self, d: Duration) {
        let until = self.now.saturating_add(nanos(d));
        while self.queue.peek().is_some_and(|s| s.at <= until) {
            if let Some(s) = self.queue.pop() {
                self.now = s.at;
                self.handle(s.event);
            }
        }
        self.now = until;
    }

    /// Runs in steps of `step` until `done` holds (answers the virtual time it took, at the
    /// step's granularity) or `limit` passed (`None`).
    pub fn run_until(
        &mut self,
        step: Duration,
        limit: Duration,
        mut done: impl FnMut(&mut Sim) -> bool,
    ) -> Option<Duration> {
        let start = self.now;
        loop {
            if done(self) {
                return Some(Duration::from_nanos(self.now - start));
            }
            if Duration::from_nanos(self.now - start) >= limit {
                return None;
            }
            self.run_for(step);
        }
    }

    fn at(&self) -> Instant {
        self.base + Duration::from_nanos(self.now)
    }

    fn schedule_at(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.queue.push(Scheduled {
            at,
            seq: self.seq,
            event,
        });
    }

    fn schedule(&mut self, after: Duration, event: Event) {
        self.schedule_at(self.now.saturating_add(nanos(after)), event);
    }

    fn send(&mut self, from: usize, to: usize, msg: Msg) {
        match &msg {
            Msg::Heartbeat { hb, datagram } => {
                self.counters.rows += hb.reach.len() as u64;
                if *datagram {
                    self.counters.datagrams += 1;
                } else {
                    self.counters.session_copies += 1;
                }
            }
            Msg::Probe(_) => self.counters.probes += 1,
            Msg::Hello { .. } | Msg::HelloPlease => self.counters.hellos += 1,
            Msg::YouAreDown { .. } => {}
        }
        if self
            .sides
            .as_ref()
            .is_some_and(|sides| sides[from] != sides[to])
            || self.cut.contains(&(from, to))
            || self.rng.f64() < self.net.drop
        {
            return;
        }
        let (lo, hi) = (nanos(self.net.min_delay), nanos(self.net.max_delay));
        // A heartbeat of a partition's first seconds carries hundreds of rows: copied only
        // when it arrives twice.
        if self.rng.f64() < self.net.duplicate {
            let delay = self.rng.u64(lo..=hi.max(lo));
            let msg = msg.clone();
            self.schedule_at(self.now + delay, Event::Deliver { to, from, msg });
        }
        let delay = self.rng.u64(lo..=hi.max(lo));
        self.schedule_at(self.now + delay, Event::Deliver { to, from, msg });
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Join(i) => self.join(i),
            Event::Tick(i) => self.tick(i),
            Event::Poll(i) => {
                if self.nodes[i].alive {
                    self.counters.store_requests += 1;
                    let d = self.net.store_delay;
                    self.schedule(d, Event::Listed(i));
                    let every = self.timings.membership_interval;
                    self.schedule(every, Event::Poll(i));
                }
            }
            Event::Renew(i) => {
                if self.nodes[i].alive {
                    self.counters.store_requests += 1;
                    let until = self.at() + self.timings.member_lease_ttl;
                    if let Some(m) = self.store.members.get_mut(&i) {
                        m.2 = until;
                    }
                    let every = self.timings.member_lease_interval;
                    self.schedule(every, Event::Renew(i));
                }
            }
            Event::Listed(i) => self.listed(i),
            Event::Deliver { to, from, msg } => {
                if self.nodes[to].alive {
                    self.deliver(to, from, msg);
                }
            }
            Event::Lease { node, attempt } => self.lease_step(node, attempt),
        }
    }

    fn join(&mut self, i: usize) {
        self.store.tickets += 1;
        self.counters.store_requests += 1;
        let age = self.store.tickets;
        let until = self.at() + self.timings.member_lease_ttl;
        let incarnation = self.nodes[i].incarnation;
        self.store.members.insert(i, (incarnation, age, until));
        self.store.listing = None;
        let now = self.at();
        let node = &mut self.nodes[i];
        node.up = true;
        let events = node.view.self_granted(age);
        node.detector.membership_up(now);
        self.apply(i, events);
        let jitter = self
            .rng
            .u64(..nanos(self.timings.heartbeat_interval).max(1));
        self.schedule_at(self.now + jitter, Event::Tick(i));
        self.schedule(Duration::ZERO, Event::Poll(i));
        let every = self.timings.member_lease_interval;
        self.schedule(every, Event::Renew(i));
    }

    fn listed(&mut self, i: usize) {
        if !self.nodes[i].alive {
            return;
        }
        let now = self.at();
        let fresh = self
            .store
            .listing
            .as_ref()
            .is_some_and(|(_, _, until)| now < *until);
        if !fresh {
            let listing: Vec<Listed> = self
                .store
                .members
                .iter()
                .filter(|(_, (_, _, until))| *until > now)
                .map(|(j, (incarnation, age, _))| Listed {
                    addr: self.nodes[*j].addr.clone(),
                    incarnation: *incarnation,
                    age: *age,
                    roles: Vec::new(),
                    app_version: Default::default(),
                })
                .collect();
            let until = self
                .store
                .members
                .values()
                .map(|(_, _, until)| *until)
                .filter(|until| *until > now)
                .min()
                .unwrap_or(now + self.timings.member_lease_ttl);
            let same = self
                .store
                .listing
                .as_ref()
                .is_some_and(|(_, old, _)| *old == listing);
            if !same {
                self.store.listings += 1;
            }
            self.store.listing = Some((self.store.listings, listing, until));
        }
        let Some((number, listing, _)) = self.store.listing.as_ref() else {
            return;
        };
        if self.nodes[i].listing == *number {
            return;
        }
        self.nodes[i].listing = *number;
        let events = self.nodes[i].view.listed(listing);
        self.apply(i, events);
    }

    /// The view of node `i` changed: the machine follows, the session peers too.
    fn apply(&mut self, i: usize, events: Vec<ClusterEvent>) {
        let now = self.at();
        let mut hellos = Vec::new();
        let node = &mut self.nodes[i];
        for event in events {
            node.detector.on_event(&event, now);
            node.dirty = true;
            match &event {
                ClusterEvent::MemberJoined(m) | ClusterEvent::MemberUp(m)
                    if m.addr != node.addr =>
                {
                    node.peers.insert(m.addr.clone(), m.incarnation);
                    // The mesh says hello on each new session.
                    if node.greeted.insert((m.addr.clone(), m.incarnation))
                        && let Some(&j) = self.index.get(&m.addr)
                    {
                        hellos.push(j);
                    }
                }
                ClusterEvent::MemberRemoved(m) if m.addr != node.addr => {
                    node.peers.remove(&m.addr);
                }
                ClusterEvent::Unreachable(_) => self.counters.unreachable_events += 1,
                _ => {}
            }
        }
        for j in hellos {
            self.hello(i, j);
        }
    }

    fn tick(&mut self, i: usize) {
        if !self.nodes[i].alive {
            return;
        }
        let now = self.at();
        let every = self.timings.heartbeat_interval;
        self.schedule(every, Event::Tick(i));
        let node = &mut self.nodes[i];
        let seq = node.clock.stamp(now);
        let out = node
            .detector
            .tick(now, seq, &mut node.view, &node.peers, false, &mut node.rng);
        self.apply(i, out.events);
        for o in out.heartbeats {
            let Some(&to) = self.index.get(&o.to) else {
                continue;
            };
            if self.nodes[i].greeted.insert((o.to.clone(), o.incarnation)) {
                self.hello(i, to);
            }
            if o.session_copy {
                let hb = o.heartbeat.clone();
                self.send(
                    i,
                    to,
                    Msg::Heartbeat {
                        hb,
                        datagram: false,
                    },
                );
            }
            self.send(
                i,
                to,
                Msg::Heartbeat {
                    hb: o.heartbeat,
                    datagram: true,
                },
            );
        }
        for (helper, probe) in out.probes {
            if let Some(&to) = self.index.get(&helper) {
                self.send(i, to, Msg::Probe(probe));
            }
        }
        self.resolve(i);
    }

    fn hello(&mut self, from: usize, to: usize) {
        let now = self.at();
        let clock = self.nodes[from].clock.stamp(now);
        self.send(from, to, Msg::Hello { clock });
    }

    fn deliver(&mut self, to: usize, from: usize, msg: Msg) {
        let now = self.at();
        let (from_addr, from_life) = (self.nodes[from].addr.clone(), self.nodes[from].incarnation);
        match msg {
            Msg::Hello { clock } => {
                let node = &mut self.nodes[to];
                node.clocks.hello(&from_addr, from_life, clock, now);
                node.detector.on_hello(&from_addr, now);
            }
            Msg::HelloPlease => {
                self.nodes[to]
                    .greeted
                    .insert((from_addr.clone(), from_life));
                self.hello(to, from);
            }
            Msg::Probe(probe) => {
                let node = &mut self.nodes[to];
                let next = node.detector.on_probe(probe, now, &node.view, &node.peers);
                if let Some((next_to, probe)) = next
                    && let Some(&j) = self.index.get(&next_to)
                {
                    self.send(to, j, Msg::Probe(probe));
                }
            }
            Msg::YouAreDown { age } => {
                let me = self.nodes[to].view.me();
                if self.nodes[to].up && me.status == MemberStatus::Up && me.age == age {
                    let why = format!(
                        "member {from_addr} downed this node: its side of a partition survived without it"
                    );
                    self.down_self(to, why);
                }
            }
            Msg::Heartbeat { hb, datagram } => {
                // A peer heartbeating under a membership this node downed is told (the
                // agent's sessions outlive the peer's place in the view).
                if hb.age != 0
                    && self.nodes[to]
                        .view
                        .was_downed(&hb.node, hb.incarnation, hb.age)
                {
                    self.send(to, from, Msg::YouAreDown { age: hb.age });
                    return;
                }
                let node = &mut self.nodes[to];
                if node.peers.get(&hb.node) != Some(&hb.incarnation) {
                    return;
                }
                let seq = match node.clocks.heartbeat(&hb.node, hb.incarnation, hb.seq, now) {
                    Freshness::Fresh { believed, .. } => believed,
                    Freshness::Stale => return,
                    Freshness::Unknown => {
                        self.send(to, from, Msg::HelloPlease);
                        return;
                    }
                };
                let clocks = &node.clocks;
                let events =
                    node.detector
                        .on_heartbeat(hb, seq, datagram, now, &mut node.view, |o, inc| {
                            clocks.ceiling(o, inc, now)
                        });
                self.apply(to, events);
            }
        }
    }

    /// The resolver's turn at node `i` (as the agent's [`crate::agent`] `resolve`).
    fn resolve(&mut self, i: usize) {
        let now = self.at();
        let node = &mut self.nodes[i];
        let stamp = node.clock.stamp(now);
        node.detector.update_own_row(now, stamp, &node.view);
        if node.attempt.is_some() {
            return;
        }
        let Some(decision) = node.detector.decide(now, &node.view) else {
            return;
        };
        match decision {
            Decision::Survive { down } => self.down_others(i, &down),
            Decision::DownSelf { why } => self.down_self(i, why),
            Decision::Lease {
                side,
                leader,
                delay,
                down_if_won,
            } => {
                let every = self.lease_retry();
                let give_up_after = self.timings.member_lease_ttl * 2;
                let node = &mut self.nodes[i];
                node.attempts += 1;
                let side: Vec<String> = side.iter().map(ToString::to_string).collect();
                let lease = "sim-sbr".to_string();
                let machine = if leader == node.addr {
                    resolver_attempt::Attempt::leader(lease, side, every, now + delay)
                } else {
                    resolver_attempt::Attempt::watcher(
                        lease,
                        side,
                        every,
                        give_up_after,
                        now + delay,
                    )
                };
                node.attempt = Some(Attempt {
                    id: node.attempts,
                    leader: leader == node.addr,
                    machine,
                    down_if_won,
                });
                let attempt = node.attempts;
                self.schedule(delay, Event::Lease { node: i, attempt });
            }
        }
    }

    fn lease_retry(&self) -> Duration {
        self.timings.heartbeat_interval
    }

    /// One step of a lease-majority attempt: the leader tries to acquire the resolver
    /// lease, the others read it; both feed what they see to the agent's machine and do
    /// what it says.
    fn lease_step(&mut self, i: usize, attempt: u64) {
        if !self.nodes[i].alive
            || self.nodes[i]
                .attempt
                .as_ref()
                .is_none_or(|a| a.id != attempt)
        {
            return;
        }
        let now = self.at();
        let ttl = self.timings.member_lease_ttl;
        let release_after = match self.sbr.as_ref().map(|s| &s.strategy) {
            Some(Strategy::LeaseMajority { release_after, .. }) => *release_after,
            _ => Duration::ZERO,
        };
        self.counters.store_requests += 1;
        let me = self.nodes[i].addr.to_string();
        let leader = self.nodes[i].attempt.as_ref().is_some_and(|a| a.leader);
        let free = self
            .store
            .sbr
            .as_ref()
            .is_none_or(|(_, _, until)| *until <= now);
        let next = if leader && free {
            self.store.sbr_tokens += 1;
            // The winner renews it until it releases it after `release-after`.
            self.store.sbr = Some((me, self.store.sbr_tokens, now + release_after + ttl));
            self.feed(i, Answer::Granted)
        } else {
            let mut next = if leader {
                self.feed(i, Answer::NotGranted { at: now })
            } else {
                Some(Next::Look(now))
            };
            if let Some(Next::Look(_)) = next {
                let look = self.read_sbr(now);
                next = self.feed(i, Answer::Looked(look));
            }
            next
        };
        match next {
            None => {}
            Some(Next::Done(Ok(Holder::Ours))) => {
                if let Some(a) = self.nodes[i].attempt.take() {
                    self.down_others(i, &a.down_if_won);
                }
            }
            Some(Next::Done(Ok(Holder::Theirs))) => {
                self.nodes[i].attempt = None;
                self.down_self(
                    i,
                    "lease-majority: the other side holds the resolver lease".into(),
                );
            }
            Some(Next::Done(Err(ResolverLeaseError::Unheld { .. }))) => {
                self.nodes[i].attempt = None;
                self.down_self(i, "lease-majority: nobody holds the resolver lease".into());
            }
            Some(Next::Done(Err(e))) => {
                self.nodes[i].attempt = None;
                self.down_self(
                    i,
                    format!("lease-majority: this side could not acquire the resolver lease: {e}"),
                );
            }
            Some(Next::Acquire(at) | Next::Look(at)) => {
                self.schedule(
                    at.saturating_duration_since(now),
                    Event::Lease { node: i, attempt },
                );
            }
        }
    }

    /// Feeds `answer` to node `i`'s lease-majority machine: what it says next (`None`: no
    /// attempt under way).
    fn feed(&mut self, i: usize, answer: Answer) -> Option<Next> {
        let a = self.nodes[i].attempt.as_mut()?;
        Some(a.machine.step(answer))
    }

    /// The simulated store's record of the resolver lease, read at `now`.
    fn read_sbr(&self, now: Instant) -> Look {
        let ttl = self.timings.member_lease_ttl;
        let record = self
            .store
            .sbr
            .as_ref()
            .filter(|(_, _, until)| *until > now)
            .map(|(owner, token, until)| LeaseRecord {
                name: "sim-sbr".into(),
                owner: owner.clone(),
                instance: String::new(),
                token: FencingToken::new(*token),
                // Its holder renews it until it lets it go: a read shows at most a ttl left.
                expires_in: until.saturating_duration_since(now).min(ttl),
                version: 1,
                note: None,
                priority: 0,
                cleanup_timeout: Duration::ZERO,
                request: None,
            });
        Look {
            record,
            sent: now,
            answered: now,
        }
    }

    fn down_others(&mut self, i: usize, down: &[NodeAddr]) {
        let mut downed = BTreeSet::new();
        let mut events = Vec::new();
        for addr in down {
            let e = self.nodes[i].view.down(addr);
            if !e.is_empty()
                && let Some(&j) = self.index.get(addr)
            {
                downed.insert(j);
            }
            events.extend(e);
        }
        let node = &mut self.nodes[i];
        match node.outcome.as_mut() {
            Some(Outcome::Survived(all)) => all.extend(downed),
            Some(Outcome::DownedSelf(_)) => {}
            None => node.outcome = Some(Outcome::Survived(downed)),
        }
        self.apply(i, events);
    }

    fn down_self(&mut self, i: usize, why: String) {
        let node = &mut self.nodes[i];
        node.outcome = Some(Outcome::DownedSelf(why));
        node.alive = false;
        // Its member lease is released as it stops.
        self.store.members.remove(&i);
        self.store.listing = None;
        self.counters.store_requests += 1;
    }

    /// The counters since `earlier`.
    pub fn counted_since(&self, earlier: &Counters) -> Counters {
        self.counters.minus(earlier)
    }
}
