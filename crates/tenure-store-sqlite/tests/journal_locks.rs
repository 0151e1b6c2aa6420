//! What an open append transaction of the SQLite journal in a file of its own holds, and
//! what it does not: the journal file's write lock (so a new holder's claim waits for it)
//! but not the lease file's (so renewals, releases and grants go on). Every client that
//! must not wait has a busy timeout of zero: a lock it meets is an error at once, so the
//! tests measure no time.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tenure_journal::{Fence, Journal, Refusal, Written};
use tenure_lease::{AcquireOutcome, HeldLease, LeaseStore, Renewal};
use tenure_lease_kit::conformance::owner_request;
use tenure_store_sqlite::journal::sql;
use tenure_store_sqlite::rusqlite::Connection;
use tenure_store_sqlite::{SqliteJournal, SqliteStore, fence::FenceError};

const LEASE: &str = "shard-7";
const PID: &str = "cart|alice";
const TTL: Duration = Duration::from_secs(60);

struct Files {
    _dir: tempfile::TempDir,
    leases: PathBuf,
    journal: PathBuf,
}

fn files() -> Files {
    let dir = tempfile::tempdir().expect("a temporary directory");
    Files {
        leases: dir.path().join("leases.sqlite"),
        journal: dir.path().join("journal.sqlite"),
        _dir: dir,
    }
}

/// A connection set up as the journal's writer's: the journal file, the lease file
/// attached as `leases`.
fn writer_connection(f: &Files) -> Connection {
    let conn = Connection::open(&f.journal).expect("open the journal file");
    conn.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    conn.execute(
        "ATTACH DATABASE ?1 AS leases",
        [f.leases.to_str().expect("a UTF-8 path")],
    )
    .expect("attach the lease file");
    conn
}

fn store(path: &Path) -> SqliteStore {
    SqliteStore::open(path, Duration::ZERO).expect("open the lease store")
}

async fn grant(store: &SqliteStore, owner: &str) -> Fence {
    let req = owner_request(LEASE, owner, TTL);
    match store.try_acquire(&req).await.expect("acquire") {
        AcquireOutcome::Granted(record) => Fence::new(LEASE, owner, record.token),
        other => panic!("{owner} was not granted {LEASE}: {other:?}"),
    }
}

fn fence_of(f: &Fence) -> (&str, &str, tenure_lease::FencingToken) {
    (&f.lease, &f.owner, f.token)
}

/// While an append transaction is open on the journal's own file (its fence checked,
/// its event inserted, not committed), the holder renews its lease, releases it, and
/// another node is granted it, all through clients that wait for no lock; but the journal
/// file itself is locked.
#[tokio::test]
async fn an_open_append_leaves_the_lease_file_free() {
    let f = files();
    let _journal = SqliteJournal::open_beside(&f.journal, &f.leases, Duration::from_secs(5))
        .expect("open the journal");
    let leases = store(&f.leases);
    let a = grant(&leases, "node-a").await;

    let mut conn = writer_connection(&f);
    let tx = sql::begin(&mut conn).expect("begin");
    sql::append_in(&tx, fence_of(&a), PID, 1, &[b"added".to_vec()])
        .expect("the fence holds")
        .expect("the next sequence number");

    let renewed = leases
        .renew(
            "node-a",
            &[HeldLease {
                name: LEASE.into(),
                token: a.token,
            }],
            TTL,
        )
        .await
        .expect("a renewal does not wait for the append");
    assert!(
        matches!(renewed[..], [Renewal::Renewed { .. }]),
        "{renewed:?}"
    );
    assert!(
        leases
            .release(LEASE, "node-a", a.token)
            .await
            .expect("a release does not wait for the append"),
        "released"
    );
    grant(&leases, "node-b").await;

    let other = Connection::open(&f.journal).expect("open the journal file");
    other.busy_timeout(Duration::ZERO).expect("busy timeout");
    let busy = other.execute_batch("BEGIN IMMEDIATE");
    assert!(
        busy.is_err(),
        "the append holds the journal file's write lock"
    );
    tx.commit().expect("commit");
}

/// The old holder's append is pending when the new holder is granted: the new holder's
/// claim cannot complete before that append is decided; once it committed, the claim
/// succeeds and the new holder reads the event; after the claim the old holder's appends
/// and claims are refused, by the fence and by the floor.
#[tokio::test]
async fn a_claim_orders_the_new_holder_after_the_old_holders_appends() {
    let f = files();
    let impatient = SqliteJournal::open_beside(&f.journal, &f.leases, Duration::ZERO)
        .expect("open the journal");
    let journal = SqliteJournal::open_beside(&f.journal, &f.leases, Duration::from_secs(5))
        .expect("open the journal");
    let leases = store(&f.leases);
    let a = grant(&leases, "node-a").await;
    assert!(
        journal.claim(PID, &a).await.expect("claim"),
        "node-a claims"
    );

    let mut conn = writer_connection(&f);
    let tx = sql::begin(&mut conn).expect("begin");
    sql::append_in(&tx, fence_of(&a), PID, 1, &[b"by-a".to_vec()])
        .expect("the fence holds")
        .expect("the next sequence number");
    assert!(
        leases
            .release(LEASE, "node-a", a.token)
            .await
            .expect("release"),
        "released"
    );
    let b = grant(&leases, "node-b").await;
    assert!(
        impatient.claim(PID, &b).await.is_err(),
        "the claim waits for the pending append (here: fails at once, as it may not wait)"
    );
    tx.commit().expect("commit the old holder's append");

    assert!(
        journal.claim(PID, &b).await.expect("claim"),
        "node-b claims"
    );
    let events = journal.read(PID, 1, 10).await.expect("read");
    assert_eq!(
        events.len(),
        1,
        "the new holder reads the old holder's event"
    );
    assert_eq!(events[0].payload, b"by-a");

    assert!(
        !journal.claim(PID, &a).await.expect("claim"),
        "the old holder's claim is refused"
    );
    assert_eq!(
        journal
            .append(tenure_journal::Append {
                persistence_id: PID.into(),
                first_seq: 2,
                events: vec![b"late".to_vec()],
                fence: a.clone(),
            })
            .await
            .expect("append"),
        Written::Refused(Refusal::not_held(PID, &a)),
    );
    let tx = sql::begin(&mut conn).expect("begin");
    assert!(
        matches!(
            sql::check_floor(&tx, fence_of(&a)),
            Err(FenceError::NotHeld { .. })
        ),
        "the floor is the new holder's token"
    );
    sql::check_floor(&tx, fence_of(&b)).expect("the new holder is at the floor");
    drop(tx);
    assert_eq!(
        journal
            .append(tenure_journal::Append {
                persistence_id: PID.into(),
                first_seq: 2,
                events: vec![b"by-b".to_vec()],
                fence: b.clone(),
            })
            .await
            .expect("append"),
        Written::Appended(2..=2),
    );
}

/// With the journal in the lease file, an append transaction holds that file's write lock:
/// the grants wait for it (the fence cannot be checked otherwise), as documented.
#[tokio::test]
async fn in_the_lease_file_an_open_append_holds_the_grants() {
    let f = files();
    let _journal =
        SqliteJournal::open(&f.leases, Duration::from_secs(5)).expect("open the journal");
    let leases = store(&f.leases);
    let a = grant(&leases, "node-a").await;
    let mut conn = Connection::open(&f.leases).expect("open");
    let tx = sql::begin(&mut conn).expect("begin");
    sql::append_in(&tx, fence_of(&a), PID, 1, &[b"added".to_vec()])
        .expect("the fence holds")
        .expect("the next sequence number");
    assert!(
        leases.release(LEASE, "node-a", a.token).await.is_err(),
        "the release waits for the append (here: fails at once)"
    );
    tx.commit().expect("commit");
}
