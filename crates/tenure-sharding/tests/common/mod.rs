//! The one-node cluster of the sharding tests that run a real node: a memory store, short
//! leases, and the sharding sections each test gives.

use ractor::ActorProcessingErr;
use tenure_cluster::{ClusterSettings, Node};
use tenure_lease::{LeaseProvider, StoreRegistry, TenureConfig};
use tenure_sharding::{Entity, EntityContext};

/// An entity that answers every number with itself.
#[allow(dead_code)] // Not every test binary that includes this module uses it.
pub struct Echo;

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

/// Starts a node alone in its cluster (cookie `cookie`, 32 characters or more) on a memory
/// store, with `sharding` as the TOML of its sharding sections, and its lease provider.
pub async fn one_node(cookie: &str, sharding: &str) -> (Node, LeaseProvider) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = TenureConfig::from_toml_str(
        &format!(
            "[tenure]\ndefault-lease-section = \"memory\"\n\
             [lease.memory]\nheartbeat-timeout = \"3s\"\nheartbeat-interval = \"500ms\"\n\
             [cluster]\nport = {port}\ncookie = \"{cookie}\"\n\
             member-lease-ttl = \"3s\"\nmember-lease-interval = \"500ms\"\n\
             {sharding}"
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
    (node, provider)
}
