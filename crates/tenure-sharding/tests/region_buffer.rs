//! A region's buffer (messages waiting to learn their shard's home): an ask whose caller
//! stopped waiting gives its place back, so a buffer is never kept full by asks nobody
//! waits for.

use std::sync::Arc;
use std::time::Duration;

use ractor::Actor;
use ractor::rpc::CallResult;
use tenure_lease::TenureConfig;
use tenure_sharding::{
    AskReply, CoordinatorMsg, Envelope, Region, RegionArgs, RegionMsg, ShardingSettings,
};
use tenure_singleton::SingletonProxy;

fn envelope(entity: &str) -> Envelope {
    Envelope {
        shard: "3".into(),
        entity: entity.into(),
        payload: Vec::new(),
        hops: 0,
    }
}

#[tokio::test]
async fn an_ask_whose_caller_gave_up_leaves_the_region_buffer() {
    let config = TenureConfig::from_toml_str(
        "[sharding]\nbuffer-size = 1\nretry-interval = \"20ms\"",
        "test",
    )
    .unwrap();
    let settings = ShardingSettings::from_config(&config, "probe", "memory").unwrap();
    let scope = "region-buffer-test";
    // No coordinator runs anywhere: every message waits in the region's buffer.
    let coordinator =
        SingletonProxy::<CoordinatorMsg>::start(scope, "sharding-probe-coordinator", 10)
            .await
            .unwrap();
    let args = RegionArgs {
        type_name: "probe".into(),
        me: "127.0.0.1:1".into(),
        scope: scope.into(),
        system: "test".into(),
        settings: Arc::new(settings),
        hosting: None,
        coordinator,
        routes: Default::default(),

        readiness: tenure_cluster::Readiness::new().gate("region", "starting"),
    };
    let (region, _) = Actor::spawn(None, Region, args).await.unwrap();
    let ask = |entity: &'static str| {
        let region = region.clone();
        async move {
            region
                .call(
                    |r| RegionMsg::Ask(envelope(entity), r),
                    Some(Duration::from_millis(100)),
                )
                .await
                .unwrap()
        }
    };
    // The only place in the buffer is taken by an ask that times out (or that the region
    // dropped once its timeout passed, if that reached the caller first).
    let asked = tokio::time::Instant::now();
    match ask("a").await {
        CallResult::Timeout => {}
        CallResult::SenderError => assert!(
            asked.elapsed() >= Duration::from_millis(100),
            "the first ask was dropped before its timeout"
        ),
        CallResult::Success(AskReply { result }) => {
            panic!("the first ask was answered: {result:?}")
        }
    }
    // Many retry intervals later, its place is free again: the next ask waits too (and
    // times out) instead of being refused because the buffer is full.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let asked = tokio::time::Instant::now();
    match ask("b").await {
        CallResult::Timeout => {}
        CallResult::Success(AskReply { result }) => {
            panic!("the second ask was answered at once: {result:?}")
        }
        // The region drops an ask once its own timeout has passed; on a loaded machine that
        // can reach the caller before its timer does. Dropped any earlier, it was refused.
        CallResult::SenderError => assert!(
            asked.elapsed() >= Duration::from_millis(100),
            "the second ask was dropped before its timeout"
        ),
    }
    region.stop_and_wait(None, None).await.unwrap();
}
