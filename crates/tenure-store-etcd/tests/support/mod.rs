//! What this crate's tests and benches build on the test kit's etcd: store clients.
#![allow(dead_code, reason = "each test binary uses its own part of it")]

use tenure_store_etcd::EtcdStore;
use tenure_test_kit::etcd::{Etcd, PREFIX};

/// Store clients of a test etcd, under the test kit's key prefix.
#[allow(async_fn_in_trait, reason = "test support, awaited on one runtime")]
pub trait EtcdStores {
    /// A store client on every member, as another process would open it.
    async fn store(&self) -> EtcdStore;
    /// A store client on `endpoints`.
    async fn store_on(&self, endpoints: Vec<String>) -> EtcdStore;
}

impl EtcdStores for Etcd {
    async fn store(&self) -> EtcdStore {
        EtcdStore::new(self.client().await, PREFIX)
    }

    async fn store_on(&self, endpoints: Vec<String>) -> EtcdStore {
        EtcdStore::new(self.client_on(endpoints).await, PREFIX)
    }
}
