//! Sharding costs, in one process, each reported against a baseline measured in the same
//! run:
//! - messages per second to local entities through the region (`ask` round trips and
//!   one-way `tell`) vs a bare ractor actor doing the same work (`call` / `cast`);
//! - LeaseLost → every entity of a shard with 1,000 entities stopped (p50/p99 over runs,
//!   from the shard's own history lines `shard_lease_lost` → `shard_stopped`);
//! - memory (RSS) per idle entity and per shard.
//!
//! `cargo bench -p tenure-cli --bench sharding_local`: the messages in TENURE_BENCH_MESSAGE_RUNS
//! runs (default 5), each path's verdict the median of the runs' ratios; LeaseLost in
//! TENURE_BENCH_RUNS runs (default 20).
//! Fail-over after SIGKILL is measured by `cargo bench -p tenure-cli --bench sharding_failover`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tenure_lease_kit::bench::{PairedRounds, SLICES, knob, median, paired, size, timed};
use tenure_lease_kit::report::Report;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tenure::cluster::{Incarnation, NodeAddr};
use tenure::history::{HistoryFile, HistoryLayer};
use tenure::memory::Fault;
use tenure::sharding::{
    Entity, EntityContext, Shard, ShardArgs, ShardMsg, ShardingSettings, entity_factory, shard_of,
};
use tenure::{LeaseSpec, LeaseStore, MemoryStore, TenureConfig};
use tracing_subscriber::layer::SubscriberExt;

/// Counts what it is sent; replies with the count.
struct Echo(Arc<AtomicU64>);

impl Entity for Echo {
    type Request = u64;
    type Reply = u64;
    type State = ();
    async fn start(&self, _: &EntityContext) -> Result<(), ActorProcessingErr> {
        Ok(())
    }
    async fn handle(
        &self,
        _: &EntityContext,
        _: &mut (),
        n: u64,
    ) -> Result<u64, ActorProcessingErr> {
        Ok(self.0.fetch_add(n, Ordering::Relaxed) + n)
    }
}

/// The baseline: a bare ractor actor with the same work.
struct Bare;
enum BareMsg {
    Add(u64, Option<RpcReplyPort<u64>>),
}
impl ractor::Message for BareMsg {}
impl Actor for Bare {
    type Msg = BareMsg;
    type State = Arc<AtomicU64>;
    type Arguments = Arc<AtomicU64>;
    async fn pre_start(
        &self,
        _: ActorRef<BareMsg>,
        a: Arc<AtomicU64>,
    ) -> Result<Arc<AtomicU64>, ActorProcessingErr> {
        Ok(a)
    }
    async fn handle(
        &self,
        _: ActorRef<BareMsg>,
        m: BareMsg,
        s: &mut Arc<AtomicU64>,
    ) -> Result<(), ActorProcessingErr> {
        let BareMsg::Add(n, reply) = m;
        let v = s.fetch_add(n, Ordering::Relaxed) + n;
        if let Some(r) = reply {
            let _ = r.send(v);
        }
        Ok(())
    }
}

/// The baseline with the entity path's codec work: the request travels encoded and is
/// decoded by the actor, whose reply is encoded and decoded by the caller (what an entity
/// and the region's handle do for every message, whatever the routing).
struct BareCodec;
enum BareCodecMsg {
    Add(Vec<u8>, Option<RpcReplyPort<Vec<u8>>>),
}
impl ractor::Message for BareCodecMsg {}
const KIND: &str = "entity request";
impl Actor for BareCodec {
    type Msg = BareCodecMsg;
    type State = Arc<AtomicU64>;
    type Arguments = Arc<AtomicU64>;
    async fn pre_start(
        &self,
        _: ActorRef<BareCodecMsg>,
        a: Arc<AtomicU64>,
    ) -> Result<Arc<AtomicU64>, ActorProcessingErr> {
        Ok(a)
    }
    async fn handle(
        &self,
        _: ActorRef<BareCodecMsg>,
        m: BareCodecMsg,
        s: &mut Arc<AtomicU64>,
    ) -> Result<(), ActorProcessingErr> {
        let BareCodecMsg::Add(bytes, reply) = m;
        let n: u64 = tenure::cluster::codec::decode_inner(KIND, "echo", &bytes)?;
        let v = s.fetch_add(n, Ordering::Relaxed) + n;
        if let Some(r) = reply {
            let _ = r.send(tenure::cluster::codec::encode_inner(KIND, "echo", &v)?);
        }
        Ok(())
    }
}

/// One path's figures over the runs: per run its median rate, its baseline's, and the
/// median of its rounds' ratios.
#[derive(Default)]
struct Verdict(Vec<(f64, f64, f64)>);

impl Verdict {
    fn push(&mut self, ours: f64, base: f64, ratio: f64) {
        self.0.push((ours, base, ratio));
    }

    fn median(&self, field: impl Fn(&(f64, f64, f64)) -> f64) -> f64 {
        median(self.0.iter().map(field).collect()).unwrap_or(f64::NAN)
    }

    /// `  <path> <rate>/s   <baseline> <rate>/s   <ratio>x slower [each run's]<note>`.
    /// Also adds the path's row to `report`.
    fn print(&self, report: &mut Report, path: &str, baseline: &str, note: &str) {
        let each: Vec<String> = self.0.iter().map(|r| format!("{:.2}", r.2)).collect();
        let (ours, base, ratio) = (
            self.median(|r| r.0),
            self.median(|r| r.1),
            self.median(|r| r.2),
        );
        println!(
            "  {path} {ours:>10.0}/s   {baseline} {base:>10.0}/s   {ratio:.2}x slower [{}]{note}",
            each.join(" ")
        );
        report.row([
            format!("{}{note}", path.trim()),
            baseline.trim().to_string(),
            format!("{ours:.0}/s"),
            format!("{base:.0}/s"),
            format!("{ratio:.2}x"),
            each.join(" "),
        ]);
    }
}

fn rounds() -> usize {
    size(9, 2)
}

/// `n` entity ids that map to shard `shard` (a shard refuses to start an entity of another
/// shard).
fn ids_in_shard(shard: &str, n: usize) -> Vec<String> {
    let shards = shard_settings().number_of_shards;
    (0..)
        .map(|i| format!("e{i}"))
        .filter(|id| shard_of(id, shards) == shard)
        .take(n)
        .collect()
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4
}

fn lease_settings() -> tenure::LeaseSettings {
    tenure::LeaseSettings {
        heartbeat_timeout: Duration::from_millis(1500),
        heartbeat_interval: Duration::from_millis(200),
        lease_operation_timeout: Duration::from_millis(500),
        lease_retry_interval: Duration::from_millis(50),
        safety_margin: Duration::from_millis(200),
        lock_delay: Duration::ZERO,
    }
}

fn shard_settings() -> Arc<ShardingSettings> {
    let config = TenureConfig::from_toml_str("", "bench").unwrap();
    let mut s = ShardingSettings::from_config(&config, "bench", "memory").unwrap();
    s.idle_timeout = None;
    // The stop budget (stop-timeout + kill wait + delivery slack) must fit the lease's
    // heartbeat-timeout with two failed renewals to spare, or the region refuses to start.
    s.stop_timeout = Duration::from_millis(300);
    s.lease = lease_settings();
    Arc::new(s)
}

/// How long `send(0..k)` took until `handled` counted every one of them.
async fn sent_and_handled(handled: &AtomicU64, k: u64, mut send: impl FnMut(u64)) -> Duration {
    let before = handled.load(Ordering::Relaxed);
    timed(async || {
        for i in 0..k {
            send(i);
        }
        while handled.load(Ordering::Relaxed) < before + k {
            tokio::task::yield_now().await;
        }
    })
    .await
}

async fn throughput(report: &mut Report, runs: usize, asks: u64, tells: u64) {
    let (node, provider) = tenure_test_kit::node::one_node(
        "bench-cookie-0123456789abcdef0123456",
        "[sharding.echo]\nnumber-of-shards = 10\nretry-interval = \"100ms\"\nidle-timeout = \"off\"\n",
    )
    .await;
    let count = Arc::new(AtomicU64::new(0));
    let region = tenure::sharding::start_on_node(
        &node,
        &provider,
        "echo",
        Some(entity_factory(Echo(count.clone()))),
    )
    .await
    .unwrap();
    let keys: Vec<String> = (0..100).map(|i| format!("e{i}")).collect();
    // Warm up: every entity started, every shard's home known.
    for k in &keys {
        loop {
            if region
                .ask::<_, u64>(k, &0u64, Duration::from_secs(5))
                .await
                .is_ok()
            {
                break;
            }
        }
    }
    let (bare, _) = Actor::spawn(None, Bare, Arc::new(AtomicU64::new(0)))
        .await
        .unwrap();
    let bare_count = Arc::new(AtomicU64::new(0));
    let (bare_tell, _) = Actor::spawn(None, Bare, bare_count.clone()).await.unwrap();
    let (codec, _) = Actor::spawn(None, BareCodec, Arc::new(AtomicU64::new(0)))
        .await
        .unwrap();
    let codec_count = Arc::new(AtomicU64::new(0));
    let (codec_tell, _) = Actor::spawn(None, BareCodec, codec_count.clone())
        .await
        .unwrap();
    // The same work spread over as many actors as entities: 100 bare actors, round robin.
    let spread_count = Arc::new(AtomicU64::new(0));
    let mut spread = Vec::new();
    for _ in 0..100 {
        spread.push(
            Actor::spawn(None, Bare, spread_count.clone())
                .await
                .unwrap()
                .0,
        );
    }

    // Each path and its baseline, slice by slice (see `paired`).
    let ask_to = async |spread_over: u64, k: u64| {
        timed(async || {
            for i in 0..k {
                let _: u64 = region
                    .ask(
                        &keys[(i % spread_over) as usize],
                        &1u64,
                        Duration::from_secs(5),
                    )
                    .await
                    .unwrap();
            }
        })
        .await
    };
    let ask = async |k: u64| ask_to(100, k).await;
    let call = async |k: u64| {
        timed(async || {
            for _ in 0..k {
                let _ = bare.call(|r| BareMsg::Add(1, Some(r)), None).await.unwrap();
            }
        })
        .await
    };
    let spread_call = async |k: u64| {
        timed(async || {
            for i in 0..k {
                let _ = spread[(i % 100) as usize]
                    .call(|r| BareMsg::Add(1, Some(r)), None)
                    .await
                    .unwrap();
            }
        })
        .await
    };
    let codec_call = async |k: u64| {
        timed(async || {
            for _ in 0..k {
                let bytes = tenure::cluster::codec::encode_inner(KIND, "echo", &1u64).unwrap();
                let reply = codec
                    .call(|r| BareCodecMsg::Add(bytes, Some(r)), None)
                    .await
                    .unwrap()
                    .unwrap();
                let _: u64 = tenure::cluster::codec::decode_inner(KIND, "echo", &reply).unwrap();
            }
        })
        .await
    };
    // Tells: sent, then waited for until every one was handled.
    let tell_to = async |spread_over: u64, k: u64| {
        sent_and_handled(&count, k, |i| {
            region
                .tell(&keys[(i % spread_over) as usize], &1u64)
                .unwrap()
        })
        .await
    };
    let cast = async |k: u64| {
        sent_and_handled(&bare_count, k, |_| {
            bare_tell.cast(BareMsg::Add(1, None)).unwrap()
        })
        .await
    };
    let spread_cast = async |k: u64| {
        sent_and_handled(&spread_count, k, |i| {
            spread[(i % 100) as usize]
                .cast(BareMsg::Add(1, None))
                .unwrap()
        })
        .await
    };
    let codec_cast = async |k: u64| {
        sent_and_handled(&codec_count, k, |_| {
            let bytes = tenure::cluster::codec::encode_inner(KIND, "echo", &1u64).unwrap();
            codec_tell.cast(BareCodecMsg::Add(bytes, None)).unwrap()
        })
        .await
    };
    // Each run is the bench's rounds of every path; the verdict is the median over the runs
    // of each run's ratio (itself the median of its rounds), printed with every run's.
    let mut verdicts: [Verdict; 8] = Default::default();
    for run in 0..runs {
        let [
            mut ask_call,
            mut one_call,
            mut many_calls,
            mut one_cast,
            mut many_spread,
            mut ask_codec,
            mut many_codec,
        ] = std::array::from_fn::<_, 7, _>(|_| PairedRounds::default());
        for _ in 0..rounds() {
            ask_call.push(paired(asks, ask, call).await);
            one_call.push(paired(asks, async |k| ask_to(1, k).await, call).await);
            many_calls.push(paired(asks, ask, spread_call).await);
            one_cast.push(paired(tells, async |k| tell_to(1, k).await, cast).await);
            many_spread.push(paired(tells, async |k| tell_to(100, k).await, spread_cast).await);
            ask_codec.push(paired(asks, ask, codec_call).await);
            many_codec.push(paired(tells, async |k| tell_to(100, k).await, codec_cast).await);
        }
        let this_run = [
            &one_call,
            &many_calls,
            &ask_call,
            &one_cast,
            &many_spread,
            &ask_codec,
            &many_codec,
        ];
        for (verdict, rounds) in verdicts.iter_mut().zip(this_run) {
            verdict.push(rounds.ours(), rounds.base(), rounds.ratio());
        }
        // Not alternated: the medians of the two rates.
        verdicts[7].push(
            many_spread.ours(),
            one_cast.base(),
            one_cast.base() / many_spread.ours(),
        );
        eprintln!(
            "run {}/{runs}: ask 1 {:.2}x, ask 100 {:.2}x, tell 1 {:.2}x, tell 100 {:.2}x",
            run + 1,
            one_call.ratio(),
            many_calls.ratio(),
            one_cast.ratio(),
            many_spread.ratio()
        );
    }
    println!(
        "local messages ({asks} asks, {tells} tells per path and round; {runs} runs of {} rounds, each path alternating with its baseline in {SLICES} slices; per run the median of its rounds, the verdict the median of the runs, each run's in brackets; 100 entities in 10 shards on a 1-node cluster):",
        rounds()
    );
    let [
        one_call,
        many_calls,
        ask_call,
        one_cast,
        many_spread,
        ask_codec,
        many_codec,
        many_one_cast,
    ] = &verdicts;
    one_call.print(report, "ask to 1 entity      ", "bare ractor call", "");
    many_calls.print(
        report,
        "ask to 100 entities  ",
        "100 bare actors ",
        " (the same work spread as widely)",
    );
    ask_call.print(
        report,
        "ask to 100 entities  ",
        "bare ractor call",
        " (against one bare actor)",
    );
    one_cast.print(report, "tell to 1 entity     ", "bare ractor cast", "");
    many_spread.print(
        report,
        "tell to 100 entities ",
        "100 bare actors ",
        " (the same work spread as widely)",
    );
    many_one_cast.print(
        report,
        "tell to 100 entities ",
        "bare ractor cast",
        " (not alternated: medians of the two rates)",
    );
    println!(
        "  with the same codec work (request encoded by the sender and decoded by the actor; an ask's reply too):"
    );
    let codec = " (with the same codec work)";
    ask_codec.print(report, "ask to 100 entities  ", "bare ractor call", codec);
    many_codec.print(report, "tell to 100 entities ", "bare ractor cast", codec);
    region.stop().await;
    let _ = node.leave().await;
}

async fn lease_lost_to_stopped(runs: usize, entities: usize) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.jsonl");
    let addr = NodeAddr::parse("bench", "127.0.0.1:1").unwrap();
    // The process's history writer, from here on: this is the last part of the bench.
    let file = HistoryFile::open(&path).unwrap();
    let history = HistoryLayer::new(file, addr.to_string(), Incarnation::new().to_string());
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(history.filtered()),
    )
    .unwrap();
    let store = MemoryStore::new();
    let shared: Arc<dyn LeaseStore> = Arc::new(store.clone());
    let args = ShardArgs {
        type_name: "bench".into(),
        shard_id: "0".into(),
        node: addr.to_string(),
        lease: LeaseSpec::new("bench-shard-0", "127.0.0.1:1", shared, lease_settings()).unwrap(),
        factory: entity_factory(Echo(Arc::new(AtomicU64::new(0)))),
        settings: shard_settings(),
        active: None,
        process_end: tenure::ProcessEnd::abort(),
    };
    let shard = Shard::start(args, None).await.unwrap();
    let payload = tenure::cluster::codec::encode_inner("entity request", "bench", &0u64).unwrap();
    let mut times = Vec::new();
    let ids = ids_in_shard("0", entities);
    for _ in 0..runs {
        store.set_fault(Fault::None);
        for id in &ids {
            shard
                .cast(ShardMsg::Deliver {
                    entity: id.clone(),
                    payload: payload.clone(),
                    reply: None,
                })
                .unwrap();
        }
        loop {
            let s: tenure::sharding::ShardStatus = ractor::call!(shard, ShardMsg::Status).unwrap();
            if s.entities.len() == entities {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Only this shard's stops for a lost lease: shards of the parts before may still be
        // stopping, and the writer records them too.
        let lost_stop = |e: &serde_json::Value| {
            e["event"] == "shard_stopped"
                && e["shard"] == "0"
                && e["why"]
                    .as_str()
                    .is_some_and(|w| w.starts_with("lease lost"))
        };
        let seen = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(lost_stop)
            .count();
        store.set_fault(Fault::FailRenewals);
        let lines = loop {
            let text = std::fs::read_to_string(&path).unwrap();
            let lines: Vec<serde_json::Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            if lines.iter().filter(|e| lost_stop(e)).count() > seen {
                break lines;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let t = |kind: &str| {
            let e = lines
                .iter()
                .rfind(|e| e["event"] == kind && e["shard"] == "0")
                .unwrap_or_else(|| panic!("no {kind} of shard 0 in the history"));
            e["t"].as_i64().unwrap()
        };
        times.push((t("shard_stopped") - t("shard_lease_lost")) as f64 / 1e6);
    }
    let line = format!(
        "LeaseLost -> all {entities} entities of a shard stopped ({runs} runs): p50 {:.1} ms, p99 {:.1} ms",
        percentile(&mut times, 0.5),
        percentile(&mut times, 0.99)
    );
    println!("{line}");
    let _ = shard.stop_and_wait(None, None).await;
    line
}

async fn memory() -> String {
    let store = MemoryStore::new();
    let shared: Arc<dyn LeaseStore> = Arc::new(store.clone());
    let payload = tenure::cluster::codec::encode_inner("entity request", "bench", &0u64).unwrap();
    let make = |name: &str| ShardArgs {
        type_name: "bench".into(),
        shard_id: name.into(),
        node: "127.0.0.1:1".into(),
        lease: LeaseSpec::new(
            &format!("bench-shard-{name}"),
            "127.0.0.1:1",
            shared.clone(),
            lease_settings(),
        )
        .unwrap(),
        factory: entity_factory(Echo(Arc::new(AtomicU64::new(0)))),
        settings: shard_settings(),
        active: None,
        process_end: tenure::ProcessEnd::abort(),
    };
    let shard = Shard::start(make("0"), None).await.unwrap();
    let entities = size(10_000, 100);
    let ids = ids_in_shard("0", entities);
    let before = rss_kib();
    for id in ids {
        shard
            .cast(ShardMsg::Deliver {
                entity: id,
                payload: payload.clone(),
                reply: None,
            })
            .unwrap();
    }
    loop {
        let s: tenure::sharding::ShardStatus = ractor::call!(shard, ShardMsg::Status).unwrap();
        if s.entities.len() == entities {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let per_entity = (rss_kib() - before) as f64 * 1024.0 / entities as f64;
    let shards_n = size(1_000, 10);
    let before = rss_kib();
    let mut shards = Vec::new();
    for i in 0..shards_n {
        // Shard 0 above holds lease bench-shard-0 already.
        shards.push(
            Shard::start(make(&(i + 1).to_string()), None)
                .await
                .unwrap(),
        );
    }
    for s in &shards {
        loop {
            let st: tenure::sharding::ShardStatus = ractor::call!(s, ShardMsg::Status).unwrap();
            if st.serving.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let per_shard = (rss_kib() - before) as f64 * 1024.0 / shards_n as f64;
    // Baseline: bare ractor actors.
    let before = rss_kib();
    let mut bare = Vec::new();
    for _ in 0..entities {
        bare.push(
            Actor::spawn(None, Bare, Arc::new(AtomicU64::new(0)))
                .await
                .unwrap()
                .0,
        );
    }
    let per_bare = (rss_kib() - before) as f64 * 1024.0 / entities as f64;
    let line = format!(
        "memory: {per_entity:.0} B per idle entity ({entities} in one shard) vs {per_bare:.0} B per bare ractor actor ({:.2}x); {per_shard:.0} B per shard holding its lease ({shards_n} shards)",
        per_entity / per_bare
    );
    println!("{line}");
    for s in shards {
        s.stop(None);
    }
    shard.stop(None);
    for b in bare {
        b.stop(None);
    }
    line
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    tenure_lease_kit::bench::answer_test_runner();
    let runs = knob("TENURE_BENCH_RUNS", 20, 1) as usize;
    // Tells run at millions a second: enough of them that a round of one path lasts tens of
    // milliseconds, far above the scheduler's hiccups.
    let message_runs = knob("TENURE_BENCH_MESSAGE_RUNS", 5, 1) as usize;
    let mut report = Report::new(
        "sharding_local",
        "cargo bench -p tenure-cli --all-features --bench sharding_local",
        &[
            "path",
            "baseline",
            "path's rate",
            "baseline's rate",
            "slower than the baseline by (median of the runs)",
            "each run",
        ],
    );
    throughput(
        &mut report,
        message_runs,
        size(20_000, 200) as u64,
        size(200_000, 200) as u64,
    )
    .await;
    report.note(format!(
        "{message_runs} runs of {} rounds, each path alternating with its baseline in {SLICES} slices; per run the median of its rounds' ratios, the verdict the median of the runs. 100 entities in 10 shards on a 1-node cluster.",
        rounds()
    ));
    report.note(format!("{}.", memory().await));
    report.note(format!(
        "{}.",
        lease_lost_to_stopped(runs, size(1_000, 10)).await
    ));
    report.finish().expect("the report");
}
