//! Group commit: one writer task per journal writes every append and snapshot waiting at
//! once in one transaction, in a constant number of round trips whatever the batch's size:
//! one statement checks every grant the batch is fenced by, one reads the last sequence
//! number of every journal it writes to, the writes are decided from these in order (each
//! refused alone), one statement inserts every accepted event and one saves every accepted
//! snapshot, and one commit makes them durable. When another transaction wrote one of the
//! batch's sequence numbers in between (the insert's unique violation), the batch is written
//! again one savepoint per write, each with its own checks, so every answer stays exact.

use std::collections::HashMap;

use deadpool::managed::Object;
use tenure_journal::group::{Batches, Write};
use tenure_journal::{Append, JournalError, Refusal, SaveSnapshot, Written};
use tenure_lease::{FencingToken, StoreError};
use tokio_postgres::Transaction;
use tokio_postgres::error::SqlState;

use super::Shared;
use crate::error;

/// How often a batch that met a deadlock or a serialisation failure (rolled back, nothing
/// written) is tried again.
const RETRIES: usize = 3;

/// Runs until every handle of the journal is gone.
pub(crate) async fn run(shared: std::sync::Arc<Shared>, mut batches: Batches) {
    while let Some(batch) = batches.next().await {
        let writes: Vec<&Write> = batch.iter().map(|j| &j.write).collect();
        let answers = write_all(&shared, &writes, Mode::Batched).await;
        drop(writes);
        for (job, answer) in batch.into_iter().zip(answers) {
            job.answer(answer);
        }
    }
}

/// How a batch is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// In a constant number of statements, one savepoint per write after a conflict.
    Batched,
    /// One savepoint per write, each with its own statements (the tests compare the two).
    #[cfg(test)]
    Savepoints,
}

/// What one write of a batch came to inside the transaction.
enum Outcome {
    /// Written; durable once the batch commits.
    Written(Written),
    /// Refused or failed on its own: its answer stands whatever the commit does.
    Final(Result<Written, JournalError>),
}

/// Why a batch failed as a whole, and whether nothing of it can have been committed.
struct Failed {
    error: StoreError,
    /// Rolled back by the server (a deadlock or serialisation failure before the commit):
    /// trying again is safe.
    retry: bool,
}

fn failed(shared: &Shared, e: tokio_postgres::Error) -> Failed {
    let retry = matches!(
        e.code(),
        Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
    );
    Failed {
        error: error::from_pg(&shared.server, e).error,
        retry,
    }
}

/// Writes `writes` in one transaction (tried again when the server rolled it back) and
/// gives each write's answer, in order: `Ok(Appended)` committed, `Ok(Refused)` certainly
/// not written, `Err` as [`JournalError`] says (a failure of the whole batch is every
/// write's, outcome unknown).
pub(super) async fn write_all(
    shared: &Shared,
    writes: &[&Write],
    mode: Mode,
) -> Vec<Result<Written, JournalError>> {
    let limit = shared.store.options().operation_timeout;
    let mut tries = 0;
    let result = loop {
        tries += 1;
        let mut conn = match shared.store.connection().await {
            Ok(c) => c,
            Err(e) => break Err(e),
        };
        let once = async {
            if mode == Mode::Batched
                && let Some(outcomes) = batched(shared, &mut conn, writes).await?
            {
                return Ok(outcomes);
            }
            attempt(shared, &mut conn, writes).await
        };
        match tokio::time::timeout(limit, once).await {
            Ok(Ok(outcomes)) => break Ok(outcomes),
            Ok(Err(f)) if f.retry && tries <= RETRIES => continue,
            Ok(Err(f)) => break Err(f.error),
            Err(_) => {
                // The server may still answer on this connection later: close it.
                drop(Object::take(conn));
                break Err(error::timed_out(&shared.server, limit));
            }
        }
    };
    match result {
        Ok(outcomes) => outcomes
            .into_iter()
            .map(|o| match o {
                Outcome::Final(answer) => answer,
                Outcome::Written(w) => Ok(w),
            })
            .collect(),
        Err(error) => writes
            .iter()
            .map(|w| {
                Err(JournalError::store(
                    w.persistence_id(),
                    w.operation(),
                    error.clone(),
                ))
            })
            .collect(),
    }
}

/// The events a batch inserts, one element per event, as the insert's arrays.
#[derive(Default)]
struct EventRows<'a> {
    pids: Vec<&'a str>,
    seqs: Vec<i64>,
    tokens: Vec<i64>,
    writers: Vec<&'a str>,
    payloads: Vec<&'a [u8]>,
}

impl<'a> EventRows<'a> {
    /// The rows of `appends` (each accepted, in batch order), sorted by persistence id
    /// (stably: each journal's events stay in sequence order), so that concurrent batches
    /// take the journals' index locks in one order.
    fn of(mut appends: Vec<&'a Append>) -> Self {
        appends.sort_by(|a, b| a.persistence_id.cmp(&b.persistence_id));
        let mut rows = EventRows::default();
        for a in appends {
            let token = a.fence.token.get() as i64;
            for (seq, payload) in a.range().zip(&a.events) {
                rows.pids.push(&a.persistence_id);
                rows.seqs.push(seq as i64);
                rows.tokens.push(token);
                rows.writers.push(&a.fence.owner);
                rows.payloads.push(payload);
            }
        }
        rows
    }
}

/// One try of a batch in a constant number of round trips whatever its size: the
/// transaction's start; the check of every distinct grant the batch is fenced by and the
/// read of every distinct journal's last sequence number (pipelined); the insert of every
/// accepted event and the save of every accepted snapshot (pipelined); the commit. Each
/// write is decided in batch order as its own savepoint would decide it: refused when its
/// grant is not held, when its sequence number does not follow the journal's (counting the
/// batch's earlier appends), or (a snapshot) when it is past the journal's last event.
///
/// `Ok(Some(outcomes))`: each `Written` committed. `Ok(None)`: another transaction wrote
/// one of the batch's sequence numbers after the read (the insert's unique violation; this
/// transaction rolled back, nothing written): the caller writes the batch one savepoint per
/// write for exact answers. `Err`: as [`attempt`]'s.
async fn batched(
    shared: &Shared,
    conn: &mut crate::Pooled,
    writes: &[&Write],
) -> Result<Option<Vec<Outcome>>, Failed> {
    let statements = &shared.statements;
    let tx = conn.transaction().await.map_err(|e| failed(shared, e))?;
    let mut grants: Vec<(&str, &str, FencingToken)> = Vec::new();
    let mut grant_of: HashMap<&tenure_journal::Fence, usize> = HashMap::new();
    let mut pids: Vec<&str> = Vec::new();
    let mut pid_of: HashMap<&str, usize> = HashMap::new();
    let mut refs = Vec::with_capacity(writes.len());
    for write in writes {
        let fence = match write {
            Write::Append(a) => &a.fence,
            Write::Snapshot(s) => &s.fence,
        };
        let g = *grant_of.entry(fence).or_insert_with(|| {
            grants.push((&fence.lease, &fence.owner, fence.token));
            grants.len() - 1
        });
        let pid = write.persistence_id();
        let p = *pid_of.entry(pid).or_insert_with(|| {
            pids.push(pid);
            pids.len() - 1
        });
        refs.push((g, p));
    }
    let last_seqs = async {
        let statement = tx.prepare_cached(&statements.last_seqs).await?;
        tx.query(&statement, &[&pids]).await
    };
    let (held, rows) = tokio::try_join!(shared.fence.check_many(&tx, &grants), last_seqs)
        .map_err(|e| failed(shared, e))?;
    let mut last = vec![0u64; pids.len()];
    for row in rows {
        if let Some(&p) = pid_of.get(row.get::<_, &str>(0)) {
            last[p] = row.get::<_, i64>(1).max(0) as u64;
        }
    }

    let mut outcomes = Vec::with_capacity(writes.len());
    let mut appends = Vec::new();
    // Per journal, the snapshot its savepoints would leave kept: the highest sequence
    // number, the later of equals (the save keeps a snapshot unless a later one is kept).
    let mut snapshots: HashMap<usize, &SaveSnapshot> = HashMap::new();
    for (&write, &(g, p)) in writes.iter().zip(&refs) {
        let pid = write.persistence_id();
        let refused = |r: Refusal| Outcome::Final(Ok(Written::Refused(r)));
        let outcome = match write {
            Write::Append(a) if !held[g] => refused(Refusal::not_held(pid, &a.fence)),
            Write::Snapshot(s) if !held[g] => refused(Refusal::not_held(pid, &s.fence)),
            Write::Append(a) if a.first_seq != last[p] + 1 => refused(Refusal::SequenceConflict {
                persistence_id: pid.to_string(),
                expected: a.first_seq,
                next: last[p] + 1,
            }),
            Write::Append(a) => {
                appends.push(a);
                last[p] = *a.range().end();
                Outcome::Written(Written::Appended(a.range()))
            }
            Write::Snapshot(s) if s.seq > last[p] => refused(Refusal::SnapshotBeyondJournal {
                persistence_id: pid.to_string(),
                seq: s.seq,
                last: last[p],
            }),
            Write::Snapshot(s) => {
                let kept = snapshots.entry(p).or_insert(s);
                if s.seq >= kept.seq {
                    *kept = s;
                }
                Outcome::Written(Written::Appended(s.seq..=s.seq))
            }
        };
        outcomes.push(outcome);
    }
    if appends.is_empty() && snapshots.is_empty() {
        // Nothing to commit: every answer is a refusal.
        return Ok(Some(outcomes));
    }

    let events = EventRows::of(appends);
    let mut kept: Vec<&SaveSnapshot> = snapshots.into_values().collect();
    kept.sort_by(|a, b| a.persistence_id.cmp(&b.persistence_id));
    let insert = async {
        if events.pids.is_empty() {
            return Ok(0);
        }
        let statement = tx.prepare_cached(&statements.insert_rows).await?;
        let e = &events;
        tx.execute(
            &statement,
            &[&e.pids, &e.seqs, &e.tokens, &e.writers, &e.payloads],
        )
        .await
    };
    let save = async {
        if kept.is_empty() {
            return Ok(0);
        }
        let statement = tx.prepare_cached(&statements.save_snapshots).await?;
        let pids: Vec<&str> = kept.iter().map(|s| s.persistence_id.as_str()).collect();
        let seqs: Vec<i64> = kept.iter().map(|s| s.seq as i64).collect();
        let tokens: Vec<i64> = kept.iter().map(|s| s.fence.token.get() as i64).collect();
        let payloads: Vec<&[u8]> = kept.iter().map(|s| s.payload.as_slice()).collect();
        tx.execute(&statement, &[&pids, &seqs, &tokens, &payloads])
            .await
    };
    let (inserted, saved) = tokio::join!(insert, save);
    let conflict = |r: &Result<u64, tokio_postgres::Error>| matches!(r, Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION));
    if conflict(&inserted) {
        return Ok(None);
    }
    inserted.and(saved).map_err(|e| failed(shared, e))?;
    tx.commit().await.map_err(|e| Failed {
        retry: false,
        ..failed(shared, e)
    })?;
    Ok(Some(outcomes))
}

/// One try of a batch one savepoint per write, each with its own fence check, sequence
/// check and insert (round trips grow with the batch; exact whatever other transactions
/// write meanwhile): its outcomes, each `Written` committed; or why it failed (commit
/// included: then the outcome is unknown).
async fn attempt(
    shared: &Shared,
    conn: &mut crate::Pooled,
    writes: &[&Write],
) -> Result<Vec<Outcome>, Failed> {
    let tx = conn.transaction().await.map_err(|e| failed(shared, e))?;
    // A lone write needs no savepoint: its failure is the transaction's.
    let guarded = writes.len() > 1;
    let mut outcomes = Vec::with_capacity(writes.len());
    for write in writes {
        if guarded {
            tx.batch_execute("SAVEPOINT job")
                .await
                .map_err(|e| failed(shared, e))?;
        }
        let done = match write {
            Write::Append(a) => append(shared, &tx, a).await,
            Write::Snapshot(s) => snapshot(shared, &tx, s).await,
        };
        let (pid, op) = (write.persistence_id(), write.operation());
        let outcome = match done {
            Ok(w @ Written::Appended(_)) => {
                if guarded {
                    tx.batch_execute("RELEASE job")
                        .await
                        .map_err(|e| failed(shared, e))?;
                }
                Outcome::Written(w)
            }
            Ok(refused) if guarded => {
                tx.batch_execute("ROLLBACK TO job; RELEASE job")
                    .await
                    .map_err(|e| failed(shared, e))?;
                Outcome::Final(Ok(refused))
            }
            // A lone refusal: nothing to commit.
            Ok(refused) => return Ok(vec![Outcome::Final(Ok(refused))]),
            Err(Step::Conflict) => {
                // Another transaction appended the same sequence number first.
                if guarded {
                    tx.batch_execute("ROLLBACK TO job; RELEASE job")
                        .await
                        .map_err(|e| failed(shared, e))?;
                    Outcome::Final(conflict(shared, &*tx, write).await)
                } else {
                    drop(tx);
                    let client: &tokio_postgres::Client = conn;
                    return Ok(vec![Outcome::Final(conflict(shared, client, write).await)]);
                }
            }
            Err(Step::Failed(f)) if guarded && !f.retry => {
                tx.batch_execute("ROLLBACK TO job; RELEASE job")
                    .await
                    .map_err(|e| failed(shared, e))?;
                Outcome::Final(Err(JournalError::store(pid, op, f.error)))
            }
            Err(Step::Failed(f)) => return Err(f),
        };
        outcomes.push(outcome);
    }
    if outcomes.iter().any(|o| matches!(o, Outcome::Written(_))) {
        tx.commit().await.map_err(|e| Failed {
            retry: false,
            ..failed(shared, e)
        })?;
    }
    Ok(outcomes)
}

/// Why a write's statements did not give an answer.
enum Step {
    /// A unique violation: another transaction wrote the same sequence number first.
    Conflict,
    Failed(Failed),
}

fn step(shared: &Shared, e: tokio_postgres::Error) -> Step {
    if e.code() == Some(&SqlState::UNIQUE_VIOLATION) {
        Step::Conflict
    } else {
        Step::Failed(failed(shared, e))
    }
}

/// The fence's check inside `tx`: `Ok(None)` held (its row now locked until `tx` ends),
/// `Ok(Some(refusal))` not held.
async fn fence(
    shared: &Shared,
    tx: &Transaction<'_>,
    pid: &str,
    operation: &'static str,
    f: &tenure_journal::Fence,
) -> Result<Option<Refusal>, Step> {
    match shared.fence.check(tx, &f.lease, &f.owner, f.token).await {
        Ok(()) => Ok(None),
        Err(e) => match Refusal::from_fence(pid, operation, f, e) {
            Ok(refusal) => Ok(Some(refusal)),
            Err(JournalError::Store { source, .. }) => {
                let retry = source
                    .source_pg()
                    .and_then(|pg| pg.code())
                    .is_some_and(|c| {
                        *c == SqlState::T_R_DEADLOCK_DETECTED
                            || *c == SqlState::T_R_SERIALIZATION_FAILURE
                    });
                Err(Step::Failed(Failed {
                    error: source,
                    retry,
                }))
            }
            Err(other) => Err(Step::Failed(Failed {
                error: StoreError::backend(error::STORE, other.to_string()),
                retry: false,
            })),
        },
    }
}

/// The tokio-postgres error a store error was caused by, if any.
trait SourcePg {
    fn source_pg(&self) -> Option<&tokio_postgres::Error>;
}

impl SourcePg for StoreError {
    fn source_pg(&self) -> Option<&tokio_postgres::Error> {
        std::error::Error::source(self).and_then(|s| s.downcast_ref())
    }
}

async fn append(shared: &Shared, tx: &Transaction<'_>, a: &Append) -> Result<Written, Step> {
    if let Some(refusal) = fence(shared, tx, &a.persistence_id, "append", &a.fence).await? {
        return Ok(Written::Refused(refusal));
    }
    let inserted = tx
        .execute(
            shared.statements.insert.as_str(),
            &[
                &a.persistence_id,
                &(a.first_seq as i64),
                &(a.fence.token.get() as i64),
                &a.fence.owner,
                &a.events,
            ],
        )
        .await
        .map_err(|e| step(shared, e))?;
    if inserted as usize == a.events.len() {
        return Ok(Written::Appended(a.range()));
    }
    let last = last_seq(shared, tx, &a.persistence_id)
        .await
        .map_err(|e| step(shared, e))?;
    Ok(Written::Refused(Refusal::SequenceConflict {
        persistence_id: a.persistence_id.clone(),
        expected: a.first_seq,
        next: last + 1,
    }))
}

async fn snapshot(
    shared: &Shared,
    tx: &Transaction<'_>,
    s: &SaveSnapshot,
) -> Result<Written, Step> {
    let pid = &s.persistence_id;
    if let Some(refusal) = fence(shared, tx, pid, "save snapshot", &s.fence).await? {
        return Ok(Written::Refused(refusal));
    }
    let last = last_seq(shared, tx, pid)
        .await
        .map_err(|e| step(shared, e))?;
    if s.seq > last {
        return Ok(Written::Refused(Refusal::SnapshotBeyondJournal {
            persistence_id: pid.clone(),
            seq: s.seq,
            last,
        }));
    }
    tx.execute(
        shared.statements.save_snapshot.as_str(),
        &[
            pid,
            &(s.seq as i64),
            &(s.fence.token.get() as i64),
            &s.payload,
        ],
    )
    .await
    .map_err(|e| step(shared, e))?;
    Ok(Written::Appended(s.seq..=s.seq))
}

async fn last_seq(
    shared: &Shared,
    client: &impl tokio_postgres::GenericClient,
    pid: &str,
) -> Result<u64, tokio_postgres::Error> {
    let row = client
        .query_one(shared.statements.last_seq.as_str(), &[&pid])
        .await?;
    Ok(row.get::<_, i64>(0).max(0) as u64)
}

/// The refusal of `write`, whose sequence number another transaction took first.
async fn conflict(
    shared: &Shared,
    client: &impl tokio_postgres::GenericClient,
    write: &Write,
) -> Result<Written, JournalError> {
    let (pid, op) = (write.persistence_id(), write.operation());
    let last = last_seq(shared, client, pid)
        .await
        .map_err(|e| JournalError::store(pid, op, error::from_pg(&shared.server, e).error))?;
    let expected = match write {
        Write::Append(a) => a.first_seq,
        Write::Snapshot(s) => s.seq,
    };
    Ok(Written::Refused(Refusal::SequenceConflict {
        persistence_id: pid.to_string(),
        expected,
        next: last + 1,
    }))
}
