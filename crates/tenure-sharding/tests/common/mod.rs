//! What the sharding tests that run a real node share: the one-node cluster of the test kit
//! (a memory store, short leases, the sharding sections each test gives) and an entity
//! that answers every number with itself.

use std::time::Duration;

use ractor::ActorProcessingErr;
use tenure_sharding::{Entity, EntityContext};
use tokio::sync::mpsc::UnboundedSender;

#[allow(unused_imports)] // Not every test binary that includes this module uses it.
pub use tenure_test_kit::node::one_node;

/// Starts entity type `echo` of [`Echo`]s, hosted on `node`. Panics when it cannot start
/// (a test tool).
#[allow(dead_code)] // Not every test binary that includes this module uses it.
pub async fn start_echo(
    node: &tenure_cluster::Node,
    provider: &tenure_lease::LeaseProvider,
) -> tenure_sharding::ShardRegion {
    let factory = tenure_sharding::entity_factory(Echo::default());
    tenure_sharding::start_on_node(node, provider, "echo", Some(factory))
        .await
        .expect("start the echo region")
}

/// An entity that answers every number with itself; [`Echo::slow`] also tells each number
/// it takes and pauses before answering.
#[allow(dead_code)] // Not every test binary that includes this module uses it.
#[derive(Default)]
pub struct Echo {
    heard: Option<UnboundedSender<u64>>,
    pause: Duration,
}

#[allow(dead_code)]
impl Echo {
    /// Sends each number it takes to `heard`, then answers it after `pause`.
    pub fn slow(heard: UnboundedSender<u64>, pause: Duration) -> Echo {
        Echo {
            heard: Some(heard),
            pause,
        }
    }
}

impl Entity for Echo {
    type Request = u64;
    type Reply = u64;
    type State = ();

    async fn start(&self, _: &EntityContext) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _: &EntityContext,
        _: &mut (),
        n: u64,
    ) -> Result<u64, ActorProcessingErr> {
        if let Some(heard) = &self.heard {
            let _ = heard.send(n);
        }
        if !self.pause.is_zero() {
            tokio::time::sleep(self.pause).await;
        }
        Ok(n)
    }
}
