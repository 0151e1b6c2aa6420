//! # tenure
//!
//! The facade of the Tenure workspace: the Lease API of [`tenure_lease`] with every store
//! kind of the workspace wired into one [`StoreRegistry`].
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let provider = tenure::provider(tenure::TenureConfig::load(None)?)?;
//! let lease = provider.lease("nightly-report", "sqlite", "10.0.0.1:2552").await?;
//! if let tenure::Acquired::Granted { token } = lease.acquire().await? {
//!     println!("holding with fencing token {token}");
//!     lease.release().await?;
//! }
//! # Ok(()) }
//! ```

pub use tenure_cluster as cluster;
pub use tenure_lease::*;
pub use tenure_sharding as sharding;
pub use tenure_singleton as singleton;
pub use tenure_store_etcd as etcd;
pub use tenure_store_postgres as postgres;
pub use tenure_store_sqlite as sqlite;
pub use tenure_store_zookeeper as zookeeper;

/// Every store kind this build knows: `memory`, `sqlite`, `postgres`, `etcd` and `zookeeper`.
pub fn store_registry() -> StoreRegistry {
    StoreRegistry::new()
        .with(tenure_store_sqlite::SqliteStoreFactory)
        .with(tenure_store_postgres::PostgresStoreFactory)
        .with(tenure_store_etcd::EtcdStoreFactory)
        .with(tenure_store_zookeeper::ZooKeeperStoreFactory)
}

/// A provider over `config` with every known store kind.
pub fn provider(config: TenureConfig) -> Result<LeaseProvider, ConfigError> {
    LeaseProvider::new(config, store_registry())
}
