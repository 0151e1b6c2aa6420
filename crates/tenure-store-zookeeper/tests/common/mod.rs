//! One ZooKeeper server (Debian's `zookeeper` package) shared by the tests of one test
//! binary, and a lock that runs those tests one at a time: a test may restart or freeze
//! the server, which must not reach another test. Each test works under its own root.

#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tenure_lease_kit::conformance::proxy::Proxy;
use tenure_store_zookeeper::zookeeper_client as zk;
use tenure_store_zookeeper::{ZooKeeperOptions, ZooKeeperStore};
use tenure_test_kit::zookeeper::TestServer;
use tokio::sync::{Mutex, OwnedMutexGuard};

/// tickTime of the test server: sessions may last 0.5 s to 5 s.
pub const TICK: Duration = Duration::from_millis(250);

static SERVER: OnceLock<Arc<TestServer>> = OnceLock::new();
static EXCLUSIVE: OnceLock<Arc<Mutex<()>>> = OnceLock::new();
static ROOTS: AtomicUsize = AtomicUsize::new(0);

/// The shared server, for the holder of the exclusive lock.
pub struct Shared {
    pub server: Arc<TestServer>,
    pub root: String,
    _exclusive: OwnedMutexGuard<()>,
}

/// Waits for the other tests of this binary, then returns the (started, warmed) server
/// and a fresh root.
pub async fn exclusive() -> Shared {
    let guard = EXCLUSIVE
        .get_or_init(|| Arc::new(Mutex::new(())))
        .clone()
        .lock_owned()
        .await;
    let server = match SERVER.get() {
        Some(s) => s.clone(),
        None => {
            let started = tokio::task::spawn_blocking(|| TestServer::start(TICK))
                .await
                .expect("server start task")
                .unwrap_or_else(|e| panic!("cannot start the ZooKeeper test server: {e}"));
            let s = SERVER.get_or_init(|| Arc::new(started)).clone();
            s.warm_up().await.expect("warm-up");
            s
        }
    };
    let root = format!("/tenure/test-{}", ROOTS.fetch_add(1, Ordering::SeqCst));
    Shared {
        server,
        root,
        _exclusive: guard,
    }
}

impl Shared {
    /// A store on this test's root with session timeout `session`.
    pub fn store(&self, session: Duration, connection: Duration) -> ZooKeeperStore {
        self.store_via(&self.server.connect_string(), session, connection)
    }

    /// A store on this test's root that reaches the server through a TCP proxy of its own
    /// (to cut its traffic or hold the server's answers back), and that proxy.
    pub fn store_via_proxy(
        &self,
        session: Duration,
        connection: Duration,
    ) -> (ZooKeeperStore, Proxy) {
        let port = self
            .server
            .connect_string()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("the server's connect string ends in :port");
        let proxy = Proxy::start(port);
        let store = self.store_via(&format!("127.0.0.1:{}", proxy.port), session, connection);
        (store, proxy)
    }

    /// A store on this test's root connecting to `connect` (e.g. a proxy to the server).
    pub fn store_via(
        &self,
        connect: &str,
        session: Duration,
        connection: Duration,
    ) -> ZooKeeperStore {
        let mut options = ZooKeeperOptions::new(connect, self.root.clone(), session);
        options.connection_timeout = connection;
        ZooKeeperStore::new(options).expect("options")
    }

    /// Ends `session` on the server, as an expiry would (its ephemeral nodes go): another
    /// client takes the session over and closes it. The close is sent after the thief is
    /// dropped, and fails with "session moved" when the store's own client took the
    /// session back first, so the thief comes back until the server answers that the
    /// session is gone.
    pub async fn end_session(&self, session: &zk::SessionInfo) {
        let mut failures = 0;
        for _ in 0..100 {
            match zk::Client::connector()
                .with_session(session.clone())
                .with_session_timeout(Duration::from_secs(5))
                .connect(&self.server.connect_string())
                .await
            {
                Ok(thief) => drop(thief),
                Err(zk::Error::SessionExpired) => return,
                Err(e) => {
                    failures += 1;
                    assert!(failures < 10, "cannot connect with the session: {e}");
                }
            }
            tokio::time::sleep(TICK).await;
        }
        panic!("the session outlived 100 closes");
    }

    /// Restarts the server on the same data and port, then warms it up again.
    pub async fn restart(&self) {
        let server = self.server.clone();
        tokio::task::spawn_blocking(move || server.restart())
            .await
            .expect("restart task")
            .expect("restart");
        self.server.warm_up().await.expect("warm-up");
    }
}
