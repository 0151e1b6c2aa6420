//! Fault injection for tests (`tenure demo node --block-thread-when FILE`): while FILE
//! names an entity and a duration (`key-7 4s`), the next message to that entity, on
//! whichever node hosts it, blocks its handler's thread with `std::thread::sleep` for that
//! long, once across the cluster: the entity that blocks first creates `FILE.blocked`
//! (naming its node and token) and no other blocks while that file exists. A blocked
//! thread is outside any await, so a kill cannot reach it: the entity outlives its kill.
//! Its shard must keep the lease on a graceful move, and end the process when the lease is
//! being lost; `tenure check` judges whether it did.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ractor::ActorProcessingErr;
use tenure::sharding::{Entity, EntityContext};

/// Where the switch is (a file: `<entity id> <duration>` while it exists).
#[derive(Clone, Debug)]
pub struct BlockThreadSwitch(Arc<PathBuf>);

impl BlockThreadSwitch {
    pub fn new(file: PathBuf) -> Self {
        BlockThreadSwitch(Arc::new(file))
    }

    /// The file the blocking entity creates: `<node> <token>`.
    pub fn marker(file: &std::path::Path) -> PathBuf {
        let mut name = file.as_os_str().to_os_string();
        name.push(".blocked");
        PathBuf::from(name)
    }

    /// How long entity `ctx` blocks now: only if the switch names it and no entity has
    /// blocked for it yet (this one then claims it by creating the marker).
    fn claim(&self, ctx: &EntityContext) -> Option<Duration> {
        let text = std::fs::read_to_string(self.0.as_path()).ok()?;
        let (entity, pause) = text.trim().split_once(' ')?;
        if entity != ctx.entity_id {
            return None;
        }
        let pause = match tenure::duration::parse(pause.trim()) {
            Ok(pause) => pause,
            Err(e) => {
                tracing::warn!(file = %self.0.display(), error = %e, "fault injection: bad duration in the block-thread switch");
                return None;
            }
        };
        let mut marker = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(Self::marker(&self.0))
            .ok()?;
        let _ = writeln!(marker, "{} {}", ctx.node, ctx.token.get());
        Some(pause)
    }
}

/// Entity `E` whose handler blocks its thread when the switch names it.
pub struct ThreadBlockingEntity<E> {
    pub inner: E,
    pub switch: BlockThreadSwitch,
}

impl<E: Entity> Entity for ThreadBlockingEntity<E> {
    type Request = E::Request;
    type Reply = E::Reply;
    type State = E::State;

    fn start(
        &self,
        ctx: &EntityContext,
    ) -> impl Future<Output = Result<Self::State, ActorProcessingErr>> + Send {
        self.inner.start(ctx)
    }

    async fn handle(
        &self,
        ctx: &EntityContext,
        state: &mut Self::State,
        request: Self::Request,
    ) -> Result<Self::Reply, ActorProcessingErr> {
        if let Some(pause) = self.switch.claim(ctx) {
            tracing::warn!(entity = %ctx.entity_id, shard = %ctx.shard_id, token = ctx.token.get(), ?pause,
                "fault injection: blocking this entity's thread");
            std::thread::sleep(pause);
        }
        self.inner.handle(ctx, state, request).await
    }

    fn stop(
        &self,
        ctx: &EntityContext,
        state: &mut Self::State,
    ) -> impl Future<Output = ()> + Send {
        self.inner.stop(ctx, state)
    }
}
