//! Entities: one local `ractor` actor per entity id, started by its shard on demand under
//! the shard's lease, with the grant's fencing token. Entity messages never cross nodes as
//! actor messages: regions carry them as encoded payloads.

use std::future::Future;
use std::sync::Arc;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SpawnErr};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use smallvec::SmallVec;
use tenure_cluster::codec::EncodeError;
use tenure_lease::FencingToken;

use crate::messages::{AskFailure, AskReply};
use crate::shard::ShardMsg;

/// The default shard of an entity: a stable hash of its id modulo the number of shards, so
/// every node (and every build) maps an id to the same shard.
pub fn shard_of(entity_id: &str, number_of_shards: usize) -> String {
    let digest = Sha256::digest(entity_id.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) % number_of_shards.max(1) as u64).to_string()
}

/// What an entity is started with.
#[derive(Clone)]
pub struct EntityContext {
    /// The entity type.
    pub type_name: String,
    /// The entity id.
    pub entity_id: String,
    /// The shard id of the entity.
    pub shard_id: String,
    /// The fencing token of the shard's lease grant: present it with every write to a
    /// resource that checks tokens.
    pub token: FencingToken,
    /// The node hosting it (`host:port`).
    pub node: String,
    /// The shard's lease as its store names it: with `owner` and `token`, the fence of a
    /// write checked inside the lease store's own transaction ([`EntityContext::fence`]).
    pub lease: String,
    /// The owner of the shard's lease grant (this node's `host:port`).
    pub owner: String,
    pub(crate) shard: ActorRef<ShardMsg>,
}

impl EntityContext {
    /// The fence of a write under the shard's grant: lease, owner and token, as a journal
    /// (or the stores' own fenced writes) checks them.
    pub fn fence(&self) -> tenure_journal::Fence {
        tenure_journal::Fence::new(&self.lease, &self.owner, self.token)
    }

    /// Asks the shard to stop this entity (passivation). Messages arriving meanwhile are
    /// kept and delivered to the entity started again for them. With `remember-entities`,
    /// the entity is also forgotten once stopped: it is not started again after a hand-off
    /// or a crash (until a message starts it).
    pub fn passivate(&self) {
        let _ = self.shard.cast(ShardMsg::Passivate(self.entity_id.clone()));
    }
}

/// Bytes of a request carried inside its message rather than in an allocation of its own.
const INLINE: usize = 32;

/// An encoded entity request: up to 32 bytes inline, in the message that carries it, so
/// that a small request costs no allocation of its own and reaches the entity in the same
/// memory as its message; larger ones on the heap.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Payload(SmallVec<[u8; INLINE]>);

impl Payload {
    /// `request` encoded as the entity type's codec does; `Err(Serialize)` when it cannot
    /// be encoded, `Err(TooLarge)` when it is over the cluster's frame size limit.
    pub(crate) fn encode<R: Serialize>(type_name: &str, request: &R) -> Result<Self, EncodeError> {
        tenure_cluster::codec::encode_inner_to(REQUEST, type_name, request, SmallVec::new())
            .map(Payload)
    }

    /// The bytes, as a vector (for a message leaving through a region).
    pub fn into_vec(self) -> Vec<u8> {
        self.0.into_vec()
    }
}

impl std::ops::Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Payload").field(&&self.0[..]).finish()
    }
}

impl From<Vec<u8>> for Payload {
    /// Inline when it fits, whatever the vector's capacity.
    fn from(v: Vec<u8>) -> Self {
        if v.len() <= INLINE {
            Payload(SmallVec::from_slice(&v))
        } else {
            Payload(SmallVec::from_vec(v))
        }
    }
}

/// The codec's name for entity requests and replies (in its warnings).
pub(crate) const REQUEST: &str = "entity request";

/// A message for an entity actor: an encoded request and, for `ask`, where the encoded
/// reply goes.
pub struct EntityMsg {
    /// The request, encoded by the entity type's codec.
    pub payload: Payload,
    /// Where an ask's reply goes; `None` for a tell.
    pub reply: Option<RpcReplyPort<AskReply>>,
}

impl ractor::Message for EntityMsg {}

/// An entity actor whose `start` may still be running: its ref at once (so that it can be
/// stopped or killed while starting), and the task that ends when `start` finished (`Ok`,
/// then the actor is linked to its shard) or failed (also when it was killed meanwhile).
pub struct StartingEntity {
    /// The entity actor.
    pub actor: ActorRef<EntityMsg>,
    /// Ends when `start` finished or failed.
    pub started: tenure_singleton::StartHandle,
}

/// Spawns an entity actor for `ctx` without waiting for its `start` (user code, which
/// must never hold up its shard); it is linked to `supervisor`, the shard, once started.
pub type EntityFactory =
    Arc<dyn Fn(EntityContext, ActorCell) -> Result<StartingEntity, SpawnErr> + Send + Sync>;

/// A typed entity: requests and replies are serde types, state lives in the actor.
pub trait Entity: Send + Sync + 'static {
    /// What the entity is asked.
    type Request: Serialize + DeserializeOwned + Send + 'static;
    /// What it answers to an ask.
    type Reply: Serialize + DeserializeOwned + Send + 'static;
    /// The entity's state, built by `start`.
    type State: Send + 'static;

    /// Builds the state when the entity starts (after its shard's lease was granted).
    fn start(
        &self,
        ctx: &EntityContext,
    ) -> impl Future<Output = Result<Self::State, ActorProcessingErr>> + Send;

    /// Handles one request. An `Err` is sent back to an asking caller and stops the entity
    /// (the next message starts it again).
    fn handle(
        &self,
        ctx: &EntityContext,
        state: &mut Self::State,
        request: Self::Request,
    ) -> impl Future<Output = Result<Self::Reply, ActorProcessingErr>> + Send;

    /// Runs when the entity stops gracefully (passivation, hand-off, lease lost); not
    /// when it is killed after `stop-timeout` (a kill also interrupts a running `stop` or
    /// `start`).
    fn stop(
        &self,
        ctx: &EntityContext,
        state: &mut Self::State,
    ) -> impl Future<Output = ()> + Send {
        let _ = (ctx, state);
        async {}
    }
}

/// The factory of entity type `E`: one [`EntityActor`] per entity id.
pub fn entity_factory<E: Entity>(entity: E) -> EntityFactory {
    let entity = Arc::new(entity);
    Arc::new(move |ctx, supervisor| {
        let (actor, started) = ractor::ActorRuntime::spawn_linked_instant(
            None,
            EntityActor::<E>::default(),
            (entity.clone(), ctx),
            supervisor,
        )?;
        Ok(StartingEntity { actor, started })
    })
}

/// The actor running a typed [`Entity`].
pub struct EntityActor<E>(std::marker::PhantomData<fn() -> E>);

impl<E> Default for EntityActor<E> {
    fn default() -> Self {
        EntityActor(std::marker::PhantomData)
    }
}

pub struct EntityActorState<E: Entity> {
    entity: Arc<E>,
    ctx: EntityContext,
    state: E::State,
}

impl<E: Entity> Actor for EntityActor<E> {
    type Msg = EntityMsg;
    type State = EntityActorState<E>;
    type Arguments = (Arc<E>, EntityContext);

    async fn pre_start(
        &self,
        _myself: ActorRef<EntityMsg>,
        (entity, ctx): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let state = entity.start(&ctx).await?;
        Ok(EntityActorState { entity, ctx, state })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<EntityMsg>,
        s: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        s.entity.stop(&s.ctx, &mut s.state).await;
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<EntityMsg>,
        msg: EntityMsg,
        s: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        const KIND: &str = REQUEST;
        let request =
            tenure_cluster::codec::decode_inner::<E::Request>(KIND, &s.ctx.type_name, &msg.payload)
                .map_err(|_| format!("entity {}: undecodable request", s.ctx.entity_id))?;
        match s.entity.handle(&s.ctx, &mut s.state, request).await {
            Ok(reply) => {
                if let Some(port) = msg.reply {
                    let result =
                        tenure_cluster::codec::encode_inner(KIND, &s.ctx.type_name, &reply)
                            .map_err(|_| AskFailure::Other("reply could not be encoded".into()));
                    let _ = port.send(AskReply { result });
                }
                Ok(())
            }
            Err(e) => {
                if let Some(port) = msg.reply {
                    AskReply::fail(Some(port), e.to_string());
                }
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_requests_travel_inline_and_every_request_keeps_the_codecs_bytes() {
        let small = Payload::encode("t", &(7u64, "abc")).unwrap();
        assert!(!small.0.spilled(), "a small request was allocated apart");
        let at_limit = Payload::encode("t", &vec![1u8; INLINE - 1]).unwrap();
        assert_eq!(at_limit.len(), INLINE);
        assert!(!at_limit.0.spilled());
        let large = Payload::encode("t", &"x".repeat(100)).unwrap();
        assert!(large.0.spilled());
        for (p, expected) in [
            (
                &small,
                tenure_cluster::codec::encode_inner(REQUEST, "t", &(7u64, "abc")),
            ),
            (
                &large,
                tenure_cluster::codec::encode_inner(REQUEST, "t", &"x".repeat(100)),
            ),
        ] {
            assert_eq!(&p[..], &expected.unwrap()[..]);
        }
        assert_eq!(large.clone().into_vec().len(), large.len());
        // From a region's vector: inline when it fits, whatever its capacity.
        let mut v = Vec::with_capacity(1_000);
        v.extend_from_slice(&small);
        let back = Payload::from(v);
        assert!(!back.0.spilled());
        assert_eq!(back, small);
        assert!(Payload::from(large.clone().into_vec()).0.spilled());
    }

    #[test]
    fn shards_are_stable_and_spread() {
        assert_eq!(shard_of("alice", 100), shard_of("alice", 100));
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..2000 {
            let s: usize = shard_of(&format!("key-{i}"), 100).parse().unwrap();
            assert!(s < 100);
            seen.insert(s);
        }
        assert_eq!(seen.len(), 100, "2000 ids reach every one of 100 shards");
    }
}
