//! Remote messaging between two node processes: Tenure's bincode codec
//! (`cluster_message!`, one serde payload struct per variant) against ractor_cluster's
//! derive with a trivial built-in payload (`Vec<u8>`) of the same size, same run.
//!
//! `cargo bench -p tenure-cluster --bench remote` starts a second process (this binary
//! with TENURE_BENCH_SERVER set) as the remote node, then measures, alternating the two
//! codecs over several rounds: request/reply round trips (sequential calls) and one-way
//! throughput (N casts followed by one call as a barrier: per-session FIFO means the
//! reply comes after every cast was handled).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, pg};
use ractor_cluster::node::NodeConnectionMode;
use ractor_cluster::{NodeServer, RactorClusterMessage};
use serde::{Deserialize, Serialize};
use tenure_lease_kit::bench::size;
use tenure_lease_kit::report::Report;

const BODY: usize = 64;
fn round_trips() -> usize {
    size(2_000, 20)
}
fn casts() -> usize {
    size(20_000, 100)
}
fn rounds() -> usize {
    size(5, 1)
}

/// The serde payload of every codec message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Payload {
    /// The message's number in its run.
    pub seq: u64,
    /// A short key, as an entity id would be.
    pub key: String,
    /// `BODY` bytes of filler.
    pub body: Vec<u8>,
}

/// The barrier's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Count {
    /// Casts the sink has handled so far.
    pub n: u64,
}

tenure_cluster::cluster_message! {
    /// The remote sink's messages, with Tenure's codec.
    ///
    /// - `Data`: one-way, counted by the sink.
    /// - `Barrier`: answers with the casts handled so far.
    /// - `Echo`: answers with the payload (a round trip).
    // The macro takes no attributes on variants (its cast/call/local groups would be
    // ambiguous), so the variants are documented in the list above.
    #[allow(missing_docs)]
    pub enum CodecMsg {
        cast Data(Payload),
        call Barrier(Payload) -> Count,
        call Echo(Payload) -> Payload,
    }
}

/// The same messages with ractor_cluster's derive and a `Vec<u8>` payload.
#[derive(RactorClusterMessage)]
pub enum RawMsg {
    /// One-way: counted by the sink.
    Data(Vec<u8>),
    /// Answers with the casts handled so far.
    #[rpc]
    Barrier(Vec<u8>, RpcReplyPort<u64>),
    /// Answers with the payload (a round trip).
    #[rpc]
    Echo(Vec<u8>, RpcReplyPort<Vec<u8>>),
}

struct CodecSink;
impl Actor for CodecSink {
    type Msg = CodecMsg;
    type State = u64;
    type Arguments = ();
    async fn pre_start(&self, _: ActorRef<CodecMsg>, _: ()) -> Result<u64, ActorProcessingErr> {
        Ok(0)
    }
    async fn handle(
        &self,
        _: ActorRef<CodecMsg>,
        m: CodecMsg,
        n: &mut u64,
    ) -> Result<(), ActorProcessingErr> {
        match m {
            CodecMsg::Data(p) => *n += p.body.len() as u64 / BODY as u64,
            CodecMsg::Barrier(_, r) => {
                let _ = r.send(Count { n: *n });
            }
            CodecMsg::Echo(p, r) => {
                let _ = r.send(p);
            }
        }
        Ok(())
    }
}

struct RawSink;
impl Actor for RawSink {
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
            RawMsg::Data(b) => *n += b.len() as u64 / BODY as u64,
            RawMsg::Barrier(_, r) => {
                let _ = r.send(*n);
            }
            RawMsg::Echo(b, r) => {
                let _ = r.send(b);
            }
        }
        Ok(())
    }
}

fn node(port: u16, name: &str) -> NodeServer {
    NodeServer::new(
        port,
        "bench-cookie".into(),
        name.into(),
        "127.0.0.1".into(),
        None,
        Some(NodeConnectionMode::Isolated),
    )
    .with_listen_addr(std::net::Ipv4Addr::LOCALHOST.into())
}

/// Serves on a free loopback port and prints `ready <port>` once the sinks are joined.
async fn serve() {
    tenure_cluster::codec::set_local_label("bench-server");
    let (_server, port) = server_node().await;
    let (codec, _) = Actor::spawn(None, CodecSink, ()).await.expect("codec sink");
    let (raw, _) = Actor::spawn(None, RawSink, ()).await.expect("raw sink");
    pg::join("codec".into(), vec![codec.get_cell()]);
    pg::join("raw".into(), vec![raw.get_cell()]);
    println!("ready {port}");
    tokio::time::sleep(Duration::from_secs(3600)).await;
}

/// The server's node on a port that was free a moment ago; another one when something took
/// it before the node bound it (ractor fails the node's start when its listener cannot bind).
async fn server_node() -> (ActorRef<ractor_cluster::NodeServerMessage>, u16) {
    for _ in 0..20 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        if let Ok((server, _)) = Actor::spawn(None, node(port, "server"), ()).await {
            return (server, port);
        }
    }
    panic!("the server node found no free port in 20 attempts");
}

fn payload(seq: u64) -> Payload {
    Payload {
        seq,
        key: "entity-42".into(),
        body: vec![7u8; BODY],
    }
}

/// Same size on the wire as the codec's payload (label + seq + key + body), as one Vec<u8>.
fn raw_bytes(seq: u64) -> Vec<u8> {
    let size = tenure_cluster::codec::encode("m", "v", &payload(seq))
        .unwrap()
        .len();
    vec![7u8; size.max(BODY)]
}

async fn remote<M: ractor::Message>(group: &str) -> ActorRef<M> {
    for _ in 0..500 {
        if let Some(cell) = pg::get_members(&group.to_string())
            .into_iter()
            .find(|c| !c.get_id().is_local())
        {
            return cell.into();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no remote member of {group}");
}

struct Round {
    rtt_us: Vec<f64>,
    per_sec: f64,
}

async fn codec_round(to: &ActorRef<CodecMsg>) -> Round {
    let mut rtt_us = Vec::with_capacity(round_trips());
    for i in 0..round_trips() {
        let t = Instant::now();
        let back = ractor::call_t!(to, CodecMsg::Echo, 5000, payload(i as u64)).expect("echo");
        assert_eq!(back.seq, i as u64);
        rtt_us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let before = ractor::call_t!(to, CodecMsg::Barrier, 5000, payload(0))
        .expect("barrier")
        .n;
    let t = Instant::now();
    for i in 0..casts() {
        to.cast(CodecMsg::Data(payload(i as u64))).expect("cast");
    }
    let after = ractor::call_t!(to, CodecMsg::Barrier, 60_000, payload(0))
        .expect("barrier")
        .n;
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(after - before, casts() as u64, "every cast arrived");
    Round {
        rtt_us,
        per_sec: casts() as f64 / secs,
    }
}

async fn raw_round(to: &ActorRef<RawMsg>) -> Round {
    let mut rtt_us = Vec::with_capacity(round_trips());
    for i in 0..round_trips() {
        let t = Instant::now();
        let back = ractor::call_t!(to, RawMsg::Echo, 5000, raw_bytes(i as u64)).expect("echo");
        assert!(!back.is_empty());
        rtt_us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let before = ractor::call_t!(to, RawMsg::Barrier, 5000, Vec::new()).expect("barrier");
    let t = Instant::now();
    for i in 0..casts() {
        to.cast(RawMsg::Data(raw_bytes(i as u64))).expect("cast");
    }
    let after = ractor::call_t!(to, RawMsg::Barrier, 60_000, Vec::new()).expect("barrier");
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(after - before, casts() as u64, "every cast arrived");
    Round {
        rtt_us,
        per_sec: casts() as f64 / secs,
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn median(mut v: Vec<f64>) -> f64 {
    percentile(&mut v, 0.5)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    tenure_lease_kit::bench::answer_test_runner();
    if std::env::var_os("TENURE_BENCH_SERVER").is_some() {
        serve().await;
        return;
    }
    let mut server = Command::new(std::env::current_exe().unwrap())
        .env("TENURE_BENCH_SERVER", "1")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the server process");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(server.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let port: u16 = line
        .trim()
        .strip_prefix("ready ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("the server's first line is not `ready <port>`: {line:?}"));

    tenure_cluster::codec::set_local_label("bench-client");
    let (client, _) = Actor::spawn(None, node(0, "client"), ())
        .await
        .expect("client node");
    ractor_cluster::client_connect(&client, format!("127.0.0.1:{port}"))
        .await
        .expect("connect");
    let codec: ActorRef<CodecMsg> = remote("codec").await;
    let raw: ActorRef<RawMsg> = remote("raw").await;
    let wire = tenure_cluster::codec::encode("m", "v", &payload(1))
        .unwrap()
        .len();
    println!(
        "payload: {BODY}-byte body + seq + key; {wire} bytes on the wire per message for both"
    );
    let _ = codec_round(&codec).await; // warm-up
    let _ = raw_round(&raw).await;

    let (mut c_rtt, mut r_rtt, mut c_tp, mut r_tp, mut ratios_tp, mut ratios_rtt) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for round in 0..rounds() {
        let (mut c, mut r) = if round % 2 == 0 {
            let c = codec_round(&codec).await;
            (c, raw_round(&raw).await)
        } else {
            let r = raw_round(&raw).await;
            (codec_round(&codec).await, r)
        };
        let (c50, r50) = (
            percentile(&mut c.rtt_us, 0.5),
            percentile(&mut r.rtt_us, 0.5),
        );
        println!(
            "round {round}: round trip p50 codec {c50:.0} µs / raw {r50:.0} µs; one-way codec {:.0}/s, raw {:.0}/s",
            c.per_sec, r.per_sec
        );
        ratios_tp.push(c.per_sec / r.per_sec);
        ratios_rtt.push(r50 / c50);
        c_rtt.extend(c.rtt_us);
        r_rtt.extend(r.rtt_us);
        c_tp.push(c.per_sec);
        r_tp.push(r.per_sec);
    }
    let mut report = Report::new(
        "remote",
        "cargo bench -p tenure-cluster --bench remote",
        &[
            "figure",
            "Tenure's codec",
            "ractor_cluster's payload",
            "codec / raw",
        ],
    );
    report.row([
        "round trip p50".to_string(),
        format!("{:.0} µs", percentile(&mut c_rtt, 0.5)),
        format!("{:.0} µs", percentile(&mut r_rtt, 0.5)),
        format!(
            "{:.2}x the speed (median of the rounds)",
            median(ratios_rtt.clone())
        ),
    ]);
    report.row([
        "round trip p99".to_string(),
        format!("{:.0} µs", percentile(&mut c_rtt, 0.99)),
        format!("{:.0} µs", percentile(&mut r_rtt, 0.99)),
        String::new(),
    ]);
    report.row([
        format!(
            "one-way throughput (median of {} rounds of {})",
            rounds(),
            casts()
        ),
        format!("{:.0} msg/s", median(c_tp.clone())),
        format!("{:.0} msg/s", median(r_tp.clone())),
        format!(
            "{:.2}x (median of the rounds; goal at least 0.8x)",
            median(ratios_tp.clone())
        ),
    ]);
    report.note(format!(
        "Two node processes; a {BODY}-byte body + seq + key, {wire} bytes on the wire per message either way; the rounds alternate the two."
    ));
    println!(
        "round trip p50/p99: codec {:.0}/{:.0} µs, raw {:.0}/{:.0} µs",
        percentile(&mut c_rtt, 0.5),
        percentile(&mut c_rtt, 0.99),
        percentile(&mut r_rtt, 0.5),
        percentile(&mut r_rtt, 0.99)
    );
    println!(
        "one-way throughput (median of {} rounds of {}): codec {:.0} msg/s, raw {:.0} msg/s",
        rounds(),
        casts(),
        median(c_tp),
        median(r_tp)
    );
    println!(
        "RATIO codec/raw: throughput {:.2} (median of per-round ratios; goal >= 0.8), round-trip speed {:.2}",
        median(ratios_tp),
        median(ratios_rtt)
    );
    report.finish().expect("the report");
    let _ = server.kill();
    let _ = server.wait();
}
