//! SQLite store benchmarks.
//!
//! The direct way is the store's own operations by hand on the same file: before each
//! transaction the check that the paths still name the files the connection opened (the
//! store's lost-file check, a `statx` of the file, its `-wal` and its `-shm`), then the
//! store's SQL with the file's identity: read first in each transaction; in a write, the
//! generation witness asked for a higher generation, and the next generation written and
//! shown on the witness before the commit.
//!
//! 1. `acquire_release`: one acquire and one release through the Lease API (the Lease
//!    handle, SQLite inline on the calling thread) against the direct way, each pair from
//!    the bench's thread.
//! 2. `renew`: a renewal through the Lease API (reentrant acquire) and through the store's
//!    batched renew, against the direct way.
//! 3. The thin path: acquire+release through the Lease API and the store SPI
//!    against the direct way, alternating rounds in one run, every batch run by a task on
//!    the runtime ([`thin_path`]); then the same against the SQL alone (no file check).
//!    Printed after the criterion groups.
//! 4. Renewal cost: store round trips per heartbeat interval for one owner holding 1, 100
//!    and 10,000 leases through LeaseActors.
//!
//! Run: `cargo bench -p tenure-store-sqlite --bench sqlite_lease`

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use tenure_lease::{AcquireOutcome, Acquired, HeldLease, Lease, LeaseSpec, LeaseStore};
use tenure_lease_kit::bench::{
    Counting, Holders, ThinPath, api_settings, bracket_intervals, intervals, lease_acquire_release,
    lease_counts, renewal_settings, runtime, spi_request, thin_path,
};
use tenure_lease_kit::report::Report;
use tenure_store_sqlite::witness::Witness;
use tenure_store_sqlite::{SqliteStore, sql, store_now_ns, token_floor};

/// A connection configured like the store's.
fn direct(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("open");
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.pragma_update(None, "synchronous", "FULL").unwrap();
    conn
}

/// Device and inode of the file at `path`, and of its `-wal` and `-shm`.
fn file_id(path: &Path) -> [(u64, u64); 3] {
    let id = |suffix: &str| {
        let mut name = path.as_os_str().to_os_string();
        name.push(suffix);
        let m = std::fs::metadata(&name).expect("the lease file");
        (m.dev(), m.ino())
    };
    [id(""), id("-wal"), id("-shm")]
}

/// The store's own operations by hand: before each transaction, the check that `path`
/// and its log still name the files the connection opened (`file`), as the store makes it
/// (where the store would reopen a deleted or replaced file, this asserts: the bench loses
/// none), then the store's SQL, with the identity and the generation witness.
struct Direct {
    conn: Connection,
    path: PathBuf,
    file: [(u64, u64); 3],
    witness: Arc<Witness>,
}

impl Direct {
    fn open(path: &Path) -> Direct {
        let conn = direct(path);
        Direct {
            file: file_id(path),
            path: path.to_path_buf(),
            witness: Witness::for_file(path).expect("the witness"),
            conn,
        }
    }

    /// The connection, after the store's file check when `check`.
    fn conn(&mut self, check: bool) -> (&mut Connection, &Witness) {
        if check {
            assert_eq!(
                file_id(&self.path),
                self.file,
                "the lease file was replaced"
            );
        }
        (&mut self.conn, &self.witness)
    }
}

/// One write transaction as the store runs it: the identity read and no process relying
/// on a higher generation; `body` with the transaction and the store's clock; then the next
/// generation written, shown on the witness first, and the commit.
fn write<T>(
    (conn, witness): (&mut Connection, &Witness),
    body: impl FnOnce(&rusqlite::Transaction<'_>, i64) -> T,
) -> T {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    let (_store, generation): (String, i64) = tx
        .prepare_cached(sql::IDENTITY)
        .unwrap()
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap();
    assert_eq!(witness.above(generation).unwrap(), None, "state lost");
    let answer = body(&tx, store_now_ns());
    let next = (generation + 1).max(token_floor());
    tx.prepare_cached(sql::SET_GENERATION)
        .unwrap()
        .execute([next])
        .unwrap();
    witness.hold(next).unwrap();
    tx.commit().unwrap();
    answer
}

const TTL_NS: i64 = 60_000_000_000;

fn direct_acquire(db: (&mut Connection, &Witness), name: &str, owner: &str) -> i64 {
    write(db, |tx, now| {
        let mut stmt = tx.prepare_cached(sql::SELECT_CURRENT).unwrap();
        let held = stmt.exists(params![name, now]).unwrap();
        drop(stmt);
        assert!(!held);
        let lost_at: Option<String> = tx
            .prepare_cached(sql::META)
            .unwrap()
            .query_row(["lost_at"], |r| r.get(0))
            .optional()
            .unwrap();
        assert!(lost_at.is_none());
        let token = sql::next_token(tx, name, token_floor()).unwrap();
        tx.prepare_cached(sql::INSERT_GRANT)
            .unwrap()
            .execute(params![
                name,
                owner,
                token,
                now + TTL_NS,
                None::<String>,
                "direct",
                0i64,
                0i64
            ])
            .unwrap();
        token
    })
}

fn direct_release(db: (&mut Connection, &Witness), name: &str, owner: &str, token: i64) {
    write(db, |tx, now| {
        let n = tx
            .prepare_cached(sql::RELEASE)
            .unwrap()
            .execute(params![name, owner, token, now])
            .unwrap();
        assert_eq!(n, 1);
    })
}

fn direct_extend(db: (&mut Connection, &Witness), name: &str) {
    write(db, |tx, now| {
        let held = tx
            .prepare_cached(sql::SELECT_CURRENT)
            .unwrap()
            .exists(params![name, now])
            .unwrap();
        assert!(held);
        tx.prepare_cached(sql::EXTEND)
            .unwrap()
            .execute(params![name, now + TTL_NS, None::<String>])
            .unwrap();
    })
}

fn direct_renew_batch(db: (&mut Connection, &Witness), owner: &str, batch: &str) {
    write(db, |tx, now| {
        let n = tx
            .prepare_cached(sql::RENEW_BATCH)
            .unwrap()
            .query_map(params![owner, now, now + TTL_NS, batch], |r| {
                r.get::<_, String>(0)
            })
            .unwrap()
            .count();
        assert_eq!(n, 1);
    })
}

fn acquire_release(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.sqlite");
    let rt = runtime().expect("runtime");
    let store: Arc<dyn LeaseStore> =
        Arc::new(SqliteStore::open(&path, Duration::from_secs(5)).unwrap());
    let lease = rt.block_on(async {
        Lease::start(LeaseSpec::new("api", "bench-owner", store.clone(), api_settings()).unwrap())
            .await
            .unwrap()
    });
    // The same through a current-thread runtime: the actor runs on the calling thread, so
    // only the hop to the blocking pool remains.
    let local = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local_lease = local.block_on(async {
        let spec =
            LeaseSpec::new("api-local", "bench-owner", store.clone(), api_settings()).unwrap();
        Lease::start(spec).await.unwrap()
    });
    let mut direct = Direct::open(&path);
    let mut g = c.benchmark_group("acquire_release");
    g.bench_function("lease_api", |b| {
        b.iter(|| rt.block_on(lease_acquire_release(&lease)))
    });
    g.bench_function("lease_api_current_thread", |b| {
        b.iter(|| local.block_on(lease_acquire_release(&local_lease)))
    });
    g.bench_function("direct_sql", |b| {
        b.iter(|| {
            let token = direct_acquire(direct.conn(true), "direct", "bench-owner");
            direct_release(direct.conn(true), "direct", "bench-owner", token);
        })
    });
    g.finish();
}

fn renew(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.sqlite");
    let rt = runtime().expect("runtime");
    let store: Arc<dyn LeaseStore> =
        Arc::new(SqliteStore::open(&path, Duration::from_secs(5)).unwrap());
    let lease = rt.block_on(async {
        let l = Lease::start(
            LeaseSpec::new("api", "bench-owner", store.clone(), api_settings()).unwrap(),
        )
        .await
        .unwrap();
        l.acquire().await.unwrap();
        l
    });
    let spi_token = rt.block_on(async {
        let req = spi_request("spi", Duration::from_secs(60));
        match store.try_acquire(&req).await.unwrap() {
            AcquireOutcome::Granted(r) => r.token,
            AcquireOutcome::Held(_) => unreachable!(),
        }
    });
    let mut direct = Direct::open(&path);
    let token = direct_acquire(direct.conn(true), "direct", "bench-owner");
    let batch = format!("[[\"direct\",{token}]]");
    let mut g = c.benchmark_group("renew");
    g.bench_function("lease_api_reacquire", |b| {
        b.iter(|| {
            rt.block_on(async {
                assert!(matches!(
                    lease.acquire().await.unwrap(),
                    Acquired::Granted { .. }
                ))
            })
        })
    });
    g.bench_function("direct_sql_extend", |b| {
        b.iter(|| direct_extend(direct.conn(true), "direct"))
    });
    let held = [HeldLease {
        name: "spi".into(),
        token: spi_token,
    }];
    g.bench_function("store_batch_renew", |b| {
        b.iter(|| {
            rt.block_on(async {
                assert_eq!(
                    store
                        .renew("bench-owner", &held, Duration::from_secs(60))
                        .await
                        .unwrap(),
                    vec![tenure_lease::Renewal::plain(true)]
                )
            })
        })
    });
    g.bench_function("direct_sql_batch_renew", |b| {
        b.iter(|| direct_renew_batch(direct.conn(true), "bench-owner", &batch))
    });
    g.finish();
}

/// The thin path: one acquire+release pair each way, alternating rounds in one run; the
/// direct way issues the store's own operations (its file check and its SQL) when
/// `file_check`, its SQL alone otherwise.
fn thin(file_check: bool) -> ThinPath {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("thin.sqlite");
    let rt = runtime().expect("runtime");
    let store: Arc<dyn LeaseStore> =
        Arc::new(SqliteStore::open(&path, Duration::from_secs(5)).unwrap());
    let lease = rt.block_on(async {
        let spec = LeaseSpec::new("thin-api", "bench-owner", store.clone(), api_settings());
        Lease::start(spec.unwrap()).await.unwrap()
    });
    let direct = std::sync::Mutex::new(Direct::open(&path));
    let req = spi_request("thin-spi", Duration::from_secs(60));
    println!(
        "\nthe direct way: {}",
        if file_check {
            "the store's operations by hand (the lost-file check, then the SQL with the identity and its witness)"
        } else {
            "the store's SQL with the identity and its witness (no lost-file check)"
        }
    );
    thin_path(&rt, &lease, &store, &req, move || {
        let mut direct = direct.lock().unwrap();
        let token = direct_acquire(direct.conn(file_check), "thin-direct", "bench-owner");
        direct_release(direct.conn(file_check), "thin-direct", "bench-owner", token);
        std::future::ready(())
    })
}

fn renewal_cost(report: &mut Report) {
    println!("\nrenewal cost: one owner, LeaseActors on one SQLite file, heartbeat-interval 1s");
    println!(
        "{:>8} {:>12} {:>22} {:>22}",
        "leases", "intervals", "round trips/interval", "leases per round trip"
    );
    let rt = runtime().expect("runtime");
    let intervals = intervals();
    for n in lease_counts() {
        let dir = tempfile::tempdir().unwrap();
        let store = Counting::new(Arc::new(
            SqliteStore::open(dir.path().join("cost.sqlite"), Duration::from_secs(5)).unwrap(),
        ));
        let s = renewal_settings();
        let (counts, all_held) = rt.block_on(async {
            let names = (0..n).map(|i| format!("lease-{i}")).collect();
            let holders = Holders::start(store.clone(), "owner", names, s).await;
            let (before, after) = bracket_intervals(s.heartbeat_interval, || store.counts()).await;
            let all_held = holders.all_held();
            holders.stop();
            (after - before, all_held)
        });
        assert!(all_held, "every lease still held");
        let (trips, per_trip) = (
            counts.calls as f64 / intervals as f64,
            counts.leases as f64 / counts.calls.max(1) as f64,
        );
        println!("{n:>8} {intervals:>12} {trips:>22.2} {per_trip:>22.1}");
        report.row([
            format!("renewals, {n} leases held by LeaseActors of one owner: store round trips per heartbeat interval, over {intervals}"),
            format!("{trips:.2} ({per_trip:.1} leases each)"),
        ]);
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(200).measurement_time(Duration::from_secs(8)).warm_up_time(Duration::from_secs(2));
    targets = acquire_release, renew
}

fn main() {
    tenure_lease_kit::bench::store_bench_main(
        "tenure-store-sqlite",
        "sqlite_lease",
        benches,
        |report| {
            thin(true).add_to(report, "direct (the store's operations by hand)");
            thin(false).add_to(report, "direct (its SQL alone)");
            renewal_cost(report);
            report.note("Per pair from the bench's thread (Lease API, SPI and direct, SQLite inline on that thread) and renewals: criterion's output of `acquire_release` and `renew`, not in this table.");
        },
    );
}
