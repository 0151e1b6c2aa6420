//! External shard allocation through the library, on a one-node cluster (memory store):
//! `ShardRegion::pin_shard` pins a shard to the node that hosts it (nothing to move) or
//! allocates it there, and refuses, naming what is wrong, a shard id the type does not
//! have, an address that is not one, and a node that has no region; `unpin_shard` takes
//! the pin off. (The move between nodes is in tenure-cli's management tests.)

use std::time::Duration;

use ractor::ActorProcessingErr;
use tenure_cluster::{ClusterSettings, Node};
use tenure_lease::{LeaseProvider, StoreRegistry, TenureConfig};
use tenure_sharding::{Entity, EntityContext, ShardingError};

struct Echo;

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
        Ok(n)
    }
}

const TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pin_shard_places_a_shard_and_names_what_is_wrong_in_bad_input() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = TenureConfig::from_toml_str(
        &format!(
            "[tenure]\ndefault-lease-section = \"memory\"\n\
             [lease.memory]\nheartbeat-timeout = \"3s\"\nheartbeat-interval = \"500ms\"\n\
             [cluster]\nport = {port}\ncookie = \"pin-shard-test-0123456789abcdef0123\"\n\
             member-lease-ttl = \"3s\"\nmember-lease-interval = \"500ms\"\n\
             [sharding]\nretry-interval = \"100ms\"\nnumber-of-shards = 10\n"
        ),
        "test",
    )
    .unwrap();
    let registry = ["sqlite", "postgres", "etcd", "zookeeper"]
        .into_iter()
        .fold(StoreRegistry::new(), |r, kind| r.left_out(kind, kind));
    let provider = LeaseProvider::new(config.clone(), registry).unwrap();
    let node = Node::start(ClusterSettings::from_config(&config).unwrap(), &provider)
        .await
        .unwrap();
    let me = node.addr().to_string();
    let region = tenure_sharding::start_on_node(
        &node,
        &provider,
        "echo",
        Some(tenure_sharding::entity_factory(Echo)),
    )
    .await
    .unwrap();
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
