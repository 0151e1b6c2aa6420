//! etcd store benchmarks, against one real etcd member started here (data in /dev/shm).
//!
//! 1. `acquire_release`: one acquire and one release through the Lease API (LeaseActor)
//!    and through the store SPI, against the bare etcd-client transactions the store is
//!    built on (create-if-absent with a session lease, delete guarded by create revision)
//!    and against etcd's Lock RPC (lock + unlock with a session lease).
//! 2. The thin path: Lease API and store SPI against the same store operations
//!    issued directly (the store's own two transactions, written by hand and sent on the
//!    store's client), in alternating rounds in one run, every batch run by a task on the
//!    runtime; the median per-round ratio to the direct way. The criterion group times the
//!    same hand-written transactions too, next to the bare ones above.
//! 3. Renewal traffic: etcd requests (as counted by etcd's own /metrics) per heartbeat
//!    interval for one owner holding 1, 100 and 10,000 leases through LeaseActors
//!    (printed after the criterion groups).
//!
//! Run: `cargo bench -p tenure-store-etcd --bench etcd_lease`

#[path = "../tests/support/mod.rs"]
mod support;
use support::EtcdStores;

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group};
use etcd_client::{Client, Compare, CompareOp, GetOptions, LockOptions, PutOptions, Txn, TxnOp};
use tenure_lease::{AcquireOutcome, Lease, LeaseSettings, LeaseSpec, LeaseStore};
use tenure_lease_kit::bench::{
    Holders, ThinPath, api_settings, bracket_intervals, intervals, lease_acquire_release,
    lease_counts, renewal_settings, runtime, spi_request, store_acquire_release, thin_path,
};
use tenure_lease_kit::report::Report;
use tenure_store_etcd::EtcdStore;

use tenure_test_kit::etcd::{Etcd, PREFIX};

fn acquire_release(c: &mut Criterion) {
    let rt = runtime().expect("runtime");
    let etcd = rt.block_on(Etcd::single());
    let (lease, store, mut raw, session, by_hand) = rt.block_on(async {
        let etcd_store = etcd.store().await;
        let by_hand = StoreTxns::copied_from(&etcd_store, "by-hand").await;
        let store: Arc<dyn LeaseStore> = Arc::new(etcd_store);
        let lease = Lease::start(
            LeaseSpec::new("api", "bench-owner", store.clone(), api_settings()).unwrap(),
        )
        .await
        .unwrap();
        let mut raw = Client::connect(etcd.endpoints(), None).await.unwrap();
        let session = raw.lease_grant(61, None).await.unwrap().id();
        (lease, store, raw, session, by_hand)
    });
    let req = spi_request("spi", Duration::from_secs(60));
    let mut g = c.benchmark_group("acquire_release");
    g.bench_function("lease_api", |b| {
        b.iter(|| rt.block_on(lease_acquire_release(&lease)))
    });
    g.bench_function("store_spi", |b| {
        b.iter(|| rt.block_on(store_acquire_release(store.as_ref(), &req)))
    });
    g.bench_function("store_txns_by_hand", |b| {
        b.iter(|| rt.block_on(by_hand.acquire_release()))
    });
    g.bench_function("bare_etcd_txn", |b| {
        b.iter(|| rt.block_on(bare_acquire_release(&mut raw, "/bench/bare", session)))
    });
    g.bench_function("etcd_lock_rpc", |b| {
        b.iter(|| {
            rt.block_on(async {
                let held = raw
                    .lock("/bench/lock", Some(LockOptions::new().with_lease(session)))
                    .await
                    .unwrap();
                raw.unlock(held.key()).await.unwrap();
            })
        })
    });
    g.finish();
    drop(lease);
    drop(etcd);
}

/// The bare etcd-client transactions the store is built on: create-if-absent with a session
/// lease (its revision is the token), then a delete guarded by that create revision.
async fn bare_acquire_release(raw: &mut Client, key: &str, session: i64) {
    let got = raw
        .txn(
            Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key,
                    "bench-owner",
                    Some(PutOptions::new().with_lease(session)),
                )])
                .or_else([TxnOp::get(key, None)]),
        )
        .await
        .unwrap();
    assert!(got.succeeded());
    let token = got.header().unwrap().revision();
    let del = raw
        .txn(
            Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, token)])
                .and_then([TxnOp::delete(key, None)]),
        )
        .await
        .unwrap();
    assert!(del.succeeded());
}

/// The store's own two transactions for one acquire+release, written by hand and sent on
/// the store's client: the grant (the holder key created with a grant's value and the
/// session's heartbeat key rewritten, both attached to the owner's session; were the key
/// there, the holder, the heartbeats and the requests read instead) and the release's fast
/// path (guarded by the create revision and the value as written; the holder key and its
/// request key deleted). Keys follow the store's documented layout.
struct StoreTxns {
    client: Client,
    key: String,
    value: Vec<u8>,
    heartbeat: String,
    owner: String,
    session: i64,
}

impl StoreTxns {
    /// The transactions of lease `name`, with the value and session of a grant `store`
    /// made (and released) for the bench's owner.
    async fn copied_from(store: &EtcdStore, name: &str) -> Self {
        let req = spi_request(name, Duration::from_secs(60));
        let AcquireOutcome::Granted(grant) = store.try_acquire(&req).await.unwrap() else {
            panic!("{name} is held")
        };
        let mut client = store.client().clone();
        let key = format!("{PREFIX}leases/{name}");
        let got = client.get(key.as_str(), None).await.unwrap();
        let kv = got.kvs().first().expect("the holder key of a grant");
        let (value, session) = (kv.value().to_vec(), kv.lease());
        assert!(store.release(name, &req.owner, grant.token).await.unwrap());
        StoreTxns {
            key: format!("{PREFIX}leases/{name}-direct"),
            value,
            heartbeat: format!("{PREFIX}sessions/{session:016x}"),
            owner: req.owner,
            session,
            client,
        }
    }

    async fn acquire_release(&self) {
        let mut client = self.client.clone();
        let leased = || Some(PutOptions::new().with_lease(self.session));
        let got = client
            .txn(
                Txn::new()
                    .when([Compare::create_revision(
                        self.key.as_str(),
                        CompareOp::Equal,
                        0,
                    )])
                    .and_then([
                        TxnOp::put(self.key.as_str(), self.value.clone(), leased()),
                        TxnOp::put(self.heartbeat.as_str(), self.owner.as_str(), leased()),
                    ])
                    .or_else([
                        TxnOp::get(self.key.as_str(), None),
                        TxnOp::get(
                            format!("{PREFIX}sessions/"),
                            Some(GetOptions::new().with_prefix().with_keys_only()),
                        ),
                        TxnOp::get(
                            format!("{PREFIX}requests/"),
                            Some(GetOptions::new().with_prefix()),
                        ),
                    ]),
            )
            .await
            .unwrap();
        assert!(got.succeeded());
        let token = got.header().unwrap().revision();
        let del = client
            .txn(
                Txn::new()
                    .when([
                        Compare::create_revision(self.key.as_str(), CompareOp::Equal, token),
                        Compare::value(self.key.as_str(), CompareOp::Equal, self.value.clone()),
                    ])
                    .and_then([
                        TxnOp::delete(self.key.as_str(), None),
                        TxnOp::delete(format!("{PREFIX}requests/{token:016x}"), None),
                    ]),
            )
            .await
            .unwrap();
        assert!(del.succeeded());
    }
}

/// The thin path: Lease API, store SPI and the store's transactions by hand in
/// alternating rounds, each batch run by a task on the runtime ([`thin_path`]).
fn thin() -> ThinPath {
    let rt = runtime().expect("runtime");
    let etcd = rt.block_on(Etcd::single());
    let (lease, store, by_hand) = rt.block_on(async {
        let etcd_store = etcd.store().await;
        let by_hand = Arc::new(StoreTxns::copied_from(&etcd_store, "thin").await);
        let store: Arc<dyn LeaseStore> = Arc::new(etcd_store);
        let spec = LeaseSpec::new("thin-api", "bench-owner", store.clone(), api_settings());
        let lease = Lease::start(spec.unwrap()).await.unwrap();
        (lease, store, by_hand)
    });
    let req = spi_request("thin-spi", Duration::from_secs(60));
    let path = thin_path(&rt, &lease, &store, &req, move || {
        let by_hand = by_hand.clone();
        async move { by_hand.acquire_release().await }
    });
    drop(lease);
    drop(etcd);
    path
}

/// etcd's request counters from its /metrics page: unary calls handled plus keep-alive
/// messages received.
fn etcd_requests(endpoint: &str) -> u64 {
    let addr = endpoint.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).expect("metrics connection");
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body.lines()
        .filter(|l| {
            (l.starts_with("grpc_server_handled_total{") && l.contains("grpc_type=\"unary\""))
                || (l.starts_with("grpc_server_msg_received_total{")
                    && l.contains("grpc_method=\"LeaseKeepAlive\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn renewal_traffic(report: &mut Report) {
    println!("\nrenewal traffic: one owner, LeaseActors on one etcd member, heartbeat-interval 1s");
    println!(
        "{:>8} {:>10} {:>26} {:>20}",
        "leases", "intervals", "etcd requests / interval", "renewed per interval"
    );
    let rt = runtime().expect("runtime");
    let intervals = intervals();
    for n in lease_counts() {
        let etcd = rt.block_on(Etcd::single());
        let s = LeaseSettings {
            lease_operation_timeout: Duration::from_secs(10),
            ..renewal_settings()
        };
        let endpoint = etcd.endpoint(0);
        let (requests, all_held) = rt.block_on(async {
            let store: Arc<dyn LeaseStore> = Arc::new(etcd.store().await);
            let names = (0..n).map(|i| format!("lease-{i}")).collect();
            let holders = Holders::start(store, "owner", names, s).await;
            let (r0, r1) =
                bracket_intervals(s.heartbeat_interval, || etcd_requests(&endpoint)).await;
            let all_held = holders.all_held();
            holders.stop();
            (r1 - r0, all_held)
        });
        assert!(all_held, "every lease still held");
        let per_interval = requests as f64 / intervals as f64;
        println!("{n:>8} {intervals:>10} {per_interval:>26.2} {n:>20}");
        report.row([
            format!("renewals, {n} leases held by LeaseActors of one owner: etcd requests per heartbeat interval, over {intervals}"),
            format!("{per_interval:.2}"),
        ]);
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(100).measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(2));
    targets = acquire_release
}

fn main() {
    tenure_lease_kit::bench::store_bench_main(
        "tenure-store-etcd",
        "etcd_lease",
        benches,
        |report| {
            thin().add_to(report, "direct (the store's transactions by hand)");
            renewal_traffic(report);
            report.note("Per pair from the bench's thread (Lease API, SPI, by hand, bare transactions, etcd's Lock RPC): criterion's output of `acquire_release`, not in this table.");
        },
    );
}
