//! The lease machinery's SQLite calls run inline on a multi-threaded runtime
//! (`tenure_lease::blocking`), but never wait there: a call that finds the file's write
//! lock taken by another connection runs again in the blocking pool, with the store's busy
//! timeout, and is granted once the lock is free, as on any runtime.

use std::sync::Arc;
use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};
use tenure_lease::{Acquired, Lease, LeaseSpec, LeaseStore};
use tenure_lease_kit::bench::api_settings;
use tenure_store_sqlite::SqliteStore;

/// Holds the write lock of the file at `path` from another connection for `held`, then
/// lets it go; returns once the lock is taken.
fn hold_write_lock(path: &std::path::Path, held: Duration) -> std::thread::JoinHandle<()> {
    let (taken, is_taken) = std::sync::mpsc::channel();
    let path = path.to_path_buf();
    let holder = std::thread::spawn(move || {
        let mut conn = Connection::open(&path).unwrap();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        taken.send(()).unwrap();
        std::thread::sleep(held);
        tx.commit().unwrap();
    });
    is_taken.recv().unwrap();
    holder
}

async fn acquire_behind_a_held_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.sqlite");
    let store: Arc<dyn LeaseStore> =
        Arc::new(SqliteStore::open(&path, Duration::from_secs(10)).unwrap());
    let spec = LeaseSpec::new("report", "a", store, api_settings()).unwrap();
    let lease = Lease::start(spec).await.unwrap();
    let holder = hold_write_lock(&path, Duration::from_millis(300));
    let acquired = lease.acquire().await;
    assert!(
        matches!(acquired, Ok(Acquired::Granted { .. })),
        "an acquire behind another connection's write lock waits for it: {acquired:?}"
    );
    holder.join().unwrap();
    assert!(lease.check_lease());
    let holder = hold_write_lock(&path, Duration::from_millis(300));
    assert!(lease.release().await.unwrap(), "the release waits too");
    holder.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_multi_threaded_runtime_a_busy_inline_call_waits_in_the_pool() {
    acquire_behind_a_held_write_lock().await;
}

#[tokio::test(flavor = "current_thread")]
async fn on_a_current_thread_runtime_calls_wait_in_the_pool() {
    acquire_behind_a_held_write_lock().await;
}
