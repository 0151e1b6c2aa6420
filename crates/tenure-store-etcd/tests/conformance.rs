//! The conformance suite against a real single-member etcd (each client its own
//! connection, as separate processes would have).

mod support;

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use tenure_lease::LeaseStore;
use tenure_lease::conformance::Harness;

use support::Etcd;

struct EtcdHarness(Etcd);

#[async_trait]
impl Harness for EtcdHarness {
    async fn client(&self) -> Arc<dyn LeaseStore> {
        Arc::new(self.0.store().await)
    }
    /// SIGTERM and start again on the same data directory and ports.
    async fn restart(&self) {
        self.0.restart_all().await;
    }
    /// SIGSTOP: every request hangs past any operation timeout.
    async fn outage(&self) -> Box<dyn Any + Send> {
        Box::new(self.0.freeze())
    }
}

tenure_lease::conformance_tests!(async { EtcdHarness(Etcd::single().await) });
tenure_lease::preemption_fault_tests!(async { EtcdHarness(Etcd::single().await) });
