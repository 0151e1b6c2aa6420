//! A typed reference to one entity (Akka Typed's `EntityRef`): the region's untyped ask
//! and tell, bound to an entity id and checked against the entity's request and reply
//! types at compile time.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use crate::entity::Entity;
use crate::{ShardRegion, ShardingError};

/// Entity `entity_id` of a region's type, whose entity is `E`: from
/// [`ShardRegion::entity_ref`]. Cheap to clone; it holds no actor of its own, so it stays
/// valid while the entity passivates, restarts or moves to another node.
///
/// ```no_run
/// # use std::time::Duration;
/// # use ractor::ActorProcessingErr;
/// # use tenure_sharding::{Entity, EntityContext, ShardRegion, ShardingError};
/// struct Visits;
///
/// impl Entity for Visits {
///     type Request = ();
///     type Reply = u64;
///     type State = u64;
///     async fn start(&self, _: &EntityContext) -> Result<u64, ActorProcessingErr> {
///         Ok(0)
///     }
///     async fn handle(&self, _: &EntityContext, seen: &mut u64, _: ())
///         -> Result<u64, ActorProcessingErr> {
///         *seen += 1;
///         Ok(*seen)
///     }
/// }
///
/// async fn visit(region: &ShardRegion) -> Result<u64, ShardingError> {
///     let alice = region.entity_ref::<Visits>("alice");
///     alice.tell(&())?;
///     alice.ask(&(), Duration::from_secs(5)).await
/// }
/// ```
///
/// An ask whose reply is taken as anything but `E::Reply` does not compile:
///
/// ```compile_fail,E0308
/// # use std::time::Duration;
/// # use ractor::ActorProcessingErr;
/// # use tenure_sharding::{Entity, EntityContext, ShardRegion, ShardingError};
/// # struct Visits;
/// # impl Entity for Visits {
/// #     type Request = ();
/// #     type Reply = u64;
/// #     type State = u64;
/// #     async fn start(&self, _: &EntityContext) -> Result<u64, ActorProcessingErr> {
/// #         Ok(0)
/// #     }
/// #     async fn handle(&self, _: &EntityContext, seen: &mut u64, _: ())
/// #         -> Result<u64, ActorProcessingErr> {
/// #         Ok(*seen)
/// #     }
/// # }
/// async fn visit(region: &ShardRegion) -> Result<String, ShardingError> {
///     let alice = region.entity_ref::<Visits>("alice");
///     let seen: String = alice.ask(&(), Duration::from_secs(5)).await?;
///     Ok(seen)
/// }
/// ```
pub struct EntityRef<E> {
    region: ShardRegion,
    entity_id: String,
    entity: PhantomData<fn() -> E>,
}

impl<E: Entity> EntityRef<E> {
    pub(crate) fn new(region: ShardRegion, entity_id: String) -> Self {
        EntityRef {
            region,
            entity_id,
            entity: PhantomData,
        }
    }

    /// The entity's id.
    pub fn entity_id(&self) -> &str {
        &self.entity_id
    }

    /// The entity's type name (its region's).
    pub fn type_name(&self) -> &str {
        self.region.type_name()
    }

    /// The entity's shard.
    pub fn shard(&self) -> String {
        self.region.shard_of(&self.entity_id)
    }

    /// Sends `request`, fire-and-forget, as [`ShardRegion::tell`]: `Ok` means the region
    /// accepted it (delivered at most once; a full shard buffer drops it, counted and
    /// logged); `Err` that it was not sent (not encodable, or the region stopped).
    pub fn tell(&self, request: &E::Request) -> Result<(), ShardingError> {
        self.region.tell(&self.entity_id, request)
    }

    /// Sends `request` and waits up to `timeout` for the entity's reply, as
    /// [`ShardRegion::ask`]: `Ok` is the entity's reply; `Err` means the outcome is
    /// unknown, except `Encode` and `BufferFull` (certainly not delivered).
    pub async fn ask(
        &self,
        request: &E::Request,
        timeout: Duration,
    ) -> Result<E::Reply, ShardingError> {
        self.region.ask(&self.entity_id, request, timeout).await
    }
}

impl<E> Clone for EntityRef<E> {
    fn clone(&self) -> Self {
        EntityRef {
            region: self.region.clone(),
            entity_id: self.entity_id.clone(),
            entity: PhantomData,
        }
    }
}

impl<E> fmt::Debug for EntityRef<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EntityRef")
            .field("type_name", &self.region.type_name())
            .field("entity_id", &self.entity_id)
            .finish()
    }
}
