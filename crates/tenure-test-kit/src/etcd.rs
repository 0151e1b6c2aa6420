//! Real etcd servers for tests: members on free loopback ports, data in a temp dir,
//! killed on drop. Needs `/usr/bin/etcd` (Debian package `etcd-server`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use rustix::process::Signal;

use crate::ports::{self, PortTaken};
use crate::signal::send;

/// Key prefix of the stores the tests open.
pub const PREFIX: &str = "/tenure-test/";

fn etcd_binary() -> PathBuf {
    let candidates = ["/usr/bin/etcd", "/usr/local/bin/etcd"];
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "etcd not found at {candidates:?}: install the Debian package `etcd-server` \
                 (apt-get install -y etcd-server), as .ci/test.sh does"
            )
        })
}

/// Runs `etcdctl` (v3 API) with `args`; panics with its error output if it fails.
fn etcdctl(args: &[&str]) {
    let path = PathBuf::from("/usr/bin/etcdctl");
    assert!(
        path.exists(),
        "{} not found: install the Debian package `etcd-client` (apt-get install -y etcd-client), as .ci/test.sh does",
        path.display()
    );
    let out = Command::new(&path)
        .env("ETCDCTL_API", "3")
        .args(args)
        .output()
        .expect("run etcdctl");
    assert!(
        out.status.success(),
        "etcdctl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Mutex<Option<Child>>,
}

impl Member {
    fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }
    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }
}

/// An etcd cluster of one or more members on loopback.
pub struct Etcd {
    dir: tempfile::TempDir,
    members: Vec<Member>,
}

impl Etcd {
    /// One member, healthy.
    pub async fn single() -> Self {
        Etcd::cluster(1).await
    }

    /// `n` members, started together and healthy (a leader elected).
    pub async fn cluster(n: usize) -> Self {
        for _ in 1..ports::ATTEMPTS {
            let etcd = Etcd::configure(n);
            etcd.start_members();
            // A port taken before its member bound it: a new cluster on other ports (the
            // killed one's directory goes with it).
            if etcd.healthy().await.is_ok() {
                return etcd;
            }
        }
        let etcd = Etcd::configure(n);
        etcd.start_members();
        etcd.wait_healthy().await;
        etcd
    }

    /// `n` members on distinct free ports, data in a new temp dir, none started.
    fn configure(n: usize) -> Self {
        let base = if Path::new("/dev/shm").is_dir() {
            tempfile::Builder::new()
                .prefix("tenure-etcd-")
                .tempdir_in("/dev/shm")
        } else {
            tempfile::Builder::new().prefix("tenure-etcd-").tempdir()
        };
        let dir = base.expect("temp dir for etcd data");
        let mut chosen: Vec<u16> = Vec::with_capacity(2 * n);
        while chosen.len() < 2 * n {
            let port = ports::free();
            if !chosen.contains(&port) {
                chosen.push(port);
            }
        }
        let members: Vec<Member> = chosen
            .chunks(2)
            .enumerate()
            .map(|(i, pair)| Member {
                name: format!("m{i}"),
                client_port: pair[0],
                peer_port: pair[1],
                child: Mutex::new(None),
            })
            .collect();
        Etcd { dir, members }
    }

    fn start_members(&self) {
        for i in 0..self.members.len() {
            self.start_member(i);
        }
    }

    fn start_member(&self, i: usize) {
        let m = &self.members[i];
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect();
        let data = self.dir.path().join(&m.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", m.name)))
            .expect("etcd log file");
        let child = Command::new(etcd_binary())
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &m.client_url()])
            .args(["--advertise-client-urls", &m.client_url()])
            .args(["--listen-peer-urls", &m.peer_url()])
            .args(["--initial-advertise-peer-urls", &m.peer_url()])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "tenure-test"])
            // Fast elections on loopback (defaults: 100 ms / 1000 ms).
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", etcd_binary().display()));
        *m.child.lock().unwrap() = Some(child);
    }

    /// Client URLs of every member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::client_url).collect()
    }

    /// Client URL of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        self.members[i].client_url()
    }

    fn log_tail(&self) -> String {
        let mut out = String::new();
        for m in &self.members {
            let log = std::fs::read_to_string(self.dir.path().join(format!("{}.log", m.name)))
                .unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            out += &format!(
                "--- {} ---\n{}\n",
                m.name,
                lines[lines.len().saturating_sub(15)..].join("\n")
            );
        }
        out
    }

    /// Waits until every running member answers a linearizable read (a leader exists);
    /// panics, with the members' logs, when one does not.
    pub async fn wait_healthy(&self) {
        if let Err(PortTaken) = self.healthy().await {
            panic!(
                "an etcd member could not bind its port: another process took it\n{}",
                self.log_tail()
            );
        }
    }

    /// [`wait_healthy`](Self::wait_healthy), but `PortTaken` when a member exited because
    /// its port was taken.
    async fn healthy(&self) -> Result<(), PortTaken> {
        for (i, m) in self.members.iter().enumerate() {
            if m.child.lock().unwrap().is_none() {
                continue;
            }
            let mut tries = 0;
            loop {
                let ok = async {
                    let mut c = Client::connect([self.endpoint(i)], Some(quick()))
                        .await
                        .ok()?;
                    c.get("health-probe", None).await.ok()
                };
                if tokio::time::timeout(Duration::from_secs(2), ok)
                    .await
                    .ok()
                    .flatten()
                    .is_some()
                {
                    break;
                }
                if self.exited_on_a_taken_port(m) {
                    return Err(PortTaken);
                }
                tries += 1;
                assert!(
                    tries < 100,
                    "etcd member {} did not become healthy:\n{}",
                    m.name,
                    self.log_tail()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// Whether `m` has exited and its log says its port was taken.
    fn exited_on_a_taken_port(&self, m: &Member) -> bool {
        let exited = m
            .child
            .lock()
            .unwrap()
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
        exited
            && ports::taken(
                &std::fs::read_to_string(self.dir.path().join(format!("{}.log", m.name)))
                    .unwrap_or_default(),
            )
    }

    /// A client of every member, as another process would open it (connect timeout
    /// 500 ms, request timeout 1 s).
    pub async fn client(&self) -> Client {
        self.client_on(self.endpoints()).await
    }

    /// A client of `endpoints`, as [`client`](Etcd::client) makes it.
    pub async fn client_on(&self, endpoints: Vec<String>) -> Client {
        Client::connect(endpoints, Some(quick()))
            .await
            .expect("etcd client")
    }

    /// Revokes, on the server, every session (etcd lease) of `owner` under key prefix
    /// `prefix`, found by their heartbeat keys (`<prefix>sessions/<id>`, whose value is the
    /// owner): every key attached to them is deleted, as when a session expires. Returns
    /// how many sessions were revoked.
    pub async fn revoke_sessions_of(&self, prefix: &str, owner: &str) -> usize {
        let mut c = Client::connect(self.endpoints(), Some(quick()))
            .await
            .expect("client");
        let heartbeats = c
            .get(
                format!("{prefix}sessions/"),
                Some(etcd_client::GetOptions::new().with_prefix()),
            )
            .await
            .expect("read the heartbeat keys");
        let mut revoked = 0;
        for kv in heartbeats.kvs() {
            if kv.value() == owner.as_bytes() && kv.lease() != 0 {
                match c.lease_revoke(kv.lease()).await {
                    Ok(_) => revoked += 1,
                    // Expired meanwhile: as good as revoked.
                    Err(e) if e.to_string().contains("lease not found") => {}
                    Err(e) => panic!("revoke session {:x} of {owner}: {e}", kv.lease()),
                }
            }
        }
        revoked
    }

    /// Kills member `i` (SIGKILL) and waits for it to exit.
    pub fn kill(&self, i: usize) {
        if let Some(mut c) = self.members[i].child.lock().unwrap().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again on its data (after [`kill`](Self::kill)).
    pub async fn start(&self, i: usize) {
        self.start_member(i);
        self.wait_healthy().await;
    }

    /// Stops every member with SIGTERM (a clean shutdown) and starts them again.
    pub async fn restart_all(&self) {
        for m in &self.members {
            if let Some(mut c) = m.child.lock().unwrap().take() {
                send(c.id(), Signal::TERM);
                let _ = c.wait();
            }
        }
        for i in 0..self.members.len() {
            self.start_member(i);
        }
        self.wait_healthy().await;
    }

    /// Saves a snapshot of member `i` to `file` (`etcdctl snapshot save`).
    pub fn snapshot(&self, i: usize, file: &Path) {
        let endpoint = self.endpoint(i);
        let mut args = vec!["--endpoints", &endpoint, "snapshot", "save"];
        let file = file.display().to_string();
        args.push(&file);
        etcdctl(&args);
    }

    /// Replaces the data of the single member by `snapshot`, restored without bumping the
    /// revisions (`etcdctl snapshot restore`, as etcd 3.4 has no `--bump-revision`), and
    /// starts it again on the same ports: revisions go back to the snapshot's.
    pub async fn restore(&self, snapshot: &Path) {
        assert_eq!(self.members.len(), 1, "restore is for a single member");
        let m = &self.members[0];
        self.kill(0);
        let data = self.dir.path().join(&m.name);
        std::fs::remove_dir_all(&data).expect("remove the member's data");
        let (snapshot, data) = (snapshot.display().to_string(), data.display().to_string());
        let cluster = format!("{}={}", m.name, m.peer_url());
        let peer = m.peer_url();
        etcdctl(&[
            "snapshot",
            "restore",
            &snapshot,
            "--data-dir",
            &data,
            "--name",
            &m.name,
            "--initial-cluster",
            &cluster,
            "--initial-cluster-token",
            "tenure-test",
            "--initial-advertise-peer-urls",
            &peer,
        ]);
        self.start(0).await;
    }

    /// Freezes every member (SIGSTOP) until the guard is dropped (SIGCONT): requests hang.
    pub fn freeze(&self) -> Frozen {
        let pids: Vec<u32> = self
            .members
            .iter()
            .filter_map(|m| m.child.lock().unwrap().as_ref().map(|c| c.id()))
            .collect();
        for pid in &pids {
            send(*pid, Signal::STOP);
        }
        Frozen { pids }
    }

    /// The index of the current leader, asked of member `via`.
    pub async fn leader(&self, via: usize) -> usize {
        let mut c = Client::connect([self.endpoint(via)], Some(quick()))
            .await
            .expect("client");
        let status = c.status().await.expect("status");
        let members = c.member_list().await.expect("member list");
        let leader = members
            .members()
            .iter()
            .find(|m| m.id() == status.leader())
            .expect("the leader is a member");
        self.members
            .iter()
            .position(|m| m.name == leader.name())
            .expect("known member")
    }
}

/// Short client timeouts: a dead member fails requests quickly.
fn quick() -> ConnectOptions {
    ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(500))
        .with_timeout(Duration::from_secs(1))
}

/// Frozen members, resumed on drop.
pub struct Frozen {
    pids: Vec<u32>,
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for pid in &self.pids {
            send(*pid, Signal::CONT);
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for m in &self.members {
            if let Some(mut c) = m.child.lock().unwrap().take() {
                send(c.id(), Signal::CONT);
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}
