//! The conformance suite against the in-memory store.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use tenure_lease::{Fault, LeaseStore, MemoryStore};
use tenure_lease_kit::conformance::{AnswerDelay, FaultyClient, Harness};

struct MemoryHarness {
    namespace: String,
}

impl MemoryHarness {
    async fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        MemoryHarness {
            namespace: format!("conformance-{}", NEXT.fetch_add(1, Ordering::SeqCst)),
        }
    }
}

struct Outage(MemoryStore);
impl Drop for Outage {
    fn drop(&mut self) {
        self.0.set_fault(Fault::None);
    }
}

#[async_trait]
impl Harness for MemoryHarness {
    async fn client(&self) -> Arc<dyn LeaseStore> {
        Arc::new(MemoryStore::shared(&self.namespace))
    }
    async fn fair_waiters(&self, name: &str) -> Option<usize> {
        Some(MemoryStore::shared(&self.namespace).fair_waiters(name))
    }
    /// The memory store lives as long as the process; a restart is a fresh handle on it.
    async fn restart(&self) {}
    async fn outage(&self) -> Box<dyn Any + Send> {
        let store = MemoryStore::shared(&self.namespace);
        store.set_fault(Fault::Hang);
        Box::new(Outage(store))
    }
    /// Late answers at the store SPI: the memory store has no wire.
    async fn delayed_client(&self) -> (Arc<dyn LeaseStore>, Box<dyn AnswerDelay>) {
        let client = FaultyClient::new(self.client().await);
        (client.clone(), Box::new(client))
    }
}

tenure_lease_kit::conformance_tests!(MemoryHarness::new(); fair_queue, preemption_requests, remembered_ids, grant_changes);
