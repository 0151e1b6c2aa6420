//! The conformance suite against a real ZooKeeper server (Debian's `zookeeper` package).

mod common;

use std::any::Any;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tenure_lease::LeaseStore;
use tenure_lease::conformance::proxy::Proxy;
use tenure_lease::conformance::{AnswerDelay, Harness, test_settings};
use tenure_store_zookeeper::ZooKeeperStore;

/// The longest ttl the suite asks for.
const SESSION_TIMEOUT: Duration = Duration::from_secs(5);

struct ZooKeeperHarness {
    shared: common::Shared,
    /// Every client handed out, to find an owner's sessions.
    clients: Mutex<Vec<ZooKeeperStore>>,
}

impl ZooKeeperHarness {
    async fn start() -> Self {
        ZooKeeperHarness {
            shared: common::exclusive().await,
            clients: Mutex::default(),
        }
    }

    fn keep(&self, store: ZooKeeperStore) -> Arc<dyn LeaseStore> {
        self.clients.lock().unwrap().push(store.clone());
        Arc::new(store)
    }
}

#[async_trait]
impl Harness for ZooKeeperHarness {
    async fn client(&self) -> Arc<dyn LeaseStore> {
        let timeout = test_settings().lease_operation_timeout;
        self.keep(self.shared.store(SESSION_TIMEOUT, timeout))
    }

    /// Stops the JVM and starts it on the same data directory and port.
    async fn restart(&self) {
        self.shared.restart().await;
    }

    /// Freezes the JVM (SIGSTOP) until the guard drops.
    async fn outage(&self) -> Box<dyn Any + Send> {
        Box::new(self.shared.server.pause())
    }

    /// Through a TCP proxy to the server.
    async fn delayed_client(&self) -> (Arc<dyn LeaseStore>, Box<dyn AnswerDelay>) {
        let port = self
            .shared
            .server
            .connect_string()
            .rsplit(':')
            .next()
            .map(str::parse);
        let proxy = Proxy::start(port.expect("host:port").expect("a port"));
        let connect = format!("127.0.0.1:{}", proxy.port);
        let timeout = test_settings().lease_operation_timeout;
        let store = self.shared.store_via(&connect, SESSION_TIMEOUT, timeout);
        (self.keep(store), Box::new(proxy))
    }

    /// Closes the owner's sessions from another connection, as the server's expiry would.
    async fn expire_sessions(&self, owner: &str) {
        let clients: Vec<ZooKeeperStore> = self.clients.lock().unwrap().clone();
        let mut ended = 0;
        for client in clients {
            if let Some(session) = client.session_of(owner).await {
                self.shared.end_session(&session).await;
                ended += 1;
            }
        }
        assert!(ended > 0, "{owner} has no session to end");
    }
}

tenure_lease::conformance_tests!(ZooKeeperHarness::start());
tenure_lease::preemption_fault_tests!(ZooKeeperHarness::start());
