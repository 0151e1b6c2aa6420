//! # tenure-singleton
//!
//! Cluster Singleton guarded by a lease (Akka's ClusterSingletonManager with `use-lease`):
//! a [`SingletonManager`] on every node starts the instance on the oldest up member only
//! after it holds the lease `<system>-singleton-<name>` (owner: the node's `host:port`),
//! gives the instance the grant's fencing token, stops it (and waits for it) when the lease
//! is lost, and hands over on leave; a [`SingletonProxy`] on every node routes messages to
//! the current instance and buffers while there is none.

mod history;
mod instance;
mod manager;
mod proxy;
mod settings;

pub use instance::{InstanceMsg, Singleton, SingletonRef, singleton_spawner, start_singleton};
pub use manager::{
    ManagerMsg, SingletonContext, SingletonManager, SingletonSpec, SingletonStatus, Spawner,
    StartError, StartHandle, StartingInstance, instance_group, instance_group_prefix, spawner,
    start_outcome,
};
pub use proxy::{ProxyError, SingletonProxy};
pub use settings::{REFERENCE, SingletonConfig, SingletonSettings};

use ractor::ActorRef;
use tenure_cluster::{ClusterSubscriber, Node};
use tenure_lease::LeaseProvider;

/// Why a singleton could not be set up on a node.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SingletonError {
    /// The configuration could not be read.
    #[error(transparent)]
    Config(#[from] tenure_lease::ConfigError),
    /// The manager actor could not be spawned.
    #[error("singleton `{name}`: cannot start its manager: {detail}")]
    Spawn {
        /// The singleton's name.
        name: String,
        /// The spawn error.
        detail: String,
    },
    /// The manager could not be subscribed to the node's cluster events.
    #[error(transparent)]
    Cluster(#[from] tenure_cluster::ClusterError),
}

/// Runs singleton `name` on `node`: its settings from `[singleton]` / `[singleton.<name>]`
/// of the provider's config, its lease `<system>-singleton-<name>` owned by the node's
/// `host:port`, instances made by `spawner`. Every node that may host it calls this.
pub async fn start_on_node(
    node: &Node,
    provider: &LeaseProvider,
    name: &str,
    spawner: Spawner,
) -> Result<ActorRef<ManagerMsg>, SingletonError> {
    let cluster = node.settings();
    let settings = SingletonSettings::from_config(provider.config(), name, &cluster.lease_section)?;
    start_with_settings(node, provider, name, settings, spawner).await
}

/// A proxy to singleton `name` from `node` (any node of the cluster, hosting it or not):
/// `send` and `call` reach the current instance, buffering up to the singleton's
/// `buffer-size` (from `[singleton]` / `[singleton.<name>]`) while there is none. `M` is
/// the instance's message type. `Err` names the singleton: a bad name or config, or the
/// proxy actor could not be spawned.
pub async fn proxy_on_node<M: ractor::Message>(
    node: &Node,
    provider: &LeaseProvider,
    name: &str,
) -> Result<SingletonProxy<M>, SingletonError> {
    let cluster = node.settings();
    let settings = SingletonSettings::from_config(provider.config(), name, &cluster.lease_section)?;
    let scope = tenure_cluster::scope(&cluster.system);
    SingletonProxy::start(&scope, name, settings.buffer_size)
        .await
        .map_err(|e| SingletonError::Spawn {
            name: name.to_string(),
            detail: format!("its proxy: {e}"),
        })
}

/// As [`start_on_node`] with `settings` given (e.g. the shard coordinator, whose role is
/// its entity type's).
pub async fn start_with_settings(
    node: &Node,
    provider: &LeaseProvider,
    name: &str,
    settings: SingletonSettings,
    spawner: Spawner,
) -> Result<ActorRef<ManagerMsg>, SingletonError> {
    tenure_lease::names::check_component("singleton name", name)?;
    let cluster = node.settings();
    let lease_name = tenure_lease::names::singleton_lease(&cluster.system, name);
    let lease = provider
        .spec(
            &lease_name,
            &settings.lease_section,
            &node.addr().to_string(),
        )
        .await?;
    let spec = SingletonSpec {
        name: name.to_string(),
        settings,
        lease,
        me: node.addr().clone(),
        scope: tenure_cluster::scope(&cluster.system),
        spawner,
        process_end: tenure_lease::ProcessEnd::abort(),
    };
    let manager = SingletonManager::start(spec, None)
        .await
        .map_err(|e| SingletonError::Spawn {
            name: name.to_string(),
            detail: e.to_string(),
        })?;
    node.subscribe(ClusterSubscriber::to_actor(manager.clone()))?;
    Ok(manager)
}
