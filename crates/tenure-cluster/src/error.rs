//! Typed errors of the cluster layer; each names what was wrong.

use tenure_lease::{ConfigError, LeaseError};

/// Why a node could not start, or a cluster operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The configuration could not be read.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// An address in configuration or on the command line is malformed.
    #[error("`{key}`: invalid address {value:?}: {problem}")]
    Address {
        /// The config key or option that gave it.
        key: String,
        /// The address as given.
        value: String,
        /// Why it is malformed.
        #[source]
        problem: crate::AddressProblem,
    },
    /// The node could not listen on its address (in use, not local, no permission).
    #[error("cannot listen on {addr} (cluster.host/cluster.port): {source}")]
    Bind {
        /// The address (`host:port`).
        addr: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The node server (ractor_cluster's listener) could not start.
    #[error("cannot start the node server on {addr}: {source}")]
    Server {
        /// The address (`host:port`).
        addr: String,
        /// Why its actor did not start.
        #[source]
        source: ractor::SpawnErr,
    },
    /// A TLS file is missing or unusable.
    #[error("`{key}`: {path}: {detail}")]
    Tls {
        /// The config key that names the file.
        key: String,
        /// The file's path.
        path: String,
        /// Why it is unusable.
        detail: String,
    },
    /// The member lease could not be set up.
    #[error("member lease: {0}")]
    Lease(#[from] LeaseError),
    /// An actor of the node could not be started or has stopped.
    #[error("cluster node actor: {0}")]
    Actor(String),
    /// A dial to a node failed (names the node and why).
    #[error(transparent)]
    Dial(#[from] crate::transport::DialError),
    /// Could not reach or talk to a node.
    #[error("node {addr}: {detail}")]
    Connect {
        /// The node's address (`host:port`).
        addr: String,
        /// What failed: connecting, no answer, or its error.
        detail: String,
    },
    /// Refused at join: a setting that decides where entities live differs from a
    /// member's (every member must agree, or one entity could run under two shard leases).
    #[error(
        "refused to join the cluster: `{key}` is {mine} on this node but {theirs} on member {member}; every member must have the same"
    )]
    Refused {
        /// The setting that differs.
        key: String,
        /// Its value on this node.
        mine: String,
        /// Its value on the member.
        theirs: String,
        /// The member (`host:port`).
        member: String,
    },
    /// The split brain resolver downed this node (its side of a partition had to go) and
    /// `cluster.split-brain-resolver.when-down` is `"exit"`.
    #[error("downed by the split brain resolver: {why}")]
    Downed {
        /// Why this node's side had to go.
        why: String,
    },
    /// An operator's leave or down of a member was refused.
    #[error("{action} of member {member}: {refusal}")]
    Operator {
        /// `leave` or `down`.
        action: &'static str,
        /// The member (`host:port`).
        member: String,
        /// Why it was refused.
        refusal: OperatorRefusal,
    },
}

/// Why a node refused an operator's leave or down of a member.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum OperatorRefusal {
    /// The member is not in the view of the node asked (never was, or already removed).
    #[error("not a member in the view of {node}")]
    NotAMember {
        /// The node asked (`host:port`).
        node: String,
    },
    /// The request cannot be carried out now, and why (the member is already leaving, it
    /// is not connected to the node asked, its program does not take leave requests…).
    #[error("{0}")]
    Conflict(String),
}
