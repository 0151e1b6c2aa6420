//! # tenure-cluster
//!
//! A cluster node on `ractor_cluster`: identity (`host:port` plus an incarnation), a mesh
//! kept whole (seeds, transitive discovery, redial with jittered backoff), membership from
//! member leases (the Consistent Core pattern: each node holds `<system>-member-<host:port>`
//! in the lease store while it is up; a node that cannot renew it is down), an application
//! heartbeat for reachability, graceful leave with hand-over, optional mutual TLS, and the
//! bincode wire codec for remotable messages ([`cluster_message!`]).
//!
//! Membership and reachability are for liveness: who should host what. Safety (never two
//! holders) comes from the leases guarding each singleton and shard.

mod agent;
mod app_version;
pub mod backoff;
mod client;
pub mod clocks;
pub mod codec;
mod detector;
mod error;
mod history;
mod identity;
mod member;
pub mod metrics;
mod node;
pub mod placement;
mod protocol;
pub mod reachability;
mod readiness;
pub mod ring;
pub mod sbr;
mod settings;
mod shutdown;
pub mod sim;
mod subscribe;
pub mod transport;

pub use agent::scope;

/// What [`cluster_message!`]'s expansion names, so that a program using the macro needs no
/// `ractor` dependency of its own (nor one in step with Tenure's). Not an API.
#[doc(hidden)]
pub mod __private {
    pub use ractor;
}
pub use app_version::{AppVersion, DEFAULT_APP_VERSION};
pub use client::ClusterClient;
pub use error::{ClusterError, OperatorRefusal};
pub use identity::{AddressProblem, Incarnation, NodeAddr};
pub use member::{ClusterEvent, Listed, Member, MemberStatus, Membership};
pub use node::{Inspector, Node, NodeBuilder, Operator, Subscriptions};
pub use protocol::{COMPATIBLE_PROTOCOLS, MemberInfo, NodeView, PROTOCOL_VERSION};
pub use readiness::{DEFAULT_SUSPENDED_AFTER, NotReady, Readiness, ReadinessGate};
pub use settings::{ClusterConfig, ClusterSettings, REFERENCE, TlsConfig, TlsFiles};
pub use shutdown::{CoordinatedShutdown, Phase, RequestGuard, Requests, ShutdownConfig};
pub use subscribe::{ClusterSubscriber, HandOver, HandOverWait};
