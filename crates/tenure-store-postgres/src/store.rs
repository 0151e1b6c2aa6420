//! The PostgreSQL lease store and its factory.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use futures::future::BoxFuture;
use tenure_lease::{
    AcquireOutcome, AcquireRequest, Capabilities, ConfigError, HeldLease, LeaseRecord,
    LeaseSection, LeaseStore, PreemptAnswer, PreemptionRequest, Renewal, StoreError, StoreFactory,
};
use tokio::time::{Instant, sleep, timeout};
use tokio_postgres::{NoTls, Row};

use crate::errors::{self, Failure, STORE};
use crate::fenced::Fence;
use crate::options::PostgresOptions;
use crate::schema::migrate;
use crate::sql::{Statements, like_prefix};

/// Pause before the first retry of a transient failure; doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(20);
const MAX_PAUSE: Duration = Duration::from_millis(500);
/// How often an acquire re-asks when the holder it conflicted with released in between.
const ACQUIRE_RACES: usize = 8;

/// A lease store in one PostgreSQL table. Cloning shares the connection pool.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    statements: Statements,
    options: PostgresOptions,
    server: String,
}

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

impl PostgresStore {
    /// Connects to the server of `options` and creates the lease table if it is missing.
    /// Tries for `connect-timeout` (at least the operation timeout) before giving up.
    pub async fn connect(options: PostgresOptions) -> Result<PostgresStore, StoreError> {
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
        let pool = Pool::builder(manager)
            .max_size(options.pool_size)
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| errors::bad_value(&server, format!("connection pool: {e}")))?;
        let store = PostgresStore {
            inner: Arc::new(Inner {
                pool,
                statements: Statements::new(&options.schema, &options.table),
                options,
                server,
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

    /// A pooled connection to the lease database, for writes guarded by a [`Fence`].
    pub async fn connection(&self) -> Result<Object, StoreError> {
        let server = &self.inner.server;
        match timeout(self.inner.options.operation_timeout, self.inner.pool.get()).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(errors::from_pool(server, e).error),
            Err(_) => Err(errors::timed_out(
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
    async fn run<'a, T>(
        &self,
        patience: Duration,
        idempotent: bool,
        attempt: impl for<'c> Fn(&'c Object, Scope<'c, 'a>) -> Attempt<'c, T>,
    ) -> Result<T, StoreError> {
        let server = &self.inner.server;
        let deadline = Instant::now() + patience;
        let mut pause = FIRST_PAUSE;
        let mut last: Option<StoreError> = None;
        loop {
            let unknown = |last: Option<StoreError>| {
                last.unwrap_or_else(|| errors::timed_out(server, patience))
            };
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(unknown(last));
            }
            let failure: Failure = match timeout(remaining, self.inner.pool.get()).await {
                Err(_) => return Err(unknown(last)),
                Ok(Err(e)) => errors::from_pool(server, e),
                Ok(Ok(client)) => {
                    match timeout(remaining, attempt(&client, Scope::default())).await {
                        Ok(Ok(value)) => return Ok(value),
                        Err(_) => {
                            // The server may still answer on this connection later: close it.
                            drop(Object::take(client));
                            return Err(errors::timed_out(server, patience));
                        }
                        Ok(Err((sent, e))) => {
                            let failure = errors::from_pg(server, e);
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

    fn patience(&self) -> Duration {
        self.inner.options.operation_timeout
    }

    fn bad(&self, e: impl std::fmt::Display) -> StoreError {
        errors::bad_value(&self.inner.server, format!("lease row: {e}"))
    }

    /// A priority column (`numeric(20)` as text).
    fn priority(&self, text: &str) -> Result<u64, StoreError> {
        text.parse()
            .map_err(|_| self.bad(format!("priority {text:?} is not a u64")))
    }

    fn decode(&self, row: &Row, at: usize) -> Result<LeaseRecord, StoreError> {
        let bad = |e: tokio_postgres::Error| self.bad(e);
        let token: i64 = row.try_get(at + 3).map_err(bad)?;
        let expires_in_us: i64 = row.try_get(at + 4).map_err(bad)?;
        let version: i64 = row.try_get(at + 5).map_err(bad)?;
        let priority: String = row.try_get(at + 7).map_err(bad)?;
        let cleanup_us: i64 = row.try_get(at + 8).map_err(bad)?;
        Ok(LeaseRecord {
            name: row.try_get(at).map_err(bad)?,
            owner: row.try_get(at + 1).map_err(bad)?,
            instance: row.try_get(at + 2).map_err(bad)?,
            token: u64::try_from(token).map_err(|_| self.bad(format!("negative token {token}")))?,
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

    /// Runs `sql` (one row: a flag, then a record) with `params`, idempotently.
    async fn flagged_record(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Option<(bool, LeaseRecord)>, StoreError> {
        let rows = self
            .run(self.patience(), true, |c, _| {
                Box::pin(async move {
                    let stmt = c.prepare_cached(sql).await.map_err(|e| (false, e))?;
                    c.query(&stmt, params).await.map_err(|e| (true, e))
                })
            })
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let flag: bool = row.try_get(0).map_err(|e| self.bad(e))?;
        Ok(Some((flag, self.decode(row, 1)?)))
    }
}

/// The ttl in whole microseconds, rounded up (a grant never lives shorter than asked),
/// capped at 100 years (PostgreSQL intervals overflow far beyond).
fn ttl_us(ttl: Duration) -> i64 {
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
            fair_waiting: false,
            watch: false,
            durable: true,
            preemption: true,
        }
    }

    /// One statement: insert the grant, or take over the row if it is expired, this
    /// instance's (and not being forcefully preempted) or, for an emergency request, of
    /// lower priority; otherwise return the current holder.
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome, StoreError> {
        let sql = &self.inner.statements.acquire;
        let ttl = ttl_us(req.ttl);
        let priority = req.priority.to_string();
        let cleanup = ttl_us(req.cleanup_timeout);
        // The emergency rule's own half (the statement compares the priorities): a request
        // that would take over even the lowest-priority grant.
        let emergency = req.takes_over(0);
        for _ in 0..ACQUIRE_RACES {
            let answer = self
                .flagged_record(
                    sql,
                    &[
                        &req.name,
                        &req.owner,
                        &req.instance,
                        &ttl,
                        &req.note,
                        &priority,
                        &cleanup,
                        &emergency,
                    ],
                )
                .await?;
            match answer {
                Some((true, record)) => return Ok(AcquireOutcome::Granted(record)),
                Some((false, record)) => return Ok(AcquireOutcome::Held(record)),
                // Released between the insert and the look-up: ask again.
                None => continue,
            }
        }
        Err(errors::bad_value(
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
        let sql = &self.inner.statements.renew;
        let names: Vec<&str> = leases.iter().map(|l| l.name.as_str()).collect();
        // A token beyond i64 was never issued: -1 matches nothing.
        let tokens: Vec<i64> = leases
            .iter()
            .map(|l| i64::try_from(l.token).unwrap_or(-1))
            .collect();
        let ttl = ttl_us(ttl);
        let (names, tokens) = (&names, &tokens);
        let rows = self
            .run(self.patience(), true, |c, _| {
                Box::pin(async move {
                    let stmt = c.prepare_cached(sql).await.map_err(|e| (false, e))?;
                    c.query(&stmt, &[&owner, names, tokens, &ttl])
                        .await
                        .map_err(|e| (true, e))
                })
            })
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

    /// Ends the grant if `owner` holds it unexpired with `token`. Not retried once sent:
    /// a second try after a lost answer would report `false` for our own release.
    async fn release(&self, name: &str, owner: &str, token: u64) -> Result<bool, StoreError> {
        let Ok(token) = i64::try_from(token) else {
            return Ok(false);
        };
        let sql = &self.inner.statements.release;
        let n = self
            .run(self.patience(), false, |c, _| {
                Box::pin(async move {
                    let stmt = c.prepare_cached(sql).await.map_err(|e| (false, e))?;
                    c.execute(&stmt, &[&name, &owner, &token])
                        .await
                        .map_err(|e| (true, e))
                })
            })
            .await?;
        Ok(n == 1)
    }

    /// One statement: the request is set on the unexpired grant `token` if it outranks
    /// it and any other owner's pending request. A `Refused` answer whose record would
    /// have allowed it (a concurrent change the statement's snapshot did not show) is
    /// asked again.
    async fn request_preemption(
        &self,
        name: &str,
        token: u64,
        request: &PreemptionRequest,
    ) -> Result<PreemptAnswer, StoreError> {
        let Ok(token) = i64::try_from(token) else {
            return Ok(PreemptAnswer::Gone);
        };
        let sql = &self.inner.statements.request_preemption;
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
        token: u64,
        by: &str,
    ) -> Result<bool, StoreError> {
        let Ok(token) = i64::try_from(token) else {
            return Ok(false);
        };
        let sql = &self.inner.statements.withdraw_preemption;
        let n = self
            .run(self.patience(), false, |c, _| {
                Box::pin(async move {
                    let stmt = c.prepare_cached(sql).await.map_err(|e| (false, e))?;
                    c.execute(&stmt, &[&name, &token, &by])
                        .await
                        .map_err(|e| (true, e))
                })
            })
            .await?;
        Ok(n == 1)
    }

    async fn read(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError> {
        let sql = &self.inner.statements.read;
        let rows = self
            .run(self.patience(), true, |c, _| {
                Box::pin(async move {
                    let stmt = c.prepare_cached(sql).await.map_err(|e| (false, e))?;
                    c.query(&stmt, &[&name]).await.map_err(|e| (true, e))
                })
            })
            .await?;
        rows.first().map(|r| self.decode(r, 0)).transpose()
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        let sql = &self.inner.statements.list;
        let pattern = like_prefix(prefix);
        let pattern = &pattern;
        let rows = self
            .run(self.patience(), true, |c, _| {
                Box::pin(async move {
                    let stmt = c.prepare_cached(sql).await.map_err(|e| (false, e))?;
                    c.query(&stmt, &[pattern]).await.map_err(|e| (true, e))
                })
            })
            .await?;
        rows.iter().map(|r| self.decode(r, 0)).collect()
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
