//! `tenure`: hold, inspect and release leases; guard a command with a lease.

mod check_cmd;
mod demo_node;
mod exit;
mod lease_cmd;
mod management_cmd;
mod node_cmd;
mod run_cmd;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tenure::cluster::transport::LinkFault;
use tenure::cluster::{ClusterSettings, Incarnation};
use tenure::history::{HistoryFile, HistoryLayer};

use crate::exit::{CliError, Outcome};

/// Distributed leases with fencing tokens.
#[derive(Parser, Debug)]
#[command(name = "tenure", version, about, long_about = None)]
struct Cli {
    /// TOML file overriding config/reference.toml (TENURE_* variables override both).
    #[arg(long, global = true, env = "TENURE_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Acquire, release and inspect leases.
    #[command(subcommand)]
    Lease(LeaseCommand),
    /// Run a cluster node ([cluster] in the config) until SIGTERM or Ctrl-C, then leave
    /// gracefully (a second signal exits at once). Exit 0 after a graceful leave.
    Node {
        /// Append the node's events (JSON Lines, host CLOCK_BOOTTIME) to this file.
        #[arg(long)]
        history: Option<PathBuf>,
    },
    /// Inspect a running cluster through one of its nodes (members and fault speak the
    /// cluster protocol with [cluster] cookie and TLS; shards and leases ask the node's
    /// management endpoint).
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Check a recorded history (docs/history.md): no two owners holding a lease at
    /// overlapping times, tokens increasing, every grant after the previous one ended, no
    /// stale write accepted. Exit 0 safe, 1 a violation (the first is printed with both
    /// events), 2 the history cannot be read.
    Check {
        /// The history file (JSON Lines).
        history: PathBuf,
        /// Print every violation, not only the first.
        #[arg(long)]
        all: bool,
        /// The demo's sharded counter file (`tenure demo node --counter`): also check that
        /// every acknowledged increment was accepted and is still in the counter.
        #[arg(long, value_name = "FILE")]
        counter: Option<PathBuf>,
        /// Durable entities' journal (`tenure demo node --durable-counter`): a SQLite file,
        /// or a `postgres://` URL. Also check, per persistence id, that sequence numbers are
        /// contiguous, every acknowledged command's event is there exactly once, no event
        /// was appended under a token older than its shard's current grant, and every
        /// recovery matches the events.
        #[arg(long, value_name = "PATH|URL")]
        journal: Option<String>,
        /// The PostgreSQL schema of the journal's tables (with a `postgres://` --journal).
        #[arg(long, default_value = "tenure", requires = "journal")]
        journal_schema: String,
        /// How long after resuming a process frozen across its lease deadline may still act
        /// (its entities, singleton instances and accepted writes): at least its stop budget
        /// (stop-timeout + 500 ms). The default fits the reference configuration
        /// (stop-timeout 12 s at the 120 s ttl).
        #[arg(long, default_value = "13s", value_parser = tenure::duration::parse)]
        resume_grace: Duration,
    },
    /// Run a local cluster under load through a scenario of faults and check it was safe.
    ///
    /// Starts --nodes `tenure demo node` processes on 127.0.0.1 (a SQLite lease store in a
    /// temp dir, or --store), hosting a sharded counter with --shards shards and the singleton
    /// `demo`, each node driving increments through its shard region. Once every shard
    /// runs, the scenario plays over --duration with a progress line every second. The
    /// built-in scenario (times as a share of --duration): SIGKILL a node at 15 %, restart
    /// it at 30 %; SIGSTOP a node for twice the ttl at 40 % (its leases expire, others take
    /// over, it resumes and finds them lost); cut the traffic between two nodes for twice
    /// the ttl at 55 %; isolate the oldest node (it hosts the singleton) from the others for
    /// twice the ttl at 67 %; a graceful leave at 75 % and its restart at 82 %; at 90 % a
    /// rolling restart (rolling-restart: each node in turn sent SIGTERM and started again
    /// once the cluster converged, as a deploy does; it runs to its end past --duration).
    /// Every node asks every key every 2 s (open loop), and the summary gives each fault's
    /// fail-over time and the service during it, and the rolling restart's time per node
    /// restarted, requests unanswered and shards moved. Every step moves by
    /// up to ttl/2 and random targets are drawn from --seed. It is written out, with the
    /// scenario file format, in config/demo-scenario.example.toml.
    ///
    /// Then every node leaves, and the summary shows operations acknowledged, fail-over
    /// time per fault, the rolling restart's figures, lease grants and losses, and the safety verdict on the history
    /// (JSON Lines, --history). The HTML report (--report) shows which node held each
    /// shard and the singleton when, with the faults marked. Exit 0 safe, 1 unsafe, 2
    /// error. Ctrl-C stops early and still reports; a second Ctrl-C exits at once.
    #[command(verbatim_doc_comment, args_conflicts_with_subcommands = true)]
    Demo {
        #[command(subcommand)]
        part: Option<DemoCommand>,
        #[command(flatten)]
        args: tenure_cli::demo::DemoArgs,
    },
}

#[derive(Subcommand, Debug)]
enum DemoCommand {
    /// Run one node of the demo's cluster: `tenure node` hosting the demo's examples (ticker
    /// singletons, the sharded counter, client load). The demo and the tests start these.
    Node(Box<demo_node::DemoNodeArgs>),
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// Print a node's view: every member with status, age order, reachability, sessions
    /// and incarnation (oldest first; `*` marks the node asked).
    Members {
        /// The node to ask, as host:port.
        #[arg(long)]
        node: String,
        /// Print the view as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a node's shard map per entity type: each shard's home (the coordinator's
    /// allocation), shards per node, and for the shards the node hosts their lease token and
    /// entity ids. Asks the node's management endpoint (cluster.management.enabled).
    Shards {
        /// The node's management endpoint, as host:port (its cluster.management.bind).
        #[arg(long)]
        node: String,
        /// Only this entity type.
        #[arg(long = "type", value_name = "TYPE")]
        type_name: Option<String>,
        /// Print the endpoint's JSON (a list of shard maps).
        #[arg(long)]
        json: bool,
    },
    /// Pin a shard to a node (external shard allocation): the coordinator moves it there
    /// through the lossless hand-off, allocates it there from then on, and no rebalance
    /// moves it away (while that node cannot take it, it runs elsewhere and comes back).
    /// Asks a node's management endpoint with cluster.management.token. Exit 0 taken, 2
    /// refused (the reason names the shard or node) or no answer.
    PinShard {
        /// A node's management endpoint, as host:port (its cluster.management.bind).
        #[arg(long)]
        node: String,
        /// The entity type.
        #[arg(long = "type", value_name = "TYPE")]
        type_name: String,
        /// The shard id (0 to number-of-shards - 1).
        #[arg(long)]
        shard: String,
        /// The node (cluster address, host:port) to host the shard.
        #[arg(long, required_unless_present = "unpin", conflicts_with = "unpin")]
        to: Option<String>,
        /// Remove the shard's pin: the allocation strategy places it again.
        #[arg(long)]
        unpin: bool,
    },
    /// Resize a sharded daemon process at run time: every worker of the old count stops
    /// before the workers of the new count start, and the count outlives a coordinator
    /// fail-over. Asks a node that runs the daemon through its management endpoint with
    /// cluster.management.token. Exit 0 taken, 2 refused (the reason names the daemon and
    /// the count) or no answer.
    ResizeDaemon {
        /// A node's management endpoint, as host:port (its cluster.management.bind).
        #[arg(long)]
        node: String,
        /// The daemon's name (its entity type is daemon-<name>).
        #[arg(long)]
        daemon: String,
        /// The new number of workers (1 to the daemon's number-of-shards).
        #[arg(long)]
        count: usize,
    },
    /// Print a node's leases: name, state (held, suspended, lost, released, not_granted),
    /// fencing token and for how long. Asks the node's management endpoint.
    Leases {
        /// The node's management endpoint, as host:port (its cluster.management.bind).
        #[arg(long)]
        node: String,
        /// Print the endpoint's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Fault injection (the node needs cluster.fault-injection = true): stall, drop or
    /// resume the node's traffic with a peer. Set both sides of a pair to partition it
    /// (for one-way loss from A to B: A `--mode outbound`, B `--mode inbound`).
    Fault {
        /// The node to change, as host:port.
        #[arg(long)]
        node: String,
        /// Cut traffic with this peer (how: --mode).
        #[arg(long, conflicts_with = "heal", required_unless_present = "heal")]
        cut: Option<String>,
        /// What the cut does: `stall` both directions (the TCP connection stays open,
        /// nothing is lost; heartbeat datagrams are not delivered), only `inbound` or
        /// `outbound` traffic, `drop` (connections reset, dials refused, datagrams
        /// dropped), or `session`: stall the TCP connection both ways while heartbeat
        /// datagrams flow (a link stuck behind data).
        #[arg(long, default_value = "stall", value_parser = ["stall", "inbound", "outbound", "drop", "session"])]
        mode: String,
        /// Resume traffic with this peer.
        #[arg(long)]
        heal: Option<String>,
    },
}

/// Which lease, held by whom, in which config section.
#[derive(Args, Debug, Clone)]
pub struct Target {
    /// The lease name.
    pub name: String,
    /// The owner to acquire or release for (default: <hostname>/<pid>).
    #[arg(long)]
    pub owner: Option<String>,
    /// The lease section of the config (default: [tenure] default-lease-section).
    #[arg(long)]
    pub section: Option<String>,
}

#[derive(Subcommand, Debug)]
enum LeaseCommand {
    /// Try once to acquire a lease. Exit 0 granted, 1 held by another owner, 2 error.
    /// Without --hold the grant is not renewed and lapses after heartbeat-timeout.
    Acquire {
        #[command(flatten)]
        target: Target,
        /// Wait until granted, keep renewing until Ctrl-C (or SIGTERM), then release.
        /// Exit 3 if the lease is lost meanwhile, or given up for a higher priority.
        #[arg(long)]
        hold: bool,
        /// Free text kept with the grant (who and why), shown by `lease show`, and sent
        /// with preemption requests.
        #[arg(long, visible_alias = "message")]
        note: Option<String>,
        #[command(flatten)]
        priority: lease_cmd::PriorityArgs,
    },
    /// Campaign in the election NAME with --value, lead until Ctrl-C (or SIGTERM), then
    /// resign. Prints "elected NAME as OWNER token=T value=V" once leading. Exit 0 resigned,
    /// 1 interrupted before being elected, 3 the leadership was lost, 2 error.
    Elect {
        #[command(flatten)]
        target: Target,
        /// The value the leader announces (etcd's campaign value), shown by `lease observe`
        /// and `lease show` (as the note).
        #[arg(long)]
        value: String,
    },
    /// Print the leader of the election NAME, then each change (owner, token, value), until
    /// Ctrl-C (or SIGTERM), or after --count leaders. Exit 0, 2 error.
    Observe {
        name: String,
        #[arg(long)]
        section: Option<String>,
        /// Stop after printing this many leaders (the first is the current one).
        #[arg(long)]
        count: Option<usize>,
    },
    /// Release a lease held by --owner. A grant its holder still renews (`acquire --hold`,
    /// `run`, `elect`, a node) is refused unless --force; a one-shot grant of `acquire`
    /// (not renewed) is released. Exit 0 released, 1 not released (not held by that owner,
    /// or renewed by its holder and no --force), 2 error.
    Release {
        #[command(flatten)]
        target: Target,
        /// Release a grant its holder still renews. That holder learns of it only at its
        /// next renewal and may act on the lease until then, while another owner can be
        /// granted it at once: only fencing tokens protect resources meanwhile.
        #[arg(long)]
        force: bool,
    },
    /// Show the holder of a lease. Exit 0 held, 1 free, 2 error.
    Show {
        name: String,
        #[arg(long)]
        section: Option<String>,
    },
    /// List held leases whose names start with PREFIX.
    List {
        #[arg(default_value = "")]
        prefix: String,
        #[arg(long)]
        section: Option<String>,
    },
    /// Wait for the lease, run COMMAND while holding it (with TENURE_LEASE_NAME and
    /// TENURE_LEASE_TOKEN set), release when it exits, and exit with its status. COMMAND
    /// is every process it starts, also those that leave its process group (setsid,
    /// daemons): when it exits, what it left running gets SIGTERM, then SIGKILL after
    /// --grace, and the lease is released once none is left. If the lease is lost, all of
    /// COMMAND gets the same before the local deadline; exit 3. The same happens when a
    /// higher priority asks for the lease (its cleanup timeout defaults to
    /// heartbeat-interval + --grace + 200ms).
    Run {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        priority: lease_cmd::PriorityArgs,
        /// Time COMMAND's processes get between SIGTERM and SIGKILL when they are ended:
        /// on a loss, a preemption, SIGINT or SIGTERM to tenure, and (unless
        /// --let-children-outlive-lease) when its first process exits leaving others.
        #[arg(long, default_value = "2s", value_parser = tenure::duration::parse)]
        grace: Duration,
        /// Release as soon as COMMAND's first process exits, leaving what it started
        /// (background jobs, daemons) running unguarded: they may run on while another
        /// holder is granted the lease. A loss or a preemption still ends them.
        #[arg(long)]
        let_children_outlive_lease: bool,
        /// Append the lease's events and the command's start and stop to this history
        /// (JSON Lines, docs/history.md; `node` is the owner), for `tenure check`.
        #[arg(long)]
        history: Option<PathBuf>,
        /// The command and its arguments.
        #[arg(trailing_var_arg = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
}

/// Installs the process's one subscriber: the log (stderr, filtered by `TENURE_LOG`, default
/// `warn`) and, when given, the history writer. The log leaves history events to the writer.
fn init_tracing(history: Option<HistoryLayer>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer};
    let filter = EnvFilter::try_from_env("TENURE_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    let filter = match format!("{}=off", tenure::history::TARGET).parse() {
        Ok(no_history) => filter.add_directive(no_history),
        Err(_) => filter,
    };
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(filter);
    tracing_subscriber::registry()
        .with(log)
        .with(history.map(HistoryLayer::filtered))
        .init();
}

/// The history writer of a command given `--history FILE`, to install before the command
/// runs: its events are about the node (`node`, `demo node`: its cluster address) or the
/// owner (`lease run`), as this process's `incarnation`.
fn history_writer(
    command: &Command,
    config: &tenure::TenureConfig,
    incarnation: Incarnation,
) -> Result<Option<HistoryLayer>, CliError> {
    let node = |config| Ok::<_, CliError>(ClusterSettings::from_config(config)?.addr.to_string());
    let (path, about) = match command {
        Command::Node {
            history: Some(path),
        } => (path, node(config)?),
        Command::Demo {
            part: Some(DemoCommand::Node(args)),
            ..
        } => match &args.history {
            Some(path) => (path, node(config)?),
            None => return Ok(None),
        },
        Command::Lease(LeaseCommand::Run {
            history: Some(path),
            target,
            ..
        }) => (path, lease_cmd::owner_of(target)),
        _ => return Ok(None),
    };
    let file = HistoryFile::open(path)?;
    Ok(Some(HistoryLayer::new(
        file,
        about,
        incarnation.to_string(),
    )))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Check {
        history,
        all,
        counter,
        journal,
        journal_schema,
        resume_grace,
    } = &cli.command
    {
        init_tracing(None);
        let journal = journal
            .as_deref()
            .map(|spec| (spec, journal_schema.as_str()));
        return check_cmd::check(history, *all, counter.as_deref(), journal, *resume_grace)
            .exit_code();
    }
    // The demo drives processes from plain threads; it needs neither a runtime nor a config.
    if let Command::Demo { part: None, args } = cli.command {
        init_tracing(None);
        return match tenure_cli::demo::run(args) {
            Ok(outcome) if outcome.safe() => Outcome::Success.exit_code(),
            Ok(_) => Outcome::No.exit_code(),
            Err(e) => {
                eprintln!("tenure: error: {e}");
                Outcome::Error.exit_code()
            }
        };
    }
    // Lease commands run single-threaded on purpose: `lease run` spawns its command from
    // the main thread, which lives as long as the process, so the command's parent-death
    // signal fires only when the process dies. A node serves many peers: multi-threaded.
    let runtime = match cli.command {
        Command::Lease(_) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Command::Node { .. }
        | Command::Cluster(_)
        | Command::Check { .. }
        | Command::Demo { .. } => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
    };
    let node = matches!(cli.command, Command::Node { .. } | Command::Demo { .. });
    let result = match runtime {
        Ok(rt) => {
            let result = rt.block_on(run(cli));
            if node {
                // A node's runtime is not shut down: that waits for every task, and code
                // blocking a thread (an entity that outlived its kill) would hold the exit
                // up, running on while the leases it ran under lapse. The process ends
                // with main, and every thread with it; what it still held expires.
                std::mem::forget(rt);
            }
            result
        }
        Err(e) => Err(CliError::Command(format!(
            "cannot start the async runtime: {e}"
        ))),
    };
    match result {
        Ok(outcome) => outcome.exit_code(),
        Err(e) => {
            eprintln!("tenure: error: {e}");
            Outcome::Error.exit_code()
        }
    }
}

async fn run(cli: Cli) -> Result<Outcome, CliError> {
    let config = tenure::TenureConfig::load(cli.config.as_deref())?;
    let incarnation = Incarnation::new();
    init_tracing(history_writer(&cli.command, &config, incarnation)?);
    let provider = tenure::provider(config)?;
    match cli.command {
        Command::Lease(cmd) => match cmd {
            LeaseCommand::Acquire {
                target,
                hold,
                note,
                priority,
            } => {
                let options = priority.options();
                if hold {
                    lease_cmd::hold(&provider, &target, note, options).await
                } else {
                    lease_cmd::acquire_once(&provider, &target, note, options).await
                }
            }
            LeaseCommand::Elect { target, value } => {
                lease_cmd::elect(&provider, &target, value).await
            }
            LeaseCommand::Observe {
                name,
                section,
                count,
            } => lease_cmd::observe(&provider, &name, section.as_deref(), count).await,
            LeaseCommand::Release { target, force } => {
                lease_cmd::release(&provider, &target, force).await
            }
            LeaseCommand::Show { name, section } => {
                lease_cmd::show(&provider, &name, section.as_deref()).await
            }
            LeaseCommand::List { prefix, section } => {
                lease_cmd::list(&provider, &prefix, section.as_deref()).await
            }
            LeaseCommand::Run {
                target,
                priority,
                grace,
                let_children_outlive_lease,
                history: _,
                command,
            } => {
                let guard = run_cmd::Guard {
                    grace,
                    options: priority.options(),
                    let_children_outlive_lease,
                };
                run_cmd::run(&provider, &target, guard, &command).await
            }
        },
        Command::Node { .. } => {
            node_cmd::node(provider.config(), &provider, incarnation, async |_, _| {
                Ok(())
            })
            .await
        }
        Command::Demo {
            part: Some(DemoCommand::Node(args)),
            ..
        } => demo_node::run(provider.config(), &provider, *args, incarnation).await,
        Command::Cluster(ClusterCommand::Members { node, json }) => {
            node_cmd::members(provider.config(), &node, json).await
        }
        Command::Cluster(ClusterCommand::Shards {
            node,
            type_name,
            json,
        }) => management_cmd::shards(&node, type_name.as_deref(), json).await,
        Command::Cluster(ClusterCommand::PinShard {
            node,
            type_name,
            shard,
            to,
            unpin: _,
        }) => {
            management_cmd::pin_shard(provider.config(), &node, &type_name, &shard, to.as_deref())
                .await
        }
        Command::Cluster(ClusterCommand::ResizeDaemon {
            node,
            daemon,
            count,
        }) => management_cmd::resize_daemon(provider.config(), &node, &daemon, count).await,
        Command::Cluster(ClusterCommand::Leases { node, json }) => {
            management_cmd::leases(&node, json).await
        }
        Command::Cluster(ClusterCommand::Fault {
            node,
            cut,
            mode,
            heal,
        }) => match (cut, heal) {
            (Some(peer), _) => {
                let fault = match mode.as_str() {
                    "inbound" => LinkFault::StallInbound,
                    "outbound" => LinkFault::StallOutbound,
                    "drop" => LinkFault::Drop,
                    "session" => LinkFault::StallSession,
                    _ => LinkFault::Stall,
                };
                node_cmd::fault(provider.config(), &node, &peer, fault).await
            }
            (None, Some(peer)) => {
                node_cmd::fault(provider.config(), &node, &peer, LinkFault::None).await
            }
            (None, None) => Err(CliError::Command("give --cut PEER or --heal PEER".into())),
        },
        Command::Check { .. } => unreachable!("main checks without a runtime"),
        Command::Demo { part: None, .. } => {
            unreachable!("main runs the demo without a runtime")
        }
    }
}
