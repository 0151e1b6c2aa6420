//! The conformance suite against the SQLite store, in one process (each client its own
//! connection, as separate processes would have).

use std::any::Any;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::Connection;
use tenure_lease::LeaseStore;
use tenure_lease::conformance::{Harness, test_settings};
use tenure_store_sqlite::SqliteStore;

struct SqliteHarness {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl SqliteHarness {
    async fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("leases.sqlite");
        SqliteHarness { _dir: dir, path }
    }
}

/// Holds SQLite's write lock from another connection: every store operation waits past
/// the operation timeout.
struct WriteLock(#[allow(dead_code)] Connection);

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
}

tenure_lease::conformance_tests!(SqliteHarness::new());
