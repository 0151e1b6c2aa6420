//! The demo's singleton: every `interval` it adds one to a [`FencedCounter`] with the
//! fencing token of its grant, and records each tick (accepted or refused) in the node's
//! history. `tenure demo node --singleton NAME` hosts it; `examples/singleton_ticks.rs`
//! runs it.

use std::time::Duration;

use crate::demo::FencedCounter;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde::{Deserialize, Serialize};
use tenure::FencingToken;

/// Asks the ticker for its counter.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CountRequest {}

/// The counter as the ticker last wrote it, with the token it runs under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountReply {
    /// The counter as last written; `None` before the first write.
    pub value: Option<u64>,
    /// The fencing token the ticker runs under.
    pub token: FencingToken,
    /// The node that answered.
    pub node: String,
}

/// A local timer message.
#[derive(Debug)]
pub struct Tick;

tenure::cluster::cluster_message! {
    /// Messages of the ticker singleton.
    ///
    /// - `Count`: answers with the counter as last written.
    /// - `Tick`: the local timer: write the next tick.
    // The macro takes no attributes on variants (its cast/call/local groups would be
    // ambiguous), so the variants are documented in the list above.
    #[allow(missing_docs)]
    pub enum TickerMsg {
        call Count(CountRequest) -> CountReply,
        local Tick(Tick),
    }
}

/// The ticker actor.
pub struct Ticker;

/// What a ticker instance runs with.
pub struct TickerArgs {
    /// The counter's name (the singleton's name).
    pub name: String,
    /// The fencing token of the grant the instance runs under: presented with every write.
    pub token: FencingToken,
    /// The fenced counter it writes.
    pub counter: FencedCounter,
    /// How often it ticks.
    pub interval: Duration,
    /// This node's address, for replies.
    pub node: String,
}

/// The state of a ticker instance.
pub struct TickerState {
    args: TickerArgs,
    last: Option<u64>,
    timer: ractor::concurrency::JoinHandle<()>,
}

impl Actor for Ticker {
    type Msg = TickerMsg;
    type State = TickerState;
    type Arguments = TickerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<TickerMsg>,
        args: TickerArgs,
    ) -> Result<TickerState, ActorProcessingErr> {
        let timer = myself.send_interval(args.interval, || TickerMsg::Tick(Tick));
        Ok(TickerState {
            args,
            last: None,
            timer,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<TickerMsg>,
        state: &mut TickerState,
    ) -> Result<(), ActorProcessingErr> {
        state.timer.abort();
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<TickerMsg>,
        msg: TickerMsg,
        state: &mut TickerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            TickerMsg::Tick(Tick) => {
                let (counter, name, token) = (
                    state.args.counter.clone(),
                    state.args.name.clone(),
                    state.args.token,
                );
                let result =
                    tokio::task::spawn_blocking(move || counter.increment(&name, token)).await?;
                match result {
                    Ok(Some(value)) => {
                        state.last = Some(value);
                        crate::history::tick(&state.args.name, token, Some(value));
                    }
                    Ok(None) => {
                        tracing::warn!(singleton = %state.args.name, token = token.get(), "tick refused: a newer token wrote the counter");
                        crate::history::tick(&state.args.name, token, None);
                    }
                    Err(e) => {
                        tracing::warn!(singleton = %state.args.name, error = %e, "tick not written")
                    }
                }
            }
            TickerMsg::Count(CountRequest {}, reply) => {
                let _ = reply.send(CountReply {
                    value: state.last,
                    token: state.args.token,
                    node: state.args.node.clone(),
                });
            }
        }
        Ok(())
    }
}
