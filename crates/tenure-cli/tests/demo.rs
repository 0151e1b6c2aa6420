//! `tenure demo` end to end: a short run with a small scenario (ending in a rolling restart)
//! reaches a clean verdict (its durable counter's journal checked with the history), reports the rolling restart's figures and writes its history and
//! an HTML report showing every hold; bad flags are refused.

use tenure_test_kit::cli;

use std::process::Command;

use cli::TENURE;
use cli::cluster::ClusterTurn;

const SCENARIO: &str = r#"
[[step]]
at = "3s"
fault = "kill"

[[step]]
at = "6s"
fault = "restart"

[[step]]
at = "8s"
fault = "pause"
for = "3s"

[[step]]
at = "12s"
fault = "isolate"
for = "3s"

[[step]]
at = "18s"
fault = "rolling-restart"
"#;

#[test]
fn a_short_demo_reaches_a_safe_verdict_and_writes_its_report() {
    // The demo runs a cluster of its own: one at a time with the other tests'.
    let _turn = ClusterTurn::take();
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.toml");
    std::fs::write(&scenario, SCENARIO).unwrap();
    let history = dir.path().join("run/history.jsonl");
    let out = Command::new(&*TENURE)
        .args([
            "demo",
            "--duration",
            "19s",
            "--shards",
            "16",
            "--seed",
            "42",
        ])
        .arg("--scenario")
        .arg(&scenario)
        .arg("--history")
        .arg(&history)
        .env_remove("TENURE_CONFIG")
        .output()
        .expect("run tenure demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("seed 42"), "{stdout}");
    assert!(stdout.contains("verdict: SAFE"), "{stdout}");
    let acks: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("operations acknowledged"))
        .and_then(|n| n.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no ack count in:\n{stdout}"));
    assert!(acks > 0, "{stdout}");
    // On the embedded SQLite store the counter is a durable entity, and the verdict
    // includes the journal check: every acknowledged increment's event is in the journal.
    assert!(
        stdout.contains("counter durable entity") && stdout.contains("journal.sqlite"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "operations acknowledged   {acks} ({acks} checked against the journal)"
        )),
        "every acknowledged increment is checked against the journal: {stdout}"
    );
    let journal = stdout
        .lines()
        .find_map(|l| l.strip_prefix("journal check"))
        .unwrap_or_else(|| panic!("no journal check line in:\n{stdout}"))
        .trim();
    let journal_events: u64 = journal
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no event count in: {journal}"));
    assert!(journal_events >= acks, "{journal}");
    assert!(
        journal.contains(&format!("{acks} acks checked")) && journal.ends_with(": passed"),
        "{journal}"
    );
    assert!(stdout.contains("tenure check --journal"), "{stdout}");

    let events = std::fs::read_to_string(&history).expect("the history is kept");
    assert!(
        stdout.contains("asks answered"),
        "the service during each fault is reported: {stdout}"
    );
    // The rolling restart sent every node SIGTERM and started it again, and its figures
    // are in the summary.
    let roll = stdout
        .lines()
        .find_map(|l| l.strip_prefix("rolling restart "))
        .unwrap_or_else(|| panic!("no rolling restart line in:\n{stdout}"))
        .trim();
    assert!(
        roll.starts_with("3 nodes, ") && roll.contains(" s per node restarted (mean; at most "),
        "{roll}"
    );
    let figures: Vec<u64> = roll
        .split([' ', ','])
        .filter_map(|w| w.parse().ok())
        .collect();
    let [nodes, unanswered, requests, moved] = figures[..] else {
        panic!("nodes, unanswered, requests and shards moved in: {roll}");
    };
    assert_eq!(nodes, 3, "{roll}");
    assert!(requests > 0 && unanswered <= requests, "{roll}");
    assert!(roll.ends_with(&format!("{moved} shards moved")), "{roll}");
    let harness = |kind: &str| {
        events
            .lines()
            .filter(|l| l.contains("\"harness\"") && l.contains(&format!("\"event\":\"{kind}\"")))
            .count()
    };
    // Three leaves of the rolling restart and three of the final shutdown; the kill's
    // restart and the rolling restart's three.
    assert_eq!(
        (harness("leaving"), harness("restarted")),
        (6, 4),
        "{stdout}"
    );
    for fault in [
        "\"killed\"",
        "\"restarted\"",
        "\"paused\"",
        "\"resumed\"",
        "\"isolated\"",
        "\"isolation_healed\"",
    ] {
        assert!(events.contains(fault), "no {fault} in the history");
    }
    let report = std::fs::read_to_string(history.with_extension("html")).expect("the report");
    assert!(report.contains("<svg") && report.contains("SAFE"));
    assert!(
        report.contains("journal check") && report.contains(&format!("{journal_events} events of")),
        "the report names the journal check and its event count"
    );
    // One bar per hold of a shard's or a singleton's lease: per distinct grant (a
    // re-grant of the same token to the same owner is the same hold).
    let holds: std::collections::BTreeSet<(String, String, String, u64)> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "lease_granted")
        .filter_map(|e| {
            let lease = e["lease"].as_str()?.to_string();
            (lease.starts_with("tenure-shard-") || lease.starts_with("tenure-singleton-")).then(
                || {
                    (
                        lease,
                        e["node"].as_str().unwrap_or_default().to_string(),
                        e["inc"].as_str().unwrap_or_default().to_string(),
                        e["token"].as_u64().unwrap_or_default(),
                    )
                },
            )
        })
        .collect();
    assert!(!holds.is_empty());
    assert_eq!(
        report.matches("<rect class=\"hold\"").count(),
        holds.len(),
        "one bar per hold"
    );
}

#[test]
fn help_documents_every_flag() {
    let out = Command::new(&*TENURE)
        .args(["demo", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--nodes",
        "--shards",
        "--duration",
        "--ttl",
        "--scenario",
        "--seed",
        "--history",
        "--report",
        "--store",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
    assert!(help.contains("SIGKILL a node"), "{help}");
    assert!(help.contains("rolling-restart"), "{help}");
}

#[test]
fn bad_flags_are_refused_naming_the_flag() {
    let out = Command::new(&*TENURE)
        .args(["demo", "--ttl", "10ms"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ttl"));
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("s.toml");
    std::fs::write(&scenario, "[[step]]\nat = \"1s\"\nfault = \"cut\"\n").unwrap();
    let out = Command::new(&*TENURE)
        .args(["demo", "--scenario"])
        .arg(&scenario)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("s.toml") && stderr.contains("for"),
        "{stderr}"
    );
}

/// Starts a long demo, waits for its first traffic line, sends it SIGINT, and sends a second
/// one when `again` once the demo says it is stopping. Returns its exit code and stdout.
fn interrupt_demo(again: bool) -> (Option<i32>, String) {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    use rustix::process::{Pid, Signal, kill_process};

    let _turn = ClusterTurn::take();
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(&*TENURE)
        .args(["demo", "--duration", "10m", "--shards", "8", "--seed", "7"])
        .arg("--history")
        .arg(dir.path().join("history.jsonl"))
        .env_remove("TENURE_CONFIG")
        .stdout(Stdio::piped())
        .spawn()
        .expect("run tenure demo");
    let pid = Pid::from_raw(child.id() as i32).unwrap();
    let mut out = String::new();
    let mut interrupted = false;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        out.push_str(&line);
        out.push('\n');
        if !interrupted && line.contains(" traffic ") {
            kill_process(pid, Signal::INT).unwrap();
            interrupted = true;
        }
        if again && line.starts_with("interrupted:") {
            kill_process(pid, Signal::INT).unwrap();
        }
    }
    (child.wait().unwrap().code(), out)
}

#[test]
fn an_interrupted_demo_stops_its_nodes_and_still_reports() {
    let (code, out) = interrupt_demo(false);
    assert!(out.contains("interrupted: stopping the nodes"), "{out}");
    assert!(out.contains("verdict: SAFE"), "{out}");
    assert_eq!(code, Some(0), "{out}");
}

#[test]
fn a_second_interrupt_exits_at_once() {
    let (code, out) = interrupt_demo(true);
    assert!(out.contains("interrupted: stopping the nodes"), "{out}");
    assert!(!out.contains("verdict:"), "{out}");
    assert_eq!(code, Some(130), "{out}");
}
