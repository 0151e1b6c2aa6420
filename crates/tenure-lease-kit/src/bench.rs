//! Helpers shared by Tenure's benchmarks: whether a bench runs for real or as a smoke test
//! ([`smoke`], [`knob`], [`size`]), the runtime and settings the store benches run with, the acquire+release pairs they time, a [`Counting`] store wrapper, LeaseActor
//! [`Holders`] for renewal-cost runs, and median/percentile helpers.
//!
//! Bench-only: the async helpers assert what they expect (a grant, a release) and panic
//! otherwise, as a failed benchmark iteration should.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use ractor::ActorRef;
use tenure_lease::{
    AcquireOutcome, AcquireRequest, Acquired, HeldLease, Lease, LeaseActor, LeaseEventSink,
    LeaseMsg, LeaseSettings, LeaseSpec, LeaseStore, LeaseView, Renewal, RenewalBatcher, StoreError,
};

use crate::report::Report;
use crate::wrap::{StoreWrapper, Wrapped};

/// How long renewal-cost runs wait for the renewals to settle onto the heartbeat grid
/// before counting: 2.5 s, or 1.2 s in a [`smoke`] run (still more than the 1 s interval of
/// [`renewal_settings`]).
pub fn settle() -> Duration {
    Duration::from_millis(size(2500, 1200) as u64)
}

/// How many whole heartbeat intervals renewal-cost runs count over: 5, or 2 in a [`smoke`]
/// run.
pub fn intervals() -> u64 {
    size(5, 2) as u64
}

/// The lease counts renewal-cost runs measure: 1, 100 and 10,000 (only the first two in a
/// smoke run).
pub fn lease_counts() -> Vec<usize> {
    vec![1, 100, 10_000][..size(3, 2)].to_vec()
}

/// True when this bench binary runs under `cargo test --benches`, so that the test command
/// proves every bench still works: it should run each measurement once and small. Cargo
/// passes `--bench` to a bench binary only under `cargo bench`, the rule criterion's own
/// test mode follows too.
pub fn smoke() -> bool {
    !std::env::args().any(|a| a == "--bench")
}

/// Lets a test runner run this bench binary's smoke test alongside the other tests; call it
/// first in `main`.
///
/// cargo-nextest lists a test binary with `--list --format terse` and runs each listed test
/// with `--exact <name> --nocapture`. A bench binary answers as one test, `smoke`: listing
/// prints it (and no ignored test); running it runs this binary again without arguments, as
/// `cargo test --bench` would, because criterion would read `smoke` as a filter matching none
/// of its benchmarks, then ends this process with the run's exit status. With neither
/// argument (`cargo bench`, `cargo test --bench`) it returns at once.
pub fn answer_test_runner() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        if !args.iter().any(|a| a == "--ignored") {
            println!("smoke: test");
        }
        std::process::exit(0);
    }
    if args.iter().any(|a| a == "--exact") {
        let status = std::env::current_exe()
            .and_then(|exe| std::process::Command::new(exe).status())
            .unwrap_or_else(|e| panic!("run this bench binary again for its smoke test: {e}"));
        std::process::exit(status.code().unwrap_or(1));
    }
}

/// The `main` of store crate `krate`'s lease bench `bench`: answers a test runner
/// ([`answer_test_runner`]), runs the criterion groups `criterion` and criterion's summary,
/// then `figures` adds this run's rows to the bench's report (columns [`FIGURE_COLUMNS`],
/// command `cargo bench -p <krate> --bench <bench>`), which is written; last it prints how
/// long the bench ran. Panics when the report cannot be written, as a failed bench should.
pub fn store_bench_main(
    krate: &str,
    bench: &str,
    criterion: impl FnOnce(),
    figures: impl FnOnce(&mut Report),
) {
    answer_test_runner();
    let started = std::time::Instant::now();
    let command = format!("cargo bench -p {krate} --bench {bench}");
    let mut report = Report::new(bench, &command, &FIGURE_COLUMNS);
    criterion();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
    figures(&mut report);
    report.finish().expect("the report");
    println!("(bench ran {:.0?})", started.elapsed());
}

/// A bench knob: the number in the environment variable `var` when it is set, else `full`
/// under `cargo bench` and `small` in a [`smoke`] run.
pub fn knob(var: &str, full: u64, small: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke() { small } else { full })
}

/// `full` under `cargo bench`, `small` in a [`smoke`] run: for sizes no variable sets.
pub fn size(full: usize, small: usize) -> usize {
    if smoke() { small } else { full }
}

/// A multi-threaded runtime with two workers, I/O and timers.
///
/// # Errors
/// When the runtime cannot be built.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

/// Settings for latency benches: ttl 60 s, renewals every 6 s (none during a sample).
pub fn api_settings() -> LeaseSettings {
    LeaseSettings {
        heartbeat_timeout: Duration::from_secs(60),
        heartbeat_interval: Duration::from_secs(6),
        lease_operation_timeout: Duration::from_secs(5),
        lease_retry_interval: Duration::from_secs(1),
        safety_margin: Duration::from_secs(6),
        lock_delay: Duration::ZERO,
    }
}

/// Settings for renewal-cost runs: ttl 10 s, renewals every 1 s.
pub fn renewal_settings() -> LeaseSettings {
    LeaseSettings {
        heartbeat_timeout: Duration::from_secs(10),
        heartbeat_interval: Duration::from_secs(1),
        lease_operation_timeout: Duration::from_secs(5),
        lease_retry_interval: Duration::from_secs(1),
        safety_margin: Duration::from_secs(1),
        lock_delay: Duration::ZERO,
    }
}

/// A store-SPI acquire request for `name` by owner `bench-owner`, instance `bench`.
pub fn spi_request(name: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest {
        name: name.into(),
        owner: "bench-owner".into(),
        instance: "bench".into(),
        ttl,
        ..AcquireRequest::default()
    }
}

/// One acquire (asserted granted) and one release (asserted released) through the Lease
/// API.
pub async fn lease_acquire_release(lease: &Lease) {
    assert!(matches!(
        lease.acquire().await.unwrap(),
        Acquired::Granted { .. }
    ));
    assert!(lease.release().await.unwrap());
}

/// One `try_acquire` (asserted granted) and one `release` (asserted released) of `req`
/// through the store SPI.
pub async fn store_acquire_release(store: &dyn LeaseStore, req: &AcquireRequest) {
    let AcquireOutcome::Granted(r) = store.try_acquire(req).await.unwrap() else {
        panic!("held")
    };
    assert!(store.release(&req.name, &req.owner, r.token).await.unwrap());
}

/// What [`thin_path`] measured: the mean time of one acquire+release pair each way, and the
/// median over rounds of each way's time against the direct one's in the same round.
#[derive(Clone, Copy, Debug)]
pub struct ThinPath {
    /// Rounds, each one batch of pairs per way, the ways alternating.
    pub rounds: usize,
    /// Pairs per batch.
    pub per_round: u32,
    /// The store's operations issued directly (the store's own client, no Tenure code).
    pub direct: Duration,
    /// Through the Lease API (`Lease::acquire` + `Lease::release`: the LeaseActor).
    pub lease_api: Duration,
    /// Through the store SPI (`try_acquire` + `release`).
    pub store_spi: Duration,
    /// Median per round of lease_api / direct: the figure the thin-path goal bounds by 1.1.
    pub api_ratio: f64,
    /// Median per round of store_spi / direct.
    pub spi_ratio: f64,
}

impl std::fmt::Display for ThinPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "thin path: acquire+release, {} alternating rounds of {} pairs, caller a task on the runtime: direct {:.1?}, lease_api {:.1?}, store_spi {:.1?} per pair; median per round: lease_api / direct = {:.2}x, store_spi / direct = {:.2}x",
            self.rounds,
            self.per_round,
            self.direct,
            self.lease_api,
            self.store_spi,
            self.api_ratio,
            self.spi_ratio
        )
    }
}

/// The columns of a store bench's [`Report`]: one figure a row.
pub const FIGURE_COLUMNS: [&str; 2] = ["figure", "result"];

impl ThinPath {
    /// Adds this run's figures to `report` (columns [`FIGURE_COLUMNS`]), the direct way
    /// named by `direct` ("the store's operations by hand").
    pub fn add_to(&self, report: &mut Report, direct: &str) {
        let runs = format!(
            "{} alternating rounds of {} pairs",
            self.rounds, self.per_round
        );
        report.row([
            format!("thin path: Lease API / {direct}, median of {runs}"),
            format!("{:.2}x", self.api_ratio),
        ]);
        report.row([
            format!("thin path: store SPI / {direct}, median of the same rounds"),
            format!("{:.2}x", self.spi_ratio),
        ]);
        report.row([
            format!("thin path: one acquire+release, {direct} / Lease API / store SPI (mean)"),
            format!(
                "{:.1?} / {:.1?} / {:.1?}",
                self.direct, self.lease_api, self.store_spi
            ),
        ]);
    }
}

/// Acquire+release through the Lease API (`lease`) and the store SPI (`req` on `store`)
/// against `direct`, one pair of the same store operations issued with the store's own
/// client, in one run: rounds of [`size`]`(40, 2)` batches of `size(100, 3)` pairs, the
/// three ways alternating, every batch run by one task spawned on `rt` (the caller is
/// async code on the runtime, as a Tenure user's is, and no batch pays a hop from a thread
/// outside it). Prints the result and returns it.
pub fn thin_path<D, F>(
    rt: &tokio::runtime::Runtime,
    lease: &Lease,
    store: &Arc<dyn LeaseStore>,
    req: &AcquireRequest,
    direct: D,
) -> ThinPath
where
    D: Fn() -> F + Send + Sync + 'static,
    F: std::future::Future<Output = ()> + Send,
{
    let rounds = size(40, 2);
    let per_round = size(100, 3) as u32;
    let direct = Arc::new(direct);
    let batch = |way: usize| -> Duration {
        let (lease, store, req, direct) =
            (lease.clone(), store.clone(), req.clone(), direct.clone());
        rt.block_on(rt.spawn(async move {
            let started = std::time::Instant::now();
            for _ in 0..per_round {
                match way {
                    0 => direct().await,
                    1 => lease_acquire_release(&lease).await,
                    _ => store_acquire_release(store.as_ref(), &req).await,
                }
            }
            started.elapsed()
        }))
        .expect("a thin-path batch panicked")
    };
    let (mut api, mut spi) = (Vec::new(), Vec::new());
    let mut totals = [Duration::ZERO; 3];
    for _ in 0..rounds {
        let took: Vec<Duration> = (0..3).map(batch).collect();
        api.push(took[1].as_secs_f64() / took[0].as_secs_f64());
        spi.push(took[2].as_secs_f64() / took[0].as_secs_f64());
        for (total, t) in totals.iter_mut().zip(&took) {
            *total += *t;
        }
    }
    let pairs = rounds as u32 * per_round;
    let result = ThinPath {
        rounds,
        per_round,
        direct: totals[0] / pairs,
        lease_api: totals[1] / pairs,
        store_spi: totals[2] / pairs,
        api_ratio: median(api).expect("rounds"),
        spi_ratio: median(spi).expect("rounds"),
    };
    println!("\n{result}");
    result
}

/// Renew calls seen by a [`Counting`] store and the leases they carried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenewCounts {
    /// Renew calls (store round trips).
    pub calls: u64,
    /// Leases carried by those calls.
    pub leases: u64,
}

impl std::ops::Sub for RenewCounts {
    type Output = RenewCounts;

    fn sub(self, earlier: RenewCounts) -> RenewCounts {
        RenewCounts {
            calls: self.calls - earlier.calls,
            leases: self.leases - earlier.leases,
        }
    }
}

/// Wraps a store to count its renew calls and the leases they carried; every other
/// method is forwarded unchanged, and the store's capabilities are the wrapped store's.
pub type Counting = Wrapped<RenewCounter>;

/// The counts of a [`Counting`] store and the store it wraps.
pub struct RenewCounter {
    inner: Arc<dyn LeaseStore>,
    renew_calls: AtomicU64,
    renewed: AtomicU64,
}

impl Counting {
    /// Counts the renewals of `inner`, from zero.
    pub fn new(inner: Arc<dyn LeaseStore>) -> Arc<Counting> {
        Arc::new(Wrapped(RenewCounter {
            inner,
            renew_calls: AtomicU64::new(0),
            renewed: AtomicU64::new(0),
        }))
    }
}

impl RenewCounter {
    /// The counts so far.
    pub fn counts(&self) -> RenewCounts {
        RenewCounts {
            calls: self.renew_calls.load(Ordering::SeqCst),
            leases: self.renewed.load(Ordering::SeqCst),
        }
    }

    /// The wrapped store, for calls that should not be counted.
    pub fn inner(&self) -> &Arc<dyn LeaseStore> {
        &self.inner
    }
}

#[async_trait]
impl StoreWrapper for RenewCounter {
    fn wrapped(&self) -> &dyn LeaseStore {
        &*self.inner
    }
    async fn renew(
        &self,
        owner: &str,
        leases: &[HeldLease],
        ttl: Duration,
    ) -> Result<Vec<Renewal>, StoreError> {
        self.renew_calls.fetch_add(1, Ordering::SeqCst);
        self.renewed
            .fetch_add(leases.len() as u64, Ordering::SeqCst);
        self.inner.renew(owner, leases, ttl).await
    }
}

/// LeaseActors of one owner sharing one [`RenewalBatcher`], each holding one lease.
pub struct Holders {
    names: Vec<String>,
    actors: Vec<(ActorRef<LeaseMsg>, LeaseView)>,
}

impl Holders {
    /// Starts one LeaseActor per name for `owner` on `store` and acquires each (asserted
    /// granted).
    pub async fn start(
        store: Arc<dyn LeaseStore>,
        owner: &str,
        names: Vec<String>,
        settings: LeaseSettings,
    ) -> Holders {
        let batcher = RenewalBatcher::new(store.clone(), owner.into(), settings);
        let mut actors = Vec::with_capacity(names.len());
        for name in &names {
            let spec =
                LeaseSpec::with_batcher(name, owner, store.clone(), settings, batcher.clone())
                    .unwrap();
            let (actor, view) = LeaseActor::start(spec, LeaseEventSink::ignore(), None)
                .await
                .unwrap();
            let reply = ractor::call!(actor, LeaseMsg::TryAcquire).unwrap().unwrap();
            assert!(matches!(reply.0, Acquired::Granted { .. }));
            actors.push((actor, view));
        }
        Holders { names, actors }
    }

    /// Whether every actor still believes it holds its lease.
    pub fn all_held(&self) -> bool {
        self.actors.iter().all(|(_, v)| v.check_lease())
    }

    /// The leases held now, with their tokens, in start order; `None` when one is not held.
    pub fn held(&self) -> Option<Vec<HeldLease>> {
        self.names
            .iter()
            .zip(&self.actors)
            .map(|(name, (_, v))| {
                Some(HeldLease {
                    name: name.clone(),
                    token: v.token()?,
                })
            })
            .collect()
    }

    /// Stops every actor.
    pub fn stop(&self) {
        for (a, _) in &self.actors {
            a.stop(None);
        }
    }
}

/// Waits [`settle`], samples, waits [`intervals`] heartbeat intervals and samples again:
/// the two samples bracket whole intervals.
pub async fn bracket_intervals<T>(interval: Duration, mut sample: impl FnMut() -> T) -> (T, T) {
    tokio::time::sleep(settle()).await;
    let before = sample();
    tokio::time::sleep(interval * intervals() as u32).await;
    let after = sample();
    (before, after)
}

/// How long `run` took.
pub async fn timed(run: impl AsyncFnOnce()) -> Duration {
    let t = std::time::Instant::now();
    run().await;
    t.elapsed()
}

/// Slices of a round of each path in [`paired`]: the two paths alternate slice by slice.
pub const SLICES: u64 = 20;

/// Messages per second of a path and of its baseline, `(ours, base)`, each sending `n`
/// messages in [`SLICES`] slices (`ours(k)`/`base(k)` send `k` messages, see them handled
/// and say how long that took): the slices alternate, ours first, then the baseline first,
/// and so on. Whatever the moment costs (the scheduler placing the tasks on one worker or
/// two, a neighbour's load that comes and goes, running first or second), both paths pay
/// it alike.
pub async fn paired(
    n: u64,
    mut ours: impl AsyncFnMut(u64) -> Duration,
    mut base: impl AsyncFnMut(u64) -> Duration,
) -> (f64, f64) {
    let k = n / SLICES;
    let (mut o, mut b) = (Duration::ZERO, Duration::ZERO);
    for slice in 0..SLICES {
        if slice % 2 == 0 {
            o += ours(k).await;
            b += base(k).await;
        } else {
            b += base(k).await;
            o += ours(k).await;
        }
    }
    let sent = (k * SLICES) as f64;
    (sent / o.as_secs_f64(), sent / b.as_secs_f64())
}

/// The rounds of one path against its baseline: one `(ours, base)` pair of [`paired`] per
/// round, summed up by medians over the rounds (`NaN` before the first round).
#[derive(Debug, Default, Clone)]
pub struct PairedRounds(Vec<(f64, f64)>);

impl PairedRounds {
    /// Adds one round's `(ours, base)` rates.
    pub fn push(&mut self, round: (f64, f64)) {
        self.0.push(round);
    }

    /// The median rate of the path.
    pub fn ours(&self) -> f64 {
        median(self.0.iter().map(|r| r.0).collect()).unwrap_or(f64::NAN)
    }

    /// The median rate of the baseline.
    pub fn base(&self) -> f64 {
        median(self.0.iter().map(|r| r.1).collect()).unwrap_or(f64::NAN)
    }

    /// The median of the rounds' ratios: how many times slower than the baseline.
    pub fn ratio(&self) -> f64 {
        median(self.0.iter().map(|(ours, base)| base / ours).collect()).unwrap_or(f64::NAN)
    }
}

/// The median (upper one for an even count) of `values`; `None` when empty.
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied()
}

/// The `pct`-th percentile (index `len * pct / 100`) of `sorted`, which must be sorted;
/// `None` when empty or `pct` is over 99.
pub fn percentile<T: Copy>(sorted: &[T], pct: usize) -> Option<T> {
    sorted.get(sorted.len() * pct / 100).copied()
}
