//! `tenure lease elect` and `tenure lease observe` across processes on one SQLite file.

use std::time::Duration;

use rustix::process::Signal;
use tenure_test_kit::cli::*;

const LIMIT: Duration = Duration::from_secs(30);

#[test]
fn a_killed_leader_is_replaced_with_a_higher_token_and_observers_see_each_leader() {
    let sb = Sandbox::new();
    let mut observer = sb.spawn(&["lease", "observe", "ctl"]);
    observer.wait_line("leader of ctl: none", LIMIT);
    let mut a = sb.spawn(&[
        "lease", "elect", "ctl", "--owner", "a", "--value", "http://a",
    ]);
    let first = token_of(&a.wait_line("elected ctl as a", LIMIT));
    let seen = observer.wait_line("owner=a", LIMIT);
    assert!(seen.contains("value=\"http://a\""), "{seen}");
    assert_eq!(token_of(&seen), first);

    let mut b = sb.spawn(&[
        "lease", "elect", "ctl", "--owner", "b", "--value", "http://b",
    ]);
    b.wait_line("campaigning for ctl as b", LIMIT);
    let shown = sb.run(&["lease", "show", "ctl"]);
    assert!(stdout(&shown).contains("owner=a"), "{}", stdout(&shown));

    a.signal(Signal::KILL);
    let second = token_of(&b.wait_line("elected ctl as b", LIMIT));
    assert!(second > first, "{second} after {first}");
    let seen = observer.wait_line("owner=b", LIMIT);
    assert!(seen.contains("value=\"http://b\""), "{seen}");
    assert_eq!(token_of(&seen), second);

    b.signal(Signal::INT);
    b.wait_line("resigned ctl", LIMIT);
    assert_eq!(b.wait_exit(LIMIT), Some(0));
    observer.wait_line("leader of ctl: none", LIMIT);
    observer.signal(Signal::INT);
    assert_eq!(observer.wait_exit(LIMIT), Some(0));
}

#[test]
fn observe_stops_after_count_leaders() {
    let sb = Sandbox::new();
    let out = sb.run(&["lease", "observe", "nobody", "--count", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "leader of nobody: none");
}
