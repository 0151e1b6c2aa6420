//! Where the store keeps what, under the section's key prefix.
//!
//! - `<prefix>leases/<name>`: the holder key of lease `name`, attached to the holder's
//!   session; its value is a [`GrantValue`], its create revision the fencing token.
//! - `<prefix>sessions/<session id in hex>`: the heartbeat key of one session (an etcd
//!   lease), attached to it and rewritten by every renewal. Its mod revision tells a
//!   contender that the holder is still renewing (see [`crate::clock`]).
//! - `<prefix>waiters/<name length>/<name>/<session>/<instance>`: one fair acquire waiting
//!   in line, attached to the waiter's session; the line is ordered by create revision.
//! - `<prefix>requests/<token in hex>`: the pending preemption request on the grant with
//!   that token (tokens are create revisions, unique across all keys), a
//!   [`RequestValue`] attached to the holder's session, so it goes with the grant: with
//!   its session, or deleted in the same transaction as the holder key.
//! - `<prefix>remembered/<name length>/<name>/<id>`: one id remembered with lease `name`
//!   (`LeaseStore::remember`), attached to no session: it never expires. Written only in
//!   transactions guarded by the grant's holder key.

use serde::{Deserialize, Serialize};
use tenure_lease::{PreemptionRequest, StoreError};

/// Key names of one store (one key prefix).
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    prefix: String,
}

impl Layout {
    pub(crate) fn new(prefix: &str) -> Self {
        Layout {
            prefix: prefix.to_string(),
        }
    }

    /// Prefix of every holder key.
    pub(crate) fn leases(&self) -> String {
        format!("{}leases/", self.prefix)
    }

    /// The holder key of lease `name`.
    pub(crate) fn lease(&self, name: &str) -> String {
        format!("{}leases/{name}", self.prefix)
    }

    /// Prefix of every heartbeat key.
    pub(crate) fn sessions(&self) -> String {
        format!("{}sessions/", self.prefix)
    }

    /// The heartbeat key of session `id`.
    pub(crate) fn session(&self, id: i64) -> String {
        format!("{}sessions/{id:016x}", self.prefix)
    }

    /// Prefix of the waiter keys of lease `name`. The name's length goes first, so that
    /// the waiters of `a` and of `a/b` never share a prefix.
    pub(crate) fn waiters(&self, name: &str) -> String {
        format!("{}waiters/{}/{name}/", self.prefix, name.len())
    }

    /// The waiter key of one fair acquire of `name` by `instance` in session `session`.
    pub(crate) fn waiter(&self, name: &str, session: i64, instance: &str) -> String {
        format!("{}{session:016x}/{instance}", self.waiters(name))
    }

    /// Prefix of the keys of the ids remembered with lease `name`. The name's length goes
    /// first, so that the ids of `a` and of `a/b` never share a prefix.
    pub(crate) fn remembered(&self, name: &str) -> String {
        format!("{}remembered/{}/{name}/", self.prefix, name.len())
    }

    /// Prefix of every preemption request key.
    pub(crate) fn requests(&self) -> String {
        format!("{}requests/", self.prefix)
    }

    /// The preemption request key of the grant with token `token`.
    pub(crate) fn request(&self, token: i64) -> String {
        format!("{}requests/{token:016x}", self.prefix)
    }

    /// The grant token of a request key, if it is one.
    pub(crate) fn token_of(&self, key: &[u8]) -> Option<i64> {
        let hex = std::str::from_utf8(key)
            .ok()?
            .strip_prefix(self.requests().as_str())?;
        u64::from_str_radix(hex, 16).ok().map(|t| t as i64)
    }

    /// The lease name of a holder key, if it is one.
    pub(crate) fn name_of<'k>(&self, key: &'k [u8]) -> Option<&'k str> {
        std::str::from_utf8(key)
            .ok()?
            .strip_prefix(self.leases().as_str())
    }
}

/// The value of a holder key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct GrantValue {
    pub owner: String,
    pub instance: String,
    /// The time-to-live the holder was last given, in milliseconds: a contender that has
    /// seen the grant and its session's heartbeat unchanged for this long may take over.
    pub ttl_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The grant's priority.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: u64,
    /// The holder's cleanup timeout, in milliseconds.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cleanup_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The value of a request key: the request, and since when it has been forceful.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RequestValue {
    #[serde(flatten)]
    pub request: PreemptionRequest,
    /// For a forceful request that replaced (or moved) a forceful one: the revision since
    /// which the grant has had a forceful request without a break. `None`: since this
    /// key's mod revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forced_since: Option<i64>,
}

impl RequestValue {
    pub(crate) fn new(request: &PreemptionRequest, forced_since: Option<i64>) -> Self {
        RequestValue {
            request: request.clone(),
            forced_since: forced_since.filter(|_| request.forceful),
        }
    }

    /// The revision since which a forceful request has been pending on the grant without
    /// a break, `mod_revision` being this request key's.
    pub(crate) fn forced_at(&self, mod_revision: i64) -> Option<i64> {
        self.request
            .forceful
            .then(|| self.forced_since.unwrap_or(mod_revision))
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a RequestValue always serialises")
    }

    pub(crate) fn decode(key: &[u8], bytes: &[u8]) -> Result<Self, StoreError> {
        serde_json::from_slice(bytes).map_err(|e| {
            StoreError::backend(
                "etcd",
                format!(
                    "key {} does not hold a Tenure preemption request: {e}",
                    String::from_utf8_lossy(key)
                ),
            )
        })
    }
}

impl GrantValue {
    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a GrantValue always serialises")
    }

    pub(crate) fn decode(key: &[u8], bytes: &[u8]) -> Result<Self, StoreError> {
        serde_json::from_slice(bytes).map_err(|e| {
            StoreError::backend(
                "etcd",
                format!(
                    "key {} does not hold a Tenure grant: {e}",
                    String::from_utf8_lossy(key)
                ),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_names() {
        let l = Layout::new("/t/");
        assert_eq!(l.lease("a/b"), "/t/leases/a/b");
        assert_eq!(l.name_of(b"/t/leases/a/b"), Some("a/b"));
        assert_eq!(l.name_of(b"/t/sessions/1"), None);
        assert_eq!(l.session(255), "/t/sessions/00000000000000ff");
        assert!(!l.waiter("a/b", 1, "i").starts_with(&l.waiters("a")));
        assert!(l.waiter("a", 1, "i").starts_with(&l.waiters("a")));
        assert_eq!(l.token_of(l.request(4242).as_bytes()), Some(4242));
        assert_eq!(l.token_of(l.lease("x").as_bytes()), None);
    }

    #[test]
    fn a_forceful_span_starts_at_the_write_or_carries_over() {
        let ask = |forceful| PreemptionRequest {
            by: "b".into(),
            forceful,
            ..PreemptionRequest::default()
        };
        assert_eq!(RequestValue::new(&ask(true), None).forced_at(42), Some(42));
        assert_eq!(
            RequestValue::new(&ask(true), Some(7)).forced_at(42),
            Some(7)
        );
        // A non-forceful request ends the span, whatever it replaced.
        let plain = RequestValue::new(&ask(false), Some(7));
        assert_eq!((plain.forced_since, plain.forced_at(42)), (None, None));
        let v = RequestValue::new(&ask(true), Some(7));
        assert_eq!(RequestValue::decode(b"k", &v.encode()).unwrap(), v);
    }

    #[test]
    fn values_round_trip_and_garbage_is_an_error() {
        let v = GrantValue {
            owner: "o".into(),
            instance: "i".into(),
            ttl_ms: 1500,
            note: None,
            priority: 0,
            cleanup_ms: 0,
        };
        assert_eq!(GrantValue::decode(b"k", &v.encode()).unwrap(), v);
        let err = GrantValue::decode(b"/t/leases/x", b"nope").unwrap_err();
        assert!(err.to_string().contains("/t/leases/x"), "{err}");
    }
}
