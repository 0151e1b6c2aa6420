//! The local fast path keeps one sender's order: tells and asks from one handle to entities
//! of a one-node cluster (memory store) arrive in the order sent, across the entities'
//! first start (messages kept by the shard), direct delivery, and passivations in the
//! middle of the stream (messages kept for the next incarnation), and none is lost; small
//! requests (carried inline) and large ones (on the heap) alike.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::ActorProcessingErr;
use serde::{Deserialize, Serialize};
use tenure_sharding::{Entity, EntityContext};

type Seen = Arc<Mutex<HashMap<String, Vec<u64>>>>;

#[derive(Serialize, Deserialize)]
enum Req {
    /// Record `n`.
    Note(u64),
    /// Record `n`, then ask to be passivated.
    NoteAndPassivate(u64),
    /// Record `n`; the padding makes the request too large to travel inline.
    NoteLarge(u64, String),
}

/// Records, per entity, the numbers it was sent (across its incarnations).
struct Recorder(Seen);

impl Entity for Recorder {
    type Request = Req;
    type Reply = usize;
    type State = ();

    async fn start(&self, _: &EntityContext) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        ctx: &EntityContext,
        _: &mut (),
        request: Req,
    ) -> Result<usize, ActorProcessingErr> {
        let n = match request {
            Req::Note(n) | Req::NoteLarge(n, _) => n,
            Req::NoteAndPassivate(n) => {
                ctx.passivate();
                n
            }
        };
        let mut seen = self.0.lock().unwrap();
        let mine = seen.entry(ctx.entity_id.clone()).or_default();
        mine.push(n);
        Ok(mine.len())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_senders_messages_keep_their_order_across_starts_direct_sends_and_passivation() {
    let (node, provider) = common::one_node("direct-test-0123456789abcdef01234", "[sharding.seq]\nnumber-of-shards = 4\nretry-interval = \"100ms\"\nidle-timeout = \"off\"\n").await;
    let seen: Seen = Arc::default();
    let region = tenure_sharding::start_on_node(
        &node,
        &provider,
        "seq",
        Some(tenure_sharding::entity_factory(Recorder(seen.clone()))),
    )
    .await
    .unwrap();
    let entities: Vec<String> = (0..5).map(|i| format!("e{i}")).collect();
    let per_entity = 3_000u64;
    // Sent with no entity running yet: the first ones wait for the shards' leases.
    for n in 0..per_entity {
        for (i, e) in entities.iter().enumerate() {
            let entity = region.entity_ref::<Recorder>(e.clone());
            // Each entity passivates every few hundred messages (at different points).
            let req = if (n + 37 * i as u64) % 400 == 399 {
                Req::NoteAndPassivate(n)
            } else if n % 3 == 0 {
                Req::NoteLarge(n, "x".repeat(64))
            } else {
                Req::Note(n)
            };
            if n % 250 == 0 {
                // An ask in the stream: it is answered after everything sent before it.
                let count = entity.ask(&req, Duration::from_secs(30)).await.unwrap();
                assert_eq!(count as u64, n + 1, "entity {e}: the ask overtook tells");
            } else {
                entity.tell(&req).unwrap();
            }
        }
    }
    // The last message of each entity, asked: everything before it has been handled then.
    for e in &entities {
        let entity = region.entity_ref::<Recorder>(e.clone());
        let count = entity
            .ask(&Req::Note(per_entity), Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(count as u64, per_entity + 1, "entity {e} lost messages");
    }
    let seen = seen.lock().unwrap().clone();
    for e in &entities {
        let expected: Vec<u64> = (0..=per_entity).collect();
        assert!(seen[e] == expected, "entity {e}: out of order or lost");
    }
    region.stop().await;
    let _ = node.leave().await;
}
