//! The conformance kit against the in-memory journal and the in-memory lease store.

use std::sync::Arc;

use async_trait::async_trait;
use tenure_journal::conformance::JournalHarness;
use tenure_journal::{Journal, MemoryJournal};
use tenure_lease::{LeaseStore, MemoryStore};

struct Memory {
    journal: MemoryJournal,
}

#[async_trait]
impl JournalHarness for Memory {
    async fn leases(&self) -> Arc<dyn LeaseStore> {
        Arc::new(self.journal.leases().clone())
    }

    async fn journal(&self) -> Arc<dyn Journal> {
        Arc::new(self.journal.clone())
    }
}

tenure_journal::journal_conformance_tests!(async {
    Memory {
        journal: MemoryJournal::new(MemoryStore::new()),
    }
});
