//! The journal conformance kit against the PostgreSQL journal, on a real server per test
//! (Debian's `postgresql`). Every client (lease store and journal) has its own connection
//! pool, as another process would.

mod support;
use support::PgOptions;

use std::sync::Arc;

use async_trait::async_trait;
use tenure_journal::Journal;
use tenure_journal::conformance::JournalHarness;
use tenure_lease::LeaseStore;
use tenure_lease_kit::conformance::test_settings;
use tenure_store_postgres::{PostgresJournal, PostgresStore};
use tenure_test_kit::postgres::{Exclusive, PgServer};

struct PgJournal {
    server: Arc<PgServer>,
    _exclusive: Exclusive,
}

impl PgJournal {
    async fn start() -> Self {
        let exclusive = Exclusive::start().await;
        PgJournal {
            server: exclusive.server.clone(),
            _exclusive: exclusive,
        }
    }

    async fn store(&self) -> PostgresStore {
        let options = self.server.options(test_settings().lease_operation_timeout);
        PostgresStore::connect(options).await.expect("connect")
    }
}

#[async_trait]
impl JournalHarness for PgJournal {
    async fn leases(&self) -> Arc<dyn LeaseStore> {
        Arc::new(self.store().await)
    }

    async fn journal(&self) -> Arc<dyn Journal> {
        let store = self.store().await;
        Arc::new(
            PostgresJournal::open(&store)
                .await
                .expect("open the journal"),
        )
    }
}

tenure_journal::journal_conformance_tests!(PgJournal::start());
