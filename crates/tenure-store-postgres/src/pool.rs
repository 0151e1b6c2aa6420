//! The store's connection pool: deadpool-postgres's connections, each with the store's
//! statements prepared on it at most once, kept in fixed slots.
//!
//! deadpool-postgres's own `prepare_cached` looks a statement up by its full text, which
//! hashes and compares the text (several kilobytes for the acquire statement) on every
//! call: the costliest thing the store did per operation besides the round trip itself.
//! A slot per statement costs an index.

use std::ops::{Deref, DerefMut};

use deadpool::managed::{self, Metrics, RecycleResult};
use deadpool_postgres::ClientWrapper;
use tokio::sync::OnceCell;
use tokio_postgres::Statement;

use crate::sql::{Sql, Statements};

/// Makes and recycles the pool's [`Connection`]s: deadpool-postgres's manager does the
/// connecting and the recycling check, this adds the statement slots.
pub struct Connector {
    inner: deadpool_postgres::Manager,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector").finish_non_exhaustive()
    }
}

impl Connector {
    pub(crate) fn new(inner: deadpool_postgres::Manager) -> Connector {
        Connector { inner }
    }
}

impl managed::Manager for Connector {
    type Type = Connection;
    type Error = tokio_postgres::Error;

    async fn create(&self) -> Result<Connection, tokio_postgres::Error> {
        Ok(Connection {
            client: self.inner.create().await?,
            prepared: Default::default(),
        })
    }

    async fn recycle(
        &self,
        connection: &mut Connection,
        metrics: &Metrics,
    ) -> RecycleResult<tokio_postgres::Error> {
        self.inner.recycle(&mut connection.client, metrics).await
    }

    fn detach(&self, connection: &mut Connection) {
        self.inner.detach(&mut connection.client)
    }
}

/// A pooled connection, as [`PostgresStore::connection`](crate::PostgresStore::connection)
/// hands it out: it dereferences to deadpool-postgres's client (transactions,
/// `prepare_cached`, everything of `tokio_postgres::Client`).
pub type Pooled = managed::Object<Connector>;

/// One connection of the pool and the store's statements prepared on it so far.
pub struct Connection {
    client: ClientWrapper,
    /// Slot `Sql as usize`: that statement, prepared on this connection (a statement is
    /// only valid on the connection that prepared it).
    prepared: [OnceCell<Statement>; Sql::COUNT],
}

impl Connection {
    /// Statement `sql` of `statements`, prepared on this connection at its first use (one
    /// round trip then, none after). A failed preparation leaves the slot empty.
    pub(crate) async fn statement(
        &self,
        sql: Sql,
        statements: &Statements,
    ) -> Result<Statement, tokio_postgres::Error> {
        self.prepared[sql as usize]
            .get_or_try_init(|| self.client.prepare(statements.text(sql)))
            .await
            .cloned()
    }
}

impl Deref for Connection {
    type Target = ClientWrapper;

    fn deref(&self) -> &ClientWrapper {
        &self.client
    }
}

impl DerefMut for Connection {
    fn deref_mut(&mut self) -> &mut ClientWrapper {
        &mut self.client
    }
}
