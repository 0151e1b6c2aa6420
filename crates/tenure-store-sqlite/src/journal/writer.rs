//! Group commit: one writer thread per journal takes the appends and snapshots waiting at
//! once and writes them in one transaction holding the journal file's write lock (see
//! [`super::sql::begin`]), each behind a savepoint with its own
//! fence and sequence checks, so that each is refused alone, and one commit (one `fsync`)
//! makes all the others durable.

use rusqlite::Connection;
use tenure_journal::group::{Batches, Job, Write};
use tenure_journal::{Append, JournalError, Refusal, SaveSnapshot, Written};
use tenure_lease::StoreError;

use super::files::{Files, Opened};

fn store_error(e: rusqlite::Error) -> StoreError {
    StoreError::unavailable("sqlite", e.to_string()).caused_by(e)
}

/// Runs until every handle of the journal is gone: writes each batch in one transaction.
pub(crate) fn run(files: Files, mut batches: Batches) {
    let mut slot: Option<Opened> = None;
    while let Some(mut batch) = batches.blocking_next() {
        match files.current(&mut slot) {
            Ok(conn) => write_batch(conn, &mut batch),
            Err(e) => {
                let error = StoreError::unavailable("sqlite", e.to_string());
                for job in batch.drain(..) {
                    job.fail(error.clone());
                }
            }
        }
    }
}

/// What one job of a batch came to inside the transaction.
enum Outcome {
    /// Written, committed with the batch.
    Written(Written),
    /// Refused, or failed on its own (rolled back to its savepoint): its answer stands
    /// whatever the commit does.
    Final(Result<Written, JournalError>),
}

/// Writes `batch` in one transaction and answers every job; empties `batch`.
fn write_batch(conn: &mut Connection, batch: &mut Vec<Job>) {
    let tx = match super::sql::begin(conn) {
        Ok(tx) => tx,
        Err(e) => {
            let error = store_error(e);
            for job in batch.drain(..) {
                job.fail(error.clone());
            }
            return;
        }
    };
    let outcomes: Vec<Outcome> = batch.iter().map(|job| write_one(&tx, &job.write)).collect();
    let committed = tx.commit().map_err(store_error);
    for (job, outcome) in batch.drain(..).zip(outcomes) {
        let answer = match (outcome, &committed) {
            (Outcome::Final(answer), _) => answer,
            (Outcome::Written(w), Ok(())) => Ok(w),
            (Outcome::Written(_), Err(e)) => {
                job.fail(e.clone());
                continue;
            }
        };
        job.answer(answer);
    }
}

/// One job behind its own savepoint: kept when written, rolled back when refused or failed.
fn write_one(tx: &rusqlite::Transaction<'_>, job: &Write) -> Outcome {
    let (pid, op) = (job.persistence_id(), job.operation());
    if let Err(e) = tx.execute_batch("SAVEPOINT job") {
        return Outcome::Final(Err(JournalError::store(pid, op, store_error(e))));
    }
    let done = match job {
        Write::Append(a) => append(tx, a),
        Write::Snapshot(s) => snapshot(tx, s),
    };
    let end = match &done {
        Ok(Written::Appended(_)) => tx.execute_batch("RELEASE job"),
        _ => tx.execute_batch("ROLLBACK TO job; RELEASE job"),
    };
    match (done, end) {
        (Ok(w @ Written::Appended(_)), Ok(())) => Outcome::Written(w),
        (Ok(w @ Written::Refused(_)), _) => Outcome::Final(Ok(w)),
        (Err(e), _) => Outcome::Final(Err(e)),
        // The savepoint could not be released: the transaction is unusable, so is the write.
        (Ok(Written::Appended(_)), Err(e)) => {
            Outcome::Final(Err(JournalError::store(pid, op, store_error(e))))
        }
    }
}

fn append(tx: &rusqlite::Transaction<'_>, a: &Append) -> Result<Written, JournalError> {
    let fence = (
        a.fence.lease.as_str(),
        a.fence.owner.as_str(),
        a.fence.token,
    );
    match super::sql::append_in(tx, fence, &a.persistence_id, a.first_seq, &a.events) {
        Ok(Ok(())) => Ok(Written::Appended(a.range())),
        Ok(Err(next)) => Ok(Written::Refused(Refusal::SequenceConflict {
            persistence_id: a.persistence_id.clone(),
            expected: a.first_seq,
            next,
        })),
        Err(e) => {
            Refusal::from_fence(&a.persistence_id, "append", &a.fence, e).map(Written::Refused)
        }
    }
}

fn snapshot(tx: &rusqlite::Transaction<'_>, s: &SaveSnapshot) -> Result<Written, JournalError> {
    let (pid, f) = (&s.persistence_id, &s.fence);
    let checked = crate::fence::check(tx, &f.lease, &f.owner, f.token)
        .and_then(|()| super::sql::check_floor(tx, (&f.lease, &f.owner, f.token)));
    if let Err(e) = checked {
        return Refusal::from_fence(pid, "save snapshot", f, e).map(Written::Refused);
    }
    let failed = |e| JournalError::store(pid, "save snapshot", store_error(e));
    let last = super::sql::last_seq(tx, pid).map_err(failed)?;
    if s.seq > last {
        return Ok(Written::Refused(Refusal::SnapshotBeyondJournal {
            persistence_id: pid.clone(),
            seq: s.seq,
            last,
        }));
    }
    tx.prepare_cached(super::sql::SAVE_SNAPSHOT)
        .and_then(|mut stmt| {
            stmt.execute(rusqlite::params![
                pid,
                s.seq as i64,
                f.token.get() as i64,
                s.payload
            ])
        })
        .map_err(failed)?;
    Ok(Written::Appended(s.seq..=s.seq))
}
