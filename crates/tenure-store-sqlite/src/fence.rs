//! Writes guarded by the lease in the same SQLite file: the token check runs inside the
//! caller's own transaction, so the check and the caller's writes commit together or not
//! at all, and no later grant of the lease can commit in between.
//!
//! ```no_run
//! # fn f(path: &std::path::Path, token: tenure_lease::FencingToken) -> Result<(), Box<dyn std::error::Error>> {
//! use rusqlite::{Connection, TransactionBehavior};
//!
//! let mut conn = Connection::open(path)?; // the lease store's file
//! let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
//! tenure_store_sqlite::fence::check(&tx, "nightly-report", "10.0.0.7:2552", token)?;
//! tx.execute("UPDATE report SET done = 1", [])?;
//! tx.commit()?;
//! # Ok(()) }
//! ```
//!
//! Why it holds: an `IMMEDIATE` transaction takes the file's write lock at `BEGIN`, and every
//! acquire, renewal and release is a write: none can commit until the caller's transaction
//! ends. (A `DEFERRED` one is safe too in the store's WAL mode: if a grant commits after the
//! check read the file, the caller's first write fails with `SQLITE_BUSY_SNAPSHOT` and
//! nothing is written; `IMMEDIATE` only avoids that failure.) Keep such transactions short:
//! the holder's own renewals wait for them.

use rusqlite::{OptionalExtension, Transaction, params};
use tenure_lease::FencingToken;

pub use tenure_lease::FenceError;

const CHECK: &str = "SELECT 1 FROM tenure_lease
    WHERE name = ?1 AND owner = ?2 AND token = ?3 AND expires_at > ?4";

/// Inside the caller's transaction `tx` on the lease store's file: `Ok(())` when `owner`
/// holds `name` with `token`, unexpired on the store's clock (the host's `CLOCK_BOOTTIME`).
/// [`FenceError::NotHeld`] when it does not: roll back. Until `tx` ends, no other grant of
/// `name` can commit (see the module docs), so the caller's writes land before any later
/// holder's.
pub fn check(
    tx: &Transaction<'_>,
    name: &str,
    owner: &str,
    token: FencingToken,
) -> Result<(), FenceError> {
    let Ok(t) = i64::try_from(token.get()) else {
        return Err(FenceError::not_held(name, owner, token));
    };
    let found = tx
        .query_row(
            CHECK,
            params![name, owner, t, crate::clock::now_ns()],
            |_| Ok(()),
        )
        .optional()
        .map_err(|e| FenceError::failed(name, "sqlite", e))?;
    found.ok_or_else(|| FenceError::not_held(name, owner, token))
}
