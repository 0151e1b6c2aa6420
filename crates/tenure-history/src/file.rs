//! A history file, appended to by every process of a host.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::entry::Entry;
use crate::read::HistoryError;

/// An append-only history file (docs/history.md): one JSON line per [`Entry`], each appended
/// with one `write(2)` on a file opened with `O_APPEND`, so that the lines of concurrent
/// writers (the nodes of a host, a harness recording faults) never interleave. Clones share
/// the file.
#[derive(Clone)]
pub struct HistoryFile {
    path: Arc<PathBuf>,
    file: Arc<Mutex<File>>,
}

impl std::fmt::Debug for HistoryFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HistoryFile")
            .field("path", &self.path)
            .finish()
    }
}

impl HistoryFile {
    /// Opens the history at `path` for appending, creating it if missing. `Err` names the
    /// file.
    pub fn open(path: &Path) -> Result<HistoryFile, HistoryError> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| HistoryError::Append {
                path: path.display().to_string(),
                source,
            })?;
        Ok(HistoryFile {
            path: Arc::new(path.to_path_buf()),
            file: Arc::new(Mutex::new(file)),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `entry` as one line. `Err` names the file.
    pub fn append(&self, entry: &Entry) -> Result<(), HistoryError> {
        let mut line = entry.to_json().to_string();
        line.push('\n');
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        file.write_all(line.as_bytes())
            .map_err(|source| HistoryError::Append {
                path: self.path.display().to_string(),
                source,
            })
    }
}
