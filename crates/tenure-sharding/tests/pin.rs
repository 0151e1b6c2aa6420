//! External shard allocation through the library, on a one-node cluster (memory store):
//! `ShardRegion::pin_shard` pins a shard to the node that hosts it (nothing to move) or
//! allocates it there, and refuses, naming what is wrong, a shard id the type does not
//! have, an address that is not one, and a node that has no region; `unpin_shard` takes
//! the pin off. (The move between nodes is in tenure-cli's management tests.)

mod common;

use std::time::Duration;

use tenure_sharding::ShardingError;

const TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pin_shard_places_a_shard_and_names_what_is_wrong_in_bad_input() {
    let (node, provider) = common::one_node(
        "pin-shard-test-0123456789abcdef0123",
        "[sharding]\nretry-interval = \"100ms\"\nnumber-of-shards = 10\n",
    )
    .await;
    let me = node.addr().to_string();
    let region = common::start_echo(&node, &provider).await;
    let shard = region.shard_of("a");
    let answer: u64 = region.ask("a", &7u64, TIMEOUT).await.unwrap();
    assert_eq!(answer, 7);

    // Where it lives already: pinned, nothing moves.
    assert!(!region.pin_shard(&shard, &me, TIMEOUT).await.unwrap());
    // A shard with no home yet is allocated to its pin.
    let other = if shard == "3" { "4" } else { "3" };
    assert!(region.pin_shard(other, &me, TIMEOUT).await.unwrap());
    region.unpin_shard(other, TIMEOUT).await.unwrap();

    let err = region.pin_shard("10", &me, TIMEOUT).await.unwrap_err();
    assert!(
        matches!(err, ShardingError::InvalidPlacement { .. })
            && err.to_string().contains("`10`")
            && err.to_string().contains("0 to 9"),
        "{err}"
    );
    let err = region.pin_shard("03", &me, TIMEOUT).await.unwrap_err();
    assert!(
        matches!(err, ShardingError::InvalidPlacement { .. }),
        "{err}"
    );
    let err = region
        .pin_shard(&shard, "no-port", TIMEOUT)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ShardingError::InvalidPlacement { .. })
            && err.to_string().contains("no-port"),
        "{err}"
    );
    let err = region
        .pin_shard(&shard, "127.0.0.1:1", TIMEOUT)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, ShardingError::Placement { .. })
            && text.contains("127.0.0.1:1")
            && text.contains(&format!("shard {shard}"))
            && text.contains(&me),
        "{text}"
    );
    // Still served where it was.
    let answer: u64 = region.ask("a", &8u64, TIMEOUT).await.unwrap();
    assert_eq!(answer, 8);
    node.leave().await.unwrap();
}
