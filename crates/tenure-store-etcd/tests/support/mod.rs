//! What this crate's tests and benches build on the test kit's etcd: store clients.
#![allow(dead_code, reason = "each test binary uses its own part of it")]

use tenure_lease_kit::conformance::proxy::Proxy;
use tenure_store_etcd::EtcdStore;
use tenure_test_kit::etcd::{Etcd, PREFIX};

/// Store clients of a test etcd, under the test kit's key prefix.
#[allow(async_fn_in_trait, reason = "test support, awaited on one runtime")]
pub trait EtcdStores {
    /// A store client on every member, as another process would open it.
    async fn store(&self) -> EtcdStore;
    /// A store client on `endpoints`.
    async fn store_on(&self, endpoints: Vec<String>) -> EtcdStore;
    /// A store client that reaches member 0 through a TCP proxy of its own (to cut its
    /// traffic or hold the server's answers back), and that proxy.
    async fn store_via_proxy(&self) -> (EtcdStore, Proxy);
}

impl EtcdStores for Etcd {
    async fn store(&self) -> EtcdStore {
        EtcdStore::new(self.client().await, PREFIX)
    }

    async fn store_on(&self, endpoints: Vec<String>) -> EtcdStore {
        EtcdStore::new(self.client_on(endpoints).await, PREFIX)
    }

    async fn store_via_proxy(&self) -> (EtcdStore, Proxy) {
        let port = self
            .endpoint(0)
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("the member's client URL ends in :port");
        let proxy = Proxy::start(port);
        let store = self
            .store_on(vec![format!("http://127.0.0.1:{}", proxy.port)])
            .await;
        (store, proxy)
    }
}
