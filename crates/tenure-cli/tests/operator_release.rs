//! `tenure lease release` by an operator: a grant its holder still renews is not freed
//! under that holder unless `--force`, and `--force` says what the holder may still do.

use std::time::Duration;

use tenure_test_kit::cli::*;

const LIMIT: Duration = Duration::from_secs(30);

/// A held grant (renewed by `lease acquire --hold`) is refused without `--force`: the holder
/// keeps it and no contender gets it; with `--force` it is freed, the output says the
/// holder may act until its next renewal and that fencing tokens protect resources
/// meanwhile, and the holder learns of the loss at its next renewal.
#[test]
fn a_renewed_grant_is_released_only_by_force() {
    let sb = Sandbox::new();
    let mut holder = sb.spawn(&["lease", "acquire", "--hold", "nightly", "--owner", "a"]);
    let token = token_of(&holder.wait_line("holding nightly as a", LIMIT));

    let refused = sb.run(&["lease", "release", "nightly", "--owner", "a"]);
    assert_eq!(refused.status.code(), Some(1), "{}", stdout(&refused));
    let said = stdout(&refused);
    assert!(
        said.contains("not released nightly")
            && said.contains("renewed by its holder")
            && said.contains("--force"),
        "{said}"
    );
    let contender = sb.run(&["lease", "acquire", "nightly", "--owner", "b"]);
    assert_eq!(
        contender.status.code(),
        Some(1),
        "still held by a: {}",
        stdout(&contender)
    );
    assert!(stdout(&contender).contains("held by owner=a"));
    assert!(holder.child.try_wait().expect("try_wait").is_none());

    let forced = sb.run(&["lease", "release", "nightly", "--owner", "a", "--force"]);
    assert_eq!(forced.status.code(), Some(0), "{}", stderr(&forced));
    assert!(
        stdout(&forced).contains(&format!("released nightly (token {token})")),
        "{}",
        stdout(&forced)
    );
    let warned = stderr(&forced);
    assert!(
        warned.contains("until that holder's next renewal")
            && warned.contains("act on it")
            && warned.contains("fencing tokens"),
        "{warned}"
    );
    // The holder's next renewal finds the grant gone.
    assert_eq!(holder.wait_exit(LIMIT), Some(3), "{}", holder.stderr());
    assert!(holder.stderr().contains("lost nightly"));
}

/// A one-shot grant of `lease acquire` is renewed by nobody: releasing it needs no force.
#[test]
fn a_one_shot_grant_is_released_without_force() {
    let sb = Sandbox::new();
    let granted = sb.run(&["lease", "acquire", "once", "--owner", "s"]);
    assert_eq!(granted.status.code(), Some(0), "{}", stderr(&granted));
    let released = sb.run(&["lease", "release", "once", "--owner", "s"]);
    assert_eq!(released.status.code(), Some(0), "{}", stdout(&released));
    assert!(stderr(&released).is_empty(), "{}", stderr(&released));
    assert_eq!(sb.run(&["lease", "show", "once"]).status.code(), Some(1));
}
