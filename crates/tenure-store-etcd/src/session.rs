//! Sessions: one etcd lease per (owner, time-to-live), kept alive by one keep-alive
//! stream. Every Tenure lease the owner holds with that time-to-live is a key attached to
//! it, so a heartbeat costs one keep-alive whatever the number of leases, and when the
//! session expires all of the owner's keys go at once (the Consistent Core pattern).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use tenure_lease::{HolderClock, StoreError};
use tokio::time::Instant;

use crate::clock::RevisionClock;
use crate::error::etcd_error;

/// The etcd TTL (whole seconds) for a Tenure time-to-live: rounded up, plus one second.
/// Rounding up makes the server expire a session no earlier than `ttl` after it processed
/// a keep-alive; the extra second lets acquires skip the keep-alive while the session has
/// at least `ttl` left (see [`Session::lasts`]). A crashed holder's keys are deleted by
/// etcd at most two seconds past `ttl`; contenders that watch the revision clock may take
/// over at `ttl` already.
pub(crate) fn etcd_ttl(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX - 1) + 1
}

/// One etcd lease of one owner.
pub(crate) struct Session {
    pub id: i64,
    pub ttl: Duration,
    /// The clock `valid_until` is measured on: the holder clock, which counts host suspend
    /// (etcd's own clock runs on through this host's suspend).
    clock: HolderClock,
    /// Lower bound of the server's expiry: the instant the last grant or keep-alive was
    /// sent plus the TTL the server answered.
    valid_until: Mutex<Instant>,
    keeper: tokio::sync::Mutex<Option<(LeaseKeeper, LeaseKeepAliveStream)>>,
}

impl Session {
    /// Session `id` for `ttl`, granted by a request sent at `sent` (on `clock`) with the
    /// TTL `secs` the server answered.
    fn new(id: i64, ttl: Duration, clock: HolderClock, sent: Instant, secs: i64) -> Self {
        let session = Session {
            id,
            ttl,
            clock,
            valid_until: Mutex::new(sent),
            keeper: tokio::sync::Mutex::new(None),
        };
        session.extend(sent, secs);
        session
    }

    /// Whether the server keeps this session for at least `ttl` past now.
    pub(crate) fn lasts(&self, ttl: Duration) -> bool {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) >= self.clock.now() + ttl
    }

    fn what(&self) -> String {
        format!("session {:x}", self.id)
    }

    fn extend(&self, sent: Instant, secs: i64) {
        let until = sent + Duration::from_secs(u64::try_from(secs).unwrap_or(0));
        let mut v = self.valid_until.lock().unwrap_or_else(|e| e.into_inner());
        if until > *v {
            *v = until;
        }
    }
}

/// What a keep-alive found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeepAlive {
    /// The session lives on for at least its TTL from when the keep-alive was sent.
    Alive,
    /// The session has expired or was revoked: its keys are gone.
    Expired,
}

/// The sessions of one store client.
pub(crate) struct Sessions {
    client: Client,
    clock: Arc<RevisionClock>,
    live: tokio::sync::Mutex<HashMap<(String, u128), Arc<Session>>>,
}

impl Sessions {
    pub(crate) fn new(client: Client, clock: Arc<RevisionClock>) -> Self {
        Sessions {
            client,
            clock,
            live: tokio::sync::Mutex::default(),
        }
    }

    /// The session of `owner` for `ttl`, if one is open.
    pub(crate) async fn existing(&self, owner: &str, ttl: Duration) -> Option<Arc<Session>> {
        self.live
            .lock()
            .await
            .get(&(owner.to_string(), ttl.as_millis()))
            .cloned()
    }

    /// The session of `owner` for `ttl`, granted if needed, that the server keeps for at
    /// least `ttl` past the moment this call started (a keep-alive is sent when needed).
    pub(crate) async fn ready(
        &self,
        owner: &str,
        ttl: Duration,
    ) -> Result<Arc<Session>, StoreError> {
        let key = (owner.to_string(), ttl.as_millis());
        let mut live = self.live.lock().await;
        if let Some(s) = live.get(&key).cloned() {
            if s.lasts(ttl) {
                return Ok(s);
            }
            drop(live);
            if self.keep_alive(&s).await? == KeepAlive::Alive {
                return Ok(s);
            }
            live = self.live.lock().await;
            if live.get(&key).is_some_and(|l| l.id == s.id) {
                live.remove(&key);
            }
        }
        let sent = self.clock.now();
        let granted = self
            .client
            .lease_client()
            .grant(etcd_ttl(ttl), None)
            .await
            .map_err(|e| etcd_error("grant a session", owner, e))?;
        if let Some(h) = granted.header() {
            self.clock.saw(h.revision());
        }
        let session = Arc::new(Session::new(
            granted.id(),
            ttl,
            self.clock.holder().clone(),
            sent,
            granted.ttl(),
        ));
        live.insert(key, session.clone());
        Ok(session)
    }

    /// Sends one keep-alive for `session` on its stream (opened on first use, reopened
    /// after an error) and waits for the answer. A cached stream that turns out broken
    /// (the member restarted, the connection dropped, a call that timed out) is replaced
    /// once, at once: its failure says nothing about the session. The server's "not found"
    /// when a stream opens (etcd-client reports it as an error) is `Expired`: an expired or
    /// revoked session never comes back, and its owner must start a new one.
    pub(crate) async fn keep_alive(&self, session: &Session) -> Result<KeepAlive, StoreError> {
        let mut slot = session.keeper.lock().await;
        // Taken out while in use: if this call is cancelled or fails, the stream is dropped
        // and the next call opens a fresh one (no stale answer can be read later).
        if let Some(cached) = slot.take()
            && let Ok((answer, stream)) = self.keep_alive_on(session, cached).await
        {
            *slot = Some(stream);
            return Ok(answer);
        }
        let fresh = match self.client.lease_client().keep_alive(session.id).await {
            Ok(fresh) => fresh,
            Err(e) if lease_not_found(&e) => return Ok(KeepAlive::Expired),
            Err(e) => return Err(etcd_error("open a keep-alive stream", &session.what(), e)),
        };
        let (answer, stream) = self.keep_alive_on(session, fresh).await?;
        *slot = Some(stream);
        Ok(answer)
    }

    async fn keep_alive_on(
        &self,
        session: &Session,
        (mut keeper, mut stream): (LeaseKeeper, LeaseKeepAliveStream),
    ) -> Result<(KeepAlive, (LeaseKeeper, LeaseKeepAliveStream)), StoreError> {
        let what = session.what();
        let sent = self.clock.now();
        keeper
            .keep_alive()
            .await
            .map_err(|e| etcd_error("keep-alive", &what, e))?;
        let answer = stream
            .message()
            .await
            .map_err(|e| etcd_error("keep-alive", &what, e))?
            .ok_or_else(|| {
                StoreError::unavailable("etcd", format!("keep-alive of {what}: the stream closed"))
            })?;
        if let Some(h) = answer.header() {
            self.clock.saw(h.revision());
        }
        if answer.ttl() <= 0 {
            return Ok((KeepAlive::Expired, (keeper, stream)));
        }
        session.extend(sent, answer.ttl());
        Ok((KeepAlive::Alive, (keeper, stream)))
    }

    /// Forgets `session` (it expired): later acquires grant a new one.
    pub(crate) async fn forget(&self, owner: &str, session: &Session) {
        let key = (owner.to_string(), session.ttl.as_millis());
        let mut live = self.live.lock().await;
        if live.get(&key).is_some_and(|l| l.id == session.id) {
            live.remove(&key);
        }
    }
}

/// Whether `e` is etcd's answer that a session (etcd lease) does not exist any more: it
/// expired or was revoked.
pub(crate) fn lease_not_found(e: &etcd_client::Error) -> bool {
    match e {
        // What etcd-client makes of a keep-alive stream whose first answer has ttl 0.
        etcd_client::Error::LeaseKeepAliveError(m) => m.contains("lease not found"),
        etcd_client::Error::GRpcStatus(s) => s.message().contains("requested lease not found"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session whose keep-alive was last confirmed before a suspend longer than its
    /// remaining ttl does not last a ttl any more: a key is attached to it only after a
    /// keep-alive (or to a new session), never to a session etcd may expire in less than a
    /// ttl.
    #[tokio::test(start_paused = true)]
    async fn a_suspend_longer_than_a_sessions_remaining_ttl_needs_a_keep_alive() {
        let (clock, suspend) = HolderClock::manual();
        let ttl = Duration::from_secs(1);
        let session = Session::new(7, ttl, clock.clone(), clock.now(), etcd_ttl(ttl));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(session.lasts(ttl), "1.5 s left of 2 s");
        suspend.suspend(Duration::from_secs(1));
        assert!(
            !session.lasts(ttl),
            "0.5 s left after the suspend: a key attached now could expire within its ttl"
        );
        // A keep-alive confirmed after the suspend makes it last again.
        session.extend(clock.now(), etcd_ttl(ttl));
        assert!(session.lasts(ttl));
    }

    #[test]
    fn etcd_ttls_round_up_plus_one_second() {
        assert_eq!(etcd_ttl(Duration::from_millis(300)), 2);
        assert_eq!(etcd_ttl(Duration::from_millis(1000)), 2);
        assert_eq!(etcd_ttl(Duration::from_millis(1500)), 3);
        assert_eq!(etcd_ttl(Duration::from_secs(120)), 121);
    }
}
