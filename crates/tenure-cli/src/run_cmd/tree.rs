//! The guarded command's processes: every one of them, wherever it went.
//!
//! The command starts in a process group of its own, and `tenure` is the *subreaper* of its
//! descendants (`PR_SET_CHILD_SUBREAPER`): a process whose parent exits is re-parented to
//! `tenure` instead of init, also after `setsid`, `setpgid` or a daemon's double fork. So
//! every process the command started, and every process those started, stays a descendant
//! of `tenure` for as long as it runs, and `/proc` shows it. [`CommandTree::end`] ends them
//! all (SIGTERM, then SIGKILL after the grace period) and returns only once none is left,
//! so that `lease run` releases only then: the guarantee `flock(1)` gives through the
//! descriptor every child inherits.
//!
//! Signals go through a pidfd opened after the process was seen in `/proc` and checked to
//! be the same process again (same parent), so that a pid reused meanwhile is never hit.
//!
//! Not covered: processes another service starts on the command's behalf (`systemd-run`,
//! `at`, `ssh`, a container runtime's daemon) are not descendants of `tenure`; a process
//! stuck in an uninterruptible sleep outlives SIGKILL until the kernel lets it go (`end`
//! waits for it, and says so). If `tenure` itself is killed with SIGKILL, the command's
//! first process dies with it (its parent-death signal), but the rest of the tree is
//! re-parented to init (or the nearest subreaper above `tenure`) and runs on, unguarded,
//! while the lease lapses after its ttl: run `tenure` under a service manager that ends a
//! service's whole control group when its main process dies (systemd's default
//! `KillMode=control-group`, e.g. `systemd-run --user --scope tenure lease run ...`).

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use rustix::io::Errno;
use rustix::process::{
    Pid, PidfdFlags, Signal, WaitOptions, getpid, getppid, kill_process, kill_process_group,
    pidfd_open, pidfd_send_signal, set_child_subreaper, set_parent_process_death_signal, waitpid,
};
use tenure::FencingToken;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::exit::CliError;

/// How often `end` looks at what is left.
const POLL: Duration = Duration::from_millis(10);

/// The guarded command: its first process (the leader of the command's process group), and
/// every process started under it.
pub(super) struct CommandTree {
    leader: Child,
    /// The command's process group (the leader's pid).
    group: Option<Pid>,
}

impl CommandTree {
    /// Makes `tenure` the subreaper of its descendants, then starts `command` in a process
    /// group of its own, with `TENURE_LEASE_NAME` and `TENURE_LEASE_TOKEN` set.
    pub(super) fn spawn(
        command: &[String],
        name: &str,
        token: FencingToken,
    ) -> Result<CommandTree, CliError> {
        set_child_subreaper(Some(getpid())).map_err(|e| {
            CliError::Command(format!(
                "cannot become the subreaper of {:?}'s processes: {e}",
                command[0]
            ))
        })?;
        let parent = getpid();
        let mut cmd = std::process::Command::new(&command[0]);
        cmd.args(&command[1..])
            .env("TENURE_LEASE_NAME", name)
            .env("TENURE_LEASE_TOKEN", token.to_string())
            .stdin(Stdio::inherit())
            .process_group(0);
        // SAFETY: only system calls (prctl, getppid) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                // If `tenure` dies (SIGKILL included), the command's first process dies with
                // it: nobody would renew the lease or stop the command at the deadline.
                set_parent_process_death_signal(Some(Signal::KILL))?;
                if getppid() != Some(parent) {
                    return Err(std::io::Error::other(
                        "tenure exited before the command started",
                    ));
                }
                Ok(())
            });
        }
        let leader = Command::from(cmd)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| CliError::Command(format!("cannot start {:?}: {e}", command[0])))?;
        let group = leader.id().and_then(|pid| Pid::from_raw(pid as i32));
        Ok(CommandTree { leader, group })
    }

    /// The first process's id, while it has not been reaped.
    pub(super) fn pid(&self) -> Option<u32> {
        self.leader.id()
    }

    /// Waits for the first process to exit. What it started may run on.
    pub(super) async fn leader_exited(&mut self) -> std::io::Result<ExitStatus> {
        self.leader.wait().await
    }

    /// The processes of the command that run now (not the ones that exited), by pid.
    pub(super) fn running(&mut self) -> Vec<i32> {
        self.look().into_iter().map(|p| p.pid).collect()
    }

    /// Reaps the processes of the command that exited after being left to `tenure`
    /// (adopted as their subreaper): nobody else will.
    pub(super) fn reap_exited(&mut self) {
        let _ = self.look();
    }

    /// Ends every process of the command: SIGTERM to its process group and to each of its
    /// processes, up to `grace` for them to exit, then SIGKILL to whatever is left, again
    /// at each look (a process may fork meanwhile). Returns once no process of the command
    /// runs and every one of them was reaped. A process that outlives SIGKILL by
    /// `kill_slack` (an uninterruptible sleep) is reported on stderr, and waited for.
    pub(super) async fn end(&mut self, grace: Duration, kill_slack: Duration) {
        let started = Instant::now();
        let mut termed = false;
        let mut reported = false;
        loop {
            let running = self.look();
            if running.is_empty() {
                break;
            }
            let elapsed = started.elapsed();
            // SIGTERM once; SIGKILL at every look once the grace is over.
            let signal = if elapsed < grace {
                Signal::TERM
            } else {
                Signal::KILL
            };
            if signal == Signal::KILL || !termed {
                termed = true;
                if let Some(group) = self.group {
                    let _ = kill_process_group(group, signal);
                }
                for p in &running {
                    p.signal(signal);
                }
            }
            if !reported && elapsed >= grace + kill_slack {
                reported = true;
                let pids: Vec<i32> = running.iter().map(|p| p.pid).collect();
                eprintln!(
                    "tenure: processes {pids:?} of the command outlive SIGKILL; waiting for them before going on"
                );
            }
            tokio::time::sleep(POLL).await;
        }
        let _ = self.leader.wait().await;
    }

    /// The command's processes that run now; reaps the ones that exited and were left to
    /// `tenure` (its first process through tokio, the adopted ones here).
    fn look(&mut self) -> Vec<Proc> {
        let _ = self.leader.try_wait();
        let me = getpid().as_raw_nonzero().get();
        let leader = self.leader.id().map(|pid| pid as i32);
        let mut running = Vec::new();
        for p in descendants(me) {
            if !p.exited {
                running.push(p);
            } else if p.ppid == me
                && Some(p.pid) != leader
                && let Some(pid) = Pid::from_raw(p.pid)
            {
                let _ = waitpid(Some(pid), WaitOptions::NOHANG);
            }
        }
        running
    }
}

/// One process as `/proc/PID/stat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Proc {
    pid: i32,
    ppid: i32,
    /// A zombie: it exited and waits to be reaped by its parent.
    exited: bool,
}

impl Proc {
    /// Sends `signal` to this process, if it is still the one seen (same parent).
    fn signal(&self, signal: Signal) {
        let Some(pid) = Pid::from_raw(self.pid) else {
            return;
        };
        match pidfd_open(pid, PidfdFlags::empty()) {
            Ok(fd) => {
                if stat(self.pid).is_some_and(|now| now.ppid == self.ppid) {
                    let _ = pidfd_send_signal(&fd, signal);
                }
            }
            // Gone already.
            Err(Errno::SRCH) => {}
            // No pidfds (Linux before 5.3): the pid as seen.
            Err(_) => {
                let _ = kill_process(pid, signal);
            }
        }
    }
}

/// The process `pid` now, if it exists.
fn stat(pid: i32) -> Option<Proc> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(pid, &text)
}

/// Parses `/proc/PID/stat`: `pid (comm) state ppid ...`, where `comm` may hold spaces and
/// parentheses (so the fields start after the last `)`).
fn parse_stat(pid: i32, text: &str) -> Option<Proc> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some(Proc {
        pid,
        ppid,
        exited: matches!(state, "Z" | "X"),
    })
}

/// Every process whose chain of parents leads to `root`, as `/proc` lists them now.
fn descendants(root: i32) -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut children: HashMap<i32, Vec<Proc>> = HashMap::new();
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        // A process that exited between the listing and the read is simply not there.
        if let Some(p) = stat(pid) {
            children.entry(p.ppid).or_default().push(p);
        }
    }
    let mut found = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for p in children.remove(&parent).unwrap_or_default() {
            parents.push(p.pid);
            found.push(p);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_come_after_the_last_parenthesis() {
        let p = parse_stat(42, "42 (a (b) c) S 7 42 42 0 -1").unwrap();
        assert_eq!(
            p,
            Proc {
                pid: 42,
                ppid: 7,
                exited: false
            }
        );
        assert!(parse_stat(43, "43 (sh) Z 1 43").unwrap().exited);
        assert_eq!(parse_stat(44, "44 (sh"), None);
    }

    #[test]
    fn a_child_is_a_descendant() {
        let me = getpid().as_raw_nonzero().get();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("start sleep");
        let found = descendants(me);
        assert!(
            found
                .iter()
                .any(|p| p.pid == child.id() as i32 && p.ppid == me),
            "{found:?}"
        );
        child.kill().expect("kill sleep");
        child.wait().expect("reap sleep");
    }
}
