//! # tenure-store-sqlite
//!
//! The embedded default lease store: one SQLite file shared by every process of one host
//! (WAL journal, `synchronous = FULL`, busy timeout = `lease-operation-timeout`).
//!
//! **Time.** Expiry never uses the wall clock (it can jump). Every process of a host reads
//! the same `CLOCK_MONOTONIC`, which never goes back, and which is the clock tokio's
//! `Instant` (and so the holder's local deadline) runs on: store and holder measure time
//! alike. The clock restarts at boot, so the file records the boot id; after a reboot
//! every lease is expired (no holder can have survived it), fencing counters are kept.
//!
//! **The file must be on a local file system.** SQLite's locking is unreliable on network
//! file systems (NFS, SMB), and a host-local clock means nothing to another host.
//!
//! **Tokens** come from a per-lease counter row that is never deleted, so they keep
//! increasing across releases, expiries and restarts; `synchronous = FULL` makes every
//! issued token durable before it is handed out.

mod clock;
mod fenced;
mod schema;
pub mod sql;
mod store;

/// The host-wide monotonic clock expiry is measured on, in nanoseconds.
pub fn monotonic_now_ns() -> i64 {
    clock::now_ns()
}

pub use fenced::FencedCounter;
pub use store::{SqliteStore, SqliteStoreFactory};
