//! Priority leases across `tenure` processes on one SQLite file: a higher-priority
//! `lease acquire --hold` asks a holding process to give the lease up; the holder prints
//! the request, releases, and the requester holds it with a higher token.

mod common;

use std::time::Duration;

use common::*;

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
    high.signal(libc::SIGINT);
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
