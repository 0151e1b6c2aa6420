//! A node alone in its cluster, in the test's own process, on the memory store: the
//! fixture of the tests that need a real [`Node`] (sharding and management integration
//! tests) and of the in-process sharding bench.

use tenure_cluster::{ClusterError, ClusterSettings, Node};
use tenure_lease::{LeaseProvider, StoreRegistry, TenureConfig};

use crate::ports;

/// The `[tenure]`, `[lease.memory]` and `[cluster]` sections of a node alone in its cluster
/// on `port` with `cookie` (32 characters or more): the memory store with short leases
/// (ttl 3 s, renewed every 500 ms), the member lease likewise. A test appends its own
/// sections (`[sharding]`, `[cluster.management]`) after it.
pub fn one_node_toml(port: u16, cookie: &str) -> String {
    format!(
        "[tenure]\ndefault-lease-section = \"memory\"\n\
         [lease.memory]\nheartbeat-timeout = \"3s\"\nheartbeat-interval = \"500ms\"\n\
         [cluster]\nport = {port}\ncookie = \"{cookie}\"\n\
         member-lease-ttl = \"3s\"\nmember-lease-interval = \"500ms\"\n"
    )
}

/// The head of a test node's config on the memory store: `[tenure]` naming the lease
/// section `m`, and `[lease.m]` on the memory store in `namespace` (tests of one process
/// share the memory store; distinct namespaces keep their leases apart). A test appends the
/// rest of `[lease.m]` (its timings) and its other sections.
pub fn memory_head(namespace: &str) -> String {
    format!(
        "[tenure]\ndefault-lease-section = \"m\"\n\
         [lease.m]\nstore = \"memory\"\nnamespace = \"{namespace}\"\n"
    )
}

/// Starts a node alone in its cluster from [`one_node_toml`] with `more` (TOML sections)
/// appended, and its lease provider (whose `config()` is the whole config). Panics, naming
/// what failed, when the node cannot start.
pub async fn one_node(cookie: &str, more: &str) -> (Node, LeaseProvider) {
    start_node(
        |port| format!("{}{more}", one_node_toml(port, cookie)),
        |_| {},
    )
    .await
}

/// Starts a node from the config `config` writes for a free loopback port, with the memory
/// store only (the reference's other store kinds load as left out); `prepare` sees the
/// provider before the node starts (to add an observer). A port taken by someone else
/// before the node bound it is replaced by another free one; any other failure panics,
/// naming it.
pub async fn start_node(
    config: impl Fn(u16) -> String,
    prepare: impl Fn(&LeaseProvider),
) -> (Node, LeaseProvider) {
    for _ in 0..ports::ATTEMPTS {
        let toml = config(ports::free());
        let config = TenureConfig::from_toml_str(&toml, "test")
            .unwrap_or_else(|e| panic!("the test's config: {e}\n{toml}"));
        let registry = ["sqlite", "postgres", "etcd", "zookeeper"]
            .into_iter()
            .fold(StoreRegistry::new(), |r, kind| r.left_out(kind, kind));
        let provider = LeaseProvider::new(config.clone(), registry)
            .unwrap_or_else(|e| panic!("the test's lease provider: {e}"));
        prepare(&provider);
        let settings = ClusterSettings::from_config(&config)
            .unwrap_or_else(|e| panic!("the test's cluster settings: {e}"));
        match Node::start(settings, &provider).await {
            Ok(node) => return (node, provider),
            Err(ClusterError::Bind { source, .. })
                if source.kind() == std::io::ErrorKind::AddrInUse => {}
            Err(e) => panic!("the test's node did not start: {e}"),
        }
    }
    panic!(
        "the test's node found no free port in {} attempts",
        ports::ATTEMPTS
    )
}
