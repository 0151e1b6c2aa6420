//! The active-entity limit of a region: two shards of one region share a limit of 2
//! entities; starting a third passivates the least recently used, whichever shard runs
//! it, and a message to a passivated entity starts it again (passivating the next least
//! recently used).

use std::sync::Arc;
use std::time::Duration;

use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};
use tenure_lease::{LeaseSpec, MemoryStore, TenureConfig};
use tenure_lease_kit::conformance::holder_test_settings;
use tenure_sharding::{
    ActiveEntities, AskReply, Entity, EntityContext, Shard, ShardArgs, ShardMsg, ShardingSettings,
    entity_factory, shard_of,
};
use tenure_test_kit::next_within;
use tokio::sync::mpsc;

/// Reports its starts and stops as `+id` and `-id`.
struct Probe(mpsc::UnboundedSender<String>);

impl Entity for Probe {
    type Request = String;
    type Reply = String;
    type State = ();

    async fn start(&self, ctx: &EntityContext) -> Result<(), ActorProcessingErr> {
        let _ = self.0.send(format!("+{}", ctx.entity_id));
        Ok(())
    }

    async fn handle(
        &self,
        ctx: &EntityContext,
        _state: &mut (),
        request: String,
    ) -> Result<String, ActorProcessingErr> {
        Ok(format!("{}:{request}", ctx.entity_id))
    }

    async fn stop(&self, ctx: &EntityContext, _state: &mut ()) {
        let _ = self.0.send(format!("-{}", ctx.entity_id));
    }
}

async fn shard(
    store: &MemoryStore,
    shard_id: &str,
    active: &ActiveEntities,
    tx: &mpsc::UnboundedSender<String>,
) -> ActorRef<ShardMsg> {
    let config = TenureConfig::from_toml_str(
        "[sharding]\nidle-timeout = \"off\"\nactive-entity-limit = 2",
        "test",
    )
    .unwrap();
    let mut settings = ShardingSettings::from_config(&config, "probe", "memory").unwrap();
    assert_eq!(settings.active_entity_limit, Some(2));
    settings.number_of_shards = 2;
    settings.stop_timeout = Duration::from_millis(300);
    settings.lease = holder_test_settings();
    let lease = LeaseSpec::new(
        &format!("test-shard-probe-{shard_id}"),
        "10.0.0.1:2552",
        Arc::new(store.clone()),
        holder_test_settings(),
    )
    .unwrap();
    let args = ShardArgs {
        type_name: "probe".into(),
        shard_id: shard_id.into(),
        node: "10.0.0.1:2552".into(),
        lease,
        factory: entity_factory(Probe(tx.clone())),
        active: Some(active.clone()),
        settings: Arc::new(settings),
        process_end: tenure_lease::ProcessEnd::abort(),
    };
    Shard::start(args, None).await.unwrap()
}

async fn ask(shard: &ActorRef<ShardMsg>, entity: &str) -> String {
    let payload =
        tenure_cluster::codec::encode_inner("entity request", "probe", &"hi".to_string()).unwrap();
    let reply = shard
        .call(
            |r: RpcReplyPort<AskReply>| ShardMsg::Deliver {
                entity: entity.into(),
                payload,
                reply: Some(r),
            },
            Some(Duration::from_secs(10)),
        )
        .await
        .unwrap();
    let ractor::rpc::CallResult::Success(AskReply { result }) = reply else {
        panic!("no answer");
    };
    tenure_cluster::codec::decode_inner("entity request", "probe", &result.unwrap()).unwrap()
}

async fn next(seen: &mut mpsc::UnboundedReceiver<String>) -> String {
    next_within(seen, Duration::from_secs(10), "an entity start or stop").await
}

/// The `n`th id (from 0) of the form `e<i>` that belongs to shard `shard` of 2.
fn id_in(shard: &str, n: usize) -> String {
    (0..)
        .map(|i| format!("e{i}"))
        .filter(|id| shard_of(id, 2) == shard)
        .nth(n)
        .unwrap()
}

#[tokio::test]
async fn the_least_recently_used_entity_of_the_region_is_passivated_past_the_limit() {
    let store = MemoryStore::new();
    let active = ActiveEntities::new(2);
    let (tx, mut seen) = mpsc::unbounded_channel();
    let s0 = shard(&store, "0", &active, &tx).await;
    let s1 = shard(&store, "1", &active, &tx).await;
    let (a, b, c) = (id_in("0", 0), id_in("1", 0), id_in("0", 1));

    assert_eq!(ask(&s0, &a).await, format!("{a}:hi"));
    assert_eq!(next(&mut seen).await, format!("+{a}"));
    assert_eq!(ask(&s1, &b).await, format!("{b}:hi"));
    assert_eq!(next(&mut seen).await, format!("+{b}"));
    // `a` is used again: `b` is now the least recently used.
    assert_eq!(ask(&s0, &a).await, format!("{a}:hi"));
    assert_eq!(active.len(), 2);

    // A third entity, in shard 0: `b`, in shard 1, is passivated.
    assert_eq!(ask(&s0, &c).await, format!("{c}:hi"));
    let mut got = vec![next(&mut seen).await, next(&mut seen).await];
    got.sort();
    assert_eq!(got, [format!("+{c}"), format!("-{b}")]);
    assert_eq!(active.len(), 2);

    // `b` starts again on its next message; `a` is the least recently used now.
    assert_eq!(ask(&s1, &b).await, format!("{b}:hi"));
    let mut got = vec![next(&mut seen).await, next(&mut seen).await];
    got.sort();
    assert_eq!(got, [format!("+{b}"), format!("-{a}")]);
    assert_eq!(active.len(), 2);

    // Stopped shards leave the count.
    for s in [s0, s1] {
        s.stop_and_wait(None, Some(Duration::from_secs(10)))
            .await
            .unwrap();
    }
    assert!(active.is_empty(), "{active:?}");
}

#[test]
fn a_limit_of_zero_is_refused_naming_the_key() {
    let config =
        TenureConfig::from_toml_str("[sharding.probe]\nactive-entity-limit = 0", "test").unwrap();
    let e = ShardingSettings::from_config(&config, "probe", "memory").unwrap_err();
    assert!(
        e.to_string().contains("sharding.probe.active-entity-limit"),
        "{e}"
    );
}
