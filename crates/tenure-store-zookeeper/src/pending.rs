//! What a renewal knows of the pending preemption requests on its owner's grants, and why
//! it need not read the holder nodes again while the root's data version stays the same.
//!
//! **The count.** Every write of a holder node's `request` (a request recorded, replaced
//! or withdrawn) is one `multi` that also sets the root node's data (unversioned, empty):
//! the root's data version counts request writes, and moves in the same transaction as
//! the request it counts. Nothing else changes a holder node's request: a grant creates
//! its node without one, and a reentrant acquire rewrites the data with a version check,
//! keeping the request it read. So the store's clients need write permission on the root
//! node (a request without it fails, naming the root, and is not recorded).
//!
//! **The renewal.** Each owner session keeps a [`PendingRequests`]: the request of each
//! grant `(name, token)` as last read, and the root version `v` read *before* those holder
//! nodes, in the same session. A renewal sends `sync`, `getEphemerals`, `exists(root)` and
//! reads of the holder nodes it has no entry for, pipelined in one round trip. If the root
//! version is still `v`, the entries are what the holder nodes hold now; otherwise it
//! reads the other holder nodes too, in a second round trip, and keeps their requests with
//! the new version.
//!
//! Why an entry is current when the version is `v` again: it was read after the server
//! had committed version `v`, and this renewal's `exists(root)` saw `v` still; any request
//! write in between would have moved the version in the same transaction. A grant made
//! after the read has no entry (its token is new), so it is read. Versions only grow (an
//! `i32` that would take 2³² request writes between two renewals to come back), so an entry
//! is never taken for a later version than it was read at. Every entry kept was read after
//! the version kept with it: a renewal that read only some holder nodes adds them only if
//! it saw the kept version; one that saw another version (concurrent renewals may finish
//! out of order) read all it renews and replaces the entries wholesale. The three
//! requests of the first round trip are sent when called, in this order, before the holder
//! reads, and ZooKeeper answers one session's requests in order.
//!
//! **Safety does not rest on it.** A forcefully preempted grant is refused by the first
//! renewal processed after the request (the request moved the version), so its local
//! expiry is not extended from then. Even a holder that missed the request (a client
//! writing requests without the count) could not overlap with the requester: contenders
//! are granted only once the holder node is gone. Such a holder would keep its grant until
//! it released, a liveness loss only.
//!
//! **Cost.** With no request written since the last renewal, a renewal is the old
//! `sync` + `getEphemerals` and one `exists`, whatever the number of leases. A request
//! anywhere under the root makes every owner's next renewal read its holder nodes once, in
//! a second round trip (a count per owner session would spare the other owners that, at
//! the price of nodes that outlive their sessions; a watch on the root could spare the
//! `exists`, at the price of trusting the client library's event order across reconnects).

use std::collections::HashMap;

use tenure_lease::{FencingToken, HeldLease, PreemptionRequest};

/// The requests on one session's grants, as read at a root version.
#[derive(Debug, Default)]
pub(crate) struct PendingRequests {
    /// The root's data version the entries were read at (`None`: nothing read yet).
    version: Option<i32>,
    /// Lease name → (token, its pending request).
    entries: HashMap<String, (FencingToken, Option<PreemptionRequest>)>,
}

/// A lease's known request, if its entry is for `token`.
pub(crate) type Known = Option<Option<PreemptionRequest>>;

impl PendingRequests {
    /// The version the entries hold at, and for each lease its request if known.
    pub(crate) fn lookup(&self, leases: &[HeldLease]) -> (Option<i32>, Vec<Known>) {
        let known = leases
            .iter()
            .map(|l| {
                self.entries
                    .get(&l.name)
                    .filter(|(t, _)| *t == l.token)
                    .map(|(_, r)| r.clone())
            })
            .collect();
        (self.version, known)
    }

    /// Adds requests read after seeing root version `version`. `complete`: `read` covers
    /// every entry worth keeping (the others are dropped), so it may move the version;
    /// otherwise they are added only if the entries are for `version` too.
    pub(crate) fn update(
        &mut self,
        version: i32,
        read: impl IntoIterator<Item = (String, FencingToken, Option<PreemptionRequest>)>,
        complete: bool,
    ) {
        if complete {
            self.version = Some(version);
            self.entries.clear();
        } else if self.version != Some(version) {
            return;
        }
        for (name, token, request) in read {
            self.entries.insert(name, (token, request));
        }
    }

    /// Drops the entry of the grant `(name, token)` (released or expired).
    pub(crate) fn forget(&mut self, name: &str, token: FencingToken) {
        if self.entries.get(name).is_some_and(|(t, _)| *t == token) {
            self.entries.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(by: &str) -> PreemptionRequest {
        PreemptionRequest {
            by: by.into(),
            ..PreemptionRequest::default()
        }
    }

    fn t(n: u64) -> FencingToken {
        FencingToken::new(n)
    }

    fn held(leases: &[(&str, u64)]) -> Vec<HeldLease> {
        leases
            .iter()
            .map(|(name, token)| HeldLease {
                name: (*name).into(),
                token: FencingToken::new(*token),
            })
            .collect()
    }

    #[test]
    fn entries_are_known_only_for_their_token() {
        let mut p = PendingRequests::default();
        p.update(
            3,
            [
                ("a".into(), t(7), Some(request("x"))),
                ("b".into(), t(8), None),
            ],
            true,
        );
        let (v, known) = p.lookup(&held(&[("a", 7), ("a", 9), ("b", 8)]));
        assert_eq!(v, Some(3));
        assert_eq!(known, vec![Some(Some(request("x"))), None, Some(None)]);
    }

    #[test]
    fn reads_at_another_version_are_not_mixed_in() {
        let mut p = PendingRequests::default();
        p.update(3, [("a".into(), t(7), None)], true);
        // Read while the root was at version 2 (an older view): not added.
        p.update(2, [("b".into(), t(8), Some(request("x")))], false);
        assert_eq!(p.lookup(&held(&[("b", 8)])).1, vec![None]);
        p.update(3, [("b".into(), t(8), Some(request("x")))], false);
        assert_eq!(
            p.lookup(&held(&[("b", 8)])).1,
            vec![Some(Some(request("x")))]
        );
        // A complete read at a new version drops what it did not read.
        p.update(4, [("a".into(), t(7), None)], true);
        assert_eq!(p.lookup(&held(&[("b", 8)])), (Some(4), vec![None]));
        p.forget("a", t(7));
        assert_eq!(p.lookup(&held(&[("a", 7)])).1, vec![None]);
    }
}
