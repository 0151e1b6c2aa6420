//! Tokens never go back: those of one file exceed the last one it issued even when the
//! wall clock (their floor) is behind it, those of a file that replaces a lost one exceed
//! the lost file's, and a file deleted without its log is refused rather than read with
//! the wrong log.

use std::time::Duration;

use tenure_lease::{AcquireOutcome, AcquireRequest, FencingToken, LeaseStore, StoreError};
use tenure_lease_kit::conformance::owner_request;
use tenure_store_sqlite::SqliteStore;

fn request(owner: &str) -> AcquireRequest {
    owner_request("nightly", owner, Duration::from_secs(5))
}

async fn acquire_release(store: &SqliteStore) -> FencingToken {
    let AcquireOutcome::Granted(r) = store.try_acquire(&request("a")).await.unwrap() else {
        panic!("held")
    };
    assert!(store.release("nightly", "a", r.token).await.unwrap());
    r.token
}

fn remove(path: &std::path::Path, suffix: &str) {
    let mut name = path.as_os_str().to_os_string();
    name.push(suffix);
    let _ = std::fs::remove_file(name);
}

/// The counter row's last token, not the wall clock, decides while the clock is behind
/// it, as after the clock was set back.
#[tokio::test]
async fn a_token_exceeds_the_last_one_issued_when_the_wall_clock_is_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.sqlite");
    let store = SqliteStore::open(&path, Duration::from_secs(1)).unwrap();
    let first = acquire_release(&store).await;
    // Grants issued while the wall clock ran about 11.6 days ahead of where it is now.
    let ahead = first.get() + 1_000_000_000_000;
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.busy_timeout(Duration::from_secs(5)).unwrap();
    let changed = raw
        .execute(
            "UPDATE tenure_fence SET last_token = ?1 WHERE name = 'nightly'",
            [i64::try_from(ahead).unwrap()],
        )
        .unwrap();
    assert_eq!(changed, 1, "the counter row of the first grant");
    let next = acquire_release(&store).await;
    assert_eq!(
        next,
        FencingToken::new(ahead + 1),
        "the token after {ahead} was issued"
    );
}

/// Issue 15's reproduction: three grants, the file deleted, a new process acquires.
#[tokio::test]
async fn a_new_file_issues_tokens_above_the_deleted_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.sqlite");
    let old = SqliteStore::open(&path, Duration::from_secs(1)).unwrap();
    let mut last = FencingToken::new(0);
    for _ in 0..3 {
        let t = acquire_release(&old).await;
        assert!(t > last);
        last = t;
    }
    drop(old);
    for suffix in ["-wal", "-shm", ""] {
        remove(&path, suffix);
    }
    let new = SqliteStore::open(&path, Duration::from_secs(1)).unwrap();
    let t = acquire_release(&new).await;
    assert!(t > last, "token {t} of the new file, {last} before");
}

/// Deleting only the database file leaves its `-wal`: opening the path then would read the
/// lost file's log as this file's. The store refuses, naming the files to delete.
#[tokio::test]
async fn a_file_deleted_without_its_log_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.sqlite");
    let store = SqliteStore::open(&path, Duration::from_secs(1)).unwrap();
    acquire_release(&store).await;
    std::fs::remove_file(&path).unwrap();
    let err = store.try_acquire(&request("a")).await.unwrap_err();
    assert!(matches!(err, StoreError::StateLost { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("{}-wal", path.display())) && text.contains("deleted or replaced"),
        "{text}"
    );
    let again = SqliteStore::open(&path, Duration::from_secs(1))
        .map(|_| ())
        .unwrap_err();
    assert!(again.to_string().contains("-wal"), "{again}");
    assert!(!path.exists(), "nothing created next to the orphaned log");
}

/// Inode of the file at `path`.
fn inode(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().ino()
}

/// `rm leases.sqlite-wal leases.sqlite-shm` under a holder: the main file alone holds older
/// content, and every connection of this process would go on reading the lost log's index.
/// The holder's renewals are refused, and so is a contender with a connection of its own in
/// the process, and a store the process opens afterwards: none is granted the lease.
#[tokio::test]
async fn a_log_deleted_under_a_holder_loses_its_grants_and_grants_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.sqlite");
    let holder = SqliteStore::open(&path, Duration::from_secs(1)).unwrap();
    let contender = SqliteStore::open(&path, Duration::from_secs(1)).unwrap();
    let AcquireOutcome::Granted(grant) = holder.try_acquire(&request("a")).await.unwrap() else {
        panic!("held")
    };
    remove(&path, "-wal");
    remove(&path, "-shm");
    let tried = contender.try_acquire(&request("b")).await;
    assert!(
        matches!(&tried, Err(StoreError::StateLost { .. })),
        "{tried:?}"
    );
    let text = tried.unwrap_err().to_string();
    assert!(text.contains("-wal or -shm"), "{text}");
    let held = [tenure_lease::HeldLease {
        name: "nightly".into(),
        token: grant.token,
    }];
    let renewed = holder.renew("a", &held, Duration::from_secs(5)).await;
    assert!(
        matches!(&renewed, Err(StoreError::StateLost { .. })),
        "{renewed:?}"
    );
    let reopened = SqliteStore::open(&path, Duration::from_secs(1))
        .map(|_| ())
        .unwrap_err();
    assert!(reopened.to_string().contains("-wal or -shm"), "{reopened}");
}

/// A copy taken before the grant is written over the file in place (same inode, older
/// content; the log checkpointed first, as a backup tool's restore leaves it): a contender
/// sees no grant in it, yet is not granted while the holder may still believe; the
/// holder's renewal finds its grant gone.
#[tokio::test]
async fn a_file_restored_in_place_grants_nothing_while_its_holders_may_believe() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.sqlite");
    let copy = dir.path().join("backup.sqlite");
    let holder = SqliteStore::open(&path, Duration::from_secs(1)).unwrap();
    let contender = SqliteStore::open(&path, Duration::from_secs(1)).unwrap();
    acquire_release(&holder).await;
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.busy_timeout(Duration::from_secs(5)).unwrap();
    raw.execute("VACUUM INTO ?1", [copy.display().to_string()])
        .unwrap();
    let AcquireOutcome::Granted(grant) = holder.try_acquire(&request("a")).await.unwrap() else {
        panic!("held")
    };
    let before = inode(&path);
    let (busy, _, _): (i64, i64, i64) = raw
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap();
    assert_eq!(busy, 0, "checkpointed");
    std::fs::write(&path, std::fs::read(&copy).unwrap()).unwrap();
    assert_eq!(inode(&path), before, "restored in place");

    let tried = contender.try_acquire(&request("b")).await;
    assert!(
        matches!(&tried, Err(StoreError::StateLost { .. })),
        "{tried:?}"
    );
    let text = tried.unwrap_err().to_string();
    assert!(text.contains("generation went back"), "{text}");
    let held = [tenure_lease::HeldLease {
        name: "nightly".into(),
        token: grant.token,
    }];
    let renewed = holder
        .renew("a", &held, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(renewed, vec![tenure_lease::Renewal::NotHeld]);
    // Refused for one ttl from the loss, whoever asks.
    let again = holder.try_acquire(&request("a")).await.unwrap_err();
    assert!(matches!(again, StoreError::StateLost { .. }), "{again}");
}
