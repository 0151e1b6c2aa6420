//! Opening a lease file that other processes keep busy.

use std::sync::mpsc;
use std::time::Duration;

use tenure_store_sqlite::SqliteStore;

/// A process starting while another holds the file's write lock for longer than one
/// operation may wait (a busy file, a store locked by an operator) opens it once the lock
/// is free, instead of failing to start with "database is locked".
#[test]
fn opening_waits_for_a_write_lock_longer_than_an_operation_does() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.sqlite");
    drop(SqliteStore::open(&path, Duration::from_millis(100)).unwrap());
    let (locked, is_locked) = mpsc::channel();
    let holder = {
        let path = path.clone();
        std::thread::spawn(move || {
            let conn = rusqlite::Connection::open(&path).unwrap();
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            locked.send(()).unwrap();
            // Ten times what an operation of the store opened below waits.
            std::thread::sleep(Duration::from_secs(1));
            conn.execute_batch("COMMIT").unwrap();
        })
    };
    is_locked.recv().unwrap();
    let opened = SqliteStore::open(&path, Duration::from_millis(100));
    holder.join().unwrap();
    opened.expect("opened once the write lock was free");
}
