//! Writes fenced in the caller's own transaction on the lease file: accepted for the holder
//! with its token, refused for an old token once the lease moved on, and no grant commits
//! while a fenced transaction is open.

use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};
use tenure_lease::{AcquireOutcome, AcquireRequest, FencingToken, LeaseStore, StoreError};
use tenure_lease_kit::conformance::owner_request;
use tenure_store_sqlite::SqliteStore;
use tenure_store_sqlite::fence::{FenceError, check};

fn request(owner: &str, ttl: Duration) -> AcquireRequest {
    owner_request("report", owner, ttl)
}

async fn granted(store: &SqliteStore, owner: &str, ttl: Duration) -> FencingToken {
    match store.try_acquire(&request(owner, ttl)).await.unwrap() {
        AcquireOutcome::Granted(r) => r.token,
        other => panic!("{owner} not granted: {other:?}"),
    }
}

/// One fenced write of `value` by `owner` with `token`: `Ok` when committed.
fn write(
    conn: &mut Connection,
    owner: &str,
    token: FencingToken,
    value: i64,
) -> Result<(), FenceError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    check(&tx, "report", owner, token)?;
    tx.execute("UPDATE report SET value = ?1", [value]).unwrap();
    tx.commit().unwrap();
    Ok(())
}

fn value(conn: &Connection) -> i64 {
    conn.query_row("SELECT value FROM report", [], |r| r.get(0))
        .unwrap()
}

#[tokio::test]
async fn the_holder_writes_and_an_old_token_is_refused_after_the_lease_moved() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.sqlite");
    let store = SqliteStore::open(&path, Duration::from_secs(5)).unwrap();
    let mut conn = Connection::open(&path).unwrap();
    conn.execute_batch("CREATE TABLE report (value INTEGER); INSERT INTO report VALUES (0);")
        .unwrap();
    let first = granted(&store, "a", Duration::from_secs(30)).await;
    write(&mut conn, "a", first, 1).unwrap();
    assert_eq!(value(&conn), 1);
    // Another owner with the holder's token, or the holder with another token: refused.
    assert!(matches!(
        write(&mut conn, "b", first, 9),
        Err(FenceError::NotHeld { .. })
    ));
    assert!(matches!(
        write(&mut conn, "a", FencingToken::new(first.get() + 1), 9),
        Err(FenceError::NotHeld { .. })
    ));
    assert!(store.release("report", "a", first).await.unwrap());
    let second = granted(&store, "b", Duration::from_secs(30)).await;
    assert!(second > first);
    let err = write(&mut conn, "a", first, 2).unwrap_err();
    assert!(
        err.to_string().contains("report") && err.to_string().contains(&first.to_string()),
        "{err}"
    );
    write(&mut conn, "b", second, 3).unwrap();
    assert_eq!(value(&conn), 3, "only the current holder's writes landed");
}

#[tokio::test]
async fn no_grant_commits_while_a_fenced_transaction_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.sqlite");
    // A short busy timeout: an acquire blocked by the open transaction fails fast.
    let store = SqliteStore::open(&path, Duration::from_millis(100)).unwrap();
    let mut conn = Connection::open(&path).unwrap();
    conn.execute_batch("CREATE TABLE report (value INTEGER); INSERT INTO report VALUES (0);")
        .unwrap();
    let token = granted(&store, "a", Duration::from_millis(200)).await;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    check(&tx, "report", "a", token).unwrap();
    // The grant expires while the transaction is open; the next owner still cannot commit
    // a grant until it ends.
    tokio::time::sleep(Duration::from_millis(300)).await;
    match store
        .try_acquire(&request("b", Duration::from_secs(30)))
        .await
    {
        Err(StoreError::Unavailable { .. }) => {}
        other => panic!("a grant went through an open fenced transaction: {other:?}"),
    }
    tx.execute("UPDATE report SET value = 1", []).unwrap();
    tx.commit().unwrap();
    let next = granted(&store, "b", Duration::from_secs(30)).await;
    assert!(next > token);
    assert_eq!(value(&conn), 1);
}
