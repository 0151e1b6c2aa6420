//! The SQLite file's state lost under a running `tenure lease run`: its `-wal` and `-shm`
//! deleted, or an old copy written over it in place. A second `lease run`, started after
//! the loss, must never run its command while the first one's still runs, and `tenure
//! check` finds the two holds apart.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::process::Signal;
use tenure_test_kit::cli::{self, *};

const LIMIT: Duration = Duration::from_secs(30);

/// `lease run NAME --owner OWNER` of a command that appends to `history` until stopped,
/// recording its lease events in `checked`.
fn run_args(owner: &str, history: &Path, checked: &Path) -> Vec<String> {
    lease_run_args(
        "nightly",
        owner,
        Some(checked),
        &guarded_writer(history, None),
    )
}

fn spawn_run(sb: &Sandbox, owner: &str, history: &Path, checked: &Path) -> Running {
    let args = run_args(owner, history, checked);
    sb.spawn(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Waits (bounded) until `pred` holds for the history.
fn until(history: &Path, what: &str, pred: impl Fn(&[Entry]) -> bool) {
    let end = Instant::now() + LIMIT;
    while !pred(&read_history(history)) {
        assert!(Instant::now() < end, "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `a` until its command writes, makes the file lose its state with `lose`, starts
/// `b`, and waits until `b`'s command wrote; then checks that the commands never overlapped.
fn two_runs_across(lose: impl FnOnce(&Sandbox)) {
    let sb = Sandbox::new();
    let history = sb.path("history");
    let checked = sb.path("history.jsonl");
    // The file exists, with nothing held, before the first run.
    assert_eq!(sb.run(&["lease", "show", "nightly"]).status.code(), Some(1));
    std::fs::copy(sb.path("leases.sqlite"), sb.path("backup.sqlite")).expect("back up");

    let mut a = spawn_run(&sb, "a", &history, &checked);
    until(&history, "a's command writes", |h| h.len() >= 5);
    let ta = read_history(&history)[0].token;
    lose(&sb);
    let mut b = spawn_run(&sb, "b", &history, &checked);
    until(&history, "b's command writes", |h| {
        h.iter().filter(|e| e.token > ta).count() >= 5
    });
    let entries = read_history(&history);
    let first_b = entries.iter().position(|e| e.token != ta).expect("b wrote");
    assert!(
        entries[first_b..].iter().all(|e| e.token > ta),
        "a's command wrote after b's started: {entries:?}"
    );
    assert_eq!(
        a.wait_exit(LIMIT),
        Some(3),
        "a lost the lease: {}",
        a.stderr()
    );
    b.signal(Signal::TERM);
    b.wait_exit(LIMIT);
    cli::assert_checked(&checked);
}

/// The reproduction: `rm leases.sqlite-wal leases.sqlite-shm` next to the database while
/// `a` holds the lease, then `b` runs.
#[test]
fn a_deleted_log_never_lets_two_runs_overlap() {
    two_runs_across(|sb| {
        for suffix in ["-wal", "-shm"] {
            std::fs::remove_file(sb.path(&format!("leases.sqlite{suffix}")))
                .expect("delete the log");
        }
    });
}

/// A backup taken before `a` ran is written over the database in place (same inode), after
/// the log was checkpointed into it, while `a` holds the lease; then `b` runs.
#[test]
fn a_file_restored_in_place_never_lets_two_runs_overlap() {
    two_runs_across(|sb| {
        let path = sb.path("leases.sqlite");
        let conn = rusqlite::Connection::open(&path).expect("open");
        conn.busy_timeout(Duration::from_secs(5))
            .expect("busy timeout");
        let busy: i64 = conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
            .expect("checkpoint");
        assert_eq!(busy, 0, "the log checkpointed into the file");
        drop(conn);
        let inode = std::fs::metadata(&path).expect("the file").ino();
        let backup = std::fs::read(sb.path("backup.sqlite")).expect("the backup");
        std::fs::write(&path, backup).expect("restore in place");
        assert_eq!(std::fs::metadata(&path).expect("the file").ino(), inode);
    });
}
