//! The conformance suite against a real ZooKeeper server (Debian's `zookeeper` package), on
//! a root the store creates (the families layout). The flat layout an earlier version's root
//! keeps is the layout of every lease outside a family, which these tests' leases are; the
//! two layouts side by side are tested in `layout.rs`.

mod common;

use std::any::Any;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tenure_lease::LeaseStore;
use tenure_lease_kit::conformance::{AnswerDelay, Harness, test_settings};
use tenure_store_zookeeper::ZooKeeperStore;
use tenure_store_zookeeper::zookeeper_client as zk;

/// The longest ttl the suite asks for.
const SESSION_TIMEOUT: Duration = Duration::from_secs(5);

struct ZooKeeperHarness {
    shared: common::Shared,
    /// Every client handed out, to find an owner's sessions.
    clients: Mutex<Vec<ZooKeeperStore>>,
    /// A plain client that counts fair waiters, connected at first use.
    observer: tokio::sync::OnceCell<zk::Client>,
}

impl ZooKeeperHarness {
    async fn start() -> Self {
        ZooKeeperHarness {
            shared: common::exclusive().await,
            clients: Mutex::default(),
            observer: tokio::sync::OnceCell::new(),
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
        let timeout = test_settings().lease_operation_timeout;
        let (store, proxy) = self.shared.store_via_proxy(SESSION_TIMEOUT, timeout);
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

    /// The waiter nodes of `name` (ephemeral sequential `wait-<seq>` children of the lease
    /// node): each lives as long as its waiter's session.
    async fn fair_waiters(&self, name: &str) -> Option<usize> {
        let observer = self
            .observer
            .get_or_init(|| async {
                zk::Client::connect(&self.shared.server.connect_string())
                    .await
                    .expect("connect")
            })
            .await;
        match observer
            .list_children(&format!("{}/{name}", self.shared.root))
            .await
        {
            Ok(children) => Some(children.iter().filter(|c| c.starts_with("wait-")).count()),
            Err(zk::Error::NoNode) => Some(0),
            Err(e) => panic!("list the waiters of {name}: {e}"),
        }
    }
}

tenure_lease_kit::conformance_tests!(ZooKeeperHarness::start(); fair_queue, preemption_requests, remembered_ids, grant_changes);
tenure_lease_kit::preemption_fault_tests!(ZooKeeperHarness::start());
