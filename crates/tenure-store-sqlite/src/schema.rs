//! Tables, created idempotently on open.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

/// `tenure_lease`: the current grant per name (expired rows are ignored and replaced).
/// `tenure_fence`: the highest token issued per name; never deleted.
/// `tenure_waiter`: fair acquires in line, per name in `seq` order (`AUTOINCREMENT`: a
/// `seq` is never reused), each with its own expiry, refreshed while it waits.
/// `tenure_remembered`: the ids remembered per lease name (`RememberedIds::remember`): not
/// grants, so kept across reboots, unlike `tenure_lease`'s rows.
/// `tenure_meta`: `boot_id`, the boot the `expires_at` values are measured in; `clock`, the
/// clock they are measured on (`boottime`; absent in files of earlier versions, which used
/// `CLOCK_MONOTONIC`); `lost_at`, when a process last found the state of the file at this
/// path lost (see `SqliteStore`).
/// `tenure_identity`: one row, the file's random store id and its generation (see
/// `identity`).
/// `tenure_change`: per prefix a process asked about (`GrantChanges::changes_since`), a
/// count of the grants under it made and ended, bumped in the transaction that makes or
/// ends one; it starts at the wall clock in microseconds, so that a count of a lost earlier
/// file at this path is not taken for it. `tenure_lease_expiry` finds the grants that
/// expired between two checks without reading the others.
pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tenure_lease (
    name       TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    instance   TEXT NOT NULL,
    token      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,  -- CLOCK_BOOTTIME nanoseconds of the boot in tenure_meta
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
CREATE INDEX IF NOT EXISTS tenure_lease_expiry ON tenure_lease (expires_at);
CREATE TABLE IF NOT EXISTS tenure_change (
    prefix  TEXT PRIMARY KEY,
    changes INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tenure_fence (
    name       TEXT PRIMARY KEY,
    last_token INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS tenure_waiter (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    name       TEXT NOT NULL,
    owner      TEXT NOT NULL,
    instance   TEXT NOT NULL,
    expires_at INTEGER NOT NULL   -- CLOCK_BOOTTIME nanoseconds, as in tenure_lease
);
CREATE INDEX IF NOT EXISTS tenure_waiter_line ON tenure_waiter (name, seq);
CREATE TABLE IF NOT EXISTS tenure_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tenure_identity (
    one        INTEGER PRIMARY KEY CHECK (one = 1),
    store      TEXT NOT NULL,
    generation INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS tenure_remembered (
    name TEXT NOT NULL,
    id   TEXT NOT NULL,
    PRIMARY KEY (name, id)
) WITHOUT ROWID;
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

/// The clock `expires_at` is measured on, as recorded in `tenure_meta`.
const CLOCK: &str = "boottime";

fn meta(tx: &rusqlite::Transaction<'_>, key: &str) -> rusqlite::Result<Option<String>> {
    // Cached: every new grant reads `lost_at`.
    tx.prepare_cached(crate::sql::META)?
        .query_row([key], |r| r.get(0))
        .optional()
}

fn set_meta(tx: &rusqlite::Transaction<'_>, key: &str, value: &str) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO tenure_meta (key, value) VALUES (?1, ?2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        params![key, value],
    )?;
    Ok(())
}

/// Creates the tables (and the identity of a file without one) and, if the host rebooted
/// since the file was last used, expires every grant and removes every fair waiter (their
/// deadlines were measured on the previous boot's clock). Expiries of
/// the current boot written on `CLOCK_MONOTONIC` (earlier versions) move to
/// `CLOCK_BOOTTIME`: the same instants, plus the time the host has been suspended.
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
    tx.execute(
        crate::sql::CREATE_IDENTITY_IF_NONE,
        [crate::identity::next(0)],
    )?;
    let recorded = meta(&tx, "boot_id")?;
    if recorded.as_deref() != Some(boot_id) {
        let dropped = tx.execute("DELETE FROM tenure_lease", [])?;
        tx.execute(crate::sql::CHANGED_ALL, [])?;
        // Waiters' expiries were on the previous boot's clock too, and no waiter survived.
        tx.execute("DELETE FROM tenure_waiter", [])?;
        // No process that could believe in a grant of the lost file survived the reboot.
        tx.execute("DELETE FROM tenure_meta WHERE key = 'lost_at'", [])?;
        if recorded.is_some() {
            tracing::info!(
                dropped,
                "host rebooted since the lease file was last used: all grants expired"
            );
        }
        set_meta(&tx, "boot_id", boot_id)?;
    } else if meta(&tx, "clock")?.as_deref() != Some(CLOCK) {
        let suspended =
            i64::try_from(tenure_lease::clock::host_suspended().as_nanos()).unwrap_or(i64::MAX);
        tx.execute(
            "UPDATE tenure_lease SET expires_at = expires_at + ?1",
            [suspended],
        )?;
    }
    set_meta(&tx, "clock", CLOCK)?;
    tx.commit()
}

/// Notes in `tx` that the file's state was found lost at `now` (`CLOCK_BOOTTIME` ns):
/// grants of the lost state may be believed until `now + ttl`. Keeps a later record.
pub(crate) fn note_loss(tx: &rusqlite::Transaction<'_>, now: i64) -> rusqlite::Result<()> {
    let known = meta(tx, "lost_at")?.and_then(|v| v.parse::<i64>().ok());
    if known.is_none_or(|k| k < now) {
        set_meta(tx, "lost_at", &now.to_string())?;
    }
    Ok(())
}

/// When a process last found the file at this path lost (`CLOCK_BOOTTIME` ns), if ever in
/// this boot.
pub(crate) fn lost_at(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<Option<i64>> {
    Ok(meta(tx, "lost_at")?.and_then(|v| v.parse().ok()))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tenure_lease::{
        AcquireOutcome, AcquireRequest, FencingToken, LeaseStore, PreemptionRequests,
    };

    use crate::SqliteStore;

    /// A file made before priorities (and before holder instances, and on CLOCK_MONOTONIC)
    /// opens with its grant intact, at priority 0 with nothing pending, and takes
    /// preemption requests.
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
                tenure_lease::clock::monotonic_now_ns() + 60_000_000_000
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
            ("a", FencingToken::new(4), Some("kept"), 0)
        );
        assert_eq!(rec.request, None);
        // The expiry was on CLOCK_MONOTONIC: converted to CLOCK_BOOTTIME, the same instant.
        assert!(
            rec.expires_in > Duration::from_secs(59) && rec.expires_in <= Duration::from_secs(60),
            "{:?}",
            rec.expires_in
        );
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
            store
                .request_preemption("old", FencingToken::new(4), &ask)
                .await
                .unwrap(),
            tenure_lease::PreemptAnswer::Recorded(_)
        ));
    }
}
