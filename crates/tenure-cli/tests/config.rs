//! The `tenure` command's configuration: reference defaults, then the `--config` or
//! `TENURE_CONFIG` file, then `TENURE_…` variables; unknown keys and the retired sentinel
//! spellings are refused with exit 2, naming the dotted key.

use std::process::{Command, Output};

use tenure_test_kit::cli::*;

/// `tenure lease acquire j` with `config` in a file given by `TENURE_CONFIG` and `env`.
fn acquire(sb: &Sandbox, config: &str, env: &[(&str, &str)]) -> Output {
    let path = sb.path("env.toml");
    std::fs::write(&path, config).expect("write");
    let mut cmd = Command::new(&*TENURE);
    cmd.args(["lease", "acquire", "j", "--owner", "o"])
        .env("TENURE_CONFIG", &path)
        .env_remove("TENURE_LEASE__SQLITE__PATH");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run")
}

#[test]
fn the_file_and_the_environment_override_the_reference() {
    let sb = Sandbox::new();
    let file = sb.path("from-file.sqlite");
    let env = sb.path("from-env.sqlite");
    // TENURE_CONFIG names the file; its section's timing is in humantime.
    let config = format!(
        "[lease.sqlite]\npath = \"{}\"\nheartbeat-timeout = \"1m 30s\"\nheartbeat-interval = \"1500ms\"\n",
        file.display()
    );
    let out = acquire(&sb, &config, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(file.is_file(), "the file's path is used");
    // A variable overrides the file's key.
    let path = env.display().to_string();
    let out = acquire(&sb, &config, &[("TENURE_LEASE__SQLITE__PATH", &path)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(env.is_file(), "the variable's path is used");
    // A variable naming no key is refused like a key in a file.
    let out = acquire(&sb, &config, &[("TENURE_LEASE__SQLITE__PATHH", &path)]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("`lease.sqlite.pathh`"), "{err}");
}

#[test]
fn unknown_keys_and_retired_sentinels_are_refused_naming_the_key() {
    let sb = Sandbox::new();
    for (config, key, says) in [
        ("[tenure]\nsytem = \"x\"\n", "`tenure.sytem`", "unknown key"),
        (
            "[leases.sqlite]\npath = \"/x\"\n",
            "`leases`",
            "unknown table",
        ),
        (
            "[lease]\nheartbeat-timout = \"10s\"\n",
            "`lease.heartbeat-timout`",
            "unknown key",
        ),
        (
            "[lease.sqlite]\nsafety-margin = \"0s\"\n",
            "`lease.sqlite.safety-margin`",
            "leave the key out",
        ),
        (
            "[lease.sqlite]\npath = \"\"\n",
            "`lease.sqlite.path`",
            "leave it out",
        ),
        (
            "[lease.sqlite]\nheartbeat-timeout = \"2 fortnights\"\n",
            "`lease.sqlite.heartbeat-timeout`",
            "2 fortnights",
        ),
    ] {
        let out = acquire(&sb, config, &[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{config}: {err}");
        assert!(err.contains(key) && err.contains(says), "{config}: {err}");
    }
}

/// `TENURE_LOG` sets the log level; logs written to a pipe (not a terminal) carry no ANSI
/// colour codes, so `tenure … 2>&1 | tee log` stays plain text.
#[test]
fn logs_to_a_pipe_are_plain_text() {
    let sb = Sandbox::new();
    let out = sb
        .command(&[
            "lease", "run", "j", "--owner", "o", "--grace", "500ms", "--", "true",
        ])
        .env("TENURE_LOG", "info")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let logs = stderr(&out);
    assert!(logs.contains("lease granted"), "info logs: {logs}");
    assert!(!logs.contains('\u{1b}'), "no escape codes: {logs:?}");
}
