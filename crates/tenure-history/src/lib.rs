//! # tenure-history
//!
//! Histories (docs/history.md): what a Tenure cluster records while it runs, one typed
//! [`Event`] per JSON line, how they are written and read, and the [`check`]er that judges
//! them.
//!
//! Every layer emits its own events where they happen, as `tracing` events on the target
//! [`TARGET`] (`tenure::history`) with typed fields: the lease core from the LeaseActor's one
//! emitter, the cluster node, singletons, sharding and the CLI from a small `history` module
//! each. None of them depends on this crate. A process records a history by installing a
//! [`HistoryLayer`]: it turns those events back into typed [`Event`]s through serde, stamps
//! each with the host's `CLOCK_BOOTTIME` instant and the node it is about, and appends it to
//! a [`HistoryFile`]. Without the layer, an emission costs what a disabled `tracing` callsite
//! costs.
//!
//! ```no_run
//! use tracing_subscriber::layer::SubscriberExt;
//! use tenure_history::{HistoryFile, HistoryLayer};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let file = HistoryFile::open("/tmp/history.jsonl".as_ref())?;
//! let history = HistoryLayer::new(file, "10.0.0.1:2552", "1f3a");
//! let subscriber = tracing_subscriber::registry().with(history.filtered());
//! tracing::subscriber::set_global_default(subscriber)?;
//! # Ok(()) }
//! ```
//!
//! Writers and readers use the same types, so a line is written and read one way. Event
//! kinds this build does not know are kept as [`Event::Other`] rather than refused: a newer
//! writer's history stays checkable by an older `tenure check`, which judges the kinds it
//! knows (docs/history.md: readers ignore kinds and fields they do not know). A known kind
//! whose fields are missing or mistyped is an error naming the line.

pub mod check;
mod entry;
mod event;
mod fields;
mod file;
mod layer;
mod read;
mod recorder;

pub use entry::{Entry, EntryError, HARNESS, boottime_now_ns};
pub use event::{AboutMember, EntityLife, Event, Link, ShardLife, SingletonLife};
pub use file::HistoryFile;
pub use layer::{HistoryLayer, UnknownEvents, node_span};
pub use read::{HistoryError, history_lines, read_history};
pub use recorder::{Recorder, UnknownEventsError};

/// The `tracing` target of history events. Each layer's `history` module emits on it, with
/// the field `event` naming the kind and one field per field of the kind's line.
pub const TARGET: &str = "tenure::history";
