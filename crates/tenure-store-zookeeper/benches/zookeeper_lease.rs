//! ZooKeeper store benchmarks, against a standalone server started here (Debian's
//! `zookeeper` package).
//!
//! 1. `acquire_release`: one acquire and one release through the Lease API (LeaseActor,
//!    store, ZooKeeper) and through the store SPI, against the store's own two requests
//!    issued by hand with the same client library (`direct_multis`: the grant's multi, which
//!    bumps the lease node's version and creates the ephemeral holder node, and the
//!    release's multi, which checks that version and deletes the holder node), and against
//!    the cheapest pair ZooKeeper has (`bare_create_delete`: create an ephemeral node,
//!    delete it), which shows what the fencing layout costs.
//!    Then the thin path: Lease API, store SPI and the direct multis in
//!    alternating rounds in one run, every batch run by a task on the runtime, reported as
//!    median ratios to the direct multis (robust to machine load, which criterion's
//!    back-to-back groups are not).
//! 2. Renewal cost: store round trips per heartbeat interval for one owner holding 1, 100
//!    and 10,000 leases through LeaseActors, and the latency of one batched renewal of all
//!    n leases (20 calls; printed after the criterion groups), against the bare requests of
//!    a renewal without preemption requests (`sync` + `getEphemerals` on a session owning n
//!    ephemeral nodes, 20 calls in the same run): the ratio is what learning of pending
//!    requests costs (an `exists` of the root while no request was written; see the
//!    store's `pending` module) plus the store's bookkeeping.
//!
//! Run: `cargo bench -p tenure-store-zookeeper --bench zookeeper_lease`

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use tenure_lease::{AcquireOutcome, AcquireRequest, Lease, LeaseSpec, LeaseStore};
use tenure_lease_kit::bench::{
    Counting, Holders, ThinPath, bracket_intervals, intervals, lease_acquire_release, lease_counts,
    percentile, renewal_settings, runtime, spi_request, store_acquire_release, thin_path,
};
use tenure_lease_kit::report::Report;
use tenure_store_zookeeper::zookeeper_client as zk;
use tenure_store_zookeeper::{ZooKeeperOptions, ZooKeeperStore};
use tenure_test_kit::zookeeper::TestServer;

/// tickTime of the bench server: sessions may last 1 s to 10 s.
const TICK: Duration = Duration::from_millis(500);

fn server() -> TestServer {
    TestServer::start(TICK).unwrap_or_else(|e| panic!("cannot start the ZooKeeper server: {e}"))
}

fn store(server: &TestServer, root: &str) -> ZooKeeperStore {
    ZooKeeperStore::new(ZooKeeperOptions::new(
        server.connect_string(),
        root,
        renewal_settings().heartbeat_timeout,
    ))
    .expect("options")
}

/// The store's two requests of an acquire and a release, issued by hand on a plain client
/// of the same library: what "the same store operations issued directly" means here.
struct Multis {
    client: zk::Client,
    lease: String,
    holder: String,
    /// The holder node's data exactly as the store writes it for the bench's grants.
    data: Vec<u8>,
}

impl Multis {
    /// A client of its own under `root`, with holder data copied from a grant the store
    /// just made of `req` (read back, then released), so both ways write the same bytes.
    async fn start(
        server: &TestServer,
        store: &dyn LeaseStore,
        req: &AcquireRequest,
        store_root: &str,
        root: &str,
    ) -> Multis {
        let client = zk::Client::connector()
            .with_session_timeout(renewal_settings().heartbeat_timeout)
            .connect(&server.connect_string())
            .await
            .unwrap();
        let AcquireOutcome::Granted(grant) = store.try_acquire(req).await.unwrap() else {
            panic!("the store's bench lease is held")
        };
        let (data, _) = client
            .get_data(&format!("{store_root}/{}/holder", req.name))
            .await
            .expect("the store's holder node");
        assert!(
            store
                .release(&req.name, &req.owner, grant.token)
                .await
                .unwrap()
        );
        let lease = format!("{root}/lease");
        let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        client.mkdir(&lease, &persistent).await.unwrap();
        Multis {
            holder: format!("{lease}/holder"),
            lease,
            client,
            data,
        }
    }

    /// The grant's multi (new lease-node version, holder node created) and the release's
    /// (that version checked, holder node deleted), as the store issues them.
    async fn acquire_release(&self) {
        let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
        let mut grant = self.client.new_multi_writer();
        grant.add_set_data(&self.lease, &[], None).unwrap();
        grant
            .add_create(&self.holder, &self.data, &ephemeral)
            .unwrap();
        let results = grant.commit().await.unwrap();
        let version = results
            .iter()
            .find_map(|r| match r {
                zk::MultiWriteResult::SetData { stat } => Some(stat.version),
                _ => None,
            })
            .expect("the lease node's new version");
        let mut release = self.client.new_multi_writer();
        release.add_check_version(&self.lease, version).unwrap();
        release.add_delete(&self.holder, None).unwrap();
        release.commit().await.unwrap();
    }
}

fn acquire_release(c: &mut Criterion) {
    let server = server();
    let rt = runtime().expect("runtime");
    rt.block_on(server.warm_up()).expect("warm-up");
    let store: Arc<dyn LeaseStore> = Arc::new(store(&server, "/bench/acquire"));
    let lease = rt.block_on(async {
        Lease::start(
            LeaseSpec::new("api", "bench-owner", store.clone(), renewal_settings()).unwrap(),
        )
        .await
        .unwrap()
    });
    let bare = rt.block_on(async {
        let client = zk::Client::connector()
            .with_session_timeout(renewal_settings().heartbeat_timeout)
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
    let req = spi_request("spi", renewal_settings().heartbeat_timeout);
    let multis = rt.block_on(Multis::start(
        &server,
        store.as_ref(),
        &req,
        "/bench/acquire",
        "/bench/multis",
    ));
    let mut g = c.benchmark_group("acquire_release");
    g.bench_function("lease_api", |b| {
        b.iter(|| rt.block_on(lease_acquire_release(&lease)))
    });
    g.bench_function("store_spi", |b| {
        b.iter(|| rt.block_on(store_acquire_release(store.as_ref(), &req)))
    });
    g.bench_function("direct_multis", |b| {
        b.iter(|| rt.block_on(multis.acquire_release()))
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

/// The thin path: Lease API, store SPI and the same two multis issued by hand
/// in alternating rounds, each batch run by a task on the runtime ([`thin_path`]).
fn thin() -> ThinPath {
    let server = server();
    let rt = runtime().expect("runtime");
    rt.block_on(server.warm_up()).expect("warm-up");
    let store: Arc<dyn LeaseStore> = Arc::new(store(&server, "/bench/thin"));
    let req = spi_request("spi", renewal_settings().heartbeat_timeout);
    let (lease, multis) = rt.block_on(async {
        let spec = LeaseSpec::new("api", "bench-owner", store.clone(), renewal_settings());
        let lease = Lease::start(spec.unwrap()).await.unwrap();
        let multis = Multis::start(
            &server,
            store.as_ref(),
            &req,
            "/bench/thin",
            "/bench/thin-multis",
        );
        (lease, Arc::new(multis.await))
    });
    thin_path(&rt, &lease, &store, &req, move || {
        let multis = multis.clone();
        async move { multis.acquire_release().await }
    })
}

fn renewal_cost(report: &mut Report) {
    println!(
        "\nrenewal cost: one owner, LeaseActors on one ZooKeeper session, heartbeat-interval 1s"
    );
    println!(
        "{:>8} {:>10} {:>21} {:>22} {:>16} {:>16} {:>12} {:>10}",
        "leases",
        "intervals",
        "round trips/interval",
        "leases per round trip",
        "renew(n) p50",
        "renew(n) p90",
        "bare p50",
        "renew/bare"
    );
    let server = server();
    let rt = runtime().expect("runtime");
    rt.block_on(server.warm_up()).expect("warm-up");
    let s = renewal_settings();
    let intervals = intervals();
    for n in lease_counts() {
        let store = Counting::new(Arc::new(store(&server, &format!("/bench/renew-{n}"))));
        let (counts, mut direct, all_held) = rt.block_on(async {
            let names = (0..n).map(|i| format!("lease-{i}")).collect();
            let holders = Holders::start(store.clone(), "owner", names, s).await;
            let (before, after) = bracket_intervals(s.heartbeat_interval, || store.counts()).await;
            let all_held = holders.all_held();
            // The batched renewal of all n leases, issued directly 20 times.
            let held = holders.held().expect("held");
            let mut direct = Vec::new();
            for _ in 0..20 {
                let started = Instant::now();
                let flags = store
                    .inner()
                    .renew("owner", &held, s.heartbeat_timeout)
                    .await;
                direct.push(started.elapsed());
                assert!(flags.unwrap().iter().all(|f| f.is_renewed()));
            }
            holders.stop();
            (after - before, direct, all_held)
        });
        assert!(all_held, "every lease still held");
        direct.sort();
        let mut bare = rt.block_on(bare_renewals(&server, n));
        bare.sort();
        let (renew_p50, bare_p50) = (
            percentile(&direct, 50).expect("runs"),
            percentile(&bare, 50).expect("runs"),
        );
        let (trips, per_trip, renew_p90, ratio) = (
            counts.calls as f64 / intervals as f64,
            counts.leases as f64 / counts.calls.max(1) as f64,
            percentile(&direct, 90).expect("runs"),
            renew_p50.as_secs_f64() / bare_p50.as_secs_f64(),
        );
        println!(
            "{n:>8} {intervals:>10} {trips:>21.2} {per_trip:>22.1} {renew_p50:>16.2?} {renew_p90:>16.2?} {bare_p50:>12.2?} {ratio:>10.2}",
        );
        report.row([
            format!("renewals, {n} leases held by LeaseActors of one owner: store round trips per heartbeat interval, over {intervals}; one batch renewal p50, p90; bare multi p50"),
            format!("{trips:.2} ({per_trip:.1} leases each); {renew_p50:.2?}, {renew_p90:.2?}; {bare_p50:.2?} ({ratio:.2}x)"),
        ]);
    }
}

/// 20 timings of the bare requests of a renewal before priority leases (`sync` and
/// `getEphemerals`, pipelined) on a session owning `n` ephemeral nodes laid out as holder
/// nodes are.
async fn bare_renewals(server: &TestServer, n: usize) -> Vec<Duration> {
    let client = zk::Client::connector()
        .with_session_timeout(renewal_settings().heartbeat_timeout)
        .connect(&server.connect_string())
        .await
        .expect("bare session");
    let root = format!("/bench/bare-renew-{n}");
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    client.mkdir(&root, &persistent).await.expect("root");
    let leases: Vec<String> = (0..n).map(|i| format!("{root}/lease-{i}")).collect();
    let holders: Vec<String> = leases.iter().map(|l| format!("{l}/holder")).collect();
    let data = br#"{"owner":"owner","instance":"i","ttl_ms":4000}"#;
    for (leases, holders) in leases.chunks(1000).zip(holders.chunks(1000)) {
        let created = leases.iter().map(|l| client.create(l, &[], &persistent));
        futures::future::try_join_all(created)
            .await
            .expect("lease nodes");
        let created = holders.iter().map(|h| client.create(h, data, &ephemeral));
        futures::future::try_join_all(created)
            .await
            .expect("holder nodes");
    }
    let mut timings = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        let (synced, listed) =
            futures::future::join(client.sync(&root), client.list_ephemerals(&root)).await;
        synced.expect("sync");
        assert_eq!(listed.expect("ephemerals").len(), n);
        timings.push(started.elapsed());
    }
    timings
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(200).measurement_time(Duration::from_secs(8)).warm_up_time(Duration::from_secs(3));
    targets = acquire_release
}

fn main() {
    tenure_lease_kit::bench::store_bench_main(
        "tenure-store-zookeeper",
        "zookeeper_lease",
        benches,
        |report| {
            thin().add_to(report, "direct (the store's multis by hand)");
            renewal_cost(report);
            report.note("Per pair from the bench's thread: criterion's output of `acquire_release`, not in this table.");
        },
    );
}
