//! `tenure lease run` owns every process its command starts: a background child, a child
//! that leaves the process group and session (`setsid`, a daemon's double fork), on a
//! normal exit, on a loss and on a preemption. The lease is released only once none of
//! them is left, so the next holder's command never runs beside them.

use tenure_test_kit::cli;

use std::path::Path;
use std::time::Duration;

use cli::*;
use rustix::process::{Pid, Signal, kill_process};
use tenure::{FenceCheck, FencingToken};

const LIMIT: Duration = Duration::from_secs(30);

/// Whether process `pid` runs (exists and is not a zombie).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat[stat.rfind(')')? + 1..].split_whitespace().next()?;
            Some(state != "Z" && state != "X")
        })
        .unwrap_or(false)
}

/// Kills process `pid` when dropped, if it still runs: a test that fails leaves nothing
/// running behind.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if running(self.0)
            && let Some(pid) = Pid::from_raw(self.0)
        {
            let _ = kill_process(pid, Signal::KILL);
        }
    }
}

/// Background children keep no pipe of `tenure`'s open (the test reads its output to the
/// end), so that `lease run` is seen to exit when it does.
const DETACHED: &str = "</dev/null >/dev/null 2>&1";

/// The first number in the file at `path` (the command writes it).
fn pid_in(path: &Path) -> i32 {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {}: {text:?}", path.display()))
}

fn run_args<'a>(owner: &'a str, extra: &[&'a str], script: &'a str) -> Vec<&'a str> {
    let mut args = vec!["lease", "run", "job", "--owner", owner, "--grace", "200ms"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    args
}

fn run_as(sb: &Sandbox, owner: &str, extra: &[&str], script: &str) -> std::process::Output {
    sb.run(&run_args(owner, extra, script))
}

/// `owner`'s `lease run` of `script`, left running.
fn spawn_as(sb: &Sandbox, owner: &str, script: &str) -> Running {
    sb.spawn(&run_args(owner, &[], script))
}

/// The lines of the write log, each `<token> <who>`: the fence admits every one in order.
fn assert_fenced(log: &Path, expected: &[&str]) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let fence = FenceCheck::new();
    let mut who = Vec::new();
    for line in text.lines() {
        let (token, name) = line.split_once(' ').expect("<token> <who>");
        let token = FencingToken::new(token.parse().expect("a token"));
        if let Err(stale) = fence.admit("log", token) {
            panic!("a stale write ({stale}) in {text:?}");
        }
        who.push(name);
    }
    assert_eq!(who, expected, "{text:?}");
}

/// `owner`'s command (run with `extra` flags) appends its line to `log`, after every line
/// of `before`'s command: `before`'s processes were all gone when `owner` was granted.
fn writes_last(sb: &Sandbox, log: &Path, owner: &str, extra: &[&str], before: &str) {
    let script = format!("echo \"$TENURE_LEASE_TOKEN {owner}\" >> {}", log.display());
    let out = run_as(sb, owner, extra, &script);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = std::fs::read_to_string(log).expect("the write log");
    let earlier = text
        .lines()
        .filter(|l| l.split_once(' ').is_some_and(|(_, who)| who == before))
        .count();
    let expected: Vec<&str> = std::iter::repeat_n(before, earlier)
        .chain([owner])
        .collect();
    assert_fenced(log, &expected);
}

/// `lease run --owner a job -- sh -c "(sleep 2; echo a >> log) & exit 0"`: a's background
/// child is ended before a's release, so it never writes beside b's command.
#[test]
fn a_background_child_is_ended_before_the_release() {
    let sb = Sandbox::new();
    let (log, bg) = (sb.path("log"), sb.path("bg"));
    let (log_s, bg_s) = (log.display(), bg.display());
    let a = run_as(
        &sb,
        "a",
        &[],
        &format!(
            "(sleep 2; echo \"$TENURE_LEASE_TOKEN a\" >> {log_s}) {DETACHED} & echo $! > {bg_s}; exit 0"
        ),
    );
    assert_eq!(a.status.code(), Some(0), "{}", stderr(&a));
    let child = pid_in(&bg);
    let _cleanup = KillOnDrop(child);
    assert!(
        !running(child),
        "a's background child {child} runs on after a released the lease"
    );
    assert!(
        stderr(&a).contains("ending them before releasing job"),
        "{}",
        stderr(&a)
    );
    writes_last(&sb, &log, "b", &[], "a");
}

/// A child that leaves the command's process group and session (`setsid`) and is orphaned
/// at once (a daemon's double fork) is ended before the release too.
#[test]
fn a_child_that_calls_setsid_is_ended_before_the_release() {
    let sb = Sandbox::new();
    let (log, escaped) = (sb.path("log"), sb.path("escaped"));
    let (log_s, esc_s) = (log.display(), escaped.display());
    // The escaped child writes its pid, process group and session, then a line every 50 ms.
    let a = run_as(
        &sb,
        "a",
        &[],
        &format!(
            "(setsid sh -c 'echo $$ $(cut -d\" \" -f5,6 /proc/$$/stat) > {esc_s}.tmp; mv {esc_s}.tmp {esc_s}; \
             while :; do echo \"$TENURE_LEASE_TOKEN a\" >> {log_s}; sleep 0.05; done' {DETACHED} &); \
             while [ ! -s {esc_s} ]; do sleep 0.01; done; exit 0"
        ),
    );
    assert_eq!(a.status.code(), Some(0), "{}", stderr(&a));
    let ids: Vec<i32> = std::fs::read_to_string(&escaped)
        .expect("the escaped child's ids")
        .split_whitespace()
        .map(|n| n.parse().expect("an id"))
        .collect();
    let [pid, group, session] = ids[..] else {
        panic!("pid, group, session: {ids:?}")
    };
    let _cleanup = KillOnDrop(pid);
    assert_eq!(
        (group, session),
        (pid, pid),
        "the child leads a session of its own"
    );
    assert!(
        !running(pid),
        "a's child {pid} in its own session runs on after a released the lease"
    );
    writes_last(&sb, &log, "b", &[], "a");
}

/// Preempted by a higher priority, the holder ends its command's child that left the
/// session before it releases: the higher-priority command's write is the last.
#[test]
fn a_preempted_holder_ends_a_child_that_left_its_session() {
    let sb = Sandbox::new();
    let (log, escaped) = (sb.path("log"), sb.path("escaped"));
    let (log_s, esc_s) = (log.display(), escaped.display());
    let low_script = format!(
        "(setsid sh -c 'echo $$ > {esc_s}.tmp; mv {esc_s}.tmp {esc_s}; \
         while :; do echo \"$TENURE_LEASE_TOKEN low\" >> {log_s}; sleep 0.05; done' {DETACHED} &); \
         while [ ! -s {esc_s} ]; do sleep 0.01; done; echo working; while :; do sleep 1; done"
    );
    let mut low = spawn_as(&sb, "low", &low_script);
    low.wait_line("working", LIMIT);
    let escaped_pid = pid_in(&escaped);
    let _cleanup = KillOnDrop(escaped_pid);
    writes_last(&sb, &log, "high", &["--priority", "2"], "low");
    assert_eq!(low.wait_exit(LIMIT), Some(3), "{}", low.stderr());
    assert!(
        !running(escaped_pid),
        "low's child {escaped_pid} in its own session outlived the preemption"
    );
    let text = std::fs::read_to_string(&log).expect("the write log");
    assert!(text.contains(" low\n"), "low's child wrote: {text:?}");
}

/// `--let-children-outlive-lease` keeps the old behaviour: the release follows the first
/// process's exit, and its background child runs on.
#[test]
fn children_may_outlive_the_lease_when_asked() {
    let sb = Sandbox::new();
    let bg = sb.path("bg");
    let a = run_as(
        &sb,
        "a",
        &["--let-children-outlive-lease"],
        &format!("sleep 30 {DETACHED} & echo $! > {}; exit 0", bg.display()),
    );
    assert_eq!(a.status.code(), Some(0), "{}", stderr(&a));
    let child = pid_in(&bg);
    let _cleanup = KillOnDrop(child);
    assert!(
        running(child),
        "the background child was ended although asked not to"
    );
    assert!(stderr(&a).contains("running unguarded"), "{}", stderr(&a));
    let shown = stdout(&sb.run(&["lease", "show", "job"]));
    assert!(!shown.contains("owner=a"), "released: {shown}");
}

/// A process the command orphans and that exits is reaped by `tenure` (its subreaper)
/// while the command runs on: a long run collects no zombies.
#[test]
fn an_orphan_that_exits_is_reaped_while_the_command_runs() {
    let sb = Sandbox::new();
    let orphan = sb.path("orphan");
    let orphan_s = orphan.display();
    // The orphan writes its pid and exits; its parent (the subshell) is gone before.
    let script = format!(
        "(sh -c 'echo $$ > {orphan_s}.tmp; mv {orphan_s}.tmp {orphan_s}' {DETACHED} &); \
         while [ ! -s {orphan_s} ]; do sleep 0.01; done; echo started; while :; do sleep 1; done"
    );
    let mut run = spawn_as(&sb, "a", &script);
    run.wait_line("started", LIMIT);
    let pid = pid_in(&orphan);
    let _cleanup = KillOnDrop(pid);
    // The orphan has exited (or is about to); only a reap removes it from /proc.
    let started = std::time::Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            started.elapsed() < LIMIT,
            "the orphan {pid} was never reaped: {:?}",
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    run.signal(Signal::TERM);
    assert_eq!(run.wait_exit(LIMIT), Some(143), "{}", run.stderr());
}

/// A holder paused past its ttl (SIGSTOP to `tenure` alone, as a stuck host would) finds
/// its lease lost when it resumes: it ends its command's child that left the session, not
/// only the command's process group, and exits 3.
#[test]
fn a_lost_lease_ends_a_child_that_left_its_session() {
    let sb = Sandbox::new();
    let escaped = sb.path("escaped");
    let esc_s = escaped.display();
    let script = format!(
        "(setsid sh -c 'echo $$ > {esc_s}.tmp; mv {esc_s}.tmp {esc_s}; \
         while :; do sleep 0.05; done' {DETACHED} &); \
         while [ ! -s {esc_s} ]; do sleep 0.01; done; echo working; while :; do sleep 1; done"
    );
    let mut a = spawn_as(&sb, "a", &script);
    a.wait_line("working", LIMIT);
    let escaped_pid = pid_in(&escaped);
    let _cleanup = KillOnDrop(escaped_pid);
    a.signal(Signal::STOP);
    // Past the sandbox's ttl: the grant has lapsed when `tenure` wakes.
    std::thread::sleep(TTL + Duration::from_secs(1));
    a.signal(Signal::CONT);
    assert_eq!(a.wait_exit(LIMIT), Some(3), "{}", a.stderr());
    assert!(a.stderr().contains("lost job"), "{}", a.stderr());
    assert!(
        !running(escaped_pid),
        "a's child {escaped_pid} in its own session outlived the loss"
    );
}
