//! PostgreSQL store benchmarks, against a server the bench starts (Debian's `postgresql`).
//!
//! 1. `acquire_release`: one acquire and one release through the Lease API (LeaseActor,
//!    pool, store) and through the store SPI, against the very same SQL statements issued
//!    directly on one plain tokio-postgres connection to the same server.
//! 2. `renew`: one batched renewal of one lease through the store vs the same statement
//!    issued directly.
//!    Then the same in alternating rounds (robust to load from other processes): the
//!    median per-round ratio to the direct SQL.
//! 3. Renewal cost: store round trips (= statements) per heartbeat interval for one owner
//!    holding 1, 100 and 10,000 leases through LeaseActors, and the time of one batched
//!    renewal statement of that size (printed after the criterion groups).
//!
//! Run: `cargo bench -p tenure-store-postgres --bench postgres_lease`

#[path = "../tests/server/mod.rs"]
mod server;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use criterion::{Criterion, criterion_group};
use server::PgServer;
use tenure_lease::{
    AcquireOutcome, AcquireRequest, Acquired, Capabilities, HeldLease, Lease, LeaseActor,
    LeaseEventSink, LeaseMsg, LeaseRecord, LeaseSettings, LeaseSpec, LeaseStore, RenewalBatcher,
    StoreError,
};
use tenure_store_postgres::PostgresStore;
use tenure_store_postgres::sql::Statements;
use tokio_postgres::NoTls;

const TTL_US: i64 = 60_000_000;

fn settings() -> LeaseSettings {
    LeaseSettings {
        heartbeat_timeout: Duration::from_secs(60),
        heartbeat_interval: Duration::from_secs(6),
        lease_operation_timeout: Duration::from_secs(5),
        lease_retry_interval: Duration::from_secs(1),
        safety_margin: Duration::from_secs(6),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A plain connection and the store's statements, prepared once: the baseline.
struct Direct {
    client: tokio_postgres::Client,
    acquire: tokio_postgres::Statement,
    release: tokio_postgres::Statement,
    renew: tokio_postgres::Statement,
}

impl Direct {
    async fn connect(server: &PgServer) -> Direct {
        let (client, connection) = server.connection().connect(NoTls).await.expect("connect");
        tokio::spawn(connection);
        let sql = Statements::new("tenure", "tenure_lease");
        Direct {
            acquire: client.prepare(&sql.acquire).await.unwrap(),
            release: client.prepare(&sql.release).await.unwrap(),
            renew: client.prepare(&sql.renew).await.unwrap(),
            client,
        }
    }

    async fn acquire_release(&self, name: &str, owner: &str) {
        let row = self
            .client
            .query_one(
                &self.acquire,
                &[&name, &owner, &"direct", &TTL_US, &None::<String>],
            )
            .await
            .unwrap();
        assert!(row.get::<_, bool>(0));
        let token: i64 = row.get(4);
        let n = self
            .client
            .execute(&self.release, &[&name, &owner, &token])
            .await
            .unwrap();
        assert_eq!(n, 1);
    }

    async fn renew(&self, owner: &str, names: &[&str], tokens: &[i64]) -> usize {
        self.client
            .query(&self.renew, &[&owner, &names, &tokens, &TTL_US])
            .await
            .unwrap()
            .len()
    }
}

fn acquire_release(c: &mut Criterion, server: &PgServer) {
    let rt = runtime();
    let store = rt.block_on(PostgresStore::connect(
        server.options(Duration::from_secs(5)),
    ));
    let store: Arc<dyn LeaseStore> = Arc::new(store.expect("store"));
    let lease = rt.block_on(async {
        Lease::start(LeaseSpec::new("api", "bench-owner", store.clone(), settings()).unwrap())
            .await
            .unwrap()
    });
    let direct = rt.block_on(Direct::connect(server));
    let req = AcquireRequest {
        name: "spi".into(),
        owner: "bench-owner".into(),
        instance: "bench".into(),
        ttl: Duration::from_secs(60),
        note: None,
    };
    let mut g = c.benchmark_group("acquire_release");
    g.bench_function("lease_api", |b| {
        b.iter(|| {
            rt.block_on(async {
                assert!(matches!(
                    lease.acquire().await.unwrap(),
                    Acquired::Granted { .. }
                ));
                assert!(lease.release().await.unwrap());
            })
        })
    });
    g.bench_function("store_spi", |b| {
        b.iter(|| {
            rt.block_on(async {
                let AcquireOutcome::Granted(r) = store.try_acquire(&req).await.unwrap() else {
                    panic!("held")
                };
                assert!(store.release("spi", "bench-owner", r.token).await.unwrap());
            })
        })
    });
    g.bench_function("direct_sql", |b| {
        b.iter(|| rt.block_on(direct.acquire_release("direct", "bench-owner")))
    });
    g.finish();
}

fn renew(c: &mut Criterion, server: &PgServer) {
    let rt = runtime();
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
    let direct_token = token("renew-direct") as i64;
    let mut g = c.benchmark_group("renew");
    g.bench_function("store_batch_renew", |b| {
        b.iter(|| {
            let flags = rt
                .block_on(store.renew("renewer", &held, Duration::from_secs(60)))
                .unwrap();
            assert_eq!(flags, [true]);
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

/// Counts the store round trips (renew calls) and the leases they carried.
struct Counting {
    inner: PostgresStore,
    renew_calls: AtomicU64,
    renewed: AtomicU64,
}

#[async_trait]
impl LeaseStore for Counting {
    fn kind(&self) -> &'static str {
        "postgres"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome, StoreError> {
        self.inner.try_acquire(req).await
    }
    async fn renew(
        &self,
        owner: &str,
        leases: &[HeldLease],
        ttl: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        self.renew_calls.fetch_add(1, Ordering::SeqCst);
        self.renewed
            .fetch_add(leases.len() as u64, Ordering::SeqCst);
        self.inner.renew(owner, leases, ttl).await
    }
    async fn release(&self, name: &str, owner: &str, token: u64) -> Result<bool, StoreError> {
        self.inner.release(name, owner, token).await
    }
    async fn read(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError> {
        self.inner.read(name).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        self.inner.list(prefix).await
    }
}

fn renewal_cost(server: &PgServer) {
    println!(
        "\nrenewal cost: one owner, LeaseActors on one PostgreSQL table, heartbeat-interval 1s"
    );
    println!(
        "{:>8} {:>10} {:>22} {:>22} {:>20}",
        "leases", "intervals", "round trips/interval", "leases per round trip", "one batch renew"
    );
    let rt = runtime();
    for n in [1usize, 100, 10_000] {
        let owner = format!("owner-{n}");
        let inner = rt
            .block_on(PostgresStore::connect(
                server.options(Duration::from_secs(5)),
            ))
            .expect("store");
        let store = Arc::new(Counting {
            inner: inner.clone(),
            renew_calls: AtomicU64::new(0),
            renewed: AtomicU64::new(0),
        });
        let s = LeaseSettings {
            heartbeat_timeout: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(1),
            lease_operation_timeout: Duration::from_secs(5),
            lease_retry_interval: Duration::from_secs(1),
            safety_margin: Duration::from_secs(1),
        };
        let (calls, renewed, intervals, all_held, tokens) = rt.block_on(async {
            let dynstore: Arc<dyn LeaseStore> = store.clone();
            let batcher = RenewalBatcher::new(dynstore.clone(), owner.clone(), s);
            let mut actors = Vec::with_capacity(n);
            let mut tokens = Vec::with_capacity(n);
            for i in 0..n {
                let spec = LeaseSpec::with_batcher(
                    &format!("cost-{n}-{i}"),
                    &owner,
                    dynstore.clone(),
                    s,
                    batcher.clone(),
                )
                .unwrap();
                let (actor, view) = LeaseActor::start(spec, LeaseEventSink::ignore(), None)
                    .await
                    .unwrap();
                let reply = ractor::call!(actor, LeaseMsg::TryAcquire).unwrap().unwrap();
                let Acquired::Granted { token } = reply.0 else {
                    panic!("not granted")
                };
                tokens.push(token);
                actors.push((actor, view));
            }
            // Settle onto the grid, then count over whole intervals.
            tokio::time::sleep(Duration::from_millis(2500)).await;
            let (c0, r0) = (
                store.renew_calls.load(Ordering::SeqCst),
                store.renewed.load(Ordering::SeqCst),
            );
            let intervals = 5u64;
            tokio::time::sleep(s.heartbeat_interval * intervals as u32).await;
            let (c1, r1) = (
                store.renew_calls.load(Ordering::SeqCst),
                store.renewed.load(Ordering::SeqCst),
            );
            let all_held = actors.iter().all(|(_, v)| v.check_lease());
            for (a, _) in &actors {
                a.stop(None);
            }
            (c1 - c0, r1 - r0, intervals, all_held, tokens)
        });
        assert!(all_held, "every lease still held");
        // One batched renewal statement of all n leases, directly through the store.
        let held: Vec<HeldLease> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| HeldLease {
                name: format!("cost-{n}-{i}"),
                token: *t,
            })
            .collect();
        let runs = 10u32;
        let started = Instant::now();
        for _ in 0..runs {
            rt.block_on(inner.renew(&owner, &held, Duration::from_secs(10)))
                .expect("renew");
        }
        let per_batch = started.elapsed() / runs;
        println!(
            "{n:>8} {intervals:>10} {:>22.2} {:>22.1} {:>20}",
            calls as f64 / intervals as f64,
            renewed as f64 / calls.max(1) as f64,
            format!("{per_batch:.2?}")
        );
    }
}

/// The same comparison as `acquire_release`, in alternating rounds, so that load from
/// other processes on the machine hits both sides alike: the median of per-round ratios.
fn interleaved(server: &PgServer) {
    let rt = runtime();
    let store = rt.block_on(PostgresStore::connect(
        server.options(Duration::from_secs(5)),
    ));
    let store: Arc<dyn LeaseStore> = Arc::new(store.expect("store"));
    let lease = rt.block_on(async {
        let spec = LeaseSpec::new("inter-api", "bench-owner", store.clone(), settings()).unwrap();
        Lease::start(spec).await.unwrap()
    });
    let direct = rt.block_on(Direct::connect(server));
    let req = AcquireRequest {
        name: "inter-spi".into(),
        owner: "bench-owner".into(),
        instance: "bench".into(),
        ttl: Duration::from_secs(60),
        note: None,
    };
    const ROUNDS: usize = 40;
    const PER_ROUND: u32 = 100;
    let (mut api, mut spi) = (Vec::new(), Vec::new());
    let (mut t_direct, mut t_api, mut t_spi) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for _ in 0..ROUNDS {
        let d = rt.block_on(async {
            let started = Instant::now();
            for _ in 0..PER_ROUND {
                direct.acquire_release("inter-direct", "bench-owner").await;
            }
            started.elapsed()
        });
        let a = rt.block_on(async {
            let started = Instant::now();
            for _ in 0..PER_ROUND {
                assert!(matches!(
                    lease.acquire().await.unwrap(),
                    Acquired::Granted { .. }
                ));
                assert!(lease.release().await.unwrap());
            }
            started.elapsed()
        });
        let s = rt.block_on(async {
            let started = Instant::now();
            for _ in 0..PER_ROUND {
                let AcquireOutcome::Granted(r) = store.try_acquire(&req).await.unwrap() else {
                    panic!("held")
                };
                assert!(
                    store
                        .release("inter-spi", "bench-owner", r.token)
                        .await
                        .unwrap()
                );
            }
            started.elapsed()
        });
        api.push(a.as_secs_f64() / d.as_secs_f64());
        spi.push(s.as_secs_f64() / d.as_secs_f64());
        (t_direct, t_api, t_spi) = (t_direct + d, t_api + a, t_spi + s);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let n = ROUNDS as u32 * PER_ROUND;
    println!(
        "\nacquire+release, {ROUNDS} alternating rounds of {PER_ROUND}: direct_sql {:.1?}, lease_api {:.1?}, store_spi {:.1?} per pair",
        t_direct / n,
        t_api / n,
        t_spi / n
    );
    println!(
        "median ratio per round: lease_api / direct_sql = {:.2}x, store_spi / direct_sql = {:.2}x",
        median(&mut api),
        median(&mut spi)
    );
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
    let started = Instant::now();
    groups();
    Criterion::default().configure_from_args().final_summary();
    let server = PgServer::start();
    interleaved(&server);
    renewal_cost(&server);
    println!("(bench ran {:.0?})", started.elapsed());
}
