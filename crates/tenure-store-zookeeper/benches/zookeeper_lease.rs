//! ZooKeeper store benchmarks, against a standalone server started here (Debian's
//! `zookeeper` package).
//!
//! 1. `acquire_release`: one acquire and one release through the Lease API (LeaseActor,
//!    store, ZooKeeper) and through the store SPI, against the bare ZooKeeper operations
//!    (create an ephemeral node, delete it) on the same server with the same client library.
//!    Then the same three in alternating rounds, reported as median ratios to bare (robust
//!    to machine load, which criterion's back-to-back groups are not).
//! 2. Renewal cost: store round trips per heartbeat interval for one owner holding 1, 100
//!    and 10,000 leases through LeaseActors, and the latency of one batched renewal of all
//!    n leases (20 calls; printed after the criterion groups).
//!
//! Run: `cargo bench -p tenure-store-zookeeper --bench zookeeper_lease`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use criterion::{Criterion, criterion_group};
use tenure_lease::{
    AcquireOutcome, AcquireRequest, Acquired, Capabilities, HeldLease, Lease, LeaseActor,
    LeaseEventSink, LeaseMsg, LeaseRecord, LeaseSettings, LeaseSpec, LeaseStore, RenewalBatcher,
    StoreError,
};
use tenure_store_zookeeper::server::TestServer;
use tenure_store_zookeeper::zookeeper_client as zk;
use tenure_store_zookeeper::{ZooKeeperOptions, ZooKeeperStore};

/// tickTime of the bench server: sessions may last 1 s to 10 s.
const TICK: Duration = Duration::from_millis(500);

fn settings() -> LeaseSettings {
    LeaseSettings {
        heartbeat_timeout: Duration::from_secs(10),
        heartbeat_interval: Duration::from_secs(1),
        lease_operation_timeout: Duration::from_secs(5),
        lease_retry_interval: Duration::from_secs(1),
        safety_margin: Duration::from_secs(1),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn server() -> TestServer {
    TestServer::start(TICK).unwrap_or_else(|e| panic!("cannot start the ZooKeeper server: {e}"))
}

fn store(server: &TestServer, root: &str) -> ZooKeeperStore {
    ZooKeeperStore::new(ZooKeeperOptions::new(
        server.connect_string(),
        root,
        settings().heartbeat_timeout,
    ))
    .expect("options")
}

fn acquire_release(c: &mut Criterion) {
    let server = server();
    let rt = runtime();
    rt.block_on(server.warm_up()).expect("warm-up");
    let store: Arc<dyn LeaseStore> = Arc::new(store(&server, "/bench/acquire"));
    let lease = rt.block_on(async {
        Lease::start(LeaseSpec::new("api", "bench-owner", store.clone(), settings()).unwrap())
            .await
            .unwrap()
    });
    let bare = rt.block_on(async {
        let client = zk::Client::connector()
            .with_session_timeout(settings().heartbeat_timeout)
            .connect(&server.connect_string())
            .await
            .unwrap();
        client
            .mkdir(
                "/bench/bare",
                &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
            )
            .await
            .unwrap();
        client
    });
    let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    let req = AcquireRequest {
        name: "spi".into(),
        owner: "bench-owner".into(),
        instance: "bench".into(),
        ttl: settings().heartbeat_timeout,
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
    g.bench_function("bare_create_delete", |b| {
        b.iter(|| {
            rt.block_on(async {
                bare.create("/bench/bare/holder", b"bench-owner", &ephemeral)
                    .await
                    .unwrap();
                bare.delete("/bench/bare/holder", None).await.unwrap();
            })
        })
    });
    g.finish();
}

/// Lease API, store SPI and bare create+delete in alternating rounds of 200 iterations, so
/// that machine load hits all alike; prints the median per-round ratio to bare.
fn alternating_ratio() {
    const ROUNDS: usize = 15;
    const ITERS: u32 = 200;
    let server = server();
    let rt = runtime();
    rt.block_on(server.warm_up()).expect("warm-up");
    let store: Arc<dyn LeaseStore> = Arc::new(store(&server, "/bench/alternating"));
    let (lease, bare) = rt.block_on(async {
        let lease =
            Lease::start(LeaseSpec::new("api", "bench-owner", store.clone(), settings()).unwrap())
                .await
                .unwrap();
        let bare = zk::Client::connector()
            .with_session_timeout(settings().heartbeat_timeout)
            .connect(&server.connect_string())
            .await
            .unwrap();
        bare.mkdir(
            "/bench/bare",
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .unwrap();
        (lease, bare)
    });
    let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    let req = AcquireRequest {
        name: "spi".into(),
        owner: "bench-owner".into(),
        instance: "bench".into(),
        ttl: settings().heartbeat_timeout,
        note: None,
    };
    let (mut api, mut spi, mut raw) = (Vec::new(), Vec::new(), Vec::new());
    rt.block_on(async {
        for _ in 0..ROUNDS {
            let started = Instant::now();
            for _ in 0..ITERS {
                assert!(matches!(
                    lease.acquire().await.unwrap(),
                    Acquired::Granted { .. }
                ));
                assert!(lease.release().await.unwrap());
            }
            api.push(started.elapsed() / ITERS);
            let started = Instant::now();
            for _ in 0..ITERS {
                let AcquireOutcome::Granted(r) = store.try_acquire(&req).await.unwrap() else {
                    panic!("held")
                };
                assert!(store.release("spi", "bench-owner", r.token).await.unwrap());
            }
            spi.push(started.elapsed() / ITERS);
            let started = Instant::now();
            for _ in 0..ITERS {
                bare.create("/bench/bare/holder", b"bench-owner", &ephemeral)
                    .await
                    .unwrap();
                bare.delete("/bench/bare/holder", None).await.unwrap();
            }
            raw.push(started.elapsed() / ITERS);
        }
    });
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let ratio = |a: &[Duration]| {
        median(
            a.iter()
                .zip(&raw)
                .map(|(x, b)| x.as_secs_f64() / b.as_secs_f64())
                .collect(),
        )
    };
    let med = |v: &[Duration]| {
        Duration::from_secs_f64(median(v.iter().map(Duration::as_secs_f64).collect()))
    };
    println!(
        "\nacquire+release, {ROUNDS} alternating rounds of {ITERS}: median per-iteration time, median ratio to bare"
    );
    println!("  bare create+delete  {:>10.1?}", med(&raw));
    println!(
        "  store SPI           {:>10.1?}  x{:.2}",
        med(&spi),
        ratio(&spi)
    );
    println!(
        "  Lease API           {:>10.1?}  x{:.2}",
        med(&api),
        ratio(&api)
    );
}

/// Counts the store round trips (renew calls), the leases they carried and their time.
struct Counting {
    inner: ZooKeeperStore,
    renew_calls: AtomicU64,
    renewed: AtomicU64,
    latencies: Mutex<Vec<Duration>>,
}

#[async_trait]
impl LeaseStore for Counting {
    fn kind(&self) -> &'static str {
        "zookeeper"
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
        let started = Instant::now();
        let result = self.inner.renew(owner, leases, ttl).await;
        self.latencies.lock().unwrap().push(started.elapsed());
        self.renew_calls.fetch_add(1, Ordering::SeqCst);
        self.renewed
            .fetch_add(leases.len() as u64, Ordering::SeqCst);
        result
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

fn renewal_cost() {
    println!(
        "\nrenewal cost: one owner, LeaseActors on one ZooKeeper session, heartbeat-interval 1s"
    );
    println!(
        "{:>8} {:>10} {:>21} {:>22} {:>16} {:>16}",
        "leases",
        "intervals",
        "round trips/interval",
        "leases per round trip",
        "renew(n) p50",
        "renew(n) p90"
    );
    let server = server();
    let rt = runtime();
    rt.block_on(server.warm_up()).expect("warm-up");
    let s = settings();
    for n in [1usize, 100, 10_000] {
        let store = Arc::new(Counting {
            inner: store(&server, &format!("/bench/renew-{n}")),
            renew_calls: AtomicU64::new(0),
            renewed: AtomicU64::new(0),
            latencies: Mutex::new(Vec::new()),
        });
        let (calls, renewed, mut direct, intervals, all_held) = rt.block_on(async {
            let dynstore: Arc<dyn LeaseStore> = store.clone();
            let batcher = RenewalBatcher::new(dynstore.clone(), "owner".into(), s);
            let mut actors = Vec::with_capacity(n);
            for i in 0..n {
                let spec = LeaseSpec::with_batcher(
                    &format!("lease-{i}"),
                    "owner",
                    dynstore.clone(),
                    s,
                    batcher.clone(),
                )
                .unwrap();
                let (actor, view) = LeaseActor::start(spec, LeaseEventSink::ignore(), None)
                    .await
                    .unwrap();
                let reply = ractor::call!(actor, LeaseMsg::TryAcquire).unwrap().unwrap();
                assert!(matches!(reply.0, Acquired::Granted { .. }));
                actors.push((actor, view));
            }
            // Settle onto the grid, then count over whole intervals.
            tokio::time::sleep(Duration::from_millis(2500)).await;
            let (c0, r0) = (
                store.renew_calls.load(Ordering::SeqCst),
                store.renewed.load(Ordering::SeqCst),
            );
            store.latencies.lock().unwrap().clear();
            let intervals = 5u64;
            tokio::time::sleep(s.heartbeat_interval * intervals as u32).await;
            let (c1, r1) = (
                store.renew_calls.load(Ordering::SeqCst),
                store.renewed.load(Ordering::SeqCst),
            );
            let all_held = actors.iter().all(|(_, v)| v.check_lease());
            // The batched renewal of all n leases, issued directly 20 times.
            let held: Vec<HeldLease> = actors
                .iter()
                .enumerate()
                .map(|(i, (_, v))| HeldLease {
                    name: format!("lease-{i}"),
                    token: v.token().expect("held"),
                })
                .collect();
            let mut direct = Vec::new();
            for _ in 0..20 {
                let started = Instant::now();
                let flags = store.inner.renew("owner", &held, s.heartbeat_timeout).await;
                direct.push(started.elapsed());
                assert!(flags.unwrap().iter().all(|f| *f));
            }
            for (a, _) in &actors {
                a.stop(None);
            }
            (c1 - c0, r1 - r0, direct, intervals, all_held)
        });
        assert!(all_held, "every lease still held");
        direct.sort();
        println!(
            "{n:>8} {intervals:>10} {:>21.2} {:>22.1} {:>16.2?} {:>16.2?}",
            calls as f64 / intervals as f64,
            renewed as f64 / calls.max(1) as f64,
            direct[direct.len() / 2],
            direct[direct.len() * 9 / 10],
        );
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(200).measurement_time(Duration::from_secs(8)).warm_up_time(Duration::from_secs(3));
    targets = acquire_release
}

fn main() {
    let started = Instant::now();
    benches();
    Criterion::default().configure_from_args().final_summary();
    alternating_ratio();
    renewal_cost();
    println!("(bench ran {:.0?})", started.elapsed());
}
