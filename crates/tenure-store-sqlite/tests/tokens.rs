//! Tokens of one file never go back: each grant's token exceeds the last one the file
//! issued, even when the wall clock (the floor that keeps tokens above a lost file's) is
//! behind it, as after the clock was set back.

use std::time::Duration;

use tenure_lease::{AcquireOutcome, AcquireRequest, FencingToken, LeaseStore};
use tenure_store_sqlite::SqliteStore;

async fn acquire_release(store: &SqliteStore) -> FencingToken {
    let req = AcquireRequest {
        name: "nightly".into(),
        owner: "a".into(),
        instance: "a-1".into(),
        ttl: Duration::from_secs(5),
        ..AcquireRequest::default()
    };
    let AcquireOutcome::Granted(r) = store.try_acquire(&req).await.unwrap() else {
        panic!("held")
    };
    assert!(store.release("nightly", "a", r.token).await.unwrap());
    r.token
}

#[tokio::test]
async fn a_token_exceeds_the_last_one_issued_when_the_wall_clock_is_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.sqlite");
    let store = SqliteStore::open(&path, Duration::from_secs(1)).unwrap();
    let first = acquire_release(&store).await;
    // Grants issued while the wall clock ran about 11.6 days ahead of where it is now.
    let ahead = i64::try_from(first.get()).unwrap() + 1_000_000_000_000;
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.busy_timeout(Duration::from_secs(5)).unwrap();
    let changed = raw
        .execute(
            "UPDATE tenure_fence SET last_token = ?1 WHERE name = 'nightly'",
            [ahead],
        )
        .unwrap();
    assert_eq!(changed, 1, "the counter row of the first grant");
    let next = acquire_release(&store).await;
    assert_eq!(
        next,
        FencingToken::new(u64::try_from(ahead).unwrap() + 1),
        "the token after {ahead} was issued"
    );
}
