//! Bad input gives exit 2 and one clear error naming the key, path or lease.

use tenure_test_kit::cli::*;

fn fails_naming(sb: &Sandbox, config: &str, args: &[&str], expected: &[&str]) {
    let path = sb.path("bad.toml");
    std::fs::write(&path, config).expect("write");
    let out = std::process::Command::new(&*TENURE)
        .arg("--config")
        .arg(&path)
        .args(args)
        .output()
        .expect("run");
    let err = stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(2),
        "exit code for {config:?}: {err}"
    );
    assert!(err.starts_with("tenure: error: "), "{err}");
    assert_eq!(
        err.matches("tenure: error: ").count(),
        1,
        "one error: {err}"
    );
    for e in expected {
        assert!(err.contains(e), "{err:?} should name {e:?}");
    }
}

#[test]
fn config_errors_name_the_key() {
    let sb = Sandbox::new();
    let show = ["lease", "show", "x"];
    fails_naming(
        &sb,
        "[lease.a]\nstore = \"consul\"\n",
        &show,
        &[
            "lease.a.store",
            "unknown store kind `consul`",
            "sqlite",
            "etcd",
            "zookeeper",
        ],
    );
    fails_naming(
        &sb,
        "[lease\nstore=",
        &show,
        &["malformed TOML", "bad.toml"],
    );
    fails_naming(
        &sb,
        "[lease.sqlite]\nheartbeat-timeout = \"3 parsecs\"\n",
        &show,
        &["lease.sqlite.heartbeat-timeout", "3 parsecs"],
    );
    fails_naming(
        &sb,
        "[lease.sqlite]\nheartbeat-timeout = \"10s\"\nheartbeat-interval = \"5s\"\n",
        &show,
        &["lease.sqlite.heartbeat-interval", "heartbeat-timeout/2"],
    );
    fails_naming(
        &sb,
        "[lease.sqlite]\npathh = \"/tmp/x\"\n",
        &show,
        &["lease.sqlite.pathh", "unknown key"],
    );
    fails_naming(
        &sb,
        "[tenure]\ndefault-lease-section = \"nope\"\n",
        &show,
        &["no lease section `nope`"],
    );
}

#[test]
fn empty_lease_name_is_refused() {
    let sb = Sandbox::new();
    let out = sb.run(&["lease", "acquire", ""]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("invalid lease name ``: must not be empty"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn missing_config_file_is_named() {
    let out = std::process::Command::new(&*TENURE)
        .args(["--config", "/nonexistent/tenure.toml", "lease", "list"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("/nonexistent/tenure.toml"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn sqlite_path_in_a_missing_directory_is_named() {
    let sb = Sandbox::new();
    fails_naming(
        &sb,
        "[lease.sqlite]\npath = \"/nonexistent/dir/leases.sqlite\"\n",
        &["lease", "list"],
        &["/nonexistent/dir/leases.sqlite", "/nonexistent/dir"],
    );
}

#[test]
fn sqlite_path_in_a_read_only_directory_is_named() {
    use std::os::unix::fs::PermissionsExt;
    let sb = Sandbox::new();
    let ro = sb.path("ro");
    std::fs::create_dir(&ro).expect("mkdir");
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).expect("chmod");
    std::fs::set_permissions(sb.dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let config = sb.path("ro.toml");
    std::fs::write(
        &config,
        format!(
            "[lease.sqlite]\npath = \"{}/leases.sqlite\"\n",
            ro.display()
        ),
    )
    .expect("write");
    // Root may write anywhere: check as an unprivileged user, with a copy of the binary
    // it can execute.
    let bin = sb.path("tenure");
    std::fs::copy(&*TENURE, &bin).expect("copy binary");
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let mut cmd = if tenure_test_kit::signal::is_root() {
        let mut c = std::process::Command::new("runuser");
        c.args(["-u", "nobody", "--"]).arg(&bin);
        c
    } else {
        std::process::Command::new(&bin)
    };
    let out = cmd
        .arg("--config")
        .arg(&config)
        .args(["lease", "list"])
        .output()
        .expect("run (runuser is in util-linux)");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("{}/leases.sqlite", ro.display())) && err.contains("not writable"),
        "{err}"
    );
    assert!(!ro.join("leases.sqlite").exists(), "nothing created");
}

#[test]
fn grace_longer_than_the_lease_allows_is_refused() {
    let sb = Sandbox::new();
    let out = sb.run(&["lease", "run", "job", "--grace", "5s", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("--grace 5s") && err.contains("`lease.sqlite.heartbeat-timeout`"),
        "{err}"
    );
    assert_eq!(
        sb.run(&["lease", "show", "job"]).status.code(),
        Some(1),
        "nothing acquired"
    );
}

/// Durations near the largest ones overflowed instant arithmetic (a panic in the lease
/// actor); every duration flag is bounded at parse, with the flag named.
#[test]
fn durations_beyond_a_year_are_refused_naming_the_flag() {
    let sb = Sandbox::new();
    let huge = "584542046090years";
    for (flag, args) in [
        (
            "--waiting-timeout",
            vec![
                "lease",
                "acquire",
                "j",
                "--hold",
                "--priority",
                "3",
                "--waiting-timeout",
                huge,
            ],
        ),
        (
            "--cleanup-timeout",
            vec!["lease", "acquire", "j", "--cleanup-timeout", huge],
        ),
        (
            "--grace",
            vec!["lease", "run", "j", "--grace", huge, "--", "true"],
        ),
    ] {
        let out = sb.run(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(
            err.contains(flag) && err.contains(huge) && err.contains("365 days"),
            "{flag}: {err}"
        );
    }
}

/// Without a `path`, the SQLite file is in the persistent state directory, created when
/// missing; a directory that cannot be created is named.
#[test]
fn the_default_sqlite_file_is_in_the_state_directory() {
    let sb = Sandbox::new();
    let state = sb.path("state");
    let run = |state: &std::path::Path| {
        std::process::Command::new(&*TENURE)
            .args(["lease", "acquire", "j", "--owner", "o"])
            .env_remove("TENURE_CONFIG")
            .env_remove("TENURE_LEASE__SQLITE__PATH")
            .env("XDG_STATE_HOME", state)
            .output()
            .expect("run")
    };
    let out = run(&state);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(state.join("tenure/leases.sqlite").is_file());
    let blocked = sb.path("a-file");
    std::fs::write(&blocked, "").expect("write");
    let out = run(&blocked.join("state"));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("{}/state/tenure", blocked.display())),
        "{err}"
    );
}
