//! Messages to entities on another node, through the regions, against a bare
//! ractor_cluster remote actor between the same two processes, same run.
//!
//! `cargo bench -p tenure-cli --bench sharding_remote` starts a second process (this
//! binary with TENURE_BENCH_NODE set): a Tenure node hosting the `echo` entity type and a
//! bare remotable actor. This process joins as a node without the type's role, so every
//! shard lives on the other node and every message crosses the network: asks are
//! request/reply round trips (sequential), tells are one-way throughput (N tells to one
//! entity followed by one ask as a barrier; per-path FIFO makes the answer come after
//! every tell). Each round, a path and its baseline alternate in slices (see `paired`);
//! ratios are medians of the per-round ratios.

use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, pg};
use ractor_cluster::RactorClusterMessage;
use tenure::TenureConfig;
use tenure::sharding::{Entity, EntityContext, entity_factory};
use tenure_lease_kit::bench::{PairedRounds, SLICES, paired, size, timed};
use tenure_lease_kit::report::Report;
use tenure_test_kit::cli::pair;

fn round_trips() -> u64 {
    size(1_000, 20) as u64
}
fn tells_per_round() -> u64 {
    size(50_000, 200) as u64
}
fn rounds() -> usize {
    size(9, 1)
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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    tenure_lease_kit::bench::answer_test_runner();
    if let Ok(path) = std::env::var("TENURE_BENCH_NODE") {
        return serve(path).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut ports = pair::ports();
    let host = pair::spawn_host(dir.path(), &mut ports, "echo", 10, &[], "TENURE_BENCH_NODE");
    let (node, region) = pair::start_sender(dir.path(), ports, "echo", 10).await;
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
    // Each path and its baseline, slice by slice (see `paired`).
    let ask = async |k: u64| {
        timed(async || {
            for i in 0..k as usize {
                let _: u64 = region
                    .ask(&keys[i % 100], &1u64, Duration::from_secs(5))
                    .await
                    .unwrap();
            }
        })
        .await
    };
    let call = async |k: u64| {
        timed(async || {
            for _ in 0..k {
                raw.call(|r| RawMsg::Echo(1, r), Some(Duration::from_secs(5)))
                    .await
                    .unwrap();
            }
        })
        .await
    };
    let tell = async |k: u64| {
        timed(async || {
            for _ in 0..k {
                region.tell(&keys[0], &1u64).unwrap();
            }
            let _: u64 = region
                .ask(&keys[0], &0u64, Duration::from_secs(60))
                .await
                .unwrap();
        })
        .await
    };
    let cast = async |k: u64| {
        timed(async || {
            for _ in 0..k {
                raw.cast(RawMsg::Add(1)).unwrap();
            }
            raw.call(|r| RawMsg::Echo(0, r), Some(Duration::from_secs(60)))
                .await
                .unwrap();
        })
        .await
    };
    let mut report = Report::new(
        "sharding_remote",
        "cargo bench -p tenure-cli --all-features --bench sharding_remote",
        &[
            "path",
            "rate",
            "baseline",
            "baseline's rate",
            "slower than the baseline by (median of the rounds)",
        ],
    );
    report.internal_var("TENURE_BENCH_NODE");
    let (mut asks, mut tells) = (PairedRounds::default(), PairedRounds::default());
    for _ in 0..rounds() {
        asks.push(paired(round_trips(), ask, call).await);
        tells.push(paired(tells_per_round(), tell, cast).await);
    }
    println!(
        "messages to entities on another node ({} rounds, each path alternating with its baseline in {SLICES} slices; medians of the rounds):",
        rounds()
    );
    println!(
        "  ask through the regions  {:>8.0}/s   bare ractor_cluster call {:>8.0}/s   {:.2}x slower",
        asks.ours(),
        asks.base(),
        asks.ratio()
    );
    println!(
        "  tell through the regions {:>8.0}/s   bare ractor_cluster cast {:>8.0}/s   {:.2}x slower",
        tells.ours(),
        tells.base(),
        tells.ratio()
    );
    for (path, rounds, baseline) in [
        ("ask through the regions", &asks, "bare ractor_cluster call"),
        (
            "tell through the regions",
            &tells,
            "bare ractor_cluster cast",
        ),
    ] {
        report.row([
            path.to_string(),
            format!("{:.0}/s", rounds.ours()),
            baseline.to_string(),
            format!("{:.0}/s", rounds.base()),
            format!("{:.2}x", rounds.ratio()),
        ]);
    }
    report.note(format!(
        "Two node processes, asks to 100 entities and tells to one, on the other node; {} rounds, each path alternating with its baseline in {SLICES} slices (goal: at most 1.25x).",
        rounds()
    ));
    report.finish().expect("the report");
    region.stop().await;
    let _ = node.leave().await;
    drop(host);
}
