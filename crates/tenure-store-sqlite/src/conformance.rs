//! The SQLite lease store and journal as a [`JournalHarness`] (feature `conformance`), for
//! the journal conformance kit and the tests of crates that run on this journal.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure_journal::Journal;
use tenure_journal::conformance::JournalHarness;
use tenure_lease::LeaseStore;

use crate::{SqliteJournal, SqliteStore};

/// The busy timeout every client of [`JournalFiles`] opens the files with.
const BUSY: Duration = Duration::from_secs(5);

/// A lease file and the journal, in the lease file or in a file of its own beside it, in
/// a temporary directory removed on drop. Every client (lease store and journal) opens the
/// files anew, as another process would.
pub struct JournalFiles {
    _dir: tempfile::TempDir,
    /// The lease file.
    pub leases: PathBuf,
    /// The journal's own file (`None`: the journal is in the lease file).
    pub journal: Option<PathBuf>,
}

impl JournalFiles {
    /// The files in a new temporary directory, the journal in a file of its own when
    /// `own_file`. Panics when the directory cannot be made (a test tool).
    pub fn new(own_file: bool) -> JournalFiles {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let leases = dir.path().join("leases.sqlite");
        let journal = own_file.then(|| dir.path().join("journal.sqlite"));
        JournalFiles {
            _dir: dir,
            leases,
            journal,
        }
    }
}

#[async_trait]
impl JournalHarness for JournalFiles {
    async fn leases(&self) -> Arc<dyn LeaseStore> {
        Arc::new(SqliteStore::open(&self.leases, BUSY).expect("open the lease store"))
    }

    async fn journal(&self) -> Arc<dyn Journal> {
        Arc::new(
            match &self.journal {
                None => SqliteJournal::open(&self.leases, BUSY),
                Some(own) => SqliteJournal::open_beside(own, &self.leases, BUSY),
            }
            .expect("open the journal"),
        )
    }
}
