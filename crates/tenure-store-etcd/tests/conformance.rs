//! The conformance suite against a real single-member etcd (each client its own
//! connection, as separate processes would have).

mod support;
use support::EtcdStores;

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use tenure_lease::LeaseStore;
use tenure_lease_kit::conformance::state_loss::StateLoss;
use tenure_lease_kit::conformance::{AnswerDelay, Harness};

use tenure_test_kit::etcd::{Etcd, PREFIX};

struct EtcdHarness(Etcd, tempfile::TempDir);

impl EtcdHarness {
    async fn start() -> Self {
        EtcdHarness(Etcd::single().await, tempfile::tempdir().expect("temp dir"))
    }

    fn snapshot_file(&self) -> std::path::PathBuf {
        self.1.path().join("snapshot.db")
    }
}

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
        let (store, proxy) = self.0.store_via_proxy().await;
        (Arc::new(store), Box::new(proxy))
    }
    /// Revokes the owner's sessions on the server: those with a heartbeat key (holders),
    /// and those only fair waiters' keys are attached to (their value is the owner).
    async fn expire_sessions(&self, owner: &str) {
        let mut ended = self.0.revoke_sessions_of(PREFIX, owner).await;
        let mut client = etcd_client::Client::connect(self.0.endpoints(), None)
            .await
            .expect("etcd client");
        let waiters = client
            .get(
                format!("{PREFIX}waiters/"),
                Some(etcd_client::GetOptions::new().with_prefix()),
            )
            .await
            .expect("read the waiter keys");
        for kv in waiters.kvs() {
            if kv.value() == owner.as_bytes() && kv.lease() != 0 {
                match client.lease_revoke(kv.lease()).await {
                    Ok(_) => ended += 1,
                    // Revoked with its heartbeat key above, or expired meanwhile.
                    Err(e) if e.to_string().contains("lease not found") => {}
                    Err(e) => panic!("revoke session {:x} of {owner}: {e}", kv.lease()),
                }
            }
        }
        assert!(ended > 0, "{owner} has no session to end");
    }
    /// The waiter keys of `name` (`<prefix>waiters/<name length>/<name>/…`): each is
    /// attached to its waiter's session, so every one there holds the line.
    async fn fair_waiters(&self, name: &str) -> Option<usize> {
        let mut client = etcd_client::Client::connect(self.0.endpoints(), None)
            .await
            .expect("etcd client");
        let keys = client
            .get(
                format!("{PREFIX}waiters/{}/{name}/", name.len()),
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_count_only(),
                ),
            )
            .await
            .expect("count the waiter keys");
        Some(usize::try_from(keys.count()).expect("a count"))
    }
}

/// A snapshot restored without bumping revisions: they go back, and the store refuses.
#[async_trait]
impl StateLoss for EtcdHarness {
    async fn checkpoint(&self) {
        self.0.snapshot(0, &self.snapshot_file());
    }
    async fn lose_state(&self) {
        self.0.restore(&self.snapshot_file()).await;
    }
    fn resumes(&self) -> bool {
        false
    }
}

tenure_lease_kit::conformance_tests!(EtcdHarness::start(); fair_queue, holder_watch, preemption_requests, remembered_ids, grant_changes);
tenure_lease_kit::preemption_fault_tests!(EtcdHarness::start());
tenure_lease_kit::state_loss_tests!(EtcdHarness::start());
