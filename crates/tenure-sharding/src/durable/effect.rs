//! What a durable entity's command handler decides: events to persist, the reply, and
//! whether to save a snapshot.

/// The reply of an [`Effect`]: a value, or one computed from the state after the events.
enum Reply<S, R> {
    Now(R),
    After(Box<dyn FnOnce(&S) -> R + Send>),
}

/// What a command comes to (Akka's `Effect`): the events to persist, in order, and the
/// reply, which goes out only once the events are durable and applied. Every effect has a
/// reply (a told command's is dropped), so no ask goes unanswered.
pub struct Effect<Ev, S, R> {
    pub(crate) events: Vec<Ev>,
    reply: Reply<S, R>,
    pub(crate) snapshot: bool,
}

impl<Ev, S, R> Effect<Ev, S, R> {
    /// Persist `events` (none: nothing is written), then reply with what `reply` makes of
    /// the state they lead to.
    pub fn persist(
        events: impl IntoIterator<Item = Ev>,
        reply: impl FnOnce(&S) -> R + Send + 'static,
    ) -> Self {
        Effect {
            events: events.into_iter().collect(),
            reply: Reply::After(Box::new(reply)),
            snapshot: false,
        }
    }

    /// Persist nothing and reply `reply` (a query, or a command refused by the handler).
    pub fn reply(reply: R) -> Self {
        Effect {
            events: Vec::new(),
            reply: Reply::Now(reply),
            snapshot: false,
        }
    }

    /// Also save a snapshot of the state once the events are applied (on demand, besides
    /// [`DurableEntity::snapshot_every`](crate::DurableEntity::snapshot_every)).
    pub fn and_snapshot(mut self) -> Self {
        self.snapshot = true;
        self
    }

    /// The reply for `state`, the state after the events.
    pub(crate) fn into_reply(self, state: &S) -> R {
        match self.reply {
            Reply::Now(r) => r,
            Reply::After(f) => f(state),
        }
    }
}
