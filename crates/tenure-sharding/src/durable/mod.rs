//! Durable entities: event-sourced entities whose events live in a [`Journal`], every
//! append fenced by the grant of the entity's shard lease.
//!
//! A [`DurableEntity`] decides, per command, which events to persist and what to reply
//! ([`Effect`]); its event handler applies an event to the state, at run time and at
//! recovery. Started (on a message, or by remember-entities), it recovers: the latest
//! snapshot, then every event after it. Per command it appends the events in one journal
//! write fenced by its shard's grant (lease, owner, token), applies them once durable, saves
//! a snapshot every [`snapshot_every`](DurableEntity::snapshot_every) events or when the
//! effect asks, and only then replies.
//!
//! **The guarantee.** Every acknowledged command's events are in the journal exactly
//! once, in the order they were decided, numbered without gaps, and the entity's next host
//! recovers exactly them: a holder whose grant is no longer the current one (it paused past
//! its ttl, or lost a split brain) has its append refused by the journal at commit, and
//! stops. Not covered: what the handlers do besides deciding events and replies (a side
//! effect of a command runs again when a command is retried after an unknown outcome), and
//! commands whose append's outcome was unknown (the caller got an error; recovery shows
//! whether the events landed).
//!
//! An append refused (a stale grant, or another writer's events in the way) or whose
//! outcome is unknown stops the entity, with an error to the caller: its state may be
//! behind the journal, and the next start recovers it from there. A refusal for a stale
//! grant is also the store's word that the shard's grant is gone: the shard stops
//! believing in it at once (its LeaseActor announces the loss, every entity of the shard
//! stops, and it acquires again), rather than start the entity again for every message
//! until its next renewal tells it.

mod effect;

use std::num::NonZeroU64;
use std::sync::Arc;

use ractor::ActorProcessingErr;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tenure_journal::{Append, Journal, Refusal, SaveSnapshot, Written};
use tenure_lease::FencingToken;
use tracing::Instrument;

pub use effect::Effect;

use crate::entity::{Entity, EntityContext, EntityFactory, entity_factory};
use crate::history::{self, DurableAbout};

/// Which entity `ctx` runs, for its history events.
fn about(ctx: &EntityContext) -> DurableAbout<'_> {
    DurableAbout {
        entity_type: &ctx.type_name,
        shard: &ctx.shard_id,
        entity: &ctx.entity_id,
        token: ctx.token,
    }
}

/// An event-sourced entity (Akka's `EventSourcedBehavior`): commands in, events persisted,
/// state rebuilt from them. See the [module docs](self).
pub trait DurableEntity: Send + Sync + 'static {
    /// What the entity is asked or told.
    type Command: Serialize + DeserializeOwned + Send + 'static;
    /// What it persists; kept in the journal as JSON, so adding an optional field keeps
    /// old events readable.
    type Event: Serialize + DeserializeOwned + Send + Sync + 'static;
    /// Its state, rebuilt from the events (and kept in snapshots as JSON).
    type State: Serialize + DeserializeOwned + Send + Sync + 'static;
    /// What it answers.
    type Reply: Serialize + DeserializeOwned + Send + 'static;

    /// The state of an entity without events.
    fn empty_state(&self, ctx: &EntityContext) -> Self::State;

    /// Decides what `command` does in `state`: the events to persist and the reply. It
    /// must not act on the world: the events are its only outcome (it may run again for a
    /// command retried after an unknown outcome).
    fn on_command(
        &self,
        ctx: &EntityContext,
        state: &Self::State,
        command: Self::Command,
    ) -> Effect<Self::Event, Self::State, Self::Reply>;

    /// Applies `event` to `state`. Deterministic: recovery replays the events through it.
    fn on_event(&self, state: &mut Self::State, event: &Self::Event);

    /// Save a snapshot every this many events (`None`, the default: only when an effect
    /// asks), so that recovery reads the snapshot and the events after it.
    fn snapshot_every(&self) -> Option<NonZeroU64> {
        None
    }
}

/// The journal's persistence id of entity `entity_id` of type `type_name`:
/// `<type>|<id>` (as Akka's sharded entities name theirs).
pub fn persistence_id(type_name: &str, entity_id: &str) -> String {
    format!("{type_name}|{entity_id}")
}

/// The factory of durable entity type `E` writing to `journal`: pass it to
/// [`start_on_node`](crate::start_on_node) as any entity factory.
pub fn durable_entity_factory<E: DurableEntity>(
    entity: E,
    journal: Arc<dyn Journal>,
) -> EntityFactory {
    entity_factory(Durable::new(entity, journal))
}

/// Events read per journal round trip at recovery.
const RECOVERY_PAGE: usize = 1000;

/// The [`Entity`] that runs durable entity `E` on its journal (made by
/// [`durable_entity_factory`]): name it in [`ShardRegion::entity_ref`](crate::ShardRegion::entity_ref)
/// (`region.entity_ref::<Durable<E>>(id)`), whose asks then take `E::Command` and answer
/// `E::Reply`.
pub struct Durable<E> {
    entity: Arc<E>,
    journal: Arc<dyn Journal>,
}

/// The state of a running durable entity: its state `S` and where its journal stands.
pub struct Running<S> {
    state: S,
    persistence_id: String,
    /// The sequence number of the next event.
    next_seq: u64,
    /// Events since the last snapshot (or since recovery began from one).
    since_snapshot: u64,
}

/// Why a durable entity failed (it stops; its next start recovers from the journal).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DurableError {
    /// The journal refused a write: the shard's grant is not current any more, or another
    /// writer's events are in the way.
    #[error("entity `{entity}` (shard {shard}, token {token}): {refusal}; stopping")]
    Refused {
        /// The entity id.
        entity: String,
        /// Its shard.
        shard: String,
        /// The token it wrote under.
        token: u64,
        /// The journal's refusal.
        #[source]
        refusal: Box<Refusal>,
    },
    /// The journal failed: for an append, whether its events were written is unknown.
    #[error("entity `{entity}` (shard {shard}): {source}; stopping")]
    Journal {
        /// The entity id.
        entity: String,
        /// Its shard.
        shard: String,
        /// The journal's error.
        #[source]
        source: Box<tenure_journal::JournalError>,
    },
    /// An event, snapshot or state could not be encoded or decoded.
    #[error("entity `{entity}`: {what} of `{persistence_id}`: {source}")]
    Codec {
        /// The entity id.
        entity: String,
        /// The persistence id.
        persistence_id: String,
        /// What: `event 12`, `the snapshot at 50`, `an event`, `the state`.
        what: String,
        /// serde_json's error.
        #[source]
        source: serde_json::Error,
    },
    /// The journal's events do not follow each other (a gap or a repeat): it was
    /// written around the journal's checks.
    #[error(
        "entity `{entity}`: the journal of `{persistence_id}` jumps from {expected} to {found}"
    )]
    Gap {
        /// The entity id.
        entity: String,
        /// The persistence id.
        persistence_id: String,
        /// The sequence number expected next.
        expected: u64,
        /// The one found.
        found: u64,
    },
}

impl DurableError {
    /// The token of the grant the journal refused as not current (the lease was
    /// released, expired or granted to another holder), when that is why the entity
    /// failed: its shard then stops believing in that grant at once.
    pub fn not_current(&self) -> Option<FencingToken> {
        match self {
            DurableError::Refused { refusal, .. } => match refusal.as_ref() {
                Refusal::NotHeld { token, .. } => Some(*token),
                _ => None,
            },
            _ => None,
        }
    }
}

impl<E: DurableEntity> Durable<E> {
    /// Durable entity `entity` on `journal` as an [`Entity`], for wrapping in another entity
    /// before [`entity_factory`] (which [`durable_entity_factory`] does without one).
    pub fn new(entity: E, journal: Arc<dyn Journal>) -> Self {
        Durable {
            entity: Arc::new(entity),
            journal,
        }
    }

    fn journal_error(ctx: &EntityContext, source: tenure_journal::JournalError) -> DurableError {
        DurableError::Journal {
            entity: ctx.entity_id.clone(),
            shard: ctx.shard_id.clone(),
            source: Box::new(source),
        }
    }

    fn codec(
        ctx: &EntityContext,
        pid: &str,
        what: String,
        source: serde_json::Error,
    ) -> DurableError {
        DurableError::Codec {
            entity: ctx.entity_id.clone(),
            persistence_id: pid.to_string(),
            what,
            source,
        }
    }

    /// The latest snapshot, then every event after it.
    async fn recover(&self, ctx: &EntityContext) -> Result<Running<E::State>, DurableError> {
        let pid = persistence_id(&ctx.type_name, &ctx.entity_id);
        let issued = tenure_lease::clock::boottime_now_ns();
        // Before reading: an append of the shard's previous holder still pending is then
        // either read below or refused.
        let fence = ctx.fence();
        let claimed = self
            .journal
            .claim(&pid, &fence)
            .await
            .map_err(|e| Self::journal_error(ctx, e))?;
        if !claimed {
            return Err(DurableError::Refused {
                entity: ctx.entity_id.clone(),
                shard: ctx.shard_id.clone(),
                token: ctx.token.get(),
                refusal: Box::new(Refusal::not_held(&pid, &fence)),
            });
        }
        let snapshot = self
            .journal
            .load_snapshot(&pid)
            .await
            .map_err(|e| Self::journal_error(ctx, e))?;
        let from_snapshot = snapshot.as_ref().map(|s| s.seq);
        let (mut state, mut last) = match snapshot {
            Some(s) => (
                serde_json::from_slice(&s.payload)
                    .map_err(|e| Self::codec(ctx, &pid, format!("the snapshot at {}", s.seq), e))?,
                s.seq,
            ),
            None => (self.entity.empty_state(ctx), 0),
        };
        let mut replayed = 0;
        loop {
            let events = self
                .journal
                .read(&pid, last + 1, RECOVERY_PAGE)
                .await
                .map_err(|e| Self::journal_error(ctx, e))?;
            let full = events.len() == RECOVERY_PAGE;
            for stored in events {
                if stored.seq != last + 1 {
                    return Err(DurableError::Gap {
                        entity: ctx.entity_id.clone(),
                        persistence_id: pid,
                        expected: last + 1,
                        found: stored.seq,
                    });
                }
                let event: E::Event = serde_json::from_slice(&stored.payload)
                    .map_err(|e| Self::codec(ctx, &pid, format!("event {}", stored.seq), e))?;
                self.entity.on_event(&mut state, &event);
                last = stored.seq;
                replayed += 1;
            }
            if !full {
                break;
            }
        }
        tracing::debug!(entity = %ctx.entity_id, shard = %ctx.shard_id, persistence_id = %pid,
            last, replayed, "durable entity recovered");
        let encoded = serde_json::to_vec(&state)
            .map_err(|e| Self::codec(ctx, &pid, "the state".into(), e))?;
        history::entity_recovered(
            &about(ctx),
            last,
            from_snapshot,
            issued,
            &history::state_digest(&encoded),
        );
        Ok(Running {
            state,
            persistence_id: pid,
            next_seq: last + 1,
            since_snapshot: replayed,
        })
    }

    /// Appends `events` under the shard's grant: their sequence numbers once durable.
    async fn persist(
        &self,
        ctx: &EntityContext,
        running: &Running<E::State>,
        events: &[E::Event],
    ) -> Result<std::ops::RangeInclusive<u64>, DurableError> {
        let pid = &running.persistence_id;
        let encoded = events
            .iter()
            .map(|e| serde_json::to_vec(e).map_err(|e| Self::codec(ctx, pid, "an event".into(), e)))
            .collect::<Result<Vec<_>, _>>()?;
        let append = Append {
            persistence_id: pid.clone(),
            first_seq: running.next_seq,
            events: encoded,
            fence: ctx.fence(),
        };
        // The append and the record of its answer run in a task of their own: an entity
        // killed while it waits (its shard's lease being lost) must not take the history's
        // record of what the journal did with the append along with it.
        let journal = self.journal.clone();
        let (entity_type, shard, entity, token) = (
            ctx.type_name.clone(),
            ctx.shard_id.clone(),
            ctx.entity_id.clone(),
            ctx.token,
        );
        let first_seq = running.next_seq;
        let task = tokio::spawn(
            async move {
                let issued = tenure_lease::clock::boottime_now_ns();
                let answer = journal.append(append).await;
                let about = DurableAbout {
                    entity_type: &entity_type,
                    shard: &shard,
                    entity: &entity,
                    token,
                };
                match &answer {
                    Ok(Written::Appended(range)) => {
                        history::journal_appended(&about, *range.start(), *range.end(), issued)
                    }
                    Ok(Written::Refused(refusal)) => {
                        let reason = match refusal {
                            Refusal::NotHeld { .. } => "not_held",
                            _ => "sequence",
                        };
                        history::journal_refused(&about, first_seq, reason, issued);
                    }
                    Err(_) => {}
                }
                answer
            }
            .instrument(tracing::Span::current()),
        );
        let answer = task.await.unwrap_or_else(|e| {
            Err(tenure_journal::JournalError::store(
                pid,
                "append",
                tenure_lease::StoreError::backend(
                    "journal",
                    format!("the append's task ended: {e}"),
                ),
            ))
        });
        match answer {
            Ok(Written::Appended(range)) => Ok(range),
            Ok(Written::Refused(refusal)) => {
                let e = DurableError::Refused {
                    entity: ctx.entity_id.clone(),
                    shard: ctx.shard_id.clone(),
                    token: ctx.token.get(),
                    refusal: Box::new(refusal),
                };
                tracing::error!(entity = %ctx.entity_id, shard = %ctx.shard_id,
                    token = ctx.token.get(), error = %e, "journal append refused: stopping the entity");
                Err(e)
            }
            Err(source) => {
                let e = Self::journal_error(ctx, source);
                tracing::warn!(entity = %ctx.entity_id, shard = %ctx.shard_id,
                    token = ctx.token.get(), error = %e, "journal append failed (outcome unknown): stopping the entity");
                Err(e)
            }
        }
    }

    /// Saves a snapshot of the state after event `next_seq - 1`. A failure is logged and
    /// left for the next snapshot: the events are durable, and a refusal for a stale grant
    /// stops the entity at its next append.
    async fn snapshot(&self, ctx: &EntityContext, running: &mut Running<E::State>) {
        let pid = &running.persistence_id;
        let payload = match serde_json::to_vec(&running.state) {
            Ok(p) => p,
            Err(e) => {
                let e = Self::codec(ctx, pid, "the state".into(), e);
                tracing::warn!(error = %e, "snapshot not saved");
                return;
            }
        };
        let save = SaveSnapshot {
            persistence_id: pid.clone(),
            seq: running.next_seq - 1,
            payload,
            fence: ctx.fence(),
        };
        match self.journal.save_snapshot(save).await {
            Ok(Written::Appended(_)) => running.since_snapshot = 0,
            Ok(Written::Refused(r)) => {
                tracing::warn!(entity = %ctx.entity_id, shard = %ctx.shard_id, token = ctx.token.get(), refusal = %r, "snapshot refused")
            }
            Err(e) => {
                tracing::warn!(entity = %ctx.entity_id, shard = %ctx.shard_id, error = %e, "snapshot not saved")
            }
        }
    }
}

impl<E: DurableEntity> Entity for Durable<E> {
    type Request = E::Command;
    type Reply = E::Reply;
    type State = Running<E::State>;

    async fn start(&self, ctx: &EntityContext) -> Result<Self::State, ActorProcessingErr> {
        Ok(self.recover(ctx).await?)
    }

    async fn handle(
        &self,
        ctx: &EntityContext,
        running: &mut Self::State,
        command: E::Command,
    ) -> Result<E::Reply, ActorProcessingErr> {
        let effect = self.entity.on_command(ctx, &running.state, command);
        if !effect.events.is_empty() {
            let range = self.persist(ctx, running, &effect.events).await?;
            for event in &effect.events {
                self.entity.on_event(&mut running.state, event);
            }
            running.next_seq = range.end() + 1;
            running.since_snapshot += effect.events.len() as u64;
        }
        let every = self.entity.snapshot_every().map(NonZeroU64::get);
        let due = every.is_some_and(|n| running.since_snapshot >= n);
        if running.next_seq > 1 && (effect.snapshot || due) {
            self.snapshot(ctx, running).await;
        }
        Ok(effect.into_reply(&running.state))
    }
}
