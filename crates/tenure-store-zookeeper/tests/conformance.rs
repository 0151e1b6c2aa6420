//! The conformance suite against a real ZooKeeper server (Debian's `zookeeper` package).

mod common;

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure_lease::LeaseStore;
use tenure_lease::conformance::{Harness, test_settings};

/// The longest ttl the suite asks for.
const SESSION_TIMEOUT: Duration = Duration::from_secs(5);

struct ZooKeeperHarness(common::Shared);

#[async_trait]
impl Harness for ZooKeeperHarness {
    async fn client(&self) -> Arc<dyn LeaseStore> {
        Arc::new(
            self.0
                .store(SESSION_TIMEOUT, test_settings().lease_operation_timeout),
        )
    }

    /// Stops the JVM and starts it on the same data directory and port.
    async fn restart(&self) {
        self.0.restart().await;
    }

    /// Freezes the JVM (SIGSTOP) until the guard drops.
    async fn outage(&self) -> Box<dyn Any + Send> {
        Box::new(self.0.server.pause())
    }
}

tenure_lease::conformance_tests!(async { ZooKeeperHarness(common::exclusive().await) });
tenure_lease::preemption_fault_tests!(async { ZooKeeperHarness(common::exclusive().await) });
