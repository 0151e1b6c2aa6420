//! The shard supervisor: one per hosted shard. It acquires the shard's lease through a
//! LeaseActor before starting any entity and keeps messages meanwhile; starts entities on
//! demand with the grant's fencing token; on `LeaseLost` stops **all** its entities and
//! waits for them before trying again; on hand-off lets them finish the messages they
//! have, stops them, releases the lease and gives back the messages it still kept;
//! passivates idle entities. With `remember-entities` it keeps its entities' ids with its
//! lease and starts them again whenever it is granted the lease (see [`crate::remember`]).
//!
//! Timing: the LeaseActor announces a loss the shard's stop budget before the local
//! deadline (`stop-timeout` plus a kill wait, an exit wait and delivery slack), and the
//! shard's handlers never await user code (an entity's `start` runs in the entity's own
//! task, its messages waiting here until it has started), so a loss is handled at once and
//! every entity has terminated, by a graceful stop or else a kill, before the deadline; an
//! entity that outlives even its kill ends the process before it ([`stopping`]).

mod entities;
mod stopping;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tenure_lease::{
    FencingToken, LeaseActor, LeaseEvent, LeaseEventSink, LeaseMsg, LeaseSpec, LeaseView,
    LossWatch, ProcessEnd, RememberChange, Terminator,
};
use tokio::time::Instant;

use crate::active::ActiveEntities;
use crate::direct::{Routes, Ticket};
use crate::entity::{EntityContext, EntityFactory, EntityMsg, shard_of};
use crate::history::{self, EntityEvent, ShardEvent};
use crate::messages::{AskReply, Pending as RegionPending, ask_expired, refuse_buffer_full};
use crate::remember::{RememberStore, Remembering};
use crate::settings::ShardingSettings;
use stopping::Stop;

/// Everything a shard needs.
#[derive(Clone)]
pub struct ShardArgs {
    /// The entity type.
    pub type_name: String,
    /// The shard id.
    pub shard_id: String,
    /// This node (`host:port`), the owner of the shard's lease.
    pub node: String,
    /// The lease `<system>-shard-<type>-<shard id>`.
    pub lease: LeaseSpec,
    /// Starts the shard's entities.
    pub factory: EntityFactory,
    /// The running entities of the shard's region, when it has an `active-entity-limit`
    /// (one set shared by all the region's shards).
    pub active: Option<ActiveEntities>,
    /// The entity type's sharding settings.
    pub settings: Arc<ShardingSettings>,
    /// How the process ends when an entity outlives its kill while the shard's lease is
    /// being lost (`when-kill-fails = "abort"`): [`ProcessEnd::abort`] but in tests.
    pub process_end: ProcessEnd,
}

/// Where a shard stands (for inspection and tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardStatus {
    /// The token of the grant it serves under, while it serves.
    pub serving: Option<FencingToken>,
    /// Ids of its running entities, sorted.
    pub entities: Vec<String>,
    /// Messages waiting for the lease or for a passivating entity.
    pub waiting: usize,
}

/// Messages of a shard (local only).
pub enum ShardMsg {
    /// A message for entity `entity`; `reply` for an ask.
    Deliver {
        /// The entity id.
        entity: String,
        /// The request, encoded by the entity type's codec.
        payload: Vec<u8>,
        /// Where an ask's reply goes; `None` for a tell.
        reply: Option<RpcReplyPort<AskReply>>,
    },
    /// A message its region routed here (as `Deliver`, with the ticket of a message sent
    /// on this node).
    #[doc(hidden)]
    Routed(RegionPending),
    /// An event of the shard's lease.
    Lease(LeaseEvent),
    /// Stop entity `0` (it asked, or it was idle).
    Passivate(String),
    /// Stop entity `0`: its region reached its `active-entity-limit`, and it is the least
    /// recently used.
    #[doc(hidden)]
    Evict(String),
    /// The `start` of an entity actor ended: `Ok` it runs (and is linked to the shard),
    /// `Err` it failed or was killed while starting.
    #[doc(hidden)]
    EntityStarted {
        entity: String,
        actor: ractor::ActorId,
        result: Result<(), tenure_singleton::StartError>,
    },
    #[doc(hidden)]
    IdleCheck,
    /// The ids remembered with the shard's lease, read under grant `token`
    /// (remember-entities).
    #[doc(hidden)]
    Recalled {
        token: FencingToken,
        ids: Vec<String>,
    },
    /// A write of remembered ids under grant `token` ended: `written`, or not (the grant
    /// is not current any more).
    #[doc(hidden)]
    Remembered {
        token: FencingToken,
        change: RememberChange,
        written: bool,
    },
    /// Start remembered entity `0` again (it stopped without passivating).
    #[doc(hidden)]
    Restart(String),
    /// An entity that outlived its kill (actor `0`) has ended.
    #[doc(hidden)]
    EntityEnded(ractor::ActorId),
    /// `hand-off-timeout` has passed since the hand-off began.
    #[doc(hidden)]
    HandOffDue,
    /// Let every entity finish the messages in its mailbox and stop, release the lease,
    /// answer with the outcome and the messages not delivered, then stop. An entity that
    /// outlives its kill holds the release (and the shard) up until it has ended, and the
    /// answer (`released: false`) up to `hand-off-timeout`.
    HandOff(RpcReplyPort<HandedOff>),
    /// Answers with where the shard stands.
    Status(RpcReplyPort<ShardStatus>),
}

impl ractor::Message for ShardMsg {}

/// The outcome of a shard's hand-off.
pub struct HandedOff {
    /// The store confirmed the release of the shard's lease (otherwise the next host waits
    /// for it to expire).
    pub released: bool,
    /// Messages the shard accepted and did not deliver (waiting for the lease or for a
    /// passivating entity), in arrival order: they belong to the shard's next home.
    pub undelivered: Vec<RegionPending>,
}

impl From<LeaseEvent> for ShardMsg {
    fn from(e: LeaseEvent) -> Self {
        ShardMsg::Lease(e)
    }
}

struct Pending {
    entity: String,
    payload: Vec<u8>,
    reply: Option<RpcReplyPort<AskReply>>,
    /// When the shard accepted it: an ask waiting here expires with its own timeout.
    since: Instant,
    /// Dropped once the message is in its entity's mailbox or gone (see [`Routes`]).
    ticket: Option<Ticket>,
    /// Regions it passed through (0: sent on this node).
    hops: u8,
}

struct Running {
    actor: ActorRef<EntityMsg>,
    /// The grant it runs under.
    token: FencingToken,
    last: Instant,
    passivating: bool,
    /// It asked to be passivated ([`EntityContext::passivate`]): forgotten once stopped.
    asked: bool,
    /// Its `start` has not finished: its messages wait in the shard.
    starting: bool,
    /// It survived its kill (see [`stopping`]): it still runs, and is never started again
    /// until it has ended.
    outlived: bool,
}

/// The shard actor.
pub struct Shard;

pub struct ShardState {
    args: ShardArgs,
    myself: ActorRef<ShardMsg>,
    lease: ActorRef<LeaseMsg>,
    view: LeaseView,
    /// The token of the grant entities run under, while serving.
    serving: Option<FencingToken>,
    /// A grant a journal refused as not current: no entity starts under it while its
    /// LeaseActor ends the belief (see [`ShardState::not_current`]).
    refused: Option<FencingToken>,
    entities: HashMap<String, Running>,
    waiting: VecDeque<Pending>,
    handing_off: bool,
    /// The hand-off's answer, while entities that outlived their kill hold it up.
    hand_off: Option<RpcReplyPort<HandedOff>>,
    /// Ends the process (once) for entities that outlived their kill under a lease being
    /// lost: shared with `watch`.
    terminator: Terminator,
    /// Watches the lease for its entities from a task of its own ([`stopping`]).
    watch: LossWatch,
    idle_timer: Option<ractor::concurrency::JoinHandle<()>>,
    /// remember-entities: the ids remembered with the shard's lease.
    remember: Option<Remembering>,
    /// The region's direct routes to entities: open while an entity may take messages
    /// straight into its mailbox.
    routes: Option<Arc<Routes>>,
}

impl Shard {
    /// Spawns the shard, linked to `supervisor` (its region) when given; it starts
    /// acquiring its lease at once.
    pub async fn start(
        args: ShardArgs,
        supervisor: Option<ractor::ActorCell>,
    ) -> Result<ActorRef<ShardMsg>, ractor::SpawnErr> {
        Self::spawn_with(args, supervisor, None).await
    }

    /// As [`Shard::start`], opening direct routes in `routes` to its running entities.
    pub(crate) async fn start_routed(
        args: ShardArgs,
        supervisor: Option<ractor::ActorCell>,
        routes: Arc<Routes>,
    ) -> Result<ActorRef<ShardMsg>, ractor::SpawnErr> {
        Self::spawn_with(args, supervisor, Some(routes)).await
    }

    async fn spawn_with(
        args: ShardArgs,
        supervisor: Option<ractor::ActorCell>,
        routes: Option<Arc<Routes>>,
    ) -> Result<ActorRef<ShardMsg>, ractor::SpawnErr> {
        let args = (args, routes);
        let (r, _) = match supervisor {
            Some(s) => Actor::spawn_linked(None, Shard, args, s).await?,
            None => Actor::spawn(None, Shard, args).await?,
        };
        Ok(r)
    }
}

impl Actor for Shard {
    type Msg = ShardMsg;
    type State = ShardState;
    /// The shard's arguments, and the region's direct routes (none: every message comes
    /// through the shard).
    type Arguments = (ShardArgs, Option<Arc<Routes>>);

    async fn pre_start(
        &self,
        myself: ActorRef<ShardMsg>,
        (args, routes): (ShardArgs, Option<Arc<Routes>>),
    ) -> Result<ShardState, ActorProcessingErr> {
        let mut args = args;
        args.lease = args.lease.with_checked_stop_budget(
            &args.settings.stop_budget(),
            &format!("lease.{}", args.settings.lease_section),
            "sharding.stop-timeout",
        )?;
        let (lease, view) = LeaseActor::start(
            args.lease.clone(),
            LeaseEventSink::to_actor(myself.clone()),
            Some(myself.get_cell()),
        )
        .await?;
        lease.cast(LeaseMsg::Acquire { reply: None })?;
        let terminator = stopping::terminator(&args);
        let watch = LossWatch::start(
            &view,
            &args.lease.name,
            args.settings.stop_budget(),
            terminator.clone(),
        );
        let remembering = args.settings.remember_entities;
        // Remembered entities stop only when they ask (Akka turns idle passivation off too).
        let idle_timer = args
            .settings
            .idle_timeout
            .filter(|_| !remembering)
            .map(|idle| {
                let every = (idle / 2).max(Duration::from_millis(20));
                myself.send_interval(every, || ShardMsg::IdleCheck)
            });
        let remember = remembering.then(|| {
            Remembering::new(RememberStore {
                store: args.lease.store.clone(),
                name: args.lease.store_name.clone(),
                owner: args.lease.owner.clone(),
                timeout: args.lease.settings.lease_operation_timeout,
                retry: args.settings.retry_interval,
            })
        });
        Ok(ShardState {
            args,
            myself,
            lease,
            view,
            serving: None,
            refused: None,
            entities: HashMap::new(),
            waiting: VecDeque::new(),
            handing_off: false,
            hand_off: None,
            terminator,
            watch,
            idle_timer,
            remember,
            routes,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<ShardMsg>,
        state: &mut ShardState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(timer) = state.idle_timer.take() {
            timer.abort();
        }
        if !state.handing_off {
            state.stop_entities("shard stopped", Stop::Now).await;
        }
        // Stopping, the shard stops its lease actor, which releases the lease.
        state.kill_failed("the shard stopped");
        if !state.handing_off {
            state.flush_remembered().await;
            if let Some(token) = state.serving.take() {
                state.record(history::shard_stopped, token, "shard stopped");
            }
            state.release().await;
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ShardMsg>,
        msg: ShardMsg,
        state: &mut ShardState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ShardMsg::Deliver {
                entity,
                payload,
                reply,
            } => state.deliver(Pending {
                entity,
                payload,
                reply,
                since: Instant::now(),
                ticket: None,
                hops: 0,
            }),
            ShardMsg::Routed(p) => state.deliver(Pending {
                entity: p.env.entity,
                payload: p.env.payload,
                reply: p.reply,
                since: Instant::now(),
                ticket: p.ticket,
                hops: p.env.hops,
            }),
            ShardMsg::Lease(LeaseEvent::Granted(granted)) => {
                // Serve only a grant still believed now (not one lapsed before this event).
                if state.serving.is_none()
                    && !state.handing_off
                    && state.view.token() == Some(granted.token)
                {
                    state.serving = Some(granted.token);
                    tracing::debug!(shard = %state.args.shard_id, token = granted.token.get(), "shard lease granted");
                    state.record(history::shard_started, granted.token, "");
                    if let Some(r) = &mut state.remember {
                        // Messages wait until the remembered entities started.
                        r.serve(granted.token, myself.clone(), state.view.clone());
                    } else {
                        state.flush();
                    }
                }
            }
            ShardMsg::Lease(LeaseEvent::Lost(lost)) => {
                if state.serving == Some(lost.token) {
                    tracing::warn!(shard = %state.args.shard_id, token = lost.token.get(), reason = %lost.reason,
                        "shard lease lost: stopping its entities, then acquiring again");
                    state.record(history::shard_lease_lost, lost.token, &lost.reason.to_string());
                    if !state.stop_entities("lease lost", Stop::Now).await {
                        state.kill_failed(&format!("lease lost: {}", lost.reason));
                    }
                    state.record(
                        history::shard_stopped,
                        lost.token,
                        &format!("lease lost: {}", lost.reason),
                    );
                    state.serving = None;
                    state.refused = None;
                    if let Some(r) = &mut state.remember {
                        r.reset();
                    }
                }
                // Acquires again, or finishes a hand-off, once no entity that outlived its
                // kill runs.
                state.resume(&myself).await;
            }
            // Shard leases are plain (priority 0): a forceful preemption arrives as a loss.
            ShardMsg::Lease(
                LeaseEvent::PreemptionRequested(_)
                | LeaseEvent::PreemptionWithdrawn(_)
                // Renewals failing before the deadline: the grant is still ours, and the
                // stop budget acts on a loss, not on doubt.
                | LeaseEvent::Suspended(_)
                | LeaseEvent::Resumed(_),
            ) => {}
            ShardMsg::Passivate(entity) => state.passivate(&entity, true),
            ShardMsg::Evict(entity) => state.evict(&entity),
            ShardMsg::Recalled { token, ids } => state.recalled(token, ids),
            ShardMsg::Remembered {
                token,
                change,
                written,
            } => state.remembered(token, &change, written),
            ShardMsg::Restart(entity) => state.restart(&entity),
            ShardMsg::EntityEnded(actor) => {
                state
                    .entity_ended(&myself, actor, "outlived its kill".into())
                    .await
            }
            ShardMsg::HandOffDue => state.hand_off_due(),
            ShardMsg::EntityStarted {
                entity,
                actor,
                result,
            } => {
                let outlived = state.has_outlived();
                state.entity_started(&entity, actor, result);
                if outlived {
                    // A starting entity that outlived its kill may have ended with its start.
                    state.resume(&myself).await;
                }
            }
            ShardMsg::IdleCheck => {
                if let Some(idle) = state.args.settings.idle_timeout {
                    let now = Instant::now();
                    if let Some(routes) = &state.routes {
                        // Messages that went straight to an entity keep it busy too.
                        for (id, r) in state.entities.iter_mut() {
                            if routes.take_used(id) {
                                r.last = now;
                            }
                        }
                    }
                    let idle: Vec<String> = state
                        .entities
                        .iter()
                        .filter(|(_, r)| !r.passivating && now.duration_since(r.last) >= idle)
                        .map(|(id, _)| id.clone())
                        .collect();
                    for id in idle {
                        state.passivate(&id, false);
                    }
                }
            }
            ShardMsg::HandOff(reply) => {
                crate::metrics::hand_off(&state.args.type_name);
                let began = Instant::now();
                state.handing_off = true;
                if let Some(earlier) = state.hand_off.replace(reply) {
                    let _ = earlier.send(HandedOff {
                        released: false,
                        undelivered: Vec::new(),
                    });
                }
                if state.stop_entities("hand-off", Stop::Drain).await {
                    state.resume(&myself).await;
                } else {
                    tracing::warn!(shard = %state.args.shard_id,
                        "hand-off waits for entities that outlived their kill: the lease stays held until they end");
                    let due = state
                        .args
                        .settings
                        .hand_off_timeout
                        .saturating_sub(began.elapsed());
                    myself.send_after(due, || ShardMsg::HandOffDue);
                }
            }
            ShardMsg::Status(reply) => {
                let mut entities: Vec<String> = state.entities.keys().cloned().collect();
                entities.sort();
                let _ = reply.send(ShardStatus {
                    serving: state.serving,
                    entities,
                    waiting: state.waiting.len(),
                });
            }
        }
        state.publish_metrics();
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<ShardMsg>,
        event: SupervisionEvent,
        state: &mut ShardState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, why) = match &event {
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                (cell.clone(), reason.clone().unwrap_or_default())
            }
            SupervisionEvent::ActorFailed(cell, err) => (cell.clone(), format!("failed: {err}")),
            _ => return Ok(()),
        };
        if cell.get_id() == state.lease.get_id() {
            // The lease actor died (a bug): its grant is given up without a Lost event.
            tracing::error!(shard = %state.args.shard_id, why, "lease actor ended; stopping the entities and acquiring again");
            if !state.stop_entities("lease actor ended", Stop::Now).await {
                state.kill_failed("the shard's lease actor ended");
            }
            if let Some(token) = state.serving.take() {
                state.record(history::shard_stopped, token, "lease actor ended");
            }
            if let Some(r) = &mut state.remember {
                r.reset();
            }
            let (lease, view) = LeaseActor::start(
                state.args.lease.clone(),
                LeaseEventSink::to_actor(myself.clone()),
                Some(myself.get_cell()),
            )
            .await?;
            state.watch = LossWatch::start(
                &view,
                &state.args.lease.name,
                state.args.settings.stop_budget(),
                state.terminator.clone(),
            );
            state.lease = lease;
            state.view = view;
            state.resume(&myself).await;
            return Ok(());
        }
        if let SupervisionEvent::ActorFailed(_, err) = &event
            && let Some(token) = err
                .downcast_ref::<crate::durable::DurableError>()
                .and_then(crate::durable::DurableError::not_current)
        {
            // Before its waiting messages are delivered: they must not start it again.
            state.not_current(cell.get_id(), token);
        }
        state.entity_ended(&myself, cell.get_id(), why).await;
        state.publish_metrics();
        Ok(())
    }
}

impl Drop for ShardState {
    fn drop(&mut self) {
        // Dropped without post_stop (killed, or its runtime shutting down): its lease actor
        // goes with it, and the lease with the actor.
        self.kill_failed("the shard was dropped");
    }
}

impl ShardState {
    /// Releases the lease; `true` when the store confirmed it.
    async fn release(&mut self) -> bool {
        let timeout = self.args.lease.settings.release_answer_timeout();
        matches!(
            self.lease.call(LeaseMsg::Release, Some(timeout)).await,
            Ok(ractor::rpc::CallResult::Success(Ok(true)))
        )
    }

    fn publish_metrics(&self) {
        crate::metrics::shard(
            &self.args.type_name,
            &self.args.shard_id,
            self.serving.is_some(),
            self.entities.len(),
        );
    }

    fn record(&self, event: ShardEvent, token: FencingToken, why: &str) {
        event(&self.args.type_name, &self.args.shard_id, token, why);
    }

    fn record_entity(&self, event: EntityEvent, entity: &str, token: FencingToken, why: &str) {
        event(
            &self.args.type_name,
            &self.args.shard_id,
            entity,
            token,
            why,
        );
    }
}
