//! # tenure-store-etcd
//!
//! The lease store on etcd, the Consistent Core of the lease pattern: etcd's leader tracks
//! time-to-lives on its own clock, keys attached to an etcd lease are deleted with it.
//!
//! - **One session per owner** (an etcd lease per owner and time-to-live, per store
//!   client). Every Tenure lease the owner holds is a key `<prefix>leases/<name>` attached
//!   to it, so renewing costs one keep-alive (plus one heartbeat write and one read of the
//!   attached keys) whatever the number of leases, and when the session expires every key
//!   of the owner goes at once.
//! - **Fencing tokens** are the holder key's create revision: etcd's global revision
//!   never goes back, across holders, releases, expiries and restarts.
//! - **Expiry** is the server's for whole seconds; shorter time-to-lives are judged on
//!   each client's own monotonic clock against etcd's revision order ([`clock`] module
//!   docs): no wall clocks are compared.
//! - **Fair acquire** ([`LeaseStore::acquire_fair`](tenure_lease::LeaseStore::acquire_fair))
//!   queues waiter keys in revision order, each watching only its predecessor (etcd's
//!   `concurrency.Mutex`), and **watch** pushes holder changes.
//! - **Priority leases**: a preemption request is a key next to the grant, read by the
//!   holder's renewal in the transaction that writes its heartbeat; a forceful one ends the
//!   grant for every client one ttl after it was recorded, judged on the revision clock,
//!   although the holder's session lives on (`preempt` module docs).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tenure_lease::{AcquireOutcome, AcquireRequest, LeaseStore};
//! let client = etcd_client::Client::connect(["http://127.0.0.1:2379"], None).await?;
//! let store = tenure_store_etcd::EtcdStore::new(client, "/tenure/");
//! let req = AcquireRequest {
//!     name: "nightly-report".into(),
//!     owner: "10.0.0.1:2552".into(),
//!     instance: "1".into(),
//!     ttl: Duration::from_secs(10),
//!     note: None,
//!     ..AcquireRequest::default()
//! };
//! if let AcquireOutcome::Granted(record) = store.try_acquire(&req).await? {
//!     println!("fencing token {}", record.token);
//!     store.release(&req.name, &req.owner, record.token).await?;
//! }
//! # Ok(()) }
//! ```

pub mod clock;
mod error;
mod fair;
mod layout;
mod local;
mod options;
mod preempt;
mod session;
mod store;
mod watch;

pub use options::{EtcdConfig, EtcdOptions, EtcdStoreFactory, REFERENCE};
pub use store::EtcdStore;
