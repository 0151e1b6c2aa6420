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
//! <root>/<lease name>/remembered  persistent: the ids remembered with the lease
//!                                 (`LeaseStore::remember`), one persistent child each,
//!                                 named `id-` and the id percent-encoded (see
//!                                 [`remembered_node`]); written only in multis fenced by
//!                                 the grant, never expiring
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

    /// The parent of the nodes of the ids remembered with lease `name`.
    pub(crate) fn remembered(&self, name: &str) -> Result<String, StoreError> {
        Ok(format!("{}/{REMEMBERED}", self.lease(name)?))
    }
}

/// The child of a lease node under which its remembered ids live.
pub(crate) const REMEMBERED: &str = "remembered";

/// The node name of a remembered id: `id-` and the id's UTF-8 bytes, each byte other than
/// an ASCII letter, digit, `-` or `_` written `%XX` (upper-case hex). Any id becomes a valid
/// path segment (no `/`, never `.` or `..`, never empty, no character ZooKeeper refuses), and
/// [`remembered_id`] gives it back.
pub(crate) fn remembered_node(id: &str) -> String {
    let mut node = String::with_capacity(id.len() + 3);
    node.push_str("id-");
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            node.push(char::from(b));
        } else {
            node.push_str(&format!("%{b:02X}"));
        }
    }
    node
}

/// The id of a node named by [`remembered_node`]; `None` for any other name.
pub(crate) fn remembered_id(node: &str) -> Option<String> {
    let encoded = node.strip_prefix("id-")?.as_bytes();
    let mut bytes = Vec::with_capacity(encoded.len());
    let mut i = 0;
    while i < encoded.len() {
        if encoded[i] == b'%' {
            let hex = std::str::from_utf8(encoded.get(i + 1..i + 3)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            bytes.push(encoded[i]);
            i += 1;
        }
    }
    String::from_utf8(bytes).ok()
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

#[cfg(test)]
mod remembered_tests {
    use super::*;

    #[test]
    fn remembered_ids_round_trip_through_valid_node_names() {
        for id in [
            "",
            ".",
            "..",
            "a/b",
            "%",
            "%2F",
            "id-",
            "ünï ✓",
            "\u{7f}",
            "plain-id_9",
        ] {
            let node = remembered_node(id);
            assert!(node.starts_with("id-") && !node.contains('/'), "{node}");
            assert!(
                node.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_%".contains(&b)),
                "{node}"
            );
            assert_eq!(remembered_id(&node).as_deref(), Some(id), "{node}");
        }
        assert_eq!(remembered_node("a/b"), "id-a%2Fb");
        assert_eq!(remembered_id("holder"), None);
        assert_eq!(remembered_id("id-%2"), None);
        assert_eq!(remembered_id("id-%FF"), None, "not UTF-8");
    }
}
