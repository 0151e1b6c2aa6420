//! The shard region: one per node and entity type, the only remotable actor of the type.
//! It routes each message to the local shard, or to the region that hosts the shard on
//! another node, asking the coordinator where unknown shards live and keeping their
//! messages meanwhile (bounded). It hosts the shards the coordinator gives it, hands them
//! off on request, on leave, and when its node is down (the split brain resolver downed it,
//! or it lost its member lease).
//!
//! While a shard moves, no message is lost to routing: the coordinator tells every region
//! first (`BeginHandOff`), and each forgets the shard's home and keeps its messages until
//! the coordinator names the new one; the old host gives back what its shard had not
//! delivered, ahead of newer messages; and a region sent a message for a shard it does not
//! host asks the coordinator before passing it on, so two stale beliefs never bounce a
//! message between them.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent, pg};
use tenure_cluster::{ClusterEvent, HandOver, Member, MemberStatus, ReadinessGate};
use tenure_lease::{FencingToken, LeaseSpec};
use tenure_singleton::SingletonProxy;
use tokio::time::Instant;

use crate::active::ActiveEntities;
use crate::entity::{EntityFactory, EntityMsg};
use crate::messages::{
    AskReply, BeginHandOff, BeginHandOffs, CoordinatorMsg, Envelope, Envelopes, GetShardHome,
    HandOff, HandOffBegun, HandOffDone, HandOffsBegun, HostShard, Pending, RegionLocal, RegionMsg,
    RegionSnapshot, RegisterAgain, RegisterChanges, ShardHome, ShardHomes, Vacated, Vacating,
    ask_expired, refuse_buffer_full,
};
use crate::settings::ShardingSettings;
use crate::shard::{HandedOff, Shard, ShardArgs, ShardMsg};

/// Regions a message may pass through before it is dropped (homes change while it travels).
const MAX_HOPS: u8 = 8;

/// The pg group of the region of `type_name` on node `addr`.
pub fn region_group(type_name: &str, addr: &str) -> String {
    format!("sharding/{type_name}/region@{addr}")
}

/// The region of `type_name` on node `addr`, if this node sees it.
pub fn region_ref(scope: &str, type_name: &str, addr: &str) -> Option<ActorRef<RegionMsg>> {
    pg::get_scoped_members(&scope.to_string(), &region_group(type_name, addr))
        .into_iter()
        .next()
        .map(ActorRef::from)
}

/// What a region runs with.
pub struct RegionArgs {
    /// The entity type.
    pub type_name: String,
    /// This node (`host:port`).
    pub me: String,
    /// The cluster's pg scope.
    pub scope: String,
    /// The `[tenure] system` name (prefix of the lease names).
    pub system: String,
    /// The entity type's sharding settings.
    pub settings: Arc<ShardingSettings>,
    /// Entities and the lease template of shards (store, timing, renewal batcher);
    /// `None`: proxy-only, this node hosts no shard of the type.
    pub hosting: Option<(EntityFactory, LeaseSpec)>,
    /// Reaches the entity type's coordinator singleton.
    pub coordinator: SingletonProxy<CoordinatorMsg>,
    /// The local fast path to entities, shared with the region's handles: its shards open
    /// and close their entities' routes.
    pub routes: Arc<crate::Routes>,
    /// This region's condition of its node's readiness: open once a coordinator answered
    /// its registration (with the shard homes it knows), closed while leaving or down.
    pub readiness: ReadinessGate,
}

/// The region actor.
pub struct Region;

/// A message waiting in the region for its shard's home, since `since`: an ask is dropped
/// once its own timeout has passed since then (its caller no longer waits).
struct Waiting {
    p: Pending,
    since: Instant,
}

impl Waiting {
    fn expired(&self) -> bool {
        ask_expired(self.p.reply.as_ref(), self.since)
    }
}

pub struct RegionState {
    args: RegionArgs,
    myself: ActorRef<RegionMsg>,
    shards: HashMap<String, ActorRef<ShardMsg>>,
    /// The entities its shards run, when the type has an `active-entity-limit`.
    active: Option<ActiveEntities>,
    /// Shards handing off: a new instance of one starts only once the old one terminated
    /// (its lease released or lapsed), so that one node never runs two copies of a shard.
    stopping: HashMap<String, ActorRef<ShardMsg>>,
    homes: HashMap<String, String>,
    /// Messages waiting for their shard's home, per shard, in arrival order; each shard's
    /// queue is bounded by `buffer-size` on its own, so that shards whose home stays
    /// unknown never crowd out the others.
    pending: HashMap<String, VecDeque<Waiting>>,
    pending_count: usize,
    /// Tells refused because their shard's buffer was full (each is logged).
    dropped_tells: u64,
    asked: HashMap<String, Instant>,
    /// Shards whose home this region knew and lost (that node became unreachable or went
    /// down): their home is asked every tick until the coordinator names one, so that they
    /// start again elsewhere without waiting for a message. A coordinator that failed over
    /// with their node does not know them otherwise: their leases lapsed before it listed
    /// them.
    orphans: BTreeSet<String>,
    members: BTreeMap<String, Member>,
    leaving: bool,
    down: bool,
    /// A coordinator answered a registration of this region (with every shard home it
    /// knew): it serves from then on, through coordinator fail-overs (messages wait for a
    /// new coordinator in the buffer), until this node leaves or goes down.
    acknowledged: bool,
    /// Whether the readiness gate was last set open.
    gate_open: bool,
    /// The newest coordinator heard from (its lease's fencing token).
    coordinator: FencingToken,
    /// The last registration sent, the base of the next one's changes; `None`: the next
    /// one names every shard.
    registered: Option<Registered>,
    /// The number of the last registration sent.
    registrations: u64,
    timer: Option<ractor::concurrency::JoinHandle<()>>,
    /// Hand-offs of local shards whose outcome has not come back yet.
    handoffs: usize,
    /// Messages forwarded to other regions so far.
    forwarded: u64,
    /// Asks of other nodes relayed to a third one whose answer has not passed yet (it comes
    /// back through this node).
    relays: usize,
    /// Nodes whose regions left (they said so with `Vacate`): never taken as a home.
    vacated: HashSet<String>,
    /// This node is leaving: the guard that holds its exit until the region vacated.
    leave: Option<Leave>,
    /// The regions of other nodes found so far, by node: forwarding looks a region up in the
    /// process-wide `pg` groups only when it has none for the node, or the one it has stopped
    /// (its node left, or it was replaced).
    regions: HashMap<String, ActorRef<RegionMsg>>,
    buffer_gauge: crate::metrics::RegionBuffer,
}

/// A registration sent to a coordinator instance: its number and the shards it reported.
struct Registered {
    to: ractor::ActorId,
    seq: u64,
    shards: BTreeSet<String>,
}

/// A graceful leave in progress. The node exits only once no accepted message depends on
/// it: its shards are handed off, everything they and the region kept went on to the new
/// homes, relayed asks were answered, and every other region stopped sending here and
/// received what this one forwarded to it (a round of `Vacate` that began with nothing left
/// to forward and saw nothing forwarded meanwhile).
struct Leave {
    _guard: HandOver,
    /// A round of `Vacate` is under way.
    round: bool,
    /// `forwarded` when the last finished round began.
    clean_from: Option<u64>,
}

impl Actor for Region {
    type Msg = RegionMsg;
    type State = RegionState;
    type Arguments = RegionArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<RegionMsg>,
        args: RegionArgs,
    ) -> Result<RegionState, ActorProcessingErr> {
        pg::join_scoped(
            args.scope.clone(),
            region_group(&args.type_name, &args.me),
            vec![myself.get_cell()],
        );
        let timer = myself.send_interval(args.settings.retry_interval, || {
            RegionMsg::Local(RegionLocal::Tick)
        });
        let buffer_gauge = crate::metrics::RegionBuffer::new(&args.type_name);
        Ok(RegionState {
            active: args.settings.active_entity_limit.map(ActiveEntities::new),
            args,
            myself,
            shards: HashMap::new(),
            stopping: HashMap::new(),
            homes: HashMap::new(),
            pending: HashMap::new(),
            pending_count: 0,
            dropped_tells: 0,
            asked: HashMap::new(),
            orphans: BTreeSet::new(),
            members: BTreeMap::new(),
            leaving: false,
            down: false,
            acknowledged: false,
            gate_open: false,
            coordinator: FencingToken::new(0),
            registered: None,
            registrations: 0,
            timer: Some(timer),
            handoffs: 0,
            forwarded: 0,
            relays: 0,
            vacated: HashSet::new(),
            leave: None,
            regions: HashMap::new(),
            buffer_gauge,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<RegionMsg>,
        state: &mut RegionState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(t) = state.timer.take() {
            t.abort();
        }
        state.args.readiness.close("the region stopped");
        state.args.routes.close_remote_node(None);
        // Stop the shards before the region's exit kills them without their post_stop.
        for (_, shard) in state.shards.drain() {
            let _ = shard
                .stop_and_wait(None, Some(state.args.settings.stop_timeout * 2))
                .await;
        }
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<RegionMsg>,
        msg: RegionMsg,
        state: &mut RegionState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RegionMsg::Deliver(env) => {
                state
                    .route(Pending {
                        env,
                        reply: None,
                        ticket: None,
                    })
                    .await
            }
            RegionMsg::Ask(env, reply) => {
                state
                    .route(Pending {
                        env,
                        reply: Some(reply),
                        ticket: None,
                    })
                    .await
            }
            RegionMsg::Local(RegionLocal::Route(p)) => state.route(p).await,
            RegionMsg::Local(RegionLocal::RouteAll(ps)) => state.route_all(ps).await,
            RegionMsg::DeliverAll(Envelopes { envelopes }) => {
                let ps = envelopes.into_iter().map(|env| Pending {
                    env,
                    reply: None,
                    ticket: None,
                });
                state.route_all(ps.collect()).await
            }
            RegionMsg::Homes(ShardHomes {
                host,
                homes,
                coordinator,
            }) => {
                if state.current(coordinator, "(a wave of allocations)") {
                    state.acknowledged |= state.registered.is_some();
                    for shard in host {
                        state.settle(&shard, Some(state.args.me.clone())).await;
                    }
                    for (shard, home) in homes {
                        state.settle(&shard, home).await;
                    }
                }
            }
            RegionMsg::RegisterAll(RegisterAgain { coordinator }) => {
                if state.current(coordinator, "(a registration)") {
                    state.registered = None;
                    state.register().await;
                }
            }
            RegionMsg::BeginHandOffShards(
                BeginHandOffs {
                    shards,
                    coordinator,
                },
                reply,
            ) => {
                // As BeginHandOffShard, for a round of moves.
                if state.current(coordinator, "(a rebalance round)") {
                    for shard in &shards {
                        state.forget_home(shard);
                    }
                }
                let _ = reply.send(HandOffsBegun {
                    region: state.args.me.clone(),
                });
            }
            RegionMsg::Host(HostShard { shard, coordinator }) => {
                if state.current(coordinator, &shard) {
                    state.settle(&shard, Some(state.args.me.clone())).await
                }
            }
            RegionMsg::Home(ShardHome {
                shard,
                home,
                coordinator,
            }) => {
                if state.current(coordinator, &shard) {
                    state.settle(&shard, home).await
                }
            }
            RegionMsg::BeginHandOffShard(BeginHandOff { shard, coordinator }, reply) => {
                // Messages for it wait here from now on, until the coordinator names its
                // next home; a local shard keeps serving until its HandOff.
                if state.current(coordinator, &shard) {
                    state.forget_home(&shard);
                }
                let _ = reply.send(HandOffBegun {
                    shard,
                    region: state.args.me.clone(),
                });
            }
            RegionMsg::Vacate(Vacating { node }, reply) => {
                if node != state.args.me {
                    state.homes.retain(|_, h| *h != node);
                    state.forget_region(&node);
                    state.vacated.insert(node);
                }
                let _ = reply.send(Vacated {
                    region: state.args.me.clone(),
                });
            }
            RegionMsg::Local(RegionLocal::Relayed) => {
                state.relays = state.relays.saturating_sub(1);
            }
            RegionMsg::Local(RegionLocal::Vacated { forwarded }) => {
                if let Some(leave) = &mut state.leave {
                    leave.round = false;
                    leave.clean_from = Some(forwarded);
                }
            }
            RegionMsg::HandOffShard(HandOff { shard, coordinator }, reply) => {
                if !state.current(coordinator, &shard) {
                    let _ = reply.send(HandOffDone {
                        shard,
                        released: false,
                    });
                    return Ok(());
                }
                state.forget_home(&shard);
                match state.shards.remove(&shard) {
                    Some(actor) => {
                        state.hand_off(shard, actor, Some(reply));
                    }
                    None => {
                        let _ = reply.send(HandOffDone {
                            shard,
                            released: true,
                        });
                    }
                }
            }
            RegionMsg::Local(RegionLocal::HandedOff {
                shard,
                released,
                undelivered,
                reply,
            }) => {
                state.handoffs = state.handoffs.saturating_sub(1);
                state.take_back(&shard, undelivered).await;
                if let Some(reply) = reply {
                    let _ = reply.send(HandOffDone { shard, released });
                }
            }
            RegionMsg::Local(RegionLocal::Tick) => state.tick().await,
            RegionMsg::Local(RegionLocal::Snapshot(reply)) => {
                let _ = reply.send(RegionSnapshot {
                    shards: state
                        .shards
                        .iter()
                        .map(|(id, s)| (id.clone(), s.clone()))
                        .collect(),
                    homes: state
                        .homes
                        .iter()
                        .map(|(id, h)| (id.clone(), h.clone()))
                        .collect(),
                    waiting: state
                        .pending
                        .iter()
                        .map(|(id, q)| (id.clone(), q.len()))
                        .collect(),
                    dropped_tells: state.dropped_tells,
                });
            }
            RegionMsg::Local(RegionLocal::Cluster(event)) => state.on_cluster(event).await,
        }
        state.vacate();
        state.update_readiness();
        state.buffer_gauge.set(state.pending_count);
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<RegionMsg>,
        event: SupervisionEvent,
        state: &mut RegionState,
    ) -> Result<(), ActorProcessingErr> {
        if let SupervisionEvent::ActorTerminated(cell, ..)
        | SupervisionEvent::ActorFailed(cell, _) = &event
        {
            state.shards.retain(|_, s| s.get_id() != cell.get_id());
            state.stopping.retain(|_, s| s.get_id() != cell.get_id());
        }
        Ok(())
    }
}

impl RegionState {
    /// Opens or closes the readiness gate as the region's state says.
    fn update_readiness(&mut self) {
        let why = if self.leaving {
            Some("leaving: handing its shards off")
        } else if self.down {
            Some("this node is down")
        } else if !self.acknowledged {
            Some("not registered with a coordinator yet (no shard homes known)")
        } else {
            None
        };
        if why.is_none() != self.gate_open {
            self.gate_open = why.is_none();
            match why {
                None => self.args.readiness.open(),
                Some(why) => self.args.readiness.close(why),
            }
        }
    }

    fn can_host(&self) -> bool {
        self.args.hosting.is_some() && !self.leaving && !self.down
    }

    fn hand_off_wait(&self) -> Duration {
        let settings = &self.args.settings;
        // With remember-entities, the shard also waits for its remembered ids' writes.
        let flush = if settings.remember_entities {
            settings.lease.lease_operation_timeout * 2
        } else {
            Duration::ZERO
        };
        // An entity that outlives its kill holds the answer up to hand-off-timeout.
        let stop = (settings.stop_timeout * 2).max(settings.hand_off_timeout);
        stop + settings.lease.release_answer_timeout() + flush
    }

    /// Routes a message that just arrived (from a local sender, or from another region).
    async fn route(&mut self, p: Pending) {
        if p.env.hops > MAX_HOPS {
            tracing::warn!(entity_type = %self.args.type_name, shard = %p.env.shard, entity = %p.env.entity,
                "message dropped: it went through too many regions while the shard moved");
            AskReply::fail(p.reply, format!("shard {}: no stable home", p.env.shard));
            return;
        }
        if p.env.hops > 0 && !self.shards.contains_key(&p.env.shard) {
            // Sent here by a region that believes this node hosts the shard, but it does
            // not: this region's own belief may be just as stale, so it learns the home
            // from the coordinator before passing the message on (two stale beliefs would
            // bounce it back and forth).
            self.forget_home(&p.env.shard);
        }
        self.dispatch(p).await;
    }

    /// Sends `p` to its shard: the local one, or the region of its home as this region
    /// knows it; keeps it (asking the coordinator) while the home is unknown.
    async fn dispatch(&mut self, p: Pending) {
        if let Some(shard) = self.shards.get(&p.env.shard) {
            let mut p = p;
            // No ticket: from another node, or given back by a shard of this one. Straight
            // into its entity's mailbox when this node's direct route to it is open (see
            // [`crate::Routes`]: never ahead of a message still on the routed path,
            // whichever node sent it). One whose sender maps the entity to another shard
            // goes to the shard, which refuses it.
            if p.ticket.is_none()
                && crate::entity::shard_of(&p.env.entity, self.args.settings.number_of_shards)
                    == p.env.shard
            {
                let msg = EntityMsg {
                    payload: std::mem::take(&mut p.env.payload),
                    reply: p.reply.take(),
                };
                match self.args.routes.send(&p.env.entity, msg) {
                    Ok(()) => return,
                    Err((msg, ticket)) => {
                        p.env.payload = msg.payload;
                        p.reply = msg.reply;
                        p.ticket = Some(ticket);
                    }
                }
            }
            let _ = shard.cast(ShardMsg::Routed(p));
            return;
        }
        let region = match self.homes.get(&p.env.shard) {
            // Ours but not running (stopped meanwhile): find out again.
            Some(home) if *home == self.args.me => None,
            Some(home) => region_of(&mut self.regions, &self.args, home),
            None => return self.wait(p).await,
        };
        let Some(region) = region else {
            self.forget_home(&p.env.shard);
            return self.wait(p).await;
        };
        let p = self.relay(p);
        let shard = p.env.shard.clone();
        match forward(region.clone(), p) {
            Ok(()) => {
                self.forwarded += 1;
                // The shard's next messages from this node's handles may go there directly
                // (see [`crate::Routes`]), except while this node leaves or is down: then
                // all of them pass here, counted by the leave.
                if !self.leaving
                    && !self.down
                    && let Some(home) = self.homes.get(&shard)
                {
                    self.args.routes.open_remote(&shard, home, &region);
                }
            }
            Err(p) => {
                if let Some(home) = self.forget_home(&p.env.shard) {
                    self.forget_region(&home);
                }
                self.wait(p).await;
            }
        }
    }

    /// Forgets the region of node `node` (gone, replaced, or refusing a forward): the next
    /// forward there looks it up again, and no handle sends to it directly meanwhile.
    fn forget_region(&mut self, node: &str) {
        self.regions.remove(node);
        self.args.routes.close_remote_node(Some(node));
    }

    /// Forgets where `shard` lives (its messages wait here until the coordinator names a
    /// home), closing its remote route; the home it had, if any.
    fn forget_home(&mut self, shard: &str) -> Option<String> {
        self.args.routes.close_remote(shard);
        self.homes.remove(shard)
    }

    /// An ask of another node (it passed through a region) about to go to a third one: its
    /// answer will pass through this node, so the region counts it until it has passed (a
    /// leaving node waits for it).
    fn relay(&mut self, mut p: Pending) -> Pending {
        if p.env.hops == 0 {
            return p;
        }
        let Some(port) = p.reply.take() else {
            return p;
        };
        let timeout = port.get_timeout();
        let (tx, rx) = ractor::concurrency::oneshot();
        p.reply = Some(match timeout {
            Some(t) => (tx, t).into(),
            None => tx.into(),
        });
        self.relays += 1;
        let region = self.myself.clone();
        tokio::spawn(async move {
            let answer = match timeout {
                Some(t) => tokio::time::timeout(t, rx).await.ok().and_then(Result::ok),
                None => rx.await.ok(),
            };
            if let Some(answer) = answer {
                let _ = port.send(answer);
            }
            let _ = region.cast(RegionMsg::Local(RegionLocal::Relayed));
        });
        p
    }

    /// Routes tells that travel together (see [`RegionLocal::RouteAll`]): those for shards
    /// of another node go there in one message, the others as [`route`](Self::route) sends
    /// them.
    async fn route_all(&mut self, ps: Vec<Pending>) {
        let mut out: BTreeMap<String, Vec<Pending>> = BTreeMap::new();
        for p in ps {
            let shard = &p.env.shard;
            if p.reply.is_some() || p.env.hops > MAX_HOPS || self.shards.contains_key(shard) {
                self.route(p).await;
                continue;
            }
            if p.env.hops > 0 {
                // As in `route`: its sender believed the shard lives here.
                self.forget_home(shard);
            }
            match self.homes.get(shard) {
                Some(home) if *home != self.args.me => out.entry(home.clone()).or_default().push(p),
                _ => self.dispatch(p).await,
            }
        }
        for (home, ps) in out {
            let Some(region) = region_of(&mut self.regions, &self.args, &home) else {
                for p in ps {
                    self.forget_home(&p.env.shard);
                    self.wait(p).await;
                }
                continue;
            };
            match forward_all(region, ps) {
                Ok(n) => self.forwarded += n,
                Err(ps) => {
                    self.forget_region(&home);
                    for p in ps {
                        self.forget_home(&p.env.shard);
                        self.wait(p).await;
                    }
                }
            }
        }
    }

    /// Keeps a message until its shard's home is known, asking the coordinator; refuses it
    /// when the shard's buffer is full.
    async fn wait(&mut self, p: Pending) {
        let capacity = self.args.settings.buffer_size;
        if self.pending.get(&p.env.shard).map_or(0, VecDeque::len) >= capacity {
            let Pending { env, reply, .. } = p;
            if refuse_buffer_full(
                &self.args.type_name,
                &env.shard,
                &env.entity,
                capacity,
                reply,
            ) {
                self.dropped_tells += 1;
            }
            return;
        }
        let shard = p.env.shard.clone();
        self.pending
            .entry(shard.clone())
            .or_default()
            .push_back(Waiting {
                p,
                since: Instant::now(),
            });
        self.pending_count += 1;
        self.ask_home(&shard).await;
    }

    async fn ask_home(&mut self, shard: &str) {
        if self
            .asked
            .get(shard)
            .is_some_and(|t| t.elapsed() < self.args.settings.retry_interval)
        {
            return;
        }
        if let Some(c) = self.args.coordinator.instance().await {
            let _ = c.cast(CoordinatorMsg::GetHome(GetShardHome {
                shard: shard.to_string(),
                region: self.args.me.clone(),
            }));
            self.asked.insert(shard.to_string(), Instant::now());
        }
    }

    /// The coordinator said where `shard` lives (`Host` means here).
    async fn settle(&mut self, shard: &str, home: Option<String>) {
        self.asked.remove(shard);
        let Some(home) = home else {
            return;
        };
        // A home this node no longer counts as a member (the coordinator has not seen it
        // go yet): its messages keep waiting here, and the home is asked again next tick.
        let member = home == self.args.me
            || (!self.vacated.contains(&home)
                && self
                    .members
                    .get(&home)
                    .is_some_and(|m| matches!(m.status, MemberStatus::Up | MemberStatus::Leaving)));
        if !member {
            tracing::debug!(entity_type = %self.args.type_name, shard, home, "the coordinator named a home that is not a member here; asking again");
            return;
        }
        if home == self.args.me && !self.start_shard(shard).await {
            return;
        }
        self.orphans.remove(shard);
        // A route to a former home closes; one to this home opens at the next forward.
        self.args.routes.close_remote(shard);
        self.homes.insert(shard.to_string(), home);
        if let Some(waiting) = self.pending.remove(shard) {
            self.pending_count -= waiting.len();
            // Straight to the home just learned: these already passed the check of route.
            for w in waiting {
                self.dispatch(w.p).await;
            }
        }
    }

    /// Messages a local shard gave back on hand-off: they go to the shard's next home
    /// ahead of those that arrived since (kept even beyond `buffer-size`: they were
    /// accepted already).
    async fn take_back(&mut self, shard: &str, undelivered: Vec<Pending>) {
        if undelivered.is_empty() {
            return;
        }
        self.pending_count += undelivered.len();
        let queue = self.pending.entry(shard.to_string()).or_default();
        let since = Instant::now();
        for p in undelivered.into_iter().rev() {
            queue.push_front(Waiting { p, since });
        }
        if self.homes.contains_key(shard) || self.shards.contains_key(shard) {
            // The home is known again already (the hand-off answer came late).
            if let Some(waiting) = self.pending.remove(shard) {
                self.pending_count -= waiting.len();
                for w in waiting {
                    self.dispatch(w.p).await;
                }
            }
        } else {
            self.ask_home(shard).await;
        }
    }

    /// Hands the local shard `shard` off: it stops (a new instance may start here only
    /// once it terminated), and what it had not delivered comes back to this region.
    fn hand_off(
        &mut self,
        shard: String,
        actor: ActorRef<ShardMsg>,
        reply: Option<RpcReplyPort<HandOffDone>>,
    ) {
        self.stopping.insert(shard.clone(), actor.clone());
        self.handoffs += 1;
        let timeout = self.hand_off_wait();
        let region = self.myself.clone();
        tokio::spawn(async move {
            let (released, undelivered) = match actor.call(ShardMsg::HandOff, Some(timeout)).await {
                Ok(ractor::rpc::CallResult::Success(HandedOff {
                    released,
                    undelivered,
                })) => (released, undelivered),
                _ => {
                    tracing::warn!(
                        shard,
                        "the shard did not confirm its hand-off in time; messages it kept are lost (asks fail)"
                    );
                    (false, Vec::new())
                }
            };
            let _ = region.cast(RegionMsg::Local(RegionLocal::HandedOff {
                shard,
                released,
                undelivered,
                reply,
            }));
        });
    }

    /// Starts the local shard `shard` if it is not running; `false` if this region cannot
    /// host it.
    async fn start_shard(&mut self, shard: &str) -> bool {
        if self.shards.contains_key(shard) {
            return true;
        }
        if !self.can_host() || self.stopping.contains_key(shard) {
            return false;
        }
        let Some((factory, template)) = &self.args.hosting else {
            return false;
        };
        let name = tenure_lease::names::shard_lease(&self.args.system, &self.args.type_name, shard);
        let lease = match template.renamed(&name) {
            Ok(spec) => spec,
            Err(e) => {
                tracing::error!(entity_type = %self.args.type_name, shard, error = %e, "bad shard lease");
                return false;
            }
        };
        let args = ShardArgs {
            type_name: self.args.type_name.clone(),
            shard_id: shard.to_string(),
            node: self.args.me.clone(),
            lease,
            factory: factory.clone(),
            active: self.active.clone(),
            settings: self.args.settings.clone(),
            process_end: tenure_lease::ProcessEnd::abort(),
        };
        match Shard::start_routed(args, Some(self.myself.get_cell()), self.args.routes.clone())
            .await
        {
            Ok(actor) => {
                self.shards.insert(shard.to_string(), actor);
                true
            }
            Err(e) => {
                tracing::error!(entity_type = %self.args.type_name, shard, error = %e, "cannot start a shard");
                false
            }
        }
    }

    /// Whether a coordinator message with `token` comes from the newest coordinator heard
    /// from (which it then is); an older one's is ignored and logged.
    fn current(&mut self, token: FencingToken, shard: &str) -> bool {
        if token < self.coordinator {
            tracing::info!(entity_type = %self.args.type_name, shard, token = token.get(), newest = self.coordinator.get(),
                "ignoring a message from an older coordinator");
            return false;
        }
        self.coordinator = token;
        true
    }

    /// Registers with the coordinator: the changes to its shards since the last
    /// registration, or all of them to a coordinator instance it has not registered with
    /// (or that asked for all).
    async fn register(&mut self) {
        let Some(c) = self.args.coordinator.instance().await else {
            return;
        };
        let shards: BTreeSet<String> = self.shards.keys().cloned().collect();
        self.registrations += 1;
        let (base, added, removed) = match &self.registered {
            Some(r) if r.to == c.get_id() => (
                Some(r.seq),
                shards.difference(&r.shards).cloned().collect(),
                r.shards.difference(&shards).cloned().collect(),
            ),
            _ => (None, shards.iter().cloned().collect(), Vec::new()),
        };
        let sent = c.cast(CoordinatorMsg::RegisterChanges(RegisterChanges {
            region: self.args.me.clone(),
            seq: self.registrations,
            base,
            added,
            removed,
            available: self.can_host(),
        }));
        self.registered = sent.is_ok().then(|| Registered {
            to: c.get_id(),
            seq: self.registrations,
            shards,
        });
    }

    async fn tick(&mut self) {
        self.register().await;
        self.drop_expired_asks();
        let mut asking: BTreeSet<String> = self.pending.keys().cloned().collect();
        if !self.down && !self.leaving {
            asking.extend(self.orphans.iter().cloned());
        }
        for shard in asking {
            self.ask_home(&shard).await;
        }
    }

    /// Forgets the homes on `addr` (unreachable or gone), keeping their shards as orphans
    /// whose home is asked again.
    fn lose_homes_on(&mut self, addr: &str) {
        self.args.routes.close_remote_node(Some(addr));
        let orphans = &mut self.orphans;
        self.homes.retain(|shard, h| {
            let lost = h == addr;
            if lost {
                orphans.insert(shard.clone());
            }
            !lost
        });
    }

    /// Gives up every message kept for a home: asks fail with `why`, tells are counted and
    /// logged as dropped.
    fn refuse_pending(&mut self, why: &str) {
        for (shard, queue) in self.pending.drain() {
            for w in queue {
                let Pending { env, reply, .. } = w.p;
                match reply {
                    Some(_) => AskReply::fail(reply, format!("shard {shard}: {why}")),
                    None => {
                        self.dropped_tells += 1;
                        crate::metrics::tell_dropped(&self.args.type_name);
                        tracing::warn!(entity_type = %self.args.type_name, shard, entity = %env.entity, why, "tell dropped");
                    }
                }
            }
        }
        self.pending_count = 0;
    }

    /// Forgets waiting asks whose caller stopped waiting (its timeout passed, or it went
    /// away), so that no ask is kept forever and none holds buffer space. Their callers
    /// have had their timeout error already.
    fn drop_expired_asks(&mut self) {
        let mut dropped = 0;
        let type_name = &self.args.type_name;
        self.pending.retain(|shard, queue| {
            queue.retain(|w| {
                let expired = w.expired();
                if expired {
                    dropped += 1;
                    tracing::debug!(entity_type = %type_name, shard, entity = %w.p.env.entity,
                        "expired ask dropped: its shard's home is still unknown");
                }
                !expired
            });
            !queue.is_empty()
        });
        self.pending_count -= dropped;
    }

    async fn on_cluster(&mut self, event: ClusterEvent) {
        match event {
            ClusterEvent::CurrentMembers(members) => {
                self.members = members
                    .into_iter()
                    .map(|m| (m.addr.to_string(), m))
                    .collect();
            }
            ClusterEvent::MemberJoined(m) | ClusterEvent::MemberUp(m) => {
                // A node back at a vacated address is a new incarnation (with a new region).
                let addr = m.addr.to_string();
                self.vacated.remove(&addr);
                self.forget_region(&addr);
                self.members.insert(addr, m);
            }
            ClusterEvent::MemberLeaving(m) | ClusterEvent::Reachable(m) => {
                self.members.insert(m.addr.to_string(), m);
            }
            ClusterEvent::Unreachable(m) => {
                let addr = m.addr.to_string();
                self.lose_homes_on(&addr);
                self.members.insert(addr, m);
            }
            ClusterEvent::MemberDown(m) | ClusterEvent::MemberRemoved(m) => {
                let addr = m.addr.to_string();
                self.lose_homes_on(&addr);
                self.forget_region(&addr);
                self.vacated.remove(&addr);
                if addr == self.args.me {
                    self.members.insert(addr, m);
                } else {
                    self.members.remove(&addr);
                }
            }
            ClusterEvent::SelfDown => {
                tracing::warn!(entity_type = %self.args.type_name, "this node is down: stopping its shards");
                self.down = true;
                self.acknowledged = false;
                self.args.routes.close_remote_node(None);
                self.hand_off_all();
            }
            ClusterEvent::SelfLeaving(guard) => {
                self.leaving = true;
                self.args.routes.close_remote_node(None);
                self.leave = Some(Leave {
                    _guard: guard,
                    round: false,
                    clean_from: None,
                });
                self.hand_off_all();
                self.tick().await;
            }
        }
        if self
            .members
            .get(&self.args.me)
            .is_some_and(|m| m.status == MemberStatus::Up)
        {
            self.down = false;
        }
    }

    /// Hands every local shard off (entities stopped, leases released).
    fn hand_off_all(&mut self) {
        let shards: Vec<(String, ActorRef<ShardMsg>)> = self.shards.drain().collect();
        let me = self.args.me.clone();
        self.homes.retain(|_, h| *h != me);
        for (id, s) in shards {
            self.hand_off(id, s, None);
        }
    }

    /// A leaving region's next step: once it hosts, keeps and relays nothing, a round of
    /// `Vacate` to every other region of its type; the leave may go on (the guard is
    /// dropped) after a round that began that way and saw nothing forwarded meanwhile.
    fn vacate(&mut self) {
        if self.leave.is_none() {
            return;
        }
        let me = self.args.me.clone();
        let successor = self
            .members
            .iter()
            .any(|(addr, m)| *addr != me && m.status == MemberStatus::Up);
        if !successor {
            // Every member is leaving or gone (the cluster is shutting down): no shard can
            // have a next home, so nothing kept here can be delivered.
            self.refuse_pending("no member is left up to host it: the cluster is leaving");
            if self.shards.is_empty() && self.handoffs == 0 {
                tracing::info!(entity_type = %self.args.type_name, "region left with the rest of the cluster");
                self.leave = None;
            }
            return;
        }
        let idle = self.shards.is_empty()
            && self.handoffs == 0
            && self.pending.is_empty()
            && self.relays == 0;
        let Some(leave) = &mut self.leave else {
            return;
        };
        if leave.round || !idle {
            return;
        }
        if leave.clean_from == Some(self.forwarded) {
            tracing::info!(entity_type = %self.args.type_name, "region vacated: no message here depends on this node any more");
            self.leave = None;
            return;
        }
        leave.round = true;
        let forwarded = self.forwarded;
        let others: Vec<ActorRef<RegionMsg>> = self
            .members
            .keys()
            .filter(|addr| **addr != me)
            .filter_map(|addr| region_ref(&self.args.scope, &self.args.type_name, addr))
            .collect();
        // Bounded: a region that does not answer (its node unreachable) holds the leave no
        // longer than this, and the node's leave-timeout bounds the whole leave.
        let bound = self.args.settings.retry_interval * 4;
        let region = self.myself.clone();
        tokio::spawn(async move {
            let calls = others.into_iter().map(|other| {
                let node = me.clone();
                async move {
                    other
                        .call(|r| RegionMsg::Vacate(Vacating { node }, r), Some(bound))
                        .await
                }
            });
            futures::future::join_all(calls).await;
            let _ = region.cast(RegionMsg::Local(RegionLocal::Vacated { forwarded }));
        });
    }
}

/// The region of node `home` (for `args`' type): the one in `found` while it runs, else the
/// one its `pg` group holds now (then kept in `found`).
fn region_of(
    found: &mut HashMap<String, ActorRef<RegionMsg>>,
    args: &RegionArgs,
    home: &str,
) -> Option<ActorRef<RegionMsg>> {
    if let Some(region) = found.get(home)
        && region.get_status() == ractor::ActorStatus::Running
    {
        return Some(region.clone());
    }
    let region = region_ref(&args.scope, &args.type_name, home);
    match &region {
        Some(r) => found.insert(home.to_string(), r.clone()),
        None => found.remove(home),
    };
    region
}

/// Sends `p` on to another node's region. An ask travels with its reply port (the answer
/// comes back through this node's session), so asks and tells to one region leave in the
/// order they were routed.
/// `Err` gives `p` back when that region has stopped.
/// A message sent on this node gives up its ticket once it left (see [`crate::Routes`]).
// The message comes back whole on the (rare) error path: boxing it would cost every
// forward an allocation.
#[allow(clippy::result_large_err)]
fn forward(region: ActorRef<RegionMsg>, mut p: Pending) -> Result<(), Pending> {
    p.env.hops += 1;
    let ticket = p.ticket.take();
    let msg = match p.reply {
        None => RegionMsg::Deliver(p.env),
        Some(port) => RegionMsg::Ask(p.env, port),
    };
    match region.cast(msg) {
        Ok(()) => Ok(()),
        Err(ractor::MessagingErr::SendErr(RegionMsg::Deliver(mut env))) => {
            env.hops -= 1;
            Err(Pending {
                env,
                reply: None,
                ticket,
            })
        }
        Err(ractor::MessagingErr::SendErr(RegionMsg::Ask(mut env, port))) => {
            env.hops -= 1;
            Err(Pending {
                env,
                reply: Some(port),
                ticket,
            })
        }
        Err(e) => {
            // Not a send error with the message back: it is gone (an ask's port with it,
            // so its asker gets an error at once).
            tracing::warn!(error = %e, "message lost forwarding it to another region");
            Ok(())
        }
    }
}

/// Sends tells on to another node's region in one message (see [`forward`]); how many.
/// `Err` gives them back when that region has stopped.
fn forward_all(region: ActorRef<RegionMsg>, ps: Vec<Pending>) -> Result<u64, Vec<Pending>> {
    let n = ps.len() as u64;
    let (envelopes, tickets): (Vec<Envelope>, Vec<Option<crate::direct::Ticket>>) = ps
        .into_iter()
        .map(|mut p| {
            p.env.hops += 1;
            (p.env, p.ticket)
        })
        .unzip();
    match region.cast(RegionMsg::DeliverAll(Envelopes { envelopes })) {
        Ok(()) => Ok(n),
        Err(ractor::MessagingErr::SendErr(RegionMsg::DeliverAll(Envelopes { envelopes }))) => {
            Err(envelopes
                .into_iter()
                .zip(tickets)
                .map(|(mut env, ticket)| {
                    env.hops -= 1;
                    Pending {
                        env,
                        reply: None,
                        ticket,
                    }
                })
                .collect())
        }
        Err(e) => {
            tracing::warn!(error = %e, tells = n, "tells lost forwarding them to another region");
            Ok(n)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ractor::ActorProcessingErr;
    use tenure_lease::TenureConfig;

    use super::*;
    use crate::test_regions::{RegionDouble, proxy_region};
    use crate::{Entity, EntityContext, ShardRegion, ShardingError};

    /// Never started in these tests: it only types their entity references.
    struct Echo;

    impl Entity for Echo {
        type Request = String;
        type Reply = String;
        type State = ();

        async fn start(&self, _: &EntityContext) -> Result<(), ActorProcessingErr> {
            Ok(())
        }

        async fn handle(
            &self,
            _: &EntityContext,
            _: &mut (),
            request: String,
        ) -> Result<String, ActorProcessingErr> {
            Ok(request)
        }
    }

    async fn snapshot(region: &ShardRegion) -> RegionSnapshot {
        ractor::call!(region.actor(), |r| RegionMsg::Local(RegionLocal::Snapshot(
            r
        )))
        .unwrap()
    }

    fn waiting(s: &RegionSnapshot) -> BTreeMap<String, usize> {
        s.waiting.iter().cloned().collect()
    }

    /// A coordinator that only reports the shards it is asked the home of.
    struct HomeAsks(tokio::sync::mpsc::UnboundedSender<String>);

    impl Actor for HomeAsks {
        type Msg = CoordinatorMsg;
        type State = ();
        type Arguments = ();

        async fn pre_start(
            &self,
            _: ActorRef<CoordinatorMsg>,
            _: (),
        ) -> Result<(), ActorProcessingErr> {
            Ok(())
        }

        async fn handle(
            &self,
            _: ActorRef<CoordinatorMsg>,
            msg: CoordinatorMsg,
            _: &mut (),
        ) -> Result<(), ActorProcessingErr> {
            if let CoordinatorMsg::GetHome(GetShardHome { shard, .. }) = msg {
                let _ = self.0.send(shard);
            }
            Ok(())
        }
    }

    fn member(addr: &str, status: MemberStatus) -> Member {
        Member {
            addr: tenure_cluster::NodeAddr::parse("member", addr).unwrap(),
            incarnation: tenure_cluster::Incarnation(1),
            age: 1,
            status,
            reachable: true,
            roles: Vec::new(),
            app_version: Default::default(),
        }
    }

    /// A coordinator that reports each registration it gets: how many shard ids it
    /// carried, and the shards its region hosts according to it.
    struct Registrations {
        to: tokio::sync::mpsc::UnboundedSender<(usize, BTreeSet<String>)>,
    }

    impl Actor for Registrations {
        type Msg = CoordinatorMsg;
        type State = BTreeSet<String>;
        type Arguments = ();

        async fn pre_start(
            &self,
            _: ActorRef<CoordinatorMsg>,
            _: (),
        ) -> Result<BTreeSet<String>, ActorProcessingErr> {
            Ok(BTreeSet::new())
        }

        async fn handle(
            &self,
            _: ActorRef<CoordinatorMsg>,
            msg: CoordinatorMsg,
            hosted: &mut BTreeSet<String>,
        ) -> Result<(), ActorProcessingErr> {
            let carried = match msg {
                CoordinatorMsg::RegisterRegion(crate::messages::Register { shards, .. }) => {
                    let carried = shards.len();
                    *hosted = shards.into_iter().collect();
                    carried
                }
                CoordinatorMsg::RegisterChanges(RegisterChanges {
                    base,
                    added,
                    removed,
                    ..
                }) => {
                    if base.is_none() {
                        hosted.clear();
                    }
                    let carried = added.len() + removed.len();
                    hosted.extend(added);
                    for shard in removed {
                        hosted.remove(&shard);
                    }
                    carried
                }
                _ => return Ok(()),
            };
            let _ = self.to.send((carried, hosted.clone()));
            Ok(())
        }
    }

    /// A region hosting `probe` on a memory store, with `config`.
    async fn hosting_region(scope: &str, config: &str) -> ActorRef<RegionMsg> {
        let config = TenureConfig::from_toml_str(
            &format!("[tenure]\ndefault-lease-section = \"memory\"\n{config}"),
            "test",
        )
        .unwrap();
        let registry = ["sqlite", "postgres", "etcd", "zookeeper"]
            .into_iter()
            .fold(tenure_lease::StoreRegistry::new(), |r, kind| {
                r.left_out(kind, kind)
            });
        let provider = tenure_lease::LeaseProvider::new(config.clone(), registry).unwrap();
        let settings = Arc::new(ShardingSettings::from_config(&config, "probe", "memory").unwrap());
        let me = "127.0.0.1:1";
        let template = provider
            .spec(
                &tenure_lease::names::shard_lease("test", "probe", "0"),
                "memory",
                me,
            )
            .await
            .unwrap();
        let coordinator =
            SingletonProxy::<CoordinatorMsg>::start(scope, "sharding-probe-coordinator", 10)
                .await
                .unwrap();
        let args = RegionArgs {
            type_name: "probe".into(),
            me: me.into(),
            scope: scope.into(),
            system: "test".into(),
            settings,
            hosting: Some((crate::entity_factory(Echo), template)),
            coordinator,
            routes: Arc::default(),
            readiness: tenure_cluster::Readiness::new().gate("region", "starting"),
        };
        Actor::spawn(None, Region, args).await.unwrap().0
    }

    /// A region's registration, sent every `retry-interval`, carries the shards that
    /// changed since the coordinator last had its report, not every shard it hosts: once
    /// the coordinator knows its 40 shards, retries with nothing changed carry none.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_registration_retry_carries_only_the_changes() {
        let scope = "region-register-changes";
        let (tx, mut registered) = tokio::sync::mpsc::unbounded_channel();
        let (coordinator, _) = Actor::spawn(None, Registrations { to: tx }, ())
            .await
            .unwrap();
        pg::join_scoped(
            scope.to_string(),
            tenure_singleton::instance_group("sharding-probe-coordinator", FencingToken::new(1)),
            vec![coordinator.get_cell()],
        );
        let region = hosting_region(scope, "[sharding]\nretry-interval = \"50ms\"").await;
        let shards: BTreeSet<String> = (0..40).map(|i| i.to_string()).collect();
        for shard in &shards {
            region
                .cast(RegionMsg::Host(HostShard {
                    shard: shard.clone(),
                    coordinator: FencingToken::new(1),
                }))
                .unwrap();
        }
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(30), registered.recv())
                .await
                .expect("a registration within 30 s")
                .expect("the coordinator runs")
        };
        while next().await.1 != shards {}
        let mut carried = Vec::new();
        for _ in 0..5 {
            let (n, hosted) = next().await;
            assert_eq!(
                hosted, shards,
                "what the coordinator knows the region hosts"
            );
            carried.push(n);
        }
        assert_eq!(
            carried, [0; 5],
            "shard ids carried by registrations with nothing changed"
        );
        // A new coordinator instance gets every shard once, then changes.
        let (tx, mut registered) = tokio::sync::mpsc::unbounded_channel();
        let (successor, _) = Actor::spawn(None, Registrations { to: tx }, ())
            .await
            .unwrap();
        pg::join_scoped(
            scope.to_string(),
            tenure_singleton::instance_group("sharding-probe-coordinator", FencingToken::new(2)),
            vec![successor.get_cell()],
        );
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(30), registered.recv())
                .await
                .expect("a registration within 30 s")
                .expect("the coordinator runs")
        };
        assert_eq!(
            next().await,
            (40, shards.clone()),
            "the first to a new coordinator"
        );
        assert_eq!(next().await, (0, shards.clone()));
        // Asked for every shard (it lacks the base of the changes): all of them at once.
        region
            .cast(RegionMsg::RegisterAll(RegisterAgain {
                coordinator: FencingToken::new(2),
            }))
            .unwrap();
        let mut after = next().await;
        if after.0 == 0 {
            // A retry that had left before the request.
            after = next().await;
        }
        assert_eq!(after, (40, shards.clone()), "the registration asked for");
        region.stop_and_wait(None, None).await.unwrap();
        coordinator.stop(None);
        successor.stop(None);
    }

    /// A coordinator that failed over with a node does not know that node's shards (their
    /// leases lapsed before it listed them): the regions that knew them ask their home,
    /// with no message for them, so that they start again elsewhere at once.
    #[tokio::test(start_paused = true)]
    async fn a_shard_whose_home_went_down_is_asked_a_new_home_with_no_message_for_it() {
        let scope = "region-orphans";
        let (asks, mut asked) = tokio::sync::mpsc::unbounded_channel();
        let (coordinator, _) = Actor::spawn(None, HomeAsks(asks), ()).await.unwrap();
        ractor::pg::join_scoped(
            scope.to_string(),
            tenure_singleton::instance_group("sharding-probe-coordinator", FencingToken::new(1)),
            vec![coordinator.get_cell()],
        );
        let region = proxy_region(scope, "[sharding]\nretry-interval = \"100ms\"").await;
        let other = "127.0.0.1:2";
        let cast = |msg: RegionMsg| region.actor().cast(msg).unwrap();
        cast(RegionMsg::Local(RegionLocal::Cluster(
            ClusterEvent::CurrentMembers(vec![member(other, MemberStatus::Up)]),
        )));
        cast(RegionMsg::Home(ShardHome {
            shard: "7".into(),
            home: Some(other.into()),
            coordinator: FencingToken::new(1),
        }));
        assert_eq!(
            snapshot(&region).await.homes,
            vec![("7".into(), other.into())]
        );
        cast(RegionMsg::Local(RegionLocal::Cluster(
            ClusterEvent::MemberDown(member(other, MemberStatus::Down)),
        )));
        let first = tokio::time::timeout(Duration::from_secs(60), asked.recv()).await;
        assert_eq!(
            first.ok().flatten().as_deref(),
            Some("7"),
            "the region never asked the new home of the shard its lost node hosted"
        );
        coordinator.stop(None);
    }

    /// A handle's messages to an entity of another node go to that node's region directly
    /// only after this region forwarded one there, and take the region again (kept until
    /// the shard's next home is named) once the shard begins a hand-off or its node becomes
    /// unreachable.
    #[tokio::test]
    async fn a_remote_route_opens_at_a_forward_and_closes_when_the_shard_moves_or_its_node_is_lost()
    {
        let scope = "region-remote-routes";
        let other = "127.0.0.1:2";
        let (tx, mut received) = tokio::sync::mpsc::unbounded_channel();
        let (other_region, _) = Actor::spawn(None, RegionDouble::envelopes(tx), ())
            .await
            .unwrap();
        pg::join_scoped(
            scope.to_string(),
            region_group("probe", other),
            vec![other_region.get_cell()],
        );
        let region = proxy_region(scope, "").await;
        let alice = region.entity_ref::<Echo>("alice");
        let shard = alice.shard();
        let coordinator = FencingToken::new(1);
        let cast = |msg: RegionMsg| region.actor().cast(msg).unwrap();
        let home = || {
            cast(RegionMsg::Home(ShardHome {
                shard: shard.clone(),
                home: Some(other.into()),
                coordinator,
            }))
        };
        let mut note = 0u8;
        let mut tell = || {
            note += 1;
            alice.tell(&note.to_string()).unwrap();
        };
        // Everything the other region got so far (in order).
        let mut seen = Vec::new();
        let mut delivered = async || {
            ractor::call!(other_region, |r| RegionMsg::Vacate(
                Vacating {
                    node: "127.0.0.1:1".into()
                },
                r
            ))
            .unwrap();
            while let Ok(env) = received.try_recv() {
                assert_eq!(env.hops, 1);
                seen.push(
                    tenure_cluster::codec::decode_inner::<String>(
                        "entity request",
                        "probe",
                        &env.payload,
                    )
                    .unwrap(),
                );
            }
            seen.clone()
        };
        cast(RegionMsg::Local(RegionLocal::Cluster(
            ClusterEvent::CurrentMembers(vec![member(other, MemberStatus::Up)]),
        )));
        home();
        tell();
        snapshot(&region).await;
        assert!(region.routes.remote_open(&shard), "not opened by a forward");
        tell();
        assert_eq!(delivered().await, ["1", "2"]);

        ractor::call!(region.actor(), |r| RegionMsg::BeginHandOffShard(
            BeginHandOff {
                shard: shard.clone(),
                coordinator
            },
            r
        ))
        .unwrap();
        assert!(
            !region.routes.remote_open(&shard),
            "open while the shard moves"
        );
        tell();
        assert_eq!(
            waiting(&snapshot(&region).await),
            BTreeMap::from([(shard.clone(), 1)])
        );
        assert_eq!(
            delivered().await,
            ["1", "2"],
            "a message overtook the hand-off"
        );

        // The home named again: the kept message first, then the route opens again.
        home();
        snapshot(&region).await;
        tell();
        assert_eq!(delivered().await, ["1", "2", "3", "4"]);
        assert!(region.routes.remote_open(&shard));

        cast(RegionMsg::Local(RegionLocal::Cluster(
            ClusterEvent::Unreachable(member(other, MemberStatus::Up)),
        )));
        snapshot(&region).await;
        assert!(
            !region.routes.remote_open(&shard),
            "open to an unreachable node"
        );
        tell();
        assert_eq!(
            waiting(&snapshot(&region).await),
            BTreeMap::from([(shard.clone(), 1)])
        );
        assert_eq!(delivered().await, ["1", "2", "3", "4"]);
        region.actor().stop_and_wait(None, None).await.unwrap();
        other_region.stop(None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_ask_to_a_shard_without_a_home_times_out_naming_it_and_is_not_kept() {
        let region = proxy_region(
            "region-ask-expiry",
            "[sharding]\nretry-interval = \"500ms\"",
        )
        .await;
        let alice = region.entity_ref::<Echo>("alice");
        let timeout = Duration::from_secs(2);
        let err = alice.ask(&"hello".to_string(), timeout).await.unwrap_err();
        let ShardingError::Timeout {
            type_name,
            shard,
            entity,
            timeout: t,
        } = &err
        else {
            panic!("not a timeout: {err}");
        };
        assert_eq!(
            (type_name.as_str(), shard.clone(), entity.as_str(), *t),
            ("probe", alice.shard(), "alice", timeout)
        );
        let text = err.to_string();
        assert!(
            text.contains("probe") && text.contains("alice") && text.contains(&alice.shard()),
            "{text}"
        );
        // An ask whose port stays open past its timeout (a remote asker's: its node session
        // holds the port) is dropped all the same.
        let (tx, _kept_open) = tokio::sync::oneshot::channel();
        let env = region.envelope("bob", &"hello".to_string()).unwrap();
        region
            .actor()
            .cast(RegionMsg::Ask(env, (tx, timeout).into()))
            .unwrap();
        let bob = region.shard_of("bob");
        assert!(waiting(&snapshot(&region).await).contains_key(&bob));
        tokio::time::sleep(timeout).await;
        // The region drops them at its next tick at the latest.
        let mut left = BTreeMap::new();
        for _ in 0..4 {
            left = waiting(&snapshot(&region).await);
            if left.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert!(left.is_empty(), "the region still keeps {left:?}");
        region.actor().stop_and_wait(None, None).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_shard_buffer_refuses_with_the_type_and_shard_and_spares_other_shards() {
        let region = proxy_region("region-shard-buffers", "[sharding]\nbuffer-size = 1").await;
        let full = region.entity_ref::<Echo>("a");
        let other_id = (0..)
            .map(|i| format!("b{i}"))
            .find(|id| region.shard_of(id) != full.shard())
            .unwrap();
        let other = region.entity_ref::<Echo>(other_id.clone());
        full.tell(&"first".to_string()).unwrap();
        let err = full
            .ask(&"second".to_string(), Duration::from_secs(5))
            .await
            .unwrap_err();
        match &err {
            ShardingError::BufferFull {
                type_name,
                shard,
                entity,
                capacity,
            } => assert_eq!(
                (
                    type_name.as_str(),
                    shard.clone(),
                    entity.as_str(),
                    *capacity
                ),
                ("probe", full.shard(), "a", 1)
            ),
            other => panic!("not a full buffer: {other}"),
        }
        assert!(
            err.to_string().contains(&format!("shard {}", full.shard())),
            "{err}"
        );
        // A tell beyond it is dropped and counted.
        full.tell(&"third".to_string()).unwrap();
        let s = snapshot(&region).await;
        assert_eq!(s.dropped_tells, 1);
        assert_eq!(waiting(&s), BTreeMap::from([(full.shard(), 1)]));
        // Another shard has a buffer of its own: its ask waits (and times out).
        let err = other
            .ask(&"elsewhere".to_string(), Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ShardingError::Timeout { entity, .. } if *entity == other_id),
            "{err}"
        );
        region.actor().stop_and_wait(None, None).await.unwrap();
    }
}
