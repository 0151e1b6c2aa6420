//! # tenure-store-sqlite
//!
//! The embedded default lease store: one SQLite file shared by every process of one host
//! (WAL journal, `synchronous = FULL`, busy timeout = `lease-operation-timeout`). The
//! default file is in a persistent state directory ([`default_path`]).
//!
//! **Time.** Expiry never uses the wall clock (it can jump). Every process of a host reads
//! the same `CLOCK_BOOTTIME`, which never goes back, counts host suspend, and which is the
//! clock holder deadlines are measured on (see the `clock` module for why not
//! `CLOCK_MONOTONIC`): store and holder measure time alike. The clock restarts at boot, so
//! the file records the boot id; after a reboot every lease is expired (no holder can have
//! survived it), fencing counters are kept.
//!
//! **The file must be on a local file system.** SQLite's locking is unreliable on network
//! file systems (NFS, SMB), and a host-local clock means nothing to another host.
//!
//! **Tokens** come from a per-lease counter row that is never deleted, so they keep
//! increasing across releases, expiries and restarts; `synchronous = FULL` makes every
//! issued token durable before it is handed out. Every token is also at least the host's
//! wall clock in microseconds at its grant, so a new file (the old one deleted, or
//! replaced by an older copy) issues tokens above all of the lost file's. What the store
//! does when its file is lost while in use is described at [`SqliteStore`].
//!
//! **Fair acquire** ([`LeaseStore::acquire_fair`](tenure_lease::LeaseStore::acquire_fair),
//! capability `fair_waiting`): waiters queue as rows of `tenure_waiter` (`seq` order), each
//! with its own expiry that it refreshes while it waits, so a waiter whose process died
//! holds the line back for at most its ttl; the first in line acquires by the rules of
//! `try_acquire` in the transaction that removes its row. SQLite has no notifications
//! between processes: waiters of one process are woken at once by a release or a
//! departure from the line in that process (a `tokio::sync::Notify` per file and lease),
//! and every waiter also looks again every [`cross_process_poll`] (a twentieth of its ttl,
//! 10 to 250 ms) for what other processes did, and when the holder's grant or the row of a
//! waiter ahead expires. [`try_acquire`](tenure_lease::LeaseStore::try_acquire) does not
//! queue and may take a free lease ahead of waiters, as on the other stores.

mod clock;
#[cfg(feature = "conformance")]
pub mod conformance;
mod db;
mod fair;
pub mod fence;
mod identity;
pub mod journal;
mod schema;
pub mod sql;
mod store;
pub mod witness;

/// The host-wide clock expiry is measured on (`CLOCK_BOOTTIME`), in nanoseconds.
pub fn store_now_ns() -> i64 {
    clock::now_ns()
}

/// The least token a grant made now may carry (the wall clock in microseconds): the
/// `floor` of [`sql::next_token`].
pub fn token_floor() -> i64 {
    clock::token_floor()
}

pub use fair::cross_process_poll;
pub use journal::SqliteJournal;
/// The `rusqlite` this store is built with: a fenced write ([`fence::check`]) runs in a
/// `rusqlite::Transaction` on the lease file, so an application needs no `rusqlite`
/// dependency of its own (and cannot pick a version that differs from the store's).
pub use rusqlite;
pub use store::{
    NoStateDirectory, REFERENCE, SqliteOptions, SqliteStore, SqliteStoreFactory, default_path,
};
