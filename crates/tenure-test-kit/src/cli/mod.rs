//! Helpers for tests and benches of `tenure-cli` that run `tenure` processes against one
//! SQLite file: a sandbox config, running processes and their output, guarded commands'
//! histories, `tenure check` on a history, and (submodules) clusters of nodes, what their
//! histories show running where, and the service of the demo's load.

pub mod cluster;
pub mod endpoints;
pub mod lives;
pub mod pair;
pub mod service;
pub mod shards;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, LazyLock, Mutex, mpsc};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

/// The `tenure` executable of this build, in the target directory above the running test's
/// or bench's `deps` directory (cargo builds a package's binaries for its integration tests
/// and benches): only tests and benches of `tenure-cli` may start it.
pub static TENURE: LazyLock<PathBuf> = LazyLock::new(|| {
    let exe = std::env::current_exe().expect("test binary path");
    let tenure = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target profile dir")
        .join("tenure");
    assert!(
        tenure.exists(),
        "no `tenure` executable at {}: run this from a test or bench of tenure-cli",
        tenure.display()
    );
    tenure
});

/// The `heartbeat-timeout` of the sandbox config.
pub const TTL: Duration = Duration::from_secs(3);

/// A temp dir with a config whose `sqlite` section has short timings: ttl 3 s, renewals
/// every 500 ms, retries every 100 ms, operations bounded by 2 s (headroom for a loaded
/// 2-core machine running several of these tests at once).
pub struct Sandbox {
    /// The temporary directory, removed when dropped.
    pub dir: tempfile::TempDir,
    /// The config file, `tenure.toml` in `dir`.
    pub config: PathBuf,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Sandbox {
    /// A new sandbox with its config written.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("tenure.toml");
        std::fs::write(
            &config,
            format!(
                "[lease.sqlite]\nstore = \"sqlite\"\npath = \"{}\"\nheartbeat-timeout = \"3s\"\nheartbeat-interval = \"500ms\"\nlease-retry-interval = \"100ms\"\nlease-operation-timeout = \"2s\"\n",
                dir.path().join("leases.sqlite").display()
            ),
        )
        .expect("write config");
        Sandbox { dir, config }
    }

    /// The path of `name` in the sandbox's directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A `tenure` command with `--config` set to the sandbox's config (and `TENURE_CONFIG` unset).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&*TENURE);
        cmd.arg("--config").arg(&self.config).args(args);
        cmd.env_remove("TENURE_CONFIG");
        cmd
    }

    /// Runs `tenure` with `args` to completion and returns its output.
    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run tenure")
    }

    /// Starts `tenure` with stdout piped into a line channel.
    pub fn spawn(&self, args: &[&str]) -> Running {
        let mut cmd = self.command(args);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        Running::start(cmd)
    }
}

/// A running `tenure` whose stdout lines are collected as they come, and whose stderr (when
/// piped) is drained as it comes, so that the process never blocks on a full pipe.
pub struct Running {
    /// The `tenure` process.
    pub child: Child,
    lines: mpsc::Receiver<String>,
    /// Stdout lines received so far.
    pub seen: Vec<String>,
    errors: Arc<Mutex<String>>,
    drained: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Spawns `cmd` (stdout piped) and starts collecting its stdout lines (and its stderr,
    /// when piped).
    pub fn start(mut cmd: Command) -> Self {
        let mut child = cmd.spawn().expect("spawn tenure");
        let errors = Arc::new(Mutex::new(String::new()));
        let drained = child.stderr.take().map(|stderr| {
            let errors = errors.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let mut e = errors.lock().unwrap_or_else(|e| e.into_inner());
                    e.push_str(&line);
                    e.push('\n');
                }
            })
        });
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Running {
            child,
            lines,
            seen: Vec::new(),
            errors,
            drained,
        }
    }

    /// Waits (at most `limit`, a generous bound against hangs) for a stdout line
    /// containing `needle`; returns it.
    pub fn wait_line(&mut self, needle: &str, limit: Duration) -> String {
        let end = Instant::now() + limit;
        loop {
            if let Some(l) = self.seen.iter().find(|l| l.contains(needle)) {
                return l.clone();
            }
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.seen.push(l),
                Err(_) => panic!(
                    "no line containing {needle:?} within {limit:?}; saw {:?}",
                    self.seen
                ),
            }
        }
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `sig` to the process; panics if that fails.
    pub fn signal(&self, sig: Signal) {
        if let Err(e) = kill_process(Pid::from_child(&self.child), sig) {
            panic!("kill({sig:?}): {e}");
        }
    }

    /// Waits for exit (bounded) and returns the exit code (None when killed by a signal).
    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let end = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            assert!(Instant::now() < end, "tenure did not exit within {limit:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its stderr so far; all of it once the process has exited (empty if not piped).
    pub fn stderr(&mut self) -> String {
        if matches!(self.child.try_wait(), Ok(Some(_)))
            && let Some(drain) = self.drained.take()
        {
            let _ = drain.join();
        }
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `token=N` of an output line.
pub fn token_of(line: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("token="))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no token in {line:?}"))
}

/// An output's stdout, lossily decoded.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// An output's stderr, lossily decoded.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// One line of a guarded command's history file: `<token> <what> <pid>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The lease token the command ran under (`$TENURE_LEASE_TOKEN`).
    pub token: u64,
    /// What it wrote: `start`, `end` or `tick`.
    pub what: String,
    /// The writing shell's process id.
    pub pid: u32,
}

/// The entries of the history file a [`guarded_writer`] appends to (none if it is missing).
pub fn read_history(path: &Path) -> Vec<Entry> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut parts = l.split_whitespace();
            let token = parts
                .next()
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("bad line {l:?}"));
            let what = parts
                .next()
                .unwrap_or_else(|| panic!("bad line {l:?}"))
                .to_string();
            let pid = parts
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("bad line {l:?}"));
            Entry { token, what, pid }
        })
        .collect()
}

/// The arguments of `tenure lease run <lease> --owner <owner> --grace 200ms
/// [--history <checked>] -- <command>`: `command` guarded by the lease, stopped 200 ms after
/// a loss, its lease events recorded in `checked` when given.
pub fn lease_run_args(
    lease: &str,
    owner: &str,
    checked: Option<&Path>,
    command: &[String],
) -> Vec<String> {
    let mut args: Vec<String> = ["lease", "run", lease, "--owner", owner, "--grace", "200ms"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if let Some(checked) = checked {
        args.push("--history".into());
        args.push(checked.display().to_string());
    }
    args.push("--".into());
    args.extend(command.iter().cloned());
    args
}

/// A shell command that appends `<token> <what> <pid>` lines to `history` every 20 ms,
/// `iterations` times (forever when None).
pub fn guarded_writer(history: &Path, iterations: Option<u32>) -> Vec<String> {
    let h = history.display();
    let body = match iterations {
        Some(n) => format!(
            "i=0; while [ $i -lt {n} ]; do echo \"$TENURE_LEASE_TOKEN start $$\" >> {h}; sleep 0.02; echo \"$TENURE_LEASE_TOKEN end $$\" >> {h}; i=$((i+1)); done"
        ),
        None => {
            format!("while true; do echo \"$TENURE_LEASE_TOKEN tick $$\" >> {h}; sleep 0.02; done")
        }
    };
    vec!["sh".into(), "-c".into(), body]
}

/// How long after resuming a node frozen across its lease deadline may still act: at least
/// the tests' stop budget (`stop-timeout` 500 ms + 500 ms), with room for a loaded machine.
pub const RESUME_GRACE: &str = "3s";

/// Runs `tenure check --all` on the history at `path` and fails the test with its output
/// unless the verdict is safe. Returns the checker's summary line.
pub fn assert_checked(path: &Path) -> String {
    assert_checked_with(path, &[])
}

/// [`assert_checked`] with more arguments of `tenure check` (e.g. `--journal <file>`).
pub fn assert_checked_with(path: &Path, more: &[&str]) -> String {
    let out = Command::new(&*TENURE)
        .args(["check", "--all", "--resume-grace", RESUME_GRACE])
        .args(more)
        .arg(path)
        .output()
        .expect("run tenure check");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "tenure check {}: {}\n{}",
        path.display(),
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}
