//! The etcd lease store: compare-and-set transactions on holder keys attached to the
//! owner's session.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, KeyValue, LeaseTimeToLiveOptions, PutOptions, Txn,
    TxnOp, TxnOpResponse, TxnResponse,
};
use futures::stream::{self, StreamExt};
use tenure_lease::{
    AcquireOutcome, AcquireRequest, Capabilities, HeldLease, LeaseRecord, LeaseStore, Renewal,
    StoreError,
};

use crate::clock::RevisionClock;
use crate::error::etcd_error;
use crate::layout::{GrantValue, Layout};
use crate::session::{KeepAlive, Session, Sessions};

/// How many times one acquire re-reads after losing a race (another client changed the
/// key between its read and its write) before giving up with an error.
const RACES: usize = 16;

/// How many times a request refused at connect (it reached no member) is sent.
const CONNECT_ATTEMPTS: usize = 4;

/// Whether `e` says the request could not be delivered to any member (connection refused
/// or not established), so that it certainly had no effect.
fn never_sent(e: &etcd_client::Error) -> bool {
    let text = e.to_string();
    text.contains("tcp connect error") || text.contains("Connection refused")
}

/// A grant this client wrote: what renewals and releases check against.
#[derive(Debug, Clone)]
struct LocalGrant {
    owner: String,
    token: i64,
    session: i64,
    value: GrantValue,
}

/// A lease store on an etcd cluster (v3 API). Cloning shares the connection and sessions.
///
/// - **Grant**: a transaction creates `<prefix>leases/<name>` if absent
///   (`create_revision == 0`), attached to the owner's session; the **fencing token** is
///   the key's create revision, which etcd never reuses (monotonic across holders and
///   restarts).
/// - **Renew**: one keep-alive of the owner's session, one heartbeat write and one read of
///   the keys attached to the session: constant cost in the number of leases.
/// - **Expiry**: etcd deletes a session's keys when it expires (whole seconds, rounded
///   up). Sub-second time-to-lives are honoured by the revision clock
///   ([`crate::clock`]): a grant whose key and heartbeat have not changed since this client
///   first saw their revision, at least `ttl` ago, is expired and may be taken over.
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) layout: Layout,
    pub(crate) clock: Arc<RevisionClock>,
    pub(crate) sessions: Sessions,
    grants: Mutex<HashMap<String, LocalGrant>>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("layout", &self.inner.layout)
            .finish()
    }
}

/// A grant as read, judged against the revision clock.
struct Judged {
    value: GrantValue,
    heartbeat: i64,
    record: LeaseRecord,
    expired: bool,
}

/// Drops this client's memory of a grant unless the operation that may change it
/// completes (cancelled or failed acquires leave the token in doubt).
struct Doubt<'a> {
    inner: &'a Inner,
    name: &'a str,
    settled: bool,
}

impl Drop for Doubt<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.inner.forget_grant(self.name);
        }
    }
}

pub(crate) fn put_leased(
    key: impl Into<Vec<u8>>,
    value: impl Into<Vec<u8>>,
    session: i64,
) -> TxnOp {
    TxnOp::put(key, value, Some(PutOptions::new().with_lease(session)))
}

impl EtcdStore {
    /// A store on `client` keeping its keys under `prefix` (e.g. `/tenure/`).
    pub fn new(client: Client, prefix: &str) -> Self {
        let clock = Arc::new(RevisionClock::default());
        EtcdStore {
            inner: Arc::new(Inner {
                sessions: Sessions::new(client.clone(), clock.clone()),
                client,
                layout: Layout::new(prefix),
                clock,
                grants: Mutex::default(),
            }),
        }
    }

    /// The etcd client this store uses.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }
}

impl Inner {
    fn forget_grant(&self, name: &str) {
        self.grants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
    }

    fn remember(&self, name: &str, grant: LocalGrant) {
        self.grants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), grant);
    }

    fn local(&self, name: &str) -> Option<LocalGrant> {
        self.grants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    pub(crate) async fn txn(
        &self,
        txn: Txn,
        operation: &str,
        what: &str,
    ) -> Result<TxnResponse, StoreError> {
        let mut attempt = 1;
        let resp = loop {
            match self.client.kv_client().txn(txn.clone()).await {
                Ok(resp) => break resp,
                // The request never left this client (a member refused the connection):
                // send it again, the balancer may pick another member.
                Err(e) if attempt < CONNECT_ATTEMPTS && never_sent(&e) => attempt += 1,
                Err(e) => return Err(etcd_error(operation, what, e)),
            }
        };
        let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        self.clock.saw(revision);
        Ok(resp)
    }

    /// Reads every heartbeat key (their mod revisions, by session id).
    fn heartbeats_op(&self) -> TxnOp {
        TxnOp::get(
            self.layout.sessions(),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
    }

    fn heartbeats(&self, kvs: &[KeyValue]) -> HashMap<i64, i64> {
        let prefix = self.layout.sessions();
        kvs.iter()
            .filter_map(|kv| {
                let hex = std::str::from_utf8(kv.key()).ok()?.strip_prefix(&prefix)?;
                let id = u64::from_str_radix(hex, 16).ok()? as i64;
                Some((id, kv.mod_revision()))
            })
            .collect()
    }

    /// The key-values of op `i` (a get) of `resp`.
    pub(crate) fn got(resp: &TxnResponse, i: usize) -> Vec<KeyValue> {
        match resp.op_responses().into_iter().nth(i) {
            Some(TxnOpResponse::Get(g)) => g.kvs().to_vec(),
            _ => Vec::new(),
        }
    }

    /// Reads `key_op` together with the heartbeats, in one snapshot.
    async fn snapshot(
        &self,
        key_op: TxnOp,
        operation: &str,
        what: &str,
    ) -> Result<(Vec<KeyValue>, HashMap<i64, i64>), StoreError> {
        let resp = self
            .txn(
                Txn::new().and_then([key_op, self.heartbeats_op()]),
                operation,
                what,
            )
            .await?;
        let hb = self.heartbeats(&Self::got(&resp, 1));
        Ok((Self::got(&resp, 0), hb))
    }

    fn judge(
        &self,
        name: &str,
        kv: &KeyValue,
        hbs: &HashMap<i64, i64>,
    ) -> Result<Judged, StoreError> {
        let value = GrantValue::decode(kv.key(), kv.value())?;
        let heartbeat = hbs.get(&kv.lease()).copied().unwrap_or(0);
        let ttl = Duration::from_millis(value.ttl_ms);
        let age = self.clock.age(kv.mod_revision().max(heartbeat));
        let record = LeaseRecord {
            name: name.to_string(),
            owner: value.owner.clone(),
            instance: value.instance.clone(),
            token: kv.create_revision() as u64,
            expires_in: ttl.saturating_sub(age),
            version: kv.version() as u64,
            note: value.note.clone(),
            ..LeaseRecord::default()
        };
        Ok(Judged {
            value,
            heartbeat,
            record,
            expired: age >= ttl,
        })
    }

    /// Acquires as [`LeaseStore::try_acquire`]; with `pinned`, only under that session
    /// (a fair waiter whose session was replaced must not be granted).
    pub(crate) async fn try_acquire_in(
        &self,
        req: &AcquireRequest,
        pinned: Option<i64>,
    ) -> Result<AcquireOutcome, StoreError> {
        let name = req.name.as_str();
        let mut doubt = Doubt {
            inner: self,
            name,
            settled: false,
        };
        let key = self.layout.lease(name);
        let ttl_ms = u64::try_from(req.ttl.as_millis()).unwrap_or(u64::MAX);
        let value = GrantValue {
            owner: req.owner.clone(),
            instance: req.instance.clone(),
            ttl_ms,
            note: req.note.clone(),
        };
        let bytes = value.encode();
        for _ in 0..RACES {
            let session = self.sessions.ready(&req.owner, req.ttl).await?;
            if pinned.is_some_and(|p| p != session.id) {
                return Err(StoreError::Unavailable {
                    store: "etcd",
                    detail: format!("acquire {key}: the waiter's session expired"),
                });
            }
            let heartbeat = self.layout.session(session.id);
            let write = [
                put_leased(key.clone(), bytes.clone(), session.id),
                put_leased(heartbeat.clone(), req.owner.clone(), session.id),
            ];
            let resp = self
                .txn(
                    Txn::new()
                        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                        .and_then(write.clone())
                        .or_else([TxnOp::get(key.clone(), None), self.heartbeats_op()]),
                    "acquire",
                    &key,
                )
                .await;
            let resp = match resp {
                Err(e) if e.to_string().contains("lease not found") => {
                    // Revoked behind our back (or expired early): later calls grant anew.
                    self.sessions.forget(&req.owner, &session).await;
                    return Err(e);
                }
                other => other?,
            };
            let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            if resp.succeeded() {
                return Ok(self.granted(&mut doubt, req, &session, value, revision, 1));
            }
            let hbs = self.heartbeats(&Self::got(&resp, 1));
            let Some(kv) = Self::got(&resp, 0).into_iter().next() else {
                continue; // deleted since: try to create it again
            };
            let held = self.judge(name, &kv, &hbs)?;
            let same_owner = held.value.owner == req.owner;
            if same_owner && held.value.instance == req.instance && !held.expired {
                // Reentrant: rewrite the key (fresh ttl, session, note), keeping its
                // create revision and so its token.
                let resp = self
                    .txn(
                        Txn::new()
                            .when([Compare::mod_revision(
                                key.clone(),
                                CompareOp::Equal,
                                kv.mod_revision(),
                            )])
                            .and_then(write),
                        "acquire (reentrant)",
                        &key,
                    )
                    .await?;
                if resp.succeeded() {
                    let version = kv.version() as u64 + 1;
                    return Ok(self.granted(
                        &mut doubt,
                        req,
                        &session,
                        value,
                        kv.create_revision(),
                        version,
                    ));
                }
            } else if same_owner || held.expired {
                // Taken over (another instance of the owner) or expired: delete the old
                // grant if nothing changed since it was judged, then create a new one
                // (new create revision, so a new token). etcd rejects a put and a delete
                // of one key in one transaction, hence two steps.
                let mut guards = vec![Compare::mod_revision(
                    key.clone(),
                    CompareOp::Equal,
                    kv.mod_revision(),
                )];
                if held.heartbeat > 0 {
                    guards.push(Compare::mod_revision(
                        self.layout.session(kv.lease()),
                        CompareOp::Equal,
                        held.heartbeat,
                    ));
                }
                self.txn(
                    Txn::new()
                        .when(guards)
                        .and_then([TxnOp::delete(key.clone(), None)]),
                    "acquire (take over)",
                    &key,
                )
                .await?;
            } else {
                return Ok(AcquireOutcome::Held(held.record));
            }
        }
        Err(StoreError::Unavailable {
            store: "etcd",
            detail: format!("acquire {key}: lost {RACES} races with other clients in a row"),
        })
    }

    fn granted(
        &self,
        doubt: &mut Doubt<'_>,
        req: &AcquireRequest,
        session: &Session,
        value: GrantValue,
        token: i64,
        version: u64,
    ) -> AcquireOutcome {
        let record = LeaseRecord {
            name: req.name.clone(),
            owner: req.owner.clone(),
            instance: req.instance.clone(),
            token: token as u64,
            expires_in: req.ttl,
            version,
            note: req.note.clone(),
            ..LeaseRecord::default()
        };
        self.remember(
            &req.name,
            LocalGrant {
                owner: req.owner.clone(),
                token,
                session: session.id,
                value,
            },
        );
        doubt.settled = true;
        AcquireOutcome::Granted(record)
    }

    async fn renew(
        &self,
        owner: &str,
        leases: &[HeldLease],
        ttl: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        let local: Vec<Option<LocalGrant>> = leases
            .iter()
            .map(|l| {
                self.local(&l.name)
                    .filter(|g| g.owner == owner && g.token as u64 == l.token)
            })
            .collect();
        if local.iter().all(Option::is_none) {
            return Ok(vec![false; leases.len()]);
        }
        // One keep-alive (a fresh grant counts as one: it was sent during this call).
        let mut expired = HashSet::new();
        let session = match self.sessions.existing(owner, ttl).await {
            Some(s) => match self.sessions.keep_alive(&s).await? {
                KeepAlive::Alive => s,
                KeepAlive::Expired => {
                    expired.insert(s.id);
                    self.sessions.forget(owner, &s).await;
                    self.sessions.ready(owner, ttl).await?
                }
            },
            None => self.sessions.ready(owner, ttl).await?,
        };
        // The heartbeat tells contenders the holder is alive; written before the keys are
        // confirmed, so a takeover that confirmed after it is seen as a missing key.
        let heartbeat = self.layout.session(session.id);
        self.txn(
            Txn::new().and_then([put_leased(heartbeat.clone(), owner, session.id)]),
            "renew (heartbeat)",
            &heartbeat,
        )
        .await?;
        let attached = self
            .client
            .lease_client()
            .time_to_live(session.id, Some(LeaseTimeToLiveOptions::new().with_keys()))
            .await
            .map_err(|e| etcd_error("renew (read attached keys)", &heartbeat, e))?;
        if let Some(h) = attached.header() {
            self.clock.saw(h.revision());
        }
        let attached: HashSet<&[u8]> = attached.keys().iter().map(Vec::as_slice).collect();
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let mut flags = Vec::with_capacity(leases.len());
        let mut moves = Vec::new();
        for (i, (lease, grant)) in leases.iter().zip(local).enumerate() {
            let key = self.layout.lease(&lease.name);
            flags.push(match grant {
                None => false,
                Some(g) if g.session == session.id => attached.contains(key.as_bytes()),
                Some(g) if expired.contains(&g.session) => false,
                Some(g) => {
                    // Granted under another time-to-live: move the key to this session
                    // (a put keeps its create revision, so its token).
                    moves.push((i, lease.name.clone(), key, g));
                    false
                }
            });
        }
        let moved: Vec<_> = stream::iter(moves.into_iter().map(|(i, name, key, g)| {
            let value = GrantValue {
                ttl_ms,
                ..g.value.clone()
            };
            let session_id = session.id;
            async move {
                let resp = self
                    .txn(
                        Txn::new()
                            .when([
                                Compare::create_revision(key.clone(), CompareOp::Equal, g.token),
                                Compare::lease(key.clone(), CompareOp::Equal, g.session),
                            ])
                            .and_then([put_leased(key.clone(), value.encode(), session_id)]),
                        "renew (move to session)",
                        &key,
                    )
                    .await?;
                if resp.succeeded() {
                    self.remember(
                        &name,
                        LocalGrant {
                            session: session_id,
                            value,
                            ..g
                        },
                    );
                }
                Ok::<_, StoreError>((i, resp.succeeded()))
            }
        }))
        .buffer_unordered(MOVES_IN_FLIGHT)
        .collect()
        .await;
        for r in moved {
            let (i, ok) = r?;
            flags[i] = ok;
        }
        Ok(flags)
    }

    async fn release(&self, name: &str, owner: &str, token: u64) -> Result<bool, StoreError> {
        let key = self.layout.lease(name);
        let token = i64::try_from(token).unwrap_or(i64::MAX);
        if let Some(g) = self
            .local(name)
            .filter(|g| g.owner == owner && g.token == token)
        {
            // Fast path: the grant this client wrote, compared as written.
            let resp = self
                .txn(
                    Txn::new()
                        .when([
                            Compare::create_revision(key.clone(), CompareOp::Equal, token),
                            Compare::value(key.clone(), CompareOp::Equal, g.value.encode()),
                        ])
                        .and_then([TxnOp::delete(key.clone(), None)]),
                    "release",
                    &key,
                )
                .await?;
            if resp.succeeded() {
                self.forget_grant(name);
                return Ok(true);
            }
        }
        for _ in 0..RACES {
            let (kvs, _) = self
                .snapshot(TxnOp::get(key.clone(), None), "release (read)", &key)
                .await?;
            let Some(kv) = kvs.into_iter().next() else {
                return Ok(false);
            };
            let value = GrantValue::decode(kv.key(), kv.value())?;
            if value.owner != owner || kv.create_revision() != token {
                return Ok(false);
            }
            let resp = self
                .txn(
                    Txn::new()
                        .when([Compare::mod_revision(
                            key.clone(),
                            CompareOp::Equal,
                            kv.mod_revision(),
                        )])
                        .and_then([TxnOp::delete(key.clone(), None)]),
                    "release",
                    &key,
                )
                .await?;
            if resp.succeeded() {
                self.forget_grant(name);
                return Ok(true);
            }
        }
        Err(StoreError::Unavailable {
            store: "etcd",
            detail: format!("release {key}: lost {RACES} races with other clients in a row"),
        })
    }

    pub(crate) async fn read(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError> {
        let key = self.layout.lease(name);
        let (kvs, hbs) = self
            .snapshot(TxnOp::get(key.clone(), None), "read", &key)
            .await?;
        match kvs.first() {
            None => Ok(None),
            Some(kv) => {
                let j = self.judge(name, kv, &hbs)?;
                Ok((!j.expired).then_some(j.record))
            }
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        let from = self.layout.lease(prefix);
        let (kvs, hbs) = self
            .snapshot(
                TxnOp::get(from.clone(), Some(GetOptions::new().with_prefix())),
                "list",
                &from,
            )
            .await?;
        let mut out = Vec::new();
        for kv in &kvs {
            let Some(name) = self.layout.name_of(kv.key()) else {
                continue;
            };
            let j = self.judge(name, kv, &hbs)?;
            if !j.expired {
                out.push(j.record);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

/// How many key moves (time-to-live changes) a renewal has in flight at once.
const MOVES_IN_FLIGHT: usize = 32;

#[async_trait]
impl LeaseStore for EtcdStore {
    fn kind(&self) -> &'static str {
        "etcd"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_fencing: true,
            server_side_expiry: true,
            fair_waiting: true,
            watch: true,
            durable: true,
            preemption: false,
        }
    }

    /// `Ok(Granted)`: the key was created (new token = its create revision), rewritten for
    /// the same owner and instance (same token), or taken over from another instance of the
    /// same owner or from an expired grant (new token). `Ok(Held)`: another owner's
    /// unexpired grant. `Err`: unknown (unreachable, timed out, or lost too many races).
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome, StoreError> {
        self.inner.try_acquire_in(req, None).await
    }

    /// One keep-alive of `owner`'s session for `ttl`, one heartbeat write, one read of the
    /// keys attached to the session. `true` for a lease whose key is still attached with
    /// `token`; `false` when it is gone, taken over or its session expired. Leases granted
    /// under another time-to-live are moved to this session (one write each, only when the
    /// time-to-live changes).
    async fn renew(
        &self,
        owner: &str,
        leases: &[HeldLease],
        ttl: Duration,
    ) -> Result<Vec<Renewal>, StoreError> {
        let renewed = self.inner.renew(owner, leases, ttl).await?;
        Ok(renewed.into_iter().map(Renewal::plain).collect())
    }

    /// `Ok(true)`: the key held by `owner` with create revision `token` was deleted.
    /// `Ok(false)`: no such grant (another holder's, a later grant, or none).
    async fn release(&self, name: &str, owner: &str, token: u64) -> Result<bool, StoreError> {
        self.inner.release(name, owner, token).await
    }

    async fn read(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError> {
        self.inner.read(name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        self.inner.list(prefix).await
    }

    /// Queues behind earlier fair acquires of `req.name` (a waiter key attached to the
    /// owner's session, ordered by create revision, each waiter watching only the one
    /// before it), then acquires as `try_acquire` does. `Ok(Held)`: `wait` passed while
    /// another owner held the lease. `Err`: unknown, including a waiter whose session
    /// expired while queued (never granted then) and `wait` passing while earlier waiters
    /// had not reached the lease. The waiter key is removed however this ends (also when
    /// the future is dropped). `try_acquire` does not queue: it may overtake waiters.
    async fn acquire_fair(
        &self,
        req: &AcquireRequest,
        wait: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        self.inner.acquire_fair(req, wait).await
    }

    async fn watch(&self, prefix: &str) -> Result<tenure_lease::WatchReceiver, StoreError> {
        crate::watch::watch(&self.inner.client, &self.inner.layout, prefix).await
    }
}
