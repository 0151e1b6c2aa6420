//! Signals to server processes the kit started (pause, resume, stop).

use rustix::process::{Pid, Signal, kill_process};

/// Sends `signal` to process `pid`; a process that is gone already is ignored (the servers'
/// children come and go).
pub fn send(pid: u32, signal: Signal) {
    if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let _ = kill_process(pid, signal);
    }
}

/// `true` when this process runs as root (servers then run as an unprivileged user).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}
