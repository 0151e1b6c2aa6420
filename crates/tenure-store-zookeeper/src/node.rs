//! The node layout under the root, and what a holder node holds.
//!
//! ```text
//! <root>                          persistent: its data *version* counts request writes
//!                                 (each sets its data in the multi that writes a holder
//!                                 node's request; see `pending`)
//! <root>/<lease name>             persistent: the lease's node; its data *version* counts
//!                                 grants (every grant sets its data in the same multi that
//!                                 creates the holder node), so "no grant since mine" is a
//!                                 version check
//! <root>/<lease name>/holder      ephemeral, owned by the holder's session: the grant, its
//!                                 priority and its pending preemption request (so the
//!                                 request lives and dies with the grant)
//! <root>/<lease name>/wait-<seq>  ephemeral sequential: fair waiters, in arrival order
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenure_lease::{FencingToken, LeaseRecord, PreemptionRequest, StoreError};

use crate::error::backend;

/// The child of a lease node that is the grant.
pub(crate) const HOLDER: &str = "holder";
/// Prefix of fair waiters' nodes (ephemeral sequential).
pub(crate) const WAITER: &str = "wait-";

/// Paths of one store root.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    root: String,
}

impl Layout {
    /// `root` is an absolute path without a trailing slash (checked by the options).
    pub(crate) fn new(root: String) -> Self {
        Layout { root }
    }

    pub(crate) fn root(&self) -> &str {
        &self.root
    }

    /// The lease node of `name`. Names are sanitised to the store's name rules (no `/`),
    /// but `.` and `..` are not valid path segments.
    pub(crate) fn lease(&self, name: &str) -> Result<String, StoreError> {
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(backend(format!(
                "lease name {name:?} cannot be a ZooKeeper path segment"
            )));
        }
        Ok(format!("{}/{name}", self.root))
    }

    pub(crate) fn holder(&self, name: &str) -> Result<String, StoreError> {
        Ok(format!("{}/{HOLDER}", self.lease(name)?))
    }
}

/// The data of a holder node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct GrantData {
    pub owner: String,
    pub instance: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The ttl asked for, in milliseconds (shown as the expiry of other clients' grants).
    pub ttl_ms: u64,
    /// The grant's priority.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: u64,
    /// The holder's cleanup timeout, in milliseconds.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cleanup_ms: u64,
    /// The pending preemption request, written by the requester (a version-checked
    /// `setData`, which keeps the node's czxid and so the token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<PreemptionRequest>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Milliseconds of `d`, saturating.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl GrantData {
    /// The data of a new grant for `req`.
    pub(crate) fn new(req: &tenure_lease::AcquireRequest) -> Self {
        GrantData {
            owner: req.owner.clone(),
            instance: req.instance.clone(),
            note: req.note.clone(),
            ttl_ms: millis(req.ttl),
            priority: req.priority,
            cleanup_ms: millis(req.cleanup_timeout),
            request: None,
        }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("GrantData serialises")
    }

    pub(crate) fn decode(path: &str, data: &[u8]) -> Result<Self, StoreError> {
        serde_json::from_slice(data)
            .map_err(|e| backend(format!("holder node {path} has unreadable data: {e}")))
    }

    /// The record of this grant. `expires_in` is the time left on this client's expiry when
    /// it made the grant, else the grant's ttl (an upper bound as seen from another client).
    pub(crate) fn record(
        self,
        name: &str,
        token: FencingToken,
        data_version: i32,
        expires_in: Option<Duration>,
    ) -> LeaseRecord {
        LeaseRecord {
            name: name.to_string(),
            token,
            expires_in: expires_in.unwrap_or(Duration::from_millis(self.ttl_ms)),
            version: u64::try_from(data_version).unwrap_or(0) + 1,
            owner: self.owner,
            instance: self.instance,
            note: self.note,
            priority: self.priority,
            cleanup_timeout: Duration::from_millis(self.cleanup_ms),
            request: self.request,
        }
    }
}

/// A fencing token from a zxid (always positive for created nodes).
pub(crate) fn token(zxid: i64) -> FencingToken {
    FencingToken::new(u64::try_from(zxid).unwrap_or(0))
}
