//! Group commit: one writer task per journal writes every append and snapshot waiting at
//! once in one transaction, each (when there are several) behind a savepoint with its own
//! fence check and sequence check, so each is refused alone and one commit makes all the
//! others durable.

use deadpool::managed::Object;
use tenure_journal::group::{Batches, Job, Write};
use tenure_journal::{Append, JournalError, Refusal, SaveSnapshot, Written};
use tenure_lease::StoreError;
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
        write_batch(&shared, batch).await;
    }
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

/// Writes `batch` in one transaction and answers every write.
async fn write_batch(shared: &Shared, batch: Vec<Job>) {
    let limit = shared.store.options().operation_timeout;
    let mut tries = 0;
    let result = loop {
        tries += 1;
        let mut conn = match shared.store.connection().await {
            Ok(c) => c,
            Err(e) => break Err(e),
        };
        let writes: Vec<&Write> = batch.iter().map(|j| &j.write).collect();
        match tokio::time::timeout(limit, attempt(shared, &mut conn, &writes)).await {
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
        Ok(outcomes) => {
            for (job, outcome) in batch.into_iter().zip(outcomes) {
                match outcome {
                    Outcome::Final(answer) => job.answer(answer),
                    Outcome::Written(w) => job.answer(Ok(w)),
                }
            }
        }
        Err(error) => {
            for job in batch {
                job.fail(error.clone());
            }
        }
    }
}

/// One try of a batch: its outcomes, each `Written` committed; or why it failed (commit
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
