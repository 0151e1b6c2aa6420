//! `tenure demo`: a local cluster of `tenure demo node` processes hosting a sharded counter
//! (a durable entity on SQLite, its journal fenced by the shard's grant; the fenced counter
//! file on other stores) and a singleton under client load, put through a scenario of faults (SIGKILL, SIGSTOP past
//! the ttl, a cut link, a graceful leave, restarts, a rolling restart), with a live progress
//! line, then a summary (operations acknowledged, fail-over per fault, the rolling restart's
//! figures, grants and losses), the safety verdict on the recorded history (and on the
//! durable counter's journal) and an HTML report of who held which lease when.

pub mod cluster;
pub mod counter;
pub mod example_nodes;
pub mod fenced_counter;
pub mod progress;
pub mod report;
pub mod scenario;
pub mod summary;
pub mod ticker;
pub mod timeline;

pub use fenced_counter::FencedCounter;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::check;
use cluster::{Cluster, HarnessError, Options};
use progress::Live;
use scenario::{Fault, Scenario, SplitMix, Step};
use summary::{RollWindow, Summary};
use timeline::Timeline;

/// The entity type of the demo's sharded counter (`tenure demo node --durable-counter` or
/// `--sharded-counter`).
const COUNTER_TYPE: &str = "counter";
/// The demo's singleton.
const SINGLETON: &str = "demo";
/// Keys of the load per shard: enough that every shard gets some.
const KEYS_PER_SHARD: usize = 10;

/// `tenure demo` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Node processes to run (127.0.0.1, free ports).
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Shards of the sharded counter entity type.
    #[arg(long, default_value_t = 64)]
    pub shards: usize,
    /// Length of the traffic phase, in which the scenario runs (starting and stopping the
    /// cluster add a few seconds).
    #[arg(long, default_value = "60s", value_parser = tenure::duration::parse)]
    pub duration: Duration,
    /// Lease ttl of shards, singletons and members (heartbeat-timeout, member-lease-ttl);
    /// heartbeats every ttl/6, retries every ttl/10, store operations bounded by ttl/2.
    #[arg(long, default_value = "3s", value_parser = tenure::duration::parse)]
    pub ttl: Duration,
    /// TOML list of `[[step]]`s (at, fault = kill|pause|cut|isolate|leave|restart|
    /// rolling-restart, optional node, peer, and `for` for pause, cut and isolate) replacing
    /// the built-in scenario.
    #[arg(long, value_name = "FILE")]
    pub scenario: Option<PathBuf>,
    /// Seed of the fault timing (each step moved by up to ttl/2) and of the targets not
    /// named in the scenario (default: from the clock). Printed at start: replay a run
    /// with the same seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Keep the history here, replacing an older one (default: history.jsonl in
    /// tenure-demo-<seed> under the temp dir; the path is printed).
    #[arg(long, value_name = "PATH")]
    pub history: Option<PathBuf>,
    /// Write the HTML report here (default: next to the history, with .html).
    #[arg(long, value_name = "PATH")]
    pub report: Option<PathBuf>,
    /// A config whose [tenure] default-lease-section names a [lease.<name>] section of
    /// etcd, postgres or zookeeper to use instead of a SQLite file in a temp dir (its
    /// timing keys are replaced by the ones derived from --ttl). On SQLite the counter is a
    /// durable entity (its journal in a file of its own, checked with the history); on
    /// other stores it is the fenced counter file.
    #[arg(long, value_name = "FILE")]
    pub store: Option<PathBuf>,
}

/// Why the demo could not run or report.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A command-line flag has a value the demo cannot use.
    #[error("{flag}: {problem}")]
    Flag {
        /// The flag, e.g. `--nodes`.
        flag: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// The scenario file cannot be used.
    #[error(transparent)]
    Scenario(#[from] scenario::ScenarioError),
    /// The lease store (`--store`, or the temporary one) cannot be set up.
    #[error("--store {path}: {problem}")]
    Store {
        /// The store's path.
        path: String,
        /// What failed.
        problem: String,
    },
    /// The history file cannot be created or replaced.
    #[error("history {path}: {problem}")]
    History {
        /// The history file's path.
        path: String,
        /// What failed.
        problem: String,
    },
    /// The durable counter's journal cannot be read for the verdict.
    #[error(transparent)]
    Journal(#[from] check::JournalReadError),
    /// The HTML report cannot be written.
    #[error("report {path}: {source}")]
    Report {
        /// The report's path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The `tenure` executable that runs the nodes was not found.
    #[error("cannot find the tenure executable to start the nodes: {0}")]
    Binary(std::io::Error),
    /// The cluster could not be set up or its nodes started (names the node and why).
    #[error("cluster: {0}")]
    Cluster(#[from] HarnessError),
    /// A step of the scenario failed (a fault that could not be injected or ended, a node
    /// that did not start again); the nodes were stopped before the demo ended.
    #[error("scenario step at {at:.1}s ({step}) failed: {source}")]
    Step {
        /// When the step was due, in seconds from the start of the traffic.
        at: f64,
        /// What the step does, e.g. `SIGKILL node 1`.
        step: String,
        /// What failed.
        #[source]
        source: Box<HarnessError>,
    },
}

/// What a finished demo produced.
#[derive(Debug)]
pub struct Outcome {
    /// What the run did, counted from its history.
    pub summary: Summary,
    /// The checker's violations (of the history, and of the journal when the counter is
    /// durable); empty when both are safe.
    pub violations: Vec<String>,
    /// The journal check's figures when the counter is a durable entity (SQLite); `None`
    /// for the fenced counter file.
    pub journal: Option<check::JournalCheck>,
    /// The history file written.
    pub history: PathBuf,
    /// The HTML report written.
    pub report: PathBuf,
}

impl Outcome {
    /// Whether the checker found the history safe.
    pub fn safe(&self) -> bool {
        self.violations.is_empty()
    }
}

/// `true` after the first SIGINT/SIGTERM: the demo stops its scenario, stops the nodes and
/// still reports. A second signal exits at once (status 130); the nodes die with the demo
/// (parent-death signal).
fn interrupted() -> bool {
    flag().load(Ordering::SeqCst)
}

fn watch_signals() {
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // The exit is registered first, so that the first signal only sets the flag.
        let registered = signal_hook::flag::register_conditional_shutdown(signal, 130, flag())
            .and_then(|_| signal_hook::flag::register(signal, flag()));
        if let Err(e) = registered {
            tracing::warn!(signal, error = %e, "cannot handle the signal: it ends the demo without a report");
        }
    }
}

fn flag() -> Arc<AtomicBool> {
    static FLAG: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();
    FLAG.get_or_init(Arc::default).clone()
}

/// The lease part of the nodes' config and the system name (lease name prefix).
struct LeaseConfig {
    toml: String,
    system: String,
    describe: String,
    /// The store is SQLite: the counter can be durable (its journal fenced by the lease
    /// file).
    sqlite: bool,
}

/// What the demo's sharded counter is.
#[derive(Debug, Clone, PartialEq)]
enum CounterKind {
    /// A durable entity (`--durable-counter`), its journal in this SQLite file of its own,
    /// fenced by the lease file (appends write-lock the journal file only, so they never
    /// hold up the leases' renewals).
    Durable { journal: PathBuf },
    /// The fenced counter file (`--sharded-counter`): the durable counter's journal needs
    /// a SQLite lease store (PostgreSQL's is not wired into the demo).
    Plain,
}

impl CounterKind {
    /// The durable counter on a SQLite store, its journal `journal.sqlite` in `dir`; the
    /// fenced counter file on any other.
    fn of(lease: &LeaseConfig, dir: &Path) -> CounterKind {
        if lease.sqlite {
            CounterKind::Durable {
                journal: dir.join("journal.sqlite"),
            }
        } else {
            CounterKind::Plain
        }
    }

    fn describe(&self) -> String {
        match self {
            CounterKind::Durable { journal } => format!(
                "durable entity, one event per increment, journal {} fenced by the shard's grant",
                journal.display()
            ),
            CounterKind::Plain => {
                "fenced counter file (durable only on SQLite: this store keeps no journal for the demo)"
                    .into()
            }
        }
    }
}

fn lease_config(args: &DemoArgs, sqlite: &Path) -> Result<LeaseConfig, DemoError> {
    let ttl = args.ttl;
    let ms = |d: Duration| toml::Value::String(format!("{}ms", d.as_millis()));
    let timing = [
        ("heartbeat-timeout", ms(ttl)),
        ("heartbeat-interval", ms(ttl / 6)),
        ("lease-retry-interval", ms(ttl / 10)),
        ("lease-operation-timeout", ms(ttl / 2)),
    ];
    let Some(path) = &args.store else {
        let mut section = toml::Table::new();
        section.insert("path".into(), sqlite.display().to_string().into());
        section.extend(timing.map(|(k, v)| (k.to_string(), v)));
        let toml = format!(
            "[tenure]\ndefault-lease-section = \"sqlite\"\n\n[lease.sqlite]\n{}",
            toml::to_string(&section).expect("a table of strings serializes")
        );
        return Ok(LeaseConfig {
            toml,
            system: "tenure".into(),
            describe: format!("sqlite {}", sqlite.display()),
            sqlite: true,
        });
    };
    let bad = |problem: String| DemoError::Store {
        path: path.display().to_string(),
        problem,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let mut doc: toml::Table = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let tenure = doc
        .remove("tenure")
        .unwrap_or(toml::Value::Table(toml::Table::new()));
    let system = tenure
        .get("system")
        .and_then(|v| v.as_str())
        .unwrap_or("tenure")
        .to_string();
    let name = tenure
        .get("default-lease-section")
        .and_then(|v| v.as_str())
        .ok_or_else(|| bad("no [tenure] default-lease-section".into()))?
        .to_string();
    let mut lease = doc
        .remove("lease")
        .and_then(|v| v.as_table().cloned())
        .ok_or_else(|| bad("no [lease] table".into()))?;
    let section = lease
        .get_mut(&name)
        .and_then(|v| v.as_table_mut())
        .ok_or_else(|| bad(format!("no [lease.{name}] section")))?;
    section.extend(timing.map(|(k, v)| (k.to_string(), v)));
    let store = section
        .get("store")
        .and_then(|v| v.as_str())
        .unwrap_or(&name)
        .to_string();
    let mut out = toml::Table::new();
    out.insert("tenure".into(), tenure);
    out.insert("lease".into(), toml::Value::Table(lease));
    let toml = toml::to_string(&out).map_err(|e| bad(e.to_string()))?;
    // The section must be usable by this build (its store kind compiled in, its options
    // valid) before any node starts with it.
    let mut config = tenure::TenureConfig::reference();
    config
        .merge_str(&toml, &path.display().to_string())
        .and_then(|()| config.validate())
        .and_then(|()| tenure::provider(config))
        .and_then(|provider| provider.section(&name))
        .map_err(|e| bad(e.to_string()))?;
    Ok(LeaseConfig {
        toml,
        system,
        describe: format!("{store} ([lease.{name}] of {})", path.display()),
        sqlite: store == "sqlite",
    })
}

fn validate(args: &DemoArgs) -> Result<(), DemoError> {
    let flag = |flag, problem: &str| {
        Err(DemoError::Flag {
            flag,
            problem: problem.to_string(),
        })
    };
    if args.nodes == 0 {
        return flag("--nodes", "at least one node");
    }
    if args.shards == 0 {
        return flag("--shards", "at least one shard");
    }
    if args.ttl < Duration::from_secs(2) {
        return flag(
            "--ttl",
            "at least 2s (heartbeats run every ttl/6, and two of them and the stop budget must fit)",
        );
    }
    if args.duration < Duration::from_secs(1) {
        return flag("--duration", "at least 1s");
    }
    Ok(())
}

/// The node harness options of a demo cluster.
fn options(args: &DemoArgs, lease: &LeaseConfig, history: &Path, counter: &CounterKind) -> Options {
    let ttl = args.ttl;
    let ms = |d: Duration| format!("\"{}ms\"", d.as_millis());
    // Open loop: every node asks every key every 2 s whether or not earlier asks were
    // answered, each ask given one ttl, so that service during a fault is measured honestly
    // (64 shards x 10 keys x 3 nodes: 960 asks a second, within what the one SQLite
    // counter file takes on 2 cores).
    let mut node_args = match counter {
        CounterKind::Durable { journal } => vec![
            "--durable-counter".to_string(),
            "--journal-file".into(),
            journal.display().to_string(),
        ],
        CounterKind::Plain => vec!["--sharded-counter".to_string()],
    };
    node_args.extend(
        [
            "--singleton",
            SINGLETON,
            "--load-keys",
            &(args.shards * KEYS_PER_SHARD).to_string(),
            "--load-rate",
            "0.5",
            "--load-timeout",
            &format!("{}ms", ttl.as_millis()),
        ]
        .map(String::from),
    );
    Options {
        node_args,
        tail: format!(
            "[sharding]\nnumber-of-shards = {}\nretry-interval = {}\nunreachable-reallocate-after = {}\n\
             rebalance-interval = \"1s\"\nhand-off-timeout = {}\n",
            args.shards,
            ms(ttl / 10),
            ms(ttl * 2 / 3),
            ms(ttl * 2),
        ),
        overrides: vec![
            ("member-lease-ttl".into(), ms(ttl)),
            ("member-lease-interval".into(), ms(ttl / 6)),
            ("unreachable-after".into(), ms(ttl / 2)),
            // A leaving node exits once leave-timeout passed, whatever its draining entities
            // still hold: it outlasts a hand-off (hand-off-timeout, 2 ttl).
            ("leave-timeout".into(), ms(ttl * 3)),
        ],
        history: Some(history.to_path_buf()),
        lease: Some(lease.toml.clone()),
        supervised: true,
        ..Options::default()
    }
}

/// The history's clock (CLOCK_BOOTTIME ns, never negative).
fn now_ns() -> u64 {
    tenure::clock::boottime_now_ns().max(0) as u64
}

/// The history path of this run (`--history`, or `tenure-demo-<seed>/history.jsonl` under
/// the temp dir), its directory created and an older history there removed: a history is
/// one run, appending to an older one would mix runs.
fn fresh_history(args: &DemoArgs, seed: u64) -> Result<PathBuf, DemoError> {
    let history = args.history.clone().unwrap_or_else(|| {
        std::env::temp_dir()
            .join(format!("tenure-demo-{seed}"))
            .join("history.jsonl")
    });
    if let Some(dir) = history.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| DemoError::History {
            path: history.display().to_string(),
            problem: format!("cannot create its directory: {e}"),
        })?;
    }
    match std::fs::remove_file(&history) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(DemoError::History {
                path: history.display().to_string(),
                problem: format!("cannot replace it: {e}"),
            });
        }
        _ => {}
    }
    Ok(history)
}

/// Runs the demo, printing progress and the summary on stdout. Returns once every node
/// stopped and the report is written, with the verdict; `Err` when a flag, the scenario,
/// the `--store` config, the history or the report cannot be used. A node that cannot be
/// started panics the harness; the nodes already running are killed on the way out.
pub fn run(args: DemoArgs) -> Result<Outcome, DemoError> {
    validate(&args)?;
    let seed = args
        .seed
        .unwrap_or_else(|| now_ns() ^ u64::from(std::process::id()));
    let mut rng = SplitMix::new(seed);
    let scenario = match &args.scenario {
        Some(path) => Scenario::load(path, args.nodes)?,
        None => Scenario::builtin(args.duration, args.ttl),
    }
    .jittered(&mut rng, args.ttl / 2);
    let history = fresh_history(&args, seed)?;
    let report_path = args
        .report
        .clone()
        .unwrap_or_else(|| history.with_extension("html"));
    let store_dir = tempfile::tempdir().map_err(|e| DemoError::Store {
        path: "temp dir".into(),
        problem: e.to_string(),
    })?;
    let lease = lease_config(&args, &store_dir.path().join("leases.sqlite"))?;
    // Beside the default lease file (in the same temp dir).
    let counter_kind = CounterKind::of(&lease, store_dir.path());
    let binary = std::env::current_exe().map_err(DemoError::Binary)?;

    println!(
        "tenure demo: {} nodes, {} shards, ttl {}, {} of traffic, store {}",
        args.nodes,
        args.shards,
        humantime::format_duration(args.ttl),
        humantime::format_duration(args.duration),
        lease.describe
    );
    println!("counter {}", counter_kind.describe());
    println!("seed {seed} (replay with --seed {seed})");
    println!("history {}", history.display());
    println!("scenario (from the start of the traffic):");
    for step in &scenario.steps {
        println!(
            "  at {:>5.1}s {}",
            step.at.as_secs_f64(),
            describe_step(step)
        );
    }
    watch_signals();
    let started = Instant::now();
    // A node that does not start ends the demo; dropping the cluster kills the others.
    let mut cluster = Cluster::configure(
        &binary,
        args.nodes,
        &options(&args, &lease, &history, &counter_kind),
    )?;
    for i in 0..args.nodes {
        cluster.spawn(i)?;
        println!("node {i} {} started", cluster.nodes[i].addr);
    }
    let mut run = Run::new(
        cluster,
        Live::new(&history, &lease.system),
        rng,
        args.shards,
    );
    run.warm_up(&args);
    let traffic = run.traffic(&args, scenario);
    let scenario_end = now_ns();
    run.shut_down();
    traffic?;
    let setup = started.elapsed();

    let events = check::read_history(&history).map_err(|e| DemoError::History {
        path: history.display().to_string(),
        problem: e.to_string(),
    })?;
    // A node frozen past its deadline must stop within its stop budget of resuming: the
    // demo's stop-timeout is ttl/10 (plus 500 ms of kill wait and delivery slack).
    let rule = check::ActionRule {
        resume_grace: args.ttl.max(Duration::from_secs(2)),
    };
    let verdict = check::check_with(&events, rule);
    // The acknowledged increments are checked against what the counter keeps: the
    // journal's events (with the rest of the journal check) or the counter file's values.
    let (acks, journal) = match &counter_kind {
        CounterKind::Durable { journal } => {
            let found = check::check_counter_journal(
                &events,
                &journal.display().to_string(),
                JOURNAL_SCHEMA,
            )?;
            (
                Acks {
                    checked: found.acked,
                    against: "the journal",
                    violations: found.violations.clone(),
                },
                Some(found),
            )
        }
        CounterKind::Plain => {
            let counter = run.cluster.counter_file();
            let acks =
                check::check_counter_acks(&events, &counter).map_err(|e| DemoError::History {
                    path: counter.display().to_string(),
                    problem: e.to_string(),
                })?;
            (
                Acks {
                    checked: acks.acked,
                    against: "the counter's final state",
                    violations: acks.violations,
                },
                None,
            )
        }
    };
    let violations: Vec<String> = verdict
        .violations
        .iter()
        .chain(&acks.violations)
        .map(|v| v.to_string())
        .collect();
    let timeline = Timeline::new(
        &events,
        timeline::workload_holds(&verdict.holds, &lease.system),
    );
    let summary = summary::summarize(&events, &timeline, scenario_end, &run.rolls);
    let html = report::render(&report::ReportInput {
        run: vec![
            ("seed".into(), seed.to_string()),
            ("nodes".into(), args.nodes.to_string()),
            ("shards".into(), args.shards.to_string()),
            (
                "ttl".into(),
                humantime::format_duration(args.ttl).to_string(),
            ),
            ("store".into(), lease.describe.clone()),
            ("counter".into(), counter_kind.describe()),
            (
                "journal check".into(),
                journal
                    .as_ref()
                    .map(|j| describe_journal(j, j.violations.is_empty()))
                    .unwrap_or_else(|| "none (no journal: the counter is not durable)".into()),
            ),
            ("history".into(), history.display().to_string()),
            (
                "scenario".into(),
                args.scenario
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "built in".into()),
            ),
        ],
        timeline: &timeline,
        summary: &summary,
        violations: &violations,
        system: &lease.system,
        scenario_end_ns: scenario_end,
        requests: &crate::availability::requests(&events),
    });
    std::fs::write(&report_path, html).map_err(|source| DemoError::Report {
        path: report_path.display().to_string(),
        source,
    })?;
    print_summary(
        &summary,
        &timeline,
        &violations,
        &acks,
        journal.as_ref(),
        setup,
    );
    println!("history {}", history.display());
    println!("report  {}", report_path.display());
    Ok(Outcome {
        summary,
        violations,
        journal,
        history,
        report: report_path,
    })
}

fn describe_step(step: &Step) -> String {
    let node = |n: Option<usize>| {
        n.map(|n| format!("node {n}"))
            .unwrap_or("a random node".into())
    };
    match (step.fault, step.lasts) {
        (Fault::Cut, Some(d)) => format!(
            "cut {} | {} for {}",
            node(step.node),
            node(step.peer),
            humantime::format_duration(d)
        ),
        (Fault::Pause, Some(d)) => format!(
            "SIGSTOP {} for {}",
            node(step.node),
            humantime::format_duration(d)
        ),
        (Fault::Restart, _) if step.node.is_none() => "restart the node down longest".into(),
        (f, _) => format!("{} {}", f.as_str(), node(step.node)),
    }
}

/// The durable counter's journal schema (PostgreSQL only; a SQLite journal has none).
const JOURNAL_SCHEMA: &str = "tenure";

/// The acknowledged increments checked against what the counter keeps.
struct Acks {
    /// How many were checked.
    checked: usize,
    /// What they were checked against, for the summary.
    against: &'static str,
    /// What the check found.
    violations: Vec<check::Violation>,
}

/// The journal check's figures and outcome in one line (`passed` when neither it nor the
/// history check found a violation).
fn describe_journal(j: &check::JournalCheck, passed: bool) -> String {
    format!(
        "{} events of {} entities, {} appends and {} refusals recorded, {} recoveries ({} \
         states replayed), {} acks checked: {}",
        j.events,
        j.persistence_ids,
        j.appends,
        j.refused,
        j.recoveries,
        j.states_compared,
        j.acked,
        if passed {
            "passed".to_string()
        } else {
            format!("FAILED ({} violation(s))", j.violations.len())
        }
    )
}

fn print_summary(
    summary: &Summary,
    timeline: &Timeline,
    violations: &[String],
    acks: &Acks,
    journal: Option<&check::JournalCheck>,
    took: Duration,
) {
    println!();
    println!("== summary ({:.1} s in all) ==", took.as_secs_f64());
    println!(
        "operations acknowledged   {} ({} checked against {})",
        summary.acks, acks.checked, acks.against
    );
    match journal {
        Some(j) => println!(
            "journal check             {}",
            describe_journal(j, j.violations.is_empty())
        ),
        None => println!(
            "fenced writes             {} accepted, {} refused (stale token)",
            summary.writes_accepted, summary.writes_refused
        ),
    }
    println!("singleton ticks written   {}", summary.ticks);
    println!(
        "lease grants              {} (shards and singletons)",
        summary.grants
    );
    println!("leases lost by holders    {}", summary.losses);
    if !summary.failovers.is_empty() {
        println!(
            "per fault: fail-over (fault → every lease the victim held granted again), then the \
             service during the fault (asks issued until the heal, or for 10 s)"
        );
        for f in &summary.failovers {
            println!(
                "  {:>5.1}s {:<40} {}\n         {:<40} {}",
                f.fault.t_ns.saturating_sub(timeline.start_ns) as f64 / 1e9,
                f.fault.label(),
                f.describe(),
                "",
                f.service.describe()
            );
        }
    }
    for roll in &summary.rolls {
        println!("rolling restart           {}", roll.describe());
    }
    if violations.is_empty() {
        println!(
            "verdict: SAFE (tenure check: no lease held by two owners at once, tokens \
             increasing, every grant after the previous hold ended, every entity, singleton \
             and accepted write inside its node's hold, no stale write accepted, no \
             acknowledged increment lost{})",
            if journal.is_some() {
                "; tenure check --journal: every acknowledged increment's event in the journal \
                 exactly once, no append under a stale token, contiguous sequence numbers, \
                 recovered states matching the events"
            } else {
                ""
            }
        );
    } else {
        println!("verdict: UNSAFE, {} violation(s):", violations.len());
        for v in violations {
            println!("  {v}");
        }
    }
}

/// A running demo.
struct Run {
    cluster: Cluster,
    live: Live,
    rng: SplitMix,
    paused: BTreeSet<usize>,
    /// Cut links (a < b).
    cuts: BTreeSet<(usize, usize)>,
    /// Nodes cut off from every other node.
    isolated: BTreeSet<usize>,
    /// Stopped nodes, the one down longest first.
    down: Vec<usize>,
    /// The fault in effect, for the progress line.
    fault: String,
    origin: Instant,
    /// The rolling restarts run so far.
    rolls: Vec<RollWindow>,
    /// Shards of the counter (`--shards`).
    shards: usize,
}

#[derive(Debug)]
enum Action {
    Step(Step),
    Resume(usize),
    Heal(usize, usize),
    Reconnect(usize),
}

impl Action {
    /// What the action does, for a failed step's line and error.
    fn describe(&self) -> String {
        match self {
            Action::Step(step) => describe_step(step),
            Action::Resume(i) => format!("resume node {i}"),
            Action::Heal(a, b) => format!("heal the link between nodes {a} and {b}"),
            Action::Reconnect(i) => format!("reconnect node {i}"),
        }
    }
}

impl Run {
    /// A run of `cluster` (its history followed by `live`), no fault in effect yet.
    fn new(cluster: Cluster, live: Live, rng: SplitMix, shards: usize) -> Run {
        Run {
            cluster,
            live,
            rng,
            paused: BTreeSet::new(),
            cuts: BTreeSet::new(),
            isolated: BTreeSet::new(),
            down: Vec::new(),
            fault: String::from("none"),
            origin: Instant::now(),
            rolls: Vec::new(),
            shards,
        }
    }

    fn progress(&mut self, phase: &str) {
        self.live.poll();
        let per = self.live.shards_per_node(COUNTER_TYPE);
        let shards: Vec<String> = self
            .cluster
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| format!("n{i}:{}", per.get(n.addr.as_str()).copied().unwrap_or(0)))
            .collect();
        let singleton = self
            .live
            .singleton_holder(SINGLETON)
            .and_then(|h| self.cluster.nodes.iter().position(|n| n.addr == h))
            .map(|i| format!("n{i}"))
            .unwrap_or_else(|| "-".into());
        println!(
            "[{:>5.1}s] {phase:<7} acks {:>7}  shards {}  singleton {singleton}  fault: {}",
            self.origin.elapsed().as_secs_f64(),
            self.live.acks,
            shards.join(" "),
            self.fault
        );
    }

    /// Waits (at most a minute) until every loaded shard and the singleton run.
    fn warm_up(&mut self, args: &DemoArgs) {
        let loaded: BTreeSet<String> = (0..args.shards * KEYS_PER_SHARD)
            .map(|i| tenure::sharding::shard_of(&format!("key-{i}"), args.shards))
            .collect();
        let limit = Instant::now() + Duration::from_secs(60);
        let mut next_line = Instant::now();
        while !interrupted() {
            self.live.poll();
            let running: usize = self.live.shards_per_node(COUNTER_TYPE).values().sum();
            if running >= loaded.len() && self.live.singleton_holder(SINGLETON).is_some() {
                self.progress("ready");
                return;
            }
            if Instant::now() > limit {
                println!(
                    "warning: after 60 s only {running} of {} shards run; starting the scenario anyway",
                    loaded.len()
                );
                return;
            }
            if Instant::now() >= next_line {
                self.progress("warm-up");
                next_line += Duration::from_secs(1);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `scenario` over `args.duration` of traffic, a progress line every second;
    /// [`DemoError::Step`] (also printed as a failed step) at the first step that fails.
    fn traffic(&mut self, args: &DemoArgs, scenario: Scenario) -> Result<(), DemoError> {
        let start = Instant::now();
        let mut queue: Vec<(Duration, Action)> = scenario
            .steps
            .into_iter()
            .map(|s| (s.at, Action::Step(s)))
            .collect();
        let mut next_line = Instant::now();
        while start.elapsed() < args.duration && !interrupted() {
            queue.sort_by_key(|(at, _)| *at);
            while queue.first().is_some_and(|(at, _)| *at <= start.elapsed()) {
                let (at, action) = queue.remove(0);
                let step = action.describe();
                match self.act(action, at) {
                    Ok(Some(follow)) => queue.push(follow),
                    Ok(None) => {}
                    Err(source) => {
                        println!(
                            "[{:>5.1}s] step failed: {step}: {source}",
                            self.origin.elapsed().as_secs_f64()
                        );
                        self.fault = format!("failed: {step}");
                        return Err(DemoError::Step {
                            at: at.as_secs_f64(),
                            step,
                            source: Box::new(source),
                        });
                    }
                }
                self.progress("fault");
                next_line = Instant::now() + Duration::from_secs(1);
            }
            if Instant::now() >= next_line {
                self.progress("traffic");
                next_line += Duration::from_secs(1);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if interrupted() {
            println!("interrupted: stopping the nodes and reporting (again to exit at once)");
        }
        Ok(())
    }

    /// The oldest up member that serves, from a serving node's view.
    fn oldest_serving(&self) -> Option<usize> {
        let serving = self.serving();
        let members = serving.iter().find_map(|i| self.cluster.members(*i))?;
        members.iter().filter(|m| m.status == "up").find_map(|m| {
            serving
                .iter()
                .copied()
                .find(|i| self.cluster.nodes[*i].addr == m.addr)
        })
    }

    fn serving(&self) -> Vec<usize> {
        (0..self.cluster.nodes.len())
            .filter(|i| self.cluster.is_running(*i) && !self.paused.contains(i))
            .collect()
    }

    /// A serving node to hit: `wanted` if it serves, else a random one; None when hitting
    /// it would leave no node serving.
    fn victim(&mut self, wanted: Option<usize>) -> Option<usize> {
        let serving = self.serving();
        if serving.len() < 2 {
            return None;
        }
        match wanted {
            Some(n) => serving.contains(&n).then_some(n),
            None => self.rng.pick(&serving),
        }
    }

    /// Does `action`; returns the action that ends it (resume, heal), if any, or what
    /// failed (naming the node).
    fn act(
        &mut self,
        action: Action,
        at: Duration,
    ) -> Result<Option<(Duration, Action)>, HarnessError> {
        let addr = |c: &Cluster, i: usize| {
            c.nodes
                .get(i)
                .map(|n| n.addr.clone())
                .unwrap_or_else(|| format!("no node {i}"))
        };
        match action {
            Action::Resume(i) => {
                self.paused.remove(&i);
                self.cluster.resume(i)?;
                self.fault = format!("n{i} resumed");
                Ok(None)
            }
            Action::Heal(a, b) => {
                self.cuts.remove(&(a.min(b), a.max(b)));
                link_taken(self.cluster.set_link(a, b, false))?;
                self.fault = format!("link n{a} | n{b} healed");
                Ok(None)
            }
            Action::Reconnect(i) => {
                self.isolated.remove(&i);
                link_taken(self.cluster.isolate(i, false))?;
                self.fault = format!("n{i} reconnected");
                Ok(None)
            }
            Action::Step(step) => {
                let skipped = |why: &str| {
                    println!("skipped {}: {why}", describe_step(&step));
                    Ok(None)
                };
                match step.fault {
                    Fault::RollingRestart => {
                        let unhealthy = !self.down.is_empty()
                            || !self.paused.is_empty()
                            || !self.cuts.is_empty()
                            || !self.isolated.is_empty();
                        if unhealthy {
                            return skipped(
                                "a node is down, paused, cut or isolated (a deploy starts \
                                 from a healthy cluster)",
                            );
                        }
                        self.rolling_restart()?;
                        Ok(None)
                    }
                    Fault::Restart => {
                        let node = match step.node {
                            Some(n) => self.down.iter().position(|d| *d == n),
                            None => (!self.down.is_empty()).then_some(0),
                        };
                        let Some(pos) = node else {
                            return skipped("no such node is down");
                        };
                        let i = self.down.remove(pos);
                        self.cluster.restart(i)?;
                        self.fault = format!("n{i} restarted ({})", addr(&self.cluster, i));
                        Ok(None)
                    }
                    Fault::Kill | Fault::Pause | Fault::Leave => {
                        let Some(i) = self.victim(step.node) else {
                            return skipped(
                                "it would leave no node serving (or the node is not serving)",
                            );
                        };
                        let who = addr(&self.cluster, i);
                        match step.fault {
                            Fault::Kill => {
                                self.cluster.kill(i)?;
                                self.down.push(i);
                                self.fault = format!("SIGKILL n{i} ({who})");
                                Ok(None)
                            }
                            Fault::Leave => {
                                self.fault = format!("n{i} leaving ({who})");
                                self.progress("fault");
                                let stopped = self.cluster.stop(i);
                                // Not running any more, whatever the stop answered.
                                self.down.push(i);
                                stopped?;
                                self.fault = format!("n{i} left ({who})");
                                Ok(None)
                            }
                            _ => {
                                self.cluster.pause(i)?;
                                self.paused.insert(i);
                                let lasts = step.lasts.unwrap_or_default();
                                self.fault = format!(
                                    "SIGSTOP n{i} ({who}) for {}",
                                    humantime::format_duration(lasts)
                                );
                                Ok(Some((at + lasts, Action::Resume(i))))
                            }
                        }
                    }
                    Fault::Isolate => {
                        let serving = self.serving();
                        let i = match step.node {
                            Some(n) => serving.contains(&n).then_some(n),
                            None => self.oldest_serving(),
                        };
                        let Some(i) = i else {
                            return skipped("the node is not serving");
                        };
                        if serving.len() < 2 {
                            return skipped("no other serving node");
                        }
                        // Inserted first: a partly applied isolation is healed at the end.
                        self.isolated.insert(i);
                        link_taken(self.cluster.isolate(i, true))?;
                        let lasts = step.lasts.unwrap_or_default();
                        self.fault = format!(
                            "n{i} ({}) isolated for {}",
                            addr(&self.cluster, i),
                            humantime::format_duration(lasts)
                        );
                        Ok(Some((at + lasts, Action::Reconnect(i))))
                    }
                    Fault::Cut => {
                        let serving = self.serving();
                        let a = match step.node {
                            Some(n) => serving.contains(&n).then_some(n),
                            None => self.rng.pick(&serving),
                        };
                        let Some(a) = a else {
                            return skipped("the node is not serving");
                        };
                        let others: Vec<usize> =
                            serving.iter().copied().filter(|n| *n != a).collect();
                        let b = match step.peer {
                            Some(p) => others.contains(&p).then_some(p),
                            None => self.rng.pick(&others),
                        };
                        let Some(b) = b else {
                            return skipped("no other serving node");
                        };
                        // Inserted first: a partly cut link is healed at the end.
                        self.cuts.insert((a.min(b), a.max(b)));
                        link_taken(self.cluster.set_link(a, b, true))?;
                        self.fault = format!(
                            "link n{a} | n{b} cut for {}",
                            humantime::format_duration(step.lasts.unwrap_or_default())
                        );
                        Ok(Some((
                            at + step.lasts.unwrap_or_default(),
                            Action::Heal(a, b),
                        )))
                    }
                }
            }
        }
    }

    /// Restarts every node in turn, as a deploy does: waits until the cluster converged and
    /// the previous node hosts shards again, then sends the next one SIGTERM, waits for its
    /// exit and starts it again. Keeps the span and each node's time (SIGTERM to the
    /// cluster converged with it hosting shards again) for the summary. Stops early when
    /// interrupted, or when the cluster does not settle within a minute; `Err` when a node
    /// could not be stopped or started again.
    fn rolling_restart(&mut self) -> Result<(), HarnessError> {
        let mut from_ns = None;
        let mut restarts = Vec::new();
        for i in 0..self.cluster.nodes.len() {
            if interrupted() || !self.settle(None) {
                break;
            }
            let addr = self.cluster.nodes[i].addr.clone();
            let began = Instant::now();
            // The deploy begins at its first SIGTERM: what the earlier faults left unsettled
            // (shards still moving back) is theirs.
            from_ns.get_or_insert_with(now_ns);
            self.fault = format!("rolling restart: n{i} leaving ({addr})");
            self.progress("deploy");
            if let Err(e) = self.cluster.stop(i).and_then(|_| self.cluster.restart(i)) {
                self.end_roll(from_ns, restarts);
                return Err(e);
            }
            self.fault = format!("rolling restart: n{i} restarted ({addr})");
            self.progress("deploy");
            if !self.settle(Some(i)) {
                break;
            }
            restarts.push((addr, began.elapsed().as_nanos() as u64));
        }
        self.end_roll(from_ns, restarts);
        Ok(())
    }

    /// Keeps a rolling restart's window and each node's time for the summary.
    fn end_roll(&mut self, from_ns: Option<u64>, restarts: Vec<(String, u64)>) {
        self.fault = format!(
            "rolling restart done ({} of {} nodes)",
            restarts.len(),
            self.cluster.nodes.len()
        );
        let until_ns = now_ns();
        self.rolls.push(RollWindow {
            from_ns: from_ns.unwrap_or(until_ns),
            until_ns,
            restarts,
        });
    }

    /// Waits (at most a minute, a progress line a second) until every node sees every node
    /// up and, with `restarted`, that node hosts a shard again (when there are shards
    /// enough for every node). False when interrupted or out of time (said so).
    fn settle(&mut self, restarted: Option<usize>) -> bool {
        let limit = Instant::now() + Duration::from_secs(60);
        let mut next_line = Instant::now() + Duration::from_secs(1);
        while !interrupted() {
            self.live.poll();
            let hosting = restarted.is_none_or(|i| {
                self.shards < self.cluster.nodes.len()
                    || self
                        .live
                        .shards_per_node(COUNTER_TYPE)
                        .get(self.cluster.nodes[i].addr.as_str())
                        .is_some_and(|n| *n > 0)
            });
            if hosting && self.cluster.converged() {
                return true;
            }
            if Instant::now() > limit {
                println!(
                    "warning: the cluster did not settle within 60 s: rolling restart stopped"
                );
                return false;
            }
            if Instant::now() >= next_line {
                self.progress("deploy");
                next_line += Duration::from_secs(1);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    }

    /// Ends every fault still in effect, then stops every node gracefully (all at once).
    /// What fails here is printed, and the rest goes on: every node is stopped (or killed
    /// when the cluster is dropped) whatever failed before.
    fn shut_down(&mut self) {
        let warn = |what: Result<(), HarnessError>| {
            if let Err(e) = what {
                println!("warning: while stopping: {e}");
            }
        };
        for i in std::mem::take(&mut self.paused) {
            warn(self.cluster.resume(i));
        }
        for (a, b) in std::mem::take(&mut self.cuts) {
            warn(self.cluster.set_link(a, b, false));
        }
        for i in std::mem::take(&mut self.isolated) {
            warn(self.cluster.isolate(i, false));
        }
        self.fault = "stopping the nodes".into();
        self.progress("stop");
        match self.cluster.stop_all(Duration::from_secs(20)) {
            Ok(unclean) if unclean.is_empty() => {}
            Ok(unclean) => println!("nodes that did not leave cleanly: {unclean:?}"),
            Err(e) => println!("warning: while stopping: {e}"),
        }
    }
}

/// A link fault some node did not take (it was not listening: it left, was downed and
/// ends, or restarts) is reported and the scenario goes on: the other nodes' links are set
/// (see `Cluster::isolate`), and the end of the run heals every link again. Other errors
/// end the run.
fn link_taken(done: Result<(), HarnessError>) -> Result<(), HarnessError> {
    match done {
        Err(e @ HarnessError::Fault { .. }) => {
            println!("warning: {e}");
            Ok(())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(store: Option<PathBuf>) -> DemoArgs {
        DemoArgs {
            nodes: 3,
            shards: 8,
            duration: Duration::from_secs(20),
            ttl: Duration::from_secs(3),
            scenario: None,
            seed: None,
            history: None,
            report: None,
            store,
        }
    }

    #[test]
    fn the_default_store_is_a_sqlite_file_with_timing_from_the_ttl() {
        let lease = lease_config(&args(None), Path::new("/tmp/x/leases.sqlite")).unwrap();
        let doc: toml::Table = toml::from_str(&lease.toml).unwrap();
        assert_eq!(
            doc["tenure"]["default-lease-section"].as_str(),
            Some("sqlite")
        );
        let section = &doc["lease"]["sqlite"];
        assert_eq!(section["path"].as_str(), Some("/tmp/x/leases.sqlite"));
        assert_eq!(section["heartbeat-timeout"].as_str(), Some("3000ms"));
        assert_eq!(section["heartbeat-interval"].as_str(), Some("500ms"));
        assert_eq!(lease.system, "tenure");
    }

    #[test]
    fn the_counter_is_durable_on_sqlite_with_its_journal_beside_the_lease_file() {
        let dir = Path::new("/tmp/x");
        let lease = lease_config(&args(None), &dir.join("leases.sqlite")).unwrap();
        let counter = CounterKind::of(&lease, dir);
        assert_eq!(
            counter,
            CounterKind::Durable {
                journal: dir.join("journal.sqlite")
            }
        );
        let history = dir.join("history.jsonl");
        let node_args = options(&args(None), &lease, &history, &counter).node_args;
        assert_eq!(
            node_args[..3],
            [
                "--durable-counter",
                "--journal-file",
                "/tmp/x/journal.sqlite"
            ]
        );
        assert!(!node_args.iter().any(|a| a == "--sharded-counter"));
        assert!(counter.describe().contains("/tmp/x/journal.sqlite"));

        // Any other store keeps the fenced counter file, and says so.
        let other = LeaseConfig {
            sqlite: false,
            ..lease
        };
        let plain = CounterKind::of(&other, dir);
        assert_eq!(plain, CounterKind::Plain);
        let node_args = options(&args(None), &other, &history, &plain).node_args;
        assert_eq!(node_args[0], "--sharded-counter");
        assert!(!node_args.iter().any(|a| a.contains("journal")));
        assert!(plain.describe().contains("durable only on SQLite"));
    }

    #[test]
    #[cfg(feature = "etcd")]
    fn a_store_config_keeps_its_section_and_system_with_the_demo_timing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("etcd.toml");
        std::fs::write(
            &path,
            "[tenure]\nsystem = \"shop\"\ndefault-lease-section = \"main\"\n\n\
             [lease.main]\nstore = \"etcd\"\nendpoints = [\"http://127.0.0.1:2379\"]\n\
             heartbeat-timeout = \"120s\"\n\n[cluster]\nport = 1\n",
        )
        .unwrap();
        let lease = lease_config(&args(Some(path.clone())), Path::new("/unused")).unwrap();
        let doc: toml::Table = toml::from_str(&lease.toml).unwrap();
        assert!(
            doc.get("cluster").is_none(),
            "only [tenure] and [lease] are kept"
        );
        let section = &doc["lease"]["main"];
        assert_eq!(section["store"].as_str(), Some("etcd"));
        assert_eq!(section["heartbeat-timeout"].as_str(), Some("3000ms"));
        assert_eq!(lease.system, "shop");
        assert!(
            !lease.sqlite,
            "etcd keeps no journal for the demo's counter"
        );
        assert!(
            lease.describe.starts_with("etcd ([lease.main]"),
            "{}",
            lease.describe
        );

        std::fs::write(&path, "[tenure]\ndefault-lease-section = \"pg\"\n").unwrap();
        let err = lease_config(&args(Some(path)), Path::new("/unused"))
            .err()
            .expect("no [lease] table");
        assert!(err.to_string().contains("etcd.toml"), "{err}");
    }

    /// A demo run over `nodes` configured nodes of a `tenure` executable that does not
    /// exist: none is running, and none can start.
    fn run_without_nodes(dir: &Path, nodes: usize) -> Run {
        let binary = dir.join("no-such-tenure");
        let cluster = Cluster::configure(&binary, nodes, &Options::default()).unwrap();
        let live = Live::new(&dir.join("history.jsonl"), "tenure");
        Run::new(cluster, live, SplitMix::new(1), 1)
    }

    #[test]
    fn a_step_whose_node_does_not_start_fails_the_scenario_naming_the_node() {
        let dir = tempfile::tempdir().unwrap();
        let mut run = run_without_nodes(dir.path(), 2);
        run.down = vec![1];
        let scenario = Scenario {
            steps: vec![Step {
                at: Duration::ZERO,
                fault: Fault::Restart,
                node: Some(1),
                peer: None,
                lasts: None,
            }],
        };
        let addr = run.cluster.nodes[1].addr.clone();
        let Err(DemoError::Step { step, source, .. }) = run.traffic(&args(None), scenario) else {
            panic!("a restart of a node that cannot start did not fail the scenario");
        };
        assert_eq!(step, "restart node 1");
        assert!(
            matches!(*source, HarnessError::Process { node: 1, .. }),
            "{source:?}"
        );
        let message = source.to_string();
        assert!(
            message.contains(&format!("node 1 ({addr})")) && message.contains("no-such-tenure"),
            "{message}"
        );
        // The rest of the run still stops what it can.
        run.shut_down();
    }

    #[test]
    fn a_fault_on_a_node_that_is_gone_or_does_not_exist_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut run = run_without_nodes(dir.path(), 2);
        let addr = run.cluster.nodes[0].addr.clone();
        // A paused node that is gone by the time it is resumed (killed, or never started).
        let gone = run.act(Action::Resume(0), Duration::ZERO).unwrap_err();
        assert!(
            matches!(&gone, HarnessError::NotRunning { node: 0, .. }),
            "{gone:?}"
        );
        assert!(
            gone.to_string().contains(&format!("node 0 ({addr})")),
            "{gone}"
        );
        let missing = run.cluster.kill(7).unwrap_err();
        assert!(
            matches!(missing, HarnessError::NoSuchNode { node: 7, nodes: 2 }),
            "{missing:?}"
        );
        let link = run.act(Action::Heal(0, 5), Duration::ZERO).unwrap_err();
        assert!(link.to_string().contains("node 5"), "{link}");
    }
}
