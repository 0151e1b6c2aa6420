//! Appends and their answers: what a writer asks the journal, and how the journal answers.

use std::ops::RangeInclusive;

use tenure_lease::{FenceError, FencingToken};

use crate::JournalError;

/// The grant a write is fenced by: the journal writes only while `owner` holds the lease
/// `lease` (its name as the lease store holds it) with fencing token `token`, checked in
/// the same store transaction as the write.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fence {
    /// The lease's name in the store (a shard's lease for a sharded entity).
    pub lease: String,
    /// The holder's owner string (a node's `host:port`).
    pub owner: String,
    /// The grant's fencing token.
    pub token: FencingToken,
}

impl Fence {
    /// The fence of `owner`'s grant `token` of `lease`.
    pub fn new(lease: impl Into<String>, owner: impl Into<String>, token: FencingToken) -> Self {
        Fence {
            lease: lease.into(),
            owner: owner.into(),
            token,
        }
    }
}

/// A request to append `events` to the journal of `persistence_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Append {
    /// Whose events: one journal per persistence id.
    pub persistence_id: String,
    /// The sequence number the first event gets, which must be the journal's next one
    /// (1 for a new persistence id): the writer says which history it extends.
    pub first_seq: u64,
    /// The events, encoded; at least one.
    pub events: Vec<Vec<u8>>,
    /// The grant the append is fenced by.
    pub fence: Fence,
}

impl Append {
    /// The sequence numbers the events get when appended.
    pub fn range(&self) -> RangeInclusive<u64> {
        let count = self.events.len() as u64;
        self.first_seq..=self.first_seq.saturating_add(count.saturating_sub(1))
    }

    /// `Ok` when the request is well formed (what every journal checks before writing):
    /// a persistence id that is not empty and holds no NUL character, `first_seq` at least
    /// 1, at least one event, and a last sequence number that fits in an `i64` (the
    /// databases' integer).
    pub fn check(&self) -> Result<(), JournalError> {
        check_persistence_id(&self.persistence_id)?;
        let invalid = |detail: String| JournalError::invalid(&self.persistence_id, detail);
        if self.first_seq == 0 {
            return Err(invalid("sequence numbers start at 1, not 0".into()));
        }
        if self.events.is_empty() {
            return Err(invalid("an append needs at least one event".into()));
        }
        let last = self.first_seq.checked_add(self.events.len() as u64 - 1);
        if last.is_none_or(|l| l > i64::MAX as u64) {
            return Err(invalid(format!(
                "sequence numbers from {} for {} events run past {}",
                self.first_seq,
                self.events.len(),
                i64::MAX
            )));
        }
        Ok(())
    }
}

/// `Ok` when `persistence_id` can name a journal: not empty, no NUL character.
pub fn check_persistence_id(persistence_id: &str) -> Result<(), JournalError> {
    if persistence_id.is_empty() {
        return Err(JournalError::invalid(
            persistence_id,
            "the persistence id is empty",
        ));
    }
    if persistence_id.contains('\0') {
        return Err(JournalError::invalid(
            persistence_id,
            "the persistence id contains a NUL character",
        ));
    }
    Ok(())
}

/// A journal's answer to a write it carried out or certainly did not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// Committed: the events hold these sequence numbers (for a snapshot: the snapshot's).
    Appended(RangeInclusive<u64>),
    /// Certainly not written.
    Refused(Refusal),
}

/// Why a journal refused a write (nothing was written).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The fence's grant is not the lease's current one (a stale token: the lease was
    /// released, expired or granted to another holder): the writer must stop writing.
    #[error(
        "append to `{persistence_id}` refused: lease `{lease}` is not held by `{owner}` with token {token}"
    )]
    NotHeld {
        /// The persistence id written to.
        persistence_id: String,
        /// The lease the write was fenced by.
        lease: String,
        /// The owner the write claimed to be.
        owner: String,
        /// The token the write presented.
        token: FencingToken,
    },
    /// The journal's next sequence number is not the one the write expected: another
    /// writer appended meanwhile, or the writer's view of the journal is out of date.
    #[error(
        "append to `{persistence_id}` refused: it expected sequence number {expected} next, the journal's next is {next}"
    )]
    SequenceConflict {
        /// The persistence id written to.
        persistence_id: String,
        /// The sequence number the write expected next.
        expected: u64,
        /// The journal's next sequence number.
        next: u64,
    },
    /// A snapshot names an event past the journal's last: it would stand for events the
    /// journal does not hold.
    #[error(
        "snapshot of `{persistence_id}` at sequence number {seq} refused: the journal's last event is {last}"
    )]
    SnapshotBeyondJournal {
        /// The persistence id.
        persistence_id: String,
        /// The snapshot's sequence number.
        seq: u64,
        /// The journal's last sequence number (0: none).
        last: u64,
    },
}

impl Refusal {
    /// [`Refusal::NotHeld`] for a write of `persistence_id` fenced by `fence`.
    pub fn not_held(persistence_id: &str, fence: &Fence) -> Self {
        Refusal::NotHeld {
            persistence_id: persistence_id.to_string(),
            lease: fence.lease.clone(),
            owner: fence.owner.clone(),
            token: fence.token,
        }
    }

    /// The answer to a write of `persistence_id` whose fence check failed with `e`: a
    /// refusal when the grant is not current, an error (outcome unknown) when the check
    /// itself failed.
    pub fn from_fence(
        persistence_id: &str,
        operation: &'static str,
        fence: &Fence,
        e: FenceError,
    ) -> Result<Refusal, JournalError> {
        match e {
            FenceError::NotHeld { .. } => Ok(Refusal::not_held(persistence_id, fence)),
            FenceError::Store { source, .. } => {
                Err(JournalError::store(persistence_id, operation, source))
            }
            other => Err(JournalError::store(
                persistence_id,
                operation,
                tenure_lease::StoreError::backend("journal", other.to_string()),
            )),
        }
    }
}
