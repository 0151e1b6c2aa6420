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

/// A sequence number or fencing token as an SQL journal reads it from its BIGINT column:
/// journals write neither below 0, so a negative one (written by something else) reads
/// as 0.
fn from_bigint(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl StoredEvent {
    /// An event from the columns of an SQL journal's row (`seq` and `token` as BIGINT).
    pub fn from_columns(seq: i64, token: i64, writer: String, payload: Vec<u8>) -> StoredEvent {
        StoredEvent {
            seq: from_bigint(seq),
            payload,
            token: FencingToken::new(from_bigint(token)),
            writer,
        }
    }
}

impl Snapshot {
    /// A snapshot from the columns of an SQL journal's row (`seq` and `token` as BIGINT).
    pub fn from_columns(seq: i64, token: i64, payload: Vec<u8>) -> Snapshot {
        Snapshot {
            seq: from_bigint(seq),
            payload,
            token: FencingToken::new(from_bigint(token)),
        }
    }
}

/// [`Journal::read`](crate::Journal::read)'s `from` and `max` as an SQL journal binds them
/// (BIGINT): a value beyond `i64::MAX` reads as `i64::MAX`, past every sequence number a
/// journal accepts.
pub fn bigint_bounds(from: u64, max: usize) -> (i64, i64) {
    (
        i64::try_from(from).unwrap_or(i64::MAX),
        i64::try_from(max).unwrap_or(i64::MAX),
    )
}

#[cfg(test)]
mod sql_tests {
    use super::*;

    #[test]
    fn bigint_columns_and_bounds_never_wrap() {
        let e = StoredEvent::from_columns(-1, -7, "w".into(), vec![1]);
        assert_eq!((e.seq, e.token), (0, FencingToken::new(0)));
        let s = Snapshot::from_columns(3, 9, vec![]);
        assert_eq!((s.seq, s.token), (3, FencingToken::new(9)));
        assert_eq!(bigint_bounds(u64::MAX, usize::MAX), (i64::MAX, i64::MAX));
        assert_eq!(bigint_bounds(5, 10), (5, 10));
    }
}
