//! PostgreSQL store benchmarks, against a server the bench starts (Debian's `postgresql`).
//!
//! 1. `acquire_release`: one acquire and one release through the Lease API (LeaseActor,
//!    pool, store) and through the store SPI, against the very same SQL statements issued
//!    directly on the store's own connection (`direct_sql`: a store with a pool of one
//!    connection, checked out once per pair, the statements prepared on it once) and on a
//!    plain tokio-postgres connection of the bench's own (`direct_sql_own_connection`).
//!    The first is the thin path's measure. On a quiet machine the same statements take
//!    about 155 µs per pair on one connection and 280-340 µs on another, in the same run
//!    and for the whole run (where the scheduler puts each connection's server process
//!    relative to the client's threads, most likely: under load from other processes both
//!    take about 160 µs). Only the same connection compares Tenure's code rather than two
//!    connections' luck.
//! 2. `renew`: one batched renewal of one lease through the store vs the same statement
//!    issued directly.
//!    Then the thin path: the same in alternating rounds in one run, every batch
//!    run by a task on the runtime (robust to load from other processes): the median
//!    per-round ratio to the direct SQL.
//! 3. Renewal cost: store round trips (= statements) per heartbeat interval for one owner
//!    holding 1, 100 and 10,000 leases through LeaseActors, and the time of one batched
//!    renewal statement of that size (printed after the criterion groups).
//!
//! Run: `cargo bench -p tenure-store-postgres --bench postgres_lease`

#[path = "../tests/support/mod.rs"]
mod support;
use support::PgOptions;

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use tenure_lease::{AcquireOutcome, AcquireRequest, HeldLease, Lease, LeaseSpec, LeaseStore};
use tenure_lease_kit::bench::{
    Counting, Holders, ThinPath, api_settings, bracket_intervals, intervals, lease_acquire_release,
    lease_counts, renewal_settings, runtime, spi_request, store_acquire_release, thin_path,
};
use tenure_lease_kit::report::Report;
use tenure_store_postgres::PostgresStore;
use tenure_store_postgres::sql::Statements;
use tenure_test_kit::postgres::PgServer;
use tokio_postgres::NoTls;

const TTL_US: i64 = 60_000_000;

/// Where the baseline's statements run.
enum Connection {
    /// A plain connection of the bench's own.
    Own(tokio_postgres::Client),
    /// The one connection of this store's pool, checked out for each pair.
    Store(PostgresStore),
}

/// The store's statements, prepared once on the baseline's connection: the baseline.
struct Direct {
    connection: Connection,
    acquire: tokio_postgres::Statement,
    release: tokio_postgres::Statement,
    renew: tokio_postgres::Statement,
}

impl Direct {
    /// On a plain connection of its own to `server`.
    async fn connect(server: &PgServer) -> Direct {
        let (client, connection) = server.connection().connect(NoTls).await.expect("connect");
        tokio::spawn(connection);
        let [acquire, release, renew] = prepare(&client).await;
        Direct {
            connection: Connection::Own(client),
            acquire,
            release,
            renew,
        }
    }

    /// On `store`'s own connection: its pool must hold one connection, so that every
    /// checkout gets the connection the statements were prepared on.
    async fn on_store(store: &PostgresStore) -> Direct {
        let [acquire, release, renew] = {
            let pooled = store.connection().await.expect("the store's connection");
            prepare(&pooled).await
        };
        Direct {
            connection: Connection::Store(store.clone()),
            acquire,
            release,
            renew,
        }
    }

    /// The statement's parameters as the store binds them (see `Statements::acquire`): no
    /// note, priority 0, no cleanup timeout, no emergency, no observed grant. The answer is
    /// read whole, as the store must to return the grant's record (the SPI's answer), not
    /// just the flag and the token.
    async fn acquire_release(&self, name: &str, owner: &str) {
        match &self.connection {
            Connection::Own(client) => self.pair(client, name, owner).await,
            Connection::Store(store) => {
                let pooled = store.connection().await.expect("the store's connection");
                self.pair(&pooled, name, owner).await
            }
        }
    }

    async fn pair(&self, client: &tokio_postgres::Client, name: &str, owner: &str) {
        let row = client
            .query_one(
                &self.acquire,
                &[
                    &name,
                    &owner,
                    &"direct",
                    &TTL_US,
                    &None::<String>,
                    &"0",
                    &0i64,
                    &false,
                    &None::<i64>,
                    &None::<i64>,
                ],
            )
            .await
            .unwrap();
        let answer = Answer::read(&row);
        assert!(answer.granted);
        let token = answer.token;
        std::hint::black_box(answer);
        let n = client
            .execute(&self.release, &[&name, &owner, &token])
            .await
            .unwrap();
        assert_eq!(n, 1);
    }

    async fn renew(&self, owner: &str, names: &[&str], tokens: &[i64]) -> usize {
        let Connection::Own(client) = &self.connection else {
            panic!("renewals are compared on a connection of the bench's own")
        };
        client
            .query(&self.renew, &[&owner, &names, &tokens, &TTL_US])
            .await
            .unwrap()
            .len()
    }
}

/// The store's acquire, release and renew statements, prepared on `client`.
async fn prepare(client: &tokio_postgres::Client) -> [tokio_postgres::Statement; 3] {
    let sql = Statements::new("tenure", "tenure_lease");
    let acquire = client.prepare(&sql.acquire).await.unwrap();
    let release = client.prepare(&sql.release).await.unwrap();
    let renew = client.prepare(&sql.renew).await.unwrap();
    [acquire, release, renew]
}

/// The acquire statement's answer, every column in the store's column order (see
/// `Statements::acquire`), read with plain tokio-postgres.
#[allow(dead_code)] // Read only to be decoded, as the store decodes it.
#[derive(Debug)]
struct Answer {
    granted: bool,
    name: String,
    owner: String,
    instance: String,
    token: i64,
    expires_in_us: i64,
    version: i64,
    note: Option<String>,
    priority: String,
    cleanup_us: i64,
    request_by: Option<String>,
    request_instance: Option<String>,
    request_priority: Option<String>,
    request_forceful: Option<bool>,
    request_note: Option<String>,
}

impl Answer {
    fn read(row: &tokio_postgres::Row) -> Answer {
        Answer {
            granted: row.get(0),
            name: row.get(1),
            owner: row.get(2),
            instance: row.get(3),
            token: row.get(4),
            expires_in_us: row.get(5),
            version: row.get(6),
            note: row.get(7),
            priority: row.get(8),
            cleanup_us: row.get(9),
            request_by: row.get(10),
            request_instance: row.get(11),
            request_priority: row.get(12),
            request_forceful: row.get(13),
            request_note: row.get(14),
        }
    }
}

/// A store whose pool holds one connection, shared by the Lease API, the SPI and the
/// baseline (see the module doc).
fn one_connection_store(rt: &tokio::runtime::Runtime, server: &PgServer) -> PostgresStore {
    let mut options = server.options(Duration::from_secs(5));
    options.pool_size = 1;
    rt.block_on(PostgresStore::connect(options)).expect("store")
}

fn acquire_release(c: &mut Criterion, server: &PgServer) {
    let rt = runtime().expect("runtime");
    let pg = one_connection_store(&rt, server);
    let store: Arc<dyn LeaseStore> = Arc::new(pg.clone());
    let lease = rt.block_on(async {
        Lease::start(LeaseSpec::new("api", "bench-owner", store.clone(), api_settings()).unwrap())
            .await
            .unwrap()
    });
    let direct = rt.block_on(Direct::on_store(&pg));
    let own = rt.block_on(Direct::connect(server));
    let req = spi_request("spi", Duration::from_secs(60));
    let mut g = c.benchmark_group("acquire_release");
    g.bench_function("lease_api", |b| {
        b.iter(|| rt.block_on(lease_acquire_release(&lease)))
    });
    g.bench_function("store_spi", |b| {
        b.iter(|| rt.block_on(store_acquire_release(store.as_ref(), &req)))
    });
    g.bench_function("direct_sql", |b| {
        b.iter(|| rt.block_on(direct.acquire_release("direct", "bench-owner")))
    });
    g.bench_function("direct_sql_own_connection", |b| {
        b.iter(|| rt.block_on(own.acquire_release("direct-own", "bench-owner")))
    });
    g.finish();
}

fn renew(c: &mut Criterion, server: &PgServer) {
    let rt = runtime().expect("runtime");
    let store = rt
        .block_on(PostgresStore::connect(
            server.options(Duration::from_secs(5)),
        ))
        .expect("store");
    let direct = rt.block_on(Direct::connect(server));
    let token = |name: &str| {
        let req = AcquireRequest {
            name: name.into(),
            owner: "renewer".into(),
            instance: "bench".into(),
            ttl: Duration::from_secs(600),
            note: None,
            ..AcquireRequest::default()
        };
        match rt.block_on(store.try_acquire(&req)).unwrap() {
            AcquireOutcome::Granted(r) => r.token,
            AcquireOutcome::Held(_) => unreachable!(),
        }
    };
    let held = [HeldLease {
        name: "renew-spi".into(),
        token: token("renew-spi"),
    }];
    let direct_token = token("renew-direct").get() as i64;
    let mut g = c.benchmark_group("renew");
    g.bench_function("store_batch_renew", |b| {
        b.iter(|| {
            let flags = rt
                .block_on(store.renew("renewer", &held, Duration::from_secs(60)))
                .unwrap();
            assert!(flags.iter().all(|f| f.is_renewed()) && flags.len() == 1);
        })
    });
    g.bench_function("direct_sql_batch_renew", |b| {
        b.iter(|| {
            let n = rt.block_on(direct.renew("renewer", &["renew-direct"], &[direct_token]));
            assert_eq!(n, 1);
        })
    });
    g.finish();
}

fn renewal_cost(server: &PgServer, report: &mut Report) {
    println!(
        "\nrenewal cost: one owner, LeaseActors on one PostgreSQL table, heartbeat-interval 1s"
    );
    println!(
        "{:>8} {:>10} {:>22} {:>22} {:>20}",
        "leases", "intervals", "round trips/interval", "leases per round trip", "one batch renew"
    );
    let rt = runtime().expect("runtime");
    let intervals = intervals();
    for n in lease_counts() {
        let owner = format!("owner-{n}");
        let inner = rt
            .block_on(PostgresStore::connect(
                server.options(Duration::from_secs(5)),
            ))
            .expect("store");
        let store = Counting::new(Arc::new(inner.clone()));
        let s = renewal_settings();
        let (counts, all_held, held) = rt.block_on(async {
            let names = (0..n).map(|i| format!("cost-{n}-{i}")).collect();
            let holders = Holders::start(store.clone(), &owner, names, s).await;
            let held = holders.held().expect("held");
            let (before, after) = bracket_intervals(s.heartbeat_interval, || store.counts()).await;
            let all_held = holders.all_held();
            holders.stop();
            (after - before, all_held, held)
        });
        assert!(all_held, "every lease still held");
        // One batched renewal statement of all n leases, directly through the store.
        let runs = 10u32;
        let started = Instant::now();
        for _ in 0..runs {
            rt.block_on(inner.renew(&owner, &held, Duration::from_secs(10)))
                .expect("renew");
        }
        let per_batch = started.elapsed() / runs;
        let (trips, per_trip) = (
            counts.calls as f64 / intervals as f64,
            counts.leases as f64 / counts.calls.max(1) as f64,
        );
        println!(
            "{n:>8} {intervals:>10} {trips:>22.2} {per_trip:>22.1} {:>20}",
            format!("{per_batch:.2?}")
        );
        report.row([
            format!("renewals, {n} leases held by LeaseActors of one owner: store round trips per heartbeat interval, over {intervals}; one batch renewal by hand"),
            format!("{trips:.2} ({per_trip:.1} leases each); {per_batch:.2?}"),
        ]);
    }
}

/// The thin path: the same comparison as `acquire_release`, in alternating
/// rounds, each batch run by a task on the runtime ([`thin_path`]). All three ways use the
/// store's one connection and take and give back the same row, so that they differ only
/// in the code between the caller and the statements.
fn thin(server: &PgServer) -> ThinPath {
    let rt = runtime().expect("runtime");
    let pg = one_connection_store(&rt, server);
    let store: Arc<dyn LeaseStore> = Arc::new(pg.clone());
    let lease = rt.block_on(async {
        let spec = LeaseSpec::new("thin", "bench-owner", store.clone(), api_settings()).unwrap();
        Lease::start(spec).await.unwrap()
    });
    let direct = Arc::new(rt.block_on(Direct::on_store(&pg)));
    let req = spi_request("thin", Duration::from_secs(60));
    thin_path(&rt, &lease, &store, &req, move || {
        let direct = direct.clone();
        async move { direct.acquire_release("thin", "bench-owner").await }
    })
}

fn benches(c: &mut Criterion) {
    let server = PgServer::start();
    acquire_release(c, &server);
    renew(c, &server);
}

criterion_group! {
    name = groups;
    config = Criterion::default().sample_size(100).measurement_time(Duration::from_secs(6)).warm_up_time(Duration::from_secs(2));
    targets = benches
}

fn main() {
    tenure_lease_kit::bench::store_bench_main(
        "tenure-store-postgres",
        "postgres_lease",
        groups,
        |report| {
            let server = PgServer::start();
            thin(&server).add_to(report, "direct (the store's statements by hand)");
            renewal_cost(&server, report);
            report.note("Per pair from the bench's thread: criterion's output of `acquire_release` and `renew`, not in this table.");
        },
    );
}
