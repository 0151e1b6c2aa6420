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

mod cluster;
mod hosting;
mod routing;
#[cfg(test)]
mod tests;

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
}
