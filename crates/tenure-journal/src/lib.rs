//! # tenure-journal
//!
//! The journal SPI of Tenure's durable entities: per persistence id, events numbered 1, 2,
//! 3… and the latest snapshot, where **every write runs in one store transaction with the
//! check of the writer's lease grant** (its [`Fence`]: lease, owner, fencing token). A
//! holder whose grant is no longer the lease's current one (it paused past its ttl, or it
//! is on the losing side of a split brain) is refused, whatever sequence number it
//! presents; and since an append must name the journal's next sequence number, numbers
//! stay contiguous whoever writes.
//!
//! Akka Persistence relies on a single writer per persistence id and cannot tell when two
//! write; Orleans' ETags stop a writer that read an old version but not a paused one that
//! read the latest. A fenced append is refused by the store itself, at commit.
//!
//! Journals: [`MemoryJournal`] here (tests), `SqliteJournal` in `tenure-store-sqlite`,
//! `PostgresJournal` in `tenure-store-postgres`. Add your own by implementing [`Journal`]
//! and running the conformance kit (feature `conformance`) against it. A journal must
//! check the fence in the same transaction as the write, in the database that holds the
//! leases: that is why etcd and ZooKeeper, whose requests and stored data are limited to
//! about a megabyte and a few gigabytes in all, are lease stores but not journals.

mod append;
#[cfg(feature = "conformance")]
pub mod conformance;
mod error;
pub mod group;
mod journal;
mod memory;
mod stored;

pub use append::{Append, Fence, Refusal, Written, check_persistence_id};
pub use error::JournalError;
pub use journal::{Journal, read_all};
pub use memory::MemoryJournal;
pub use stored::{SaveSnapshot, Snapshot, StoredEvent, bigint_bounds};
