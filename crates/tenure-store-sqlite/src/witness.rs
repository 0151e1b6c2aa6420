//! The generation witness: which generations of a lease file the live processes of this
//! host rely on, kept by the kernel as open-file-description locks on the file itself.
//!
//! Every write transaction advances the file's generation (see `identity`). Before it
//! commits generation `g`, a process holds a shared OFD lock on the byte range
//! `[BASE, BASE + g]` of the database file (far above the bytes SQLite locks), and keeps
//! it while it lives. So while a process may still believe in a grant or renewal it
//! committed, the kernel shows that generation on the file's inode. A transaction that finds
//! a lock above the generation it reads is looking at older content than some live process
//! committed to: the file was restored in place (same inode, older bytes) or its `-wal`
//! was deleted under its users (the main file alone holds older content). Such a file is
//! treated as lost state.
//!
//! Why the kernel: the witness must survive every way the files can be replaced while
//! their users run, and vanish with its process (a process that died believes nothing). A
//! lock on the inode does both; a row or a side file would be restored or deleted with the
//! rest. Why OFD locks: a traditional POSIX lock belongs to the process and is dropped when
//! the process closes *any* descriptor of the file, which SQLite does as it sees fit; an
//! OFD lock belongs to this descriptor only.
//!
//! The descriptor is never closed: closing any descriptor of the file would drop the
//! traditional locks SQLite's connections of this process hold on it. One descriptor per
//! database inode a process ever used, kept in a process-wide registry.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, OnceLock};

/// The first byte of the witness range: far above SQLite's lock bytes (around 1 GiB) and
/// any lease file's size; generations (wall-clock microseconds) fit above it in an `off_t`.
const BASE: i64 = 1 << 56;

/// The highest generation a lock can show.
pub(crate) const MAX_GENERATION: i64 = i64::MAX - BASE - 1;

/// The witness of one database file (one inode) in this process, shared by every store of
/// the process on that file (and by [`Witness::for_file`]'s callers).
#[derive(Debug)]
pub struct Witness {
    id: FileId,
    file: File,
    state: Mutex<Seen>,
    /// Why no connection of this process may open the file again: its `-wal` or `-shm`
    /// was lost under a connection of this process (SQLite shares one index mapping among
    /// a process's connections to a file, and the lost one stays mapped).
    log_lost: Mutex<Option<String>>,
    /// The log files this process's open connections to the file use.
    log: Mutex<LogUse>,
}

/// The `-wal` and `-shm` of a database (`None`: absent).
pub(crate) type Log = (Option<FileId>, Option<FileId>);

/// The log files of a process's open connections to a file, and how many there are.
#[derive(Debug, Default)]
struct LogUse {
    files: Option<Log>,
    connections: usize,
}

fn registry() -> std::sync::MutexGuard<'static, HashMap<FileId, Arc<Witness>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<FileId, Arc<Witness>>>> = OnceLock::new();
    REGISTRY
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// What this process knows of the file.
#[derive(Debug, Default, Clone)]
pub(crate) struct Seen {
    /// The store id read from the file.
    pub store: Option<String>,
    /// The highest generation this process read in the file or committed to it.
    pub generation: i64,
    /// The generation the lock shows (the highest this process committed).
    pub held: Option<i64>,
}

/// Device and inode of a file.
pub(crate) type FileId = (u64, u64);

impl Witness {
    /// The witness of the file `file` (opened on the database path; its device and inode
    /// `id`). The first of the process on that inode keeps `file` open for the life of the
    /// process; a caller that lost a race to register one keeps its `file` open too
    /// (closing any descriptor of the file would drop the process's traditional locks on
    /// it, SQLite's).
    fn of(id: FileId, file: File) -> Arc<Witness> {
        let mut registry = registry();
        match registry.get(&id) {
            Some(w) => {
                std::mem::forget(file);
                w.clone()
            }
            None => {
                let w = Arc::new(Witness::new(id, file));
                registry.insert(id, w.clone());
                w
            }
        }
    }

    /// The device and inode of the file.
    pub(crate) fn id(&self) -> FileId {
        self.id
    }

    fn new(id: FileId, file: File) -> Witness {
        Witness {
            id,
            file,
            state: Mutex::default(),
            log_lost: Mutex::default(),
            log: Mutex::default(),
        }
    }

    fn log(&self) -> std::sync::MutexGuard<'_, LogUse> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether connections of this process are open on the file with log files other than
    /// `log`: then theirs were lost, and a new connection would share their index.
    pub(crate) fn other_log_in_use(&self, log: Log) -> bool {
        let use_ = self.log();
        use_.connections > 0 && use_.files != Some(log)
    }

    /// Counts a new connection of this process using `log`; `false` (not counted) when
    /// connections with other log files are open.
    pub(crate) fn attach(&self, log: Log) -> bool {
        let mut use_ = self.log();
        if use_.connections > 0 && use_.files != Some(log) {
            return false;
        }
        use_.files = Some(log);
        use_.connections += 1;
        true
    }

    /// A connection [`attach`](Witness::attach)ed was closed.
    pub(crate) fn detach(&self) {
        let mut use_ = self.log();
        use_.connections = use_.connections.saturating_sub(1);
    }

    /// The witness of the file `id` in this process, if a store of the process opened it.
    pub(crate) fn known(id: FileId) -> Option<Arc<Witness>> {
        registry().get(&id).cloned()
    }

    /// Records that the file's `-wal` or `-shm` was lost under a connection of this
    /// process, and `why` no connection of the process may open the file again.
    pub(crate) fn lose_log(&self, why: String) {
        let mut lost = self.log_lost.lock().unwrap_or_else(|e| e.into_inner());
        lost.get_or_insert(why);
    }

    /// Why no connection of this process may open the file again, if so.
    pub(crate) fn log_lost(&self) -> Option<String> {
        self.log_lost
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What this process knows of the file now.
    pub(crate) fn seen(&self) -> Seen {
        self.state().clone()
    }

    /// Records that this process read `generation` of store `store` in the file.
    pub(crate) fn saw(&self, store: &str, generation: i64) {
        let mut s = self.state();
        if s.store.as_deref() != Some(store) {
            s.store = Some(store.to_string());
        }
        s.generation = s.generation.max(generation);
    }

    /// Records a store id and generation found after a loss: the file's state now,
    /// whatever was known before.
    pub(crate) fn reset(&self, store: &str, generation: i64) {
        let mut s = self.state();
        s.store = Some(store.to_string());
        s.generation = generation;
    }

    /// This process's witness of the database file at `path`, for code that writes the
    /// lease file by hand as the store does (the benchmark's baseline).
    ///
    /// # Errors
    /// The file cannot be opened.
    pub fn for_file(path: &std::path::Path) -> std::io::Result<Arc<Witness>> {
        use std::os::unix::fs::MetadataExt;
        // A known file needs no new descriptor (one opened could never be closed).
        let m = std::fs::metadata(path)?;
        if let Some(w) = Witness::known((m.dev(), m.ino())) {
            return Ok(w);
        }
        let file = File::open(path)?;
        let m = file.metadata()?;
        Ok(Witness::of((m.dev(), m.ino()), file))
    }

    /// The highest generation another process of this host relies on, if above
    /// `generation` (locks of this process are not seen: the process knows its own).
    ///
    /// # Errors
    /// The kernel refused the lock query.
    pub fn above(&self, generation: i64) -> std::io::Result<Option<i64>> {
        let mut highest = None;
        let mut from = generation.clamp(0, MAX_GENERATION);
        while let Some(top) = self.conflict(from)? {
            highest = Some(top);
            if top >= MAX_GENERATION {
                break;
            }
            from = top;
        }
        Ok(highest)
    }

    /// The top generation of some other description's lock above `generation`, if any.
    fn conflict(&self, generation: i64) -> std::io::Result<Option<i64>> {
        let mut probe = flock(libc::F_WRLCK, BASE + generation + 1, 0);
        self.fcntl(libc::F_OFD_GETLK, &mut probe)?;
        if probe.l_type == libc::F_UNLCK as libc::c_short {
            return Ok(None);
        }
        let top = if probe.l_len == 0 {
            MAX_GENERATION
        } else {
            probe.l_start.saturating_add(probe.l_len) - 1 - BASE
        };
        // A lock reaching above `generation` is reported by its whole range.
        Ok(Some(top.clamp(generation + 1, MAX_GENERATION)))
    }

    /// Shows `generation` on the lock (before the transaction that writes it commits).
    /// Returns the generation shown before, to restore if that commit fails.
    ///
    /// # Errors
    /// The kernel refused the lock.
    pub fn hold(&self, generation: i64) -> std::io::Result<Option<i64>> {
        let generation = generation.clamp(0, MAX_GENERATION);
        let mut s = self.state();
        let before = s.held;
        if before.is_none_or(|h| h < generation) {
            let mut lock = flock(libc::F_RDLCK, BASE, generation + 1);
            self.fcntl(libc::F_OFD_SETLK, &mut lock)?;
            s.held = Some(generation);
        }
        Ok(before)
    }

    /// Lowers the lock back to `before` (what [`Witness::hold`] returned) after the commit
    /// of a higher generation failed: nothing relies on it.
    pub(crate) fn restore(&self, before: Option<i64>) {
        let mut s = self.state();
        let Some(held) = s.held else { return };
        let keep = before.map_or(0, |b| b + 1);
        if held < keep {
            return;
        }
        let mut unlock = flock(libc::F_UNLCK, BASE + keep, held + 1 - keep);
        if let Err(e) = self.fcntl(libc::F_OFD_SETLK, &mut unlock) {
            tracing::warn!(error = %e, "cannot lower the lease file's generation lock");
            return;
        }
        s.held = before;
    }

    fn fcntl(&self, cmd: libc::c_int, lock: &mut libc::flock) -> std::io::Result<()> {
        // SAFETY: `self.file` is an open descriptor for the life of `self`, and `lock` is a
        // valid, exclusively borrowed `struct flock` that the kernel reads and (for
        // F_OFD_GETLK) writes; no other memory is touched.
        let r = unsafe { libc::fcntl(self.file.as_raw_fd(), cmd, lock as *mut libc::flock) };
        if r == -1 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}

/// A `struct flock` for OFD locks (`l_pid` must be zero).
fn flock(kind: libc::c_int, start: i64, len: i64) -> libc::flock {
    // SAFETY: `struct flock` is plain integers: all zeros is a valid value.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = kind as libc::c_short;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    l.l_start = start;
    l.l_len = len;
    l.l_pid = 0;
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(path: &std::path::Path) -> File {
        File::open(path).unwrap()
    }

    /// A lock is seen by another open file description (as another process's is), not by
    /// its own; it rises with what is held, and falls back when a commit failed.
    #[test]
    fn a_held_generation_is_seen_from_other_descriptions_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let mine = Witness::new((0, 1), open(&path));
        let other = Witness::new((0, 2), open(&path));
        assert_eq!(other.above(0).unwrap(), None);
        assert_eq!(mine.hold(1_000).unwrap(), None);
        assert_eq!(mine.hold(2_000).unwrap(), Some(1_000));
        assert_eq!(mine.above(0).unwrap(), None, "its own lock");
        assert_eq!(other.above(1_999).unwrap(), Some(2_000));
        assert_eq!(other.above(2_000).unwrap(), None);
        assert_eq!(
            mine.hold(1_500).unwrap(),
            Some(2_000),
            "never lowered by hold"
        );
        assert_eq!(other.above(1_999).unwrap(), Some(2_000));
        mine.restore(Some(1_000));
        assert_eq!(other.above(1_000).unwrap(), None);
        assert_eq!(other.above(999).unwrap(), Some(1_000));
        // The highest of several.
        let third = Witness::new((0, 3), open(&path));
        third.hold(5_000).unwrap();
        assert_eq!(other.above(10).unwrap(), Some(5_000));
        drop(third);
        assert_eq!(
            other.above(10).unwrap(),
            Some(1_000),
            "gone with its description"
        );
    }
}
