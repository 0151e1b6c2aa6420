//! The PostgreSQL lease store and its factory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use deadpool::managed::{Object, Pool};
use deadpool_postgres::{Manager, ManagerConfig, RecyclingMethod, Runtime};
use futures::future::BoxFuture;
use tenure_lease::{
    AcquireOutcome, AcquireRequest, Capabilities, ChangeVersion, Changes, ConfigError, FairQueue,
    FencingToken, GrantChanges, HeldLease, HolderClock, LeaseRecord, LeaseSection, LeaseStore,
    PreemptAnswer, PreemptionRequest, PreemptionRequests, RememberChange, RememberedIds, Renewal,
    StoreError, StoreFactory,
};
use tokio::time::{Instant, sleep, timeout};
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};

use crate::error::{self, Failure, STORE};
use crate::fair::Listener;
use crate::fence::Fence;
use crate::options::{PostgresOptions, REFERENCE};
use crate::pool::{Connector, Pooled};
use crate::schema::migrate;
use crate::sql::{Sql, Statements};

/// Pause before the first retry of a transient failure; doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(20);
const MAX_PAUSE: Duration = Duration::from_millis(500);
/// How often an acquire re-asks when the holder it conflicted with released in between.
pub(crate) const ACQUIRE_RACES: usize = 8;

/// A lease store in one PostgreSQL table. Cloning shares the connection pool.
#[derive(Clone)]
pub struct PostgresStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pool: Pool<Connector>,
    pub(crate) statements: Statements,
    pub(crate) options: PostgresOptions,
    pub(crate) server: String,
    /// The highest token this client has seen (the token sequence's high-water mark).
    seen: AtomicI64,
    /// When this client found the sequence gone back, and the high-water mark it was below.
    went_back: Mutex<Option<(i64, Instant)>>,
    /// `observed-expiry`: per name, the expired row (token, version) and when this client
    /// first saw it so.
    observed: Mutex<HashMap<String, (i64, i64, Instant)>>,
    /// The clock of `went_back` and `observed`: the holder clock, which counts host
    /// suspend (the holders' deadlines and the server's clock go on while this host
    /// sleeps).
    pub(crate) clock: HolderClock,
    /// The connection this client's fair waiters LISTEN on, opened at the first fair
    /// acquire and again when it was lost.
    pub(crate) listener: tokio::sync::Mutex<Option<Arc<Listener>>>,
}

/// Most sequence values taken in one go to pass the high-water mark after the sequence
/// went back; a larger gap is left to the operator (`setval`).
const MAX_ADVANCE: i64 = 1_000_000;

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("options", &self.inner.options)
            .finish()
    }
}

/// One attempt of an operation on a pooled connection. `Err((sent, e))`: `sent` says
/// whether the statement that changes something may have reached the server.
type Attempt<'c, T> = BoxFuture<'c, Result<T, (bool, tokio_postgres::Error)>>;

/// Ties an attempt's connection borrow `'c` to the data `'a` the attempt captures (its
/// type implies `'a: 'c`, which a plain `for<'c>` bound cannot say).
type Scope<'c, 'a> = std::marker::PhantomData<&'c &'a ()>;

/// Methods that run one prepared statement with the pooled connection's method of the same
/// name (`query`, `query_one`, `execute`), each as [`PostgresStore::run`] runs an attempt:
/// within the store's patience, retried after it was sent only when `idempotent`.
macro_rules! statement_runs {
    ($($(#[$doc:meta])* $method:ident -> $answer:ty;)+) => {$(
        $(#[$doc])*
        pub(crate) async fn $method(
            &self,
            sql: Sql,
            params: &[&(dyn ToSql + Sync)],
            idempotent: bool,
        ) -> Result<$answer, StoreError> {
            let statements = &self.inner.statements;
            self.run(self.patience(), idempotent, |c, _| {
                Box::pin(async move {
                    let stmt = c.statement(sql, statements).await.map_err(|e| (false, e))?;
                    c.$method(&stmt, params).await.map_err(|e| (true, e))
                })
            })
            .await
        }
    )+};
}

impl PostgresStore {
    /// Connects to the server of `options` and creates the lease table if it is missing.
    /// Tries for `connect-timeout` (at least the operation timeout) before giving up.
    pub async fn connect(options: PostgresOptions) -> Result<PostgresStore, StoreError> {
        PostgresStore::connect_with_clock(options, HolderClock::host()).await
    }

    /// [`PostgresStore::connect`] measuring the times of its own rules (the quiet period
    /// after the token sequence went back, `observed-expiry`) on `clock`: the holder clock
    /// of the Lease API, which counts host suspend (tests inject [`HolderClock::manual`]).
    pub async fn connect_with_clock(
        options: PostgresOptions,
        clock: HolderClock,
    ) -> Result<PostgresStore, StoreError> {
        let server = options.server();
        let manager = Manager::from_config(
            options.connection.clone(),
            NoTls,
            ManagerConfig {
                // A closed connection is noticed without a round trip; one that died
                // silently fails its next statement, which is then retried or reported.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(Connector::new(manager))
            .max_size(options.pool_size)
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| error::bad_value(&server, format!("connection pool: {e}")))?;
        let store = PostgresStore {
            inner: Arc::new(Inner {
                pool,
                statements: Statements::new(&options.schema, &options.table),
                options,
                server,
                seen: AtomicI64::new(0),
                went_back: Mutex::new(None),
                observed: Mutex::default(),
                clock,
                listener: tokio::sync::Mutex::default(),
            }),
        };
        let patience = store
            .inner
            .options
            .connect_timeout
            .max(store.inner.options.operation_timeout);
        let statements = &store.inner.statements;
        store
            .run(patience, true, |c, _| {
                Box::pin(async move { migrate(c, statements).await.map_err(|e| (true, e)) })
            })
            .await?;
        Ok(store)
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &PostgresOptions {
        &self.inner.options
    }

    /// The SQL the store runs.
    pub fn statements(&self) -> &Statements {
        &self.inner.statements
    }

    /// A pooled connection to the lease database, for writes guarded by a [`Fence`]. It
    /// dereferences to deadpool-postgres's client.
    pub async fn connection(&self) -> Result<Pooled, StoreError> {
        let server = &self.inner.server;
        match timeout(self.inner.options.operation_timeout, self.inner.pool.get()).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(error::from_pool(server, e).error),
            Err(_) => Err(error::timed_out(
                server,
                self.inner.options.operation_timeout,
            )),
        }
    }

    /// The token check for writes in the caller's own transactions on this database.
    pub fn fence(&self) -> Fence {
        Fence::new(&self.inner.options.schema, &self.inner.options.table)
    }

    /// Runs `attempt` on a pooled connection until it succeeds, fails for good, or
    /// `patience` has passed. Transient failures are retried, after a statement may have
    /// been sent only when `idempotent` (asking again cannot change the answer's meaning).
    pub(crate) async fn run<'a, T>(
        &self,
        patience: Duration,
        idempotent: bool,
        attempt: impl for<'c> Fn(&'c Pooled, Scope<'c, 'a>) -> Attempt<'c, T>,
    ) -> Result<T, StoreError> {
        let server = &self.inner.server;
        let deadline = Instant::now() + patience;
        let mut pause = FIRST_PAUSE;
        let mut last: Option<StoreError> = None;
        loop {
            let unknown = |last: Option<StoreError>| {
                last.unwrap_or_else(|| error::timed_out(server, patience))
            };
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(unknown(last));
            }
            let failure: Failure = match timeout(remaining, self.inner.pool.get()).await {
                Err(_) => return Err(unknown(last)),
                Ok(Err(e)) => error::from_pool(server, e),
                Ok(Ok(client)) => {
                    match timeout(remaining, attempt(&client, Scope::default())).await {
                        Ok(Ok(value)) => return Ok(value),
                        Err(_) => {
                            // The server may still answer on this connection later: close it.
                            drop(Object::take(client));
                            return Err(error::timed_out(server, patience));
                        }
                        Ok(Err((sent, e))) => {
                            let failure = error::from_pg(server, e);
                            if failure.broken {
                                drop(Object::take(client));
                            }
                            if sent && !idempotent {
                                return Err(failure.error);
                            }
                            failure
                        }
                    }
                }
            };
            if !failure.transient {
                return Err(failure.error);
            }
            tracing::debug!(error = %failure.error, "postgres lease store: transient failure, retrying");
            last = Some(failure.error);
            let remaining = deadline.saturating_duration_since(Instant::now());
            sleep(pause.min(remaining)).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    pub(crate) fn patience(&self) -> Duration {
        self.inner.options.operation_timeout
    }

    pub(crate) fn bad(&self, e: impl std::fmt::Display) -> StoreError {
        error::bad_value(&self.inner.server, format!("lease row: {e}"))
    }

    /// A priority column (`numeric(20)` as text).
    fn priority(&self, text: &str) -> Result<u64, StoreError> {
        text.parse()
            .map_err(|_| self.bad(format!("priority {text:?} is not a u64")))
    }

    fn decode(&self, row: &Row, at: usize) -> Result<LeaseRecord, StoreError> {
        let bad = |e: tokio_postgres::Error| self.bad(e);
        let token: i64 = row.try_get(at + 3).map_err(bad)?;
        self.inner.seen.fetch_max(token, Ordering::Relaxed);
        let expires_in_us: i64 = row.try_get(at + 4).map_err(bad)?;
        let version: i64 = row.try_get(at + 5).map_err(bad)?;
        let priority: String = row.try_get(at + 7).map_err(bad)?;
        let cleanup_us: i64 = row.try_get(at + 8).map_err(bad)?;
        Ok(LeaseRecord {
            name: row.try_get(at).map_err(bad)?,
            owner: row.try_get(at + 1).map_err(bad)?,
            instance: row.try_get(at + 2).map_err(bad)?,
            token: FencingToken::new(
                u64::try_from(token).map_err(|_| self.bad(format!("negative token {token}")))?,
            ),
            expires_in: Duration::from_micros(expires_in_us.max(0) as u64),
            version: version.max(0) as u64,
            note: row.try_get(at + 6).map_err(bad)?,
            priority: self.priority(&priority)?,
            cleanup_timeout: Duration::from_micros(cleanup_us.max(0) as u64),
            request: self.decode_request(row, at + 9)?,
        })
    }

    /// The pending request in the five columns from `at` (`request_by` NULL: none).
    fn decode_request(
        &self,
        row: &Row,
        at: usize,
    ) -> Result<Option<PreemptionRequest>, StoreError> {
        let bad = |e: tokio_postgres::Error| self.bad(e);
        let Some(by) = row.try_get::<_, Option<String>>(at).map_err(bad)? else {
            return Ok(None);
        };
        let priority: Option<String> = row.try_get(at + 2).map_err(bad)?;
        let forceful: Option<bool> = row.try_get(at + 3).map_err(bad)?;
        Ok(Some(PreemptionRequest {
            by,
            instance: row
                .try_get::<_, Option<String>>(at + 1)
                .map_err(bad)?
                .unwrap_or_default(),
            priority: self.priority(priority.as_deref().unwrap_or("0"))?,
            forceful: forceful.unwrap_or(false),
            note: row.try_get(at + 4).map_err(bad)?,
        }))
    }

    statement_runs! {
        /// Runs `sql` with `params` as [`run`](Self::run) does, within the store's
        /// patience and retried after it was sent only when `idempotent`: the rows it
        /// answers.
        query -> Vec<Row>;
        /// [`query`](Self::query) for a statement that answers exactly one row; another
        /// number of rows is an error.
        query_one -> Row;
        /// [`query`](Self::query) for a statement whose answer is the number of rows it
        /// changed.
        execute -> u64;
    }

    /// Runs `sql` (one row: a flag, then a record) with `params`, idempotently.
    async fn flagged_record(
        &self,
        sql: Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<(bool, LeaseRecord)>, StoreError> {
        let rows = self.query(sql, params, true).await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let flag: bool = row.try_get(0).map_err(|e| self.bad(e))?;
        Ok(Some((flag, self.decode(row, 1)?)))
    }
    /// Refuses while the token sequence went back less than `ttl` ago: grants the server
    /// forgot may still be believed by their holders.
    fn quiet(&self, ttl: Duration) -> Result<(), StoreError> {
        let went_back = *self
            .inner
            .went_back
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let since = |at: Instant| self.inner.clock.now().saturating_duration_since(at);
        match went_back {
            Some((mark, at)) if since(at) < ttl => Err(StoreError::state_lost(
                STORE,
                format!(
                    "the token sequence of {} went back below {mark} {} ago (a fail-over to a replica that had not received the latest commits, or a restored backup): grants the server forgot may still be believed, so no new grant for one ttl ({})",
                    self.inner.server,
                    humantime::format_duration(Duration::from_millis(since(at).as_millis() as u64)),
                    humantime::format_duration(ttl)
                ),
            )),
            _ => Ok(()),
        }
    }

    /// A new grant got token `record.token`, not above `seen`, a token this client saw
    /// before: the sequence went back (asynchronous fail-over, restored backup). The grant
    /// is released unused, the sequence advanced past `seen`, and acquires are refused for
    /// one ttl ([`PostgresStore::quiet`]).
    async fn went_back(&self, req: &AcquireRequest, record: &LeaseRecord, seen: i64) -> StoreError {
        let token = record.token.get() as i64;
        {
            let mut went_back = self
                .inner
                .went_back
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            // Once per high-water mark: acquires that catch up on the same gap do not
            // start the wait again.
            if went_back.is_none_or(|(mark, _)| mark != seen) {
                *went_back = Some((seen, self.inner.clock.now()));
            }
        }
        let released = self.release(&req.name, &req.owner, record.token).await;
        let gap = seen - token;
        let advanced = if gap <= MAX_ADVANCE {
            self.query_one(Sql::Advance, &[&gap], false)
                .await
                .map(|row| row.get::<_, Option<i64>>(0))
        } else {
            Ok(None)
        };
        tracing::error!(lease = %req.name, token, seen, ?released, ?advanced, "the token sequence went back");
        StoreError::state_lost(
            STORE,
            format!(
                "the token sequence of {} went back: a new grant of `{}` got token {token}, but token {seen} was issued before (a fail-over to a replica that had not received the latest commits, or a restored backup); the grant was released unused, {}, and no new grant is made for one ttl",
                self.inner.server,
                req.name,
                match advanced {
                    Ok(Some(last)) => format!("the sequence advanced to {last}"),
                    _ => format!(
                        "the sequence could not be advanced: run SELECT setval('{}.{}_token', {seen})",
                        self.inner.options.schema, self.inner.options.table
                    ),
                }
            ),
        )
    }

    /// The contender rule of `observed-expiry`: a row the server says expired (not
    /// released) may be taken over only once this client has seen it, with the same token
    /// and version, at least one ttl ago. Its holder's last renewal was processed before
    /// this client first read that version, so it was sent before, and the holder stopped
    /// believing less than one ttl after: no comparison with the server's clock.
    async fn observe(&self, req: &AcquireRequest) -> Result<Observed, StoreError> {
        let name = &req.name;
        let rows = self.query(Sql::Observe, &[name], true).await?;
        let Some(row) = rows.first() else {
            self.forget_observed(name);
            return Ok(Observed::Takeover(None));
        };
        let record = self.decode(row, 0)?;
        let live: bool = row.try_get(14).map_err(|e| self.bad(e))?;
        let released: bool = row.try_get(15).map_err(|e| self.bad(e))?;
        if live || released {
            self.forget_observed(name);
            return Ok(Observed::Takeover(None));
        }
        let seen = (record.token.get() as i64, record.version as i64);
        let mut observed = self
            .inner
            .observed
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let since = match observed.get(name) {
            Some((t, v, at)) if (*t, *v) == seen => *at,
            _ => {
                let now = self.inner.clock.now();
                observed.insert(name.clone(), (seen.0, seen.1, now));
                now
            }
        };
        let waited = self.inner.clock.now().saturating_duration_since(since);
        if waited >= req.ttl {
            return Ok(Observed::Takeover(Some(seen)));
        }
        Ok(Observed::Wait(Box::new(LeaseRecord {
            expires_in: req.ttl - waited,
            ..record
        })))
    }

    /// One acquire statement: the plain one, or for `waiter` (a `seq` in line) the fair one
    /// (granted only while that waiter is first in line, whose row it then removes). With
    /// `observed-expiry`, the contender rule first ([`PostgresStore::observe`]). A new grant
    /// whose token is not above every token this client has seen means the sequence went
    /// back: see [`PostgresStore::went_back`]. `Ok(None)`: no answer to give yet (the lease
    /// was released between the insert and the look-up, or, guarded, changed since it was
    /// observed; the waiter was not first in line): ask again.
    pub(crate) async fn acquire_once(
        &self,
        req: &AcquireRequest,
        waiter: Option<i64>,
    ) -> Result<Option<AcquireOutcome>, StoreError> {
        self.quiet(req.ttl)?;
        let sql = match waiter {
            None => Sql::Acquire,
            Some(_) => Sql::FairAcquire,
        };
        let ttl = ttl_us(req.ttl);
        let priority = req.priority.to_string();
        let cleanup = ttl_us(req.cleanup_timeout);
        // The emergency rule's own half (the statement compares the priorities): a request
        // that would take over even the lowest-priority grant.
        let emergency = req.takes_over(0);
        let seen = self.inner.seen.load(Ordering::Relaxed);
        let guard = match self.inner.options.observed_expiry {
            true => match self.observe(req).await? {
                Observed::Takeover(guard) => guard,
                Observed::Wait(record) => return Ok(Some(AcquireOutcome::Held(*record))),
            },
            false => None,
        };
        let (token, version) = (guard.map(|g| g.0), guard.map(|g| g.1));
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![
            &req.name,
            &req.owner,
            &req.instance,
            &ttl,
            &req.note,
            &priority,
            &cleanup,
            &emergency,
            &token,
            &version,
        ];
        if let Some(seq) = &waiter {
            params.push(seq);
        }
        match self.flagged_record(sql, &params).await? {
            Some((true, record)) if record.version == 1 && record.token.get() as i64 <= seen => {
                Err(self.went_back(req, &record, seen).await)
            }
            Some((true, record)) => {
                self.forget_observed(&req.name);
                Ok(Some(AcquireOutcome::Granted(record)))
            }
            Some((false, record)) => Ok(Some(AcquireOutcome::Held(record))),
            None => Ok(None),
        }
    }

    fn forget_observed(&self, name: &str) {
        if self.inner.options.observed_expiry {
            self.inner
                .observed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(name);
        }
    }
}

/// What the contender rule makes of a row.
enum Observed {
    /// Acquire, taking an expired grant over only if it is still (token, version).
    Takeover(Option<(i64, i64)>),
    /// Expired on the server's clock, but not yet seen unchanged for a ttl: treated as held.
    Wait(Box<LeaseRecord>),
}

/// The ttl in whole microseconds, rounded up (a grant never lives shorter than asked),
/// capped at 100 years (PostgreSQL intervals overflow far beyond).
pub(crate) fn ttl_us(ttl: Duration) -> i64 {
    const CAP: u128 = 100 * 366 * 24 * 3600 * 1_000_000;
    ttl.as_nanos().div_ceil(1000).min(CAP) as i64
}

#[async_trait]
impl LeaseStore for PostgresStore {
    fn kind(&self) -> &'static str {
        STORE
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_fencing: true,
            server_side_expiry: true,
            durable: true,
        }
    }

    /// One statement: insert the grant, or take over the row if it is expired, this
    /// instance's (and not being forcefully preempted) or, for an emergency request, of
    /// lower priority; otherwise return the current holder. With `observed-expiry`, a row
    /// the server says expired is read first and taken over only once this client has seen
    /// it unchanged for a full ttl. A new grant whose token is not above every token this
    /// client has seen means the sequence went back: see [`PostgresStore::went_back`].
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome, StoreError> {
        for _ in 0..ACQUIRE_RACES {
            if let Some(outcome) = self.acquire_once(req, None).await? {
                return Ok(outcome);
            }
        }
        Err(error::bad_value(
            &self.inner.server,
            format!("lease `{}` kept changing hands while acquiring", req.name),
        ))
    }

    /// One statement for the whole batch (`unnest` of names and tokens), however many.
    /// A grant with a forceful request pending answers `Refused` and keeps its expiry.
    async fn renew(
        &self,
        owner: &str,
        leases: &[HeldLease],
        ttl: Duration,
    ) -> Result<Vec<Renewal>, StoreError> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<&str> = leases.iter().map(|l| l.name.as_str()).collect();
        // A token beyond i64 was never issued: -1 matches nothing.
        let tokens: Vec<i64> = leases
            .iter()
            .map(|l| i64::try_from(l.token.get()).unwrap_or(-1))
            .collect();
        let ttl = ttl_us(ttl);
        let (names, tokens) = (&names, &tokens);
        let rows = self
            .query(Sql::Renew, &[&owner, names, tokens, &ttl], true)
            .await?;
        let mut held = HashMap::with_capacity(rows.len());
        for row in rows {
            let name: String = row.try_get(0).map_err(|e| self.bad(e))?;
            let token: i64 = row.try_get(1).map_err(|e| self.bad(e))?;
            let answer = match self.decode_request(&row, 2)? {
                Some(request) if request.forceful => Renewal::Refused(request),
                request => Renewal::Renewed { request },
            };
            held.insert((name, token), answer);
        }
        Ok(names
            .iter()
            .zip(tokens)
            .map(|(n, t)| {
                held.get(&(n.to_string(), *t))
                    .cloned()
                    .unwrap_or(Renewal::NotHeld)
            })
            .collect())
    }

    /// Ends the grant if `owner` holds it unexpired with `token`, and in the same statement
    /// notifies the name's fair waiters, if any are in line. Not retried once sent: a
    /// second try after a lost answer would report `false` for our own release.
    async fn release(
        &self,
        name: &str,
        owner: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        let Ok(token) = i64::try_from(token.get()) else {
            return Ok(false);
        };
        let n = self
            .execute(Sql::Release, &[&name, &owner, &token], false)
            .await?;
        Ok(n == 1)
    }

    async fn read(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError> {
        let rows = self.query(Sql::Read, &[&name], true).await?;
        rows.first().map(|r| self.decode(r, 0)).transpose()
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        let rows = match tenure_lease::names::prefix_end(prefix) {
            Some(end) => self.query(Sql::List, &[&prefix, &end], true).await?,
            None => self.query(Sql::ListFrom, &[&prefix], true).await?,
        };
        rows.iter().map(|r| self.decode(r, 0)).collect()
    }

    tenure_lease::capability_accessors!(
        fair_queue,
        preemption_requests,
        remembered_ids,
        grant_changes
    );
}

#[async_trait]
impl GrantChanges for PostgresStore {
    /// One statement reading two index ranges: the prefix's row of `<table>_change` (bumped
    /// in the statement that makes or ends a grant under it, whichever client sent it) and
    /// the grants under it whose expiry on the server's clock fell after `since` and by now
    /// (expiry writes nothing). The first check of a prefix makes its row.
    async fn changes_since(
        &self,
        prefix: &str,
        since: Option<ChangeVersion>,
    ) -> Result<Changes, StoreError> {
        let after = since.map(|v| v.at);
        let (prefix, after) = (&prefix, &after);
        let row = self.query_one(Sql::Changes, &[prefix, after], true).await?;
        let changes: Option<i64> = row.try_get(0).map_err(|e| self.bad(e))?;
        let at: i64 = row.try_get(1).map_err(|e| self.bad(e))?;
        let expired: bool = row.try_get(2).map_err(|e| self.bad(e))?;
        let version = ChangeVersion {
            changes: changes.unwrap_or_default() as u64,
            at,
        };
        Ok(match since {
            Some(since)
                if changes.is_some()
                    && !expired
                    && since.at <= at
                    && since.changes == version.changes =>
            {
                Changes::Unchanged(version)
            }
            _ => Changes::Changed(version),
        })
    }
}

#[async_trait]
impl FairQueue for PostgresStore {
    /// Joins the name's line (a row in `<table>_waiter`, ordered by its `seq`, with its own
    /// expiry, refreshed while it waits) and, once first in line, acquires as
    /// [`try_acquire`](LeaseStore::try_acquire) does, removing the row in the same
    /// statement. Waiters are woken by LISTEN/NOTIFY (a release and a departure from the
    /// line notify in their own transaction), at the holder's expiry (a lapse sends
    /// nothing), at the expiry of a waiter ahead that stopped refreshing (its process
    /// died), and at a third of the ttl to refresh their row. `Ok(Held)`: `wait` passed
    /// while another owner held the lease; `Err`: unknown, including a waiter whose row
    /// expired while queued (never granted then) and `wait` passing while earlier waiters
    /// had not reached the lease. The row is removed however this ends (also when the
    /// future is dropped: by a spawned task); if that fails it expires after the ttl.
    /// The holder instance's own fair acquire re-enters at once, without queueing.
    /// `try_acquire` does not queue: it may take a free lease ahead of waiters, as with
    /// the etcd and ZooKeeper stores.
    async fn acquire_fair(
        &self,
        req: &AcquireRequest,
        wait: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        self.fair(req, wait).await
    }
}

#[async_trait]
impl PreemptionRequests for PostgresStore {
    /// One statement: the request is set on the unexpired grant `token` if it outranks
    /// it and any other owner's pending request. A `Refused` answer whose record would
    /// have allowed it (a concurrent change the statement's snapshot did not show) is
    /// asked again.
    async fn request_preemption(
        &self,
        name: &str,
        token: FencingToken,
        request: &PreemptionRequest,
    ) -> Result<PreemptAnswer, StoreError> {
        let Ok(token) = i64::try_from(token.get()) else {
            return Ok(PreemptAnswer::Gone);
        };
        let sql = Sql::RequestPreemption;
        let priority = request.priority.to_string();
        let mut last = None;
        for _ in 0..ACQUIRE_RACES {
            let answer = self
                .flagged_record(
                    sql,
                    &[
                        &name,
                        &token,
                        &request.by,
                        &request.instance,
                        &priority,
                        &request.forceful,
                        &request.note,
                    ],
                )
                .await?;
            match answer {
                None => return Ok(PreemptAnswer::Gone),
                Some((true, record)) => return Ok(PreemptAnswer::Recorded(record)),
                Some((false, record)) => {
                    if !request.may_replace(record.priority, record.request.as_ref()) {
                        return Ok(PreemptAnswer::Refused(record));
                    }
                    last = Some(record);
                }
            }
        }
        Ok(last.map_or(PreemptAnswer::Gone, PreemptAnswer::Refused))
    }

    /// Not retried once sent: a second try after a lost answer would report `false` for
    /// our own withdrawal.
    async fn withdraw_preemption(
        &self,
        name: &str,
        token: FencingToken,
        by: &str,
    ) -> Result<bool, StoreError> {
        let Ok(token) = i64::try_from(token.get()) else {
            return Ok(false);
        };
        let n = self
            .execute(Sql::WithdrawPreemption, &[&name, &token, &by], false)
            .await?;
        Ok(n == 1)
    }
}

#[async_trait]
impl RememberedIds for PostgresStore {
    /// One statement: the grant check (its row locked until the statement commits) and
    /// every id, atomic whatever the change's size. Retried when its answer is lost:
    /// applying it again changes nothing.
    async fn remember(
        &self,
        name: &str,
        owner: &str,
        token: FencingToken,
        change: &RememberChange,
    ) -> Result<bool, StoreError> {
        let Ok(token) = i64::try_from(token.get()) else {
            return Ok(false);
        };
        let add: Vec<&str> = change.added().iter().map(String::as_str).collect();
        let remove: Vec<&str> = change.removed().iter().map(String::as_str).collect();
        let (add, remove) = (&add, &remove);
        let row = self
            .query_one(Sql::Remember, &[&name, &owner, &token, add, remove], true)
            .await?;
        row.try_get(0).map_err(|e| self.bad(e))
    }

    async fn remembered(&self, name: &str) -> Result<Vec<String>, StoreError> {
        let rows = self.query(Sql::Remembered, &[&name], true).await?;
        rows.iter()
            .map(|r| r.try_get(0).map_err(|e| self.bad(e)))
            .collect()
    }
}

/// Opens `store = "postgres"` sections. Options (defaults in the reference's
/// `[lease.postgres]`): `url`, `password`, `schema`, `table`, `pool-size`,
/// `connect-timeout`. Opening connects and creates the lease table if missing.
#[derive(Debug, Default, Clone, Copy)]
pub struct PostgresStoreFactory;

#[async_trait]
impl StoreFactory for PostgresStoreFactory {
    fn kind(&self) -> &'static str {
        STORE
    }

    fn defaults(&self) -> toml::Table {
        // The fragment is checked to parse (and to match the options' defaults) by a test.
        REFERENCE.parse().unwrap_or_default()
    }

    fn check(&self, section: &LeaseSection) -> Result<(), ConfigError> {
        PostgresOptions::from_section(section).map(drop)
    }

    async fn open(&self, section: &LeaseSection) -> Result<Arc<dyn LeaseStore>, ConfigError> {
        let options = PostgresOptions::from_section(section)?;
        let table = format!("{}.{}", options.schema, options.table);
        let store = PostgresStore::connect(options).await.map_err(|e| {
            ConfigError::invalid(
                format!("{}.url", section.key()),
                format!("cannot open the lease table {table}: {e}"),
            )
        })?;
        Ok(Arc::new(store))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rounds_up_and_is_capped() {
        assert_eq!(ttl_us(Duration::from_nanos(1)), 1);
        assert_eq!(ttl_us(Duration::from_millis(1500)), 1_500_000);
        assert!(ttl_us(Duration::MAX) > 0);
    }
}
