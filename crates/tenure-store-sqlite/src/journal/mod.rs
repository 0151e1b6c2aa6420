//! The SQLite journal: events and snapshots of durable entities in a SQLite file, every
//! write fenced by the lease store's grant in the same transaction.
//!
//! By default the journal lives in the lease store's own file ([`SqliteJournal::open`]):
//! every write transaction holds the file's write lock, so no grant, renewal or release
//! of any lease of the file commits while an append checks its fence and writes (see
//! [`crate::fence`]). [`SqliteJournal::open_beside`] gives it a file of its own and
//! attaches the lease file to its connection; a write then holds the journal file's write
//! lock only and reads the lease file, so appends never hold up the renewals of the
//! leases, and a new holder [claims](Journal::claim) the journal before it reads, which
//! orders its reads after every write of an older grant (see [`sql::begin`]).
//!
//! **Group commit.** One writer thread per journal writes every append and snapshot
//! waiting at once in one transaction (at most [`SqliteJournal::with_max_batch`] of them),
//! each behind a savepoint with its own fence and sequence checks, so each is refused
//! alone, and one commit makes them all durable (`synchronous = FULL`). Reads use
//! connections of their own (WAL readers do not wait for the writer).
//!
//! **A lost file.** Before every batch and read the journal checks that its paths still
//! name the files it has open (device and inode); a file deleted or replaced is reopened,
//! so that no append is ever fenced by the grants of a lost lease file.

mod files;
pub mod sql;
mod writer;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::OptionalExtension;
use tenure_journal::group::{GroupCommit, Write};
use tenure_journal::{
    Append, Fence, Journal, JournalError, Refusal, SaveSnapshot, Snapshot, StoredEvent, Written,
    bigint_bounds, check_persistence_id,
};
use tenure_lease::{ConfigError, StoreError};

use files::{Files, Opened};

/// Most writes in one transaction by default.
pub const DEFAULT_MAX_BATCH: usize = 256;

/// Read connections kept open, at most.
const READERS: usize = 4;

/// A journal in SQLite (see the module docs). Cloning shares the writer and readers.
#[derive(Clone)]
pub struct SqliteJournal {
    inner: Arc<Inner>,
}

struct Inner {
    files: Files,
    /// The writes waiting for the writer thread.
    group: GroupCommit,
    readers: Mutex<Vec<Opened>>,
    /// The connection that claims run on, one claim at a time.
    claimer: Arc<tokio::sync::Mutex<Option<Opened>>>,
}

impl std::fmt::Debug for SqliteJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteJournal")
            .field("journal", &self.inner.files.journal)
            .field("leases", &self.inner.files.leases)
            .finish()
    }
}

impl SqliteJournal {
    /// A journal in the lease store's file at `path` (created with the lease tables when
    /// missing), fenced by its leases. `busy_timeout` bounds how long a write waits for
    /// another process's transaction (use the leases' `lease-operation-timeout`).
    pub fn open(path: impl AsRef<Path>, busy_timeout: Duration) -> Result<Self, ConfigError> {
        Self::with_files(Files {
            journal: path.as_ref().to_path_buf(),
            leases: None,
            busy_timeout,
        })
    }

    /// A journal in a file of its own at `path`, fenced by the leases of the lease store's
    /// file at `leases` (on the same host: the fence holds both files' write locks).
    pub fn open_beside(
        path: impl AsRef<Path>,
        leases: impl AsRef<Path>,
        busy_timeout: Duration,
    ) -> Result<Self, ConfigError> {
        let (journal, leases) = (path.as_ref(), leases.as_ref());
        if journal == leases {
            return Self::open(journal, busy_timeout);
        }
        Self::with_files(Files {
            journal: journal.to_path_buf(),
            leases: Some(leases.to_path_buf()),
            busy_timeout,
        })
    }

    fn with_files(files: Files) -> Result<Self, ConfigError> {
        let first = files.open()?;
        Ok(SqliteJournal {
            inner: Arc::new(Inner {
                files,
                group: GroupCommit::new(DEFAULT_MAX_BATCH),
                readers: Mutex::new(vec![first]),
                claimer: Arc::default(),
            }),
        })
    }

    /// This journal (and its clones) writing at most `max_batch` appends and snapshots per
    /// transaction (at least 1: one transaction per write), from its first write on: call
    /// it before.
    pub fn with_max_batch(self, max_batch: usize) -> Self {
        self.inner.group.set_max_batch(max_batch);
        self
    }

    /// The journal's file.
    pub fn path(&self) -> &Path {
        &self.inner.files.journal
    }

    /// The lease file the journal is fenced by.
    pub fn lease_path(&self) -> &Path {
        self.inner
            .files
            .leases
            .as_deref()
            .unwrap_or(&self.inner.files.journal)
    }

    /// Queues `write` for the writer thread (started at the first write) and waits for
    /// its answer.
    async fn write(&self, write: Write) -> Result<Written, JournalError> {
        let files = self.inner.files.clone();
        self.inner
            .group
            .submit(write, |batches| {
                std::thread::Builder::new()
                    .name("tenure-journal".into())
                    .spawn(move || writer::run(files, batches))
                    .map(drop)
            })
            .await
    }

    /// Runs `read` on a read connection in the blocking pool.
    async fn read_with<T: Send + 'static>(
        &self,
        persistence_id: &str,
        operation: &'static str,
        read: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, JournalError> {
        let inner = self.inner.clone();
        let failed = |e: StoreError| JournalError::store(persistence_id, operation, e);
        tokio::task::spawn_blocking(move || {
            let taken = inner
                .readers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop();
            let mut slot = taken;
            let conn = inner
                .files
                .current(&mut slot)
                .map_err(|e| StoreError::unavailable("sqlite", e.to_string()))?;
            let out = read(conn)
                .map_err(|e| StoreError::unavailable("sqlite", e.to_string()).caused_by(e));
            if let Some(opened) = slot {
                let mut readers = inner.readers.lock().unwrap_or_else(|e| e.into_inner());
                if readers.len() < READERS {
                    readers.push(opened);
                }
            }
            out
        })
        .await
        .map_err(|e| {
            failed(StoreError::backend(
                "sqlite",
                format!("read task failed: {e}"),
            ))
        })?
        .map_err(failed)
    }
}

#[async_trait]
impl Journal for SqliteJournal {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    async fn append(&self, append: Append) -> Result<Written, JournalError> {
        append.check()?;
        self.write(Write::Append(append)).await
    }

    async fn read(
        &self,
        persistence_id: &str,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, JournalError> {
        check_persistence_id(persistence_id)?;
        let pid = persistence_id.to_string();
        let (from, max) = bigint_bounds(from, max);
        self.read_with(persistence_id, "read", move |conn| {
            let mut stmt = conn.prepare_cached(sql::READ)?;
            stmt.query_map(rusqlite::params![pid, from, max], |r| {
                Ok(StoredEvent::from_columns(
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                ))
            })?
            .collect()
        })
        .await
    }

    async fn save_snapshot(&self, snapshot: SaveSnapshot) -> Result<Written, JournalError> {
        snapshot.check()?;
        self.write(Write::Snapshot(snapshot)).await
    }

    async fn load_snapshot(&self, persistence_id: &str) -> Result<Option<Snapshot>, JournalError> {
        check_persistence_id(persistence_id)?;
        let pid = persistence_id.to_string();
        self.read_with(persistence_id, "load snapshot", move |conn| {
            conn.prepare_cached(sql::LOAD_SNAPSHOT)?
                .query_row([pid], |r| {
                    Ok(Snapshot::from_columns(r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .optional()
        })
        .await
    }

    async fn claim(&self, persistence_id: &str, fence: &Fence) -> Result<bool, JournalError> {
        check_persistence_id(persistence_id)?;
        let Ok(token) = i64::try_from(fence.token.get()) else {
            return Ok(false);
        };
        // Every entity of a shard claims under the shard's grant: after the first, a read
        // finds the floor raised already.
        let lease = fence.lease.clone();
        let floor: Option<i64> = self
            .read_with(persistence_id, "claim", move |conn| {
                conn.prepare_cached(sql::FLOOR)?
                    .query_row([lease], |r| r.get(0))
                    .optional()
            })
            .await?;
        match floor {
            Some(f) if f > token => return Ok(false),
            Some(f) if f == token => return Ok(true),
            _ => {}
        }
        let mut slot = self.inner.claimer.clone().lock_owned().await;
        let (files, fence, pid) = (
            self.inner.files.clone(),
            fence.clone(),
            persistence_id.to_string(),
        );
        tokio::task::spawn_blocking(move || {
            let failed = |e: StoreError| JournalError::store(&pid, "claim", e);
            let conn = files
                .current(&mut slot)
                .map_err(|e| failed(StoreError::unavailable("sqlite", e.to_string())))?;
            let unavailable =
                |e: rusqlite::Error| StoreError::unavailable("sqlite", e.to_string()).caused_by(e);
            let tx = sql::begin(conn).map_err(|e| failed(unavailable(e)))?;
            match sql::claim_in(&tx, (&fence.lease, &fence.owner, fence.token)) {
                Ok(()) => tx
                    .commit()
                    .map(|()| true)
                    .map_err(|e| failed(unavailable(e))),
                Err(e) => Refusal::from_fence(&pid, "claim", &fence, e).map(|_| false),
            }
        })
        .await
        .map_err(|e| {
            JournalError::store(
                persistence_id,
                "claim",
                StoreError::backend("sqlite", format!("claim task failed: {e}")),
            )
        })?
    }

    async fn persistence_ids(&self) -> Result<Vec<String>, JournalError> {
        self.read_with("", "list", |conn| {
            let mut stmt = conn.prepare_cached(sql::PERSISTENCE_IDS)?;
            stmt.query_map([], |r| r.get(0))?.collect()
        })
        .await
    }
}
