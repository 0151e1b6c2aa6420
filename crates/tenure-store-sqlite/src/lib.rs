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

mod clock;
mod fair;
pub mod fence;
mod fenced;
mod schema;
pub mod sql;
mod store;

/// The host-wide clock expiry is measured on (`CLOCK_BOOTTIME`), in nanoseconds.
pub fn store_now_ns() -> i64 {
    clock::now_ns()
}

/// The least token a grant made now may carry (the wall clock in microseconds): the
/// parameter `?2` of [`sql::NEXT_TOKEN`].
pub fn token_floor() -> i64 {
    clock::token_floor()
}

pub use fair::cross_process_poll;
pub use fenced::FencedCounter;
pub use store::{REFERENCE, SqliteOptions, SqliteStore, SqliteStoreFactory, default_path};
