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
    note       TEXT,
    priority   INTEGER NOT NULL DEFAULT 0,  -- the u64 priority, bit-cast to i64
    cleanup_ns INTEGER NOT NULL DEFAULT 0,
    -- The pending preemption request, if any (req_by NULL: none).
    req_by       TEXT,
    req_instance TEXT,
    req_priority INTEGER,
    req_forceful INTEGER NOT NULL DEFAULT 0,
    req_note     TEXT
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

/// Columns of `tenure_lease` added after its first version, with their definitions.
const ADDED_COLUMNS: [(&str, &str); 8] = [
    ("instance", "TEXT NOT NULL DEFAULT ''"),
    ("priority", "INTEGER NOT NULL DEFAULT 0"),
    ("cleanup_ns", "INTEGER NOT NULL DEFAULT 0"),
    ("req_by", "TEXT"),
    ("req_instance", "TEXT"),
    ("req_priority", "INTEGER"),
    ("req_forceful", "INTEGER NOT NULL DEFAULT 0"),
    ("req_note", "TEXT"),
];

/// Creates the tables and, if the host rebooted since the file was last used, expires
/// every grant (their deadlines were measured on the previous boot's clock).
pub(crate) fn migrate(conn: &mut Connection, boot_id: &str) -> rusqlite::Result<()> {
    conn.execute_batch(SCHEMA)?;
    // Files made by earlier versions get the columns added since.
    for (column, definition) in ADDED_COLUMNS {
        let exists = conn
            .prepare("SELECT 1 FROM pragma_table_info('tenure_lease') WHERE name = ?1")?
            .exists([column])?;
        if !exists {
            conn.execute_batch(&format!(
                "ALTER TABLE tenure_lease ADD COLUMN {column} {definition}"
            ))?;
        }
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tenure_lease::{AcquireOutcome, AcquireRequest, LeaseStore};

    use crate::SqliteStore;

    /// A file made before priorities (and before holder instances) opens with its grant
    /// intact, at priority 0 with nothing pending, and takes preemption requests.
    #[tokio::test]
    async fn files_of_earlier_versions_gain_the_new_columns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.sqlite");
        let boot = crate::clock::boot_id().unwrap();
        {
            let conn = rusqlite::Connection::open(&path).unwrap();
            conn.execute_batch(&format!(
                "CREATE TABLE tenure_lease (name TEXT PRIMARY KEY, owner TEXT NOT NULL,
                    token INTEGER NOT NULL, expires_at INTEGER NOT NULL,
                    version INTEGER NOT NULL, note TEXT);
                 CREATE TABLE tenure_fence (name TEXT PRIMARY KEY, last_token INTEGER NOT NULL);
                 CREATE TABLE tenure_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
                 INSERT INTO tenure_meta VALUES ('boot_id', '{boot}');
                 INSERT INTO tenure_fence VALUES ('old', 4);
                 INSERT INTO tenure_lease VALUES ('old', 'a', 4, {}, 1, 'kept');",
                crate::clock::now_ns() + 60_000_000_000
            ))
            .unwrap();
        }
        let store = SqliteStore::open(&path, Duration::from_secs(1)).unwrap();
        let rec = store.read("old").await.unwrap().expect("grant kept");
        assert_eq!(
            (
                rec.owner.as_str(),
                rec.token,
                rec.note.as_deref(),
                rec.priority
            ),
            ("a", 4, Some("kept"), 0)
        );
        assert_eq!(rec.request, None);
        let req = AcquireRequest {
            name: "old".into(),
            owner: "b".into(),
            instance: "b-1".into(),
            ttl: Duration::from_secs(5),
            ..AcquireRequest::default()
        };
        assert!(matches!(
            store.try_acquire(&req).await.unwrap(),
            AcquireOutcome::Held(_)
        ));
        let ask = tenure_lease::PreemptionRequest {
            by: "b".into(),
            priority: 3,
            ..Default::default()
        };
        assert!(matches!(
            store.request_preemption("old", 4, &ask).await.unwrap(),
            tenure_lease::PreemptAnswer::Recorded(_)
        ));
    }
}
