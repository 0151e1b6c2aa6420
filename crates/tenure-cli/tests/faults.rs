//! The fault-injection suite: a 3-node cluster (sharded counter under load, a singleton)
//! on each store kind, through a sequence of faults in an order and with timings drawn
//! from a seed: SIGKILL (then restart), SIGSTOP past the ttl and shorter than it, traffic
//! cut between two nodes, traffic cut between a node and the store, a store restart, a
//! wall-clock jump on one node (libfaketime; the monotonic clocks are left alone),
//! slow-stopping entities (every node's entities and singleton take a minute to stop while
//! a node loses its leases: its store connection cut, or on SQLite the lease file
//! write-locked for everyone; only kills within the stop budget end them in time), on
//! SQLite the lease file lost while in use (deleted, or replaced by a copy taken at the
//! start: its grants gone, its token counters behind), a second process acquiring as a
//! node's owner (its member lease, while the node runs or is frozen past the ttl: a
//! replaced pod), the store's answers to a node delayed past the operation timeout,
//! (etcd) a node's sessions expiring while it is cut off, and an entity blocking its
//! thread (`std::thread::sleep` in its handler, outside any await, so no kill reaches it)
//! for longer than the ttl while its node loses its leases (the node must end itself
//! before the shard lease's deadline) or leaves (its shard's hand-off keeps the lease until
//! the entity ends). On SQLite and PostgreSQL the counter is a durable entity (`tenure demo
//! node --durable-counter`; on SQLite its journal in a file of its own beside the lease
//! file, on PostgreSQL in the lease database), with one more fault: a paused holder, frozen
//! with an append on its way past the ttl, that resumes and appends under its lapsed grant
//! (the journal must refuse it). `TENURE_FAULT_DURABLE=sqlite` keeps it on SQLite only,
//! `=0` on neither (the plain fenced counter file). Every run's history must pass `tenure check`
//! (with `--journal` for a durable counter: every acknowledged increment's event in the
//! journal exactly once, no stale append, contiguous sequences, recoveries matching the
//! events), every acknowledged increment must be in the counter, and the cluster must serve
//! again after the faults. A node may end itself during a fault that loses leases (abort(3)
//! after recording `process_abort`, when an entity could not be ended before a lease's local
//! deadline, as designed): it is logged and started again, and the run goes on; any other
//! end of a node fails the run at once with its log's tail.
//!
//! Each store runs the fixed seeds ([`FIXED_SEEDS`]), and one more test runs one random seed
//! on a store the seed picks, each run on a fresh store and cluster; every run injects every
//! fault kind of its store. Each seed is printed (`fault seed …`, with its store); replay one
//! with `TENURE_FAULT_SEED=<seed>` (then each test runs only that seed, on its store).
//! `TENURE_FAULT_ROUNDS=<n>` (default 1) repeats the fault sequence n times: a soak.
//! `TENURE_FAULT_KINDS=<kind>,…` injects only those kinds (e.g. `BlockedThreadLoss`).
//! SQLite is one file on one host: it has no connection to cut and no server to restart,
//! so those two faults run on the network stores only, and file loss on SQLite only; its
//! late answers are a write lock held on the file (every process's operations wait, and
//! those that wait past their caller's timeout complete unanswered).

use rustix::process::Signal;
use tenure_test_kit::cli;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cli::cluster::{Cluster, MEMBER_TTL, Options, TestCluster};
use tenure::history::Event;
use tenure_cli::demo::FencedCounter;
use tenure_cli::demo::scenario::SplitMix;
use tenure_lease_kit::conformance::proxy::Proxy;

/// Serializes the runs: one cluster at a time on a 2-core machine.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
const KEYS: usize = 120;
/// The sharding tests' settings with fewer shards (faster to move after each fault).
fn sharding() -> String {
    let settings = cli::shards::SHARDING.replace("number-of-shards = 100", "number-of-shards = 30");
    assert!(settings.contains("number-of-shards = 30"), "{settings}");
    settings
}

/// Timing of every store section: the harness's (ttl 3 s).
const TIMING: &str = r#"heartbeat-timeout = "3s"
heartbeat-interval = "500ms"
lease-retry-interval = "300ms"
lease-operation-timeout = "1500ms"
"#;
/// The sections' `lease-operation-timeout`.
const OPERATION_TIMEOUT: Duration = Duration::from_millis(1500);
/// The key prefix of the etcd section.
const ETCD_PREFIX: &str = "/faults/";

/// The fault plan's randomness, reproducible from the seed (the demo's generator).
struct Rng(SplitMix);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0.below(n as u64) as usize
    }

    fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = (hi - lo).as_millis() as u64;
        lo + Duration::from_millis(self.0.below(span + 1))
    }
}

/// Seeds every test command runs, on every store. Each run injects every fault kind of its
/// store (in a seeded order, with seeded timings and targets), so each seed covers them all;
/// the first is the issue's etcd seed that once wedged a node. A seed that fails is a bug.
const FIXED_SEEDS: [u64; 1] = [1795460317234921142];

/// The seed of a replay, `TENURE_FAULT_SEED`, if set.
fn replay_seed() -> Option<u64> {
    std::env::var("TENURE_FAULT_SEED").ok().map(|s| {
        s.parse()
            .unwrap_or_else(|_| panic!("TENURE_FAULT_SEED={s:?} is not an unsigned integer"))
    })
}

/// The fixed seeds, or the replay's seed alone.
fn fixed_seeds() -> Vec<u64> {
    replay_seed().map_or_else(|| FIXED_SEEDS.to_vec(), |seed| vec![seed])
}

/// The random seed of this test run (the replay's seed when set), printed for replay.
fn random_seed() -> u64 {
    replay_seed().unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    })
}

/// The store kinds, in the order a random seed picks from.
const STORES: [&str; 4] = ["sqlite", "etcd", "postgres", "zookeeper"];

/// A fresh store of `kind` (one of [`STORES`]).
fn fresh_store(kind: &str) -> Store {
    match kind {
        "sqlite" => Store::Sqlite,
        "etcd" => {
            let rt = tokio::runtime::Runtime::new().expect("runtime");
            let etcd = rt.block_on(tenure_test_kit::etcd::Etcd::single());
            Store::Etcd(etcd, rt)
        }
        "postgres" => Store::Postgres(tenure_test_kit::postgres::PgServer::start()),
        "zookeeper" => {
            let server = tenure_test_kit::zookeeper::TestServer::start(Duration::from_millis(250))
                .expect("start ZooKeeper (Debian package `zookeeper`)");
            Store::ZooKeeper(server)
        }
        other => panic!("no store kind {other:?} (one of {STORES:?})"),
    }
}

/// Where the counter is a durable entity (see the module's documentation): `(sqlite,
/// postgres)`. Unset (or `TENURE_FAULT_DURABLE=1`): both; `=sqlite`: SQLite only; `=0`:
/// neither.
fn durable_counter() -> (bool, bool) {
    match std::env::var("TENURE_FAULT_DURABLE") {
        Ok(v) => match v.as_str() {
            "1" | "" => (true, true),
            "sqlite" => (true, false),
            "0" => (false, false),
            _ => panic!("TENURE_FAULT_DURABLE={v:?} is none of 1, sqlite and 0"),
        },
        Err(_) => (true, true),
    }
}

fn rounds() -> usize {
    std::env::var("TENURE_FAULT_ROUNDS")
        .ok()
        .map(|s| {
            s.parse()
                .unwrap_or_else(|_| panic!("TENURE_FAULT_ROUNDS={s:?} is not a count"))
        })
        .unwrap_or(1)
}

/// `TENURE_FAULT_KINDS` (comma-separated fault kinds, e.g. `BlockedThreadLoss,CutLink`):
/// a replay that injects only those.
fn only_kinds() -> Option<Vec<String>> {
    let kinds = std::env::var("TENURE_FAULT_KINDS").ok()?;
    let kinds: Vec<String> = kinds.split(',').map(|k| k.trim().to_string()).collect();
    for k in &kinds {
        assert!(
            Fault::ALL.iter().any(|f| format!("{f:?}") == *k),
            "TENURE_FAULT_KINDS: {k:?} is not a fault kind (one of {:?})",
            Fault::ALL
        );
    }
    Some(kinds)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Kill,
    PauseLong,
    PauseShort,
    CutLink,
    CutStore,
    RestartStore,
    ClockJump,
    SlowStop,
    FileLoss,
    SameOwner,
    SlowStore,
    SessionExpiry,
    /// An entity blocks its thread past the ttl while its node loses its leases.
    BlockedThreadLoss,
    /// An entity blocks its thread past the ttl while its node leaves.
    BlockedThreadLeave,
    /// A durable entity's node is frozen past the ttl with an append on its way; resumed,
    /// it appends under its lapsed grant.
    PausedAppend,
}

impl Fault {
    /// Whether a node may lose shard leases during this fault (cut off from the store, frozen
    /// past the ttl, the store slow, locked, restarted or lost, its member lease taken):
    /// the faults where a node ends itself by design when an entity cannot be ended before
    /// the lease's local deadline (`when-kill-fails = "abort"`). On a loaded machine any
    /// entity can be such a one: a shard not run in time to kill it.
    fn loses_leases(self) -> bool {
        match self {
            Fault::PauseLong
            | Fault::CutStore
            | Fault::RestartStore
            | Fault::SlowStop
            | Fault::FileLoss
            | Fault::SameOwner
            | Fault::SlowStore
            | Fault::SessionExpiry
            | Fault::BlockedThreadLoss
            | Fault::PausedAppend => true,
            Fault::Kill
            | Fault::PauseShort
            | Fault::CutLink
            | Fault::ClockJump
            | Fault::BlockedThreadLeave => false,
        }
    }

    const ALL: [Fault; 15] = [
        Fault::Kill,
        Fault::PauseLong,
        Fault::PauseShort,
        Fault::CutLink,
        Fault::CutStore,
        Fault::RestartStore,
        Fault::ClockJump,
        Fault::SlowStop,
        Fault::FileLoss,
        Fault::SameOwner,
        Fault::SlowStore,
        Fault::SessionExpiry,
        Fault::BlockedThreadLoss,
        Fault::BlockedThreadLeave,
        Fault::PausedAppend,
    ];
}

/// The store a run uses, and the server behind it when there is one.
enum Store {
    Sqlite,
    Etcd(tenure_test_kit::etcd::Etcd, tokio::runtime::Runtime),
    Postgres(tenure_test_kit::postgres::PgServer),
    ZooKeeper(tenure_test_kit::zookeeper::TestServer),
}

impl Store {
    fn kind(&self) -> &'static str {
        match self {
            Store::Sqlite => "sqlite",
            Store::Etcd(..) => "etcd",
            Store::Postgres(_) => "postgres",
            Store::ZooKeeper(_) => "zookeeper",
        }
    }

    /// The port clients connect to (behind each node's proxy).
    fn port(&self) -> Option<u16> {
        let url = match self {
            Store::Sqlite => return None,
            Store::Etcd(e, _) => e.endpoint(0),
            Store::Postgres(p) => p.url().replace("/postgres", ""),
            Store::ZooKeeper(z) => z.connect_string(),
        };
        let port = url.rsplit(':').next().expect("host:port");
        Some(port.parse().unwrap_or_else(|_| panic!("port of {url}")))
    }

    /// The `[lease.faults]` section of a node reaching the store on `port`.
    fn section(&self, port: u16) -> String {
        let options = match self {
            Store::Sqlite => unreachable!("SQLite uses the harness's section"),
            Store::Etcd(..) => format!(
                "store = \"etcd\"\nendpoints = [\"http://127.0.0.1:{port}\"]\nprefix = \"{ETCD_PREFIX}\"\n"
            ),
            Store::Postgres(_) => format!(
                "store = \"postgres\"\nurl = \"postgres://postgres@127.0.0.1:{port}/postgres\"\n\
                 schema = \"faults\"\npool-size = 4\nconnect-timeout = \"1s\"\n"
            ),
            Store::ZooKeeper(_) => {
                format!(
                    "store = \"zookeeper\"\nconnect = \"127.0.0.1:{port}\"\nroot = \"/faults\"\n"
                )
            }
        };
        format!("\n[lease.faults]\n{options}{TIMING}")
    }

    /// Whether the store keeps durable entities' journals (SQLite and PostgreSQL do; etcd
    /// and ZooKeeper are lease stores only).
    fn journals(&self) -> bool {
        let (sqlite, postgres) = durable_counter();
        match self {
            Store::Sqlite => sqlite,
            Store::Postgres(_) => postgres,
            _ => false,
        }
    }

    fn restart(&self) {
        match self {
            Store::Sqlite => unreachable!("no SQLite server"),
            Store::Etcd(e, rt) => {
                e.kill(0);
                rt.block_on(e.start(0));
            }
            Store::Postgres(p) => p.restart(),
            Store::ZooKeeper(z) => z.restart().expect("restart ZooKeeper"),
        }
    }
}

struct Run {
    c: Cluster,
    store: Store,
    proxies: Vec<Proxy>,
    /// Node whose wall clock libfaketime moves, and the file holding its offset.
    clock_node: usize,
    clock_file: PathBuf,
    /// While this file exists, every node's example entities and singleton stop slowly.
    slow_stop: PathBuf,
    /// While this file names an entity, that entity blocks its thread once.
    block_thread: PathBuf,
    /// SQLite: a copy of the lease file taken once the cluster served, for `FileLoss`.
    lease_copy: Option<PathBuf>,
    /// The durable counter's journal as `tenure check --journal` takes it, and its schema;
    /// `None`: the counter is the fenced counter file.
    journal: Option<(String, String)>,
    /// The fault being injected (or waited out) and the one before it: a node that ends
    /// itself is judged against them ([`Fault::loses_leases`]).
    recent: [Option<Fault>; 2],
}

impl Run {
    /// Every event of the durable counter's journal.
    fn journal(&self) -> Vec<tenure_cli::check::JournalEvent> {
        let (spec, schema) = self.journal.as_ref().expect("a durable counter");
        tenure_cli::check::read_journal(spec, schema).expect("read the journal")
    }
}

fn start(store: Store) -> Run {
    let mut options = Options {
        node_args: [
            if store.journals() {
                "--durable-counter"
            } else {
                "--sharded-counter"
            },
            "--load-keys",
            &KEYS.to_string(),
            "--load-interval",
            "30ms",
            "--singleton",
            "s1",
            "--tick",
            "100ms",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        tail: sharding(),
        ..Options::default()
    };
    let upstream = store.port();
    if let Some(port) = upstream {
        // Placeholder port, replaced per node by the node's proxy below.
        options.tail.push_str(&store.section(port));
        options
            .overrides
            .push(("default-lease-section".into(), "\"faults\"".into()));
    }
    let mut c = Cluster::with_options(3, &options);
    // SQLite: the journal in a file of its own, fenced by the lease file, so that losing
    // the lease file (`FileLoss`) loses no event.
    let journal_file = c.dir.path().join("journal.sqlite");
    if matches!(store, Store::Sqlite) && store.journals() {
        for node in &mut c.nodes {
            node.args.extend([
                "--journal-file".to_string(),
                journal_file.display().to_string(),
            ]);
        }
    }
    let mut proxies = Vec::new();
    if let Some(port) = upstream {
        for i in 0..3 {
            let proxy = Proxy::start(port);
            let path = c.nodes[i].config.clone();
            let text = std::fs::read_to_string(&path).expect("node config");
            let text = text.replace(
                &format!("127.0.0.1:{port}"),
                &format!("127.0.0.1:{}", proxy.port),
            );
            std::fs::write(&path, text).expect("write node config");
            proxies.push(proxy);
        }
    }
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} not found: install the Debian package `faketime` (apt-get install -y faketime), as .ci/test.sh does"
    );
    let slow_stop = c.dir.path().join("slow-stop");
    let block_thread = c.dir.path().join("block-thread");
    for node in &mut c.nodes {
        node.args.extend([
            "--slow-stop-when".to_string(),
            slow_stop.display().to_string(),
            "--block-thread-when".to_string(),
            block_thread.display().to_string(),
        ]);
    }
    // A node that ends itself with abort(3) leaves no core file behind (its children
    // inherit the limit).
    let core = rustix::process::Resource::Core;
    let limit = rustix::process::getrlimit(core);
    rustix::process::setrlimit(
        core,
        rustix::process::Rlimit {
            current: Some(0),
            maximum: limit.maximum,
        },
    )
    .expect("no core files");
    let clock_node = 2;
    let clock_file = c.dir.path().join("faketime");
    std::fs::write(&clock_file, "+0\n").expect("faketime file");
    c.nodes[clock_node].env = vec![
        ("LD_PRELOAD".into(), LIBFAKETIME.into()),
        (
            "FAKETIME_TIMESTAMP_FILE".into(),
            clock_file.display().to_string(),
        ),
        ("FAKETIME_NO_CACHE".into(), "1".into()),
        ("DONT_FAKE_MONOTONIC".into(), "1".into()),
    ];
    c.start_all();
    c.wait_converged(Duration::from_secs(40));
    let journal = match &store {
        _ if !store.journals() => None,
        Store::Sqlite => Some((journal_file.display().to_string(), "tenure".to_string())),
        Store::Postgres(p) => Some((p.url(), "faults".to_string())),
        _ => None,
    };
    let mut run = Run {
        journal,
        recent: [None; 2],
        c,
        store,
        proxies,
        clock_node,
        clock_file,
        slow_stop,
        block_thread,
        lease_copy: None,
    };
    wait_serving(&mut run, 0, Duration::from_secs(60));
    if matches!(run.store, Store::Sqlite) {
        let copy = run.c.dir.path().join("leases-copy.sqlite");
        rusqlite::Connection::open(run.c.lease_store())
            .and_then(|conn| conn.execute("VACUUM INTO ?1", [copy.display().to_string()]))
            .expect("copy the lease file");
        run.lease_copy = Some(copy);
    }
    run
}

fn now_ns() -> i64 {
    tenure::clock::boottime_now_ns()
}

/// Waits until every running node got an acknowledged increment after `after` and the
/// singleton ticked after it: the service is back.
fn wait_serving(run: &mut Run, after: i64, limit: Duration) {
    wait_for(
        run,
        "every node's increments acknowledged and the singleton ticking",
        limit,
        |c| {
            let h = c.history();
            let fresh = |e: &serde_json::Value| e["t"].as_i64().unwrap_or(0) > after;
            h.iter()
                .any(|e| e["event"] == "tick" && e["accepted"] == true && fresh(e))
                && (0..c.nodes.len()).filter(|i| c.is_running(*i)).all(|i| {
                    h.iter().any(|e| {
                        e["event"] == "ack" && e["node"] == c.nodes[i].addr.as_str() && fresh(e)
                    })
                })
        },
    );
}

/// Waits (polling) until `check` holds, starting again every node that ended itself as
/// designed meanwhile ([`restart_ended`]); panics on timeout with every node's view, process
/// state and log tail.
fn wait_for(run: &mut Run, what: &str, limit: Duration, mut check: impl FnMut(&Cluster) -> bool) {
    let started = Instant::now();
    loop {
        restart_ended(run);
        if check(&run.c) {
            return;
        }
        if started.elapsed() > limit {
            for (i, node) in run.c.nodes.iter().enumerate() {
                let state = node
                    .pid()
                    .map(|pid| process_state(pid.as_raw_nonzero().get()));
                eprintln!(
                    "node {i} ({}) view: {:?}\nprocess: {}\nlog ends:\n{}",
                    node.addr,
                    run.c.members(i),
                    state.unwrap_or_else(|| "not started".into()),
                    run.c.log_tail(i, 40)
                );
            }
            panic!("timed out after {limit:?} waiting for: {what}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every node whose process ended by itself: one that ended itself as designed (abort(3)
/// after recording `process_abort`) during a fault that loses leases, or right after one
/// ([`Run::recent`]), is logged and started again ([`restart_self_ended`]); any other end
/// (a panic, an exit status, an abort during a fault that cannot cause one) fails the run
/// with the node's log tail.
fn restart_ended(run: &mut Run) {
    for i in 0..run.c.nodes.len() {
        let Some(end) = run.c.ended(i) else {
            continue;
        };
        let addr = run.c.nodes[i].addr.clone();
        let cause = run.recent.iter().flatten().find(|f| f.loses_leases());
        match cause {
            Some(cause) if end.aborted() => {
                let why = format!("during or right after {cause:?}");
                restart_self_ended(run, i, Duration::ZERO, &why);
            }
            _ => panic!(
                "node {i} ({addr}) ended by itself ({end}) during {:?} (the fault before: {:?}), an end no fault of these causes by design; its log ends:\n{}",
                run.recent[0],
                run.recent[1],
                run.c.log_tail(i, 40)
            ),
        }
    }
}

/// Node `target` ended itself, or is ending itself (waited for up to `limit`), as designed
/// when something outlived its kill under a lease being lost: by abort(3), after recording
/// `process_abort` under its current incarnation. Then it is started again (recorded as
/// `restarted`). Any other end, or none within `limit`, panics with the node's log tail.
fn restart_self_ended(run: &mut Run, target: usize, limit: Duration, why: &str) {
    let addr = run.c.nodes[target].addr.clone();
    let inc = run.c.nodes[target]
        .incarnation()
        .expect("started")
        .to_string();
    // The log of the process that ended, before a restart replaces it.
    let tail = run.c.log_tail(target, 40);
    let status = run.c.wait_exit(target, limit);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.and_then(|s| s.signal()),
        Some(Signal::ABORT.as_raw()),
        "node {target} ({addr}) did not end itself by abort(3) {why}: {status:?}; its log ends:\n{tail}"
    );
    assert!(
        run.c.history().iter().any(|e| e["event"] == "process_abort"
            && e["node"] == addr.as_str()
            && e["inc"] == inc.as_str()),
        "node {target} ({addr}) ended by abort(3) {why} without recording process_abort first; its log ends:\n{tail}"
    );
    let what: Vec<&str> = tail
        .lines()
        .filter(|l| l.contains("outlived its kill while its lease is being lost"))
        .collect();
    eprintln!(
        "node {target} ({addr}) ended itself {why}; restarting it\n{}",
        what.join("\n")
    );
    run.c.spawn(target);
    run.c.record(target, Event::Restarted {});
}

fn inject(run: &mut Run, fault: Fault, rng: &mut Rng) {
    let ttl = MEMBER_TTL;
    let n = run.c.nodes.len();
    let target = match fault {
        Fault::ClockJump => run.clock_node,
        Fault::BlockedThreadLoss => return blocked_thread(run, rng, true),
        Fault::PausedAppend => return paused_append(run, rng),
        Fault::BlockedThreadLeave => return blocked_thread(run, rng, false),
        _ => rng.below(n),
    };
    let addr = run.c.nodes[target].addr.clone();
    eprintln!("fault {fault:?} on node {target} ({addr})");
    match fault {
        Fault::Kill => {
            run.c.kill(target);
            std::thread::sleep(rng.between(Duration::from_millis(500), ttl));
            run.c.spawn(target);
            run.c.record(target, Event::Restarted {});
        }
        Fault::PauseLong => {
            run.c.pause(target);
            std::thread::sleep(rng.between(ttl + Duration::from_millis(500), ttl * 2));
            run.c.resume(target);
        }
        Fault::PauseShort => {
            run.c.pause(target);
            std::thread::sleep(rng.between(Duration::from_millis(200), ttl / 3));
            run.c.resume(target);
        }
        Fault::CutLink => {
            let other = (target + 1 + rng.below(n - 1)) % n;
            run.c.set_link(target, other, true);
            std::thread::sleep(rng.between(Duration::from_secs(1), ttl + Duration::from_secs(1)));
            run.c.set_link(target, other, false);
        }
        Fault::CutStore => {
            run.proxies[target].set_cut(true);
            run.c.record(target, Event::StoreCut {});
            std::thread::sleep(rng.between(ttl / 2, ttl + Duration::from_secs(1)));
            run.proxies[target].set_cut(false);
            run.c.record(target, Event::StoreHealed {});
        }
        Fault::RestartStore => {
            run.store.restart();
            run.c.record_about("store", Event::StoreRestarted {});
        }
        Fault::SlowStop => {
            std::fs::write(&run.slow_stop, "").expect("slow-stop switch");
            run.c.record_about(&addr, Event::SlowStop {});
            lose_leases(run, target, rng);
            std::fs::remove_file(&run.slow_stop).expect("slow-stop switch off");
        }
        Fault::FileLoss => {
            let file = run.c.lease_store().to_path_buf();
            let sibling = |suffix: &str| {
                let mut name = file.as_os_str().to_os_string();
                name.push(suffix);
                PathBuf::from(name)
            };
            // The log and shared memory first: a process reopening the path must never
            // find the lost file's log.
            for suffix in ["-wal", "-shm"] {
                let _ = std::fs::remove_file(sibling(suffix));
            }
            let restored = rng.below(2) == 0;
            if restored {
                let copy = run.lease_copy.as_ref().expect("SQLite keeps a copy");
                let staged = sibling(".restoring");
                std::fs::copy(copy, &staged).expect("stage the old copy");
                std::fs::rename(&staged, &file).expect("replace the lease file");
            } else {
                std::fs::remove_file(&file).expect("delete the lease file");
            }
            eprintln!(
                "lease file {}",
                if restored {
                    "replaced by the old copy"
                } else {
                    "deleted"
                }
            );
            run.c.record_about(
                "store",
                Event::StoreLost {
                    restored: Some(restored),
                },
            );
            // Once a running node noticed (it records the loss in the file at the path), or
            // after a while, a node restarts: a new process opens the file at the path.
            let noticed = wait_loss_noticed(&file, Duration::from_secs(3));
            eprintln!("loss noticed by a running node: {noticed}");
            run.c.kill(target);
            run.c.spawn(target);
            run.c.record(target, Event::Restarted {});
        }
        Fault::ClockJump => {
            let offset = if rng.below(2) == 0 { "+2h" } else { "-2h" };
            std::fs::write(&run.clock_file, format!("{offset}\n")).expect("faketime file");
            run.c.record_about(
                &addr,
                Event::ClockJump {
                    offset: offset.into(),
                },
            );
            std::thread::sleep(Duration::from_secs(2));
        }
        Fault::SameOwner => second_owner(run, target, rng),
        Fault::BlockedThreadLoss | Fault::BlockedThreadLeave | Fault::PausedAppend => {
            unreachable!("chooses its node by the entity it blocks")
        }
        Fault::SlowStore => {
            let span = rng.between(OPERATION_TIMEOUT - Duration::from_millis(500), ttl);
            match run.proxies.get(target) {
                Some(proxy) => {
                    proxy.set_delay(Some(OPERATION_TIMEOUT + Duration::from_millis(500)));
                    run.c.record(target, Event::StoreSlow {});
                    std::thread::sleep(span);
                    proxy.set_delay(None);
                    run.c.record(target, Event::StoreOnTime {});
                }
                None => {
                    // SQLite: every process's operations wait for the lock; those that wait
                    // past the busy timeout fail, those behind them on a process's
                    // connection complete after their caller gave up.
                    let lock = rusqlite::Connection::open(run.c.dir.path().join("leases.sqlite"))
                        .expect("open the lease file");
                    lock.busy_timeout(Duration::from_secs(10))
                        .and_then(|_| lock.execute_batch("BEGIN EXCLUSIVE"))
                        .expect("take the write lock");
                    run.c.record_about("store", Event::StoreSlow {});
                    std::thread::sleep(span);
                    drop(lock);
                    run.c.record_about("store", Event::StoreOnTime {});
                }
            }
        }
        Fault::SessionExpiry => {
            // An expiry, not an operator's revocation: the server ends a session only when
            // its keep-alives stopped for its TTL, when the holder's deadlines have passed.
            // So the node is cut off from the store first, for a ttl, and its sessions are
            // then ended on the server (as the TTL would, a little later); its calls that
            // were in flight (keep-alives among them) time out meanwhile.
            let Store::Etcd(etcd, rt) = &run.store else {
                unreachable!("session expiry runs on etcd only")
            };
            run.proxies[target].set_cut(true);
            run.c.record(target, Event::StoreCut {});
            std::thread::sleep(ttl + Duration::from_millis(100));
            let revoked = rt.block_on(etcd.revoke_sessions_of(ETCD_PREFIX, &addr));
            run.c.record_about(
                &addr,
                Event::SessionExpired {
                    sessions: Some(revoked as u64),
                },
            );
            std::thread::sleep(rng.between(Duration::ZERO, Duration::from_secs(1)));
            run.proxies[target].set_cut(false);
            run.c.record(target, Event::StoreHealed {});
        }
    }
}

/// Node `target` loses every lease it holds, for long enough that they all lapse: its
/// store connection cut or, on SQLite (no connection to cut), the lease file write-locked
/// (a backup, a stuck writer), which fails every node's renewals.
fn lose_leases(run: &mut Run, target: usize, rng: &mut Rng) {
    let ttl = MEMBER_TTL;
    let outage = rng.between(ttl + Duration::from_millis(500), ttl * 2);
    match &run.store {
        Store::Sqlite => {
            let lock =
                rusqlite::Connection::open(run.c.lease_store()).expect("open the lease file");
            lock.busy_timeout(Duration::from_secs(10))
                .expect("busy timeout");
            lock.execute_batch("BEGIN EXCLUSIVE")
                .expect("write-lock the lease file");
            run.c.record_about("store", Event::StoreLocked {});
            std::thread::sleep(outage);
            lock.execute_batch("COMMIT").expect("unlock the lease file");
            run.c.record_about("store", Event::StoreUnlocked {});
        }
        _ => {
            run.proxies[target].set_cut(true);
            run.c.record(target, Event::StoreCut {});
            std::thread::sleep(outage);
            run.proxies[target].set_cut(false);
            run.c.record(target, Event::StoreHealed {});
        }
    }
}

/// An example entity blocks its thread for longer than the ttl, on whichever node hosts it
/// (found from the marker the entity writes), and meanwhile:
/// - `leases_lost`: its node loses its leases (its store connection cut, or on SQLite the
///   lease file write-locked for every node): the node must end itself by SIGABRT,
///   recording `process_abort`, before the shard lease's deadline; it is then started
///   again;
/// - otherwise its node leaves gracefully (SIGTERM): the shard's hand-off keeps the lease, renewed,
///   until the entity ends, and the node exits once its leave is done, or by SIGABRT when
///   its leave-timeout came first with the entity still running.
///
/// Either way `tenure check` judges the entity's life and every write against the holds.
fn blocked_thread(run: &mut Run, rng: &mut Rng, leases_lost: bool) {
    let ttl = MEMBER_TTL;
    let key = format!("key-{}", rng.below(KEYS));
    // Blocked well past the loss when the leases go; a little longer than the ttl when the
    // node leaves, so that its leave may see the entity end.
    let pause = if leases_lost {
        ttl * 2
    } else {
        rng.between(
            ttl + Duration::from_millis(300),
            ttl + Duration::from_secs(1),
        )
    };
    std::fs::write(
        &run.block_thread,
        format!("{key} {}ms\n", pause.as_millis()),
    )
    .expect("block-thread switch");
    let marker = {
        let mut name = run.block_thread.as_os_str().to_os_string();
        name.push(".blocked");
        PathBuf::from(name)
    };
    let started = Instant::now();
    let blocked = loop {
        if let Some(text) = std::fs::read_to_string(&marker)
            .ok()
            .filter(|t| t.ends_with('\n'))
        {
            break text;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no node blocked {key}'s thread within 20 s of the switch"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    std::fs::remove_file(&run.block_thread).expect("block-thread switch off");
    let addr = blocked.split_whitespace().next().unwrap_or_default();
    let target = (0..run.c.nodes.len())
        .find(|i| run.c.nodes[*i].addr == addr)
        .unwrap_or_else(|| panic!("the entity blocked on an unknown node: {blocked:?}"));
    let addr = addr.to_string();
    eprintln!(
        "fault BlockedThread on node {target} ({addr}): {key} blocked for {pause:?}, {}",
        if leases_lost {
            "its leases lost"
        } else {
            "its node leaving"
        }
    );
    run.c
        .record_about(&addr, Event::ThreadBlocked { entity: key });
    if leases_lost {
        lose_leases(run, target, rng);
        restart_self_ended(
            run,
            target,
            Duration::from_secs(15),
            "while an entity outlived its kill under a lost lease",
        );
    } else {
        std::thread::sleep(rng.between(Duration::from_millis(500), Duration::from_millis(1000)));
        let status = run.c.stop(target);
        let zombies = run
            .c
            .history()
            .iter()
            .filter(|e| e["event"] == "entity_zombie" && e["node"] == addr.as_str())
            .count();
        eprintln!(
            "node {target} ({addr}) left: {status:?}; entities that outlived their kill there so far: {zombies}"
        );
        run.c.spawn(target);
        run.c.record(target, Event::Restarted {});
    }
    std::fs::remove_file(&marker).expect("remove the block-thread marker");
}

/// The marker the blocking entity writes beside the block-thread switch: `<node> <token>`.
fn block_marker(run: &Run) -> PathBuf {
    let mut name = run.block_thread.as_os_str().to_os_string();
    name.push(".blocked");
    PathBuf::from(name)
}

/// Waits (20 s at most) for an entity to claim the block-thread switch naming `key`:
/// the marker's text, and how long ago the entity wrote it.
fn wait_blocked(run: &Run, key: &str) -> (String, Duration) {
    let marker = block_marker(run);
    let started = Instant::now();
    loop {
        if let Some(text) = std::fs::read_to_string(&marker)
            .ok()
            .filter(|t| t.ends_with('\n'))
        {
            let age = std::fs::metadata(&marker)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|at| at.elapsed().ok())
                .unwrap_or_default();
            return (text, age);
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no node blocked {key}'s thread within 20 s of the switch"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A paused holder that resumes and appends. The durable counter entity of a random key
/// blocks its thread (the block-thread switch) for [`PAUSED_HOLD`] on whichever node hosts
/// it, on its way to an append; the harness freezes that node at once (SIGSTOP, recorded as
/// `paused` as every freeze is, so the checker knows its beliefs are frozen) for longer
/// than the hold and the ttl, so its shard's grant lapses and another node may take the
/// shard; on SIGCONT (recorded `resumed`) the entity's block has run out and it appends
/// its event under the lapsed grant. The journal must refuse it: no event of the key may be
/// appended with the paused grant's token from the freeze on. The node must record the
/// refusal, or else end itself (the entity counted as outliving its kill under the lapsed
/// grant); it is then started again.
fn paused_append(run: &mut Run, rng: &mut Rng) {
    let ttl = MEMBER_TTL;
    let key = format!("key-{}", rng.below(KEYS));
    let hold = PAUSED_HOLD;
    std::fs::write(&run.block_thread, format!("{key} {}ms\n", hold.as_millis()))
        .expect("block-thread switch");
    let (blocked, age) = wait_blocked(run, &key);
    let mut words = blocked.split_whitespace();
    let addr = words.next().unwrap_or_default().to_string();
    let token: u64 = words
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("the block-thread marker names no token: {blocked:?}"));
    let target = (0..run.c.nodes.len())
        .find(|i| run.c.nodes[*i].addr == addr)
        .unwrap_or_else(|| panic!("the entity blocked on an unknown node: {blocked:?}"));
    run.c.pause(target);
    // The freeze must come before the hold runs out, or the append went out under a
    // current grant and this fault tested nothing.
    assert!(
        age + Duration::from_millis(100) < hold,
        "node {target} ({addr}) frozen {age:?} after {key} blocked, past its {hold:?} hold"
    );
    std::fs::remove_file(&run.block_thread).expect("block-thread switch off");
    let pid = format!("counter|{key}");
    let under_token = |events: &[tenure_cli::check::JournalEvent]| {
        events
            .iter()
            .filter(|e| e.persistence_id == pid && e.token == token)
            .count()
    };
    let before = under_token(&run.journal());
    // Past the ttl (the grant lapses) and past the hold (the entity appends at once on
    // resuming).
    let frozen = rng.between(
        (ttl + Duration::from_secs(1)).max(hold + Duration::from_millis(500)),
        ttl * 2 + Duration::from_secs(1),
    );
    eprintln!(
        "fault PausedAppend on node {target} ({addr}): {key} blocked on its way to an append under token {token}, the node frozen {age:?} later for {frozen:?}"
    );
    std::thread::sleep(frozen);
    let resumed = now_ns();
    run.c.resume(target);
    // The entity appends as soon as it runs again, and the journal's answer is recorded
    // even if the shard's stop ends the entity meanwhile. On a loaded machine the shard may
    // find the entity not yet polled past its kill wait after the resume (every timer of
    // the frozen process fires at once): it then counts as outliving its kill under a lease
    // being lost, and the node ends itself before the deadline, as it must. Either way no
    // append may land under the lapsed grant.
    let refused = |c: &Cluster| {
        c.history().iter().any(|e| {
            e["event"] == "journal_refused"
                && e["node"] == addr.as_str()
                && e["entity"] == key.as_str()
                && e["token"] == token
                && e["t"].as_i64().unwrap_or(0) > resumed
        })
    };
    let inc = run.c.nodes[target]
        .incarnation()
        .expect("started")
        .to_string();
    let ended_itself = |c: &Cluster| {
        c.history().iter().any(|e| {
            e["event"] == "process_abort"
                && e["node"] == addr.as_str()
                && e["inc"] == inc.as_str()
                && e["t"].as_i64().unwrap_or(0) > resumed
        })
    };
    let started = Instant::now();
    while !refused(&run.c) && !ended_itself(&run.c) && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    if !refused(&run.c) && ended_itself(&run.c) {
        let why = format!("on resuming ({key} outlived its kill under the lapsed grant)");
        restart_self_ended(run, target, Duration::from_secs(15), &why);
    } else if !refused(&run.c) {
        let stderr = run.c.nodes[target].stderr();
        let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        panic!(
            "node {target} ({addr}) neither recorded a refusal of {key}'s append under token {token} nor ended itself within 10 s of resuming; its log ends:\n{}",
            tail.join("\n")
        );
    }
    let after = under_token(&run.journal());
    assert_eq!(
        after,
        before,
        "{key}: the journal accepted {} events under token {token} from node {target} ({addr}) after it was frozen past its grant",
        after.saturating_sub(before)
    );
    std::fs::remove_file(block_marker(run)).expect("remove the block-thread marker");
}

/// How long the entity of a [`Fault::PausedAppend`] blocks before its append: time for the
/// harness to freeze its node first, even on a loaded machine.
const PAUSED_HOLD: Duration = Duration::from_millis(2500);

/// Whether a process recorded the loss of the lease file in the file now at `file` within
/// `limit` (see `SqliteStore`).
fn wait_loss_noticed(file: &Path, limit: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        let recorded =
            rusqlite::Connection::open_with_flags(file, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .and_then(|conn| {
                    conn.query_row(
                        "SELECT count(*) FROM tenure_meta WHERE key = 'lost_at'",
                        [],
                        |r| r.get::<_, i64>(0),
                    )
                });
        if recorded.is_ok_and(|n| n > 0) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// A second process acquiring as node `target`'s owner: `tenure lease run --owner <node>`
/// on the node's member lease, recording into the history. Half the time the node is frozen
/// meanwhile past the ttl (a pod replaced while its predecessor hangs): the second process
/// is granted the lease only once the node's grant expired, and the node, resumed, stays
/// out of the cluster until the second process is stopped. Otherwise the second process
/// waits while the node renews. Either way the checker judges the two holders.
fn second_owner(run: &mut Run, target: usize, rng: &mut Rng) {
    let ttl = MEMBER_TTL;
    let addr = run.c.nodes[target].addr.clone();
    let lease = format!("tenure-member-{addr}");
    let history = run.c.history.display().to_string();
    let mut second = run
        .c
        .command(
            target,
            &[
                "lease",
                "run",
                &lease,
                "--owner",
                &addr,
                "--grace",
                "200ms",
                "--history",
                &history,
                "--",
                "sleep",
                "600",
            ],
        )
        .env("TENURE_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start tenure lease run");
    run.c.record_about(
        &addr,
        Event::SecondOwnerStarted {
            lease: lease.to_string(),
        },
    );
    if rng.below(2) == 0 {
        run.c.pause(target);
        std::thread::sleep(rng.between(ttl + Duration::from_millis(500), ttl * 2));
        run.c.resume(target);
        std::thread::sleep(rng.between(Duration::from_millis(200), ttl));
    } else {
        std::thread::sleep(rng.between(Duration::from_secs(1), ttl + Duration::from_secs(1)));
    }
    tenure_test_kit::signal::send(second.id(), Signal::TERM);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = second.try_wait().expect("wait for tenure lease run") {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "tenure lease run --owner {addr} did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    run.c.record_about(
        &addr,
        Event::SecondOwnerStopped {
            lease: lease.to_string(),
            status: status.code(),
        },
    );
}

fn final_checks(run: &Run) {
    if let Some((spec, schema)) = &run.journal {
        let summary = cli::assert_checked_with(
            &run.c.history,
            &["--journal", spec, "--journal-schema", schema],
        );
        eprintln!("{}", summary.trim());
        let history = run.c.history();
        let refused = history
            .iter()
            .filter(|e| e["event"] == "journal_refused")
            .count();
        let acked = history.iter().filter(|e| e["event"] == "ack").count();
        eprintln!("durable counter: {acked} increments acknowledged, {refused} appends refused");
        assert!(acked > 0, "no increment acknowledged");
        return;
    }
    let summary = cli::assert_checked(&run.c.history);
    eprintln!("{}", summary.trim());
    let history = run.c.history();
    let counter = FencedCounter::open(&run.c.counter_file()).expect("open the counter");
    let acked = cli::shards::check_acks(&history, |key| {
        counter
            .get(&tenure_cli::demo::counter::counter_name(key))
            .expect("read the counter")
            .map(|(v, _)| v)
            .unwrap_or(0)
    });
    assert!(acked > 0, "no increment acknowledged");
    let grants = history
        .iter()
        .filter(|e| e["event"] == "lease_granted")
        .count();
    assert!(grants > 0, "the history records lease grants");
}

/// Runs the fixed seeds (or a replay's seed) on fresh stores of `kind`.
fn run_suite(kind: &str) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for seed in fixed_seeds() {
        run_seed(fresh_store(kind), seed);
    }
}

fn run_seed(store: Store, seed: u64) {
    let kind = store.kind();
    eprintln!("fault seed {seed} on {kind} (replay: TENURE_FAULT_SEED={seed})");
    let mut rng = Rng(SplitMix::new(seed));
    let started = Instant::now();
    let mut run = start(store);
    let mut faults = vec![
        Fault::Kill,
        Fault::PauseLong,
        Fault::PauseShort,
        Fault::CutLink,
        Fault::ClockJump,
        Fault::SlowStop,
        Fault::SameOwner,
        Fault::SlowStore,
        Fault::BlockedThreadLoss,
        Fault::BlockedThreadLeave,
    ];
    if run.store.journals() {
        faults.push(Fault::PausedAppend);
    }
    if kind == "sqlite" {
        faults.push(Fault::FileLoss);
    } else {
        faults.extend([Fault::CutStore, Fault::RestartStore]);
    }
    if kind == "etcd" {
        faults.push(Fault::SessionExpiry);
    }
    if let Some(only) = only_kinds() {
        faults.retain(|f| only.contains(&format!("{f:?}")));
        eprintln!("fault kinds of this run (TENURE_FAULT_KINDS): {faults:?}");
        assert!(
            !faults.is_empty(),
            "TENURE_FAULT_KINDS={only:?} names no fault kind of the {kind} store"
        );
    }
    for _ in 0..rounds() {
        // Fisher-Yates with the seeded generator.
        for i in (1..faults.len()).rev() {
            faults.swap(i, rng.below(i + 1));
        }
        for &fault in &faults {
            std::thread::sleep(rng.between(Duration::from_millis(200), Duration::from_secs(1)));
            // A node that ended itself late in the fault before is judged against it.
            restart_ended(&mut run);
            run.recent = [Some(fault), run.recent[0]];
            inject(&mut run, fault, &mut rng);
            let healed = now_ns();
            wait_for(
                &mut run,
                "every running node sees every running node up",
                Duration::from_secs(60),
                |c| c.converged(),
            );
            wait_serving(&mut run, healed, Duration::from_secs(60));
        }
    }
    final_checks(&run);
    eprintln!(
        "{kind}: {} faults in {:.1} s, seed {seed}",
        faults.len() * rounds(),
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn faults_on_sqlite() {
    run_suite("sqlite");
}

#[test]
fn faults_on_etcd() {
    run_suite("etcd");
}

#[test]
fn faults_on_postgres() {
    run_suite("postgres");
}

#[test]
fn faults_on_zookeeper() {
    run_suite("zookeeper");
}

/// One random seed on one store, both drawn per test run: over many runs every store meets
/// many seeds, while a run pays for one random run rather than one per store. The seed
/// picks the store, so a replay (`TENURE_FAULT_SEED`) runs it on the same store again.
#[test]
fn faults_on_a_random_store_with_a_random_seed() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let seed = random_seed();
    let kind = STORES[(seed % STORES.len() as u64) as usize];
    eprintln!(
        "random fault seed {seed} picks the {kind} store (replay: TENURE_FAULT_SEED={seed} cargo nextest run -p tenure-cli --all-features --test faults faults_on_{kind})"
    );
    run_seed(fresh_store(kind), seed);
}

/// What the kernel says of process `pid` (for a node that stopped answering): its state
/// (`R` running, `S` sleeping, `T` stopped by a signal, `Z` exited and not reaped), and per
/// thread the state and the kernel function it waits in, so that a hang, a stop and an exit
/// tell apart.
fn process_state(pid: i32) -> String {
    let stat = |path: PathBuf| {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.chars().next()))
            .flatten()
    };
    let Some(state) = stat(PathBuf::from(format!("/proc/{pid}/stat"))) else {
        return format!("pid {pid}: gone");
    };
    let mut threads: BTreeMap<String, usize> = BTreeMap::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            let wchan = std::fs::read_to_string(task.path().join("wchan")).unwrap_or_default();
            let state = stat(task.path().join("stat")).unwrap_or('?');
            *threads.entry(format!("{state} {wchan}")).or_default() += 1;
        }
    }
    format!("pid {pid} state {state}; threads (state, waiting in): {threads:?}")
}
