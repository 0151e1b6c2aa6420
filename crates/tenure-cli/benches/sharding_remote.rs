//! Messages to entities on another node, through the regions, against a bare
//! ractor_cluster remote actor between the same two processes, same run.
//!
//! `cargo bench -p tenure-cli --bench sharding_remote` starts a second process (this
//! binary with TENURE_BENCH_NODE set): a Tenure node hosting the `echo` entity type and a
//! bare remotable actor. This process joins as a node without the type's role, so every
//! shard lives on the other node and every message crosses the network: asks are
//! request/reply round trips (sequential), tells are one-way throughput (N tells to one
//! entity followed by one ask as a barrier; per-path FIFO makes the answer come after
//! every tell). The two paths alternate over several rounds; ratios are medians of the
//! per-round ratios.

use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, pg};
use ractor_cluster::RactorClusterMessage;
use tenure::TenureConfig;
use tenure::sharding::{Entity, EntityContext, entity_factory};
use tenure_lease::conformance::bench::size;
use tenure_test_kit::cli::pair;

fn round_trips() -> usize {
    size(1_000, 20)
}
fn tells() -> usize {
    size(10_000, 100)
}
fn rounds() -> usize {
    size(5, 1)
}

struct Echo;
impl Entity for Echo {
    type Request = u64;
    type Reply = u64;
    type State = u64;
    async fn start(&self, _: &EntityContext) -> Result<u64, ActorProcessingErr> {
        Ok(0)
    }
    async fn handle(
        &self,
        _: &EntityContext,
        n: &mut u64,
        add: u64,
    ) -> Result<u64, ActorProcessingErr> {
        *n += add;
        Ok(*n)
    }
}

/// The bare remote actor's messages (ractor_cluster's derive).
#[derive(RactorClusterMessage)]
pub enum RawMsg {
    /// Adds to the actor's sum, one-way.
    Add(u64),
    /// Adds to the sum and answers with it (a round trip, or the barrier after tells).
    #[rpc]
    Echo(u64, RpcReplyPort<u64>),
}

struct Raw;
impl Actor for Raw {
    type Msg = RawMsg;
    type State = u64;
    type Arguments = ();
    async fn pre_start(&self, _: ActorRef<RawMsg>, _: ()) -> Result<u64, ActorProcessingErr> {
        Ok(0)
    }
    async fn handle(
        &self,
        _: ActorRef<RawMsg>,
        m: RawMsg,
        n: &mut u64,
    ) -> Result<(), ActorProcessingErr> {
        match m {
            RawMsg::Add(k) => *n += k,
            RawMsg::Echo(k, r) => {
                *n += k;
                let _ = r.send(*n);
            }
        }
        Ok(())
    }
}

async fn serve(path: String) {
    let config = TenureConfig::load(Some(std::path::Path::new(&path))).unwrap();
    let (_node, _region) = pair::start(&config, "echo", Some(entity_factory(Echo))).await;
    let (raw, _) = Actor::spawn(None, Raw, ()).await.unwrap();
    pg::join("bench/raw".into(), vec![raw.get_cell()]);
    println!("ready");
    tokio::time::sleep(Duration::from_secs(3600)).await;
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if let Ok(path) = std::env::var("TENURE_BENCH_NODE") {
        return serve(path).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let ports = pair::ports();
    let host = pair::spawn_host(dir.path(), ports, "echo", 10, &[], "TENURE_BENCH_NODE");
    let config = pair::sender_config(dir.path(), ports, "echo", 10);
    let (node, region) = pair::start(&config, "echo", None).await;
    let keys: Vec<String> = (0..100).map(|i| format!("e{i}")).collect();
    for k in &keys {
        while region
            .ask::<_, u64>(k, &0u64, Duration::from_secs(5))
            .await
            .is_err()
        {}
    }
    let raw: ActorRef<RawMsg> = loop {
        if let Some(cell) = pg::get_members(&"bench/raw".to_string())
            .into_iter()
            .find(|c| !c.get_id().is_local())
        {
            break cell.into();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let (mut ask_ratio, mut tell_ratio) = (Vec::new(), Vec::new());
    let (mut ask_rates, mut raw_call_rates, mut tell_rates, mut raw_cast_rates) =
        (vec![], vec![], vec![], vec![]);
    for _ in 0..rounds() {
        let t = Instant::now();
        for i in 0..round_trips() {
            let _: u64 = region
                .ask(&keys[i % 100], &1u64, Duration::from_secs(5))
                .await
                .unwrap();
        }
        let ask = round_trips() as f64 / t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..round_trips() {
            raw.call(|r| RawMsg::Echo(1, r), Some(Duration::from_secs(5)))
                .await
                .unwrap();
        }
        let raw_call = round_trips() as f64 / t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..tells() {
            region.tell(&keys[0], &1u64).unwrap();
        }
        let _: u64 = region
            .ask(&keys[0], &0u64, Duration::from_secs(60))
            .await
            .unwrap();
        let tell = tells() as f64 / t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..tells() {
            raw.cast(RawMsg::Add(1)).unwrap();
        }
        raw.call(|r| RawMsg::Echo(0, r), Some(Duration::from_secs(60)))
            .await
            .unwrap();
        let raw_cast = tells() as f64 / t.elapsed().as_secs_f64();
        ask_ratio.push(raw_call / ask);
        tell_ratio.push(raw_cast / tell);
        ask_rates.push(ask);
        raw_call_rates.push(raw_call);
        tell_rates.push(tell);
        raw_cast_rates.push(raw_cast);
    }
    println!(
        "messages to entities on another node ({} alternating rounds, medians):",
        rounds()
    );
    println!(
        "  ask through the regions  {:>8.0}/s   bare ractor_cluster call {:>8.0}/s   {:.2}x slower",
        median(ask_rates),
        median(raw_call_rates),
        median(ask_ratio)
    );
    println!(
        "  tell through the regions {:>8.0}/s   bare ractor_cluster cast {:>8.0}/s   {:.2}x slower",
        median(tell_rates),
        median(raw_cast_rates),
        median(tell_ratio)
    );
    region.stop().await;
    let _ = node.leave().await;
    drop(host);
}
