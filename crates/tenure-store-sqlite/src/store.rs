//! The SQLite lease store and its factory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use tenure_lease::{
    AcquireOutcome, AcquireRequest, AcquireStep, Capabilities, ChangeVersion, Changes, ConfigError,
    FairQueue, FencingToken, GrantChanges, HeldLease, HolderClock, LeaseRecord, LeaseSection,
    LeaseStore, PreemptAnswer, PreemptionRequest, PreemptionRequests, RememberChange,
    RememberedIds, Renewal, StoreError, StoreFactory,
};

use crate::clock::{boot_id, now_ns, token_floor};
use crate::db::{Db, DbError, Files, file_id, sibling};
use crate::schema::{lost_at, migrate};
use crate::sql;
use crate::witness::Witness;

/// A lease store in one SQLite file. Cloning shares the connection.
///
/// **A lost file.** The state of the file can be lost under its users: the file deleted or
/// replaced (restored from a copy, even in place, keeping its inode), or its `-wal`
/// deleted (the main file alone holds older content). Every operation first checks that
/// `path`, `path-wal` and `path-shm` still name the files the connection has open (device
/// and inode), then, in its transaction, the file's identity (a random store id and a
/// generation that every write advances): a store id other than the one this process
/// used, a generation below one this process read, or, for a write, below one that a live
/// process of the host committed (each process shows the generation it last committed as a
/// lock on the file, see the `witness` module), means lost state. The store then records
/// in the file when the loss was found (`lost_at`) and forgets its grants and waiters.
/// Holders of grants in the lost state may still believe in them: their last renewal that
/// succeeded was sent before the loss was found, so they believe until at most
/// `lost_at + ttl`. Until then the file makes no new grant ([`StoreError::StateLost`]).
/// Tokens of every file exceed those of any earlier one (see `sql::next_token`).
///
/// A file replaced under the connection is reopened at `path`. A `-wal` or `-shm` replaced
/// or deleted under the same main file cannot be: SQLite shares one `-shm` mapping among
/// the connections of a process to one file, so a new connection would read the lost log's
/// index. Every store of the process on that file then refuses
/// ([`StoreError::StateLost`]) until the process restarts (or the main file is replaced
/// too); other processes go on (after the ttl without grants).
///
/// Not covered: a process that starts after the file was deleted (a new inode) and makes a
/// new file before any running process noticed grants at once (fencing tokens still order
/// it after the lost file's grants); a lease file of another store copied over this one
/// with a generation above this file's latest, noticed only by processes that used this
/// file (the generation is the wall clock in microseconds: such a file was written after
/// this one); a file deleted without its `-wal` is refused until the `-wal` and `-shm`
/// files are deleted too (SQLite would read the lost file's log). Transactions an
/// application runs itself on the file ([`crate::fence::check`]) do not read the identity.
#[derive(Clone)]
pub struct SqliteStore {
    path: Arc<PathBuf>,
    /// The file's path made absolute (symbolic links resolved) when opened: which fair
    /// waiters of this process share a line (see [`crate::fair`]).
    pub(crate) line_key: Arc<PathBuf>,
    busy_timeout: Duration,
    /// `None` after a loss whose reopening failed: every operation retries it.
    open: Arc<Mutex<Option<Open>>>,
    /// The clock of this process's own timing (when a fair waiter refreshes its row): the
    /// holder clock, which counts host suspend like the expiries in the file.
    pub(crate) clock: HolderClock,
}

/// A connection and the files it has open.
struct Open {
    db: Db,
    files: Files,
}

impl Open {
    /// Closes the connection of a lost file without checkpointing (see
    /// [`close_without_checkpoint`]).
    fn abandon(self) {
        let Open { db, .. } = self;
        if db
            .conn
            .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
            .is_ok()
        {
            drop(db);
        } else {
            // Never closed then (and counted as open): a leaked connection is the lesser harm.
            tracing::warn!(
                "cannot turn off the checkpoint on close: a lost lease file's connection stays open"
            );
            std::mem::forget(db);
        }
    }
}

/// Closes `conn`, a connection to a lost file, without checkpointing: SQLite would
/// otherwise copy the lost log into the main file and, as the last connection of the host,
/// delete the `-wal` and `-shm` by their paths, which may now be another file's. A
/// connection that cannot be told so is never closed (leaked): the lesser harm.
fn close_without_checkpoint(conn: Connection) {
    if conn
        .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
        .is_ok()
    {
        drop(conn);
    } else {
        std::mem::forget(conn);
    }
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

/// How long a store being opened waits for another process's write lock, at least.
const OPEN_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens (creating if needed) the lease database at `path`, with the files it opened and
/// this process's witness of the main file; initialising it waits up to `open_wait` for
/// another process's write lock, and its operations then wait up to `busy_timeout`.
fn connect(path: &Path, busy_timeout: Duration, open_wait: Duration) -> Result<Open, ConfigError> {
    check_path(path)?;
    if !path.exists() {
        for suffix in ["-wal", "-shm"] {
            let orphan = sibling(path, suffix);
            if orphan.exists() {
                return Err(path_error(
                    path,
                    format!(
                        "the database file is gone but {} is still there: delete {} and {} too (SQLite would read the lost file's log into a new one)",
                        orphan.display(),
                        sibling(path, "-wal").display(),
                        sibling(path, "-shm").display()
                    ),
                ));
            }
        }
    }
    // Before SQLite opens it: a new connection would share the index of a log lost under
    // this process.
    if let Ok(id) = file_id(path)
        && let Some(witness) = Witness::known(id)
    {
        let files = Files::at(path);
        if witness.other_log_in_use((files.wal, files.shm)) {
            witness.lose_log(LOG_LOST.into());
        }
        if let Some(why) = witness.log_lost() {
            return Err(path_error(path, why));
        }
    }
    let boot = boot_id().map_err(|e| path_error(path, format!("cannot read the boot id: {e}")))?;
    let mut conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| path_error(path, e.to_string()))?;
    conn.busy_timeout(open_wait)
        .and_then(|_| conn.pragma_update(None, "journal_mode", "WAL"))
        .and_then(|_| conn.pragma_update(None, "synchronous", "FULL"))
        .and_then(|_| migrate(&mut conn, &boot))
        .and_then(|_| conn.busy_timeout(busy_timeout))
        .map_err(|e| path_error(path, format!("cannot initialise the lease database: {e}")))?;
    // The file exists now (the migration wrote it): this is the one the connection has,
    // unless it was replaced meanwhile (checked below).
    let witness =
        Witness::for_file(path).map_err(|e| path_error(path, format!("cannot open: {e}")))?;
    let opened = witness.id();
    let files = Files::at(path);
    let refused = if files.main != Some(opened) {
        Some("the file was replaced while it was being opened".to_string())
    } else if !witness.attach((files.wal, files.shm)) {
        witness.lose_log(LOG_LOST.into());
        witness.log_lost()
    } else {
        let db = Db { conn, witness };
        return match db.witness.log_lost() {
            None => Ok(Open { db, files }),
            Some(why) => {
                Open { db, files }.abandon();
                Err(path_error(path, why))
            }
        };
    };
    close_without_checkpoint(conn);
    Err(path_error(
        path,
        refused.unwrap_or_else(|| LOG_LOST.to_string()),
    ))
}

/// Why a process whose connection used a `-wal` or `-shm` deleted or replaced under it
/// uses the file no more.
const LOG_LOST: &str = "its -wal or -shm file was deleted or replaced while this process used it: SQLite would read the lost log's index in every new connection of this process, so no store of this process uses the file again; restart the process (other processes refuse new grants for one ttl, then go on)";

/// The connection to the file `path` names now: `slot`'s, or, when a file of the database
/// was deleted or replaced, a new one, with the loss recorded in the file.
fn current<'a>(
    path: &Path,
    busy_timeout: Duration,
    slot: &'a mut Option<Open>,
) -> Result<&'a mut Db, StoreError> {
    let files = Files::at(path);
    if slot.as_ref().is_some_and(|o| o.files == files) {
        return Ok(&mut slot.as_mut().expect("checked").db);
    }
    if let Some(old) = slot.take() {
        if old.files.main.is_some() && old.files.main == files.main {
            old.db.witness.lose_log(LOG_LOST.into());
        }
        tracing::warn!(path = %path.display(), "a file of the lease database was deleted or replaced while in use: its grants are gone");
        old.abandon();
    }
    let mut fresh = connect(path, busy_timeout, busy_timeout).map_err(|e| {
        StoreError::state_lost(
            "sqlite",
            format!("the lease file was deleted or replaced while in use: {e}"),
        )
    })?;
    fresh
        .db
        .record_loss(now_ns())
        .map_err(|e| db_error(path, e))?;
    Ok(&mut slot.insert(fresh).db)
}

impl SqliteStore {
    /// Opens (creating if needed) the lease database at `path`, waiting up to 10 s (or
    /// `busy_timeout` if longer) for another process's transaction. `busy_timeout` bounds
    /// how long an operation waits for one.
    pub fn open(path: impl AsRef<Path>, busy_timeout: Duration) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        // A process that cannot open its store cannot start: opening waits longer for the
        // write lock than an operation does, since other processes' transactions on a busy
        // file may keep taking it first for a while (SQLite's busy handler is not fair).
        let open = connect(path, busy_timeout, busy_timeout.max(OPEN_BUSY_TIMEOUT))?;
        let line_key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        Ok(SqliteStore {
            path: Arc::new(path.to_path_buf()),
            line_key: Arc::new(line_key),
            busy_timeout,
            open: Arc::new(Mutex::new(Some(open))),
            clock: HolderClock::host(),
        })
    }

    /// This store timing its own waits on `clock` (the holder clock of the Lease API, which
    /// counts host suspend; tests inject [`HolderClock::manual`]). Expiries in the file stay
    /// on the host's `CLOCK_BOOTTIME`, shared by every process of the host.
    pub fn with_clock(mut self, clock: HolderClock) -> Self {
        self.clock = clock;
        self
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on the connection to the file `path` names now. `f` is one transaction
    /// begun with [`Db::write`] or [`Db::read`]: it may run twice, and a first run that
    /// ended with SQLite busy or locked, or that found the file's state lost, changed
    /// nothing. A loss `f` found is recorded in the file ([`Db::record_loss`]) and answered
    /// with [`StoreError::StateLost`].
    ///
    /// Inline on the calling worker when the caller allows it
    /// ([`tenure_lease::blocking::inline_allowed`]: the lease machinery's own calls) and
    /// nothing has to wait: the connection is free, open on the files `path` names, and
    /// with a busy timeout of zero for that run. A run that found the file's write lock
    /// taken (busy or locked), or the file's state lost, runs again in the blocking pool,
    /// where it may wait `busy_timeout`, as does every call the caller did not allow inline.
    pub(crate) async fn with_conn<T: Send + 'static>(
        &self,
        f: impl Fn(&mut Db) -> Result<T, DbError> + Send + 'static,
    ) -> Result<T, StoreError> {
        if tenure_lease::blocking::inline_allowed()
            && let Some(done) = self.inline(&f)
        {
            return done.map_err(|e| db_error(&self.path, e));
        }
        self.in_pool(f).await
    }

    /// [`with_conn`](Self::with_conn) of `f` on `args`, which `f` borrows when it runs
    /// inline (the hot path then clones none of them) and are cloned for the blocking pool.
    pub(crate) async fn with_args<A: Clone + Send + Sync + 'static, T: Send + 'static>(
        &self,
        args: &A,
        f: fn(&mut Db, &A) -> Result<T, DbError>,
    ) -> Result<T, StoreError> {
        if tenure_lease::blocking::inline_allowed()
            && let Some(done) = self.inline(&|db: &mut Db| f(db, args))
        {
            return done.map_err(|e| db_error(&self.path, e));
        }
        let args = args.clone();
        self.in_pool(move |db| f(db, &args)).await
    }

    /// Runs `f` in the blocking pool on the connection to the files `path` names now,
    /// waiting up to `busy_timeout` for another process's transaction; records a loss `f`
    /// found.
    async fn in_pool<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Db) -> Result<T, DbError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (open, path, busy) = (self.open.clone(), self.path.clone(), self.busy_timeout);
        tokio::task::spawn_blocking(move || {
            let mut slot = open.lock().unwrap_or_else(|e| e.into_inner());
            let db = current(&path, busy, &mut slot)?;
            match f(db) {
                Err(DbError::Lost(lost)) => {
                    tracing::warn!(path = %path.display(), %lost, "the lease file lost its state: its grants are gone");
                    db.record_loss(now_ns()).map_err(|e| db_error(&path, e))?;
                    Err(lost_error(&path, &lost))
                }
                done => done.map_err(|e| db_error(&path, e)),
            }
        })
        .await
        .map_err(|e| StoreError::backend("sqlite", format!("blocking task failed: {e}")))?
    }

    /// `f`'s run on the calling thread, or `None` when it would have had to wait or found
    /// the file's state lost: the connection is in use, a file was replaced (reopening
    /// waits), SQLite found the write lock taken, or the identity showed a loss (recording
    /// it waits).
    fn inline<T>(&self, f: &impl Fn(&mut Db) -> Result<T, DbError>) -> Option<Result<T, DbError>> {
        let mut slot = self.open.try_lock().ok()?;
        let open = slot.as_mut()?;
        if Files::at(&self.path) != open.files {
            return None;
        }
        open.db.conn.busy_timeout(Duration::ZERO).ok()?;
        let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut open.db)));
        if let Err(e) = open.db.conn.busy_timeout(self.busy_timeout) {
            // A connection left without its busy timeout would fail where it should wait:
            // drop it; the next call reopens the file.
            tracing::warn!(path = %self.path.display(), error = %e, "cannot restore the busy timeout: reopening the lease file");
            *slot = None;
        }
        // The busy timeout is back (or the connection gone) before a panic goes on.
        let done = done.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        match done {
            Err(DbError::Sqlite(e)) if is_busy(&e) => None,
            Err(DbError::Lost(_)) => None,
            done => Some(done),
        }
    }
}

/// SQLite found a lock taken (`SQLITE_BUSY` or `SQLITE_LOCKED`): nothing was changed.
fn is_busy(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode::{DatabaseBusy, DatabaseLocked};
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if matches!(f.code, DatabaseBusy | DatabaseLocked))
}

fn store_error(e: rusqlite::Error) -> StoreError {
    if is_busy(&e) {
        StoreError::unavailable("sqlite", e.to_string()).caused_by(e)
    } else {
        StoreError::backend("sqlite", e.to_string()).caused_by(e)
    }
}

/// The answer to an operation that found the state of the file at `path` lost.
fn lost_error(path: &Path, lost: &crate::identity::Lost) -> StoreError {
    StoreError::state_lost(
        "sqlite",
        format!(
            "the lease file {} lost its state: {lost}; its grants are gone, and holders of them may believe in them for up to one ttl: no new grant until then",
            path.display()
        ),
    )
}

/// A failed transaction on the file at `path` as a store error.
fn db_error(path: &Path, e: DbError) -> StoreError {
    match e {
        DbError::Sqlite(e) => store_error(e),
        DbError::Lost(lost) => lost_error(path, &lost),
        DbError::Witness(e) => StoreError::backend(
            "sqlite",
            format!(
                "the generation lock on the lease file {}: {e}",
                path.display()
            ),
        )
        .caused_by(e),
    }
}

/// An acquire refused: the file's state was found lost at `lost` (ns), less than the ttl
/// before `now`.
pub(crate) struct Quiet {
    lost: i64,
    now: i64,
}

impl Quiet {
    /// The refusal of an acquire of `name` with `ttl` in the file at `path`.
    pub(crate) fn error(&self, path: &Path, name: &str, ttl: Duration) -> StoreError {
        let Quiet { lost, now } = *self;
        let ago = Duration::from_nanos(now.saturating_sub(lost).max(0) as u64);
        let left = ttl_ns(ttl).saturating_sub(now.saturating_sub(lost));
        StoreError::state_lost(
            "sqlite",
            format!(
                "the state of the lease file {} was found lost {} ago (the file deleted or replaced, an old copy restored over it, or its -wal deleted); holders of its grants may believe in them for up to one ttl: no new grant of `{}` for another {}",
                path.display(),
                humantime::format_duration(round_ms(ago)),
                name,
                humantime::format_duration(round_ms(Duration::from_nanos(left.max(0) as u64)))
            ),
        )
    }
}

/// The rules of [`LeaseStore::try_acquire`] inside `tx` (which holds the write lock) at
/// clock `now`: the outcome, written but not committed, or the refusal of a file that
/// replaced a lost one.
pub(crate) fn acquire_in(
    tx: &rusqlite::Transaction<'_>,
    req: &AcquireRequest,
    now: i64,
) -> rusqlite::Result<Result<AcquireOutcome, Quiet>> {
    let current = tx
        .prepare_cached(sql::SELECT_CURRENT)?
        .query_row(params![req.name, now], |r| row_record(r, now))
        .optional()?;
    let expires_at = now.saturating_add(ttl_ns(req.ttl));
    Ok(Ok(match (req.step(current.as_ref()), current) {
        (AcquireStep::Held, Some(rec)) => AcquireOutcome::Held(rec),
        (AcquireStep::Extend, Some(rec)) => {
            tx.prepare_cached(sql::EXTEND)?
                .execute(params![req.name, expires_at, req.note])?;
            if req.note.is_some() && req.note != rec.note {
                tx.prepare_cached(sql::CHANGED)?.execute([&req.name])?;
            }
            AcquireOutcome::Granted(LeaseRecord {
                expires_in: req.ttl,
                version: rec.version + 1,
                note: req.note.clone().or(rec.note),
                ..rec
            })
        }
        // Free, expired, or an emergency take-over: a new grant, unless a lost file's
        // grants may still be believed.
        _ => {
            if let Some(lost) = lost_at(tx)?
                && now < lost.saturating_add(ttl_ns(req.ttl))
            {
                return Ok(Err(Quiet { lost, now }));
            }
            let token = sql::next_token(tx, &req.name, token_floor())?;
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
            tx.prepare_cached(sql::CHANGED)?.execute([&req.name])?;
            AcquireOutcome::Granted(LeaseRecord {
                name: req.name.clone(),
                owner: req.owner.clone(),
                instance: req.instance.clone(),
                token: token_from_sql(token),
                expires_in: req.ttl,
                version: 1,
                note: req.note.clone(),
                priority: req.priority,
                cleanup_timeout: req.cleanup_timeout,
                request: None,
            })
        }
    }))
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
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

/// Tokens are SQLite integers: issued from `token_floor()` upwards, so never negative.
fn token_to_sql(token: FencingToken) -> i64 {
    token.get() as i64
}

fn token_from_sql(stored: i64) -> FencingToken {
    FencingToken::new(stored as u64)
}

/// A record from the columns of [`sql::SELECT_CURRENT`] / [`sql::LIST`].
pub(crate) fn row_record(row: &rusqlite::Row<'_>, now: i64) -> rusqlite::Result<LeaseRecord> {
    let expires_at: i64 = row.get(4)?;
    Ok(LeaseRecord {
        name: row.get(0)?,
        owner: row.get(1)?,
        instance: row.get(2)?,
        token: token_from_sql(row.get(3)?),
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
            durable: true,
        }
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome, StoreError> {
        let attempt = self
            .with_args(req, |db, req| {
                let tx = db.write()?;
                // Read the clock only once the write lock is ours: expiry counts from processing.
                let now = now_ns();
                let outcome = acquire_in(&tx, req, now)?;
                if outcome.is_ok() {
                    tx.commit()?;
                }
                Ok(outcome)
            })
            .await?;
        attempt.map_err(|quiet| quiet.error(&self.path, &req.name, req.ttl))
    }

    async fn renew(
        &self,
        owner: &str,
        leases: &[HeldLease],
        ttl: Duration,
    ) -> Result<Vec<Renewal>, StoreError> {
        let owner = owner.to_string();
        // Tokens serialize as their bare numbers.
        let pairs: Vec<(&str, FencingToken)> =
            leases.iter().map(|l| (l.name.as_str(), l.token)).collect();
        let batch = serde_json::to_string(&pairs)
            .map_err(|e| StoreError::backend("sqlite", e.to_string()).caused_by(e))?;
        let wanted: Vec<HeldLease> = leases.to_vec();
        self.with_conn(move |db| {
            let tx = db.write()?;
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
                    let key = (l.name.clone(), token_to_sql(l.token));
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

    /// Deletes the grant if `owner` holds it unexpired with `token`; once committed, wakes
    /// the name's fair waiters in this process (those of other processes see it at their
    /// next look, see [`acquire_fair`](LeaseStore::acquire_fair)).
    async fn release(
        &self,
        name: &str,
        owner: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        let (lease, holder, token) = (name.to_string(), owner.to_string(), token_to_sql(token));
        let released = self
            .with_conn(move |db| {
                let tx = db.write()?;
                let now = now_ns();
                let deleted = tx
                    .prepare_cached(sql::RELEASE)?
                    .execute(params![lease, holder, token, now])?;
                if deleted == 1 {
                    tx.prepare_cached(sql::CHANGED)?.execute([&lease])?;
                }
                tx.commit()?;
                Ok(deleted == 1)
            })
            .await?;
        if released {
            crate::fair::wake(&self.line_key, name);
        }
        Ok(released)
    }

    async fn read(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError> {
        let name = name.to_string();
        self.with_conn(move |db| {
            let tx = db.read()?;
            let now = now_ns();
            let record = tx
                .prepare_cached(sql::SELECT_CURRENT)?
                .query_row(params![name, now], |r| row_record(r, now))
                .optional()?;
            tx.finish()?;
            Ok(record)
        })
        .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        let prefix = prefix.to_string();
        self.with_conn(move |db| {
            let tx = db.read()?;
            let now = now_ns();
            let records = match sql::prefix_end(&prefix) {
                Some(end) => tx
                    .prepare_cached(sql::LIST)?
                    .query_map(params![prefix, now, end], |r| row_record(r, now))?
                    .collect::<rusqlite::Result<_>>()?,
                None => tx
                    .prepare_cached(sql::LIST_FROM)?
                    .query_map(params![prefix, now], |r| row_record(r, now))?
                    .collect::<rusqlite::Result<_>>()?,
            };
            tx.finish()?;
            Ok(records)
        })
        .await
    }

    tenure_lease::capability_accessors!(
        fair_queue,
        preemption_requests,
        remembered_ids,
        grant_changes
    );
}

#[async_trait]
impl GrantChanges for SqliteStore {
    /// One read transaction of two index lookups: the prefix's row of `tenure_change`
    /// (bumped by every grant made or ended under it, whichever process wrote it) and the
    /// grants under it that expired since `since` on the host's `CLOCK_BOOTTIME` (expiry
    /// writes nothing). The first check of a prefix in this file starts its count (a write).
    async fn changes_since(
        &self,
        prefix: &str,
        since: Option<ChangeVersion>,
    ) -> Result<Changes, StoreError> {
        let prefix = prefix.to_string();
        self.with_conn(move |db| {
            let tx = db.read()?;
            let now = now_ns();
            let changes: Option<i64> = tx
                .prepare_cached(sql::CHANGES)?
                .query_row([&prefix], |r| r.get(0))
                .optional()?;
            let expired = match (changes, since) {
                (Some(_), Some(since)) if since.at <= now => tx
                    .prepare_cached(sql::EXPIRED_BETWEEN)?
                    .exists(params![prefix, since.at, now])?,
                _ => true,
            };
            tx.finish()?;
            let changes = match changes {
                Some(changes) => changes,
                None => {
                    let tx = db.write()?;
                    tx.prepare_cached(sql::WATCH_PREFIX)?
                        .execute(params![prefix, token_floor()])?;
                    let changes = tx
                        .prepare_cached(sql::CHANGES)?
                        .query_row([&prefix], |r| r.get(0))?;
                    tx.commit()?;
                    changes
                }
            };
            let version = ChangeVersion {
                changes: changes as u64,
                at: now,
            };
            Ok(match since {
                Some(since) if !expired && since.changes == version.changes => {
                    Changes::Unchanged(version)
                }
                _ => Changes::Changed(version),
            })
        })
        .await
    }
}

#[async_trait]
impl FairQueue for SqliteStore {
    /// Queues behind earlier fair acquires of `req.name` (a row in `tenure_waiter`, with
    /// its own expiry, refreshed while it waits) and, once first in line, acquires as
    /// [`try_acquire`](LeaseStore::try_acquire) does, removing the row in the same
    /// transaction. Waiters in this process are woken at once by a release or a departure
    /// from the line; SQLite cannot tell other processes, so every waiter also looks again
    /// at least every [`cross_process_poll`](crate::cross_process_poll) (a twentieth
    /// of the ttl, 10 to 250 ms), at the holder's expiry and at the expiry of a waiter
    /// ahead that stopped refreshing (its process died). `Ok(Held)`: `wait` passed while
    /// another owner held the lease; `Err`: unknown, including a waiter whose row expired
    /// while queued (never granted then) and `wait` passing while earlier waiters had not
    /// reached the lease. The row is removed however this ends (also when the future is
    /// dropped: by a spawned task); if that fails it expires after the ttl. The holder
    /// instance's own fair acquire re-enters at once. `try_acquire` does not queue: it may
    /// take a free lease ahead of waiters, as with the etcd and ZooKeeper stores.
    async fn acquire_fair(
        &self,
        req: &AcquireRequest,
        wait: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        self.fair(req, wait).await
    }
}

#[async_trait]
impl PreemptionRequests for SqliteStore {
    /// Decides with [`PreemptionRequest::may_replace`] and writes in one IMMEDIATE
    /// transaction (SQLite's write lock makes the read and the write one compare-and-set).
    async fn request_preemption(
        &self,
        name: &str,
        token: FencingToken,
        request: &PreemptionRequest,
    ) -> Result<PreemptAnswer, StoreError> {
        let (name, request) = (name.to_string(), request.clone());
        self.with_conn(move |db| {
            let tx = db.write()?;
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
                            token_to_sql(token),
                            now,
                            request.by,
                            request.instance,
                            priority_to_sql(request.priority),
                            request.forceful,
                            request.note
                        ])?;
                        PreemptAnswer::Recorded(LeaseRecord {
                            request: Some(request.clone()),
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
        token: FencingToken,
        by: &str,
    ) -> Result<bool, StoreError> {
        let (name, by) = (name.to_string(), by.to_string());
        self.with_conn(move |db| {
            let tx = db.write()?;
            let now = now_ns();
            let changed = tx.prepare_cached(sql::WITHDRAW_REQUEST)?.execute(params![
                name,
                token_to_sql(token),
                now,
                by
            ])?;
            tx.commit()?;
            Ok(changed == 1)
        })
        .await
    }
}

#[async_trait]
impl RememberedIds for SqliteStore {
    /// The grant check and every id in one IMMEDIATE transaction: atomic whatever the
    /// change's size, and no other grant of `name` can commit in between.
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
        let (name, owner, change) = (name.to_string(), owner.to_string(), change.clone());
        self.with_conn(move |db| {
            let tx = db.write()?;
            let held =
                tx.prepare_cached(sql::HELD)?
                    .exists(params![name, owner, token, now_ns()])?;
            if held {
                let mut add = tx.prepare_cached(sql::REMEMBER)?;
                for id in change.added() {
                    add.execute(params![name, id])?;
                }
                let mut forget = tx.prepare_cached(sql::FORGET)?;
                for id in change.removed() {
                    forget.execute(params![name, id])?;
                }
            }
            tx.commit()?;
            Ok(held)
        })
        .await
    }

    async fn remembered(&self, name: &str) -> Result<Vec<String>, StoreError> {
        let name = name.to_string();
        self.with_conn(move |db| {
            let tx = db.read()?;
            let ids = tx
                .prepare_cached(sql::REMEMBERED)?
                .query_map(params![name], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            tx.finish()?;
            Ok(ids)
        })
        .await
    }
}

/// The file name of the default database in its state directory.
const DEFAULT_FILE: &str = "leases.sqlite";

/// The default database file, a persistent per-user state file (never in `/tmp`, whose
/// cleaners delete files): `$XDG_STATE_HOME/tenure/leases.sqlite` when `XDG_STATE_HOME` is
/// an absolute path, else `/var/lib/tenure/leases.sqlite` for root, else
/// `$HOME/.local/state/tenure/leases.sqlite`. The error says why there is none.
pub fn default_path() -> Result<PathBuf, NoStateDirectory> {
    default_path_from(
        std::env::var_os("XDG_STATE_HOME"),
        std::env::var_os("HOME"),
        rustix::process::geteuid().is_root(),
    )
}

fn default_path_from(
    xdg_state_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
    root: bool,
) -> Result<PathBuf, NoStateDirectory> {
    let absolute = |v: Option<std::ffi::OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    let dir = if let Some(state) = absolute(xdg_state_home) {
        state.join("tenure")
    } else if root {
        PathBuf::from("/var/lib/tenure")
    } else if let Some(home) = absolute(home) {
        home.join(".local/state/tenure")
    } else {
        return Err(NoStateDirectory);
    };
    Ok(dir.join(DEFAULT_FILE))
}

/// There is no default database file: not root, and neither `XDG_STATE_HOME` nor `HOME` is
/// an absolute path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no state directory: neither XDG_STATE_HOME nor HOME is an absolute path; set the section's `path`"
)]
pub struct NoStateDirectory;

/// Checks, without creating anything, that the directory of the default file `path` exists
/// and is usable, or can be created.
fn check_default_dir(path: &Path) -> Result<(), ConfigError> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    if dir.exists() {
        return check_path(path);
    }
    let ancestor = dir
        .ancestors()
        .find(|a| a.exists())
        .unwrap_or(Path::new("/"));
    if !ancestor.is_dir() || rustix::fs::access(ancestor, rustix::fs::Access::WRITE_OK).is_err() {
        return Err(path_error(
            path,
            format!(
                "state directory {} cannot be created: {} is not a writable directory",
                dir.display(),
                ancestor.display()
            ),
        ));
    }
    Ok(())
}

/// This crate's fragment of the reference configuration: the options of a `store =
/// "sqlite"` section (shown under `[lease.sqlite]` in `config/reference.toml`).
pub const REFERENCE: &str = include_str!("../reference.toml");

/// The options of a `store = "sqlite"` section (defaults: [`REFERENCE`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
#[non_exhaustive]
pub struct SqliteOptions {
    /// `path`: the database file (its directory must exist and be writable); `None`: the
    /// [`default_path`], whose directory is created when missing.
    pub path: Option<PathBuf>,
}

/// Opens `store = "sqlite"` sections ([`SqliteOptions`]). The busy timeout is the
/// section's `lease-operation-timeout`.
#[derive(Debug, Default, Clone, Copy)]
pub struct SqliteStoreFactory;

/// A section's database file, and whether it is the default one.
struct SectionPath {
    path: PathBuf,
    default: bool,
}

impl SqliteStoreFactory {
    fn path(section: &LeaseSection) -> Result<SectionPath, ConfigError> {
        let options: SqliteOptions = section.options()?;
        let key = || format!("{}.path", section.key());
        match options.path {
            Some(path) if path.as_os_str().is_empty() => Err(ConfigError::invalid(
                key(),
                "must not be empty (leave it out for the default state file)",
            )),
            Some(path) => Ok(SectionPath {
                path,
                default: false,
            }),
            None => Ok(SectionPath {
                path: default_path().map_err(|e| ConfigError::invalid(key(), e.to_string()))?,
                default: true,
            }),
        }
    }
}

#[async_trait]
impl StoreFactory for SqliteStoreFactory {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    fn defaults(&self) -> toml::Table {
        // The fragment is checked to parse (and to match the options' defaults) by a test.
        REFERENCE.parse().unwrap_or_default()
    }

    fn check(&self, section: &LeaseSection) -> Result<(), ConfigError> {
        match Self::path(section)? {
            SectionPath {
                path,
                default: true,
            } => check_default_dir(&path),
            SectionPath { path, .. } => check_path(&path),
        }
    }

    async fn open(&self, section: &LeaseSection) -> Result<Arc<dyn LeaseStore>, ConfigError> {
        let SectionPath { path, default } = Self::path(section)?;
        if default && let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| {
                path_error(
                    &path,
                    format!("cannot create the state directory {}: {e}", dir.display()),
                )
            })?;
        }
        let timeout = section.settings.lease_operation_timeout;
        let store = tokio::task::spawn_blocking(move || SqliteStore::open(path, timeout))
            .await
            .map_err(|e| {
                ConfigError::invalid(section.key(), format!("opening the store failed: {e}"))
            })??;
        Ok(Arc::new(store))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure_lease::TenureConfig;

    #[test]
    fn the_reference_fragment_is_the_defaults() {
        let options: SqliteOptions = toml::from_str(REFERENCE).unwrap();
        assert_eq!(options, SqliteOptions::default());
    }

    #[test]
    fn options_are_read_naming_the_key() {
        let section = |extra: &str| {
            let text = format!("[lease.f]\nstore = \"sqlite\"\n{extra}");
            TenureConfig::from_toml_str(&text, "t")
                .unwrap()
                .lease_section("f")
                .unwrap()
        };
        let s = SqliteStoreFactory::path(&section("path = \"/x/y.sqlite\""))
            .ok()
            .unwrap();
        assert_eq!((s.path, s.default), (PathBuf::from("/x/y.sqlite"), false));
        for (extra, key) in [
            ("paht = \"/x\"", "`lease.f.paht`"),
            ("path = \"\"", "`lease.f.path`"),
            ("path = 3", "`lease.f.path`"),
        ] {
            let err = SqliteStoreFactory
                .check(&section(extra))
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{extra}: {err}");
        }
    }

    #[test]
    fn the_default_file_is_in_a_persistent_state_directory() {
        let p = |xdg: Option<&str>, home: Option<&str>, root| {
            default_path_from(xdg.map(Into::into), home.map(Into::into), root)
        };
        assert_eq!(
            p(Some("/s"), Some("/h"), true).unwrap(),
            PathBuf::from("/s/tenure/leases.sqlite")
        );
        assert_eq!(
            p(None, Some("/h"), true).unwrap(),
            PathBuf::from("/var/lib/tenure/leases.sqlite")
        );
        assert_eq!(
            p(Some("relative"), Some("/h"), false).unwrap(),
            PathBuf::from("/h/.local/state/tenure/leases.sqlite")
        );
        let err = p(None, None, false).unwrap_err().to_string();
        assert!(
            err.contains("XDG_STATE_HOME") && err.contains("`path`"),
            "{err}"
        );
    }
}
