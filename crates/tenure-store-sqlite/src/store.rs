//! The SQLite lease store and its factory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use tenure_lease::config::TableReader;
use tenure_lease::{
    AcquireOutcome, AcquireRequest, AcquireStep, Capabilities, ConfigError, HeldLease, LeaseRecord,
    LeaseSection, LeaseStore, PreemptAnswer, PreemptionRequest, Renewal, StoreError, StoreFactory,
};

use crate::clock::{boot_id, now_ns};
use crate::schema::migrate;
use crate::sql;

/// A lease store in one SQLite file. Cloning shares the connection.
#[derive(Clone)]
pub struct SqliteStore {
    path: Arc<PathBuf>,
    conn: Arc<Mutex<Connection>>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish()
    }
}

fn path_error(path: &Path, detail: impl Into<String>) -> ConfigError {
    ConfigError::StorePath {
        path: path.display().to_string(),
        detail: detail.into(),
    }
}

/// Checks that `path` can hold the database: its directory exists and is writable, and an
/// existing file is a writable regular file.
pub(crate) fn check_path(path: &Path) -> Result<(), ConfigError> {
    if path.as_os_str().is_empty() {
        return Err(path_error(path, "empty path"));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    match std::fs::metadata(&dir) {
        Err(e) => {
            return Err(path_error(
                path,
                format!("directory {} is not usable: {e}", dir.display()),
            ));
        }
        Ok(m) if !m.is_dir() => {
            return Err(path_error(
                path,
                format!("{} is not a directory", dir.display()),
            ));
        }
        Ok(_) => {}
    }
    if rustix::fs::access(&dir, rustix::fs::Access::WRITE_OK).is_err() {
        return Err(path_error(
            path,
            format!(
                "directory {} is not writable (SQLite needs to create its -wal and -shm files there)",
                dir.display()
            ),
        ));
    }
    if let Ok(m) = std::fs::metadata(path) {
        if !m.is_file() {
            return Err(path_error(path, "exists and is not a regular file"));
        }
        if rustix::fs::access(
            path,
            rustix::fs::Access::WRITE_OK | rustix::fs::Access::READ_OK,
        )
        .is_err()
        {
            return Err(path_error(path, "exists and is not readable and writable"));
        }
    }
    Ok(())
}

impl SqliteStore {
    /// Opens (creating if needed) the lease database at `path`. `busy_timeout` bounds how
    /// long an operation waits for another process's transaction.
    pub fn open(path: impl AsRef<Path>, busy_timeout: Duration) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        check_path(path)?;
        let boot =
            boot_id().map_err(|e| path_error(path, format!("cannot read the boot id: {e}")))?;
        let mut conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| path_error(path, e.to_string()))?;
        conn.busy_timeout(busy_timeout)
            .and_then(|_| conn.pragma_update(None, "journal_mode", "WAL"))
            .and_then(|_| conn.pragma_update(None, "synchronous", "FULL"))
            .and_then(|_| migrate(&mut conn, &boot))
            .map_err(|e| path_error(path, format!("cannot initialise the lease database: {e}")))?;
        Ok(SqliteStore {
            path: Arc::new(path.to_path_buf()),
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on the connection in a blocking task.
    async fn with_conn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = conn.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut conn)
        })
        .await
        .map_err(|e| StoreError::Backend {
            store: "sqlite",
            detail: format!("blocking task failed: {e}"),
        })?
        .map_err(store_error)
    }
}

fn store_error(e: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode::{DatabaseBusy, DatabaseLocked};
    match &e {
        rusqlite::Error::SqliteFailure(f, _) if matches!(f.code, DatabaseBusy | DatabaseLocked) => {
            StoreError::Unavailable {
                store: "sqlite",
                detail: e.to_string(),
            }
        }
        _ => StoreError::Backend {
            store: "sqlite",
            detail: e.to_string(),
        },
    }
}

fn ttl_ns(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_nanos()).unwrap_or(i64::MAX)
}

/// Priorities are `u64`, SQLite integers `i64`: stored bit-cast (never compared in SQL).
fn priority_to_sql(priority: u64) -> i64 {
    priority as i64
}

fn priority_from_sql(stored: i64) -> u64 {
    stored as u64
}

/// A record from the columns of [`sql::SELECT_CURRENT`] / [`sql::LIST`].
fn row_record(row: &rusqlite::Row<'_>, now: i64) -> rusqlite::Result<LeaseRecord> {
    let expires_at: i64 = row.get(4)?;
    Ok(LeaseRecord {
        name: row.get(0)?,
        owner: row.get(1)?,
        instance: row.get(2)?,
        token: row.get::<_, i64>(3)? as u64,
        expires_in: Duration::from_nanos(expires_at.saturating_sub(now).max(0) as u64),
        version: row.get::<_, i64>(5)? as u64,
        note: row.get(6)?,
        priority: priority_from_sql(row.get(7)?),
        cleanup_timeout: Duration::from_nanos(row.get::<_, i64>(8)?.max(0) as u64),
        request: row_request(row, 9)?,
    })
}

/// The pending request from the five columns `req_by, req_instance, req_priority,
/// req_forceful, req_note` starting at `at` (`req_by` NULL: none).
fn row_request(row: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Option<PreemptionRequest>> {
    let Some(by) = row.get::<_, Option<String>>(at)? else {
        return Ok(None);
    };
    Ok(Some(PreemptionRequest {
        by,
        instance: row.get::<_, Option<String>>(at + 1)?.unwrap_or_default(),
        priority: priority_from_sql(row.get::<_, Option<i64>>(at + 2)?.unwrap_or(0)),
        forceful: row.get::<_, i64>(at + 3)? != 0,
        note: row.get(at + 4)?,
    }))
}

/// `(name, token)` and the pending request of a row of [`sql::RENEW_BATCH`] /
/// [`sql::REFUSED_BATCH`].
type RenewRow = ((String, i64), Option<PreemptionRequest>);

fn renew_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<RenewRow> {
    Ok(((row.get(0)?, row.get(1)?), row_request(row, 2)?))
}

#[async_trait]
impl LeaseStore for SqliteStore {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_fencing: false,
            server_side_expiry: true,
            fair_waiting: false,
            watch: false,
            durable: true,
            preemption: true,
        }
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome, StoreError> {
        let req = req.clone();
        self.with_conn(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            // Read the clock only once the write lock is ours: expiry counts from processing.
            let now = now_ns();
            let current = tx
                .prepare_cached(sql::SELECT_CURRENT)?
                .query_row(params![req.name, now], |r| row_record(r, now))
                .optional()?;
            let expires_at = now.saturating_add(ttl_ns(req.ttl));
            let outcome = match (req.step(current.as_ref()), current) {
                (AcquireStep::Held, Some(rec)) => AcquireOutcome::Held(rec),
                (AcquireStep::Extend, Some(rec)) => {
                    tx.prepare_cached(sql::EXTEND)?
                        .execute(params![req.name, expires_at, req.note])?;
                    AcquireOutcome::Granted(LeaseRecord {
                        expires_in: req.ttl,
                        version: rec.version + 1,
                        note: req.note.clone().or(rec.note),
                        ..rec
                    })
                }
                // Free, expired, or an emergency take-over: a new grant.
                _ => {
                    let token: i64 = tx
                        .prepare_cached(sql::NEXT_TOKEN)?
                        .query_row(params![req.name], |r| r.get(0))?;
                    tx.prepare_cached(sql::INSERT_GRANT)?.execute(params![
                        req.name,
                        req.owner,
                        token,
                        expires_at,
                        req.note,
                        req.instance,
                        priority_to_sql(req.priority),
                        ttl_ns(req.cleanup_timeout)
                    ])?;
                    AcquireOutcome::Granted(LeaseRecord {
                        name: req.name.clone(),
                        owner: req.owner.clone(),
                        instance: req.instance.clone(),
                        token: token as u64,
                        expires_in: req.ttl,
                        version: 1,
                        note: req.note.clone(),
                        priority: req.priority,
                        cleanup_timeout: req.cleanup_timeout,
                        request: None,
                    })
                }
            };
            tx.commit()?;
            Ok(outcome)
        })
        .await
    }

    async fn renew(
        &self,
        owner: &str,
        leases: &[HeldLease],
        ttl: Duration,
    ) -> Result<Vec<Renewal>, StoreError> {
        let owner = owner.to_string();
        let pairs: Vec<(&str, u64)> = leases.iter().map(|l| (l.name.as_str(), l.token)).collect();
        let batch = serde_json::to_string(&pairs).map_err(|e| StoreError::Backend {
            store: "sqlite",
            detail: e.to_string(),
        })?;
        let wanted: Vec<HeldLease> = leases.to_vec();
        self.with_conn(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ns();
            // One statement for the whole batch, however many leases.
            let renewed: HashMap<(String, i64), Option<PreemptionRequest>> = {
                let mut stmt = tx.prepare_cached(sql::RENEW_BATCH)?;
                stmt.query_map(
                    params![owner, now, now.saturating_add(ttl_ns(ttl)), batch],
                    renew_row,
                )?
                .collect::<rusqlite::Result<_>>()?
            };
            // Only when some were not renewed: which of those a forceful request refused.
            let refused: HashMap<(String, i64), Option<PreemptionRequest>> =
                if renewed.len() < wanted.len() {
                    let mut stmt = tx.prepare_cached(sql::REFUSED_BATCH)?;
                    stmt.query_map(params![owner, now, batch], renew_row)?
                        .collect::<rusqlite::Result<_>>()?
                } else {
                    HashMap::new()
                };
            tx.commit()?;
            Ok(wanted
                .iter()
                .map(|l| {
                    let key = (l.name.clone(), l.token as i64);
                    match (renewed.get(&key), refused.get(&key)) {
                        (Some(request), _) => Renewal::Renewed {
                            request: request.clone(),
                        },
                        (None, Some(Some(request))) => Renewal::Refused(request.clone()),
                        _ => Renewal::NotHeld,
                    }
                })
                .collect())
        })
        .await
    }

    /// Decides with [`PreemptionRequest::may_replace`] and writes in one IMMEDIATE
    /// transaction (SQLite's write lock makes the read and the write one compare-and-set).
    async fn request_preemption(
        &self,
        name: &str,
        token: u64,
        request: &PreemptionRequest,
    ) -> Result<PreemptAnswer, StoreError> {
        let (name, request) = (name.to_string(), request.clone());
        self.with_conn(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ns();
            let current = tx
                .prepare_cached(sql::SELECT_CURRENT)?
                .query_row(params![name, now], |r| row_record(r, now))
                .optional()?;
            let answer = match current {
                Some(rec) if rec.token == token => {
                    if request.may_replace(rec.priority, rec.request.as_ref()) {
                        tx.prepare_cached(sql::SET_REQUEST)?.execute(params![
                            name,
                            token as i64,
                            now,
                            request.by,
                            request.instance,
                            priority_to_sql(request.priority),
                            request.forceful,
                            request.note
                        ])?;
                        PreemptAnswer::Recorded(LeaseRecord {
                            request: Some(request),
                            ..rec
                        })
                    } else {
                        PreemptAnswer::Refused(rec)
                    }
                }
                _ => PreemptAnswer::Gone,
            };
            tx.commit()?;
            Ok(answer)
        })
        .await
    }

    async fn withdraw_preemption(
        &self,
        name: &str,
        token: u64,
        by: &str,
    ) -> Result<bool, StoreError> {
        let (name, by) = (name.to_string(), by.to_string());
        self.with_conn(move |conn| {
            let now = now_ns();
            let changed = conn
                .prepare_cached(sql::WITHDRAW_REQUEST)?
                .execute(params![name, token as i64, now, by])?;
            Ok(changed == 1)
        })
        .await
    }

    async fn release(&self, name: &str, owner: &str, token: u64) -> Result<bool, StoreError> {
        let (name, owner) = (name.to_string(), owner.to_string());
        self.with_conn(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ns();
            let deleted = tx.prepare_cached(sql::RELEASE)?.execute(params![
                name,
                owner,
                token as i64,
                now
            ])?;
            tx.commit()?;
            Ok(deleted == 1)
        })
        .await
    }

    async fn read(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError> {
        let name = name.to_string();
        self.with_conn(move |conn| {
            let now = now_ns();
            conn.prepare_cached(sql::SELECT_CURRENT)?
                .query_row(params![name, now], |r| row_record(r, now))
                .optional()
        })
        .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        let prefix = prefix.to_string();
        self.with_conn(move |conn| {
            let now = now_ns();
            let mut stmt = conn.prepare_cached(sql::LIST)?;
            stmt.query_map(params![prefix, now], |r| row_record(r, now))?
                .collect()
        })
        .await
    }
}

/// Opens `store = "sqlite"` sections. Option: `path` (the database file; its directory
/// must exist and be writable). The busy timeout is the section's `lease-operation-timeout`.
#[derive(Debug, Default, Clone, Copy)]
pub struct SqliteStoreFactory;

impl SqliteStoreFactory {
    fn path(section: &LeaseSection) -> Result<PathBuf, ConfigError> {
        let key = section.key();
        let r = TableReader::new(&key, &section.options);
        r.reject_unknown(&["path"])?;
        let path = PathBuf::from(r.string("path")?);
        if path.as_os_str().is_empty() {
            return Err(ConfigError::invalid(r.key("path"), "must not be empty"));
        }
        Ok(path)
    }
}

#[async_trait]
impl StoreFactory for SqliteStoreFactory {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    fn check(&self, section: &LeaseSection) -> Result<(), ConfigError> {
        check_path(&Self::path(section)?)
    }

    async fn open(&self, section: &LeaseSection) -> Result<Arc<dyn LeaseStore>, ConfigError> {
        let path = Self::path(section)?;
        let timeout = section.settings.lease_operation_timeout;
        let store = tokio::task::spawn_blocking(move || SqliteStore::open(path, timeout))
            .await
            .map_err(|e| {
                ConfigError::invalid(section.key(), format!("opening the store failed: {e}"))
            })??;
        Ok(Arc::new(store))
    }
}
