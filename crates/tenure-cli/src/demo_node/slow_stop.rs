//! Fault injection for tests (`tenure demo node --slow-stop-when FILE`): while FILE exists,
//! the example entities and singleton instances of this node take [`SLOW_STOP`] to stop,
//! far longer than any stop budget, as a user's entity that flushes slowly or ignores stop
//! would. Their supervisors must kill them within the stop budget, before the lease's local
//! deadline; `tenure check` judges whether they did.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tenure::sharding::{Entity, EntityContext};

/// How long a slow stop takes: only a kill ends it sooner.
pub const SLOW_STOP: Duration = Duration::from_secs(60);

/// Where the switch is (a file: slow while it exists).
#[derive(Clone, Debug)]
pub struct SlowStopSwitch(Arc<PathBuf>);

impl SlowStopSwitch {
    pub fn new(file: PathBuf) -> Self {
        SlowStopSwitch(Arc::new(file))
    }

    /// Stops slowly now if the switch is on.
    async fn maybe_stall(&self, what: &str) {
        if self.0.exists() {
            tracing::warn!(what, file = %self.0.display(), "fault injection: stopping slowly");
            tokio::time::sleep(SLOW_STOP).await;
        }
    }
}

/// Entity `E` whose stop stalls while the switch is on.
pub struct SlowStoppingEntity<E> {
    pub inner: E,
    pub switch: SlowStopSwitch,
}

impl<E: Entity> Entity for SlowStoppingEntity<E> {
    type Request = E::Request;
    type Reply = E::Reply;
    type State = E::State;

    fn start(
        &self,
        ctx: &EntityContext,
    ) -> impl Future<Output = Result<Self::State, ActorProcessingErr>> + Send {
        self.inner.start(ctx)
    }

    fn handle(
        &self,
        ctx: &EntityContext,
        state: &mut Self::State,
        request: Self::Request,
    ) -> impl Future<Output = Result<Self::Reply, ActorProcessingErr>> + Send {
        self.inner.handle(ctx, state, request)
    }

    async fn stop(&self, ctx: &EntityContext, state: &mut Self::State) {
        self.switch.maybe_stall("entity").await;
        self.inner.stop(ctx, state).await
    }
}

/// Actor `A` (a singleton instance) whose `post_stop` stalls while the switch is on.
pub struct SlowStoppingActor<A> {
    pub inner: A,
    pub switch: SlowStopSwitch,
}

impl<A: Actor> Actor for SlowStoppingActor<A> {
    type Msg = A::Msg;
    type State = A::State;
    type Arguments = A::Arguments;

    async fn pre_start(
        &self,
        myself: ActorRef<A::Msg>,
        args: A::Arguments,
    ) -> Result<A::State, ActorProcessingErr> {
        self.inner.pre_start(myself, args).await
    }

    async fn post_start(
        &self,
        myself: ActorRef<A::Msg>,
        state: &mut A::State,
    ) -> Result<(), ActorProcessingErr> {
        self.inner.post_start(myself, state).await
    }

    async fn post_stop(
        &self,
        myself: ActorRef<A::Msg>,
        state: &mut A::State,
    ) -> Result<(), ActorProcessingErr> {
        self.switch.maybe_stall("singleton instance").await;
        self.inner.post_stop(myself, state).await
    }

    async fn handle(
        &self,
        myself: ActorRef<A::Msg>,
        msg: A::Msg,
        state: &mut A::State,
    ) -> Result<(), ActorProcessingErr> {
        self.inner.handle(myself, msg, state).await
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<A::Msg>,
        event: SupervisionEvent,
        state: &mut A::State,
    ) -> Result<(), ActorProcessingErr> {
        self.inner.handle_supervisor_evt(myself, event, state).await
    }
}
