//! Acknowledged increments against the example sharded counter's SQLite file.

use std::path::Path;

use tenure::history::Entry;
use tenure::history::check::{AckCheck, check_acks};

/// Why the counter file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The counter file could not be opened.
    #[error("cannot read counter {path}: {source}")]
    CounterFile {
        /// The counter file's path.
        path: String,
        /// Why it could not be opened.
        source: tenure::ConfigError,
    },
    /// The counter's values could not be read.
    #[error("cannot read counter {path}: {source}")]
    Counter {
        /// The counter file's path.
        path: String,
        /// The store error.
        source: tenure::StoreError,
    },
}

/// [`check_acks`] against the example sharded counter's SQLite file (`tenure node
/// --counter`): the final value of key `k` is its counter `sharded/<k>`.
pub fn check_counter_acks(events: &[Entry], counter: &Path) -> Result<AckCheck, CheckError> {
    let path = || counter.display().to_string();
    let file =
        crate::demo::FencedCounter::open(counter).map_err(|source| CheckError::CounterFile {
            path: path(),
            source,
        })?;
    let failed = std::cell::Cell::new(None);
    let acks = check_acks(
        events,
        &|key| match file.get(&crate::demo::counter::counter_name(key)) {
            Ok(v) => v.map(|(value, _)| value),
            Err(e) => {
                failed.set(Some(e));
                None
            }
        },
    );
    match failed.take() {
        Some(source) => Err(CheckError::Counter {
            path: path(),
            source,
        }),
        None => Ok(acks),
    }
}
