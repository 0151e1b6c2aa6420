//! Multi-process cluster harness: N `tenure node` (or, hosting the examples, `tenure demo
//! node`) processes on 127.0.0.1 sharing a temp SQLite store (or the store of a given lease
//! config), with faults (SIGKILL, SIGSTOP/SIGCONT, graceful stop, restart, link cuts)
//! recorded in the shared history, and the nodes' views and histories for assertions. Used
//! by `tenure demo`; the multi-process tests and the fail-over benchmarks reach it through
//! the test kit (`tenure_test_kit::cli::cluster`).
//!
//! What a run can meet (a node that does not start, a signal to a node that is gone, a
//! fault the node refused) is a [`HarnessError`] naming the node and what failed: the demo
//! reports it as a failed step; the test kit's wrapper panics with it. A node whose process
//! ends by itself (a panic, an exit, `abort(3)` when something outlived its kill under a
//! lease being lost) is seen without being reaped ([`Cluster::ended`]): it no longer counts
//! as running, and [`HarnessError::Ended`] says how it ended with its log's tail.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::net::{AddressFamily, SocketFlags, SocketType};
use rustix::process::{Pid, Signal, kill_process, set_parent_process_death_signal};
use serde_json::Value;
use tenure::history::{Entry, Event, HistoryFile, Link};

/// Timing of harness clusters: member lease ttl 3 s (renewed every 500 ms), membership
/// listed every 300 ms, heartbeats every 250 ms, unreachable after 1.5 s of silence.
pub const MEMBER_TTL: Duration = Duration::from_secs(3);
/// How long a member's heartbeats may stay silent before it is unreachable.
pub const UNREACHABLE_AFTER: Duration = Duration::from_millis(1500);

/// Why the harness could not do what it was asked; names the node (index and address), the
/// fault or the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// The cluster's temporary directory could not be created.
    #[error("cannot create the cluster's temporary directory: {0}")]
    TempDir(#[source] std::io::Error),
    /// Not enough free loopback ports for the nodes.
    #[error("found {found} of {wanted} free loopback ports in 20000-31999")]
    Ports {
        /// How many were wanted.
        wanted: usize,
        /// How many were free.
        found: usize,
    },
    /// A node's config file could not be written or read.
    #[error("node config {path}: {source}")]
    Config {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The cluster has no node of that index.
    #[error("node {node}: no such node (the cluster has {nodes})")]
    NoSuchNode {
        /// The index asked for.
        node: usize,
        /// How many nodes there are.
        nodes: usize,
    },
    /// The node is not running (never started, killed or stopped), so it cannot be
    /// signalled, killed or stopped.
    #[error("node {node} ({addr}) is not running")]
    NotRunning {
        /// The node's index.
        node: usize,
        /// Its cluster address.
        addr: String,
    },
    /// The node is running already, so it cannot be started.
    #[error("node {node} ({addr}) is already running")]
    AlreadyRunning {
        /// The node's index.
        node: usize,
        /// Its cluster address.
        addr: String,
    },
    /// A `tenure` process could not be run for the node (the node itself, or a command
    /// asking it).
    #[error("node {node} ({addr}): cannot run {binary} {what}: {source}")]
    Process {
        /// The node's index.
        node: usize,
        /// Its cluster address.
        addr: String,
        /// The executable.
        binary: PathBuf,
        /// Which command (`node`, `cluster fault`, …).
        what: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The node exited (or was made to) before its "started" line.
    #[error("node {node} ({addr}) did not start (attempt {attempt}): {output}")]
    NotStarted {
        /// The node's index.
        node: usize,
        /// Its cluster address.
        addr: String,
        /// Which attempt failed last.
        attempt: u32,
        /// What it wrote (its first stdout line and its whole stderr).
        output: String,
    },
    /// A signal could not be sent to the node's process.
    #[error("{signal} to node {node} ({addr}): {source}")]
    Signal {
        /// The node's index.
        node: usize,
        /// Its cluster address.
        addr: String,
        /// The signal, e.g. `SIGSTOP`.
        signal: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The node did not exit within its time after SIGTERM (it was killed then).
    #[error("node {node} ({addr}) did not exit within {waited:?} of SIGTERM:\n{stderr}")]
    NoExit {
        /// The node's index.
        node: usize,
        /// Its cluster address.
        addr: String,
        /// How long the harness waited.
        waited: Duration,
        /// Everything the node wrote to stderr.
        stderr: String,
    },
    /// The node refused a link fault (`tenure cluster fault`).
    #[error("fault `{fault}` on node {node} ({addr}) failed (attempt {attempt}): {stderr}")]
    Fault {
        /// The node's index.
        node: usize,
        /// Its cluster address.
        addr: String,
        /// The fault's arguments, e.g. `--cut 127.0.0.1:20001 --mode stall`.
        fault: String,
        /// Which attempt failed last.
        attempt: u32,
        /// What the command wrote to stderr.
        stderr: String,
    },
    /// The node's process ended by itself (the harness neither killed nor stopped it, and
    /// had not reaped it yet).
    #[error("node {node} ({addr}) ended by itself: {end}; its log ends:\n{log_tail}")]
    Ended {
        /// The node's index.
        node: usize,
        /// Its cluster address.
        addr: String,
        /// How it ended.
        end: NodeEnd,
        /// The last lines it wrote to stderr.
        log_tail: String,
    },
    /// The shared history could not be appended to or read.
    #[error("history {path}: {detail}")]
    History {
        /// The history file.
        path: PathBuf,
        /// What failed (the I/O error, or the malformed line).
        detail: String,
    },
}

/// Extra `[cluster]` and top-level TOML for every node of a cluster.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Lines appended inside `[cluster]` (e.g. `seeds = []` for one node).
    pub cluster_extra: String,
    /// TOML appended after everything (e.g. a `[cluster.tls]` table).
    pub tail: String,
    /// `(key, value)` pairs replacing the harness's own `key = …` lines
    /// (e.g. `("member-lease-ttl", "\"10s\"")`).
    pub overrides: Vec<(String, String)>,
    /// Arguments of `tenure demo node` (e.g. `--singleton s1`): with any, the nodes run
    /// `tenure demo node` with them, hosting the demo's examples; without, `tenure node`.
    pub node_args: Vec<String>,
    /// The shared history file (default: `history.jsonl` in the cluster's temp dir, which
    /// is removed with the cluster).
    pub history: Option<PathBuf>,
    /// TOML replacing the harness's `[tenure]` and `[lease.sqlite]` tables: the lease
    /// configuration of another store (its `[tenure] default-lease-section` names the
    /// section the nodes use).
    pub lease: Option<String>,
    /// Nodes run in their own process group (the terminal's Ctrl-C reaches only the
    /// harness's process, which stops them) and die with the thread that started them.
    pub supervised: bool,
}

/// One node of a harness cluster: its address, config and arguments, and its process
/// while it runs.
pub struct NodeProc {
    /// `127.0.0.1:<port>`: the node's cluster address and lease owner.
    pub addr: String,
    /// Extra arguments of `tenure node` (after the config), used at every start.
    pub args: Vec<String>,
    /// The node's cluster port.
    pub port: u16,
    /// The node's config file.
    pub config: PathBuf,
    /// The port, held until the node's first start takes it over.
    hold: Option<PortHold>,
    child: Option<Child>,
    stderr: Arc<Mutex<String>>,
    supervised: bool,
    /// Incarnations of this address, one per start, from the node's "started" line.
    pub incarnations: Vec<String>,
    /// Extra environment of the node's process (e.g. a `faketime` preload).
    pub env: Vec<(String, String)>,
}

impl NodeProc {
    /// The running process's id; `None` when the node is not running.
    pub fn pid(&self) -> Option<Pid> {
        self.child.as_ref().map(Pid::from_child)
    }

    /// Everything the node wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Lets the port held for the node's first start go early (for tests of what a start
    /// does when something else takes it first).
    pub fn release_port(&mut self) {
        self.hold = None;
    }

    /// The incarnation of the latest start; `None` before the first.
    pub fn incarnation(&self) -> Option<&str> {
        self.incarnations.last().map(String::as_str)
    }
}

/// How a node's process ended by itself, as `waitid(2)` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeEnd {
    /// It exited with this status.
    Exited(i32),
    /// A signal ended it (`abort(3)` is SIGABRT, 6).
    Signaled(i32),
}

impl NodeEnd {
    /// Whether it ended by `abort(3)`: how a node ends itself when something outlived its
    /// kill under a lease being lost (`when-kill-fails = "abort"`).
    pub fn aborted(self) -> bool {
        self == NodeEnd::Signaled(Signal::ABORT.as_raw())
    }
}

impl std::fmt::Display for NodeEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeEnd::Exited(code) => write!(f, "exit status {code}"),
            NodeEnd::Signaled(signal) if self.aborted() => {
                write!(f, "signal {signal} (SIGABRT: abort(3))")
            }
            NodeEnd::Signaled(signal) => write!(f, "signal {signal}"),
        }
    }
}

/// One member of a node's view.
#[derive(Debug, Clone)]
pub struct Row {
    /// The member's cluster address.
    pub addr: String,
    /// `joining`, `up`, `leaving`, `down`.
    pub status: String,
    /// Whether the node hears its heartbeats.
    pub reachable: bool,
    /// The member's incarnation.
    pub incarnation: u64,
    /// Open ractor sessions with it (1 when the mesh is healthy).
    pub sessions: u64,
}

/// A local cluster of `tenure node` (or `tenure demo node`) processes; dropping it kills
/// every node still running.
pub struct Cluster {
    /// The cluster's temporary directory (configs, store, counter); removed when dropped.
    pub dir: tempfile::TempDir,
    /// The nodes, by index.
    pub nodes: Vec<NodeProc>,
    /// The history file every node appends to.
    pub history: PathBuf,
    /// The `tenure` executable the nodes run.
    pub binary: PathBuf,
    store: PathBuf,
    /// Dropped last, once every node is gone.
    _turn: ClusterTurn,
}

impl Cluster {
    /// The fenced counter file the demo's singletons and sharded counters write.
    pub fn counter_file(&self) -> PathBuf {
        self.dir.path().join("counter.sqlite")
    }

    /// The SQLite lease file of the nodes' default `[lease.sqlite]` section.
    pub fn lease_store(&self) -> &Path {
        &self.store
    }
}

/// The `p` quantile (0..=1) of `v` (sorted in place), for benchmark reports.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// A loopback port held for a node until the node takes it over, for TCP and UDP alike (a
/// node takes both: sessions and heartbeat datagrams): a TCP socket bound but not listening
/// (a dial to it is refused, as to a stopped node) and a UDP socket, neither with
/// `SO_REUSEADDR`, so that no other socket can bind the port while it is held.
#[derive(Debug)]
pub struct PortHold {
    port: u16,
    tcp: Option<OwnedFd>,
    /// Held for as long as the hold lives.
    _udp: std::net::UdpSocket,
}

impl PortHold {
    /// Holds `port` on 127.0.0.1, or `None` when anything has it (TCP or UDP).
    fn take(port: u16) -> Option<PortHold> {
        let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
        let tcp = rustix::net::socket_with(
            AddressFamily::INET,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )
        .ok()?;
        rustix::net::bind(&tcp, &addr).ok()?;
        let udp = std::net::UdpSocket::bind(addr).ok()?;
        Some(PortHold {
            port,
            tcp: Some(tcp),
            _udp: udp,
        })
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Lets the TCP port go and keeps holding the UDP one.
    pub fn release_tcp(&mut self) {
        self.tcp = None;
    }
}

/// `n` distinct loopback ports, each held (see [`PortHold`]) until dropped;
/// [`HarnessError::Ports`] when fewer are free.
pub fn hold_ports(n: usize) -> Result<Vec<PortHold>, HarnessError> {
    // Below Linux's ephemeral range (32768-60999 by default): a port handed out by
    // `bind(:0)` or taken by an outgoing connection of any other process could be that
    // range's, and a node restarted on its port after a kill would find it taken. Random,
    // so that harnesses running at the same time rarely pick the same ones.
    let mut held: Vec<PortHold> = Vec::with_capacity(n);
    for _ in 0..1000 {
        if held.len() == n {
            break;
        }
        if let Some(hold) = PortHold::take(fastrand::u16(20_000..32_000)) {
            held.push(hold);
        }
    }
    if held.len() < n {
        return Err(HarnessError::Ports {
            wanted: n,
            found: held.len(),
        });
    }
    Ok(held)
}

/// One held port.
fn one_port() -> Result<PortHold, HarnessError> {
    hold_ports(1)?.pop().ok_or(HarnessError::Ports {
        wanted: 1,
        found: 0,
    })
}

/// One cluster at a time in a process: a harness cluster takes the turn when configured
/// and gives it back when dropped, so that the tests of one binary run their clusters one
/// after the other (several at once on a 2-core machine starve each other's heartbeats).
/// Tests that start clusters by other means (the `tenure demo` command) take it themselves.
pub struct ClusterTurn(());

static TURN: Mutex<Option<std::thread::ThreadId>> = Mutex::new(None);
static TURN_FREED: std::sync::Condvar = std::sync::Condvar::new();

impl ClusterTurn {
    /// Waits for the turn. Panics when this thread holds it already (two clusters of one
    /// test would wait for each other forever).
    pub fn take() -> ClusterTurn {
        let me = std::thread::current().id();
        let mut holder = TURN.lock().unwrap_or_else(|e| e.into_inner());
        assert!(
            *holder != Some(me),
            "this thread runs a harness cluster already: one cluster at a time"
        );
        while holder.is_some() {
            holder = TURN_FREED.wait(holder).unwrap_or_else(|e| e.into_inner());
        }
        *holder = Some(me);
        ClusterTurn(())
    }
}

impl Drop for ClusterTurn {
    fn drop(&mut self) {
        *TURN.lock().unwrap_or_else(|e| e.into_inner()) = None;
        TURN_FREED.notify_one();
    }
}

impl Cluster {
    /// Writes configs for `n` nodes of `binary` (seed: node 0) without starting them, each
    /// on a port held until its first start. Waits for this process's [`ClusterTurn`].
    pub fn configure(binary: &Path, n: usize, options: &Options) -> Result<Cluster, HarnessError> {
        let turn = ClusterTurn::take();
        let dir = tempfile::tempdir().map_err(HarnessError::TempDir)?;
        let store = dir.path().join("leases.sqlite");
        let history = options
            .history
            .clone()
            .unwrap_or_else(|| dir.path().join("history.jsonl"));
        let mut c = Cluster {
            dir,
            nodes: Vec::new(),
            history,
            binary: binary.to_path_buf(),
            store,
            _turn: turn,
        };
        let mut ports = hold_ports(n)?.into_iter();
        if let Some(first) = ports.next() {
            let seed = first.addr();
            c.add_node_on(first, &seed, options)?;
            for hold in ports {
                c.add_node_on(hold, &seed, options)?;
            }
        }
        Ok(c)
    }

    /// Adds (without starting) a node with `seed` and extra options, on a port held until
    /// its first start.
    /// Returns its index.
    pub fn add_node(&mut self, seed: &str, options: &Options) -> Result<usize, HarnessError> {
        let hold = one_port()?;
        self.add_node_on(hold, seed, options)
    }

    fn add_node_on(
        &mut self,
        hold: PortHold,
        seed: &str,
        options: &Options,
    ) -> Result<usize, HarnessError> {
        let i = self.nodes.len();
        let port = hold.port();
        let config = self.dir.path().join(format!("node{i}.toml"));
        let lease = options.lease.clone().unwrap_or_else(|| {
            format!(
                r#"[tenure]
default-lease-section = "sqlite"

[lease.sqlite]
path = "{store}"
heartbeat-timeout = "3s"
heartbeat-interval = "500ms"
lease-retry-interval = "300ms"
lease-operation-timeout = "1500ms"
"#,
                store = self.store.display()
            )
        });
        let text = format!(
            r#"{lease}
[cluster]
host = "127.0.0.1"
port = {port}
cookie = "harness-cookie-0123456789abcdef0123"
seeds = ["{seed}"]
member-lease-ttl = "3s"
member-lease-interval = "500ms"
membership-interval = "300ms"
peer-heartbeat-interval = "250ms"
unreachable-after = "1500ms"
reconnect-backoff-min = "100ms"
reconnect-backoff-max = "1s"
dial-timeout = "1s"
leave-timeout = "3s"
fault-injection = true
{extra}

[cluster.split-brain-resolver]
stable-after = "1500ms"

[cluster.split-brain-resolver.lease-majority]
acquire-lease-delay-for-minority = "1s"
release-after = "10s"
{tail}
"#,
            extra = options.cluster_extra,
            tail = options.tail,
        );
        let text: String = text
            .lines()
            .map(|line| {
                let key = line.split(" = ").next().unwrap_or_default();
                match options.overrides.iter().find(|(k, _)| k == key) {
                    Some((k, v)) => format!("{k} = {v}\n"),
                    None => format!("{line}\n"),
                }
            })
            .collect();
        std::fs::write(&config, text).map_err(|source| HarnessError::Config {
            path: config.clone(),
            source,
        })?;
        let mut args = options.node_args.clone();
        if args
            .iter()
            .any(|a| a == "--singleton" || a == "--sharded-counter")
        {
            args.push("--counter".into());
            args.push(self.dir.path().join("counter.sqlite").display().to_string());
        }
        self.nodes.push(NodeProc {
            args,
            addr: format!("127.0.0.1:{port}"),
            port,
            config,
            hold: Some(hold),
            child: None,
            stderr: Arc::new(Mutex::new(String::new())),
            supervised: options.supervised,
            incarnations: Vec::new(),
            env: Vec::new(),
        });
        Ok(i)
    }

    /// Starts every configured node, one after the other; stops at the first that does not
    /// start.
    pub fn start_all(&mut self) -> Result<(), HarnessError> {
        for i in 0..self.nodes.len() {
            self.spawn(i)?;
        }
        Ok(())
    }

    /// Node `i`, or [`HarnessError::NoSuchNode`].
    fn node(&self, i: usize) -> Result<&NodeProc, HarnessError> {
        self.nodes.get(i).ok_or(HarnessError::NoSuchNode {
            node: i,
            nodes: self.nodes.len(),
        })
    }

    /// [`HarnessError::NotRunning`] for node `i`.
    fn not_running(&self, i: usize) -> HarnessError {
        HarnessError::NotRunning {
            node: i,
            addr: self.nodes[i].addr.clone(),
        }
    }

    /// A `tenure` command with node `i`'s config.
    pub fn command(&self, i: usize, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--config").arg(&self.nodes[i].config).args(args);
        cmd.env_remove("TENURE_CONFIG");
        cmd
    }

    /// Starts (or restarts) node `i` and waits for its "started" line. A first start whose
    /// port was taken in the moment between the harness letting it go and the node binding
    /// it moves the node to another held port (when no running node seeds from it); a
    /// restart, whose address is the node's identity, tries the same port again.
    /// [`HarnessError::NotStarted`] (with the node's output) when it still does not start.
    pub fn spawn(&mut self, i: usize) -> Result<(), HarnessError> {
        const ATTEMPTS: u32 = 10;
        self.node(i)?;
        let mut attempt = 1;
        loop {
            let output = match self.spawn_once(i)? {
                None => return Ok(()),
                Some(output) => output,
            };
            let taken = output.contains(&format!("cannot listen on {}", self.nodes[i].addr))
                && output.contains("Address already in use");
            if !taken || attempt == ATTEMPTS {
                return Err(HarnessError::NotStarted {
                    node: i,
                    addr: self.nodes[i].addr.clone(),
                    attempt,
                    output,
                });
            }
            if self.nodes[i].incarnations.is_empty() && !self.seeded_by_running(i) {
                self.move_node(i)?;
            } else {
                std::thread::sleep(Duration::from_millis(200) * attempt);
            }
            attempt += 1;
        }
    }

    /// Whether a running node has node `i` among its seeds.
    fn seeded_by_running(&self, i: usize) -> bool {
        let addr = format!("\"{}\"", self.nodes[i].addr);
        (0..self.nodes.len()).any(|j| {
            j != i
                && self.is_running(j)
                && std::fs::read_to_string(&self.nodes[j].config)
                    .is_ok_and(|text| text.contains(&addr))
        })
    }

    /// Moves node `i`, never started, to a newly held port: its config and the seeds of
    /// every node not running.
    fn move_node(&mut self, i: usize) -> Result<(), HarnessError> {
        let hold = one_port()?;
        let (old_port, old) = (self.nodes[i].port, self.nodes[i].addr.clone());
        let new = hold.addr();
        for j in (0..self.nodes.len()).filter(|j| !self.is_running(*j)) {
            let config = &self.nodes[j].config;
            let config_err = |source| HarnessError::Config {
                path: config.clone(),
                source,
            };
            let mut text = std::fs::read_to_string(config).map_err(config_err)?;
            if j == i {
                text = text.replace(
                    &format!("\nport = {old_port}\n"),
                    &format!("\nport = {}\n", hold.port()),
                );
            }
            std::fs::write(
                config,
                text.replace(&format!("\"{old}\""), &format!("\"{new}\"")),
            )
            .map_err(config_err)?;
        }
        let node = &mut self.nodes[i];
        node.port = hold.port();
        node.addr = new;
        node.hold = Some(hold);
        Ok(())
    }

    /// Starts node `i` once: `Ok(None)` once it said "started", `Ok(Some(output))` (its
    /// first stdout line and its stderr) when it exited before.
    fn spawn_once(&mut self, i: usize) -> Result<Option<String>, HarnessError> {
        if self.nodes[i].child.is_some() {
            return Err(HarnessError::AlreadyRunning {
                node: i,
                addr: self.nodes[i].addr.clone(),
            });
        }
        let node: &[&str] = if self.nodes[i].args.is_empty() {
            &["node", "--history"]
        } else {
            &["demo", "node", "--history"]
        };
        let mut cmd = self.command(i, node);
        cmd.arg(&self.history)
            .args(&self.nodes[i].args)
            .env(
                "TENURE_LOG",
                std::env::var("TENURE_NODE_LOG")
                    .unwrap_or_else(|_| "info,ractor_cluster=warn,ractor=warn".into()),
            )
            .envs(self.nodes[i].env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if self.nodes[i].supervised {
            cmd.process_group(0);
            // SAFETY: prctl(2) is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                cmd.pre_exec(|| Ok(set_parent_process_death_signal(Some(Signal::KILL))?));
            }
        }
        // The node binds the port itself: let it go at the last moment.
        self.nodes[i].hold = None;
        let process_err = |source| HarnessError::Process {
            node: i,
            addr: self.nodes[i].addr.clone(),
            binary: self.binary.clone(),
            what: node.join(" "),
            source,
        };
        let mut child = cmd.spawn().map_err(process_err)?;
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(process_err(std::io::Error::other(
                "no piped stdout or stderr",
            )));
        };
        let mut stdout = BufReader::new(stdout);
        let sink = Arc::new(Mutex::new(String::new()));
        let sink2 = sink.clone();
        // For a run being traced: every node's log, also kept in a file per port.
        let mut copy = std::env::var_os("TENURE_NODE_LOG_DIR").and_then(|dir| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(Path::new(&dir).join(format!("{}.log", self.nodes[i].port)))
                .ok()
        });
        let drain = std::thread::spawn(move || {
            let mut r = BufReader::new(stderr);
            let mut buf = String::new();
            while let Ok(n) = r.read_line(&mut buf) {
                if n == 0 {
                    break;
                }
                if let Some(f) = &mut copy {
                    let _ = f.write_all(buf.as_bytes());
                }
                sink2
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push_str(&buf);
                buf.clear();
            }
        });
        let mut line = String::new();
        // A failed read leaves `line` without an incarnation: handled as an early exit.
        let _ = stdout.read_line(&mut line);
        let inc = line
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .find(|w| w[0] == "incarnation")
            .map(|w| w[1].to_string());
        let Some(inc) = inc else {
            // Its whole stderr: the node has exited (or is made to).
            let _ = child.kill();
            let _ = child.wait();
            let _ = drain.join();
            let stderr = sink.lock().unwrap_or_else(|e| e.into_inner()).clone();
            return Ok(Some(format!("stdout {line:?}, stderr:\n{stderr}")));
        };
        // Keep draining stdout so the node never blocks on a full pipe.
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut stdout, &mut std::io::sink());
        });
        let node = &mut self.nodes[i];
        node.incarnations.push(inc);
        node.stderr = sink;
        node.child = Some(child);
        Ok(None)
    }

    /// Whether node `i` was started, not killed or stopped since, and its process has not
    /// ended by itself (`false` for no such node).
    pub fn is_running(&self, i: usize) -> bool {
        self.nodes.get(i).is_some_and(|n| n.child.is_some()) && self.ended(i).is_none()
    }

    /// How node `i`'s process ended by itself, when it did: it was started, the harness
    /// has neither killed, stopped nor reaped it, and the process is gone. `None` while it
    /// runs (or is frozen), and for a node not started or already reaped. Only looks:
    /// [`Cluster::reap_ended`] or [`Cluster::wait_exit`] reap it.
    pub fn ended(&self, i: usize) -> Option<NodeEnd> {
        let pid = self.nodes.get(i)?.pid()?;
        // WNOWAIT leaves the child waitable, so that `Child::wait` still reaps it.
        let options = rustix::process::WaitIdOptions::EXITED
            | rustix::process::WaitIdOptions::NOHANG
            | rustix::process::WaitIdOptions::NOWAIT;
        let status = rustix::process::waitid(rustix::process::WaitId::Pid(pid), options).ok()??;
        match (status.exit_status(), status.terminating_signal()) {
            (Some(code), _) => Some(NodeEnd::Exited(code)),
            (None, Some(signal)) => Some(NodeEnd::Signaled(signal)),
            (None, None) => None,
        }
    }

    /// [`HarnessError::Ended`] for the first node whose process ended by itself without the
    /// harness reaping it (see [`Cluster::ended`]), with the tail of its log; `Ok` when
    /// every started node still runs.
    pub fn check_none_ended(&self) -> Result<(), HarnessError> {
        for i in 0..self.nodes.len() {
            if let Some(end) = self.ended(i) {
                return Err(self.ended_error(i, end));
            }
        }
        Ok(())
    }

    /// [`HarnessError::Ended`] for node `i`, which ended by `end`.
    fn ended_error(&self, i: usize, end: NodeEnd) -> HarnessError {
        HarnessError::Ended {
            node: i,
            addr: self.nodes[i].addr.clone(),
            end,
            log_tail: self.log_tail(i, 40),
        }
    }

    /// The last `lines` lines node `i` wrote to stderr (its latest start's).
    pub fn log_tail(&self, i: usize, lines: usize) -> String {
        let Some(node) = self.nodes.get(i) else {
            return String::new();
        };
        let stderr = node.stderr();
        let all: Vec<&str> = stderr.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Reaps node `i` if its process ended by itself (recorded as `terminated`) and returns
    /// how it ended, so that it can be started again; `Ok(None)`, touching nothing, while
    /// it runs.
    pub fn reap_ended(&mut self, i: usize) -> Result<Option<ExitStatus>, HarnessError> {
        self.node(i)?;
        if self.ended(i).is_none() {
            return Ok(None);
        }
        self.reap(i, Instant::now())
    }

    /// `Ok` when node `i` runs; otherwise why not: no such node, not running, or
    /// [`HarnessError::Ended`] with its log.
    fn running(&self, i: usize) -> Result<(), HarnessError> {
        self.node(i)?;
        if self.nodes[i].child.is_none() {
            return Err(self.not_running(i));
        }
        match self.ended(i) {
            Some(end) => Err(self.ended_error(i, end)),
            None => Ok(()),
        }
    }

    fn signal(&self, i: usize, sig: Signal) -> Result<(), HarnessError> {
        let pid = self.node(i)?.pid().ok_or_else(|| self.not_running(i))?;
        kill_process(pid, sig).map_err(|e| HarnessError::Signal {
            node: i,
            addr: self.nodes[i].addr.clone(),
            signal: format!("{sig:?}"),
            source: e.into(),
        })
    }

    /// Appends a harness event about node `i` to the shared history (same clock and
    /// format as the nodes' own lines, `inc` = `harness`).
    pub fn record(&self, i: usize, event: Event) -> Result<(), HarnessError> {
        self.record_about(&self.node(i)?.addr, event)
    }

    /// Appends a harness event about `addr` (a node, or `store`), e.g. a link cut with its
    /// `peer`.
    pub fn record_about(&self, addr: &str, event: Event) -> Result<(), HarnessError> {
        HistoryFile::open(&self.history)
            .and_then(|file| file.append(&Entry::fault(addr, event)))
            .map_err(|e| HarnessError::History {
                path: self.history.clone(),
                detail: e.to_string(),
            })
    }

    /// SIGKILL node `i` and reap it.
    pub fn kill(&mut self, i: usize) -> Result<(), HarnessError> {
        self.signal(i, Signal::CONT)?;
        let Some(mut child) = self.nodes[i].child.take() else {
            return Err(self.not_running(i));
        };
        // An error here is a process already gone: reaped below either way.
        let _ = child.kill();
        let _ = child.wait();
        // Recorded once the process is certainly gone (the later end is the stricter one).
        self.record(i, Event::Killed {})
    }

    /// Starts node `i` again after a kill or a stop (a new incarnation) and records
    /// `restarted`.
    pub fn restart(&mut self, i: usize) -> Result<(), HarnessError> {
        self.spawn(i)?;
        self.record(i, Event::Restarted {})
    }

    /// SIGSTOP node `i` (recorded as `paused` first: the checker lets a process frozen across
    /// a deadline act on after it, and one frozen just before its record must not count as
    /// running).
    pub fn pause(&self, i: usize) -> Result<(), HarnessError> {
        self.running(i)?;
        self.record(i, Event::Paused {})?;
        self.signal(i, Signal::STOP)
    }

    /// SIGCONT node `i` (recorded as `resumed` first).
    pub fn resume(&self, i: usize) -> Result<(), HarnessError> {
        self.running(i)?;
        self.record(i, Event::Resumed {})?;
        self.signal(i, Signal::CONT)
    }

    /// SIGTERM node `i` (graceful leave: `leaving` is recorded before the signal,
    /// `terminated` once the process exited) and waits for its exit status;
    /// [`HarnessError::NoExit`] when it did not exit within 20 s (it is killed then).
    pub fn stop(&mut self, i: usize) -> Result<ExitStatus, HarnessError> {
        const WAIT: Duration = Duration::from_secs(20);
        self.running(i)?;
        self.record(i, Event::Leaving {})?;
        self.signal(i, Signal::TERM)?;
        self.reap(i, Instant::now() + WAIT)?
            .ok_or_else(|| HarnessError::NoExit {
                node: i,
                addr: self.nodes[i].addr.clone(),
                waited: WAIT,
                stderr: self.nodes[i].stderr(),
            })
    }

    /// Waits up to `limit` for node `i` to exit by itself (recorded as `terminated`) and
    /// returns its status; past it, SIGKILLs the node and returns `Ok(None)`.
    pub fn wait_exit(
        &mut self,
        i: usize,
        limit: Duration,
    ) -> Result<Option<ExitStatus>, HarnessError> {
        self.reap(i, Instant::now() + limit)
    }

    /// SIGTERM every running node at once (a paused one is resumed first; recorded like
    /// [`Cluster::stop`]), then waits up to `limit` for each to exit, SIGKILLing the ones
    /// that do not. Returns the nodes that exited with a non-zero status or were killed.
    /// Every node is stopped even when one fails; the first error is returned then.
    pub fn stop_all(&mut self, limit: Duration) -> Result<Vec<usize>, HarnessError> {
        // A node that ended by itself is reaped (and counted unclean) too.
        let running: Vec<usize> = (0..self.nodes.len())
            .filter(|i| self.nodes[*i].child.is_some())
            .collect();
        let mut first_err = None;
        for &i in &running {
            let sent = self
                .record(i, Event::Leaving {})
                .and_then(|()| self.signal(i, Signal::CONT))
                .and_then(|()| self.signal(i, Signal::TERM));
            if let Err(e) = sent {
                first_err.get_or_insert(e);
            }
        }
        let deadline = Instant::now() + limit;
        let mut unclean = Vec::new();
        for i in running {
            match self.reap(i, deadline) {
                Ok(Some(status)) if status.success() => {}
                Ok(_) => unclean.push(i),
                Err(e) => {
                    unclean.push(i);
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(unclean),
        }
    }

    /// Waits until `deadline` for node `i` to exit and records `terminated`; past it,
    /// SIGKILLs the node, records `killed` and returns `Ok(None)`.
    fn reap(&mut self, i: usize, deadline: Instant) -> Result<Option<ExitStatus>, HarnessError> {
        self.node(i)?;
        let Some(mut child) = self.nodes[i].child.take() else {
            return Err(self.not_running(i));
        };
        loop {
            let exited = child.try_wait().map_err(|source| HarnessError::Process {
                node: i,
                addr: self.nodes[i].addr.clone(),
                binary: self.binary.clone(),
                what: "node (waiting for its exit)".into(),
                source,
            });
            match exited {
                Ok(Some(status)) => {
                    // Recorded once the process is certainly gone (the later end is stricter).
                    self.record(i, Event::Terminated {})?;
                    return Ok(Some(status));
                }
                Ok(None) if Instant::now() <= deadline => {}
                Ok(None) | Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    self.record(i, Event::Killed {})?;
                    return exited.map(|_| None);
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stalls (or resumes) the traffic between nodes `a` and `b`, on both sides; records
    /// `link_cut` / `link_healed` about `a` with `peer` = `b`'s address.
    pub fn set_link(&self, a: usize, b: usize, cut: bool) -> Result<(), HarnessError> {
        let mode = if cut { Some("stall") } else { None };
        self.link_fault(a, b, [mode, mode])
    }

    /// Drops the traffic between `a` and `b` (connections reset, dials refused), on both
    /// sides; heal with [`set_link`](Cluster::set_link)`(a, b, false)`.
    pub fn drop_link(&self, a: usize, b: usize) -> Result<(), HarnessError> {
        self.link_fault(a, b, [Some("drop"); 2])
    }

    /// Loses what `from` sends `to` (stalled), while `to`'s traffic to `from` flows; heal
    /// with [`set_link`](Cluster::set_link)`(from, to, false)`.
    pub fn cut_one_way(&self, from: usize, to: usize) -> Result<(), HarnessError> {
        self.link_fault(from, to, [Some("outbound"), Some("inbound")])
    }

    /// Stalls the sessions (TCP) between `a` and `b` both ways, on both sides, while their
    /// heartbeat datagrams flow (a link stuck behind data); heal with
    /// [`set_link`](Cluster::set_link)`(a, b, false)`.
    pub fn stall_session(&self, a: usize, b: usize) -> Result<(), HarnessError> {
        self.link_fault(a, b, [Some("session"); 2])
    }

    /// Stalls (or resumes) the traffic between node `i` and every other node, on both
    /// sides; records `isolated` / `isolation_healed` about `i`.
    pub fn isolate(&self, i: usize, cut: bool) -> Result<(), HarnessError> {
        self.record(
            i,
            if cut {
                Event::Isolated {}
            } else {
                Event::IsolationHealed {}
            },
        )?;
        let mode = if cut { Some("stall") } else { None };
        // Every link is tried, so that one node not listening (it left, or restarts) leaves
        // the others' links set; the first error is the answer.
        let mut first = Ok(());
        for other in (0..self.nodes.len()).filter(|o| *o != i) {
            let done = self.apply_link_fault(i, other, [mode, mode]);
            if first.is_ok() {
                first = done;
            }
        }
        first
    }

    /// Sets `a`'s fault with `b` to `modes[0]` and `b`'s with `a` to `modes[1]` (`None`:
    /// heal); records `link_cut` (with `mode`) or `link_healed` about `a`, `peer` = `b`.
    fn link_fault(&self, a: usize, b: usize, modes: [Option<&str>; 2]) -> Result<(), HarnessError> {
        let mode_a = modes[0];
        self.node(a)?;
        let link = Link::by_harness(self.node(b)?.addr.clone(), mode_a.map(str::to_string));
        let event = if mode_a.is_some() {
            Event::LinkCut(link)
        } else {
            Event::LinkHealed(link)
        };
        self.record_about(&self.nodes[a].addr, event)?;
        self.apply_link_fault(a, b, modes)
    }

    /// As [`Cluster::link_fault`], without the record.
    fn apply_link_fault(
        &self,
        a: usize,
        b: usize,
        [mode_a, mode_b]: [Option<&str>; 2],
    ) -> Result<(), HarnessError> {
        self.node(a)?;
        self.node(b)?;
        // Both sides are tried (one not listening leaves the other's set); the first error
        // is the answer.
        let mut first = Ok(());
        for (x, y, mode) in [(a, b, mode_a), (b, a, mode_b)] {
            let done = self.apply_one_link_fault(x, y, mode);
            if first.is_ok() {
                first = done;
            }
        }
        first
    }

    /// Sets `x`'s fault with `y` to `mode` (`None`: heal), through `tenure cluster fault`.
    fn apply_one_link_fault(
        &self,
        x: usize,
        y: usize,
        mode: Option<&str>,
    ) -> Result<(), HarnessError> {
        let mut args = vec!["cluster", "fault", "--node", &self.nodes[x].addr];
        match mode {
            Some(mode) => args.extend(["--cut", &self.nodes[y].addr, "--mode", mode]),
            None => args.extend(["--heal", &self.nodes[y].addr]),
        }
        // Setting a link's mode is idempotent, so a session the node closed before it
        // answered (a handshake past `cluster.handshake-timeout` on a starved host) is
        // tried again rather than ending the demo.
        const ATTEMPTS: u32 = 3;
        for attempt in 1..=ATTEMPTS {
            let out = self
                .command(x, &args)
                .output()
                .map_err(|source| HarnessError::Process {
                    node: x,
                    addr: self.nodes[x].addr.clone(),
                    binary: self.binary.clone(),
                    what: "cluster fault".into(),
                    source,
                })?;
            if out.status.success() {
                break;
            }
            let stderr = String::from_utf8_lossy(&out.stderr);
            if !stderr.contains("the node closed the session") || attempt == ATTEMPTS {
                return Err(HarnessError::Fault {
                    node: x,
                    addr: self.nodes[x].addr.clone(),
                    fault: args[4..].join(" "),
                    attempt,
                    stderr: stderr.into_owned(),
                });
            }
        }
        Ok(())
    }

    /// Node `i`'s view, or None if it does not answer (or cannot be asked).
    pub fn view(&self, i: usize) -> Option<Value> {
        self.node(i).ok()?;
        let out = self
            .command(
                i,
                &[
                    "cluster",
                    "members",
                    "--json",
                    "--node",
                    &self.nodes[i].addr,
                ],
            )
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Each member in node `i`'s view, oldest first.
    pub fn members(&self, i: usize) -> Option<Vec<Row>> {
        let view = self.view(i)?;
        Some(
            view["members"]
                .as_array()?
                .iter()
                .map(|m| Row {
                    addr: m["addr"].as_str().unwrap_or_default().to_string(),
                    status: m["status"]
                        .as_str()
                        .unwrap_or_default()
                        .to_ascii_lowercase(),
                    reachable: m["reachable"].as_bool().unwrap_or(false),
                    incarnation: m["incarnation"].as_u64().unwrap_or(0),
                    sessions: m["sessions"].as_u64().unwrap_or(0),
                })
                .collect(),
        )
    }

    /// Every running node sees exactly the running nodes, all up and reachable, one
    /// session each.
    pub fn converged(&self) -> bool {
        let running: Vec<usize> = (0..self.nodes.len())
            .filter(|i| self.is_running(*i))
            .collect();
        let mut expect: Vec<String> = running
            .iter()
            .map(|i| self.nodes[*i].addr.clone())
            .collect();
        expect.sort();
        running.iter().all(|i| {
            let Some(members) = self.members(*i) else {
                return false;
            };
            let mut addrs: Vec<String> = members.iter().map(|m| m.addr.clone()).collect();
            addrs.sort();
            addrs == expect
                && members.iter().all(|m| {
                    m.status == "up"
                        && m.reachable
                        && (m.addr == self.nodes[*i].addr || m.sessions == 1)
                })
        })
    }

    /// The shared history, one JSON object per line, read under the torn-line rules of
    /// [`tenure::history::read_history`] (a node killed mid-line loses that line); none
    /// before the first line is written.
    pub fn read_history(&self) -> Result<Vec<Value>, HarnessError> {
        let history_err = |detail: String| HarnessError::History {
            path: self.history.clone(),
            detail,
        };
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.history) {
            f.read_to_string(&mut text)
                .map_err(|e| history_err(e.to_string()))?;
        }
        match tenure::history::history_lines(&text) {
            Ok(lines) => Ok(lines.into_iter().map(|(_, v)| v).collect()),
            Err((n, e)) => Err(history_err(format!("line {n}: {e}"))),
        }
    }
}

/// With this set to a directory, a cluster dropped while its thread panics (a failed
/// test) copies its history there first, named by the time: for replaying a failed seed.
pub const KEEP_HISTORY_VAR: &str = "TENURE_KEEP_HISTORY";

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = kill_process(Pid::from_child(&child), Signal::CONT);
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if std::thread::panicking()
            && let Some(dir) = std::env::var_os(KEEP_HISTORY_VAR)
        {
            let copy = PathBuf::from(dir).join(format!(
                "history-{}.jsonl",
                tenure::clock::boottime_now_ns()
            ));
            match std::fs::copy(&self.history, &copy) {
                Ok(_) => eprintln!("history kept in {}", copy.display()),
                Err(e) => eprintln!("cannot keep the history in {}: {e}", copy.display()),
            }
        }
    }
}
