//! The shard supervisor: one per hosted shard. It acquires the shard's lease through a
//! LeaseActor before starting any entity and keeps messages meanwhile; starts entities on
//! demand with the grant's fencing token; on `LeaseLost` stops **all** its entities and
//! waits for them before trying again; on hand-off lets them finish the messages they
//! have, stops them, releases the lease and gives back the messages it still kept;
//! passivates idle entities.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use serde_json::json;
use tenure_cluster::History;
use tenure_lease::{LeaseActor, LeaseEvent, LeaseEventSink, LeaseMsg, LeaseSpec, LeaseView};
use tokio::time::Instant;

use crate::entity::{EntityContext, EntityFactory, EntityMsg};
use crate::messages::{AskReply, Envelope, Pending as RegionPending};
use crate::settings::ShardingSettings;

/// Everything a shard needs.
#[derive(Clone)]
pub struct ShardArgs {
    pub type_name: String,
    pub shard_id: String,
    /// This node (`host:port`), the owner of the shard's lease.
    pub node: String,
    /// The lease `<system>-shard-<type>-<shard id>`.
    pub lease: LeaseSpec,
    pub factory: EntityFactory,
    pub settings: Arc<ShardingSettings>,
    pub history: Option<History>,
}

/// Where a shard stands (for inspection and tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardStatus {
    /// The token of the grant it serves under, while it serves.
    pub serving: Option<u64>,
    /// Ids of its running entities, sorted.
    pub entities: Vec<String>,
    /// Messages waiting for the lease or for a passivating entity.
    pub waiting: usize,
}

/// Messages of a shard (local only).
pub enum ShardMsg {
    /// A message for entity `entity`; `reply` for an ask.
    Deliver {
        entity: String,
        payload: Vec<u8>,
        reply: Option<RpcReplyPort<AskReply>>,
    },
    Lease(LeaseEvent),
    /// Stop entity `0` (it asked, or it was idle).
    Passivate(String),
    #[doc(hidden)]
    IdleCheck,
    /// Let every entity finish the messages in its mailbox and stop, release the lease,
    /// answer with the outcome and the messages not delivered, then stop.
    HandOff(RpcReplyPort<HandedOff>),
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

/// How entities stop.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// After the message in hand: the lease is gone or going.
    Now,
    /// After every message already in their mailboxes (a hand-off, under a lease still
    /// held and renewed): messages delivered to an entity are handled, not dropped.
    Drain,
}

struct Pending {
    entity: String,
    payload: Vec<u8>,
    reply: Option<RpcReplyPort<AskReply>>,
}

struct Running {
    actor: ActorRef<EntityMsg>,
    last: Instant,
    passivating: bool,
}

/// The shard actor.
pub struct Shard;

pub struct ShardState {
    args: ShardArgs,
    myself: ActorRef<ShardMsg>,
    lease: ActorRef<LeaseMsg>,
    view: LeaseView,
    /// The token of the grant entities run under, while serving.
    serving: Option<u64>,
    entities: HashMap<String, Running>,
    waiting: VecDeque<Pending>,
    handing_off: bool,
    idle_timer: Option<ractor::concurrency::JoinHandle<()>>,
}

impl Shard {
    /// Spawns the shard, linked to `supervisor` (its region) when given; it starts
    /// acquiring its lease at once.
    pub async fn start(
        args: ShardArgs,
        supervisor: Option<ractor::ActorCell>,
    ) -> Result<ActorRef<ShardMsg>, ractor::SpawnErr> {
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
    type Arguments = ShardArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ShardMsg>,
        args: ShardArgs,
    ) -> Result<ShardState, ActorProcessingErr> {
        let (lease, view) = LeaseActor::start(
            args.lease.clone(),
            LeaseEventSink::to_actor(myself.clone()),
            Some(myself.get_cell()),
        )
        .await?;
        lease.cast(LeaseMsg::Acquire { reply: None })?;
        let idle_timer = args.settings.idle_timeout.map(|idle| {
            let every = (idle / 2).max(Duration::from_millis(20));
            myself.send_interval(every, || ShardMsg::IdleCheck)
        });
        Ok(ShardState {
            args,
            myself,
            lease,
            view,
            serving: None,
            entities: HashMap::new(),
            waiting: VecDeque::new(),
            handing_off: false,
            idle_timer,
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
            } => {
                state
                    .deliver(Pending {
                        entity,
                        payload,
                        reply,
                    })
                    .await
            }
            ShardMsg::Lease(LeaseEvent::Granted(granted)) => {
                // Serve only a grant still believed now (not one lapsed before this event).
                if state.serving.is_none()
                    && !state.handing_off
                    && state.view.token() == Some(granted.token)
                {
                    state.serving = Some(granted.token);
                    tracing::debug!(shard = %state.args.shard_id, token = granted.token, "shard lease granted");
                    state.record("shard_started", granted.token, "");
                    state.flush().await;
                }
            }
            ShardMsg::Lease(LeaseEvent::Lost(lost)) => {
                if state.serving == Some(lost.token) {
                    tracing::warn!(shard = %state.args.shard_id, token = lost.token, reason = %lost.reason,
                        "shard lease lost: stopping its entities, then acquiring again");
                    state.record("shard_lease_lost", lost.token, &lost.reason.to_string());
                    state.stop_entities("lease lost", Stop::Now).await;
                    state.record(
                        "shard_stopped",
                        lost.token,
                        &format!("lease lost: {}", lost.reason),
                    );
                    state.serving = None;
                }
                if !state.handing_off {
                    state.lease.cast(LeaseMsg::Acquire { reply: None })?;
                }
            }
            // Shard leases are plain (priority 0): a forceful preemption arrives as a loss.
            ShardMsg::Lease(
                LeaseEvent::PreemptionRequested(_) | LeaseEvent::PreemptionWithdrawn(_),
            ) => {}
            ShardMsg::Passivate(entity) => state.passivate(&entity),
            ShardMsg::IdleCheck => {
                if let Some(idle) = state.args.settings.idle_timeout {
                    let now = Instant::now();
                    let idle: Vec<String> = state
                        .entities
                        .iter()
                        .filter(|(_, r)| !r.passivating && now.duration_since(r.last) >= idle)
                        .map(|(id, _)| id.clone())
                        .collect();
                    for id in idle {
                        state.passivate(&id);
                    }
                }
            }
            ShardMsg::HandOff(reply) => {
                state.handing_off = true;
                state.stop_entities("hand-off", Stop::Drain).await;
                if let Some(token) = state.serving.take() {
                    state.record("shard_stopped", token, "hand-off");
                }
                let released = state.release().await;
                let shard = state.args.shard_id.clone();
                let undelivered = std::mem::take(&mut state.waiting)
                    .into_iter()
                    .map(|p| RegionPending {
                        env: Envelope {
                            shard: shard.clone(),
                            entity: p.entity,
                            payload: p.payload,
                            hops: 0,
                        },
                        reply: p.reply,
                    })
                    .collect();
                let _ = reply.send(HandedOff {
                    released,
                    undelivered,
                });
                myself.stop(Some("handed off".into()));
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
            state.stop_entities("lease actor ended", Stop::Now).await;
            if let Some(token) = state.serving.take() {
                state.record("shard_stopped", token, "lease actor ended");
            }
            let (lease, view) = LeaseActor::start(
                state.args.lease.clone(),
                LeaseEventSink::to_actor(myself.clone()),
                Some(myself.get_cell()),
            )
            .await?;
            state.lease = lease;
            state.view = view;
            if !state.handing_off {
                state.lease.cast(LeaseMsg::Acquire { reply: None })?;
            }
            return Ok(());
        }
        let Some(id) = state
            .entities
            .iter()
            .find(|(_, r)| r.actor.get_id() == cell.get_id())
            .map(|(id, _)| id.clone())
        else {
            return Ok(());
        };
        state.entities.remove(&id);
        if let Some(token) = state.serving {
            state.record_entity("entity_stopped", &id, token, &why);
        }
        // Messages that arrived while it passivated go to its next incarnation.
        let (mine, others): (VecDeque<Pending>, VecDeque<Pending>) =
            std::mem::take(&mut state.waiting)
                .into_iter()
                .partition(|p| p.entity == id);
        state.waiting = others;
        for p in mine {
            state.deliver(p).await;
        }
        Ok(())
    }
}

impl ShardState {
    /// The grant entities may run under now: serving, and still believed (the local
    /// deadline has not passed, even if its Lost event is still on its way).
    fn live_token(&self) -> Option<u64> {
        self.serving.filter(|t| self.view.token() == Some(*t))
    }

    async fn deliver(&mut self, p: Pending) {
        if self.handing_off {
            // Kept for the shard's next home: the hand-off gives it back to the region.
            self.waiting.push_back(p);
            return;
        }
        let Some(token) = self.live_token() else {
            self.wait(p);
            return;
        };
        if let Some(r) = self.entities.get_mut(&p.entity) {
            if r.passivating {
                self.wait(p);
                return;
            }
            r.last = Instant::now();
            let _ = r.actor.cast(EntityMsg {
                payload: p.payload,
                reply: p.reply,
            });
            return;
        }
        let ctx = EntityContext {
            type_name: self.args.type_name.clone(),
            entity_id: p.entity.clone(),
            shard_id: self.args.shard_id.clone(),
            token,
            node: self.args.node.clone(),
            shard: self.myself.clone(),
            history: self.args.history.clone(),
        };
        match (self.args.factory)(ctx, self.myself.get_cell()).await {
            Ok(actor) => {
                self.record_entity("entity_started", &p.entity, token, "");
                let _ = actor.cast(EntityMsg {
                    payload: p.payload,
                    reply: p.reply,
                });
                self.entities.insert(
                    p.entity,
                    Running {
                        actor,
                        last: Instant::now(),
                        passivating: false,
                    },
                );
            }
            Err(e) => {
                tracing::warn!(shard = %self.args.shard_id, entity = %p.entity, error = %e, "entity could not be started");
                AskReply::fail(
                    p.reply,
                    format!("entity {} could not be started: {e}", p.entity),
                );
            }
        }
    }

    fn wait(&mut self, p: Pending) {
        if self.waiting.len() >= self.args.settings.buffer_size {
            AskReply::fail(
                p.reply,
                format!(
                    "shard {} buffer full ({} messages waiting)",
                    self.args.shard_id,
                    self.waiting.len()
                ),
            );
        } else {
            self.waiting.push_back(p);
        }
    }

    /// Delivers what waited for the lease.
    async fn flush(&mut self) {
        let waiting = std::mem::take(&mut self.waiting);
        for p in waiting {
            self.deliver(p).await;
        }
    }

    fn passivate(&mut self, entity: &str) {
        if let Some(r) = self.entities.get_mut(entity)
            && !r.passivating
        {
            r.passivating = true;
            r.actor.stop(Some("passivated".into()));
        }
    }

    /// Stops every entity and waits until all have terminated (one `stop-timeout`, then
    /// a kill for those still running).
    async fn stop_entities(&mut self, why: &str, how: Stop) {
        if self.entities.is_empty() {
            return;
        }
        let entities: Vec<(String, Running)> = self.entities.drain().collect();
        for (_, r) in &entities {
            match how {
                Stop::Now => r.actor.stop(Some(why.to_string())),
                Stop::Drain => {
                    if r.actor.drain().is_err() {
                        r.actor.stop(Some(why.to_string()));
                    }
                }
            }
        }
        let deadline = Instant::now() + self.args.settings.stop_timeout;
        for (id, r) in &entities {
            let left = deadline.saturating_duration_since(Instant::now());
            if r.actor.wait(Some(left)).await.is_err() {
                tracing::warn!(shard = %self.args.shard_id, entity = %id, "entity did not stop within stop-timeout; killing it");
                r.actor.kill();
                if r.actor
                    .wait(Some(self.args.settings.stop_timeout))
                    .await
                    .is_err()
                {
                    tracing::error!(shard = %self.args.shard_id, entity = %id, "entity survived a kill (blocked outside an await?)");
                }
            }
        }
        if let Some(token) = self.serving {
            for (id, _) in &entities {
                self.record_entity("entity_stopped", id, token, why);
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

    fn record(&self, event: &str, token: u64, why: &str) {
        if let Some(h) = &self.args.history {
            h.record(
                event,
                json!({"type": self.args.type_name, "shard": self.args.shard_id, "token": token, "why": why}),
            );
        }
    }

    fn record_entity(&self, event: &str, entity: &str, token: u64, why: &str) {
        if let Some(h) = &self.args.history {
            h.record(
                event,
                json!({"type": self.args.type_name, "shard": self.args.shard_id, "entity": entity, "token": token, "why": why}),
            );
        }
    }
}
