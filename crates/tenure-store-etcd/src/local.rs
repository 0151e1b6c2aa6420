//! What one store client knows of the grants it wrote, and the keys on its sessions that
//! none of them accounts for.
//!
//! A session keeps every key attached to it alive, and a renewal writes the session's
//! heartbeat, which contenders read as "every key of this session is renewed". A key this
//! client no longer renews would therefore live as long as its owner renews anything else:
//! the key of an acquire whose answer was lost (past the caller's operation timeout), of a
//! release that failed, or of a grant whose holder gave it up without releasing it (its
//! belief lapsed). Such keys are **orphans**. A renewal lists the keys attached to its
//! session; the orphans among them are deleted in the same transaction as the session's
//! next heartbeat, each only if it is still attached to the session and was not written
//! since the listing (its mod revision is at most the listing's revision): an acquire of
//! this client that re-created or re-entered it meanwhile, and whose holder now believes
//! in it, keeps it. So an orphan is kept alive by at most the heartbeat it was found
//! after: it lapses at most one renewal interval past a ttl, like a grant whose holder
//! stopped renewing.
//!
//! A grant this client wrote is known here until it is released (a release forgets it
//! first: if the release fails, its key is an orphan), found not held, or not renewed for
//! its ttl (its holder has given it up by then: its local deadline comes earlier). An
//! acquire whose outcome is unknown does not forget the grant of its name (a timed-out
//! reentrant acquire must not end a grant its holder still renews): it marks it
//! *unverified*, and the next renewal of it reads the key to compare its create revision
//! (the token) before answering.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use tokio::time::Instant;

use crate::layout::{GrantValue, Layout};

/// How many orphans one heartbeat transaction deletes (etcd bounds operations per
/// transaction, 128 by default); the rest go with the following heartbeats.
const SWEEP_PER_HEARTBEAT: usize = 64;

/// A grant this client wrote: what renewals and releases check against.
#[derive(Debug, Clone)]
pub(crate) struct LocalGrant {
    pub(crate) owner: String,
    pub(crate) token: i64,
    pub(crate) session: i64,
    pub(crate) value: GrantValue,
    /// `false` after an acquire of the same name whose outcome is unknown: the key may have
    /// been replaced (a new create revision) by it; the next renewal reads it.
    pub(crate) verified: bool,
    /// When the last acquire or renewal that confirmed the grant was sent.
    pub(crate) confirmed: Instant,
}

impl LocalGrant {
    /// Not confirmed for a whole ttl: its holder's local deadline has passed, nobody renews
    /// it any more.
    fn abandoned(&self, now: Instant) -> bool {
        now >= self.confirmed + Duration::from_millis(self.value.ttl_ms)
    }

    /// Known, on `session`, and still renewed.
    fn keeps(&self, session: i64, now: Instant) -> bool {
        self.session == session && !self.abandoned(now)
    }
}

#[derive(Debug, Default)]
struct State {
    grants: HashMap<String, LocalGrant>,
    /// Acquires under way, by lease name: their keys are not orphans (yet).
    acquiring: HashMap<String, usize>,
    /// Orphans found by the last renewal of each session, deleted with its next heartbeat,
    /// and the revision of the listing that found them.
    orphans: HashMap<i64, (Vec<String>, i64)>,
}

/// The grants one client wrote, its acquires under way, and the orphans on its sessions.
#[derive(Debug, Default)]
pub(crate) struct Local {
    state: Mutex<State>,
}

impl Local {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn get(&self, name: &str) -> Option<LocalGrant> {
        self.lock().grants.get(name).cloned()
    }

    pub(crate) fn remember(&self, name: &str, grant: LocalGrant) {
        self.lock().grants.insert(name.to_string(), grant);
    }

    /// Forgets grant `token` of `name` (found not held).
    pub(crate) fn forget(&self, name: &str, token: i64) {
        let mut state = self.lock();
        if state.grants.get(name).is_some_and(|g| g.token == token) {
            state.grants.remove(name);
        }
    }

    /// Forgets every grant (the store's history went back: none of them can be trusted).
    pub(crate) fn forget_all(&self) {
        self.lock().grants.clear();
    }

    /// A renewal sent at `sent` confirmed grant `token` of `name` (and read its key, when
    /// it was unverified).
    pub(crate) fn confirm(&self, name: &str, token: i64, sent: Instant) {
        if let Some(g) = self.lock().grants.get_mut(name)
            && g.token == token
        {
            g.verified = true;
            g.confirmed = g.confirmed.max(sent);
        }
    }

    /// An acquire of `name` starts: until the guard settles or drops, the key of `name` on
    /// this client's sessions is no orphan; dropped unsettled, the grant of `name` (if any)
    /// is unverified.
    pub(crate) fn acquiring<'a>(&'a self, name: &'a str) -> Doubt<'a> {
        *self.lock().acquiring.entry(name.to_string()).or_default() += 1;
        Doubt {
            local: self,
            name,
            settled: false,
        }
    }

    /// Finds the orphans among `attached` (the keys attached to `session`, as a renewal
    /// listed them at `now`, at store revision `listed`), forgets the abandoned grants among
    /// them, and keeps the orphans for the session's next heartbeat.
    pub(crate) fn find_orphans<'k>(
        &self,
        layout: &Layout,
        (session, listed): (i64, i64),
        attached: impl Iterator<Item = &'k [u8]>,
        now: Instant,
    ) {
        let mut state = self.lock();
        let mut orphans = Vec::new();
        for key in attached {
            if is_orphan(&state, layout, session, key, now) {
                if let Some(name) = layout.name_of(key) {
                    state.grants.remove(name);
                }
                orphans.push(String::from_utf8_lossy(key).into_owned());
            }
        }
        state.orphans.retain(|s, _| *s == session);
        if orphans.is_empty() {
            state.orphans.remove(&session);
        } else {
            state.orphans.insert(session, (orphans, listed));
        }
    }

    /// The deletions of the orphans last found on `session` that are orphans still, for its
    /// heartbeat transaction: each deletes its key only if still attached to `session` and
    /// not written since it was listed.
    pub(crate) fn sweep(&self, layout: &Layout, session: i64, now: Instant) -> Vec<TxnOp> {
        let state = self.lock();
        let Some((orphans, listed)) = state.orphans.get(&session) else {
            return Vec::new();
        };
        orphans
            .iter()
            .filter(|key| is_orphan(&state, layout, session, key.as_bytes(), now))
            .take(SWEEP_PER_HEARTBEAT)
            .map(|key| {
                let unchanged = Compare::mod_revision(key.clone(), CompareOp::Less, listed + 1);
                TxnOp::txn(
                    Txn::new()
                        .when([
                            Compare::lease(key.clone(), CompareOp::Equal, session),
                            unchanged,
                        ])
                        .and_then([TxnOp::delete(key.clone(), None)]),
                )
            })
            .collect()
    }
}

/// Whether `key`, attached to `session`, is an orphan: a holder key of no grant this client
/// keeps on the session (and no acquire of it under way), or a preemption request key of
/// no such grant's token.
fn is_orphan(state: &State, layout: &Layout, session: i64, key: &[u8], now: Instant) -> bool {
    if let Some(name) = layout.name_of(key) {
        return !state.acquiring.contains_key(name)
            && !state
                .grants
                .get(name)
                .is_some_and(|g| g.keeps(session, now));
    }
    if let Some(token) = layout.token_of(key) {
        return !state
            .grants
            .values()
            .any(|g| g.token == token && g.keeps(session, now));
    }
    false
}

/// One acquire under way (see [`Local::acquiring`]).
pub(crate) struct Doubt<'a> {
    local: &'a Local,
    name: &'a str,
    settled: bool,
}

impl Doubt<'_> {
    /// The acquire ended with a grant, now remembered.
    pub(crate) fn settle(&mut self) {
        self.settled = true;
    }
}

impl Drop for Doubt<'_> {
    fn drop(&mut self) {
        let mut state = self.local.lock();
        if let Some(n) = state.acquiring.get_mut(self.name) {
            *n -= 1;
            if *n == 0 {
                state.acquiring.remove(self.name);
            }
        }
        if !self.settled
            && let Some(g) = state.grants.get_mut(self.name)
        {
            g.verified = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(token: i64, session: i64, confirmed: Instant) -> LocalGrant {
        LocalGrant {
            owner: "a".into(),
            token,
            session,
            value: GrantValue {
                owner: "a".into(),
                instance: "i".into(),
                ttl_ms: 1000,
                note: None,
                priority: 0,
                cleanup_ms: 0,
            },
            verified: true,
            confirmed,
        }
    }

    fn keys(list: &[&str]) -> Vec<Vec<u8>> {
        list.iter().map(|k| k.as_bytes().to_vec()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn orphans_are_keys_no_kept_grant_or_acquire_accounts_for() {
        let layout = Layout::new("/p/");
        let local = Local::default();
        let now = Instant::now();
        local.remember("kept", grant(7, 1, now));
        local.remember("elsewhere", grant(8, 2, now));
        let attached = keys(&[
            "/p/leases/kept",
            "/p/requests/0000000000000007",
            "/p/leases/lost-answer",
            "/p/requests/0000000000000009",
            "/p/leases/elsewhere",
            "/p/sessions/0000000000000001",
            "/p/leases/in-flight",
        ]);
        let doubt = local.acquiring("in-flight");
        local.find_orphans(&layout, (1, 100), attached.iter().map(Vec::as_slice), now);
        assert_eq!(local.sweep(&layout, 1, now).len(), 3);
        assert!(local.sweep(&layout, 2, now).is_empty());
        // Once the acquire under way ends without a grant, its key is an orphan too.
        drop(doubt);
        local.find_orphans(&layout, (1, 100), attached.iter().map(Vec::as_slice), now);
        assert_eq!(local.sweep(&layout, 1, now).len(), 4);
        // A grant remembered since (the same instance acquired again) is no orphan.
        local.remember("lost-answer", grant(10, 1, now));
        assert_eq!(local.sweep(&layout, 1, now).len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_grant_not_renewed_for_its_ttl_is_abandoned() {
        let layout = Layout::new("/p/");
        let local = Local::default();
        let start = Instant::now();
        local.remember("a", grant(7, 1, start));
        let attached = keys(&["/p/leases/a"]);
        local.find_orphans(&layout, (1, 100), attached.iter().map(Vec::as_slice), start);
        assert!(local.sweep(&layout, 1, start).is_empty());
        tokio::time::advance(Duration::from_millis(600)).await;
        local.confirm("a", 7, Instant::now());
        tokio::time::advance(Duration::from_millis(600)).await;
        let now = Instant::now();
        local.find_orphans(&layout, (1, 100), attached.iter().map(Vec::as_slice), now);
        assert!(
            local.sweep(&layout, 1, now).is_empty(),
            "renewed 600 ms ago"
        );
        tokio::time::advance(Duration::from_millis(400)).await;
        let now = Instant::now();
        local.find_orphans(&layout, (1, 100), attached.iter().map(Vec::as_slice), now);
        assert_eq!(local.sweep(&layout, 1, now).len(), 1);
        assert!(
            local.get("a").is_none(),
            "forgotten: renewals answer not held"
        );
    }

    #[test]
    fn an_unsettled_acquire_leaves_the_grant_unverified() {
        let local = Local::default();
        local.remember("a", grant(7, 1, Instant::now()));
        let mut ok = local.acquiring("a");
        ok.settle();
        drop(ok);
        assert!(local.get("a").unwrap().verified);
        drop(local.acquiring("a"));
        assert!(!local.get("a").unwrap().verified);
        local.confirm("a", 7, Instant::now());
        assert!(local.get("a").unwrap().verified);
    }
}
