//! The conformance suite against a real PostgreSQL server per test (Debian's `postgresql`).

mod support;
use support::PgOptions;

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use tenure_lease::LeaseStore;
use tenure_lease_kit::conformance::proxy::Proxy;
use tenure_lease_kit::conformance::state_loss::StateLoss;
use tenure_lease_kit::conformance::{AnswerDelay, Harness, test_settings};
use tenure_store_postgres::PostgresStore;
use tenure_test_kit::postgres::{Exclusive, PgServer};

struct PgHarness {
    server: Arc<PgServer>,
    /// A client that counts fair waiters, connected at first use.
    observer: tokio::sync::OnceCell<PostgresStore>,
    _exclusive: Exclusive,
}

impl PgHarness {
    async fn start() -> Self {
        let exclusive = Exclusive::start().await;
        PgHarness {
            server: exclusive.server.clone(),
            observer: tokio::sync::OnceCell::new(),
            _exclusive: exclusive,
        }
    }
}

#[async_trait]
impl Harness for PgHarness {
    /// Its own connection pool, as another process would have.
    async fn client(&self) -> Arc<dyn LeaseStore> {
        let options = self.server.options(test_settings().lease_operation_timeout);
        Arc::new(PostgresStore::connect(options).await.expect("connect"))
    }

    /// Fast shutdown and start on the same data directory and port.
    async fn restart(&self) {
        let server = self.server.clone();
        tokio::task::spawn_blocking(move || server.restart())
            .await
            .expect("restart");
    }

    /// Every server process stopped with SIGSTOP: open connections hang, new ones are
    /// never answered.
    async fn outage(&self) -> Box<dyn Any + Send> {
        Box::new(self.server.freeze())
    }

    /// Its own pool, connected through a TCP proxy to the server.
    async fn delayed_client(&self) -> (Arc<dyn LeaseStore>, Box<dyn AnswerDelay>) {
        let proxy = Proxy::start(self.server.port());
        let options = self
            .server
            .options_via(proxy.port, test_settings().lease_operation_timeout);
        let store = PostgresStore::connect(options).await.expect("connect");
        (Arc::new(store), Box::new(proxy))
    }

    /// The rows of `name` in the waiters' table, expired or not (a row that was not
    /// removed counts until a later waiter's join removes it), counted with the store's own statement.
    async fn fair_waiters(&self, name: &str) -> Option<usize> {
        let store = self
            .observer
            .get_or_init(|| async {
                let options = self.server.options(test_settings().lease_operation_timeout);
                PostgresStore::connect(options).await.expect("connect")
            })
            .await;
        let conn = store.connection().await.expect("a connection");
        let count: i64 = conn
            .query_one(&store.statements().waiting, &[&name])
            .await
            .expect("count the waiters")
            .get(1);
        Some(usize::try_from(count).expect("a count"))
    }
}

/// A fail-over to a replica that had not received the latest commits: the data directory
/// rolled back to a copy. The token sequence goes back; clients that saw later tokens
/// refuse for one ttl and advance it.
#[async_trait]
impl StateLoss for PgHarness {
    async fn checkpoint(&self) {
        let server = self.server.clone();
        tokio::task::spawn_blocking(move || server.checkpoint())
            .await
            .expect("checkpoint");
    }
    async fn lose_state(&self) {
        let server = self.server.clone();
        tokio::task::spawn_blocking(move || server.roll_back())
            .await
            .expect("roll back");
    }
    fn resumes(&self) -> bool {
        true
    }
}

tenure_lease_kit::conformance_tests!(PgHarness::start(); fair_queue, preemption_requests, remembered_ids, grant_changes);
tenure_lease_kit::state_loss_tests!(PgHarness::start());
tenure_lease_kit::preemption_fault_tests!(PgHarness::start());
