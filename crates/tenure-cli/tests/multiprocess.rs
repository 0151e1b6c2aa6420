//! Several `tenure` processes on one SQLite file: the conformance properties across OS
//! processes, and the faults of the foundation's "done when" (SIGKILL, SIGSTOP past the ttl).

use tenure_test_kit::cli;

use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process_group};

use cli::*;
use tenure::{FenceCheck, FencingToken};

const LIMIT: Duration = Duration::from_secs(30);

#[test]
fn exactly_one_process_wins_every_round() {
    let sb = Sandbox::new();
    let mut last = 0;
    for round in 0..4 {
        let children: Vec<_> = (0..5)
            .map(|i| {
                sb.command(&["lease", "acquire", "race", "--owner", &format!("p{i}")])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("spawn")
            })
            .collect();
        let outputs: Vec<_> = children
            .into_iter()
            .map(|c| c.wait_with_output().expect("wait"))
            .collect();
        let winners: Vec<usize> = (0..5)
            .filter(|i| outputs[*i].status.code() == Some(0))
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {outputs:?}");
        let w = winners[0];
        for (i, o) in outputs.iter().enumerate() {
            if i != w {
                assert_eq!(
                    o.status.code(),
                    Some(1),
                    "round {round} p{i}: {}",
                    stderr(o)
                );
                assert!(
                    stdout(o).contains(&format!("held by owner=p{w}")),
                    "{}",
                    stdout(o)
                );
            }
        }
        let token = token_of(&stdout(&outputs[w]));
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
        let released = sb.run(&["lease", "release", "race", "--owner", &format!("p{w}")]);
        assert_eq!(released.status.code(), Some(0), "{}", stdout(&released));
    }
}

#[test]
fn no_process_is_granted_before_the_holders_ttl() {
    let sb = Sandbox::new();
    let sent = Instant::now();
    let first = sb.run(&["lease", "acquire", "ttl", "--owner", "a"]);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let t1 = token_of(&stdout(&first));
    let granted_at = loop {
        let o = sb.run(&["lease", "acquire", "ttl", "--owner", "b"]);
        match o.status.code() {
            Some(0) => {
                assert!(token_of(&stdout(&o)) > t1);
                break Instant::now();
            }
            Some(1) => assert!(stdout(&o).contains("owner=a")),
            // Unknown (the store was slow): maybe granted, never counted as granted.
            Some(2) => assert!(stderr(&o).contains("outcome is unknown"), "{}", stderr(&o)),
            other => panic!("unexpected exit {other:?}: {}", stderr(&o)),
        }
        assert!(sent.elapsed() < LIMIT, "never expired");
    };
    assert!(
        granted_at - sent >= TTL,
        "granted {:?} after a",
        granted_at - sent
    );
}

#[test]
fn sigkilled_holder_is_taken_over_with_a_higher_token() {
    let sb = Sandbox::new();
    let mut h1 = sb.spawn(&["lease", "acquire", "--hold", "shell", "--owner", "h1"]);
    let t1 = token_of(&h1.wait_line("holding shell as h1", LIMIT));
    let mut h2 = sb.spawn(&["lease", "acquire", "--hold", "shell", "--owner", "h2"]);
    h2.wait_line("waiting for shell: held by h1", LIMIT);
    let shown = sb.run(&["lease", "show", "shell"]);
    assert!(
        stdout(&shown).contains("owner=h1"),
        "one holder: {}",
        stdout(&shown)
    );
    h1.signal(Signal::KILL);
    let t2 = token_of(&h2.wait_line("holding shell as h2", LIMIT));
    assert!(t2 > t1);
    h2.signal(Signal::INT);
    h2.wait_line("released shell", LIMIT);
    assert_eq!(h2.wait_exit(LIMIT), Some(0));
    assert_eq!(
        sb.run(&["lease", "show", "shell"]).status.code(),
        Some(1),
        "free after release"
    );
}

/// Checks a history of guarded writes: lines of different tokens never interleave (the
/// commands never ran at overlapping times) and tokens only grow.
fn assert_exclusive(history: &[Entry]) {
    for w in history.windows(2) {
        assert!(
            w[1].token >= w[0].token,
            "token {} wrote after token {}: overlapping holders\n{history:?}",
            w[1].token,
            w[0].token
        );
    }
}

#[test]
fn guarded_commands_never_overlap_across_sigkills() {
    let sb = Sandbox::new();
    let history = sb.path("history");
    let writer = guarded_writer(&history, Some(25));
    let spawn = |i: usize| {
        let args = lease_run_args("job", &format!("r{i}"), None, &writer);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        sb.spawn(&args)
    };
    let mut runners: Vec<Running> = (0..3).map(spawn).collect();
    let mut kills = 0;
    let mut next = 3;
    let started = Instant::now();
    while kills < 4 || read_history(&history).len() < 200 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "too slow: {} lines",
            read_history(&history).len()
        );
        std::thread::sleep(Duration::from_millis(400));
        // SIGKILL whoever holds the lease now, mid-command.
        let shown = stdout(&sb.run(&["lease", "show", "job"]));
        if let Some(owner) = shown
            .split_whitespace()
            .find_map(|w| w.strip_prefix("owner=r"))
        {
            let i: usize = owner.parse().expect("runner index");
            if kills < 4
                && let Some(r) = runners.iter_mut().find(|r| runner_index(r) == Some(i))
            {
                r.signal(Signal::KILL);
                kills += 1;
            }
        }
        // Replace runners that finished or were killed.
        for slot in runners.iter_mut() {
            if slot.child.try_wait().expect("try_wait").is_some() {
                *slot = spawn(next);
                next += 1;
            }
        }
    }
    drop(runners);
    let entries = read_history(&history);
    assert_exclusive(&entries);
    let tokens: std::collections::BTreeSet<u64> = entries.iter().map(|e| e.token).collect();
    assert!(tokens.len() >= 5, "several holders took turns: {tokens:?}");
    let fence = FenceCheck::new();
    assert!(
        entries
            .iter()
            .all(|e| fence.admit("history", FencingToken::new(e.token)).is_ok())
    );
}

/// Two `tenure lease run` with the same `--owner` (as `--owner "$(hostname)"` on two hosts),
/// the second started while the first runs its command: the second waits until the first
/// released, so their commands never overlap, both complete, and `tenure check` finds the
/// two processes' holds (recorded with `--history`) apart.
#[test]
fn two_runs_with_the_same_owner_take_turns() {
    let sb = Sandbox::new();
    let history = sb.path("history");
    let checked = sb.path("history.jsonl");
    let writer = guarded_writer(&history, Some(25));
    let args = lease_run_args("nightly", "web-1", Some(&checked), &writer);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut first = sb.spawn(&args);
    let started = Instant::now();
    while read_history(&history).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the first never ran"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut second = sb.spawn(&args);
    assert_eq!(
        first.wait_exit(Duration::from_secs(30)),
        Some(0),
        "{}",
        first.stderr()
    );
    assert_eq!(
        second.wait_exit(Duration::from_secs(30)),
        Some(0),
        "{}",
        second.stderr()
    );
    let entries = read_history(&history);
    assert_exclusive(&entries);
    let pids: std::collections::BTreeSet<u32> = entries.iter().map(|e| e.pid).collect();
    assert_eq!(pids.len(), 2, "both commands ran: {entries:?}");
    assert_eq!(entries.len(), 2 * 2 * 25, "both ran to the end");
    cli::assert_checked(&checked);
}

fn runner_index(r: &Running) -> Option<usize> {
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", r.pid())).ok()?;
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let pos = args.iter().position(|a| a == "--owner")?;
    args.get(pos + 1)?.strip_prefix('r')?.parse().ok()
}

#[test]
fn sigstopped_holder_stops_its_command_on_resume_and_late_writes_are_fenced() {
    use std::os::unix::process::CommandExt;
    let sb = Sandbox::new();
    let history = sb.path("history");
    let writer = guarded_writer(&history, None);
    let run_args = |owner: &str| lease_run_args("job", owner, None, &writer);
    // r1 in a process group of its own (its command makes another).
    let args1 = run_args("r1");
    let mut cmd1 = sb.command(&args1.iter().map(String::as_str).collect::<Vec<_>>());
    cmd1.process_group(0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut r1 = Running::start(cmd1);
    let until = |pred: &dyn Fn(&[Entry]) -> bool| {
        let end = Instant::now() + LIMIT;
        while !pred(&read_history(&history)) {
            assert!(
                Instant::now() < end,
                "history never satisfied the condition"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    until(&|h| h.len() >= 5);
    let t1 = read_history(&history)[0].token;
    // The command leads a process group of its own: pause both groups, as a stopped
    // machine or VM would.
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", r1.pid()))
        .expect("children of r1");
    let command: i32 = children
        .split_whitespace()
        .next()
        .expect("r1 runs its command")
        .parse()
        .expect("pid");
    let groups = [r1.pid(), command];
    for g in groups {
        kill_process_group(Pid::from_raw(g).expect("a pid"), Signal::STOP)
            .expect("stop the process group");
    }
    let args2 = run_args("r2");
    let mut r2 = sb.spawn(&args2.iter().map(String::as_str).collect::<Vec<_>>());
    until(&|h| h.iter().any(|e| e.token > t1));
    let t2 = read_history(&history)
        .iter()
        .map(|e| e.token)
        .max()
        .expect("lines");
    // Let r2 write a while, then resume r1 and its command.
    std::thread::sleep(Duration::from_millis(200));
    for g in groups {
        kill_process_group(Pid::from_raw(g).expect("a pid"), Signal::CONT)
            .expect("resume the process group");
    }
    assert_eq!(r1.wait_exit(LIMIT), Some(3), "r1 reports the lost lease");
    let err = r1.stderr();
    assert!(
        err.contains("lost job") && err.contains(&format!("token {t1}")),
        "{err}"
    );
    std::thread::sleep(Duration::from_millis(200));
    r2.signal(Signal::TERM);
    assert_eq!(r2.wait_exit(LIMIT), Some(143));
    let entries = read_history(&history);
    // r1's command may have written a few lines between its resumption and its SIGTERM:
    // they carry the old token, and the fence check refuses every one of them.
    let fence = FenceCheck::new();
    let mut refused = 0;
    let mut accepted = Vec::new();
    for e in &entries {
        match fence.admit("history", FencingToken::new(e.token)) {
            Ok(()) => accepted.push(e.clone()),
            Err(stale) => {
                assert_eq!((stale.presented.get(), stale.highest.get()), (t1, t2));
                refused += 1;
            }
        }
    }
    assert_exclusive(&accepted);
    assert!(accepted.iter().any(|e| e.token == t2));
    let last_t1 = entries
        .iter()
        .rposition(|e| e.token == t1)
        .expect("t1 wrote");
    let first_t2 = entries
        .iter()
        .position(|e| e.token == t2)
        .expect("t2 wrote");
    assert_eq!(
        refused,
        entries[first_t2..].iter().filter(|e| e.token == t1).count()
    );
    eprintln!(
        "late writes of the paused holder refused by the fence: {refused} (last at line {last_t1}, successor from line {first_t2})"
    );
}
