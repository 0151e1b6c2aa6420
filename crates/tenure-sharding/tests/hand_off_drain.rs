//! A hand-off drains its entities' mailboxes: every ask already delivered to an entity is
//! answered, also when handling them takes longer than `stop-timeout` (a backlog built up
//! while the lease store or the entity's resource was slow, or one message slower than
//! `stop-timeout`, as on a loaded machine), for as long as the shard's grant is believed and
//! the hand-off's answer still fits in `hand-off-timeout`. One shard on a memory store.

use std::sync::Arc;
use std::time::Duration;

use ractor::{ActorProcessingErr, ActorRef};
use tenure_lease::{LeaseSpec, LeaseStore, MemoryStore, ProcessEnd, TenureConfig};
use tenure_lease_kit::conformance::holder_test_settings;
use tenure_sharding::{
    AskReply, Entity, EntityContext, Shard, ShardArgs, ShardMsg, ShardingSettings, entity_factory,
};

/// Takes the request's milliseconds over it (an awaited call to a slow resource) and
/// answers its number.
struct Slow;

impl Entity for Slow {
    type Request = (u32, u64);
    type Reply = u32;
    type State = ();

    async fn start(&self, _ctx: &EntityContext) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _ctx: &EntityContext,
        _state: &mut (),
        (n, ms): (u32, u64),
    ) -> Result<u32, ActorProcessingErr> {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(n)
    }
}

async fn shard() -> ActorRef<ShardMsg> {
    let config = TenureConfig::from_toml_str("", "test").unwrap();
    let mut settings = ShardingSettings::from_config(&config, "slow", "memory").unwrap();
    let lease_settings = holder_test_settings();
    settings.idle_timeout = None;
    settings.number_of_shards = 1;
    settings.stop_timeout = Duration::from_millis(300);
    settings.hand_off_timeout = Duration::from_secs(6);
    settings.lease = lease_settings;
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let lease =
        LeaseSpec::new("test-shard-slow-0", "10.0.0.1:2552", store, lease_settings).unwrap();
    let args = ShardArgs {
        type_name: "slow".into(),
        shard_id: "0".into(),
        node: "10.0.0.1:2552".into(),
        lease,
        factory: entity_factory(Slow),
        settings: Arc::new(settings),
        active: None,
        process_end: ProcessEnd::with_hook(|what| panic!("a hand-off ended the process: {what:?}")),
    };
    Shard::start(args, None).await.unwrap()
}

/// Asks `n`, which takes `ms` to handle.
fn ask(shard: &ActorRef<ShardMsg>, n: u32, ms: u64) -> tokio::sync::oneshot::Receiver<AskReply> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    shard
        .cast(ShardMsg::Deliver {
            entity: "e".into(),
            payload: tenure_cluster::codec::encode_inner("entity request", "slow", &(n, ms))
                .unwrap(),
            reply: Some((tx, Duration::from_secs(30)).into()),
        })
        .unwrap();
    rx
}

/// Ten asks of 100 ms each wait in the entity's mailbox (a second of work, three times
/// `stop-timeout`) when the hand-off begins: each is answered, none dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_answers_every_ask_already_delivered_past_stop_timeout() {
    let shard = shard().await;
    // The entity runs (its lease granted): the first answer comes back.
    let first = tokio::time::timeout(Duration::from_secs(10), ask(&shard, 0, 0))
        .await
        .expect("the first ask answered within 10 s");
    assert!(first.is_ok_and(|r| r.result.is_ok()), "the first ask");
    let waiting: Vec<_> = (1..=10).map(|n| ask(&shard, n, 100)).collect();
    hand_off_answering(&shard, waiting).await;
}

/// Hands the shard off and checks that every ask of `waiting` is answered.
async fn hand_off_answering(
    shard: &ActorRef<ShardMsg>,
    waiting: Vec<tokio::sync::oneshot::Receiver<AskReply>>,
) {
    let handed = ractor::call_t!(shard, ShardMsg::HandOff, 20_000).unwrap();
    assert!(handed.released, "the hand-off released the shard's lease");
    let mut dropped = Vec::new();
    for (n, reply) in (1..).zip(waiting) {
        match reply.await {
            Ok(AskReply { result: Ok(_) }) => {}
            other => dropped.push(format!("ask {n}: {other:?}")),
        }
    }
    assert!(
        dropped.is_empty(),
        "asks delivered before the hand-off were not answered:\n{}",
        dropped.join("\n")
    );
}

/// The ask in hand when the hand-off begins takes 900 ms, three times `stop-timeout`, with
/// three more behind it: the entity handles nothing for longer than `stop-timeout`, and is
/// still let finish every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_answers_the_asks_behind_one_slower_than_stop_timeout() {
    let shard = shard().await;
    let first = tokio::time::timeout(Duration::from_secs(10), ask(&shard, 0, 0))
        .await
        .expect("the first ask answered within 10 s");
    assert!(first.is_ok_and(|r| r.result.is_ok()), "the first ask");
    let mut waiting = vec![ask(&shard, 1, 900)];
    waiting.extend((2..=4).map(|n| ask(&shard, n, 10)));
    hand_off_answering(&shard, waiting).await;
}
