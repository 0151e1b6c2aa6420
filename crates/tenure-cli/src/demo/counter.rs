//! The demo's entity: a counter per key in a [`FencedCounter`] file, written with the
//! fencing token of the key's shard, so that a stale host's late write is refused by the
//! counter itself. `tenure demo node --sharded-counter` hosts it;
//! `examples/sharded_counter.rs` runs it on a 3-node cluster.
//!
//! [`DurableCounter`] is the same counter as a durable entity (`tenure demo node
//! --durable-counter`): one event per increment in a journal fenced by the shard's grant,
//! its state the number of its events, so that a reply's value is the sequence number of
//! the increment's event (what `tenure check --journal` checks acks against).

use ractor::ActorProcessingErr;
use serde::{Deserialize, Serialize};
use std::num::NonZeroU64;
use tenure::FencingToken;

use crate::demo::FencedCounter;
use tenure::sharding::{DurableEntity, Effect, Entity, EntityContext};

/// What a counter entity is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CounterRequest {
    /// Add one (fenced); the reply carries the new value.
    Increment,
    /// Read the value.
    Get,
}

/// A counter's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterReply {
    /// The value after the increment (or read); `None` if refused or never written.
    pub value: Option<u64>,
    /// `false` when the counter refused the write: a newer token wrote already.
    pub accepted: bool,
    /// The token the entity runs under.
    pub token: FencingToken,
    /// The node that answered.
    pub node: String,
}

/// The counter entity type; entity ids are the keys.
pub struct Counter {
    /// The fenced counter every entity writes (its key is the entity id).
    pub counter: FencedCounter,
}

/// The counter's name in the file for entity `key`.
pub fn counter_name(key: &str) -> String {
    format!("sharded/{key}")
}

impl Entity for Counter {
    type Request = CounterRequest;
    type Reply = CounterReply;
    type State = ();

    async fn start(&self, _ctx: &EntityContext) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        ctx: &EntityContext,
        _state: &mut (),
        request: CounterRequest,
    ) -> Result<CounterReply, ActorProcessingErr> {
        let (counter, name, token) = (
            self.counter.clone(),
            counter_name(&ctx.entity_id),
            ctx.token,
        );
        let reply = |value, accepted| CounterReply {
            value,
            accepted,
            token,
            node: ctx.node.clone(),
        };
        match request {
            CounterRequest::Increment => {
                let value =
                    tokio::task::spawn_blocking(move || counter.increment(&name, token)).await??;
                crate::history::write(&ctx.type_name, &ctx.shard_id, &ctx.entity_id, token, value);
                Ok(reply(value, value.is_some()))
            }
            CounterRequest::Get => {
                let value = tokio::task::spawn_blocking(move || counter.get(&name)).await??;
                Ok(reply(value.map(|(v, _)| v), true))
            }
        }
    }
}

/// What the durable counter persists: one event per increment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CounterEvent {
    /// One was added.
    Incremented,
}

/// The counter as a durable entity: its state is the number of its events.
pub struct DurableCounter;

/// How many events the durable counter writes between two snapshots.
pub const SNAPSHOT_EVERY: u64 = 50;

impl DurableEntity for DurableCounter {
    type Command = CounterRequest;
    type Event = CounterEvent;
    type State = u64;
    type Reply = CounterReply;

    fn empty_state(&self, _ctx: &EntityContext) -> u64 {
        0
    }

    fn on_command(
        &self,
        ctx: &EntityContext,
        state: &u64,
        command: CounterRequest,
    ) -> Effect<CounterEvent, u64, CounterReply> {
        let (token, node) = (ctx.token, ctx.node.clone());
        match command {
            CounterRequest::Increment => {
                Effect::persist([CounterEvent::Incremented], move |count: &u64| {
                    CounterReply {
                        value: Some(*count),
                        accepted: true,
                        token,
                        node,
                    }
                })
            }
            CounterRequest::Get => Effect::reply(CounterReply {
                value: Some(*state),
                accepted: true,
                token,
                node,
            }),
        }
    }

    fn on_event(&self, count: &mut u64, event: &CounterEvent) {
        match event {
            CounterEvent::Incremented => *count += 1,
        }
    }

    fn snapshot_every(&self) -> Option<NonZeroU64> {
        NonZeroU64::new(SNAPSHOT_EVERY)
    }
}

/// The durable counter's encoded state after `events` (each a JSON [`CounterEvent`]), as
/// the entity encodes it; `None` if one is not a counter event.
pub fn replay_counter(events: &[tenure::history::check::JournalEvent]) -> Option<Vec<u8>> {
    let mut count = 0u64;
    for e in events {
        match serde_json::from_slice::<CounterEvent>(&e.payload).ok()? {
            CounterEvent::Incremented => count += 1,
        }
    }
    serde_json::to_vec(&count).ok()
}
