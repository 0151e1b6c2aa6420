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
    /// The grant entities may run under now: serving, and still believed (the local
    /// deadline has not passed, even if its Lost event is still on its way).
    fn live_token(&self) -> Option<FencingToken> {
        self.serving
            .filter(|t| self.view.token() == Some(*t) && self.refused != Some(*t))
    }

    /// The id of the entity actor `actor` runs, if it is one of the shard's.
    fn entity_run_by(&self, actor: ractor::ActorId) -> Option<String> {
        self.entities
            .iter()
            .find(|(_, r)| r.actor.get_id() == actor)
            .map(|(id, _)| id.clone())
    }

    /// A journal refused a write of the entity run by `actor` under grant `token` as not
    /// current: the store's word that the grant is gone (released, expired, or granted to
    /// another holder while this node paused or was cut off). The LeaseActor ends its belief at
    /// once, and its `LeaseLost` stops every entity and starts acquiring again; until it
    /// arrives, messages wait as for the lease, so that no entity starts again only to be
    /// refused, message after message, until the next renewal would have told.
    fn not_current(&mut self, actor: ractor::ActorId, token: FencingToken) {
        if self.serving != Some(token) || self.refused == Some(token) {
            return;
        }
        let Some(entity) = self.entity_run_by(actor) else {
            return;
        };
        tracing::warn!(shard = %self.args.shard_id, entity, token = token.get(),
            "the journal refused the shard's grant as not current: giving the grant up now");
        self.refused = Some(token);
        let _ = self.lease.cast(LeaseMsg::NotCurrent(token));
    }

    fn deliver(&mut self, p: Pending) {
        if self.handing_off {
            // Kept for the shard's next home: the hand-off gives it back to the region.
            self.waiting.push_back(p);
            return;
        }
        let Some(token) = self.live_token() else {
            self.wait(p);
            return;
        };
        if self.remember.as_ref().is_some_and(|r| !r.recalled) {
            // The remembered entities start first.
            self.wait(p);
            return;
        }
        // Every node must map an id to the same shard (`number-of-shards`), or one entity
        // would run under two shard leases at once: never start one in another's shard.
        let home = shard_of(&p.entity, self.args.settings.number_of_shards);
        if home != self.args.shard_id {
            AskReply::fail(
                p.reply,
                format!(
                    "entity {} of `{}` belongs to shard {home} here (number-of-shards {}), not shard {}: \
                     the sender's sharding.number-of-shards differs",
                    p.entity,
                    self.args.type_name,
                    self.args.settings.number_of_shards,
                    self.args.shard_id
                ),
            );
            return;
        }
        if let Some(r) = self.entities.get_mut(&p.entity) {
            if r.passivating || r.starting {
                self.wait(p);
                return;
            }
            r.last = Instant::now();
            if let Some(active) = &self.args.active {
                active.used(&self.myself, &self.args.shard_id, &p.entity);
            }
            let _ = r.actor.cast(EntityMsg {
                payload: p.payload,
                reply: p.reply,
            });
            return;
        }
        if let Some(r) = &mut self.remember {
            if r.adding.contains(&p.entity) {
                self.wait(p);
                return;
            }
            if r.must_add(&p.entity) {
                if p.entity.contains('\0') {
                    AskReply::fail(
                        p.reply,
                        format!(
                            "entity {:?} cannot be remembered (remember-entities): its id contains a NUL character",
                            p.entity
                        ),
                    );
                    return;
                }
                // Remembered before it starts: the message waits for the write.
                r.add(&p.entity);
                self.wait(p);
                return;
            }
        }
        match self.start_entity(&p.entity, token) {
            Ok(()) => self.wait(p),
            Err(e) => AskReply::fail(
                p.reply,
                format!("entity {} could not be started: {e}", p.entity),
            ),
        }
    }

    /// Spawns entity `entity` under grant `token` (its messages wait until its `start`
    /// finished: [`ShardMsg::EntityStarted`]).
    fn start_entity(&mut self, entity: &str, token: FencingToken) -> Result<(), ractor::SpawnErr> {
        let ctx = EntityContext {
            type_name: self.args.type_name.clone(),
            entity_id: entity.to_string(),
            shard_id: self.args.shard_id.clone(),
            token,
            node: self.args.node.clone(),
            lease: self.args.lease.store_name.clone(),
            owner: self.args.lease.owner.clone(),
            shard: self.myself.clone(),
        };
        match (self.args.factory)(ctx, self.myself.get_cell()) {
            Ok(starting) => {
                // Its life begins now: its `start` may already act under the token.
                self.record_entity(history::entity_started, entity, token, "");
                self.watch.watch(
                    starting.actor.get_cell(),
                    token,
                    stopping::entity_name(&self.args, entity),
                );
                if let Some(active) = &self.args.active {
                    active.used(&self.myself, &self.args.shard_id, entity);
                }
                let (shard, id) = (self.myself.clone(), starting.actor.get_id());
                let name = entity.to_string();
                tokio::spawn(async move {
                    let result = tenure_singleton::start_outcome(starting.started).await;
                    let _ = shard.cast(ShardMsg::EntityStarted {
                        entity: name,
                        actor: id,
                        result,
                    });
                });
                self.entities.insert(
                    entity.to_string(),
                    Running {
                        actor: starting.actor,
                        token,
                        last: Instant::now(),
                        passivating: false,
                        asked: false,
                        starting: true,
                        outlived: false,
                    },
                );
                Ok(())
            }
            Err(e) => {
                tracing::warn!(shard = %self.args.shard_id, entity, error = %e, "entity could not be started");
                self.restart_later(entity);
                Err(e)
            }
        }
    }

    /// The ids remembered with the lease were read under grant `token`: starts their
    /// entities, then delivers what waited.
    fn recalled(&mut self, token: FencingToken, ids: Vec<String>) {
        if self.live_token() != Some(token) || self.handing_off {
            return;
        }
        let Some(r) = &mut self.remember else {
            return;
        };
        if r.recalled {
            return;
        }
        r.recalled = true;
        r.known.extend(ids.iter().cloned());
        let (shard, shards) = (
            self.args.shard_id.clone(),
            self.args.settings.number_of_shards,
        );
        tracing::debug!(
            shard,
            entities = ids.len(),
            "starting the remembered entities"
        );
        for id in ids {
            if shard_of(&id, shards) != shard {
                tracing::warn!(shard, entity = %id, shards,
                    "a remembered entity belongs to another shard (was number-of-shards changed?): not started");
                continue;
            }
            if !self.entities.contains_key(&id) {
                let _ = self.start_entity(&id, token);
            }
        }
        self.flush();
    }

    /// A write of remembered ids under grant `token` ended.
    fn remembered(&mut self, token: FencingToken, change: &RememberChange, written: bool) {
        if self.serving != Some(token) {
            return;
        }
        let ready = match &mut self.remember {
            Some(r) => r.written(change, written),
            None => return,
        };
        for id in ready {
            // Its messages wait in `waiting` until it has started.
            if let Some(token) = self.live_token().filter(|_| !self.handing_off)
                && !self.entities.contains_key(&id)
            {
                let _ = self.start_entity(&id, token);
            }
        }
    }

    /// Starts remembered entity `entity` again after `entity-restart-backoff`.
    fn restart_later(&self, entity: &str) {
        if self.remember.is_none() || self.serving.is_none() {
            return;
        }
        let entity = entity.to_string();
        let backoff = self.args.settings.entity_restart_backoff;
        self.myself
            .send_after(backoff, move || ShardMsg::Restart(entity));
    }

    /// `entity` waited its restart backoff: starts it if it is still remembered and not
    /// running.
    fn restart(&mut self, entity: &str) {
        let Some(token) = self.live_token().filter(|_| !self.handing_off) else {
            return;
        };
        let remembered = self
            .remember
            .as_ref()
            .is_some_and(|r| r.recalled && r.known.contains(entity) && !r.must_add(entity));
        if remembered && !self.entities.contains_key(entity) {
            tracing::debug!(shard = %self.args.shard_id, entity, "starting a remembered entity again after its backoff");
            let _ = self.start_entity(entity, token);
        }
    }

    /// Waits until the remembered ids' writes sent so far ended (bounded).
    async fn flush_remembered(&mut self) {
        if let Some(r) = &self.remember {
            let limit = self.args.lease.settings.lease_operation_timeout * 2;
            r.flush(limit).await;
        }
    }

    /// The `start` of entity `entity` (actor `actor`) ended.
    fn entity_started(
        &mut self,
        entity: &str,
        actor: ractor::ActorId,
        result: Result<(), tenure_singleton::StartError>,
    ) {
        let Some(r) = self
            .entities
            .get_mut(entity)
            .filter(|r| r.starting && r.actor.get_id() == actor)
        else {
            // Stopped meanwhile (its end is already recorded).
            return;
        };
        r.starting = false;
        let actor = r.actor.clone();
        let (mine, others): (VecDeque<Pending>, VecDeque<Pending>) =
            std::mem::take(&mut self.waiting)
                .into_iter()
                .partition(|p| p.entity == entity);
        self.waiting = others;
        match result {
            Ok(()) => {
                for p in mine {
                    self.deliver(p);
                }
                // Everything kept for it is in its mailbox: newer messages of this node
                // may go there directly, once none is left on the routed path.
                if let (Some(routes), Some(token)) = (&self.routes, self.live_token())
                    && !self.handing_off
                    && self.entities.get(entity).is_some_and(|r| {
                        !r.passivating && !r.starting && r.actor.get_id() == actor.get_id()
                    })
                {
                    routes.open(entity, actor, self.view.clone(), token);
                }
            }
            Err(e) => {
                tracing::warn!(shard = %self.args.shard_id, entity, error = %e, "entity could not be started");
                if let Some(r) = self.entities.remove(entity) {
                    self.watch.forget(r.actor.get_id());
                    self.inactive(entity);
                    self.record_entity(
                        history::entity_stopped,
                        entity,
                        r.token,
                        &format!("start failed: {e}"),
                    );
                }
                self.restart_later(entity);
                for p in mine {
                    AskReply::fail(
                        p.reply,
                        format!("entity {entity} could not be started: {e}"),
                    );
                }
            }
        }
    }

    fn wait(&mut self, p: Pending) {
        // Asks whose callers stopped waiting give their places back first.
        self.waiting
            .retain(|w| !ask_expired(w.reply.as_ref(), w.since));
        let capacity = self.args.settings.buffer_size;
        if self.waiting.len() >= capacity {
            let args = &self.args;
            refuse_buffer_full(
                &args.type_name,
                &args.shard_id,
                &p.entity,
                capacity,
                p.reply,
            );
        } else {
            self.waiting.push_back(p);
        }
    }

    /// Delivers what waited for the lease.
    fn flush(&mut self) {
        let waiting = std::mem::take(&mut self.waiting);
        for p in waiting {
            if ask_expired(p.reply.as_ref(), p.since) {
                tracing::debug!(shard = %self.args.shard_id, entity = %p.entity, "expired ask dropped: its caller stopped waiting");
                continue;
            }
            self.deliver(p);
        }
    }

    /// `entity` is the least recently used of its region, past the active-entity limit: it
    /// is passivated, unless a message went to it directly since (then it is used now, and
    /// the next least recently used goes instead).
    fn evict(&mut self, entity: &str) {
        // As the idle check: a direct message counts as use (and the flag is taken here).
        let used = self.routes.as_ref().is_some_and(|r| r.take_used(entity));
        match (self.entities.get_mut(entity), &self.args.active) {
            (Some(r), Some(active)) if used && !r.passivating => {
                r.last = Instant::now();
                active.used(&self.myself, &self.args.shard_id, entity);
            }
            _ => self.passivate(entity, false),
        }
    }

    /// `entity` no longer runs: it leaves the region's active entities.
    pub(super) fn inactive(&self, entity: &str) {
        if let Some(active) = &self.args.active {
            active.stopped(&self.args.shard_id, entity);
        }
    }

    /// Stops `entity` after the messages in its mailbox; `asked`: the entity asked (with
    /// remember-entities it is then forgotten once stopped).
    fn passivate(&mut self, entity: &str, asked: bool) {
        if let Some(r) = self.entities.get_mut(entity)
            && !r.passivating
        {
            r.passivating = true;
            r.asked = asked;
            if let Some(routes) = &self.routes {
                routes.close(entity, None);
            }
            // After the messages already in its mailbox (Akka sends its stop message the
            // same way): they reached the entity before it asked, so they are handled.
            // Messages arriving from now on wait for the entity started again.
            if r.actor.drain().is_err() {
                r.actor.stop(Some("passivated".into()));
            }
        }
    }

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
