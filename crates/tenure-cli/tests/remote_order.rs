//! One remote sender's order: a node without the type's role sends tells and asks to
//! entities hosted by another node process (SQLite store). They arrive in the order sent,
//! across the entities' first start (messages kept by the shard), delivery straight from
//! the hosting region into the entity's mailbox, and passivations in the middle of the
//! stream (messages kept for the next incarnation), and none is lost.
//!
//! The hosting node is this test binary again, run with `TENURE_TEST_HOST` naming its
//! config (ractor's registry is per process: one process is one node).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::ActorProcessingErr;
use serde::{Deserialize, Serialize};
use tenure::TenureConfig;
use tenure::sharding::{Entity, EntityContext, entity_factory};
use tenure_test_kit::cli::pair;

const TEST: &str = "one_remote_senders_messages_keep_their_order_across_starts_and_passivation";

#[derive(Serialize, Deserialize)]
enum Req {
    /// Record `n`.
    Note(u64),
    /// Record `n`, then ask to be passivated.
    NoteAndPassivate(u64),
    /// Answer with everything recorded for this entity, across its incarnations.
    Report,
}

/// Records, per entity, the numbers it was sent (kept by the hosting process, across
/// incarnations); answers with how many it recorded, or all of them for `Report`.
struct Recorder(Arc<Mutex<HashMap<String, Vec<u64>>>>);

impl Entity for Recorder {
    type Request = Req;
    type Reply = Vec<u64>;
    type State = ();

    async fn start(&self, _: &EntityContext) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        ctx: &EntityContext,
        _: &mut (),
        request: Req,
    ) -> Result<Vec<u64>, ActorProcessingErr> {
        let mut seen = self.0.lock().unwrap();
        let mine = seen.entry(ctx.entity_id.clone()).or_default();
        let n = match request {
            Req::Note(n) => n,
            Req::NoteAndPassivate(n) => {
                ctx.passivate();
                n
            }
            Req::Report => return Ok(mine.clone()),
        };
        mine.push(n);
        Ok(vec![mine.len() as u64])
    }
}

/// The hosting process: runs until the test kills it.
async fn host(path: String) {
    let config = TenureConfig::load(Some(std::path::Path::new(&path))).unwrap();
    let factory = entity_factory(Recorder(Arc::default()));
    let (_node, _region) = pair::start(&config, "seq", Some(factory)).await;
    println!("ready");
    tokio::time::sleep(Duration::from_secs(600)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_remote_senders_messages_keep_their_order_across_starts_and_passivation() {
    if let Ok(path) = std::env::var("TENURE_TEST_HOST") {
        return host(path).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut ports = pair::ports();
    let host = pair::spawn_host(
        dir.path(),
        &mut ports,
        "seq",
        4,
        &["--exact", TEST, "--nocapture", "--test-threads", "1"],
        "TENURE_TEST_HOST",
    );
    let (node, region) = pair::start_sender(dir.path(), ports, "seq", 4).await;
    let entities: Vec<String> = (0..5).map(|i| format!("e{i}")).collect();
    let per_entity = 1_500u64;
    // Sent before any entity runs: the first ones wait for the host to learn the shards'
    // homes and acquire their leases.
    for n in 0..per_entity {
        for (i, e) in entities.iter().enumerate() {
            let entity = region.entity_ref::<Recorder>(e.clone());
            // Each entity passivates every few hundred messages (at different points).
            let req = if (n + 37 * i as u64) % 300 == 299 {
                Req::NoteAndPassivate(n)
            } else {
                Req::Note(n)
            };
            if n % 250 == 0 {
                // An ask in the stream: it is answered after everything sent before it.
                let count = entity.ask(&req, Duration::from_secs(30)).await.unwrap();
                assert_eq!(count, vec![n + 1], "entity {e}: the ask overtook tells");
            } else {
                entity.tell(&req).unwrap();
            }
        }
    }
    for e in &entities {
        let seen = region
            .entity_ref::<Recorder>(e.clone())
            .ask(&Req::Report, Duration::from_secs(30))
            .await
            .unwrap();
        let expected: Vec<u64> = (0..per_entity).collect();
        assert!(
            seen == expected,
            "entity {e}: {} of {per_entity} messages, out of order or lost",
            seen.len()
        );
    }
    drop(host);
    region.stop().await;
    let _ = node.leave().await;
}
