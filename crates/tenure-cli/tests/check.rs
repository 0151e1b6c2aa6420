//! `tenure check` against hand-made histories: a safe one passes, and each kind of
//! violation is caught and explained with both events.

use std::path::PathBuf;
use std::process::Command;

use serde_json::{Value, json};
use tenure::FencingToken;
use tenure_cli::check::{HoldEnd, ViolationKind, check, check_acks, read_history};

const TENURE: &str = env!("CARGO_BIN_EXE_tenure");
const MS: i64 = 1_000_000;
const LEASE: &str = "demo-shard-counter-7";

fn ev(t_ms: i64, node: &str, event: &str, extra: Value) -> Value {
    let mut v = json!({"t": t_ms * MS, "node": node, "inc": format!("inc-{node}"), "event": event});
    v.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    v
}

fn granted(t: i64, node: &str, token: u64, valid_ms: i64) -> Value {
    ev(
        t,
        node,
        "lease_granted",
        json!({"lease": LEASE, "owner": node, "token": token, "valid_until": valid_ms * MS}),
    )
}

fn renewed(t: i64, node: &str, token: u64, valid_ms: i64) -> Value {
    ev(
        t,
        node,
        "lease_renewed",
        json!({"lease": LEASE, "owner": node, "token": token, "valid_until": valid_ms * MS}),
    )
}

fn released(t: i64, node: &str, token: u64) -> Value {
    ev(
        t,
        node,
        "lease_released",
        json!({"lease": LEASE, "owner": node, "token": token}),
    )
}

fn lost(t: i64, node: &str, token: u64) -> Value {
    ev(
        t,
        node,
        "lease_lost",
        json!({"lease": LEASE, "owner": node, "token": token, "reason": "expired"}),
    )
}

fn write(t: i64, node: &str, token: u64, value: u64, accepted: bool) -> Value {
    ev(
        t,
        node,
        "write",
        json!({"type": "counter", "shard": "7", "entity": "key-1", "token": token, "value": value, "accepted": accepted}),
    )
}

fn fault(t: i64, node: &str, event: &str) -> Value {
    json!({"t": t * MS, "node": node, "inc": "harness", "event": event})
}

fn write_history(lines: &[Value]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.jsonl");
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

/// Runs `tenure check` on `lines`; returns (exit code, stdout).
fn run_check(lines: &[Value]) -> (i32, String) {
    run_check_with(lines, &[])
}

fn run_check_with(lines: &[Value], flags: &[&str]) -> (i32, String) {
    let (_dir, path) = write_history(lines);
    let out = Command::new(TENURE)
        .arg("check")
        .args(flags)
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn kinds(lines: &[Value]) -> Vec<ViolationKind> {
    let (_dir, path) = write_history(lines);
    check(&read_history(&path).unwrap())
        .violations
        .iter()
        .map(|v| v.kind)
        .collect()
}

/// A hand-off done right: a holds, releases; b is granted after; a's writes precede b's.
fn safe_history() -> Vec<Value> {
    vec![
        granted(0, "a", 1, 900),
        write(10, "a", 1, 1, true),
        renewed(300, "a", 1, 1200),
        released(500, "a", 1),
        granted(510, "b", 2, 1400),
        write(520, "b", 2, 2, true),
        write(530, "a", 1, 2, false),
        // Killed while holding: counts until the kill, then c may take over.
        fault(800, "b", "killed"),
        granted(1500, "c", 3, 2400),
        // Paused past the deadline: the loss is announced late, the hold ended at 2400.
        lost(5000, "c", 3),
        granted(2450, "a", 4, 3300),
    ]
}

#[test]
fn a_safe_history_passes() {
    let (code, out) = run_check(&safe_history());
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("verdict: SAFE"), "{out}");
    assert!(out.contains("4 grants"), "{out}");
}

#[test]
fn holds_end_at_release_kill_or_deadline() {
    let (_dir, path) = write_history(&safe_history());
    let verdict = check(&read_history(&path).unwrap());
    let holds = &verdict.holds[LEASE];
    let ends: Vec<(&str, i64, &HoldEnd)> = holds
        .iter()
        .map(|h| (h.node.as_str(), h.until_ns / MS, &h.end))
        .collect();
    assert_eq!(
        ends,
        vec![
            ("a", 500, &HoldEnd::Released),
            ("b", 800, &HoldEnd::Killed),
            ("c", 2400, &HoldEnd::Lost("expired".into())),
            ("a", 3300, &HoldEnd::Unknown),
        ]
    );
}

#[test]
fn overlapping_holders_are_caught_with_both_events() {
    let lines = vec![
        granted(0, "a", 1, 900),
        granted(400, "b", 2, 1300),
        released(600, "a", 1),
    ];
    let (code, out) = run_check(&lines);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("VIOLATION overlapping holders"), "{out}");
    assert!(
        out.contains("\"node\":\"a\"") && out.contains("\"node\":\"b\""),
        "{out}"
    );
    assert!(out.contains("200.000 ms later"), "{out}");
}

#[test]
fn a_hold_without_an_end_counts_until_its_deadline() {
    // a's history stops (e.g. the process hung); its belief may last until valid_until.
    let lines = vec![granted(0, "a", 1, 900), granted(800, "b", 2, 1700)];
    assert_eq!(kinds(&lines), vec![ViolationKind::Overlap]);
    // Granted after the deadline: fine.
    let lines = vec![granted(0, "a", 1, 900), granted(901, "b", 2, 1700)];
    assert_eq!(kinds(&lines), vec![]);
}

#[test]
fn a_grant_answered_past_its_deadline_is_no_hold() {
    // a asks at 0 and is frozen until 2000; the store granted it token 5 (valid until 900)
    // at once, and b token 6 after it lapsed. a logs the grant when it resumes, past its
    // deadline, while b holds, and loses it at once: it never believed it, and its token
    // came first.
    let lines = vec![
        granted(1000, "b", 6, 3000),
        granted(2000, "a", 5, 900),
        lost(2000, "a", 5),
    ];
    assert_eq!(kinds(&lines), vec![]);
    // Answered in time, the same grant overlaps b's and comes after it with a lower token.
    let lines = vec![
        granted(1000, "b", 6, 3000),
        granted(1200, "a", 5, 2100),
        lost(2000, "a", 5),
    ];
    assert_eq!(
        kinds(&lines),
        vec![ViolationKind::Overlap, ViolationKind::TokenOrder]
    );
}

#[test]
fn renewals_extend_the_hold() {
    let lines = vec![
        granted(0, "a", 1, 900),
        renewed(500, "a", 1, 1400),
        granted(1000, "b", 2, 1700),
    ];
    assert_eq!(kinds(&lines), vec![ViolationKind::Overlap]);
}

#[test]
fn decreasing_tokens_are_caught() {
    let lines = vec![
        granted(0, "a", 5, 900),
        released(100, "a", 5),
        granted(200, "b", 4, 1100),
    ];
    let (code, out) = run_check(&lines);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("VIOLATION token not increasing"), "{out}");
    // An equal token for another owner is caught too.
    let lines = vec![
        granted(0, "a", 5, 900),
        released(100, "a", 5),
        granted(200, "b", 5, 1100),
    ];
    assert_eq!(kinds(&lines), vec![ViolationKind::TokenOrder]);
}

#[test]
fn a_new_grant_before_the_previous_ended_is_caught_for_the_same_owner() {
    let lines = vec![
        granted(0, "a", 1, 900),
        granted(300, "a", 2, 1200),
        released(400, "a", 2),
    ];
    let (code, out) = run_check(&lines);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("VIOLATION grant before the previous grant ended"),
        "{out}"
    );
    // A reentrant grant (same token) is not a new grant.
    let lines = vec![granted(0, "a", 1, 900), granted(300, "a", 1, 1200)];
    assert_eq!(kinds(&lines), vec![]);
}

#[test]
fn a_restarted_node_is_another_owner() {
    let mut second = granted(300, "a", 2, 1200);
    second["inc"] = json!("inc-a-2");
    let lines = vec![granted(0, "a", 1, 900), second];
    assert_eq!(kinds(&lines), vec![ViolationKind::Overlap]);
}

#[test]
fn stale_writes_are_caught_in_the_resource_order() {
    // a is frozen past its deadline while b takes over; a's writes after it resumes are
    // recorded after b's, but the counter's order is by value.
    let lines = vec![
        granted(0, "a", 1, 90),
        fault(50, "a", "paused"),
        granted(95, "b", 2, 900),
        write(100, "b", 2, 2, true),
        fault(100, "a", "resumed"),
        write(101, "a", 1, 1, true),
        write(102, "a", 1, 3, true),
    ];
    let (code, out) = run_check(&lines);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("VIOLATION stale write accepted"), "{out}");
    assert!(out.contains("token 1 after one with token 2"), "{out}");
    // Rejected stale writes are what fencing is for.
    let lines = vec![
        granted(0, "b", 2, 900),
        write(100, "b", 2, 1, true),
        write(101, "a", 1, 1, false),
    ];
    assert_eq!(kinds(&lines), vec![]);
    // Singleton ticks are checked the same way.
    let tick = |t, token, value| {
        ev(
            t,
            "a",
            "tick",
            json!({"singleton": "s1", "token": token, "value": value, "accepted": true}),
        )
    };
    // (Here without holds: only the write rule is looked at.)
    assert!(
        kinds(&[tick(1, 3, 1), tick(2, 2, 2)]).contains(&ViolationKind::StaleWrite),
        "a stale tick is caught"
    );
}

#[test]
fn every_violation_is_listed_with_all() {
    let lines = vec![granted(0, "a", 5, 900), granted(100, "b", 4, 1000)];
    let (_dir, path) = write_history(&lines);
    let out = Command::new(TENURE)
        .args(["check", "--all"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("VIOLATION").count(), 2, "{text}");
    assert!(text.contains("UNSAFE (2 violations)"), "{text}");
}

#[test]
fn unreadable_histories_name_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.jsonl");
    std::fs::write(
        &path,
        "{\"t\":1,\"node\":\"a\",\"inc\":\"x\",\"event\":\"e\"}\nnot json\n",
    )
    .unwrap();
    let out = Command::new(TENURE)
        .arg("check")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("h.jsonl line 2: not JSON"), "{err}");
    let missing = Command::new(TENURE)
        .args(["check", "/nonexistent/h.jsonl"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/h.jsonl"));
    std::fs::write(&path, "{\"node\":\"a\",\"inc\":\"x\",\"event\":\"e\"}\n").unwrap();
    let out = Command::new(TENURE)
        .arg("check")
        .arg(&path)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 1: field `t` missing"));
}

fn ack(t: i64, node: &str, token: u64, value: u64) -> Value {
    ev(
        t,
        node,
        "ack",
        json!({"entity": "key-1", "shard": "7", "token": token, "value": value, "from": node}),
    )
}

fn ack_kinds(lines: &[Value], final_value: u64) -> Vec<ViolationKind> {
    let (_dir, path) = write_history(lines);
    check_acks(&read_history(&path).unwrap(), &|key| {
        assert_eq!(key, "key-1");
        Some(final_value)
    })
    .violations
    .iter()
    .map(|v| v.kind)
    .collect()
}

#[test]
fn acknowledged_writes_must_be_accepted_and_kept() {
    let good = vec![
        write(10, "a", 1, 1, true),
        ack(11, "a", 1, 1),
        write(20, "a", 1, 2, true),
        ack(21, "b", 1, 2),
    ];
    assert_eq!(ack_kinds(&good, 2), vec![]);
    // The counter lost value 2 (e.g. a store that forgot a committed write).
    assert_eq!(ack_kinds(&good, 1), vec![ViolationKind::LostAck]);
    // Acknowledged with a token the write did not carry, or a write never accepted.
    assert_eq!(
        ack_kinds(&[write(10, "a", 1, 1, true), ack(11, "a", 2, 1)], 1),
        vec![ViolationKind::UnbackedAck]
    );
    assert_eq!(
        ack_kinds(&[write(10, "a", 1, 1, false), ack(11, "a", 1, 1)], 1),
        vec![ViolationKind::UnbackedAck]
    );
    // The same value acknowledged twice.
    assert_eq!(
        ack_kinds(
            &[
                write(10, "a", 1, 1, true),
                ack(11, "a", 1, 1),
                ack(12, "b", 1, 1)
            ],
            1
        ),
        vec![ViolationKind::UnbackedAck]
    );
}

#[test]
fn tenure_check_reads_the_counter_file() {
    let dir = tempfile::tempdir().unwrap();
    let counter_path = dir.path().join("counter.sqlite");
    let counter = tenure_cli::demo::FencedCounter::open(&counter_path).unwrap();
    let name = tenure_cli::demo::counter::counter_name("key-1");
    assert_eq!(
        counter.increment(&name, FencingToken::new(1)).unwrap(),
        Some(1)
    );
    let lines = vec![
        granted(0, "a", 1, 900),
        write(10, "a", 1, 1, true),
        ack(11, "a", 1, 1),
        write(20, "a", 1, 2, true),
        ack(21, "a", 1, 2),
    ];
    let (_h, history) = write_history(&lines);
    let out = Command::new(TENURE)
        .arg("check")
        .arg(&history)
        .arg("--counter")
        .arg(&counter_path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("2 acknowledged increments checked"), "{text}");
    assert!(
        text.contains("VIOLATION acknowledged write lost on counter/key-1: value 2 was acknowledged but the counter now holds 1"),
        "{text}"
    );
    assert_eq!(
        counter.increment(&name, FencingToken::new(1)).unwrap(),
        Some(2)
    );
    let out = Command::new(TENURE)
        .arg("check")
        .arg(&history)
        .arg("--counter")
        .arg(&counter_path)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let missing = Command::new(TENURE)
        .arg("check")
        .arg(&history)
        .args(["--counter", "/nonexistent/dir/counter.sqlite"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/dir/counter.sqlite"));
}

/// A writer SIGKILLed in the middle of a line leaves torn bytes (Linux may stop a write to
/// a regular file at a page boundary): at the end of the file, or followed by the next
/// writer's whole line. The torn event counts as never written; the rest is checked.
#[test]
fn a_line_torn_by_a_killed_writer_is_skipped_and_the_rest_checked() {
    let safe = safe_history();
    let torn = |l: &Value| {
        let text = l.to_string();
        text[..text.len() / 2].to_string()
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.jsonl");
    // Torn in the middle: the next line follows the torn bytes on the same line.
    let mut text = String::new();
    for (i, l) in safe.iter().enumerate() {
        if i == 2 {
            text.push_str(&torn(&lost(9_000, "n9", 1)));
        }
        text.push_str(&format!("{l}\n"));
    }
    // Torn at the end: no newline after it.
    text.push_str(&torn(&lost(9_000, "n9", 1)));
    std::fs::write(&path, &text).unwrap();
    let events = read_history(&path).unwrap();
    assert_eq!(events.len(), safe.len());
    assert!(check(&events).violations.is_empty());

    // Anything else that is not JSON is still an error naming the line.
    std::fs::write(
        &path,
        format!("{}\n{{\"t\":1,\"node\n{}\n", safe[0], safe[1]),
    )
    .unwrap();
    let err = read_history(&path).unwrap_err().to_string();
    assert!(err.contains("h.jsonl line 2: not JSON"), "{err}");
}

fn entity(t: i64, node: &str, event: &str, token: u64) -> Value {
    ev(
        t,
        node,
        event,
        json!({"type": "counter", "shard": "7", "entity": "key-1", "token": token, "why": ""}),
    )
}

fn shard_life(t: i64, node: &str, event: &str, token: u64) -> Value {
    ev(
        t,
        node,
        event,
        json!({"type": "counter", "shard": "7", "token": token, "why": ""}),
    )
}

fn singleton(t: i64, node: &str, event: &str, token: u64) -> Value {
    ev(
        t,
        node,
        event,
        json!({"singleton": "s1", "token": token, "why": ""}),
    )
}

fn action_kinds(lines: &[Value]) -> Vec<ViolationKind> {
    kinds(lines)
        .into_iter()
        .filter(|k| *k == ViolationKind::ActionOutsideHold)
        .collect()
}

/// Entities, singleton instances and accepted writes must lie inside their node's hold of
/// the matching lease: the hold bounds them until its release, its process's death or its
/// last deadline, not until the (early) loss announcement.
#[test]
fn actions_must_lie_inside_their_holds() {
    let outside = vec![ViolationKind::ActionOutsideHold];
    // The loss is announced at 700 (ahead of the deadline by the stop budget); the entity is
    // gone at 850, before the deadline 900: safe.
    let shard = |t, event| {
        ev(
            t,
            "a",
            event,
            json!({"type": "counter", "shard": "7", "token": 1, "why": ""}),
        )
    };
    let in_time = vec![
        granted(0, "a", 1, 900),
        shard(5, "shard_started"),
        entity(10, "a", "entity_started", 1),
        write(20, "a", 1, 1, true),
        lost(700, "a", 1),
        entity(850, "a", "entity_stopped", 1),
        shard(860, "shard_stopped"),
    ];
    assert_eq!(action_kinds(&in_time), vec![]);
    // The entity stops after the deadline.
    let mut late = in_time.clone();
    late[5] = entity(950, "a", "entity_stopped", 1);
    assert_eq!(action_kinds(&late), outside);
    // So does the shard.
    let mut late = in_time.clone();
    late[6] = shard(901, "shard_stopped");
    assert_eq!(action_kinds(&late), outside);
    // The entity stops after its lease was released (a hand-off that did not wait).
    let after_release = vec![
        granted(0, "a", 1, 900),
        entity(10, "a", "entity_started", 1),
        released(500, "a", 1),
        entity(510, "a", "entity_stopped", 1),
    ];
    assert_eq!(action_kinds(&after_release), outside);
    // An accepted write after the deadline, or with a token the node never held.
    let late_write = vec![granted(0, "a", 1, 900), write(901, "a", 1, 1, true)];
    assert_eq!(action_kinds(&late_write), outside);
    let foreign_token = vec![granted(0, "a", 1, 900), write(10, "a", 2, 1, true)];
    assert_eq!(action_kinds(&foreign_token), outside);
    // A refused write is no action.
    let refused = vec![granted(0, "a", 1, 900), write(901, "a", 1, 1, false)];
    assert_eq!(action_kinds(&refused), vec![]);
    // A singleton instance still running when the history ends, after its deadline.
    let singleton_lease = "demo-singleton-s1";
    let mut grant = granted(0, "a", 1, 900);
    grant["lease"] = json!(singleton_lease);
    let zombie = vec![
        grant.clone(),
        singleton(5, "a", "singleton_starting", 1),
        singleton(6, "a", "singleton_started", 1),
        ev(2000, "b", "member_up", json!({})),
    ];
    assert_eq!(action_kinds(&zombie), outside);
    let mut stopped = zombie.clone();
    stopped.insert(3, singleton(890, "a", "singleton_stopped", 1));
    assert_eq!(action_kinds(&stopped), vec![]);
    // A kill ends every life of the process.
    let killed = vec![
        granted(0, "a", 1, 900),
        entity(10, "a", "entity_started", 1),
        fault(400, "a", "killed"),
        ev(2000, "b", "member_up", json!({})),
    ];
    assert_eq!(action_kinds(&killed), vec![]);
}

/// A process frozen across its deadline may act after it, but only until the resume grace
/// after it resumed.
#[test]
fn a_frozen_process_must_stop_promptly_after_resuming() {
    let frozen = |stop_ms: i64| {
        vec![
            granted(0, "a", 1, 900),
            shard_life(5, "a", "shard_started", 1),
            entity(10, "a", "entity_started", 1),
            fault(500, "a", "paused"),
            granted(1000, "b", 2, 1900),
            fault(8000, "a", "resumed"),
            lost(8001, "a", 1),
            entity(stop_ms, "a", "entity_stopped", 1),
            shard_life(stop_ms, "a", "shard_stopped", 1),
        ]
    };
    // The default grace (13 s) covers the reference stop budget (12.5 s).
    assert_eq!(action_kinds(&frozen(8000 + 12_500)), vec![]);
    // The entity and its shard both went on too long.
    assert_eq!(
        action_kinds(&frozen(8000 + 14_000)),
        vec![ViolationKind::ActionOutsideHold; 2]
    );
    // Frozen, but resumed before the deadline: no exception.
    let short = vec![
        granted(0, "a", 1, 900),
        entity(10, "a", "entity_started", 1),
        fault(100, "a", "paused"),
        fault(200, "a", "resumed"),
        entity(950, "a", "entity_stopped", 1),
    ];
    assert_eq!(action_kinds(&short), vec![ViolationKind::ActionOutsideHold]);
    let (code, out) = run_check_with(&frozen(8000 + 3_000), &["--resume-grace", "6s"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("2 actions checked"), "{out}");
    let (code, out) = run_check_with(&frozen(8000 + 7_000), &["--resume-grace", "6s"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "frozen across its deadline, it went on 7000.000 ms after resuming (grace 6s)"
        ),
        "{out}"
    );
}

/// An entity lives inside a life of its shard (same node, incarnation and token); a
/// resource never accepts two writes at one position of its order.
#[test]
fn entities_live_inside_their_shard_and_positions_are_written_once() {
    let shard_kinds = |lines: &[Value]| {
        kinds(lines)
            .into_iter()
            .filter(|k| *k == ViolationKind::EntityOutsideShard)
            .count()
    };
    let inside = vec![
        granted(0, "a", 1, 900),
        shard_life(5, "a", "shard_started", 1),
        entity(10, "a", "entity_started", 1),
        entity(20, "a", "entity_stopped", 1),
        shard_life(30, "a", "shard_stopped", 1),
    ];
    assert_eq!(shard_kinds(&inside), 0);
    // Started before its shard served, or stopped after the shard recorded its stop.
    let mut early = inside.clone();
    early[2] = entity(4, "a", "entity_started", 1);
    assert_eq!(shard_kinds(&early), 1);
    let mut late = inside.clone();
    late[3] = entity(31, "a", "entity_stopped", 1);
    assert_eq!(shard_kinds(&late), 1);
    // Under another token than the shard's life.
    let other_token = vec![
        granted(0, "a", 1, 900),
        granted(0, "a", 2, 900),
        shard_life(5, "a", "shard_started", 1),
        entity(10, "a", "entity_started", 2),
        entity(20, "a", "entity_stopped", 2),
        shard_life(30, "a", "shard_stopped", 1),
    ];
    assert_eq!(shard_kinds(&other_token), 1);
    // Two accepted writes at value 1: a lost update.
    let twice = vec![
        granted(0, "a", 1, 900),
        write(10, "a", 1, 1, true),
        write(11, "a", 1, 1, true),
    ];
    assert!(kinds(&twice).contains(&ViolationKind::DuplicateWrite));
    let (code, out) = run_check(&twice);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("accepted two writes with value 1"), "{out}");
}

/// A kind this build does not know (a newer writer's) is ignored; a known kind with a
/// missing field makes the history unreadable, naming the file, line and kind.
#[test]
fn unknown_kinds_are_ignored_and_malformed_known_ones_are_named() {
    let mut lines = safe_history();
    lines.push(ev(9_000, "a", "from_a_newer_tenure", json!({"x": [1]})));
    let (code, out) = run_check(&lines);
    assert_eq!(code, 0, "{out}");
    let lines = vec![
        granted(0, "a", 1, 900),
        ev(
            10,
            "a",
            "lease_granted",
            json!({"lease": LEASE, "owner": "a"}),
        ),
    ];
    let (code, out) = run_check(&lines);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("history.jsonl line 2: `lease_granted`: missing field `token`"),
        "{out}"
    );
}

fn permit(t: i64, node: &str, slot: u32, permits: u32, token: u64, event: &str) -> Value {
    let lease = format!("jobs.permit-{slot}-of-{permits}");
    let mut extra = json!({"lease": lease, "owner": node, "token": token});
    if event == "lease_granted" {
        extra["valid_until"] = json!((t + 900) * MS);
    }
    ev(t, node, event, extra)
}

#[test]
fn a_semaphore_never_has_more_holders_than_permits() {
    // Two permits: a and b hold them; c takes permit 0 after a released it.
    let safe = vec![
        permit(0, "a", 0, 2, 1, "lease_granted"),
        permit(10, "b", 1, 2, 1, "lease_granted"),
        permit(100, "a", 0, 2, 1, "lease_released"),
        permit(110, "c", 0, 2, 2, "lease_granted"),
    ];
    assert_eq!(kinds(&safe), vec![]);
    // A client configured with three permits takes a third while both are held.
    let mut three = safe.clone();
    three.push(permit(120, "d", 2, 3, 1, "lease_granted"));
    assert_eq!(kinds(&three), vec![ViolationKind::TooManyHolders]);
    let (code, out) = run_check(&three);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("jobs") && out.contains("semaphore has 2"),
        "{out}"
    );
}

#[test]
fn tenure_check_reads_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.sqlite");
    tenure::sqlite::SqliteJournal::open(&journal, std::time::Duration::from_secs(1)).unwrap();
    let appended = ev(
        10,
        "a",
        "journal_appended",
        json!({"type": "counter", "shard": "7", "entity": "key-1", "token": 1,
               "from_seq": 1, "to_seq": 1, "issued": 9 * MS}),
    );
    let lines = vec![granted(0, "a", 1, 900), appended, ack(11, "a", 1, 1)];
    let journal_arg = journal.display().to_string();
    let (code, text) = run_check_with(&lines, &["--all", "--journal", &journal_arg]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("0 events of 0 persistence ids, 1 appends and 0 refusals recorded"),
        "{text}"
    );
    assert!(
        text.contains("VIOLATION appended event lost on journal/counter|key-1: event 1 was appended with token 1 but the journal does not hold it"),
        "{text}"
    );
    assert!(text.contains("VIOLATION acknowledged write lost"), "{text}");
    let (code, text) = run_check_with(&[granted(0, "a", 1, 900)], &["--journal", &journal_arg]);
    assert_eq!(code, 0, "{text}");
    let missing = dir.path().join("missing.sqlite").display().to_string();
    let (code, text) = run_check_with(&lines, &["--journal", &missing]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("missing.sqlite: no such file"), "{text}");
}
