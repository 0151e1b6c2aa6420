//! The in-memory journal: one process, no persistence, fenced by the in-memory lease
//! store. For tests of the layers above.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tenure_lease::MemoryStore;

use crate::{
    Append, Fence, Journal, JournalError, Refusal, SaveSnapshot, Snapshot, StoredEvent, Written,
};

#[derive(Debug, Default)]
struct Entries {
    events: BTreeMap<String, Vec<StoredEvent>>,
    snapshots: BTreeMap<String, Snapshot>,
}

/// A journal in memory, fenced by the grants of a [`MemoryStore`]: every write runs while
/// the store's state is locked and the fence's grant is checked current (see
/// [`MemoryStore::fenced`]). Clones share the journal.
#[derive(Debug, Clone)]
pub struct MemoryJournal {
    leases: MemoryStore,
    entries: Arc<Mutex<Entries>>,
}

impl MemoryJournal {
    /// An empty journal fenced by the leases of `leases`.
    pub fn new(leases: MemoryStore) -> Self {
        MemoryJournal {
            leases,
            entries: Arc::default(),
        }
    }

    /// The lease store the journal is fenced by.
    pub fn leases(&self) -> &MemoryStore {
        &self.leases
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `write` fenced by `fence`: its answer, or the refusal or error of the check.
    async fn fenced(
        &self,
        persistence_id: &str,
        operation: &'static str,
        fence: &Fence,
        write: impl FnOnce(&mut Entries) -> Written,
    ) -> Result<Written, JournalError> {
        let checked = self
            .leases
            .fenced(&fence.lease, &fence.owner, fence.token, || {
                write(&mut self.entries())
            })
            .await;
        match checked {
            Ok(written) => Ok(written),
            Err(e) => {
                Refusal::from_fence(persistence_id, operation, fence, e).map(Written::Refused)
            }
        }
    }
}

fn next_seq(entries: &Entries, persistence_id: &str) -> u64 {
    entries
        .events
        .get(persistence_id)
        .and_then(|e| e.last())
        .map_or(1, |e| e.seq + 1)
}

#[async_trait]
impl Journal for MemoryJournal {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn append(&self, append: Append) -> Result<Written, JournalError> {
        append.check()?;
        let fence = append.fence.clone();
        let pid = append.persistence_id.clone();
        self.fenced(&pid, "append", &fence, move |entries| {
            let next = next_seq(entries, &append.persistence_id);
            if next != append.first_seq {
                return Written::Refused(Refusal::SequenceConflict {
                    persistence_id: append.persistence_id,
                    expected: append.first_seq,
                    next,
                });
            }
            let range = append.range();
            let journal = entries.events.entry(append.persistence_id).or_default();
            journal.extend(
                append
                    .events
                    .into_iter()
                    .zip(range.clone())
                    .map(|(payload, seq)| StoredEvent {
                        seq,
                        payload,
                        token: append.fence.token,
                        writer: append.fence.owner.clone(),
                    }),
            );
            Written::Appended(range)
        })
        .await
    }

    async fn read(
        &self,
        persistence_id: &str,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, JournalError> {
        crate::check_persistence_id(persistence_id)?;
        let entries = self.entries();
        Ok(entries
            .events
            .get(persistence_id)
            .map(|events| {
                events
                    .iter()
                    .filter(|e| e.seq >= from)
                    .take(max)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn save_snapshot(&self, snapshot: SaveSnapshot) -> Result<Written, JournalError> {
        snapshot.check()?;
        let fence = snapshot.fence.clone();
        let pid = snapshot.persistence_id.clone();
        self.fenced(&pid, "save snapshot", &fence, move |entries| {
            let next = next_seq(entries, &snapshot.persistence_id);
            if snapshot.seq >= next {
                return Written::Refused(Refusal::SnapshotBeyondJournal {
                    persistence_id: snapshot.persistence_id,
                    seq: snapshot.seq,
                    last: next - 1,
                });
            }
            let seq = snapshot.seq;
            let kept = entries.snapshots.get(&snapshot.persistence_id);
            if kept.is_none_or(|k| k.seq <= seq) {
                entries.snapshots.insert(
                    snapshot.persistence_id,
                    Snapshot {
                        seq,
                        payload: snapshot.payload,
                        token: snapshot.fence.token,
                    },
                );
            }
            Written::Appended(seq..=seq)
        })
        .await
    }

    async fn load_snapshot(&self, persistence_id: &str) -> Result<Option<Snapshot>, JournalError> {
        crate::check_persistence_id(persistence_id)?;
        Ok(self.entries().snapshots.get(persistence_id).cloned())
    }

    async fn persistence_ids(&self) -> Result<Vec<String>, JournalError> {
        Ok(self.entries().events.keys().cloned().collect())
    }
}
