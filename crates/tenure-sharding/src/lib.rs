//! # tenure-sharding
//!
//! Cluster Sharding with a lease per shard (Akka's Cluster Sharding with `use-lease`):
//! entities of a type are spread over `number-of-shards` shards; a [`Region`] on every node
//! routes messages to them; a coordinator (a lease-guarded singleton) allocates shards to
//! regions; and each shard runs its entities only while its node holds the shard's lease
//! `<system>-shard-<type>-<shard id>` (owner: the node's `host:port`), passing entities the
//! grant's fencing token.
//!
//! ```no_run
//! # async fn run(node: &tenure_cluster::Node, provider: &tenure_lease::LeaseProvider)
//! #     -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use ractor::ActorProcessingErr;
//! use tenure_sharding::{Entity, EntityContext};
//!
//! /// Counts the asks each entity got since it started (its state lives in the actor).
//! struct Visits;
//!
//! impl Entity for Visits {
//!     type Request = ();
//!     type Reply = u64;
//!     type State = u64;
//!
//!     async fn start(&self, _ctx: &EntityContext) -> Result<u64, ActorProcessingErr> {
//!         Ok(0)
//!     }
//!
//!     async fn handle(&self, _ctx: &EntityContext, seen: &mut u64, _: ())
//!         -> Result<u64, ActorProcessingErr> {
//!         *seen += 1;
//!         Ok(*seen)
//!     }
//! }
//!
//! let factory = tenure_sharding::entity_factory(Visits);
//! let region = tenure_sharding::start_on_node(node, provider, "visits", Some(factory)).await?;
//! let seen: u64 = region.ask("alice", &(), Duration::from_secs(5)).await?;
//! println!("alice: {seen} visits");
//! # Ok(()) }
//! ```
//!
//! ## Why moving a shard early is safe
//!
//! A shard's entities run only while its host believes it holds the shard lease, and a
//! holder stops believing (its `LeaseLost` arrives, its entities are stopped and awaited)
//! at `send instant of its last successful renewal + ttl − safety-margin`, on its monotonic
//! clock, while the store keeps that grant at least `ttl` after it *processed* that renewal.
//! So the next host, which acquires only once the store has freed the lease, starts its
//! entities after the old host's have been told to stop, whatever the coordinator
//! believed. The coordinator may therefore move the shards of an unreachable node at once
//! (`unreachable-reallocate-after`) without risking two live copies: the new host waits
//! for the lease, which the old host gives back on hand-off, or which expires at most one
//! ttl after the old host's last renewal (a crashed, frozen or cut-off node). A node frozen
//! past its ttl may still run a write it started before the freeze: that write carries the
//! old fencing token, which a resource that checks tokens (as `tenure demo`'s counter does)
//! refuses once the new host has written.

mod active;
pub mod allocation;
mod coordinator;
pub mod daemon;
mod direct;
pub mod durable;
mod entity;
mod entity_ref;
mod history;
mod messages;
pub mod metrics;
mod placement;
mod region;
pub mod remember;
mod settings;
mod shard;
pub mod shard_map;
#[cfg(test)]
mod test_regions;

pub use active::ActiveEntities;
pub use allocation::{AllocationStrategy, LeastShards, Regions};
pub use coordinator::{ClusterEvents, Coordinator, CoordinatorArgs, CoordinatorLease};
pub use direct::Routes;
pub use durable::{
    Durable, DurableEntity, DurableError, Effect, durable_entity_factory, persistence_id,
};
pub use entity::{
    Entity, EntityActor, EntityContext, EntityFactory, EntityMsg, Payload, StartingEntity,
    entity_factory, shard_of,
};
pub use entity_ref::EntityRef;
pub use messages::{
    Allocation, AllocationRequest, AskFailure, AskReply, CoordinatorMsg, Envelope, Pending,
    RegionMsg,
};
pub use region::{Region, RegionArgs, region_group, region_ref};
pub use settings::{REFERENCE, ShardingConfig, ShardingSettings};
pub use shard::{HandedOff, Shard, ShardArgs, ShardMsg, ShardStatus};
pub use shard_map::{HostedShard, RegionShards, ShardEntry, ShardMap};

use std::sync::Arc;
use std::time::Duration;

use direct::Ticket;
use ractor::{Actor, ActorRef};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tenure_cluster::{ClusterSubscriber, Node};
use tenure_lease::{FencingToken, LeaseProvider};
use tenure_singleton::{SingletonProxy, SingletonSettings, spawner};

/// Why a message could not be sent, answered or set up.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ShardingError {
    /// The configuration could not be read.
    #[error(transparent)]
    Config(#[from] tenure_lease::ConfigError),
    /// The entity type could not be started on this node (its region, coordinator or settings).
    #[error("entity type `{type_name}`: cannot start: {detail}")]
    Start {
        /// The entity type.
        type_name: String,
        /// Why.
        detail: String,
    },
    /// The request could not be encoded by the type's codec, or is larger than
    /// `cluster.max-frame-size` allows; nothing was sent.
    #[error(
        "entity type `{type_name}`: the request for entity `{entity}` could not be encoded: {source}"
    )]
    Encode {
        /// The entity type.
        type_name: String,
        /// The entity id.
        entity: String,
        /// Why: the codec's error, or the size over the limit.
        #[source]
        source: tenure_cluster::codec::EncodeError,
    },
    /// The entity's reply could not be decoded into the expected reply type.
    #[error("entity type `{type_name}`: the reply of entity `{entity}` could not be decoded")]
    Decode {
        /// The entity type.
        type_name: String,
        /// The entity id.
        entity: String,
    },
    /// No reply within the ask's timeout: the outcome is unknown. The ask is not kept
    /// anywhere past it (a region drops it at its next `retry-interval` tick at the latest).
    #[error("entity `{entity}` of `{type_name}` (shard {shard}): no answer within {timeout:?}")]
    Timeout {
        /// The entity type.
        type_name: String,
        /// The entity's shard.
        shard: String,
        /// The entity id.
        entity: String,
        /// The ask's timeout.
        timeout: Duration,
    },
    /// The bounded buffer of the entity's shard (`buffer-size`) was full: the request was
    /// refused and certainly not delivered.
    #[error(
        "entity `{entity}` of `{type_name}`: the buffer of shard {shard} is full ({capacity} messages wait); not delivered"
    )]
    BufferFull {
        /// The entity type.
        type_name: String,
        /// The entity's shard.
        shard: String,
        /// The entity id.
        entity: String,
        /// The buffer's capacity (`buffer-size`).
        capacity: usize,
    },
    /// The ask failed: the entity failed or could not start, or the shard has no stable home.
    #[error("entity `{entity}` of `{type_name}`: {detail}")]
    Failed {
        /// The entity type.
        type_name: String,
        /// The entity id.
        entity: String,
        /// Why, as the serving side reported it.
        detail: String,
    },
    /// This node's region of the entity type has stopped; nothing was sent.
    #[error("entity type `{type_name}`: the region of this node has stopped")]
    Stopped {
        /// The entity type.
        type_name: String,
    },
    /// An operator's placement names a shard the type does not have, or a node that is not
    /// a `host:port` address; nothing was sent.
    #[error("entity type `{type_name}`: cannot place shard `{shard}`: {detail}")]
    InvalidPlacement {
        /// The entity type.
        type_name: String,
        /// The shard asked to move.
        shard: String,
        /// What is wrong with the shard id or the address.
        detail: String,
    },
    /// The coordinator refused an operator's placement of a shard.
    #[error("entity type `{type_name}`: shard `{shard}`: {detail}")]
    Placement {
        /// The entity type.
        type_name: String,
        /// The shard asked to move.
        shard: String,
        /// Why (the node cannot take shards, the shard is moving already, ...).
        detail: String,
    },
    /// A sharded daemon's number of workers out of range (0, or above the type's
    /// `number-of-shards`); nothing changed.
    #[error(
        "daemon `{daemon}`: cannot run {count} workers: a resize asks for 1 to {maximum} (its number-of-shards)"
    )]
    WorkerCount {
        /// The daemon's name.
        daemon: String,
        /// The count asked for.
        count: usize,
        /// The most workers it may run.
        maximum: usize,
    },
    /// The coordinator refused a daemon's resize (one still in progress, the count could
    /// not be stored, the type is not a daemon's).
    #[error("daemon `{daemon}`: cannot resize to {count} workers: {detail}")]
    Resize {
        /// The daemon's name.
        daemon: String,
        /// The count asked for.
        count: usize,
        /// Why.
        detail: String,
    },
    /// No coordinator of the type answered within `timeout` (none runs yet, or it is
    /// moving); the request may or may not have been taken.
    #[error("entity type `{type_name}`: no coordinator answered within {timeout:?}")]
    NoCoordinator {
        /// The entity type.
        type_name: String,
        /// How long it waited.
        timeout: Duration,
    },
}

/// A node's region of one entity type: send to any entity of the type through it.
#[derive(Clone)]
pub struct ShardRegion {
    type_name: String,
    /// This node (`host:port`).
    node: String,
    number_of_shards: usize,
    actor: ActorRef<RegionMsg>,
    coordinator: SingletonProxy<CoordinatorMsg>,
    /// The local fast path to entities running on this node (see [`Routes`]).
    routes: Arc<Routes>,
    meters: metrics::HandleMeters,
    readiness: tenure_cluster::ReadinessGate,
    /// Asks in flight, which the node's shutdown waits for.
    requests: tenure_cluster::Requests,
}

const CODEC: &str = "entity request";

impl ShardRegion {
    /// The entity type.
    pub fn type_name(&self) -> &str {
        &self.type_name
    }

    /// `Ok` once this region serves: a coordinator answered its registration with the shard
    /// homes it knew. It stays ready through coordinator fail-overs (messages wait in the
    /// region's buffer meanwhile) and is not ready while its node leaves or is down, or
    /// once the region stopped. The node's [`readiness`](tenure_cluster::Node::readiness)
    /// includes it.
    pub fn readiness(&self) -> Result<(), tenure_cluster::NotReady> {
        self.readiness.check()
    }

    /// The region actor.
    pub fn actor(&self) -> &ActorRef<RegionMsg> {
        &self.actor
    }

    /// A typed reference to entity `entity_id` of this region's type, whose entity is `E`
    /// (the [`Entity`] its hosting nodes started it with): its `ask` and `tell` take
    /// `E::Request` and answer `E::Reply`, checked at compile time.
    pub fn entity_ref<E: Entity>(&self, entity_id: impl Into<String>) -> EntityRef<E> {
        EntityRef::new(self.clone(), entity_id.into())
    }

    /// The shard of `entity`.
    pub fn shard_of(&self, entity: &str) -> String {
        shard_of(entity, self.number_of_shards)
    }

    fn encode<R: Serialize>(&self, entity: &str, request: &R) -> Result<Payload, ShardingError> {
        Payload::encode(&self.type_name, request).map_err(|source| ShardingError::Encode {
            type_name: self.type_name.clone(),
            entity: entity.to_string(),
            source,
        })
    }

    #[cfg(test)]
    fn envelope<R: Serialize>(&self, entity: &str, request: &R) -> Result<Envelope, ShardingError> {
        Ok(Envelope {
            shard: self.shard_of(entity),
            entity: entity.to_string(),
            payload: self.encode(entity, request)?.into_vec(),
            hops: 0,
        })
    }

    /// Sends `request` to `entity`, fire-and-forget: delivered at most once, in order per
    /// sender while its shard stays put. An entity running on this node gets it straight
    /// into its mailbox, and one on another node through that node's region without passing
    /// this node's, when that keeps the order (see [`Routes`]).
    pub fn tell<R: Serialize>(&self, entity: &str, request: &R) -> Result<(), ShardingError> {
        let payload = self.encode(entity, request)?;
        self.meters.tell();
        let msg = EntityMsg {
            payload,
            reply: None,
        };
        let Err((msg, ticket)) = self.send_direct(entity, msg) else {
            return Ok(());
        };
        self.route(entity, msg, ticket)
    }

    /// Sends `request` to each of `entities`, fire-and-forget, as [`tell`](Self::tell)
    /// does, except that those of other nodes leave through this node's region, in one
    /// message per node (a round of daemon keep-alives).
    pub(crate) fn tell_each<R: Serialize>(
        &self,
        entities: &[String],
        request: &R,
    ) -> Result<(), ShardingError> {
        let Some(first) = entities.first() else {
            return Ok(());
        };
        let payload = self.encode(first, request)?;
        let mut routed = Vec::new();
        for entity in entities {
            self.meters.tell();
            let msg = EntityMsg {
                payload: payload.clone(),
                reply: None,
            };
            // Straight into the mailbox of an entity running here, when that keeps the
            // order; the rest through the region.
            if let Err((msg, ticket)) = self.routes.send(entity, msg) {
                routed.push(Pending {
                    env: Envelope {
                        shard: self.shard_of(entity),
                        entity: entity.clone(),
                        payload: msg.payload.into_vec(),
                        hops: 0,
                    },
                    reply: None,
                    ticket: Some(ticket),
                });
            }
        }
        if routed.is_empty() {
            return Ok(());
        }
        self.actor
            .cast(RegionMsg::Local(messages::RegionLocal::RouteAll(routed)))
            .map_err(|_| ShardingError::Stopped {
                type_name: self.type_name.clone(),
            })
    }

    /// Sends `msg` straight to its entity on this node, or to the region of its shard's
    /// home on another node, when [`Routes`] allows it (never once this node's region has
    /// stopped: then nothing more leaves through it); otherwise gives it back with its
    /// ticket for the routed path.
    fn send_direct(&self, entity: &str, msg: EntityMsg) -> Result<(), (EntityMsg, Ticket)> {
        if self.actor.get_status() == ractor::ActorStatus::Running {
            self.routes
                .send_from_handle(entity, msg, self.number_of_shards)
        } else {
            self.routes.send(entity, msg)
        }
    }

    /// Sends `msg` for `entity` through this node's region (the routed path), with its
    /// `ticket`.
    fn route(&self, entity: &str, msg: EntityMsg, ticket: Ticket) -> Result<(), ShardingError> {
        let p = Pending {
            env: Envelope {
                shard: self.shard_of(entity),
                entity: entity.to_string(),
                payload: msg.payload.into_vec(),
                hops: 0,
            },
            reply: msg.reply,
            ticket: Some(ticket),
        };
        self.actor
            .cast(RegionMsg::Local(messages::RegionLocal::Route(p)))
            .map_err(|_| ShardingError::Stopped {
                type_name: self.type_name.clone(),
            })
    }

    /// Sends `request` to `entity` and waits up to `timeout` for its reply. `Err` means the
    /// outcome is unknown (the entity may have handled it), except `Encode` and
    /// `BufferFull` (certainly not delivered). [`entity_ref`](Self::entity_ref) gives the
    /// same, typed by the entity.
    pub async fn ask<R: Serialize, P: DeserializeOwned>(
        &self,
        entity: &str,
        request: &R,
        timeout: Duration,
    ) -> Result<P, ShardingError> {
        let payload = self.encode(entity, request)?;
        // Counted until answered (or timed out): a leaving node answers it before it closes
        // its sessions.
        let _in_flight = self.requests.start();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let msg = EntityMsg {
            payload,
            reply: Some((tx, timeout).into()),
        };
        // As `ActorRef::call`: the reply port carries the timeout (holders drop an expired
        // ask), and the caller waits for at most that long.
        let sent = match self.send_direct(entity, msg) {
            Ok(()) => Ok(()),
            Err((msg, ticket)) => self.route(entity, msg, ticket),
        };
        let answer = match sent {
            Err(_) => Err(()),
            Ok(()) => Ok(match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(reply)) => ractor::rpc::CallResult::Success(reply),
                Ok(Err(_)) => ractor::rpc::CallResult::SenderError,
                Err(_) => ractor::rpc::CallResult::Timeout,
            }),
        };
        let failed = |detail: String| ShardingError::Failed {
            type_name: self.type_name.clone(),
            entity: entity.to_string(),
            detail,
        };
        self.meters.ask(match &answer {
            Ok(ractor::rpc::CallResult::Success(AskReply { result: Ok(_) })) => {
                metrics::AskOutcome::Ok
            }
            Ok(ractor::rpc::CallResult::Timeout) => metrics::AskOutcome::Timeout,
            Err(_) => metrics::AskOutcome::Stopped,
            Ok(_) => metrics::AskOutcome::Failed,
        });
        match answer {
            Ok(ractor::rpc::CallResult::Success(AskReply { result: Ok(bytes) })) => {
                tenure_cluster::codec::decode_inner(CODEC, &self.type_name, &bytes).map_err(|_| {
                    ShardingError::Decode {
                        type_name: self.type_name.clone(),
                        entity: entity.to_string(),
                    }
                })
            }
            Ok(ractor::rpc::CallResult::Success(AskReply {
                result:
                    Err(AskFailure::BufferFull {
                        type_name,
                        shard,
                        capacity,
                    }),
            })) => Err(ShardingError::BufferFull {
                type_name,
                shard,
                entity: entity.to_string(),
                capacity,
            }),
            Ok(ractor::rpc::CallResult::Success(AskReply {
                result: Err(AskFailure::Other(e)),
            })) => Err(failed(e)),
            Ok(ractor::rpc::CallResult::Timeout) => Err(ShardingError::Timeout {
                type_name: self.type_name.clone(),
                shard: self.shard_of(entity),
                entity: entity.to_string(),
                timeout,
            }),
            Ok(ractor::rpc::CallResult::SenderError) => {
                Err(failed("dropped before it was answered".into()))
            }
            Err(_) => Err(ShardingError::Stopped {
                type_name: self.type_name.clone(),
            }),
        }
    }

    /// The coordinator's allocation (shard → region), if a coordinator answers in time.
    pub async fn allocation(&self, timeout: Duration) -> Option<Allocation> {
        self.coordinator
            .call(
                |r| CoordinatorMsg::GetAllocation(AllocationRequest {}, r),
                timeout,
            )
            .await
            .ok()
    }

    /// The shards running on this node, by id, each as it answers within `timeout` (one
    /// that does not, because it is stopping, is left out). `Err` when the region stopped.
    pub async fn hosted(
        &self,
        timeout: Duration,
    ) -> Result<std::collections::BTreeMap<String, HostedShard>, ShardingError> {
        Ok(self.hosted_and_homes(timeout).await?.0)
    }

    async fn hosted_and_homes(
        &self,
        timeout: Duration,
    ) -> Result<
        (
            std::collections::BTreeMap<String, HostedShard>,
            Vec<(String, String)>,
        ),
        ShardingError,
    > {
        let stopped = || ShardingError::Stopped {
            type_name: self.type_name.clone(),
        };
        let snapshot = match self
            .actor
            .call(
                |r| RegionMsg::Local(messages::RegionLocal::Snapshot(r)),
                Some(timeout),
            )
            .await
        {
            Ok(ractor::rpc::CallResult::Success(s)) => s,
            _ => return Err(stopped()),
        };
        let statuses = snapshot.shards.into_iter().map(|(id, shard)| async move {
            match shard.call(ShardMsg::Status, Some(timeout)).await {
                Ok(ractor::rpc::CallResult::Success(s)) => Some((
                    id,
                    HostedShard {
                        token: s.serving,
                        entities: s.entities,
                        waiting: s.waiting,
                    },
                )),
                _ => None,
            }
        });
        let hosted = futures::future::join_all(statuses)
            .await
            .into_iter()
            .flatten()
            .collect();
        Ok((hosted, snapshot.homes))
    }

    /// The type's shard map as this node knows it (Akka's `GetShardRegionState` and
    /// `GetClusterShardingStats` in one): every allocated shard with its home from the
    /// coordinator, and for the shards running here their entities and lease token. Each
    /// part waits at most `timeout`; without a coordinator's answer the homes are the
    /// region's own (see [`ShardMap::from_coordinator`]). `Err` when the region stopped.
    pub async fn shard_map(&self, timeout: Duration) -> Result<ShardMap, ShardingError> {
        let (allocation, local) =
            futures::join!(self.allocation(timeout), self.hosted_and_homes(timeout));
        let (hosted, homes) = local?;
        Ok(ShardMap::build(
            &self.type_name,
            &self.node,
            allocation,
            homes,
            hosted,
        ))
    }

    /// Pins `shard` to the region on node `to` (`host:port`) and moves it there through the
    /// lossless hand-off (Akka's external shard allocation): from then on the coordinator
    /// allocates it there, and no rebalance moves it away; while that region cannot take
    /// shards, the allocation strategy places it, and a rebalance brings it back later.
    /// `Ok(true)`: the move began (it ends once the shard runs there, see
    /// [`shard_map`](Self::shard_map)); `Ok(false)`: it lives there already.
    /// `Err(InvalidPlacement)`: `shard` is not one of the type's shard ids (`0` to
    /// `number-of-shards - 1`) or `to` is not `host:port`. `Err(Placement)` names why the
    /// coordinator refused (`to` has no region that can take shards, the shard is moving
    /// already, the pin could not be stored); `Err(NoCoordinator)`: none answered within
    /// `timeout` (the pin may or may not be set: ask again). Nothing is pinned on the
    /// other errors. `Ok` comes once the pin is stored with the coordinator's lease: a
    /// coordinator that takes over after a fail-over keeps it (see docs/sharding.md).
    pub async fn pin_shard(
        &self,
        shard: &str,
        to: &str,
        timeout: Duration,
    ) -> Result<bool, ShardingError> {
        self.check_shard(shard)?;
        let to = tenure_cluster::NodeAddr::parse("node", to).map_err(|e| {
            ShardingError::InvalidPlacement {
                type_name: self.type_name.clone(),
                shard: shard.to_string(),
                detail: e.to_string(),
            }
        })?;
        self.place(shard, Some(to.to_string()), timeout).await
    }

    /// `Err(InvalidPlacement)` unless `shard` is one of the type's shard ids.
    fn check_shard(&self, shard: &str) -> Result<(), ShardingError> {
        if shard
            .parse::<usize>()
            .is_ok_and(|n| n < self.number_of_shards && n.to_string() == shard)
        {
            return Ok(());
        }
        Err(ShardingError::InvalidPlacement {
            type_name: self.type_name.clone(),
            shard: shard.to_string(),
            detail: format!(
                "not a shard id (the type's shards are 0 to {})",
                self.number_of_shards.saturating_sub(1)
            ),
        })
    }

    /// Removes the pin of `shard` (see [`pin_shard`](Self::pin_shard)), in the store too:
    /// the allocation strategy places it again. It stays where it runs until a rebalance
    /// moves it. `Ok` once the removal is stored; `Err(InvalidPlacement)` for a shard id the
    /// type does not have; `Err(Placement)` when the coordinator could not store it;
    /// `Err(NoCoordinator)` when no coordinator answered within `timeout`.
    pub async fn unpin_shard(&self, shard: &str, timeout: Duration) -> Result<(), ShardingError> {
        self.check_shard(shard)?;
        self.place(shard, None, timeout).await.map(|_| ())
    }

    async fn place(
        &self,
        shard: &str,
        to: Option<String>,
        timeout: Duration,
    ) -> Result<bool, ShardingError> {
        let request = messages::PinShard {
            shard: shard.to_string(),
            to,
        };
        match self
            .coordinator
            .call(|r| CoordinatorMsg::PinShard(request, r), timeout)
            .await
        {
            Ok(messages::PinReply { result }) => {
                result.map_err(|detail| ShardingError::Placement {
                    type_name: self.type_name.clone(),
                    shard: shard.to_string(),
                    detail,
                })
            }
            Err(_) => Err(ShardingError::NoCoordinator {
                type_name: self.type_name.clone(),
                timeout,
            }),
        }
    }

    /// Stops this node's region (its shards hand off first).
    pub async fn stop(&self) {
        let _ = self.actor.stop_and_wait(None, None).await;
        self.coordinator.stop();
    }
}

/// The coordinator singleton's name for `type_name`.
pub fn coordinator_name(type_name: &str) -> String {
    format!("sharding-{type_name}-coordinator")
}

/// Runs entity type `type_name` on `node`: settings from `[sharding]` /
/// `[sharding.<type>]`, a region that hosts shards when `factory` is given and the node has
/// the type's role (otherwise proxy-only), and a coordinator singleton manager on every
/// hosting node. Every node that sends to or hosts the type calls this.
pub async fn start_on_node(
    node: &Node,
    provider: &LeaseProvider,
    type_name: &str,
    factory: Option<EntityFactory>,
) -> Result<ShardRegion, ShardingError> {
    start_with_strategy(node, provider, type_name, factory, None).await
}

/// As [`start_on_node`] with an allocation strategy (`None`: [`LeastShards`] with the
/// type's `rebalance-threshold`, `rebalance-relative-limit` and `rebalance-absolute-limit`).
pub async fn start_with_strategy(
    node: &Node,
    provider: &LeaseProvider,
    type_name: &str,
    factory: Option<EntityFactory>,
    strategy: Option<Arc<dyn AllocationStrategy>>,
) -> Result<ShardRegion, ShardingError> {
    let settings = ShardingSettings::from_config(
        provider.config(),
        type_name,
        &node.settings().lease_section,
    )?;
    start_with_settings(node, provider, type_name, factory, strategy, settings, None).await
}

/// As [`start_with_strategy`] with `settings` given rather than read from the
/// configuration (the [sharded daemon process](daemon) sets its number of shards), and for
/// a daemon's type the number of workers it starts with (`daemon`).
pub(crate) async fn start_with_settings(
    node: &Node,
    provider: &LeaseProvider,
    type_name: &str,
    factory: Option<EntityFactory>,
    strategy: Option<Arc<dyn AllocationStrategy>>,
    settings: ShardingSettings,
    daemon: Option<usize>,
) -> Result<ShardRegion, ShardingError> {
    let cluster = node.settings();
    let settings = Arc::new(settings);
    let strategy = strategy.unwrap_or_else(|| Arc::new(LeastShards::from_settings(&settings)));
    let start_err = |detail: String| ShardingError::Start {
        type_name: type_name.to_string(),
        detail,
    };
    let me = node.addr().to_string();
    let scope = tenure_cluster::scope(&cluster.system);
    let name = coordinator_name(type_name);
    let hosts = factory.is_some()
        && settings
            .role
            .as_ref()
            .is_none_or(|role| cluster.roles.contains(role));
    let hosting = match factory.filter(|_| hosts) {
        Some(factory) => {
            let template = provider
                .spec(
                    &tenure_lease::names::shard_lease(&cluster.system, type_name, "0"),
                    &settings.lease_section,
                    &me,
                )
                .await?;
            if settings.remember_entities {
                check_remembering(type_name, &template)?;
            }
            let mut singleton =
                SingletonSettings::from_config(provider.config(), &name, &settings.lease_section)?;
            singleton.role = settings.role.clone();
            let lease = provider
                .spec(
                    &tenure_lease::names::singleton_lease(&cluster.system, &name),
                    &singleton.lease_section,
                    &me,
                )
                .await?;
            let args = CoordinatorArgs {
                type_name: type_name.to_string(),
                scope: scope.clone(),
                settings: settings.clone(),
                strategy: strategy.clone(),
                subscriptions: Arc::new(node.subscriptions()),
                token: FencingToken::new(0),
                store: template.store.clone(),
                system: cluster.system.clone(),
                list_timeout: template.settings.lease_operation_timeout,
                lease: CoordinatorLease {
                    store: lease.store,
                    name: lease.store_name,
                    owner: me.clone(),
                },
                daemon,
            };
            tenure_singleton::start_with_settings(
                node,
                provider,
                &name,
                singleton,
                spawner(move |token| {
                    (
                        Coordinator,
                        CoordinatorArgs {
                            token,
                            ..args.clone()
                        },
                    )
                }),
            )
            .await
            .map_err(|e| start_err(e.to_string()))?;
            Some((factory, template))
        }
        None => None,
    };
    let coordinator = SingletonProxy::<CoordinatorMsg>::start(&scope, &name, settings.buffer_size)
        .await
        .map_err(|e| start_err(format!("coordinator proxy: {e}")))?;
    let routes = Arc::new(Routes::default());
    let readiness = node.readiness().gate(
        format!("region of `{type_name}`"),
        "not registered with a coordinator yet (no shard homes known)",
    );
    let args = RegionArgs {
        type_name: type_name.to_string(),
        me,
        scope,
        system: cluster.system.clone(),
        settings: settings.clone(),
        hosting,
        coordinator: coordinator.clone(),
        routes: routes.clone(),
        readiness: readiness.clone(),
    };
    let (actor, _) = Actor::spawn(None, Region, args)
        .await
        .map_err(|e| start_err(format!("region: {e}")))?;
    node.subscribe(ClusterSubscriber::to_actor(actor.clone()))
        .map_err(|e| start_err(e.to_string()))?;
    Ok(ShardRegion {
        type_name: type_name.to_string(),
        node: node.addr().to_string(),
        number_of_shards: settings.number_of_shards,
        actor,
        coordinator,
        routes,
        meters: metrics::HandleMeters::new(type_name),
        readiness,
        requests: node.shutdown().requests().clone(),
    })
}

/// remember-entities needs a store that keeps remembered ids (every store of this
/// workspace does): refused at start on any other.
fn check_remembering(
    type_name: &str,
    template: &tenure_lease::LeaseSpec,
) -> Result<(), ShardingError> {
    match remember::ids_of(&*template.store) {
        Ok(_) => Ok(()),
        Err(e) => Err(ShardingError::Start {
            type_name: type_name.to_string(),
            detail: format!("remember-entities is on, but {e}"),
        }),
    }
}
