//! Histories (docs/history.md): what a Tenure cluster records while it runs, one typed
//! [`Event`] per JSON line, and the [`check`]er that judges them.
//!
//! It lives here, in the lease crate, because this is the lowest crate every writer can
//! depend on: the LeaseActor's traces ([`Event::from_trace`]), the cluster node, singletons,
//! sharding, `tenure lease run`, test harnesses, and the conformance kit, whose
//! preemption cases check their histories with the same checker as `tenure check`. Writers
//! and readers use the same types, so a line is written and read one way.
//!
//! Event kinds this build does not know are kept as [`Event::Other`] rather than refused:
//! a newer writer's history stays checkable by an older `tenure check`, which judges the
//! kinds it knows (docs/history.md: readers ignore kinds and fields they do not know). A
//! known kind whose fields are missing or mistyped is an error naming the line.

pub mod check;
mod entry;
mod event;
mod read;

pub use entry::{Entry, HARNESS};
pub use event::{AboutMember, EntityLife, Event, Link, ShardLife, SingletonLife};
pub use read::{HistoryError, history_lines, read_history};
