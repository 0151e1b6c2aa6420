//! The PostgreSQL journal: events and snapshots of durable entities in tables beside the
//! lease table (`<table>_journal`, `<table>_snapshot`), every write in one transaction with
//! the store's fenced check ([`Fence`](crate::Fence): the grant is locked `FOR KEY SHARE`
//! until the commit, so no later grant of the lease can commit in between, while the
//! holder's renewals, which change no key column, do not wait for the appends).
//!
//! **Group commit.** One writer task per journal writes every append and snapshot waiting
//! at once in one transaction (at most [`PostgresJournal::with_max_batch`] of them), in a
//! constant number of round trips whatever their number: one statement checks every grant
//! of the batch (each locked as the fence locks it), one reads the last sequence number of
//! every journal written to, each write is refused alone or accepted in order, one
//! statement inserts the accepted events and one saves the snapshots, and one commit makes
//! them all durable. Should another transaction write one of the batch's sequence numbers
//! in between, the batch is written again one savepoint per write, each with its own
//! checks, so each answer is what that write alone would have got. A batch the server
//! rolled back (a deadlock, a serialisation failure) is tried again; any other failure is
//! reported to each write as an unknown outcome. Every batch is bounded by the store's
//! operation timeout.

#[cfg(test)]
mod batch_tests;
pub mod sql;
mod writer;

use std::sync::Arc;

use async_trait::async_trait;
use tenure_journal::group::{GroupCommit, Write};
use tenure_journal::{
    Append, Journal, JournalError, SaveSnapshot, Snapshot, StoredEvent, Written, bigint_bounds,
    check_persistence_id,
};
use tenure_lease::StoreError;

use crate::PostgresStore;
use crate::error;
use crate::fence::Fence;
use sql::JournalStatements;

/// Most writes in one transaction by default.
pub const DEFAULT_MAX_BATCH: usize = 256;

/// A journal in the lease store's database (see the module docs). Cloning shares the
/// writer.
#[derive(Clone)]
pub struct PostgresJournal {
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    store: PostgresStore,
    statements: JournalStatements,
    fence: Fence,
    server: String,
    group: GroupCommit,
}

impl std::fmt::Debug for PostgresJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresJournal")
            .field("store", &self.shared.store)
            .finish()
    }
}

impl PostgresJournal {
    /// A journal beside `store`'s lease table, fenced by its leases, sharing its connection
    /// pool; creates the journal's tables when missing.
    pub async fn open(store: &PostgresStore) -> Result<Self, JournalError> {
        let options = store.options();
        let statements = JournalStatements::new(&options.schema, &options.table);
        let migrate = statements.migrate.clone();
        store
            .run(
                options.connect_timeout.max(options.operation_timeout),
                true,
                |c, _| {
                    let migrate = migrate.clone();
                    Box::pin(async move { c.batch_execute(&migrate).await.map_err(|e| (true, e)) })
                },
            )
            .await
            .map_err(|e| JournalError::store("", "create the journal tables", e))?;
        Ok(PostgresJournal {
            shared: Arc::new(Shared {
                store: store.clone(),
                fence: store.fence(),
                server: options.server(),
                statements,
                group: GroupCommit::new(DEFAULT_MAX_BATCH),
            }),
        })
    }

    /// This journal (and its clones) writing at most `max_batch` appends and snapshots per
    /// transaction (at least 1: one transaction per write), from its first write on: call
    /// it before.
    pub fn with_max_batch(self, max_batch: usize) -> Self {
        self.shared.group.set_max_batch(max_batch);
        self
    }

    /// The SQL the journal runs.
    pub fn statements(&self) -> &JournalStatements {
        &self.shared.statements
    }

    async fn write(&self, write: Write) -> Result<Written, JournalError> {
        let shared = self.shared.clone();
        self.shared
            .group
            .submit(write, move |batches| {
                tokio::spawn(writer::run(shared, batches));
                Ok(())
            })
            .await
    }

    /// Runs `query` on a pooled connection, bounded by the operation timeout.
    async fn query(
        &self,
        persistence_id: &str,
        operation: &'static str,
        statement: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, JournalError> {
        let failed = |e: StoreError| JournalError::store(persistence_id, operation, e);
        let shared = &self.shared;
        let limit = shared.store.options().operation_timeout;
        let conn = shared.store.connection().await.map_err(failed)?;
        match tokio::time::timeout(limit, conn.query(statement, params)).await {
            Ok(Ok(rows)) => Ok(rows),
            Ok(Err(e)) => Err(failed(error::from_pg(&shared.server, e).error)),
            Err(_) => {
                drop(deadpool::managed::Object::take(conn));
                Err(failed(error::timed_out(&shared.server, limit)))
            }
        }
    }
}

#[async_trait]
impl Journal for PostgresJournal {
    fn kind(&self) -> &'static str {
        error::STORE
    }

    async fn append(&self, append: Append) -> Result<Written, JournalError> {
        append.check()?;
        self.write(Write::Append(append)).await
    }

    async fn read(
        &self,
        persistence_id: &str,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, JournalError> {
        check_persistence_id(persistence_id)?;
        let (from, max) = bigint_bounds(from, max);
        let rows = self
            .query(
                persistence_id,
                "read",
                &self.shared.statements.read,
                &[&persistence_id, &from, &max],
            )
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| StoredEvent::from_columns(r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect())
    }

    async fn save_snapshot(&self, snapshot: SaveSnapshot) -> Result<Written, JournalError> {
        snapshot.check()?;
        self.write(Write::Snapshot(snapshot)).await
    }

    async fn load_snapshot(&self, persistence_id: &str) -> Result<Option<Snapshot>, JournalError> {
        check_persistence_id(persistence_id)?;
        let rows = self
            .query(
                persistence_id,
                "load snapshot",
                &self.shared.statements.load_snapshot,
                &[&persistence_id],
            )
            .await?;
        Ok(rows
            .into_iter()
            .next()
            .map(|r| Snapshot::from_columns(r.get(0), r.get(1), r.get(2))))
    }

    async fn persistence_ids(&self) -> Result<Vec<String>, JournalError> {
        let rows = self
            .query("", "list", &self.shared.statements.persistence_ids, &[])
            .await?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }
}
