//! The conformance suite against a real single-member etcd (each client its own
//! connection, as separate processes would have).

mod support;

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use tenure_lease::LeaseStore;
use tenure_lease::conformance::proxy::Proxy;
use tenure_lease::conformance::{AnswerDelay, Harness};

use support::{Etcd, PREFIX};

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
    /// Through a TCP proxy to the (single) member.
    async fn delayed_client(&self) -> (Arc<dyn LeaseStore>, Box<dyn AnswerDelay>) {
        let port = self.0.endpoint(0).rsplit(':').next().expect("port").parse();
        let proxy = Proxy::start(port.expect("a port"));
        let url = format!("http://127.0.0.1:{}", proxy.port);
        (Arc::new(self.0.store_on(vec![url]).await), Box::new(proxy))
    }
    /// Revokes the owner's sessions on the server.
    async fn expire_sessions(&self, owner: &str) {
        assert!(
            self.0.revoke_sessions_of(PREFIX, owner).await > 0,
            "{owner} has no session to end"
        );
    }
}

tenure_lease::conformance_tests!(async { EtcdHarness(Etcd::single().await) });
tenure_lease::preemption_fault_tests!(async { EtcdHarness(Etcd::single().await) });
