//! What a cluster costs as it grows: n = 3, 6, 12, 24, 48 `tenure node` processes on this
//! host, sharing one SQLite lease file, at the reference timings (member-lease-ttl 10 s,
//! renewed every 1 s, membership listed every 1 s, heartbeats every 500 ms, unreachable
//! after 3 s), with the harness's split brain resolver (stable-after 1.5 s, so a killed
//! node is downed by the resolver before its member lease expires). For each n it prints:
//! - the time from the first node's start (and from the last's) until every node has seen
//!   every other node up (their `member_up` history lines);
//! - over an idle window (TENURE_BENCH_IDLE_SECS, default 30: half the issue's "idle
//!   minute", to fit the five sizes in a quiet moment), per node and second: CPU (utime +
//!   stime from /proc/PID/stat), UDP datagrams sent and TCP segments sent (/proc/net/snmp),
//!   loopback bytes (/proc/net/dev, `lo` received) and store requests (each node's
//!   `tenure_store_requests_total` on its management endpoint's /metrics); and the
//!   `unreachable` lines written in that window (false unreachables: nothing failed);
//! - after SIGKILL of the youngest node: the time until every other node marks it
//!   unreachable, and until every other node marks it down (history lines, host
//!   CLOCK_BOOTTIME, so the nodes' own detection and not this program's polling);
//! - with sharding on (a new cluster of n `tenure demo node --daemon S` processes, S =
//!   TENURE_BENCH_SHARDS, default 1000, each daemon worker alone in its shard): the time
//!   from the first node's start (and from the last's) until all S workers run, each in
//!   its allocated shard under its lease (`entity_started` lines).
//!
//! The network counters are the bench's own: it runs itself in a new network namespace
//! (`unshare --net`, with `lo` up; needs root), so they count these nodes' traffic and
//! nobody else's. Without one (not root, or TENURE_BENCH_NETNS=0) they are the host's and
//! say so.
//!
//! `cargo bench -p tenure-cli --bench scale` (sizes: TENURE_BENCH_NODES, default
//! `3,6,12,24,48`). In the test command's smoke run (`cargo test --benches`): 3 nodes at
//! the harness's short timings, an idle window of 3 s and 20 daemon workers.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use tenure_lease_kit::bench::{knob, smoke};
use tenure_lease_kit::report::Report;
use tenure_test_kit::cli::cluster::{Cluster, Options, TestCluster, hold_ports};

/// Set to `1` inside the network namespace the bench made for itself; `0` keeps the host's.
const NETNS_VAR: &str = "TENURE_BENCH_NETNS";

/// Clock ticks of /proc/PID/stat: USER_HZ, 100 on every Linux ABI.
const USER_HZ: f64 = 100.0;

fn now_ns() -> i64 {
    tenure::clock::boottime_now_ns()
}

/// Whether this host lets the bench make a network namespace with `lo` up.
fn netns_possible() -> bool {
    Command::new("unshare")
        .args(["--net", "--", "ip", "link", "set", "lo", "up"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn main() {
    tenure_lease_kit::bench::answer_test_runner();
    let private = match std::env::var(NETNS_VAR).as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ if netns_possible() => {
            // This same bench again, in a network namespace of its own with `lo` up.
            let exe = std::env::current_exe().expect("the bench's path");
            let status = Command::new("unshare")
                .args([
                    "--net",
                    "--",
                    "sh",
                    "-c",
                    "ip link set lo up && exec \"$0\" \"$@\"",
                ])
                .arg(exe)
                .args(std::env::args_os().skip(1))
                .env(NETNS_VAR, "1")
                .status()
                .expect("run the bench in its network namespace");
            std::process::exit(status.code().unwrap_or(1));
        }
        _ => false,
    };
    let sizes: Vec<usize> = match std::env::var("TENURE_BENCH_NODES") {
        Ok(list) => list
            .split(',')
            .map(|n| {
                n.trim()
                    .parse()
                    .expect("TENURE_BENCH_NODES: node counts, comma-separated")
            })
            .collect(),
        Err(_) if smoke() => vec![3],
        Err(_) => vec![3, 6, 12, 24, 48],
    };
    let idle = Duration::from_secs(knob("TENURE_BENCH_IDLE_SECS", 30, 3));
    let shards = knob("TENURE_BENCH_SHARDS", 1000, 20) as usize;
    println!(
        "network counters: {}",
        if private {
            "the bench's own network namespace (these nodes' traffic only)"
        } else {
            "the host's (no private network namespace: other processes' loopback traffic counts too)"
        }
    );
    let mut report = Report::new(
        "scale",
        "cargo bench -p tenure-cli --bench scale",
        &[
            "nodes",
            "all up (first / last start)",
            "CPU per node",
            "datagrams /node/s",
            "TCP segments /node/s",
            "loopback bytes /node/s",
            "store requests /node/s",
            "false unreachables",
            "kill → unreachable",
            "kill → down",
            &format!("{shards} shards serving (first / last start)"),
        ],
    );
    report.internal_var(NETNS_VAR);
    let mut rows = Vec::new();
    for &n in &sizes {
        let mut row = idle_cluster(n, idle);
        if shards > 0 {
            row.sharded = Some(sharded_cluster(n, shards));
        }
        println!("{}", row.line(n, shards));
        rows.push((n, row));
    }
    for (n, row) in &rows {
        report.row(row.cells(*n));
    }
    report.note(format!(
        "Idle figures over {} s after a settle; network counters from {}.",
        idle.as_secs(),
        if private {
            "the bench's own network namespace (these nodes' traffic only)"
        } else {
            "the host's (no private network namespace: other processes' loopback traffic counts too)"
        }
    ));
    report.finish().expect("the report");
}

/// The timings of these clusters: the reference ones, or in a smoke run the harness's
/// short ones (member lease ttl 3 s), which detect a kill in seconds.
fn options() -> Options {
    let overrides = if smoke() {
        vec![]
    } else {
        [
            ("member-lease-ttl", "\"10s\""),
            ("member-lease-interval", "\"1s\""),
            ("membership-interval", "\"1s\""),
            ("peer-heartbeat-interval", "\"500ms\""),
            ("unreachable-after", "\"3s\""),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .to_vec()
    };
    Options {
        overrides,
        ..Options::default()
    }
}

/// One size's figures.
#[derive(Default)]
struct Row {
    /// Seconds until every node saw every other up, from the first and the last start.
    up: (f64, f64),
    /// CPU per node, % of one core.
    cpu: f64,
    datagrams: f64,
    segments: f64,
    loopback: f64,
    store: f64,
    /// Store requests per node per second by operation.
    store_by_op: BTreeMap<String, f64>,
    false_unreachables: usize,
    /// Seconds from SIGKILL until the last observer marked the victim unreachable, and how
    /// many observers did (of `observers`).
    unreachable: (f64, usize),
    down: f64,
    observers: usize,
    /// Seconds until every worker ran, from the first and the last start.
    sharded: Option<(f64, f64)>,
}

impl Row {
    fn line(&self, n: usize, shards: usize) -> String {
        let ops: Vec<String> = self
            .store_by_op
            .iter()
            .map(|(op, r)| format!("{op} {r:.2}"))
            .collect();
        format!(
            "n={n}: all up {:.1} s after the first start ({:.1} s after the last); idle per node: CPU {:.2} %, {:.1} datagrams/s, {:.1} TCP segments/s, {:.0} loopback bytes/s, {:.2} store requests/s ({}); {} false unreachables; SIGKILL -> unreachable {:.1} s ({} of {} observers), -> down {:.1} s{}",
            self.up.0,
            self.up.1,
            self.cpu,
            self.datagrams,
            self.segments,
            self.loopback,
            self.store,
            ops.join(", "),
            self.false_unreachables,
            self.unreachable.0,
            self.unreachable.1,
            self.observers,
            self.down,
            match self.sharded {
                Some((first, last)) => format!(
                    "; {shards} shards serving {first:.1} s after the first start ({last:.1} s after the last)"
                ),
                None => String::new(),
            }
        )
    }

    /// The row of the report's table for `n` nodes.
    fn cells(&self, n: usize) -> Vec<String> {
        vec![
            n.to_string(),
            format!("{:.1} / {:.1} s", self.up.0, self.up.1),
            format!("{:.2} %", self.cpu),
            format!("{:.1}", self.datagrams),
            format!("{:.1}", self.segments),
            format!("{:.0}", self.loopback),
            format!("{:.2}", self.store),
            self.false_unreachables.to_string(),
            format!(
                "{:.1} s ({}/{})",
                self.unreachable.0, self.unreachable.1, self.observers
            ),
            format!("{:.1} s", self.down),
            self.sharded
                .map(|(a, b)| format!("{a:.1} / {b:.1} s"))
                .unwrap_or_else(|| "-".into()),
        ]
    }
}

/// Starts every node of `c` (the first start's and the last's instants, history clock).
fn start(c: &mut Cluster) -> (i64, i64) {
    let first = now_ns();
    c.start_all();
    (first, now_ns())
}

/// How long to wait for what grows with the cluster.
fn limit(n: usize) -> Duration {
    Duration::from_secs(60) + Duration::from_secs(3) * n as u32
}

fn secs(ns: i64) -> f64 {
    ns as f64 / 1e9
}

/// The history lines of `event` written in `[from, to)`.
fn events<'a>(h: &'a [Value], event: &'a str, from: i64) -> impl Iterator<Item = &'a Value> {
    h.iter()
        .filter(move |e| e["event"] == event && e["t"].as_i64().is_some_and(|t| t >= from))
}

/// When the last node saw the last other node up (history clock), once every one has.
fn all_up(c: &Cluster) -> Option<i64> {
    let h = c.history();
    let mut seen: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for e in events(&h, "member_up", 0) {
        if let (Some(node), Some(member), Some(t)) =
            (e["node"].as_str(), e["member"].as_str(), e["t"].as_i64())
        {
            seen.entry((node, member)).or_insert(t);
        }
    }
    let mut last = 0;
    for a in &c.nodes {
        for b in c.nodes.iter().filter(|b| b.addr != a.addr) {
            last = last.max(*seen.get(&(a.addr.as_str(), b.addr.as_str()))?);
        }
    }
    Some(last)
}

fn idle_cluster(n: usize, idle: Duration) -> Row {
    let mut c = Cluster::with_options(n, &options());
    // Each node serves /metrics on a port of its own, set through its environment.
    let metrics: Vec<String> = hold_ports(n).iter().map(|p| p.addr()).collect();
    for (node, addr) in c.nodes.iter_mut().zip(&metrics) {
        node.env.extend([
            ("TENURE_CLUSTER__MANAGEMENT__ENABLED".into(), "true".into()),
            ("TENURE_CLUSTER__MANAGEMENT__BIND".into(), addr.clone()),
        ]);
    }
    let (first, last) = start(&mut c);
    let mut up = None;
    c.wait_until("every node sees every other up", limit(n), |c| {
        up = all_up(c);
        up.is_some()
    });
    let up = up.unwrap_or_default();
    let mut row = Row {
        up: (secs(up - first), secs(up - last).max(0.0)),
        observers: n - 1,
        ..Row::default()
    };
    // Let the joins' aftermath (sessions dialled, digests exchanged) settle first.
    std::thread::sleep(if smoke() {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(5)
    });
    let pids: Vec<i32> = c
        .nodes
        .iter()
        .map(|node| node.pid().expect("node running").as_raw_nonzero().get())
        .collect();
    let store_before = store_requests(&metrics);
    let (net_before, cpu_before, t0) = (net(), cpu_ticks(&pids), Instant::now());
    let from = now_ns();
    std::thread::sleep(idle);
    let (net_after, cpu_after, took) = (net(), cpu_ticks(&pids), t0.elapsed().as_secs_f64());
    let to = now_ns();
    let store_after = store_requests(&metrics);
    let per = |d: f64| d / n as f64 / took;
    row.cpu = per((cpu_after - cpu_before) / USER_HZ) * 100.0;
    row.datagrams = per((net_after.datagrams - net_before.datagrams) as f64);
    row.segments = per((net_after.segments - net_before.segments) as f64);
    row.loopback = per((net_after.loopback - net_before.loopback) as f64);
    for (op, after) in &store_after {
        let d = after - store_before.get(op).copied().unwrap_or(0.0);
        row.store += per(d);
        row.store_by_op.insert(op.clone(), per(d));
    }
    row.false_unreachables = events(&c.history(), "unreachable", from)
        .filter(|e| e["t"].as_i64().is_some_and(|t| t < to))
        .count();
    // SIGKILL of the youngest node.
    let victim = n - 1;
    let addr = c.nodes[victim].addr.clone();
    let observers: Vec<String> = c.nodes[..victim].iter().map(|o| o.addr.clone()).collect();
    let killed = now_ns();
    c.kill(victim);
    let about = |h: &[Value], event: &str| -> BTreeMap<String, i64> {
        let mut first = BTreeMap::new();
        for e in events(h, event, killed).filter(|e| e["member"] == addr.as_str()) {
            if let (Some(node), Some(t)) = (e["node"].as_str(), e["t"].as_i64()) {
                first.entry(node.to_string()).or_insert(t);
            }
        }
        first.retain(|node, _| observers.contains(node));
        first
    };
    c.wait_until(
        "every other node marks the killed one down",
        limit(n),
        |c| about(&c.history(), "member_down").len() == observers.len(),
    );
    let h = c.history();
    let down = about(&h, "member_down");
    let unreachable = about(&h, "unreachable");
    row.down = secs(down.values().max().copied().unwrap_or(killed) - killed);
    row.unreachable = (
        secs(unreachable.values().max().copied().unwrap_or(killed) - killed),
        unreachable.len(),
    );
    c.stop_all(Duration::from_secs(30));
    row
}

/// Seconds until `workers` daemon workers run, from the first start and from the last.
fn sharded_cluster(n: usize, workers: usize) -> (f64, f64) {
    let mut options = options();
    options.node_args = vec!["--daemon".into(), workers.to_string()];
    options.tail = "[sharding]\nretry-interval = \"300ms\"\n".into();
    let mut c = Cluster::with_options(n, &options);
    let (first, last) = start(&mut c);
    let mut running_at = 0;
    c.wait_until(
        &format!("all {workers} daemon workers run"),
        limit(n) + Duration::from_millis(100) * workers as u32,
        |c| {
            let h = c.history();
            let mut started: BTreeSet<&str> = BTreeSet::new();
            for e in events(&h, "entity_started", 0).filter(|e| e["type"] == "daemon-demo") {
                if let Some(entity) = e["entity"].as_str()
                    && started.insert(entity)
                {
                    running_at = e["t"].as_i64().unwrap_or_default();
                }
            }
            started.len() == workers
        },
    );
    c.stop_all(Duration::from_secs(30));
    (secs(running_at - first), secs(running_at - last).max(0.0))
}

/// Network counters, summed over the namespace.
#[derive(Debug, Clone, Copy)]
struct Net {
    /// UDP datagrams sent.
    datagrams: u64,
    /// TCP segments sent.
    segments: u64,
    /// Bytes received on `lo` (on loopback what is sent is received).
    loopback: u64,
}

fn net() -> Net {
    let snmp = std::fs::read_to_string("/proc/self/net/snmp").expect("read /proc/self/net/snmp");
    let field = |proto: &str, name: &str| -> u64 {
        let mut lines = snmp.lines().filter(|l| l.starts_with(&format!("{proto}:")));
        let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
            panic!("no {proto} lines in /proc/self/net/snmp");
        };
        names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_else(|| panic!("no {proto} {name} in /proc/self/net/snmp"))
    };
    let dev = std::fs::read_to_string("/proc/self/net/dev").expect("read /proc/self/net/dev");
    let loopback = dev
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("lo:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|bytes| bytes.parse().ok())
        .expect("lo in /proc/self/net/dev");
    Net {
        datagrams: field("Udp", "OutDatagrams"),
        segments: field("Tcp", "OutSegs"),
        loopback,
    }
}

/// utime + stime of the processes, in clock ticks.
fn cpu_ticks(pids: &[i32]) -> f64 {
    pids.iter()
        .map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .unwrap_or_else(|e| panic!("read /proc/{pid}/stat: {e}"));
            // After the command name, which may hold spaces: state is field 3, utime 14.
            let rest = &stat[stat.rfind(')').expect("a stat line") + 2..];
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let tick = |i: usize| fields[i].parse::<f64>().expect("a tick count");
            tick(11) + tick(12)
        })
        .sum()
}

/// `tenure_store_requests_total` by operation, summed over the nodes' /metrics.
fn store_requests(endpoints: &[String]) -> BTreeMap<String, f64> {
    let mut total = BTreeMap::new();
    for addr in endpoints {
        let mut conn = std::net::TcpStream::connect(addr)
            .unwrap_or_else(|e| panic!("connect to the metrics of {addr}: {e}"));
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("a read timeout");
        write!(
            conn,
            "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .expect("ask for /metrics");
        let mut text = String::new();
        conn.read_to_string(&mut text)
            .unwrap_or_else(|e| panic!("read the metrics of {addr}: {e}"));
        for line in text
            .lines()
            .filter(|l| l.starts_with("tenure_store_requests_total"))
        {
            let op = line
                .split("operation=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("?")
                .to_string();
            let value: f64 = line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("a value in {line:?} from {addr}"));
            *total.entry(op).or_insert(0.0) += value;
        }
    }
    total
}
