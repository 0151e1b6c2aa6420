//! A throwaway standalone ZooKeeper server for tests and benchmarks: Debian's `zookeeper`
//! package (`/usr/share/java/zookeeper.jar`, whose manifest names its dependencies) run by
//! `java … ZooKeeperServerMain` on a loopback port with its data in a temporary directory.
//! Killed when dropped.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::ports;

/// The server jar of Debian's `zookeeper` package.
pub const SERVER_JAR: &str = "/usr/share/java/zookeeper.jar";

/// Why a test server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(
        "{SERVER_JAR} not found: install Debian's `zookeeper` package (apt-get install zookeeper)"
    )]
    /// The server jar is not installed.
    MissingJar,
    #[error(
        "`java` not found on PATH: install a JRE (Debian's `zookeeper` package brings OpenJDK)"
    )]
    /// No `java` on `PATH`.
    MissingJava,
    /// The server could not be set up, started, or did not answer.
    #[error("ZooKeeper test server in {dir}: {detail}")]
    Failed {
        /// Its temporary data directory.
        dir: PathBuf,
        /// What failed.
        detail: String,
    },
}

/// A standalone ZooKeeper server on 127.0.0.1.
pub struct TestServer {
    dir: tempfile::TempDir,
    port: u16,
    child: Mutex<Option<Child>>,
}

impl std::fmt::Debug for TestServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestServer")
            .field("port", &self.port)
            .finish()
    }
}

/// Asks `srvr` on the client port; true once the server serves requests.
fn is_ok(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut answer = String::new();
    stream.write_all(b"srvr").is_ok()
        && stream.read_to_string(&mut answer).is_ok()
        && answer.contains("Mode: standalone")
}

/// Spawns `command` from a thread that lives as long as the process, with the child asked
/// to be killed when that thread ends (`PR_SET_PDEATHSIG`): a server kept in a `static`
/// (never dropped) still dies with the test binary.
fn spawn_tied(mut command: Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    use std::sync::mpsc;
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    // SAFETY: the closure makes one system call (prctl) and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
            Ok(())
        });
    }
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("zookeeper-test-server-spawner".into())
            .spawn(move || {
                // Ends only with the process (the sender lives in a static).
                while let Ok((mut command, reply)) = rx.recv() {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("spawn thread");
        Mutex::new(tx)
    });
    let (reply, answer) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((command, reply))
        .map_err(|_| std::io::Error::other("spawner thread gone"))?;
    answer
        .recv()
        .map_err(|_| std::io::Error::other("spawner thread gone"))?
}

impl TestServer {
    /// Starts a server with `tick` as tickTime (sessions may then last 2 to 20 ticks) and
    /// waits until it answers. Blocks for about a second (JVM start).
    pub fn start(tick: Duration) -> Result<Self, ServerError> {
        if !Path::new(SERVER_JAR).exists() {
            return Err(ServerError::MissingJar);
        }
        if Command::new("java")
            .arg("-version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_err()
        {
            return Err(ServerError::MissingJava);
        }
        let dir = tempfile::Builder::new()
            .prefix("tenure-zk-")
            .tempdir()
            .map_err(|e| ServerError::Failed {
                dir: std::env::temp_dir(),
                detail: format!("temp dir: {e}"),
            })?;
        let dir_path = dir.path().to_path_buf();
        let fail = |detail: String| ServerError::Failed {
            dir: dir_path.clone(),
            detail,
        };
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).map_err(|e| fail(e.to_string()))?;
        let mut server = TestServer {
            dir,
            port: 0,
            child: Mutex::new(None),
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            server.port = ports::free();
            let cfg = format!(
                "tickTime={}\ndataDir={}\nclientPort={}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr\nforceSync=no\n",
                tick.as_millis().max(1),
                data.display(),
                server.port
            );
            std::fs::write(server.dir.path().join("zoo.cfg"), cfg)
                .map_err(|e| fail(e.to_string()))?;
            let logged = std::fs::metadata(server.log_path()).map_or(0, |m| m.len());
            match server.start_again() {
                Ok(()) => return Ok(server),
                // Its port taken before it bound it: again on another.
                Err(_) if attempt < ports::ATTEMPTS && server.port_was_taken(logged) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The server's log file.
    fn log_path(&self) -> PathBuf {
        self.dir.path().join("zookeeper.log")
    }

    /// Whether the server is not running and what it logged past `logged` (bytes) says its
    /// port was taken.
    fn port_was_taken(&self, logged: u64) -> bool {
        let log = std::fs::read(self.log_path()).unwrap_or_default();
        self.child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
            && ports::taken(&String::from_utf8_lossy(
                log.get(logged as usize..).unwrap_or_default(),
            ))
    }

    /// `host:port` for clients.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The directory of config, data and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts the server again (after [`stop`](Self::stop)) on the same port and data.
    pub fn start_again(&self) -> Result<(), ServerError> {
        let fail = |detail: String| ServerError::Failed {
            dir: self.dir.path().to_path_buf(),
            detail,
        };
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if child.is_some() {
            return Ok(());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| fail(e.to_string()))?;
        let log2 = log.try_clone().map_err(|e| fail(e.to_string()))?;
        let mut command = Command::new("java");
        command
            .args([
                "-Xmx128m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-XX:Tier3InvocationThreshold=20",
                "-XX:Tier3MinInvocationThreshold=10",
                "-XX:Tier3CompileThreshold=100",
                "-XX:Tier3BackEdgeThreshold=2000",
            ])
            .arg(format!("-Dzookeeper.log.dir={}", self.dir.path().display()))
            .args([
                "-cp",
                SERVER_JAR,
                "org.apache.zookeeper.server.ZooKeeperServerMain",
            ])
            .arg(self.dir.path().join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        let mut started =
            spawn_tied(command).map_err(|e| fail(format!("java did not start: {e}")))?;
        let begun = Instant::now();
        while !is_ok(self.port) {
            if let Ok(Some(status)) = started.try_wait() {
                return Err(fail(format!("server exited ({status}); see zookeeper.log")));
            }
            if begun.elapsed() > Duration::from_secs(60) {
                let _ = started.kill();
                let _ = started.wait();
                return Err(fail("not answering after 60 s".into()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        *child = Some(started);
        Ok(())
    }

    /// Sends a few thousand pipelined requests so that the JVM compiles its request path:
    /// a cold server answers several times slower, which short-ttl tests feel.
    pub async fn warm_up(&self) -> Result<(), zookeeper_client::Error> {
        use zookeeper_client as zk;
        let client = zk::Client::connect(&self.connect_string()).await?;
        let opts = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
        for round in 0..4 {
            let paths: Vec<String> = (0..500).map(|i| format!("/warm-up-{round}-{i}")).collect();
            let created =
                futures::future::join_all(paths.iter().map(|p| client.create(p, b"x", &opts)))
                    .await;
            created.into_iter().collect::<Result<Vec<_>, _>>()?;
            let read = futures::future::join_all(paths.iter().map(|p| client.get_data(p))).await;
            read.into_iter().collect::<Result<Vec<_>, _>>()?;
            let deleted =
                futures::future::join_all(paths.iter().map(|p| client.delete(p, None))).await;
            deleted.into_iter().collect::<Result<Vec<_>, _>>()?;
        }
        Ok(())
    }

    /// Kills the server (SIGKILL: the transaction log is synced before every answer, so
    /// nothing acknowledged is lost).
    pub fn stop(&self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mut c) = child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops and starts the server on the same data directory and port.
    pub fn restart(&self) -> Result<(), ServerError> {
        self.stop();
        self.start_again()
    }

    /// Freezes the server process (SIGSTOP) until the guard is dropped (SIGCONT): clients
    /// stay connected but get no answer.
    pub fn pause(&self) -> PauseGuard {
        let pid = self
            .child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|c| c.id());
        if let Some(pid) = pid {
            crate::signal::send(pid, rustix::process::Signal::STOP);
        }
        PauseGuard { pid }
    }
}

/// Resumes a paused server when dropped.
#[derive(Debug)]
pub struct PauseGuard {
    pid: Option<u32>,
}

impl Drop for PauseGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.pid {
            // The child is only reaped by `stop`, so the pid is still this server's.
            crate::signal::send(pid, rustix::process::Signal::CONT);
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop();
    }
}
