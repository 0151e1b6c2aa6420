//! # tenure-singleton
//!
//! Cluster Singleton guarded by a lease (Akka's ClusterSingletonManager with `use-lease`):
//! a [`SingletonManager`] on every node starts the instance on the oldest up member only
//! after it holds the lease `<system>-singleton-<name>` (owner: the node's `host:port`),
//! gives the instance the grant's fencing token, stops it (and waits for it) when the lease
//! is lost, and hands over on leave; a [`SingletonProxy`] on every node routes messages to
//! the current instance and buffers while there is none.

mod manager;
mod proxy;
mod settings;
pub mod ticker;

pub use manager::{
    ManagerMsg, SingletonContext, SingletonManager, SingletonSpec, SingletonStatus, Spawner,
    instance_group, spawner,
};
pub use proxy::{ProxyError, SingletonProxy};
pub use settings::SingletonSettings;
