//! What a journal gives back: events as they were appended, and snapshots.

use tenure_lease::FencingToken;

use crate::Fence;

/// An event as the journal holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// Its sequence number in its persistence id's journal (from 1, contiguous).
    pub seq: u64,
    /// The event, encoded as it was appended.
    pub payload: Vec<u8>,
    /// The fencing token of the grant it was appended under.
    pub token: FencingToken,
    /// The owner that appended it (the fence's owner).
    pub writer: String,
}

/// A request to save a snapshot of `persistence_id`'s state after event `seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaveSnapshot {
    /// Whose state.
    pub persistence_id: String,
    /// The sequence number of the last event the state includes (at least 1, and at most
    /// the journal's last one).
    pub seq: u64,
    /// The state, encoded.
    pub payload: Vec<u8>,
    /// The grant the write is fenced by.
    pub fence: Fence,
}

/// The latest snapshot of a persistence id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The sequence number of the last event the state includes.
    pub seq: u64,
    /// The state, encoded as it was saved.
    pub payload: Vec<u8>,
    /// The fencing token of the grant it was saved under.
    pub token: FencingToken,
}

impl SaveSnapshot {
    /// `Ok` when the request is well formed: a valid persistence id and a sequence number
    /// from 1 that fits in an `i64`.
    pub fn check(&self) -> Result<(), crate::JournalError> {
        crate::check_persistence_id(&self.persistence_id)?;
        if self.seq == 0 || self.seq > i64::MAX as u64 {
            return Err(crate::JournalError::invalid(
                &self.persistence_id,
                format!(
                    "a snapshot's sequence number must be from 1 to {}, not {}",
                    i64::MAX,
                    self.seq
                ),
            ));
        }
        Ok(())
    }
}
