//! A suspend of the host counts in a fair waiter's timing (the holder clock,
//! `CLOCK_BOOTTIME`, like the waiter row's expiry in the file): after a resume, the waiter
//! refreshes its row at once instead of a third of a ttl of monotonic time later, by when
//! the row may have expired.

use std::time::{Duration, Instant};

use tenure_lease::{AcquireOutcome, AcquireRequest, HolderClock, LeaseStore};
use tenure_store_sqlite::SqliteStore;

const TTL: Duration = Duration::from_secs(60);

fn request(owner: &str) -> AcquireRequest {
    AcquireRequest {
        name: "line".into(),
        owner: owner.into(),
        instance: format!("{owner}-1"),
        ttl: TTL,
        ..AcquireRequest::default()
    }
}

/// The expiry of the waiter row of `line`, if there is one.
fn waiter_expiry(conn: &rusqlite::Connection) -> Option<i64> {
    use rusqlite::OptionalExtension;
    conn.query_row(
        "SELECT expires_at FROM tenure_waiter WHERE name = 'line'",
        [],
        |r| r.get(0),
    )
    .optional()
    .expect("read the waiters")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_refreshes_its_row_at_once_after_a_suspend() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.sqlite");
    let holder = SqliteStore::open(&path, Duration::from_secs(5)).unwrap();
    let granted = holder.try_acquire(&request("a")).await.unwrap();
    assert!(matches!(granted, AcquireOutcome::Granted(_)));
    let (clock, suspend) = HolderClock::manual();
    let waiter = SqliteStore::open(&path, Duration::from_secs(5))
        .unwrap()
        .with_clock(clock);
    let waiting = tokio::spawn(async move {
        waiter
            .acquire_fair(&request("b"), Duration::from_secs(600))
            .await
    });
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.busy_timeout(Duration::from_secs(5)).unwrap();
    let limit = Instant::now() + Duration::from_secs(30);
    let joined = loop {
        if let Some(e) = waiter_expiry(&raw) {
            break e;
        }
        assert!(Instant::now() < limit, "the waiter never joined the line");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Longer than a third of the ttl (its refresh interval) on the holder clock; no
    // monotonic time passes.
    suspend.suspend(TTL / 2);
    // A generous bound against hangs, far below the 20 s of monotonic time the waiter
    // would otherwise wait before its next refresh.
    let limit = Instant::now() + Duration::from_secs(10);
    while waiter_expiry(&raw) == Some(joined) {
        assert!(
            Instant::now() < limit,
            "the waiter did not refresh its row after the suspend"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    waiting.abort();
}
