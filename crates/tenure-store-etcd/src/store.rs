//! The etcd lease store: compare-and-set transactions on holder keys attached to the
//! owner's session.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, KeyValue, LeaseTimeToLiveOptions, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use futures::stream::{self, StreamExt};
use tenure_lease::{
    AcquireOutcome, AcquireRequest, AcquireStep, Capabilities, ChangeVersion, Changes, FairQueue,
    FencingToken, GrantChanges, HeldLease, HolderClock, HolderWatch, LeaseRecord, LeaseStore,
    PreemptAnswer, PreemptionRequest, PreemptionRequests, RememberChange, RememberedIds, Renewal,
    StoreError,
};
use tokio::time::Instant;

use crate::clock::RevisionClock;
use crate::error::etcd_error;
use crate::layout::{GrantValue, Layout, RequestValue};
use crate::local::{Doubt, Local, LocalGrant};
use crate::session::{KeepAlive, Sessions};

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

fn state_lost(went_back: crate::clock::WentBack) -> StoreError {
    StoreError::state_lost("etcd", went_back.to_string())
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
    /// The grants this client wrote, and the orphans on its sessions (module
    /// [`crate::local`]).
    local: Local,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("layout", &self.inner.layout)
            .finish()
    }
}

/// A grant as read, judged against the revision clock.
pub(crate) struct Judged {
    pub(crate) value: GrantValue,
    heartbeat: i64,
    pub(crate) record: LeaseRecord,
    pub(crate) expired: bool,
    /// Expired because a forceful preemption request has been pending on it for a full
    /// ttl (its session's heartbeat may still be fresh).
    forced_out: bool,
    /// The pending request and its key's mod revision (0: none, which is also what etcd
    /// compares an absent key's mod revision with).
    pub(crate) pending: Option<RequestValue>,
    pub(crate) request_rev: i64,
}

/// Every key of one snapshot read besides the ones asked for: heartbeats (mod revision by
/// session id) and pending preemption requests (by grant token).
pub(crate) struct Context {
    heartbeats: HashMap<i64, i64>,
    requests: HashMap<i64, KeyValue>,
}

impl Context {
    /// The request key of the grant with token `token`, if one is pending.
    pub(crate) fn request(&self, token: i64) -> Option<&KeyValue> {
        self.requests.get(&token)
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
    /// A store on `client` keeping its keys under `prefix` (e.g. `/tenure/`), timing on the
    /// host's holder clock.
    pub fn new(client: Client, prefix: &str) -> Self {
        EtcdStore::with_clock(client, prefix, HolderClock::host())
    }

    /// [`EtcdStore::new`] timing on `clock` (the holder clock of the Lease API, which counts
    /// host suspend; tests inject [`HolderClock::manual`]).
    pub fn with_clock(client: Client, prefix: &str, clock: HolderClock) -> Self {
        let clock = Arc::new(RevisionClock::new(clock));
        EtcdStore {
            inner: Arc::new(Inner {
                sessions: Sessions::new(client.clone(), clock.clone()),
                client,
                layout: Layout::new(prefix),
                clock,
                local: Local::default(),
            }),
        }
    }

    /// The etcd client this store uses.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The fence of a write guarded by lease `name` with fencing token `token`, for the
    /// caller's own transaction: a [`Compare`](etcd_client::Compare) that holds while the
    /// lease's holder key is the one created by that grant (its create revision is the
    /// token). It fails once the grant was released, expired with its session, or replaced
    /// by a later grant, so the transaction takes its `or_else` branch and writes nothing.
    ///
    /// ```no_run
    /// # async fn f(store: &tenure_store_etcd::EtcdStore, token: tenure_lease::FencingToken) -> Result<(), etcd_client::Error> {
    /// use etcd_client::{Txn, TxnOp};
    ///
    /// let txn = Txn::new()
    ///     .when([store.fence("nightly-report", token)])
    ///     .and_then([TxnOp::put("/reports/nightly", "done", None)]);
    /// let written = store.client().clone().txn(txn).await?.succeeded();
    /// # let _ = written; Ok(()) }
    /// ```
    pub fn fence(&self, name: &str, token: FencingToken) -> etcd_client::Compare {
        // A token beyond i64 was never issued by etcd: compare with -1, which no key has.
        let revision = i64::try_from(token.get()).unwrap_or(-1);
        etcd_client::Compare::create_revision(
            self.inner.layout.lease(name),
            etcd_client::CompareOp::Equal,
            revision,
        )
    }
}

impl Inner {
    /// Runs `txn`, refusing an answer whose revision went back ([`RevisionClock::order`]).
    /// A write it made then happened in a history this client does not trust: use
    /// [`Inner::txn_unordered`] where such a write must be undone.
    pub(crate) async fn txn(
        &self,
        txn: Txn,
        operation: &str,
        what: &str,
    ) -> Result<TxnResponse, StoreError> {
        let floor = self.clock.highest();
        let resp = self.txn_unordered(txn, operation, what).await?;
        self.ordered(floor, &resp)?;
        Ok(resp)
    }

    /// `Err` if `resp`'s revision went back below `floor`, the highest revision when it
    /// was sent (see [`RevisionClock::order`]). Every grant this client remembers is then
    /// forgotten: renewals answer "not held".
    pub(crate) fn ordered(&self, floor: i64, resp: &TxnResponse) -> Result<(), StoreError> {
        let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        self.clock.order(floor, revision).map_err(|went_back| {
            self.local.forget_all();
            state_lost(went_back)
        })
    }

    /// Runs `txn` without judging its revision's order.
    pub(crate) async fn txn_unordered(
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
        // A revision of a history that went back is below the points kept: not recorded.
        self.clock.saw(revision);
        Ok(resp)
    }

    /// Deletes grant `key` (token `token`) and its preemption request in one transaction
    /// run as [`Inner::txn`] runs it, if every compare in `when` holds: `Ok(true)` deleted,
    /// `Ok(false)` a compare failed and nothing changed.
    async fn delete_grant_when(
        &self,
        key: &str,
        token: i64,
        when: impl Into<Vec<Compare>>,
    ) -> Result<bool, StoreError> {
        let resp = self
            .txn(
                Txn::new().when(when).and_then([
                    TxnOp::delete(key, None),
                    TxnOp::delete(self.layout.request(token), None),
                ]),
                "release",
                key,
            )
            .await?;
        Ok(resp.succeeded())
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

    /// Reads every pending preemption request (few: one per grant being preempted).
    pub(crate) fn requests_op(&self) -> TxnOp {
        TxnOp::get(
            self.layout.requests(),
            Some(GetOptions::new().with_prefix()),
        )
    }

    /// The request keys among `kvs`, by grant token.
    pub(crate) fn requests(&self, kvs: Vec<KeyValue>) -> HashMap<i64, KeyValue> {
        kvs.into_iter()
            .filter_map(|kv| Some((self.layout.token_of(kv.key())?, kv)))
            .collect()
    }

    /// The context ops (heartbeats, requests) of a response whose ops `at` and `at + 1`
    /// were [`heartbeats_op`](Self::heartbeats_op) and [`requests_op`](Self::requests_op).
    fn context(&self, resp: &TxnResponse, at: usize) -> Context {
        Context {
            heartbeats: self.heartbeats(&Self::got(resp, at)),
            requests: self.requests(Self::got(resp, at + 1)),
        }
    }

    /// Reads `key_op` together with the heartbeats and requests, in one snapshot.
    pub(crate) async fn snapshot(
        &self,
        key_op: TxnOp,
        operation: &str,
        what: &str,
    ) -> Result<(Vec<KeyValue>, Context), StoreError> {
        let resp = self
            .txn(
                Txn::new().and_then([key_op, self.heartbeats_op(), self.requests_op()]),
                operation,
                what,
            )
            .await?;
        Ok((Self::got(&resp, 0), self.context(&resp, 1)))
    }

    /// Judges the grant `kv` against the revision clock: expired once its key and its
    /// session's heartbeat are unchanged since a revision this client first saw a ttl
    /// ago, or once a forceful preemption request has been pending on it without a break
    /// since such a revision (module [`crate::preempt`]).
    pub(crate) fn judge(
        &self,
        name: &str,
        kv: &KeyValue,
        context: &Context,
    ) -> Result<Judged, StoreError> {
        let value = GrantValue::decode(kv.key(), kv.value())?;
        let heartbeat = context.heartbeats.get(&kv.lease()).copied().unwrap_or(0);
        let ttl = Duration::from_millis(value.ttl_ms);
        let mut age = self.clock.age(kv.mod_revision().max(heartbeat));
        let (pending, request_rev) = match context.request(kv.create_revision()) {
            Some(r) => (
                Some(RequestValue::decode(r.key(), r.value())?),
                r.mod_revision(),
            ),
            None => (None, 0),
        };
        let forced_age = pending
            .as_ref()
            .zip(context.request(kv.create_revision()))
            .and_then(|(p, r)| p.forced_at(r.mod_revision()))
            .map(|since| self.clock.age(since));
        let forced_out = forced_age.is_some_and(|a| a >= ttl);
        if let Some(forced_age) = forced_age {
            age = age.max(forced_age);
        }
        let record = record_of(
            name,
            &value,
            kv.create_revision(),
            ttl.saturating_sub(age),
            kv.version() as u64,
            pending.as_ref().map(|p| p.request.clone()),
        );
        Ok(Judged {
            value,
            heartbeat,
            record,
            expired: age >= ttl,
            forced_out,
            pending,
            request_rev,
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
        let mut doubt = self.local.acquiring(name);
        let key = self.layout.lease(name);
        let ttl_ms = u64::try_from(req.ttl.as_millis()).unwrap_or(u64::MAX);
        let value = GrantValue {
            owner: req.owner.clone(),
            instance: req.instance.clone(),
            ttl_ms,
            note: req.note.clone(),
            priority: req.priority,
            cleanup_ms: u64::try_from(req.cleanup_timeout.as_millis()).unwrap_or(u64::MAX),
        };
        let bytes = value.encode();
        self.clock.quiet(req.ttl).map_err(state_lost)?;
        for _ in 0..RACES {
            let session = self.sessions.ready(&req.owner, req.ttl).await?;
            if pinned.is_some_and(|p| p != session.id) {
                return Err(StoreError::unavailable(
                    "etcd",
                    format!("acquire {key}: the waiter's session expired"),
                ));
            }
            let heartbeat = self.layout.session(session.id);
            let write = [
                put_leased(key.clone(), bytes.clone(), session.id),
                put_leased(heartbeat.clone(), req.owner.clone(), session.id),
            ];
            let floor = self.clock.highest();
            let sent = self.clock.now();
            let resp = self
                .txn_unordered(
                    Txn::new()
                        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                        .and_then(write)
                        .or_else([
                            TxnOp::get(key.clone(), None),
                            self.heartbeats_op(),
                            self.requests_op(),
                        ]),
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
            if let Err(e) = self.ordered(floor, &resp) {
                if resp.succeeded() {
                    self.undo_create(&key, &resp).await;
                }
                return Err(e);
            }
            let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            if resp.succeeded() {
                if let Err(went_back) = self.clock.fresh(revision) {
                    // Created at a revision the forgotten history had issued already: its
                    // token would repeat one that a holder may have written with.
                    self.undo_create(&key, &resp).await;
                    return Err(state_lost(went_back));
                }
                let grant = (session.id, value, revision, sent);
                return Ok(self.granted(&mut doubt, req, grant, 1, None));
            }
            let context = self.context(&resp, 1);
            let Some(kv) = Self::got(&resp, 0).into_iter().next() else {
                continue; // deleted since: try to create it again
            };
            let held = self.judge(name, &kv, &context)?;
            let step = if held.expired {
                AcquireStep::NewGrant
            } else {
                req.step(Some(&held.record))
            };
            let request_key = self.layout.request(kv.create_revision());
            // The request key as judged: a reentrant refresh or a take-over goes ahead only
            // if it did not change since (in particular, did not become forceful).
            let request_unchanged =
                Compare::mod_revision(request_key.clone(), CompareOp::Equal, held.request_rev);
            match step {
                AcquireStep::Held => return Ok(AcquireOutcome::Held(held.record)),
                AcquireStep::Extend => {
                    // Reentrant: rewrite the key (fresh ttl, session, note), keeping its
                    // create revision and so its token, its priority and its pending request
                    // (moved to the session along with the key).
                    let value = GrantValue {
                        note: req.note.clone().or(held.value.note.clone()),
                        priority: held.value.priority,
                        cleanup_ms: held.value.cleanup_ms,
                        ..value.clone()
                    };
                    let mut ops = vec![
                        put_leased(key.clone(), value.encode(), session.id),
                        put_leased(heartbeat.clone(), req.owner.clone(), session.id),
                    ];
                    if let Some(p) = &held.pending {
                        ops.push(put_leased(request_key.clone(), p.encode(), session.id));
                    }
                    let sent = self.clock.now();
                    let resp = self
                        .txn(
                            Txn::new()
                                .when([
                                    Compare::mod_revision(
                                        key.clone(),
                                        CompareOp::Equal,
                                        kv.mod_revision(),
                                    ),
                                    request_unchanged,
                                ])
                                .and_then(ops),
                            "acquire (reentrant)",
                            &key,
                        )
                        .await?;
                    if resp.succeeded() {
                        if let Err(went_back) = self.clock.fresh(kv.create_revision()) {
                            // A grant of the forgotten history: never handed out again.
                            self.undo_create_at(&key, kv.create_revision()).await;
                            return Err(state_lost(went_back));
                        }
                        let version = kv.version() as u64 + 1;
                        let request = held.pending.as_ref().map(|p| p.request.clone());
                        let grant = (session.id, value, kv.create_revision(), sent);
                        return Ok(self.granted(&mut doubt, req, grant, version, request));
                    }
                }
                AcquireStep::NewGrant => {
                    // Expired, or an emergency request over a lower priority: delete the old
                    // grant and its request if nothing changed since it was judged, then
                    // create a new one (new create revision, so a new token). etcd rejects a
                    // put and a delete of one key in one transaction, hence two steps; whoever
                    // creates the key first after the delete holds the lease, which is right
                    // for an expired grant (an emergency request judges anew and takes a
                    // lower priority over again). Another instance of the same owner never
                    // gets here: it is refused like another owner (`AcquireStep::Held`).
                    let mut guards = vec![
                        Compare::mod_revision(key.clone(), CompareOp::Equal, kv.mod_revision()),
                        request_unchanged,
                    ];
                    // A grant forced out keeps its session's heartbeat going: not compared.
                    if held.heartbeat > 0 && !held.forced_out {
                        guards.push(Compare::mod_revision(
                            self.layout.session(kv.lease()),
                            CompareOp::Equal,
                            held.heartbeat,
                        ));
                    }
                    self.txn(
                        Txn::new().when(guards).and_then([
                            TxnOp::delete(key.clone(), None),
                            TxnOp::delete(request_key, None),
                        ]),
                        "acquire (take over)",
                        &key,
                    )
                    .await?;
                }
            }
        }
        Err(StoreError::unavailable(
            "etcd",
            format!("acquire {key}: lost {RACES} races with other clients in a row"),
        ))
    }

    /// Deletes the key a transaction whose revision went back created: a grant in a history
    /// this client does not trust, which nobody will believe. Only at its revision, so that
    /// nothing else is touched; best effort (left behind, it ends with the session).
    async fn undo_create(&self, key: &str, resp: &TxnResponse) {
        let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        self.undo_create_at(key, revision).await;
    }

    /// Deletes `key` if it was created at `revision` (best effort).
    async fn undo_create_at(&self, key: &str, revision: i64) {
        let undo = Txn::new()
            .when([Compare::create_revision(
                key.to_string(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([TxnOp::delete(key.to_string(), None)]);
        let undone = self
            .txn_unordered(undo, "undo a grant", key)
            .await
            .map(|r| r.succeeded());
        tracing::warn!(
            key,
            revision,
            ?undone,
            "grant made in a history that went back: deleted"
        );
    }

    /// Remembers the grant `(session, value, token, sent)` made by an acquire whose write was
    /// sent at `sent`, and answers it.
    fn granted(
        &self,
        doubt: &mut Doubt<'_>,
        req: &AcquireRequest,
        (session, value, token, sent): (i64, GrantValue, i64, Instant),
        version: u64,
        request: Option<PreemptionRequest>,
    ) -> AcquireOutcome {
        let record = record_of(&req.name, &value, token, req.ttl, version, request);
        self.local.remember(
            &req.name,
            LocalGrant {
                owner: req.owner.clone(),
                token,
                session,
                value,
                verified: true,
                confirmed: sent,
            },
        );
        doubt.settle();
        AcquireOutcome::Granted(record)
    }

    async fn renew(
        &self,
        owner: &str,
        leases: &[HeldLease],
        ttl: Duration,
    ) -> Result<Vec<Renewal>, StoreError> {
        let sent = self.clock.now();
        let local: Vec<Option<LocalGrant>> = leases
            .iter()
            .map(|l| {
                self.local
                    .get(&l.name)
                    .filter(|g| g.owner == owner && g.token as u64 == l.token.get())
            })
            .collect();
        if local.iter().all(Option::is_none) {
            return Ok(vec![Renewal::NotHeld; leases.len()]);
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
        // confirmed, so a takeover that confirmed after it is seen as a missing key. The
        // pending preemption requests are read in the same transaction, at the heartbeat's
        // revision: a grant with a forceful one is refused (see [`crate::preempt`]). So are
        // the keys of unverified grants on this session (their create revision is compared
        // below), and the orphans the last renewal found are deleted in it: no heartbeat
        // keeps them alive any more (see [`crate::local`]).
        let heartbeat = self.layout.session(session.id);
        let unverified: Vec<usize> = (0..leases.len())
            .filter(|&i| {
                local[i]
                    .as_ref()
                    .is_some_and(|g| !g.verified && g.session == session.id)
            })
            .collect();
        let mut ops = vec![
            put_leased(heartbeat.clone(), owner, session.id),
            self.requests_op(),
        ];
        ops.extend(
            unverified
                .iter()
                .map(|&i| TxnOp::get(self.layout.lease(&leases[i].name), None)),
        );
        ops.extend(self.local.sweep(&self.layout, session.id, self.clock.now()));
        let beat = self
            .txn(Txn::new().and_then(ops), "renew (heartbeat)", &heartbeat)
            .await?;
        let requests = self.requests(Self::got(&beat, 1));
        // The unverified grants whose key is not theirs any more (another create revision).
        let replaced: HashSet<usize> = unverified
            .iter()
            .enumerate()
            .filter(|&(at, &i)| {
                let token = local[i].as_ref().map_or(0, |g| g.token);
                !Self::got(&beat, 2 + at)
                    .first()
                    .is_some_and(|kv| kv.create_revision() == token && kv.lease() == session.id)
            })
            .map(|(_, &i)| i)
            .collect();
        let attached = self
            .client
            .lease_client()
            .time_to_live(session.id, Some(LeaseTimeToLiveOptions::new().with_keys()))
            .await
            .map_err(|e| etcd_error("renew (read attached keys)", &heartbeat, e))?;
        let listed = attached.header().map(|h| h.revision());
        if let Some(revision) = listed {
            self.clock.saw(revision);
        }
        let attached: HashSet<&[u8]> = attached.keys().iter().map(Vec::as_slice).collect();
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let mut answers = Vec::with_capacity(leases.len());
        let mut moves = Vec::new();
        for (i, (lease, grant)) in leases.iter().zip(local).enumerate() {
            let key = self.layout.lease(&lease.name);
            let Some(g) = grant else {
                answers.push(Renewal::NotHeld);
                continue;
            };
            let request = match requests.get(&g.token) {
                Some(kv) => Some((RequestValue::decode(kv.key(), kv.value())?, kv.clone())),
                None => None,
            };
            answers.push(match request {
                _ if expired.contains(&g.session) => Renewal::NotHeld,
                _ if g.session == session.id
                    && (replaced.contains(&i) || !attached.contains(key.as_bytes())) =>
                {
                    self.local.forget(&lease.name, g.token);
                    Renewal::NotHeld
                }
                Some((r, _)) if r.request.forceful => Renewal::Refused(r.request),
                request if g.session == session.id => {
                    self.local.confirm(&lease.name, g.token, sent);
                    Renewal::Renewed {
                        request: request.map(|(r, _)| r.request),
                    }
                }
                request => {
                    // Granted under another time-to-live: move the key to this session
                    // (a put keeps its create revision, so its token), with its request.
                    moves.push((i, lease.name.clone(), key, g, request));
                    Renewal::NotHeld
                }
            });
        }
        // Without the listing's revision, nothing can be told unchanged since: no sweep.
        if let Some(listed) = listed {
            let listing = (session.id, listed);
            let now = self.clock.now();
            self.local
                .find_orphans(&self.layout, listing, attached.into_iter(), now);
        }
        let moved: Vec<_> = stream::iter(moves.into_iter().map(|(i, name, key, g, request)| {
            self.move_grant(i, name, key, g, request, ttl_ms, (session.id, sent))
        }))
        .buffer_unordered(MOVES_IN_FLIGHT)
        .collect()
        .await;
        for r in moved {
            let (i, answer) = r?;
            answers[i] = answer;
        }
        Ok(answers)
    }

    /// Moves grant `g` of `name` (and its non-forceful request, if any) to session
    /// `session_id`, if neither changed since the renewal's heartbeat (of the renewal sent
    /// at `sent`) read them.
    #[allow(clippy::too_many_arguments)]
    async fn move_grant(
        &self,
        i: usize,
        name: String,
        key: String,
        g: LocalGrant,
        request: Option<(RequestValue, KeyValue)>,
        ttl_ms: u64,
        (session_id, sent): (i64, Instant),
    ) -> Result<(usize, Renewal), StoreError> {
        let value = GrantValue {
            ttl_ms,
            ..g.value.clone()
        };
        let request_key = self.layout.request(g.token);
        let seen = request.as_ref().map_or(0, |(_, kv)| kv.mod_revision());
        let mut ops = vec![put_leased(key.clone(), value.encode(), session_id)];
        if let Some((r, _)) = &request {
            ops.push(put_leased(request_key.clone(), r.encode(), session_id));
        }
        let resp = self
            .txn(
                Txn::new()
                    .when([
                        Compare::create_revision(key.clone(), CompareOp::Equal, g.token),
                        Compare::lease(key.clone(), CompareOp::Equal, g.session),
                        Compare::mod_revision(request_key, CompareOp::Equal, seen),
                    ])
                    .and_then(ops)
                    .or_else([TxnOp::get(key.clone(), None)]),
                "renew (move to session)",
                &key,
            )
            .await?;
        if resp.succeeded() {
            self.local.remember(
                &name,
                LocalGrant {
                    session: session_id,
                    value,
                    verified: true,
                    confirmed: sent,
                    ..g
                },
            );
            return Ok((
                i,
                Renewal::Renewed {
                    request: request.map(|(r, _)| r.request),
                },
            ));
        }
        let still = Self::got(&resp, 0)
            .first()
            .is_some_and(|kv| kv.create_revision() == g.token && kv.lease() == g.session);
        if still {
            // Only the request changed meanwhile: unknown for now, the next renewal knows.
            return Err(StoreError::unavailable(
                "etcd",
                format!(
                    "renew {key}: its preemption request changed while the grant moved to \
                     another session"
                ),
            ));
        }
        Ok((i, Renewal::NotHeld))
    }

    async fn release(
        &self,
        name: &str,
        owner: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        let key = self.layout.lease(name);
        let token = i64::try_from(token.get()).unwrap_or(i64::MAX);
        let local = self
            .local
            .get(name)
            .filter(|g| g.owner == owner && g.token == token);
        // Forgotten first: if the release fails, nothing renews the grant any more and its
        // key, an orphan, is deleted with a later heartbeat of its session.
        self.local.forget(name, token);
        if let Some(g) = local {
            // Fast path: the grant this client wrote, compared as written.
            let when = [
                Compare::create_revision(key.clone(), CompareOp::Equal, token),
                Compare::value(key.clone(), CompareOp::Equal, g.value.encode()),
            ];
            if self.delete_grant_when(&key, token, when).await? {
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
            let when = [Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                kv.mod_revision(),
            )];
            if self.delete_grant_when(&key, token, when).await? {
                return Ok(true);
            }
        }
        Err(StoreError::unavailable(
            "etcd",
            format!("release {key}: lost {RACES} races with other clients in a row"),
        ))
    }

    pub(crate) async fn read(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError> {
        let key = self.layout.lease(name);
        let (kvs, context) = self
            .snapshot(TxnOp::get(key.clone(), None), "read", &key)
            .await?;
        match kvs.first() {
            None => Ok(None),
            Some(kv) => {
                let j = self.judge(name, kv, &context)?;
                Ok((!j.expired).then_some(j.record))
            }
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        let from = self.layout.lease(prefix);
        let (kvs, context) = self
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
            let j = self.judge(name, kv, &context)?;
            if !j.expired {
                out.push(j.record);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

/// The record of grant `value` of `name` with token `token`.
pub(crate) fn record_of(
    name: &str,
    value: &GrantValue,
    token: i64,
    expires_in: Duration,
    version: u64,
    request: Option<PreemptionRequest>,
) -> LeaseRecord {
    LeaseRecord {
        name: name.to_string(),
        owner: value.owner.clone(),
        instance: value.instance.clone(),
        token: FencingToken::new(token as u64),
        expires_in,
        version,
        note: value.note.clone(),
        priority: value.priority,
        cleanup_timeout: Duration::from_millis(value.cleanup_ms),
        request,
    }
}

/// Ids written per transaction by `remember`: etcd refuses transactions of more than
/// `--max-txn-ops` operations (128 by default).
const REMEMBER_OPS: usize = 128;

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
            durable: true,
        }
    }

    /// `Ok(Granted)`: the key was created (new token = its create revision), rewritten for
    /// the same owner and instance (same token), or taken over from an expired grant or,
    /// in an emergency, from a lower priority (new token). `Ok(Held)`: another owner's or
    /// another instance's unexpired grant. `Err`: unknown (unreachable, timed out, or lost
    /// too many races); a key it may have written lapses after its ttl (module
    /// [`crate::local`]).
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
        self.inner.renew(owner, leases, ttl).await
    }

    /// `Ok(true)`: the key held by `owner` with create revision `token` was deleted.
    /// `Ok(false)`: no such grant (another holder's, a later grant, or none).
    async fn release(
        &self,
        name: &str,
        owner: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        self.inner.release(name, owner, token).await
    }

    async fn read(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError> {
        self.inner.read(name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        self.inner.list(prefix).await
    }

    tenure_lease::capability_accessors!(
        fair_queue,
        preemption_requests,
        holder_watch,
        remembered_ids,
        grant_changes
    );
}

#[async_trait]
impl GrantChanges for EtcdStore {
    /// One range read of the holder keys under the prefix that returns their count and the
    /// one written last (sorted by mod revision, limit 1, keys only): a grant made,
    /// rewritten (a reentrant acquire, a move to another session), released or deleted
    /// with its session moves one of the two (a write has a revision above every earlier
    /// one; a deletion alone lowers the count), while renewals write only heartbeat keys and
    /// move neither. A crashed holder's grant shows as ended once etcd deletes its key with
    /// its session (at most about two seconds past its ttl), where a listing, which judges
    /// expiry on the revision clock, may drop it up to that much earlier. Versions:
    /// `changes` the last write's mod revision, `at` the count.
    async fn changes_since(
        &self,
        prefix: &str,
        since: Option<ChangeVersion>,
    ) -> Result<Changes, StoreError> {
        let from = self.inner.layout.lease(prefix);
        let last = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_sort(SortTarget::Mod, SortOrder::Descend)
            .with_limit(1);
        let resp = self
            .inner
            .txn(
                Txn::new().and_then([TxnOp::get(from.clone(), Some(last))]),
                "changes",
                &from,
            )
            .await?;
        let Some(TxnOpResponse::Get(got)) = resp.op_responses().into_iter().next() else {
            return Err(StoreError::backend(
                "etcd",
                format!("changes under {from}: the transaction answered no range"),
            ));
        };
        let version = ChangeVersion {
            changes: got.kvs().first().map_or(0, |kv| kv.mod_revision()) as u64,
            at: got.count(),
        };
        Ok(match since {
            Some(since) if since == version => Changes::Unchanged(version),
            _ => Changes::Changed(version),
        })
    }
}

#[async_trait]
impl FairQueue for EtcdStore {
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
}

#[async_trait]
impl PreemptionRequests for EtcdStore {
    /// Puts the request key of grant `token` (attached to the holder's session) if the
    /// grant is current and the request key unchanged since it was read (module
    /// [`crate::preempt`]). A forceful request ends the grant, for every client, one ttl
    /// after the revision it was recorded at, however the holder's session lives on.
    async fn request_preemption(
        &self,
        name: &str,
        token: FencingToken,
        request: &PreemptionRequest,
    ) -> Result<PreemptAnswer, StoreError> {
        self.inner.request_preemption(name, token, request).await
    }

    /// Deletes the request key of grant `token` if it holds `by`'s request.
    async fn withdraw_preemption(
        &self,
        name: &str,
        token: FencingToken,
        by: &str,
    ) -> Result<bool, StoreError> {
        self.inner.withdraw_preemption(name, token, by).await
    }
}

#[async_trait]
impl HolderWatch for EtcdStore {
    async fn watch(&self, prefix: &str) -> Result<tenure_lease::WatchReceiver, StoreError> {
        crate::watch::watch(&self.inner.client, &self.inner.layout, prefix).await
    }
}

#[async_trait]
impl RememberedIds for EtcdStore {
    /// One transaction per 128 ids, each guarded by the grant's holder key (its create
    /// revision is `token`, as [`EtcdStore::fence`]); the ids' keys are attached to no
    /// session, so they never expire. A change of more than 128 ids may be applied in
    /// part: `Ok(false)` once a part finds the grant gone. `owner` is not checked: the
    /// token names the grant.
    async fn remember(
        &self,
        name: &str,
        _owner: &str,
        token: FencingToken,
        change: &RememberChange,
    ) -> Result<bool, StoreError> {
        if change.is_empty() {
            // Nothing to write: answer whether the grant is current, as a write would.
            let txn = Txn::new().when([self.fence(name, token)]);
            return Ok(self
                .inner
                .txn(txn, "remembering ids of", name)
                .await?
                .succeeded());
        }
        let prefix = self.inner.layout.remembered(name);
        for part in change.parts(REMEMBER_OPS) {
            let ops = part
                .removed()
                .iter()
                .map(|id| TxnOp::delete(format!("{prefix}{id}"), None))
                .chain(
                    part.added()
                        .iter()
                        .map(|id| TxnOp::put(format!("{prefix}{id}"), Vec::new(), None)),
                )
                .collect::<Vec<_>>();
            let txn = Txn::new().when([self.fence(name, token)]).and_then(ops);
            let resp = self.inner.txn(txn, "remembering ids of", name).await?;
            if !resp.succeeded() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    async fn remembered(&self, name: &str) -> Result<Vec<String>, StoreError> {
        let prefix = self.inner.layout.remembered(name);
        let get = TxnOp::get(
            prefix.as_str(),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        );
        let resp = self
            .inner
            .txn(
                Txn::new().and_then([get]),
                "reading the ids remembered with",
                name,
            )
            .await?;
        // Keys come sorted by bytes: the ids' order.
        Ok(Inner::got(&resp, 0)
            .iter()
            .filter_map(|kv| {
                std::str::from_utf8(kv.key())
                    .ok()?
                    .strip_prefix(prefix.as_str())
                    .map(String::from)
            })
            .collect())
    }
}
