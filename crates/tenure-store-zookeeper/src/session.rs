//! One ZooKeeper session per owner, the grants made on it, and their expiry.
//!
//! The server keeps a session alive as long as the client library's pings arrive, however
//! long ago the owner last renewed. The SPI's ttl is therefore applied here: a grant not
//! renewed within its ttl is deleted by this client ([`OwnerSession::reap`]) at `answer of
//! its last acquire/renewal + ttl`, which is never before the server processed that request
//! plus ttl, and after the holder's own deadline (`send instant + ttl - margin`, on the same
//! holder clock, which counts host suspend: [`HolderClock`]). The session timeout covers what this client cannot do: when the
//! process dies or is cut off, the server ends the session (and deletes its nodes) at the
//! earliest `session timeout` after the last request it saw from it.
//!
//! An acquire whose outcome is unknown (its answer came after the caller's operation
//! timeout, or the connection broke) may have created a holder node that no recorded grant
//! accounts for, and that the session would keep as long as the process lives. Each such
//! acquire leaves a *doubt* on its lease name: one ttl after the acquire ended, the reaper
//! deletes the name's holder node if it is an ephemeral of this session and still no
//! recorded grant's (a version check on the lease node makes sure no grant came since).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tenure_lease::{FencingToken, HeldLease, HolderClock};
use tokio::sync::Notify;
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::error::session_over;
use crate::node::Layout;
use crate::pending::PendingRequests;

/// A grant this client made.
#[derive(Debug, Clone)]
pub(crate) struct Grant {
    pub token: FencingToken,
    pub instance: String,
    /// Data version of the lease node set by the grant's multi: a later grant changes it.
    pub lease_version: i32,
    /// Data version of the holder node (reentrant acquires rewrite its data).
    pub holder_version: i32,
    /// When this client deletes the grant unless renewed (on the holder clock).
    pub expires_at: Instant,
    /// Deletion started: the grant counts as ended.
    pub ending: bool,
}

impl Grant {
    pub(crate) fn live(&self, now: Instant) -> bool {
        !self.ending && self.expires_at > now
    }
}

/// Acquires of one session whose outcome is unknown, and those under way.
#[derive(Debug, Default)]
struct Doubts {
    /// When the reaper deletes the holder node of each lease name, if it is an ephemeral of
    /// this session that no recorded grant accounts for.
    due: HashMap<String, Instant>,
    /// Acquires under way, by lease name: their nodes are not reaped meanwhile.
    acquiring: HashMap<String, usize>,
}

/// The session of one owner and the grants made on it, by lease name.
pub(crate) struct OwnerSession {
    pub client: zk::Client,
    /// The clock of every expiry and due time here.
    pub clock: HolderClock,
    /// The negotiated session timeout.
    pub timeout: Duration,
    grants: Mutex<HashMap<String, Grant>>,
    /// When the reaper wakes next (it sleeps at most a second).
    reaper_due: Mutex<Option<Instant>>,
    changed: Arc<Notify>,
    layout: Layout,
    /// The pending requests on these grants as last read (see [`crate::pending`]).
    pending: Mutex<PendingRequests>,
    doubts: Mutex<Doubts>,
}

impl std::fmt::Debug for OwnerSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnerSession")
            .field("session", &self.client.session_id())
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl OwnerSession {
    /// Wraps a connected client and starts its reaper (which ends with the session);
    /// expiries are measured on `clock`.
    pub(crate) fn start(client: zk::Client, layout: Layout, clock: HolderClock) -> Arc<Self> {
        let session = Arc::new(OwnerSession {
            timeout: client.session_timeout(),
            client,
            clock,
            grants: Mutex::new(HashMap::new()),
            reaper_due: Mutex::new(None),
            changed: Arc::new(Notify::new()),
            layout,
            pending: Mutex::new(PendingRequests::default()),
            doubts: Mutex::default(),
        });
        tokio::spawn(reap(Arc::downgrade(&session), session.changed.clone()));
        session
    }

    pub(crate) fn session_id(&self) -> i64 {
        self.client.session_id().0
    }

    /// Whether the session can still serve requests.
    pub(crate) fn usable(&self) -> bool {
        !matches!(
            self.client.state(),
            zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Grant>> {
        self.grants.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn grant(&self, name: &str) -> Option<Grant> {
        self.lock().get(name).cloned()
    }

    /// Records a grant (new or refreshed); wakes the reaper only if this grant expires
    /// before the reaper would wake anyway.
    pub(crate) fn record(&self, name: &str, grant: Grant) {
        let expires_at = grant.expires_at;
        let mut grants = self.lock();
        grants.insert(name.to_string(), grant);
        // Read under the grants lock, which the reaper holds while it scans and sets `due`.
        let due = *self.reaper_due.lock().unwrap_or_else(|e| e.into_inner());
        drop(grants);
        if due.is_none_or(|d| expires_at < d) {
            self.changed.notify_one();
        }
    }

    fn doubts(&self) -> std::sync::MutexGuard<'_, Doubts> {
        self.doubts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An acquire of `name` with time-to-live `ttl` starts on this session: settle the
    /// guard when its outcome is known; dropped unsettled, it leaves a doubt on `name`.
    pub(crate) fn acquiring<'a>(&'a self, name: &'a str, ttl: Duration) -> AcquireGuard<'a> {
        *self.doubts().acquiring.entry(name.to_string()).or_default() += 1;
        AcquireGuard {
            session: self,
            name,
            ttl,
            settled: false,
        }
    }

    /// Reaps a holder node of `name` left by an acquire of unknown outcome: deletes it if it
    /// is an ephemeral of this session that no recorded grant accounts for, unless the lease
    /// node changed since it was read. `Ok(true)`: nothing is left to reap; `Ok(false)`:
    /// something changed meanwhile, look again later.
    async fn reap_doubt(&self, name: &str) -> Result<bool, zk::Error> {
        let (lease, holder) = self.paths(name)?;
        let mut read = self.client.new_multi_reader();
        read.add_get_data(&lease)?;
        read.add_get_data(&holder)?;
        let answer = read.commit().await?;
        let (
            Some(zk::MultiReadResult::Data {
                stat: lease_stat, ..
            }),
            Some(zk::MultiReadResult::Data {
                stat: holder_stat, ..
            }),
        ) = (answer.first(), answer.get(1))
        else {
            return Ok(true);
        };
        let recorded = self
            .grant(name)
            .is_some_and(|g| g.token == crate::node::token(holder_stat.czxid));
        if holder_stat.ephemeral_owner != self.session_id() || recorded {
            return Ok(true);
        }
        tracing::info!(lease = %name, "deleting a holder node left by an acquire whose outcome was unknown");
        let deleted = self
            .delete_holder(name, lease_stat.version, Some(holder_stat.version))
            .await?;
        Ok(deleted)
    }

    pub(crate) fn forget(&self, name: &str, token: FencingToken) {
        let mut grants = self.lock();
        if grants.get(name).is_some_and(|g| g.token == token) {
            grants.remove(name);
        }
        drop(grants);
        self.pending().forget(name, token);
    }

    pub(crate) fn pending(&self) -> std::sync::MutexGuard<'_, PendingRequests> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Which of `leases` are live grants of this session whose holder node the server
    /// listed as an ephemeral of it (`alive`: the names of those leases); those not
    /// `forced` (a forceful preemption request pending) are extended to `now + ttl`. One
    /// flag per lease: held.
    pub(crate) fn extend(
        &self,
        leases: &[HeldLease],
        alive: &HashSet<&str>,
        forced: &[bool],
        ttl: Duration,
    ) -> Vec<bool> {
        let now = self.clock.now();
        let mut grants = self.lock();
        // Expiries only move later: the reaper need not wake early.
        leases
            .iter()
            .zip(forced)
            .map(|(lease, forced)| match grants.get_mut(&lease.name) {
                Some(g)
                    if g.token == lease.token
                        && g.live(now)
                        && alive.contains(lease.name.as_str()) =>
                {
                    if !forced {
                        g.expires_at = g.expires_at.max(now + ttl);
                    }
                    true
                }
                _ => false,
            })
            .collect()
    }

    /// Deletes the holder node of `name` if the lease node's version still is the grant's
    /// (no later grant): `Ok(true)` deleted, `Ok(false)` the grant had ended already.
    pub(crate) async fn delete_grant(
        &self,
        name: &str,
        lease_version: i32,
    ) -> Result<bool, zk::Error> {
        self.delete_holder(name, lease_version, None).await
    }

    /// The lease node and holder node paths of `name`.
    fn paths(&self, name: &str) -> Result<(String, String), zk::Error> {
        let lease = self
            .layout
            .lease(name)
            .map_err(|_| zk::Error::BadArguments(&"invalid lease name"))?;
        let holder = format!("{lease}/{}", crate::node::HOLDER);
        Ok((lease, holder))
    }

    /// Deletes the holder node of `name` (at `holder_version`, if given) if the lease
    /// node's version is still `lease_version`: `Ok(false)` when either changed or is gone.
    async fn delete_holder(
        &self,
        name: &str,
        lease_version: i32,
        holder_version: Option<i32>,
    ) -> Result<bool, zk::Error> {
        let (lease, holder) = self.paths(name)?;
        let mut multi = self.client.new_multi_writer();
        multi.add_check_version(&lease, lease_version)?;
        multi.add_delete(&holder, holder_version)?;
        match multi.commit().await {
            Ok(_) => Ok(true),
            Err(zk::MultiWriteError::OperationFailed {
                source: zk::Error::BadVersion | zk::Error::NoNode,
                ..
            }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// One acquire under way (see [`OwnerSession::acquiring`]).
pub(crate) struct AcquireGuard<'a> {
    session: &'a OwnerSession,
    name: &'a str,
    ttl: Duration,
    settled: bool,
}

impl AcquireGuard<'_> {
    /// The acquire's outcome is known (granted and recorded, or certainly not).
    pub(crate) fn settle(&mut self) {
        self.settled = true;
    }
}

impl Drop for AcquireGuard<'_> {
    fn drop(&mut self) {
        let due = self.session.clock.now() + self.ttl;
        let mut doubts = self.session.doubts();
        if let Some(n) = doubts.acquiring.get_mut(self.name) {
            *n -= 1;
            if *n == 0 {
                doubts.acquiring.remove(self.name);
            }
        }
        if !self.settled {
            let at = doubts.due.entry(self.name.to_string()).or_insert(due);
            *at = (*at).max(due);
            drop(doubts);
            // The reaper sleeps at most a second: waking it is not needed for a ttl-long wait.
        }
    }
}

/// Deletes grants whose expiry passed and holder nodes left by acquires of unknown outcome
/// once their doubt is due; retries deletions that failed (connection lost) every second.
/// Ends when the session is dropped or over.
async fn reap(session: Weak<OwnerSession>, changed: Arc<Notify>) {
    loop {
        let Some(s) = session.upgrade() else { return };
        if !s.usable() {
            return;
        }
        let clock = s.clock.clone();
        let now = clock.now();
        let mut due = Vec::new();
        let mut next = now + Duration::from_secs(1);
        {
            let mut grants = s.lock();
            for (name, g) in grants.iter_mut() {
                if g.ending || g.expires_at <= now {
                    g.ending = true;
                    due.push((name.clone(), g.token, g.lease_version));
                } else {
                    next = next.min(g.expires_at);
                }
            }
            *s.reaper_due.lock().unwrap_or_else(|e| e.into_inner()) = Some(next);
        }
        let doubtful: Vec<String> = {
            let doubts = s.doubts();
            for at in doubts.due.values().filter(|at| **at > now) {
                next = next.min(*at);
            }
            doubts
                .due
                .iter()
                .filter(|(name, at)| **at <= now && !doubts.acquiring.contains_key(*name))
                .map(|(name, _)| name.clone())
                .collect()
        };
        // Pipelined: the deletions of one round share the round trip.
        let (results, reaped) = futures::future::join(
            futures::future::join_all(due.iter().map(|(name, _, v)| s.delete_grant(name, *v))),
            futures::future::join_all(doubtful.iter().map(|name| s.reap_doubt(name))),
        )
        .await;
        for (name, result) in doubtful.iter().zip(reaped) {
            match result {
                Ok(true) => {
                    let mut doubts = s.doubts();
                    if doubts.due.get(name).is_some_and(|at| *at <= now) {
                        doubts.due.remove(name);
                    }
                }
                Ok(false) => {}
                Err(e) if session_over(&e) => return,
                Err(e) => {
                    tracing::debug!(lease = %name, error = %e, "reaping a node of unknown outcome failed, retrying")
                }
            }
        }
        for ((name, token, _), result) in due.iter().zip(results) {
            match result {
                Ok(_) => s.forget(name, *token),
                Err(e) if session_over(&e) => return,
                Err(e) => {
                    tracing::debug!(lease = %name, error = %e, "expiring grant: delete failed, retrying")
                }
            }
        }
        drop(s);
        let _ = tokio::time::timeout_at(clock.to_tokio(next), changed.notified()).await;
    }
}
