//! Priority leases across `tenure` processes on one SQLite file: a higher-priority
//! `lease acquire --hold` asks a holding process to give the lease up; the holder prints
//! the request, releases, and the requester holds it with a higher token.

use std::time::Duration;

use rustix::process::Signal;

use tenure_test_kit::cli::*;

const LIMIT: Duration = Duration::from_secs(30);

#[test]
fn a_higher_priority_process_preempts_a_holding_one() {
    let sb = Sandbox::new();
    let mut low = sb.spawn(&[
        "lease",
        "acquire",
        "--hold",
        "job",
        "--owner",
        "low",
        "--message",
        "nightly batch",
        "--cleanup-timeout",
        "20s",
    ]);
    let t1 = token_of(&low.wait_line("holding job as low", LIMIT));
    let shown = stdout(&sb.run(&["lease", "show", "job"]));
    assert!(
        shown.contains("owner=low") && shown.contains("priority=0"),
        "{shown}"
    );
    assert!(shown.contains("note=\"nightly batch\""), "{shown}");
    // Equal priority: not granted, told who holds it and at which priority.
    let equal = sb.run(&["lease", "acquire", "job", "--owner", "other"]);
    assert_eq!(equal.status.code(), Some(1), "{}", stdout(&equal));
    let mut high = sb.spawn(&[
        "lease",
        "acquire",
        "--hold",
        "job",
        "--owner",
        "high",
        "--priority",
        "5",
        "--message",
        "urgent fix",
    ]);
    let notice = low.wait_line("preemption of job requested by high", LIMIT);
    assert!(
        notice.contains("priority 5") && notice.contains("urgent fix"),
        "{notice}"
    );
    low.wait_line("released job", LIMIT);
    assert_eq!(
        low.wait_exit(LIMIT),
        Some(3),
        "given up for a higher priority"
    );
    let t2 = token_of(&high.wait_line("holding job as high", LIMIT));
    assert!(t2 > t1, "token {t2} after {t1}");
    let listed = stdout(&sb.run(&["lease", "list", "jo"]));
    assert!(
        listed.contains("owner=high") && listed.contains("priority=5"),
        "{listed}"
    );
    // A lower priority than the new holder's: not granted, with its priority.
    let lower = sb.run(&["lease", "acquire", "job", "--owner", "x", "--priority", "4"]);
    assert_eq!(lower.status.code(), Some(1));
    assert!(stdout(&lower).contains("priority=5"), "{}", stdout(&lower));
    high.signal(Signal::INT);
    high.wait_line("released job", LIMIT);
    assert_eq!(high.wait_exit(LIMIT), Some(0));
}

#[test]
fn emergency_needs_no_priority_and_rejects_one() {
    let sb = Sandbox::new();
    let both = sb.run(&["lease", "acquire", "job", "--emergency", "--priority", "3"]);
    assert_eq!(both.status.code(), Some(2), "{}", stderr(&both));
    let held = sb.run(&["lease", "acquire", "job", "--owner", "a", "--priority", "9"]);
    assert_eq!(held.status.code(), Some(0), "{}", stdout(&held));
    let op = sb.run(&["lease", "acquire", "job", "--owner", "op", "--emergency"]);
    assert_eq!(op.status.code(), Some(0), "{}", stdout(&op));
    let shown = stdout(&sb.run(&["lease", "show", "job"]));
    assert!(
        shown.contains("owner=op") && shown.contains(&format!("priority={}", u64::MAX)),
        "{shown}"
    );
}

#[test]
fn a_guarded_command_is_stopped_for_a_higher_priority() {
    let sb = Sandbox::new();
    let log = sb.path("writes.log");
    let log = log.to_str().expect("utf-8 path");
    let low_script = format!(
        "trap 'echo low-stopped >> {log}; echo cleaned up; exit 0' TERM; echo working; \
         while :; do echo low >> {log}; sleep 0.05; done"
    );
    let mut low = sb.spawn(&[
        "lease",
        "run",
        "job",
        "--owner",
        "low",
        "--grace",
        "1s",
        "--",
        "sh",
        "-c",
        &low_script,
    ]);
    low.wait_line("working", LIMIT);
    let high_script = format!("echo high >> {log}; echo high ran with token $TENURE_LEASE_TOKEN");
    let high = sb.run(&[
        "lease",
        "run",
        "job",
        "--owner",
        "high",
        "--priority",
        "2",
        "--grace",
        "1s",
        "--",
        "sh",
        "-c",
        &high_script,
    ]);
    assert_eq!(high.status.code(), Some(0), "{}", stderr(&high));
    assert!(
        stdout(&high).contains("high ran with token"),
        "{}",
        stdout(&high)
    );
    low.wait_line("cleaned up", LIMIT);
    assert_eq!(low.wait_exit(LIMIT), Some(3));
    assert!(
        low.stderr().contains("requested by high (priority 2)"),
        "the holder said why it stopped"
    );
    // The guarded commands never overlapped: low stopped before high wrote.
    let writes = std::fs::read_to_string(log).expect("write log");
    let lines: Vec<&str> = writes.lines().collect();
    assert_eq!(lines.last(), Some(&"high"), "{lines:?}");
    assert_eq!(lines.iter().rev().nth(1), Some(&"low-stopped"), "{lines:?}");
}
