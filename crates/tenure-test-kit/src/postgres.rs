//! A throw-away PostgreSQL server for tests and benchmarks: Debian's `postgresql` binaries,
//! a data directory in a temp dir, a free loopback port, killed on drop.
//!
//! As root the server runs as the `postgres` user (PostgreSQL refuses to run as root),
//! through `setpriv`, which execs it: the child's pid is the postmaster's.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const PG_ROOT: &str = "/usr/lib/postgresql";
const RUN_AS: &str = "postgres";

/// The newest `/usr/lib/postgresql/<version>/bin` with `initdb` and `postgres`.
fn bin_dir() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(PG_ROOT)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            (bin.join("postgres").is_file() && bin.join("initdb").is_file())
                .then_some((version, bin))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some((_, bin)) => bin,
        None => panic!(
            "PostgreSQL server binaries (initdb, postgres) not found under {PG_ROOT}/<version>/bin: \
             install the Debian package `postgresql` (apt-get install -y postgresql)"
        ),
    }
}

use crate::signal::is_root;

/// `program args…` run as the unprivileged server user when we are root.
fn command(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("setpriv");
        c.args([
            &format!("--reuid={RUN_AS}"),
            &format!("--regid={RUN_AS}"),
            "--clear-groups",
            "--",
        ])
        .arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// Gives `path` to the server user (when root), so the server can write there.
fn hand_over(path: &Path) {
    if !is_root() {
        return;
    }
    let status = Command::new("chown")
        .args(["-R", &format!("{RUN_AS}:{RUN_AS}")])
        .arg(path)
        .status()
        .expect("chown");
    assert!(
        status.success(),
        "chown {RUN_AS} {}: does user `{RUN_AS}` exist? It comes with the Debian package `postgresql`",
        path.display()
    );
}

use crate::ports::{self, PortTaken};
use crate::signal::send as signal;
use rustix::process::Signal;

/// The processes whose parent is `pid` (the postmaster's backends and workers).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid …": comm may hold spaces, so split after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(child);
        }
    }
    out
}

/// One server at a time per test process: the tests are sensitive to time (ttls of a
/// second, 200 acquires within half a ttl), and on a small machine eight servers plus
/// their clients at once starve each other.
static ONE_AT_A_TIME: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// A server for one test, held exclusively until dropped.
pub struct Exclusive {
    /// The server; no other test uses it until this is dropped.
    pub server: std::sync::Arc<PgServer>,
    _turn: tokio::sync::SemaphorePermit<'static>,
}

impl Exclusive {
    /// Waits for the servers of other tests of this process to be gone, then starts one.
    pub async fn start() -> Exclusive {
        let turn = ONE_AT_A_TIME.acquire().await.expect("never closed");
        let server = tokio::task::spawn_blocking(PgServer::start)
            .await
            .expect("server start");
        Exclusive {
            server: std::sync::Arc::new(server),
            _turn: turn,
        }
    }
}

/// A running PostgreSQL server on 127.0.0.1.
pub struct PgServer {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    child: Mutex<Option<Child>>,
    /// Environment of the server process (e.g. libfaketime), applied at each start.
    env: Mutex<Vec<(String, String)>>,
    /// Settings (`name=value`) applied at each start after the defaults, which they
    /// override.
    settings: Mutex<Vec<String>>,
}

impl PgServer {
    /// Initialises a data directory in a temp dir and starts a server on a free port.
    pub fn start() -> PgServer {
        let bin = bin_dir();
        let dir = tempfile::Builder::new()
            .prefix("tenure-pg")
            .tempdir()
            .expect("temp dir");
        hand_over(dir.path());
        let out = command(&bin.join("initdb"))
            .arg("-D")
            .arg(dir.path().join("data"))
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .output()
            .expect("run initdb (as root through setpriv, from util-linux)");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut server = PgServer {
            dir,
            bin,
            port: ports::free(),
            child: Mutex::new(None),
            env: Mutex::new(Vec::new()),
            settings: Mutex::new(Vec::new()),
        };
        for _ in 1..ports::ATTEMPTS {
            match server.launch() {
                Ok(()) => return server,
                Err(PortTaken) => server.port = ports::free(),
            }
        }
        server.start_again();
        server
    }

    /// Starts the server (again) on the same data directory and port; waits until it
    /// accepts connections. Panics, with the log, when it does not.
    pub fn start_again(&self) {
        if let Err(PortTaken) = self.launch() {
            panic!(
                "postgres could not bind port {}: another process took it\n{}",
                self.port,
                self.log_tail()
            );
        }
    }

    /// Starts the server and waits until it accepts connections; `PortTaken` when it
    /// exited because its port was taken. Panics, with the log, on any other failure.
    fn launch(&self) -> Result<(), PortTaken> {
        let mut slot = self.child.lock().unwrap();
        assert!(slot.is_none(), "server already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("log file");
        let logged = log.metadata().map_or(0, |m| m.len());
        // The environment is set by `env`, run as the server user: set on `setpriv`, a
        // preloaded libfaketime would make shared memory as root that the server cannot open.
        let child = command(Path::new("/usr/bin/env"))
            .args(
                self.env
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| format!("{k}={v}")),
            )
            .arg(self.bin.join("postgres"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(self.dir.path())
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "max_connections=200",
            ])
            .args(
                self.settings
                    .lock()
                    .unwrap()
                    .iter()
                    .flat_map(|setting| ["-c", setting.as_str()]),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start postgres");
        *slot = Some(child);
        drop(slot);
        self.wait_ready(logged)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Waits until the server accepts connections; `PortTaken` when it exited and what it
    /// logged past `logged` (bytes) says its port was taken.
    fn wait_ready(&self, logged: u64) -> Result<(), PortTaken> {
        let started = Instant::now();
        loop {
            let ok = Command::new(self.bin.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                return Ok(());
            }
            let mut slot = self.child.lock().unwrap();
            if let Some(child) = slot.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                let log = std::fs::read(self.log_path()).unwrap_or_default();
                let since = log.get(logged as usize..).unwrap_or_default();
                if ports::taken(&String::from_utf8_lossy(since)) {
                    *slot = None;
                    return Err(PortTaken);
                }
                panic!("postgres exited ({status}):\n{}", self.log_tail());
            }
            drop(slot);
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "postgres did not accept connections within 60 s:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn pid(&self) -> Option<u32> {
        self.child.lock().unwrap().as_ref().map(|c| c.id())
    }

    /// Stops the server: `fast` shuts down cleanly (clients are told), otherwise it crashes
    /// it (immediate shutdown: no checkpoint, crash recovery at the next start).
    pub fn stop(&self, fast: bool) {
        let Some(mut child) = self.child.lock().unwrap().take() else {
            return;
        };
        let pid = child.id();
        for p in std::iter::once(pid).chain(children(pid)) {
            signal(p, Signal::CONT);
        }
        signal(pid, if fast { Signal::INT } else { Signal::QUIT });
        let _ = child.wait();
    }

    /// Stops and starts the server on the same directory and port.
    pub fn restart(&self) {
        self.stop(true);
        self.start_again();
    }

    /// Restarts the server flushing every commit to disk (`fsync=on`, as a deployment
    /// runs; the test server's default is off, so that commits cost no flush).
    pub fn with_fsync(&self) {
        self.settings.lock().unwrap().push("fsync=on".into());
        self.restart();
    }

    /// Restarts the server with libfaketime preloaded, its wall clock offset read from a
    /// file (see [`PgServer::step_clock`]); monotonic clocks stay true.
    pub fn with_fake_clock(&self) {
        let lib = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
        assert!(
            Path::new(lib).exists(),
            "{lib} not found: install the Debian package `faketime` (apt-get install -y faketime), as .ci/test.sh does"
        );
        let file = self.dir.path().join("faketime");
        std::fs::write(&file, "+0\n").expect("faketime file");
        hand_over(&file);
        *self.env.lock().unwrap() = vec![
            ("LD_PRELOAD".into(), lib.into()),
            ("FAKETIME_TIMESTAMP_FILE".into(), file.display().to_string()),
            ("FAKETIME_NO_CACHE".into(), "1".into()),
            ("DONT_FAKE_MONOTONIC".into(), "1".into()),
        ];
        self.restart();
    }

    /// Moves the wall clock of a server started [`with_fake_clock`](Self::with_fake_clock)
    /// to `offset` from the true time (libfaketime syntax: "+1h", "-30s", "+0").
    pub fn step_clock(&self, offset: &str) {
        std::fs::write(self.dir.path().join("faketime"), format!("{offset}\n"))
            .expect("faketime file");
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn checkpoint_copy(&self) -> PathBuf {
        self.dir.path().join("data.checkpoint")
    }

    /// Copies the data directory (a clean shutdown, a copy, a start): the state a replica
    /// had received at this moment.
    pub fn checkpoint(&self) {
        self.stop(true);
        let _ = std::fs::remove_dir_all(self.checkpoint_copy());
        let status = Command::new("cp")
            .arg("-a")
            .arg(self.data())
            .arg(self.checkpoint_copy())
            .status()
            .expect("cp");
        assert!(status.success(), "copy the data directory");
        self.start_again();
    }

    /// Crashes the server and starts it on the copy of [`checkpoint`](Self::checkpoint):
    /// everything committed since is gone, the token sequence included, as after a
    /// fail-over to an asynchronous replica that had not received it.
    pub fn roll_back(&self) {
        self.stop(false);
        std::fs::remove_dir_all(self.data()).expect("remove the data directory");
        std::fs::rename(self.checkpoint_copy(), self.data()).expect("restore the copy");
        self.start_again();
    }

    /// Freezes the server and every backend (SIGSTOP) until the guard drops: connections
    /// stay open and nothing answers, as with a paused or partitioned server.
    pub fn freeze(&self) -> Frozen {
        let pid = self.pid().expect("server running");
        // The postmaster first, so it forks no new backend meanwhile.
        signal(pid, Signal::STOP);
        let mut pids = vec![pid];
        for child in children(pid) {
            signal(child, Signal::STOP);
            pids.push(child);
        }
        Frozen { pids }
    }

    /// Connection parameters of the server (user `postgres`, database `postgres`).
    pub fn connection(&self) -> tokio_postgres::Config {
        self.connection_via(self.port)
    }

    /// Connection parameters of the server through `port` on loopback (e.g. a proxy's).
    pub fn connection_via(&self, port: u16) -> tokio_postgres::Config {
        let mut c = tokio_postgres::Config::new();
        c.host("127.0.0.1")
            .port(port)
            .user("postgres")
            .dbname("postgres");
        c
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.stop(false);
    }
}

/// A frozen server; dropping it lets the server run again.
pub struct Frozen {
    pids: Vec<u32>,
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for p in &self.pids {
            signal(*p, Signal::CONT);
        }
    }
}
