//! The store's connection to its file, and its transactions: each reads the file's identity
//! first and fails with [`DbError::Lost`] when it shows the file's state lost (see
//! `identity`); a write that changed anything commits the next generation, shown on the
//! process's witness lock before the commit (see `witness`).

use std::ops::Deref;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use rusqlite::{Connection, Transaction, TransactionBehavior, params};

use crate::identity::{self, Identity, Lost};
use crate::sql;
use crate::witness::{FileId, Witness};

/// A failed transaction: SQLite's error, the file's state found lost, or the witness lock
/// failing.
#[derive(Debug)]
pub(crate) enum DbError {
    Sqlite(rusqlite::Error),
    Lost(Lost),
    Witness(std::io::Error),
}

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> Self {
        DbError::Sqlite(e)
    }
}

impl From<Lost> for DbError {
    fn from(l: Lost) -> Self {
        DbError::Lost(l)
    }
}

/// The identity of a file: device and inode.
pub(crate) fn file_id(path: &Path) -> std::io::Result<FileId> {
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

/// `path` with `suffix` appended (SQLite's `-wal` and `-shm` files).
pub(crate) fn sibling(path: &Path, suffix: &str) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(suffix);
    std::path::PathBuf::from(name)
}

/// Which files a database path names: the main file, its `-wal` and its `-shm` (`None`:
/// absent). While a connection is open its `-wal` and `-shm` stay (SQLite removes them
/// only when the last connection of the host closes), so any change is a file deleted or
/// replaced under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Files {
    pub main: Option<FileId>,
    pub wal: Option<FileId>,
    pub shm: Option<FileId>,
}

impl Files {
    pub(crate) fn at(path: &Path) -> Files {
        Files {
            main: file_id(path).ok(),
            wal: file_id(&sibling(path, "-wal")).ok(),
            shm: file_id(&sibling(path, "-shm")).ok(),
        }
    }
}

/// A connection to the lease file and this process's witness of that file, counted there
/// ([`Witness::attach`]) while open.
pub(crate) struct Db {
    pub conn: Connection,
    pub witness: Arc<Witness>,
}

impl Drop for Db {
    fn drop(&mut self) {
        self.witness.detach();
    }
}

impl Db {
    /// Begins a write transaction (IMMEDIATE: the file's write lock is taken at once) and
    /// checks the file's identity, including against the generations live processes of
    /// the host rely on.
    pub(crate) fn write(&mut self) -> Result<Write<'_>, DbError> {
        let Db { conn, witness } = self;
        let changes = conn.total_changes();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        // Read under the write lock: every generation committed so far is in the file.
        let known = witness.seen();
        let id = identity::check(&known, identity::read(&tx)?)?;
        if let Some(relied) = witness.above(id.generation).map_err(DbError::Witness)? {
            return Err(Lost::Behind {
                relied,
                now: id.generation,
            }
            .into());
        }
        Ok(Write {
            tx,
            witness,
            id,
            changes,
        })
    }

    /// Begins a read transaction and checks the file's identity against what this process
    /// knew before it began.
    pub(crate) fn read(&mut self) -> Result<Read<'_>, DbError> {
        let Db { conn, witness } = self;
        // Known before the snapshot is taken (at the first read): everything it holds was
        // committed before, so the snapshot shows it unless the file lost it.
        let known = witness.seen();
        let tx = conn.transaction()?;
        let id = identity::check(&known, identity::read(&tx)?)?;
        Ok(Read { tx, witness, id })
    }

    /// Records a loss of the file's state found at `now` (`CLOCK_BOOTTIME` ns): holders of
    /// its grants may believe in them until `now + ttl`, so `lost_at` becomes `now` (a later
    /// record is kept) and new grants wait until then (see `store::acquire_in`); every grant
    /// and waiter is forgotten; the generation moves above every one a live process relies
    /// on, so the loss is recorded once. The file's store id stays (a file without one gets
    /// one).
    pub(crate) fn record_loss(&mut self, now: i64) -> Result<(), DbError> {
        let Db { conn, witness } = self;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        crate::schema::note_loss(&tx, now)?;
        tx.execute("DELETE FROM tenure_lease", [])?;
        tx.execute(crate::sql::CHANGED_ALL, [])?;
        tx.execute("DELETE FROM tenure_waiter", [])?;
        let found = identity::read(&tx)?;
        let generation = found.as_ref().map_or(0, |i| i.generation);
        let relied = witness
            .above(generation)
            .map_err(DbError::Witness)?
            .unwrap_or(0);
        let next = identity::next(generation.max(relied).max(witness.seen().generation));
        let store = match found {
            Some(i) => {
                tx.prepare_cached(sql::SET_GENERATION)?.execute([next])?;
                i.store
            }
            None => {
                tx.execute(sql::CREATE_IDENTITY, params![next])?;
                identity::read(&tx)?.map(|i| i.store).unwrap_or_default()
            }
        };
        commit_witnessed(tx, witness, next)?;
        witness.reset(&store, next);
        Ok(())
    }
}

/// Commits `tx`, which writes `generation`, after showing that generation on `witness`'s
/// lock: a process relies on a commit only once it returned, and a failed commit lowers
/// the lock again (nothing relies on it).
fn commit_witnessed(
    tx: Transaction<'_>,
    witness: &Witness,
    generation: i64,
) -> Result<(), DbError> {
    let before = witness.hold(generation).map_err(DbError::Witness)?;
    if let Err(e) = tx.commit() {
        witness.restore(before);
        return Err(e.into());
    }
    Ok(())
}

/// A write transaction whose identity check passed. Dropped without
/// [`commit`](Write::commit), it rolls back.
pub(crate) struct Write<'c> {
    tx: Transaction<'c>,
    witness: &'c Witness,
    id: Identity,
    /// The connection's total changes when it began.
    changes: u64,
}

impl<'c> Deref for Write<'c> {
    type Target = Transaction<'c>;

    fn deref(&self) -> &Transaction<'c> {
        &self.tx
    }
}

impl Write<'_> {
    /// Commits. A transaction that changed anything advances the generation and shows the
    /// new one on the witness lock before it commits (see [`commit_witnessed`]).
    pub(crate) fn commit(self) -> Result<(), DbError> {
        let Write {
            tx,
            witness,
            id,
            changes,
        } = self;
        if tx.total_changes() == changes {
            tx.commit()?;
            witness.saw(&id.store, id.generation);
            return Ok(());
        }
        let next = identity::next(id.generation);
        tx.prepare_cached(sql::SET_GENERATION)?.execute([next])?;
        commit_witnessed(tx, witness, next)?;
        witness.saw(&id.store, next);
        Ok(())
    }
}

/// A read transaction whose identity check passed.
pub(crate) struct Read<'c> {
    tx: Transaction<'c>,
    witness: &'c Witness,
    id: Identity,
}

impl<'c> Deref for Read<'c> {
    type Target = Transaction<'c>;

    fn deref(&self) -> &Transaction<'c> {
        &self.tx
    }
}

impl Read<'_> {
    /// Ends the transaction; what it read is known to the process from now on.
    pub(crate) fn finish(self) -> Result<(), DbError> {
        let Read { tx, witness, id } = self;
        tx.commit()?;
        witness.saw(&id.store, id.generation);
        Ok(())
    }
}
