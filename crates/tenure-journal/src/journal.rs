//! The journal SPI.

use async_trait::async_trait;

use crate::{Append, Fence, JournalError, SaveSnapshot, Snapshot, StoredEvent, Written};

/// An event journal whose writes are fenced by a lease grant.
///
/// Per persistence id the journal holds events numbered 1, 2, 3… without gaps or
/// duplicates, whoever wrote them, and at most one snapshot (the latest saved). Every write
/// runs in **one store transaction with the check of its [`Fence`](crate::Fence)**: it is
/// committed only if the fence's grant is the lease's current one, and no later grant of
/// the lease can commit before it, so a holder that paused past its ttl, or a node on the
/// losing side of a split brain, is refused, whatever sequence number it presents.
///
/// Implementations pass the conformance kit (`conformance` feature).
#[async_trait]
pub trait Journal: Send + Sync + 'static {
    /// The journal kind (`sqlite`, `postgres`, `memory`), for messages.
    fn kind(&self) -> &'static str;

    /// Appends `append.events` with sequence numbers from `append.first_seq`, atomically:
    /// all of them or none.
    ///
    /// `Ok(Written::Appended(range))`: committed with those sequence numbers.
    /// `Ok(Written::Refused(_))`: certainly not written: the fence's grant is not current
    /// ([`Refusal::NotHeld`](crate::Refusal::NotHeld)) or `first_seq` is not the journal's
    /// next sequence number ([`Refusal::SequenceConflict`](crate::Refusal::SequenceConflict)).
    /// `Err`: see [`JournalError`]; for a store failure the outcome is unknown.
    async fn append(&self, append: Append) -> Result<Written, JournalError>;

    /// The events of `persistence_id` with sequence numbers from `from`, in order, at most
    /// `max` of them (fewer, possibly none, when the journal ends sooner).
    async fn read(
        &self,
        persistence_id: &str,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, JournalError>;

    /// Saves a snapshot, fenced as an append is; an older snapshot than the one kept is
    /// not kept (the answer is still `Appended`, naming the snapshot's sequence number).
    /// Refused ([`Refusal::SequenceConflict`](crate::Refusal::SequenceConflict)) when its
    /// sequence number is past the journal's last event.
    async fn save_snapshot(&self, snapshot: SaveSnapshot) -> Result<Written, JournalError>;

    /// The latest snapshot of `persistence_id`, if one was saved.
    async fn load_snapshot(&self, persistence_id: &str) -> Result<Option<Snapshot>, JournalError>;

    /// Every persistence id with at least one event, in byte order (for checkers and
    /// tools: it reads the whole journal's index).
    async fn persistence_ids(&self) -> Result<Vec<String>, JournalError>;

    /// Called by a new holder before it reads `persistence_id` to recover it under
    /// `fence`: orders the holder's reads after every write fenced by an older grant of
    /// `fence.lease`.
    ///
    /// `Ok(true)`: every append or snapshot under an older grant of the lease either
    /// committed before this call returned (so a read from now on sees it) or will be
    /// refused. `Ok(false)`: the fence's grant is not the lease's current one, or the
    /// journal knows of a later one: the caller must not recover or write under it.
    /// `Err`: see [`JournalError`]; nothing is promised, recover later.
    ///
    /// The default answers `Ok(true)` without doing anything, which is right for journals
    /// whose fence check holds a lock that every later grant of the lease waits for until
    /// the write commits (the memory journal, PostgreSQL's `FOR KEY SHARE` lock on the grant): no later
    /// grant, and so no read by a later holder, comes before a pending write. A journal
    /// whose writes do not block grants (SQLite with a file of its own) must override it.
    async fn claim(&self, persistence_id: &str, fence: &Fence) -> Result<bool, JournalError> {
        let _ = (persistence_id, fence);
        Ok(true)
    }
}

/// Every event of `persistence_id` from `from` on, read in pages of `page` events.
pub async fn read_all(
    journal: &dyn Journal,
    persistence_id: &str,
    from: u64,
    page: usize,
) -> Result<Vec<StoredEvent>, JournalError> {
    let page = page.max(1);
    let mut out = Vec::new();
    let mut next = from.max(1);
    loop {
        let events = journal.read(persistence_id, next, page).await?;
        let Some(last) = events.last() else {
            return Ok(out);
        };
        next = last.seq + 1;
        let full = events.len() == page;
        out.extend(events);
        if !full {
            return Ok(out);
        }
    }
}
