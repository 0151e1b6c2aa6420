//! A suspend of the host counts in a fair waiter's timing (the holder clock,
//! `CLOCK_BOOTTIME`, like the waiter row's expiry in the file): after a resume, the waiter
//! refreshes its row at once instead of a third of a ttl of monotonic time later, by when
//! the row may have expired.
//!
//! On tokio's paused clock: time moves only when every task waits (and not while a store
//! call runs in the blocking pool), so "at once" is judged in the waiter's own time.

use std::time::Duration;

use tokio::time::Instant;

use tenure_lease::{AcquireOutcome, AcquireRequest, FairQueue, HolderClock, LeaseStore};
use tenure_lease_kit::conformance::owner_request;
use tenure_store_sqlite::SqliteStore;

const TTL: Duration = Duration::from_secs(60);

fn request(owner: &str) -> AcquireRequest {
    owner_request("line", owner, TTL)
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

#[tokio::test(start_paused = true)]
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
    let joined = loop {
        if let Some(e) = waiter_expiry(&raw) {
            break e;
        }
        if waiting.is_finished() {
            panic!(
                "the waiter ended before joining the line: {:?}",
                waiting.await
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Longer than a third of the ttl (its refresh interval) on the holder clock; no
    // monotonic time passes.
    suspend.suspend(TTL / 2);
    let resumed = Instant::now();
    // The waiter's next look (a cross-process poll, at most 250 ms away) refreshes the row;
    // without the suspend counted it would wait until a third of the ttl (20 s) of
    // monotonic time had passed since it joined.
    while waiter_expiry(&raw) == Some(joined) {
        assert!(
            resumed.elapsed() < TTL / 6,
            "the waiter did not refresh its row after the suspend"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    waiting.abort();
}
