//! What Tenure's tests and benchmarks share (not published).
//!
//! Real servers, each on free loopback ports with its data in a temporary directory,
//! stopped when dropped: PostgreSQL ([`postgres`]), etcd ([`etcd`]) and ZooKeeper
//! ([`zookeeper`]), from their Debian packages (`.ci/test.sh` installs them). A missing
//! server is a loud failure naming the package, never a skip.
//!
//! The multi-process harness of `tenure-cli`'s tests and benches (`cli`, feature `cli`):
//! `tenure` processes in a sandbox, clusters of nodes with faults (the demo's cluster
//! harness, with this build's binary), what their histories show; and [`example`] runs a
//! built example. `node` (feature `node`): a node alone in its cluster on the memory
//! store, in the test's own process. [`eventually`] is the one bounded polling loop of the tests;
//! [`http`] asks a management endpoint; [`next_within`] and [`nothing_for`] wait on what a
//! test's actors report over a channel.

#[cfg(feature = "cli")]
pub mod cli;
pub mod etcd;
mod eventually;
pub mod example;
mod gate;
mod history;
pub mod http;
#[cfg(feature = "node")]
pub mod node;
mod ports;
pub mod postgres;
mod received;
pub mod signal;
pub mod zookeeper;

pub use eventually::{POLL_EVERY, eventually, eventually_async};
pub use gate::Gate;
pub use history::{TestHistory, recorded};
pub use received::{next_within, nothing_for};
