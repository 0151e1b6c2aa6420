//! The idempotent migration run when a store opens.

use crate::sql::Statements;

/// Creates what is missing (schema, token sequence, lease table, owner index). The
/// statements go as one simple query, which PostgreSQL runs as one transaction; an advisory
/// lock taken first serialises concurrent first starts, and every statement is
/// `IF NOT EXISTS`, so running it again changes nothing.
pub(crate) async fn migrate(
    client: &tokio_postgres::Client,
    statements: &Statements,
) -> Result<(), tokio_postgres::Error> {
    client.batch_execute(&statements.migrate).await
}
