//! Tables, created idempotently on open.

use rusqlite::{Connection, TransactionBehavior, params};

/// `tenure_lease`: the current grant per name (expired rows are ignored and replaced).
/// `tenure_fence`: the highest token issued per name; never deleted.
/// `tenure_meta`: the boot id the `expires_at` values are measured in.
pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tenure_lease (
    name       TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    instance   TEXT NOT NULL,
    token      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,  -- CLOCK_MONOTONIC nanoseconds of the boot in tenure_meta
    version    INTEGER NOT NULL,
    note       TEXT
);
CREATE INDEX IF NOT EXISTS tenure_lease_owner ON tenure_lease (owner);
CREATE TABLE IF NOT EXISTS tenure_fence (
    name       TEXT PRIMARY KEY,
    last_token INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS tenure_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
";

/// Creates the tables and, if the host rebooted since the file was last used, expires
/// every grant (their deadlines were measured on the previous boot's clock).
pub(crate) fn migrate(conn: &mut Connection, boot_id: &str) -> rusqlite::Result<()> {
    conn.execute_batch(SCHEMA)?;
    // Files made before holder instances existed get the column.
    let has_instance = conn
        .prepare("SELECT 1 FROM pragma_table_info('tenure_lease') WHERE name = 'instance'")?
        .exists([])?;
    if !has_instance {
        conn.execute_batch(
            "ALTER TABLE tenure_lease ADD COLUMN instance TEXT NOT NULL DEFAULT ''",
        )?;
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let recorded: Option<String> = tx
        .query_row(
            "SELECT value FROM tenure_meta WHERE key = 'boot_id'",
            [],
            |r| r.get(0),
        )
        .map(Some)
        .or_else(|e| match e {
            rusqlite::Error::QueryReturnedNoRows => Ok(None),
            e => Err(e),
        })?;
    if recorded.as_deref() != Some(boot_id) {
        let dropped = tx.execute("DELETE FROM tenure_lease", [])?;
        if recorded.is_some() {
            tracing::info!(
                dropped,
                "host rebooted since the lease file was last used: all grants expired"
            );
        }
        tx.execute(
            "INSERT INTO tenure_meta (key, value) VALUES ('boot_id', ?1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            params![boot_id],
        )?;
    }
    tx.commit()
}
