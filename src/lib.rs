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
//!
//! ## Cargo features
//!
//! | feature | what it adds | default |
//! |---|---|---|
//! | `sqlite` | the embedded SQLite store ([`sqlite`]) | yes |
//! | `postgres` | the PostgreSQL store ([`postgres`]) | no |
//! | `etcd` | the etcd store ([`etcd`]); etcd's client needs `protoc` to build | no |
//! | `zookeeper` | the ZooKeeper store ([`zookeeper`]) | no |
//! | `all-stores` | all four | no |
//! | `cluster` | the cluster node ([`cluster`]) | yes |
//! | `singleton` | Cluster Singleton ([`singleton`]), with `cluster` | yes |
//! | `sharding` | Cluster Sharding ([`sharding`]), with `singleton` | yes |
//! | `management` | the management HTTP endpoint of a node ([`management`]), with `sharding` | no |
//! | `fault-injection` | link faults on request (`cluster.fault-injection`), with `cluster`: tests and drills | no |
//!
//! The `memory` store is always there. A lease section whose store kind this build left out
//! still loads; using it is a [`ConfigError::StoreNotBuilt`] naming the feature to enable.

#[cfg(feature = "cluster")]
pub use ractor;
#[cfg(feature = "cluster")]
pub use tenure_cluster as cluster;
// The Lease API and the store SPI, by name: internals of the lease crate (its actor's
// state, the renewal batcher, the memory store's fault switch) stay out of the facade.
/// Histories (docs/history.md): the typed events every layer emits, the writer to install
/// (a `tracing` layer), the reader and the checker.
pub use tenure_history as history;
pub use tenure_lease::{
    AcquireOptions, AcquireOutcome, AcquireReply, AcquireRequest, Acquired, CONFIG_VAR,
    Capabilities, ConfigError, EMERGENCY_PRIORITY, Election, FairQueue, FenceCheck, FencingToken,
    Grant, HeldLease, HolderClock, HolderWatch, Leader, LeaderWatch, Lease, LeaseActor, LeaseError,
    LeaseEvent, LeaseEventSink, LeaseGranted, LeaseLost, LeaseMsg, LeaseObserver, LeaseProvider,
    LeaseRecord, LeaseSection, LeaseSettings, LeaseSpec, LeaseStore, LeaseTiming, LeaseTrace,
    LeaseView, LostReason, MemoryStore, MemoryStoreFactory, Permit, PreemptionRequest,
    PreemptionRequested, PreemptionRequests, PreemptionWithdrawn, ProcessEnd, RememberedIds,
    Semaphore, StaleToken, StopBudget, StopDeadlines, StoreError, StoreFactory, StoreRegistry,
    TenureConfig, TenureSettings, Unstoppable, WhenKillFails,
};
pub use tenure_lease::{
    clock, config, duration, election, fence, memory, names, semaphore, store, trace, validity,
};
#[cfg(feature = "management")]
pub use tenure_management as management;
#[cfg(feature = "sharding")]
pub use tenure_sharding as sharding;
#[cfg(feature = "singleton")]
pub use tenure_singleton as singleton;
#[cfg(feature = "etcd")]
pub use tenure_store_etcd as etcd;
#[cfg(feature = "postgres")]
pub use tenure_store_postgres as postgres;
#[cfg(feature = "sqlite")]
pub use tenure_store_sqlite as sqlite;
#[cfg(feature = "zookeeper")]
pub use tenure_store_zookeeper as zookeeper;

/// Every store kind this build has (`memory` always; `sqlite`, `postgres`, `etcd` and
/// `zookeeper` by feature), and the features that would add the others.
pub fn store_registry() -> StoreRegistry {
    let registry = StoreRegistry::new();
    #[cfg(feature = "sqlite")]
    let registry = registry.with(tenure_store_sqlite::SqliteStoreFactory);
    #[cfg(not(feature = "sqlite"))]
    let registry = registry.left_out("sqlite", "sqlite");
    #[cfg(feature = "postgres")]
    let registry = registry.with(tenure_store_postgres::PostgresStoreFactory);
    #[cfg(not(feature = "postgres"))]
    let registry = registry.left_out("postgres", "postgres");
    #[cfg(feature = "etcd")]
    let registry = registry.with(tenure_store_etcd::EtcdStoreFactory);
    #[cfg(not(feature = "etcd"))]
    let registry = registry.left_out("etcd", "etcd");
    #[cfg(feature = "zookeeper")]
    let registry = registry.with(tenure_store_zookeeper::ZooKeeperStoreFactory);
    #[cfg(not(feature = "zookeeper"))]
    let registry = registry.left_out("zookeeper", "zookeeper");
    registry
}

/// A provider over `config` with every known store kind.
pub fn provider(config: TenureConfig) -> Result<LeaseProvider, ConfigError> {
    LeaseProvider::new(config, store_registry())
}
