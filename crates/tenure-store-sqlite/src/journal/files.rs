//! The journal's connections and the files they have open: the journal file and, when
//! the journal has a file of its own, the lease file attached to it (as `leases`), so that
//! a write checks the fence where the grants are, in its own transaction (which holds the
//! journal file's write lock only: see [`super::sql::begin`]).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use tenure_lease::ConfigError;

/// Where a journal keeps its events and where the leases that fence it are.
#[derive(Debug, Clone)]
pub(crate) struct Files {
    /// The journal's file.
    pub journal: PathBuf,
    /// The lease store's file, when it is another one than the journal's.
    pub leases: Option<PathBuf>,
    pub busy_timeout: Duration,
}

/// The identity of a file: device and inode.
type FileId = (u64, u64);

fn file_id(path: &Path) -> Option<FileId> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// A connection and the identities of the files it opened.
pub(crate) struct Opened {
    pub conn: Connection,
    ids: (Option<FileId>, Option<FileId>),
}

fn path_error(path: &Path, detail: impl Into<String>) -> ConfigError {
    ConfigError::StorePath {
        path: path.display().to_string(),
        detail: detail.into(),
    }
}

impl Files {
    fn ids(&self) -> (Option<FileId>, Option<FileId>) {
        (
            file_id(&self.journal),
            self.leases.as_deref().and_then(file_id),
        )
    }

    /// Opens a connection: the journal file (created with its tables when missing), the
    /// lease file's tables created too (when the lease store never opened it yet), and the
    /// lease file attached when it is another file.
    pub fn open(&self) -> Result<Opened, ConfigError> {
        crate::store::check_path(&self.journal)?;
        let leases = self.leases.as_deref().unwrap_or(&self.journal);
        if let Some(other) = &self.leases {
            crate::store::check_path(other)?;
            // The lease file's tables, so that the fence has something to check.
            let mut conn = self.connect(other)?;
            self.lease_schema(&mut conn, other)?;
        }
        let mut conn = self.connect(&self.journal)?;
        if self.leases.is_none() {
            self.lease_schema(&mut conn, leases)?;
        }
        conn.execute_batch(super::sql::SCHEMA).map_err(|e| {
            path_error(
                &self.journal,
                format!("cannot create the journal's tables: {e}"),
            )
        })?;
        if let Some(other) = &self.leases {
            let name = other
                .to_str()
                .ok_or_else(|| path_error(other, "the lease file's path is not valid UTF-8"))?;
            conn.execute("ATTACH DATABASE ?1 AS leases", [name])
                .map_err(|e| path_error(other, format!("cannot attach the lease file: {e}")))?;
        }
        // Identities after the files exist (the connections above created them).
        Ok(Opened {
            conn,
            ids: self.ids(),
        })
    }

    fn connect(&self, path: &Path) -> Result<Connection, ConfigError> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| path_error(path, e.to_string()))?;
        conn.busy_timeout(self.busy_timeout)
            .and_then(|_| conn.pragma_update(None, "journal_mode", "WAL"))
            .and_then(|_| conn.pragma_update(None, "synchronous", "FULL"))
            .map_err(|e| path_error(path, format!("cannot open the journal: {e}")))?;
        Ok(conn)
    }

    fn lease_schema(&self, conn: &mut Connection, path: &Path) -> Result<(), ConfigError> {
        let boot = crate::clock::boot_id()
            .map_err(|e| path_error(path, format!("cannot read the boot id: {e}")))?;
        crate::schema::migrate(conn, &boot)
            .map_err(|e| path_error(path, format!("cannot initialise the lease tables: {e}")))
    }

    /// `opened` when its files are still the ones the paths name; otherwise a connection to
    /// the files the paths name now (a lease file deleted or replaced while in use must not
    /// fence anything: its grants are gone).
    pub fn current<'a>(
        &self,
        slot: &'a mut Option<Opened>,
    ) -> Result<&'a mut Connection, ConfigError> {
        if slot.as_ref().is_none_or(|o| o.ids != self.ids()) {
            if slot.is_some() {
                tracing::warn!(journal = %self.journal.display(),
                    "the journal's or its lease file was deleted or replaced while in use: reopening");
            }
            if let Some(old) = slot.take() {
                // Never closed: closing the last connection to a WAL database deletes the
                // `-wal` file by its path, which may now be the new file's.
                std::mem::forget(old.conn);
            }
            *slot = Some(self.open()?);
        }
        Ok(&mut slot.as_mut().expect("opened above").conn)
    }
}
