//! The node layout under the root, and what a holder node holds.
//!
//! A root has one of two layouts, fixed when the root is created and told by its ACL
//! ([`Layout::detect`]):
//!
//! - **families** (roots created by this version without `auth`): a lease whose name has a
//!   *family* ([`family`]: the shortest prefix of the name that ends with one of
//!   [`FAMILY_MARKERS`], e.g. `tenure-member-` for `tenure-member-10.0.0.1:2552`) has its
//!   lease node under the family's parent, `<root>/<family>/<lease name>`; a lease without
//!   a family has it at `<root>/<lease name>`. Listing one family reads that parent's
//!   children only.
//! - **flat** (roots created by earlier versions, or with `auth`): every lease node is
//!   `<root>/<lease name>`.
//!
//! A client of an earlier version knows only the flat layout. On a families root it must
//! never grant a lease at its flat path while this version grants it under its family: the
//! root's and every family parent's ACL grant `CREATE` only to [`GATE_ID`], an identity
//! the owner sessions of this version add on such a root (without `auth`), and earlier
//! versions never had. So
//! an earlier client creates nothing there (its acquires fail with `NoAuth`), and the
//! lease nodes it can reach, those of leases without a family, are at the same path in
//! both layouts. A flat root stays flat: this version uses it as earlier ones do.
//!
//! ```text
//! <root>                          persistent: its data *version* counts request writes
//!                                 (each sets its data in the multi that writes a holder
//!                                 node's request; see `pending`)
//! [<root>/<family>]               persistent, families layout only: the parent of the
//!                                 family's lease nodes, created by the family's first grant
//! <lease node>                    persistent: `<root>[/<family>]/<lease name>`; its data
//!                                 *version* counts grants (every grant sets its data in
//!                                 the same multi that creates the holder node), so "no
//!                                 grant since mine" is a version check
//! <lease node>/holder             ephemeral, owned by the holder's session: the grant, its
//!                                 priority and its pending preemption request (so the
//!                                 request lives and dies with the grant)
//! <lease node>/wait-<seq>         ephemeral sequential: fair waiters, in arrival order
//! <lease node>/remembered         persistent: the ids remembered with the lease
//!                                 (`LeaseStore::remember`), one persistent child each,
//!                                 named `id-` and the id percent-encoded (see
//!                                 [`remembered_node`]); written only in multis fenced by
//!                                 the grant, never expiring
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenure_lease::{FencingToken, LeaseRecord, PreemptionRequest, StoreError};
use zookeeper_client as zk;

use crate::error::backend;

/// The child of a lease node that is the grant.
pub(crate) const HOLDER: &str = "holder";
/// Prefix of fair waiters' nodes (ephemeral sequential).
pub(crate) const WAITER: &str = "wait-";

/// The markers that end a lease name's family ([`family`]): the cluster's member leases
/// (`<system>-member-<host:port>`) and the shard leases (`<system>-shard-<type>-<id>`).
/// Part of the families layout: clients of one root must agree on them, so another set is
/// another layout (with another gate identity), never a setting.
pub(crate) const FAMILY_MARKERS: [&str; 2] = ["-member-", "-shard-"];

/// The credentials an owner session adds on a families root (without `auth`):
/// `user:password`.
/// Not a secret: it tells the server which layout the client knows, nothing more.
pub(crate) const GATE_CREDENTIALS: &[u8] = b"tenure-layout-families-1:tenure";
/// The digest id of [`GATE_CREDENTIALS`] (`user:base64(sha1(user:password))`): the only
/// identity with `CREATE` on a families root and its family parents.
pub(crate) const GATE_ID: &str = "tenure-layout-families-1://poyjk3CFocb3AhCKmo+vt5mKE=";

/// The family of lease `name`: its shortest prefix ending with one of [`FAMILY_MARKERS`];
/// `None` when no marker occurs in it. Every name extending a prefix that has a family has
/// the same family, which is what lets a listing of such a prefix read one parent.
pub(crate) fn family(name: &str) -> Option<&str> {
    (1..=name.len())
        .filter(|&end| name.is_char_boundary(end))
        .find(|&end| FAMILY_MARKERS.iter().any(|m| name[..end].ends_with(m)))
        .map(|end| &name[..end])
}

/// The ACL of a families root and of its family parents: everything but `CREATE` for
/// anyone, `CREATE` for the gate identity only.
pub(crate) fn gated_acls() -> zk::Acls<'static> {
    static ACLS: std::sync::LazyLock<[zk::Acl; 2]> = std::sync::LazyLock::new(|| {
        [
            zk::Acl::new(
                zk::Permission::READ
                    | zk::Permission::WRITE
                    | zk::Permission::DELETE
                    | zk::Permission::ADMIN,
                zk::AuthId::anyone(),
            ),
            zk::Acl::new(zk::Permission::CREATE, zk::AuthId::new("digest", GATE_ID)),
        ]
    });
    zk::Acls::new(&*ACLS)
}

/// Paths of one store root, in its layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    root: String,
    /// The families layout (else flat).
    families: bool,
}

impl Layout {
    /// The flat layout under `root`, an absolute path without a trailing slash (checked by
    /// the options).
    pub(crate) fn flat(root: String) -> Self {
        Layout {
            root,
            families: false,
        }
    }

    /// The families layout under `root`.
    pub(crate) fn families(root: String) -> Self {
        Layout {
            root,
            families: true,
        }
    }

    /// The layout a root with ACL `acls` has: families when the gate identity may create
    /// under it (only a root created with the families layout has that entry).
    pub(crate) fn detect(root: String, acls: &[zk::Acl]) -> Self {
        let gated = acls.iter().any(|a| {
            a.scheme() == "digest"
                && a.id() == GATE_ID
                && a.permission().has(zk::Permission::CREATE)
        });
        if gated {
            Layout::families(root)
        } else {
            Layout::flat(root)
        }
    }

    pub(crate) fn root(&self) -> &str {
        &self.root
    }

    /// Whether this is the families layout.
    pub(crate) fn has_families(&self) -> bool {
        self.families
    }

    /// The family of `name` in this layout: none in the flat one.
    pub(crate) fn family_of<'a>(&self, name: &'a str) -> Option<&'a str> {
        if self.families { family(name) } else { None }
    }

    /// The parent node of `family`'s lease nodes (families layout).
    pub(crate) fn family_parent(&self, family: &str) -> String {
        format!("{}/{family}", self.root)
    }

    /// The lease node of `name`. Names are sanitised to the store's name rules (no `/`),
    /// but `.` and `..` are not valid path segments.
    pub(crate) fn lease(&self, name: &str) -> Result<String, StoreError> {
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(backend(format!(
                "lease name {name:?} cannot be a ZooKeeper path segment"
            )));
        }
        Ok(match self.family_of(name) {
            Some(family) => format!("{}/{family}/{name}", self.root),
            None => format!("{}/{name}", self.root),
        })
    }

    pub(crate) fn holder(&self, name: &str) -> Result<String, StoreError> {
        Ok(format!("{}/{HOLDER}", self.lease(name)?))
    }

    /// The parent of the nodes of the ids remembered with lease `name`.
    pub(crate) fn remembered(&self, name: &str) -> Result<String, StoreError> {
        Ok(format!("{}/{REMEMBERED}", self.lease(name)?))
    }

    /// The lease name of a holder node's path in this layout; `None` for any other node
    /// (a holder node is the `holder` child of the lease node where this layout puts it).
    pub(crate) fn holder_name<'a>(&self, path: &'a str) -> Option<&'a str> {
        let rest = path
            .strip_prefix(self.root.as_str())?
            .strip_prefix('/')?
            .strip_suffix(HOLDER)?
            .strip_suffix('/')?;
        let name = rest.rsplit('/').next()?;
        (self.holder(name).ok()? == path).then_some(name)
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
mod family_tests {
    use super::*;

    #[test]
    fn a_family_ends_at_the_first_marker() {
        assert_eq!(
            family("tenure-member-10.0.0.1:2552"),
            Some("tenure-member-")
        );
        assert_eq!(family("my-app-member-node-3:2552"), Some("my-app-member-"));
        assert_eq!(family("s-member-a-shard-b"), Some("s-member-"));
        assert_eq!(family("s-shard-orders-7"), Some("s-shard-"));
        assert_eq!(family("s-member-"), Some("s-member-"));
        assert_eq!(family("s-member"), None);
        assert_eq!(family("s-join"), None);
        assert_eq!(family("ünï-member-x"), Some("ünï-member-"));
        // A prefix with a family gives every name extending it that family.
        for name in ["s-member-", "s-member-x", "s-member-x-shard-y"] {
            assert_eq!(family(name), family("s-member-"));
        }
        let families = Layout::families("/r".into());
        let flat = Layout::flat("/r".into());
        assert_eq!(
            families.lease("s-member-a:1").unwrap(),
            "/r/s-member-/s-member-a:1"
        );
        assert_eq!(families.lease("s-join").unwrap(), "/r/s-join");
        assert_eq!(flat.lease("s-member-a:1").unwrap(), "/r/s-member-a:1");
        assert!(families.lease("..").is_err());
    }
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
