//! Typed errors of the cluster layer; each names what was wrong.

use tenure_lease::{ConfigError, LeaseError};

/// Why a node could not start, or a cluster operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// An address in configuration or on the command line is malformed.
    #[error("`{key}`: invalid address {value:?}: {detail}")]
    Address {
        key: String,
        value: String,
        detail: String,
    },
    /// The node could not listen on its address (in use, not local, no permission).
    #[error("cannot listen on {addr} (cluster.host/cluster.port): {detail}")]
    Bind { addr: String, detail: String },
    /// A TLS file is missing or unusable.
    #[error("`{key}`: {path}: {detail}")]
    Tls {
        key: String,
        path: String,
        detail: String,
    },
    /// The member lease could not be set up.
    #[error("member lease: {0}")]
    Lease(#[from] LeaseError),
    /// An actor of the node could not be started or has stopped.
    #[error("cluster node actor: {0}")]
    Actor(String),
    /// The history file cannot be opened for appending.
    #[error("history file {path}: {detail}")]
    History { path: String, detail: String },
    /// Could not reach or talk to a node.
    #[error("node {addr}: {detail}")]
    Connect { addr: String, detail: String },
    /// Refused at join: a setting that decides where entities live differs from a
    /// member's (every member must agree, or one entity could run under two shard leases).
    #[error(
        "refused to join the cluster: `{key}` is {mine} on this node but {theirs} on member {member}; every member must have the same"
    )]
    Refused {
        key: String,
        mine: String,
        theirs: String,
        member: String,
    },
    /// The split brain resolver downed this node (its side of a partition had to go) and
    /// `cluster.split-brain-resolver.when-down` is `"exit"`.
    #[error("downed by the split brain resolver: {why}")]
    Downed { why: String },
    /// An operator's leave or down of a member was refused.
    #[error("{action} of member {member}: {refusal}")]
    Operator {
        /// `leave` or `down`.
        action: &'static str,
        member: String,
        refusal: OperatorRefusal,
    },
}

/// Why a node refused an operator's leave or down of a member.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum OperatorRefusal {
    /// The member is not in the view of the node asked (never was, or already removed).
    #[error("not a member in the view of {node}")]
    NotAMember { node: String },
    /// The request cannot be carried out now, and why (the member is already leaving, it
    /// is not connected to the node asked, its program does not take leave requests…).
    #[error("{0}")]
    Conflict(String),
}
