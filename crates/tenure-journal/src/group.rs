//! Group commit's plumbing, shared by the journals that batch: writes queue for one writer
//! (a thread or a task per journal), which takes every write waiting at once (up to a
//! bound) and commits them in one transaction, each behind its own checks so that each is
//! refused alone. Only the writing is the journal's own.

use tokio::sync::{mpsc, oneshot};

use crate::{Append, JournalError, SaveSnapshot, Written};

/// Writes waiting for a writer, at most; a caller beyond waits for room.
const QUEUE: usize = 4096;

/// A write of a batch.
#[derive(Debug)]
pub enum Write {
    /// An append (checked well formed).
    Append(Append),
    /// A snapshot (checked well formed).
    Snapshot(SaveSnapshot),
}

impl Write {
    /// The persistence id written to.
    pub fn persistence_id(&self) -> &str {
        match self {
            Write::Append(a) => &a.persistence_id,
            Write::Snapshot(s) => &s.persistence_id,
        }
    }

    /// The operation, for errors: `append` or `save snapshot`.
    pub fn operation(&self) -> &'static str {
        match self {
            Write::Append(_) => "append",
            Write::Snapshot(_) => "save snapshot",
        }
    }
}

/// A queued write and where its answer goes.
#[derive(Debug)]
pub struct Job {
    /// The write.
    pub write: Write,
    reply: oneshot::Sender<Result<Written, JournalError>>,
}

impl Job {
    /// Sends the answer to the caller (who may have stopped waiting).
    pub fn answer(self, answer: Result<Written, JournalError>) {
        let _ = self.reply.send(answer);
    }

    /// Answers with a failure of `source` (outcome unknown), naming the write.
    pub fn fail(self, source: tenure_lease::StoreError) {
        let error =
            JournalError::store(self.write.persistence_id(), self.write.operation(), source);
        self.answer(Err(error));
    }
}

/// The writes a writer takes, a batch at a time.
#[derive(Debug)]
pub struct Batches {
    jobs: mpsc::Receiver<Job>,
    max: usize,
}

impl Batches {
    /// The next batch: the first write to arrive and every one waiting behind it, at most
    /// `max_batch`; `None` once every handle of the journal is gone.
    pub async fn next(&mut self) -> Option<Vec<Job>> {
        let first = self.jobs.recv().await?;
        Some(self.fill(first))
    }

    /// As [`next`](Self::next), blocking the calling thread (for a writer thread).
    pub fn blocking_next(&mut self) -> Option<Vec<Job>> {
        let first = self.jobs.blocking_recv()?;
        Some(self.fill(first))
    }

    fn fill(&mut self, first: Job) -> Vec<Job> {
        let mut batch = Vec::with_capacity(self.max.min(64));
        batch.push(first);
        while batch.len() < self.max {
            match self.jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        batch
    }
}

/// The queue in front of a journal's writer, which it starts at the first write (and
/// again should it have ended).
#[derive(Debug)]
pub struct GroupCommit {
    sender: std::sync::Mutex<Option<mpsc::Sender<Job>>>,
    max: std::sync::atomic::AtomicUsize,
}

impl GroupCommit {
    /// A queue whose batches hold at most `max_batch` writes (at least 1).
    pub fn new(max_batch: usize) -> Self {
        GroupCommit {
            sender: std::sync::Mutex::new(None),
            max: max_batch.max(1).into(),
        }
    }

    /// Batches of at most `max_batch` writes (at least 1) for writers started from now on.
    pub fn set_max_batch(&self, max_batch: usize) {
        self.max
            .store(max_batch.max(1), std::sync::atomic::Ordering::Relaxed);
    }

    /// Queues `write` and waits for its answer. `start` starts the writer on the batches
    /// when none runs; its error is the write's (nothing was written).
    pub async fn submit(
        &self,
        write: Write,
        start: impl FnOnce(Batches) -> std::io::Result<()>,
    ) -> Result<Written, JournalError> {
        let (pid, op) = (write.persistence_id().to_string(), write.operation());
        let failed = |detail: String| {
            JournalError::store(
                &pid,
                op,
                tenure_lease::StoreError::unavailable("journal", detail),
            )
        };
        let sender = {
            let mut slot = self.sender.lock().unwrap_or_else(|e| e.into_inner());
            match slot.as_ref().filter(|s| !s.is_closed()) {
                Some(s) => s.clone(),
                None => {
                    let (tx, rx) = mpsc::channel(QUEUE);
                    let max = self.max.load(std::sync::atomic::Ordering::Relaxed);
                    start(Batches { jobs: rx, max })
                        .map_err(|e| failed(format!("cannot start the journal's writer: {e}")))?;
                    *slot = Some(tx.clone());
                    tx
                }
            }
        };
        let (reply, answer) = oneshot::channel();
        let gone = || failed("the journal's writer stopped".into());
        sender
            .send(Job { write, reply })
            .await
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}
