//! The demo's fenced counter in a SQLite file of its own: the smallest resource that checks
//! fencing tokens in the same statement as the write, as a guarded database should. The
//! demo's singleton and sharded counter write it, the fault suite and `tenure check
//! --counter` read it, and the examples show it as a model for fencing your own tables (on
//! the lease file itself, `tenure::sqlite::fence::check` does the same in your transaction).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::sqlite::rusqlite::{self, Connection, OptionalExtension, params};
use tenure::{ConfigError, FencingToken, StoreError};

const CREATE: &str = "CREATE TABLE IF NOT EXISTS tenure_fenced_counter (
    name TEXT PRIMARY KEY NOT NULL,
    value INTEGER NOT NULL,
    token INTEGER NOT NULL
)";

/// Adds one unless a newer token already wrote: the token check and the write are one
/// statement, so no late writer can slip between them.
const INCREMENT: &str = "INSERT INTO tenure_fenced_counter (name, value, token) VALUES (?1, 1, ?2)
    ON CONFLICT (name) DO UPDATE SET value = value + 1, token = excluded.token
    WHERE excluded.token >= tenure_fenced_counter.token
    RETURNING value";

/// Counters that refuse writes carrying a token older than the newest one accepted.
#[derive(Clone)]
pub struct FencedCounter {
    conn: Arc<Mutex<Connection>>,
}

impl FencedCounter {
    /// Opens (creating) the counters in the SQLite file at `path`.
    pub fn open(path: &Path) -> Result<FencedCounter, ConfigError> {
        let err = |e: rusqlite::Error| ConfigError::StorePath {
            path: path.display().to_string(),
            detail: e.to_string(),
        };
        let conn = Connection::open(path).map_err(err)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        conn.execute(CREATE, []).map_err(err)?;
        Ok(FencedCounter {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Adds one to counter `name` with fencing token `token`: `Ok(Some(value))` accepted,
    /// `Ok(None)` refused because a newer token wrote already, `Err` if the file failed.
    pub fn increment(&self, name: &str, token: FencingToken) -> Result<Option<u64>, StoreError> {
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let token = i64::try_from(token.get())
            .map_err(|_| StoreError::backend("sqlite", "token beyond i64"))?;
        let err =
            |e: rusqlite::Error| StoreError::unavailable("sqlite", e.to_string()).caused_by(e);
        // An explicit transaction: in autocommit, the commit happens when the statement is
        // reset after its RETURNING row was read, and an error there (a full disk, a busy
        // file) would be lost, reporting a value that was never written.
        let tx = conn.transaction().map_err(err)?;
        let value = tx
            .query_row(INCREMENT, params![name, token], |row| row.get::<_, i64>(0))
            .optional()
            .map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(value.map(|v| v as u64))
    }

    /// The value and last token of counter `name`.
    pub fn get(&self, name: &str) -> Result<Option<(u64, FencingToken)>, StoreError> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        conn.query_row(
            "SELECT value, token FROM tenure_fenced_counter WHERE name = ?1",
            params![name],
            |row| {
                Ok((
                    row.get::<_, i64>(0)? as u64,
                    FencingToken::new(row.get::<_, i64>(1)? as u64),
                ))
            },
        )
        .optional()
        .map_err(|e| StoreError::unavailable("sqlite", e.to_string()).caused_by(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_tokens_are_refused_equal_and_newer_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let c = FencedCounter::open(&dir.path().join("f.sqlite")).unwrap();
        let t = FencingToken::new;
        assert_eq!(c.increment("n", t(3)).unwrap(), Some(1));
        assert_eq!(c.increment("n", t(3)).unwrap(), Some(2));
        assert_eq!(c.increment("n", t(2)).unwrap(), None, "stale token refused");
        assert_eq!(c.increment("n", t(5)).unwrap(), Some(3));
        assert_eq!(c.increment("n", t(3)).unwrap(), None);
        assert_eq!(c.get("n").unwrap(), Some((3, t(5))));
        assert_eq!(c.get("other").unwrap(), None);
    }
}
