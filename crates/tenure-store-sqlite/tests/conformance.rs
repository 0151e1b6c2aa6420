//! The conformance suite against the SQLite store, in one process (each client its own
//! connection, as separate processes would have).

use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::Connection;
use tenure_lease::LeaseStore;
use tenure_lease_kit::conformance::state_loss::StateLoss;
use tenure_lease_kit::conformance::{AnswerDelay, Harness, test_settings};
use tenure_store_sqlite::SqliteStore;

/// How the file is lost in [`StateLoss::lose_state`].
#[derive(Clone, Copy)]
enum Loss {
    /// Deleted with its `-wal` and `-shm` files (`rm leases.sqlite*`).
    Deleted,
    /// Replaced by a copy taken at the checkpoint (a backup restored).
    Restored,
    /// Its `-wal` and `-shm` deleted (`rm leases.sqlite-wal leases.sqlite-shm`): the main
    /// file alone holds older content.
    LogDeleted,
    /// Overwritten in place by a copy taken at the checkpoint (same inode), after its log
    /// was checkpointed into it.
    RestoredInPlace,
}

struct SqliteHarness {
    dir: tempfile::TempDir,
    path: PathBuf,
    loss: Loss,
}

impl SqliteHarness {
    async fn new() -> Self {
        SqliteHarness::losing(Loss::Deleted).await
    }

    async fn losing(loss: Loss) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("leases.sqlite");
        SqliteHarness { dir, path, loss }
    }

    fn copy(&self) -> PathBuf {
        self.dir.path().join("checkpoint.sqlite")
    }
}

/// Holds SQLite's write lock from another connection: every store operation waits past
/// the operation timeout.
struct WriteLock(#[allow(dead_code)] Connection);

/// SQLite's late answers: a write lock held by another connection while "delayed". An
/// operation started meanwhile waits for the lock inside the store (its caller gives up at
/// its operation timeout, the operation goes on) and completes once the lock is released:
/// applied, its answer lost. The delayed client's busy timeout outlasts any delay.
struct LockedWhileDelayed {
    path: PathBuf,
    lock: Mutex<Option<WriteLock>>,
}

impl AnswerDelay for LockedWhileDelayed {
    fn set(&self, delay: Option<Duration>) {
        let mut lock = self.lock.lock().unwrap();
        *lock = delay.map(|_| {
            let conn = Connection::open(&self.path).expect("open");
            conn.execute_batch("BEGIN EXCLUSIVE").expect("lock");
            WriteLock(conn)
        });
    }
}

#[async_trait]
impl Harness for SqliteHarness {
    async fn client(&self) -> Arc<dyn LeaseStore> {
        Arc::new(
            SqliteStore::open(&self.path, test_settings().lease_operation_timeout).expect("open"),
        )
    }
    /// A restart of an embedded store: every connection is closed (clients are dropped by
    /// the suite before it restarts) and the file reopened.
    async fn restart(&self) {
        let store = SqliteStore::open(&self.path, Duration::from_secs(1)).expect("reopen");
        drop(store);
    }
    async fn outage(&self) -> Box<dyn Any + Send> {
        let conn = Connection::open(&self.path).expect("open");
        conn.execute_batch("BEGIN EXCLUSIVE").expect("lock");
        Box::new(WriteLock(conn))
    }
    async fn delayed_client(&self) -> (Arc<dyn LeaseStore>, Box<dyn AnswerDelay>) {
        let client = SqliteStore::open(&self.path, Duration::from_secs(30)).expect("open");
        let delay = LockedWhileDelayed {
            path: self.path.clone(),
            lock: Mutex::new(None),
        };
        (Arc::new(client), Box::new(delay))
    }
    /// The rows of `name` in the waiters' table, expired or not (a row that was not
    /// removed counts until a later waiter's join removes it), read on a connection of their own.
    async fn fair_waiters(&self, name: &str) -> Option<usize> {
        let conn = Connection::open(&self.path).expect("open");
        let count: i64 = conn
            .query_row(
                tenure_store_sqlite::sql::WAITING,
                rusqlite::params![name, tenure_store_sqlite::store_now_ns()],
                |r| r.get(1),
            )
            .expect("count the waiters");
        Some(usize::try_from(count).expect("a count"))
    }
}

/// Removes the file's `-wal` and `-shm` first: a process that reopened the path in between
/// would otherwise read the lost file's log.
fn remove_sidecars(path: &Path) {
    for suffix in ["-wal", "-shm"] {
        let mut name = path.as_os_str().to_os_string();
        name.push(suffix);
        match std::fs::remove_file(&name) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("remove {name:?}: {e}"),
        }
    }
}

#[async_trait]
impl StateLoss for SqliteHarness {
    async fn checkpoint(&self) {
        let conn = Connection::open(&self.path).expect("open");
        conn.execute("VACUUM INTO ?1", [self.copy().display().to_string()])
            .expect("copy the lease file");
    }

    async fn lose_state(&self) {
        match self.loss {
            Loss::Deleted => {
                remove_sidecars(&self.path);
                std::fs::remove_file(&self.path).expect("delete the lease file")
            }
            Loss::Restored => {
                remove_sidecars(&self.path);
                std::fs::rename(self.copy(), &self.path).expect("restore the old copy")
            }
            Loss::LogDeleted => remove_sidecars(&self.path),
            Loss::RestoredInPlace => {
                let conn = Connection::open(&self.path).expect("open");
                conn.busy_timeout(Duration::from_secs(5))
                    .expect("busy timeout");
                let busy: i64 = conn
                    .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
                    .expect("checkpoint");
                assert_eq!(busy, 0, "the log checkpointed into the file");
                let old = std::fs::read(self.copy()).expect("read the old copy");
                std::fs::write(&self.path, old).expect("restore the old copy in place");
            }
        }
    }

    /// A process whose connections used a deleted log uses the file no more (its
    /// connections would read the lost log's index): it refuses until restarted.
    fn resumes(&self) -> bool {
        !matches!(self.loss, Loss::LogDeleted)
    }
}

tenure_lease_kit::conformance_tests!(SqliteHarness::new(); fair_queue, preemption_requests, remembered_ids, grant_changes);

mod file_deleted {
    use super::*;
    tenure_lease_kit::state_loss_tests!(SqliteHarness::losing(Loss::Deleted));
}

mod file_restored_from_a_copy {
    use super::*;
    tenure_lease_kit::state_loss_tests!(SqliteHarness::losing(Loss::Restored));
}

mod log_deleted {
    use super::*;
    tenure_lease_kit::state_loss_tests!(SqliteHarness::losing(Loss::LogDeleted));
}

mod file_restored_in_place {
    use super::*;
    tenure_lease_kit::state_loss_tests!(SqliteHarness::losing(Loss::RestoredInPlace));
}
