//! The journal's SQL, in one place: the journal runs it, and the benchmark issues the very
//! same fenced insert by hand as its baseline.

use rusqlite::OptionalExtension;

/// Tables of the journal, created idempotently when a journal opens its file.
/// `tenure_journal`: one row per event, `ordering` the order of commits across persistence
/// ids, unique (`persistence_id`, `seq`); `token` and `writer` the fence it was appended
/// under; `written_at` the wall clock in milliseconds (for people, never for decisions).
/// `tenure_snapshot`: the latest snapshot per persistence id.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tenure_journal (
    ordering       INTEGER PRIMARY KEY,
    persistence_id TEXT NOT NULL,
    seq            INTEGER NOT NULL,
    token          INTEGER NOT NULL,
    writer         TEXT NOT NULL,
    written_at     INTEGER NOT NULL,
    payload        BLOB NOT NULL,
    UNIQUE (persistence_id, seq)
);
CREATE TABLE IF NOT EXISTS tenure_snapshot (
    persistence_id TEXT PRIMARY KEY,
    seq            INTEGER NOT NULL,
    token          INTEGER NOT NULL,
    payload        BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS tenure_journal_floor (
    lease TEXT PRIMARY KEY,
    token INTEGER NOT NULL
);
";

/// Takes the journal file's write lock and no other: an update of no row of a table of
/// the journal file (`main`), run first in a `DEFERRED` transaction. Its statement names
/// no attached file, so the lease file's write lock stays free for grants and renewals.
pub const LOCK: &str = "UPDATE main.tenure_journal_floor SET token = token WHERE 0";

/// The token floor of lease `?1`: the token of the latest grant whose holder claimed the
/// journal (see [`claim_in`]); writes under a lower token are refused.
pub const FLOOR: &str = "SELECT token FROM main.tenure_journal_floor WHERE lease = ?1";

/// Raises the floor of lease `?1` to token `?2` (never lowers it).
pub const RAISE_FLOOR: &str = "INSERT INTO main.tenure_journal_floor (lease, token) VALUES (?1, ?2)
    ON CONFLICT (lease) DO UPDATE SET token = excluded.token WHERE excluded.token > token";

/// The last sequence number of `?1` (NULL: none).
pub const LAST_SEQ: &str = "SELECT max(seq) FROM tenure_journal WHERE persistence_id = ?1";

/// Event `?2` of `?1`, appended under token `?3` by `?4` at wall-clock ms `?5`.
pub const INSERT_EVENT: &str = "INSERT INTO tenure_journal
    (persistence_id, seq, token, writer, written_at, payload) VALUES (?1, ?2, ?3, ?4, ?5, ?6)";

/// The events of `?1` from sequence number `?2` on, at most `?3`.
pub const READ: &str = "SELECT seq, token, writer, payload FROM tenure_journal
    WHERE persistence_id = ?1 AND seq >= ?2 ORDER BY seq LIMIT ?3";

/// Keeps snapshot `?2` of `?1` (token `?3`) unless a later one is kept.
pub const SAVE_SNAPSHOT: &str = "INSERT INTO tenure_snapshot (persistence_id, seq, token, payload)
    VALUES (?1, ?2, ?3, ?4)
    ON CONFLICT (persistence_id) DO UPDATE SET seq = excluded.seq, token = excluded.token,
        payload = excluded.payload
    WHERE excluded.seq >= tenure_snapshot.seq";

/// The snapshot of `?1`.
pub const LOAD_SNAPSHOT: &str =
    "SELECT seq, token, payload FROM tenure_snapshot WHERE persistence_id = ?1";

/// Every persistence id with events.
pub const PERSISTENCE_IDS: &str =
    "SELECT DISTINCT persistence_id FROM tenure_journal ORDER BY persistence_id";

/// A write transaction of the journal on `conn` (the journal's connection, the lease file
/// attached when it is another one): `DEFERRED`, its first statement [`LOCK`], so that it
/// holds the journal file's write lock before it reads anything, and the lease file's
/// write lock only when the leases are in the journal's file.
///
/// Why a write fenced in such a transaction is safe when the lease file is another file
/// (grants and renewals commit meanwhile): the fence is read from a snapshot of the lease
/// file taken after the journal's lock was held, and a later holder [claims](claim_in)
/// the journal (a write, so it waits for this transaction) after its grant committed and
/// before it reads. So the write either commits before the claim, and the later holder
/// reads it, or runs after the claim, and then sees the later grant and the raised floor,
/// and is refused.
pub fn begin(conn: &mut rusqlite::Connection) -> rusqlite::Result<rusqlite::Transaction<'_>> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Deferred)?;
    tx.execute(LOCK, [])?;
    Ok(tx)
}

/// Inside a transaction from [`begin`]: `Ok(())` when `token` is not below the floor of
/// `lease` (no later holder claimed the journal), [`FenceError::NotHeld`](crate::fence::FenceError)
/// otherwise.
pub fn check_floor(
    tx: &rusqlite::Transaction<'_>,
    fence: (&str, &str, tenure_lease::FencingToken),
) -> Result<(), crate::fence::FenceError> {
    let (lease, owner, token) = fence;
    let floor: Option<i64> = tx
        .prepare_cached(FLOOR)
        .and_then(|mut stmt| stmt.query_row([lease], |r| r.get(0)).optional())
        .map_err(|e| crate::fence::FenceError::failed(lease, "sqlite", e))?;
    match floor {
        Some(f) if i64::try_from(token.get()).is_ok_and(|t| t < f) => {
            Err(crate::fence::FenceError::not_held(lease, owner, token))
        }
        _ => Ok(()),
    }
}

/// Claims the journal for the grant (`lease`, `owner`, `token`) inside a transaction from
/// [`begin`]: checks the fence and raises the lease's floor to `token`, so that once `tx`
/// commits every write under an older grant of the lease has committed before it or is
/// refused. `Ok(())` claimed (once committed); the fence's `Err` when the grant is not
/// current or the floor is already above `token`, or the check failed.
///
/// # Errors
/// [`crate::fence::FenceError`], as [`append_in`].
pub fn claim_in(
    tx: &rusqlite::Transaction<'_>,
    fence: (&str, &str, tenure_lease::FencingToken),
) -> Result<(), crate::fence::FenceError> {
    let (lease, owner, token) = fence;
    crate::fence::check(tx, lease, owner, token)?;
    check_floor(tx, fence)?;
    tx.prepare_cached(RAISE_FLOOR)
        .and_then(|mut stmt| stmt.execute(rusqlite::params![lease, token.get() as i64]))
        .map_err(|e| crate::fence::FenceError::failed(lease, "sqlite", e))?;
    Ok(())
}

/// Appends `events` to `persistence_id` from `first_seq` under the fence (`lease`, `owner`,
/// `token`) inside `tx`, a transaction from [`begin`]: the fence check, the floor check,
/// the sequence check and the inserts. `Ok(Ok(()))` written (not committed), `Ok(Err(next))`
/// refused because the journal's next sequence number is `next`; a fence refusal is the
/// `Err` of [`crate::fence::check`], as is a failed check. The journal runs this for every
/// append of a batch; the benchmark runs it by hand, one transaction per append.
///
/// # Errors
/// The fence's: [`crate::fence::FenceError`] (an SQLite error of the inserts is its `Store`
/// variant too).
pub fn append_in(
    tx: &rusqlite::Transaction<'_>,
    fence: (&str, &str, tenure_lease::FencingToken),
    persistence_id: &str,
    first_seq: u64,
    events: &[Vec<u8>],
) -> Result<Result<(), u64>, crate::fence::FenceError> {
    let (lease, owner, token) = fence;
    crate::fence::check(tx, lease, owner, token)?;
    check_floor(tx, fence)?;
    let failed = |e: rusqlite::Error| crate::fence::FenceError::failed(lease, "sqlite", e);
    let next = last_seq(tx, persistence_id).map_err(failed)? + 1;
    if next != first_seq {
        return Ok(Err(next));
    }
    let written_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let mut insert = tx.prepare_cached(INSERT_EVENT).map_err(failed)?;
    for (i, payload) in events.iter().enumerate() {
        // `Append::check` bounds the last sequence number by `i64::MAX`.
        let seq = (first_seq + i as u64) as i64;
        insert
            .execute(rusqlite::params![
                persistence_id,
                seq,
                token.get() as i64,
                owner,
                written_at,
                payload
            ])
            .map_err(failed)?;
    }
    Ok(Ok(()))
}

/// The last sequence number of `persistence_id` (0: none).
pub fn last_seq(conn: &rusqlite::Connection, persistence_id: &str) -> rusqlite::Result<u64> {
    let last: Option<i64> = conn
        .prepare_cached(LAST_SEQ)?
        .query_row([persistence_id], |r| r.get(0))?;
    Ok(last.map_or(0, |l| l.max(0) as u64))
}
