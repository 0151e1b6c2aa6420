//! The demo's entity: a counter per key in a [`FencedCounter`] file, written with the
//! fencing token of the key's shard, so that a stale host's late write is refused by the
//! counter itself. `tenure demo node --sharded-counter` hosts it;
//! `examples/sharded_counter.rs` runs it on a 3-node cluster.

use ractor::ActorProcessingErr;
use serde::{Deserialize, Serialize};
use tenure::FencingToken;
use tenure::sharding::{Entity, EntityContext};
use tenure::sqlite::FencedCounter;

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
