//! Multi-process sharding tests: 3 `tenure node` processes host the example sharded
//! counter (100 shards) while every node drives increments through its region. Faults:
//! SIGKILL, SIGSTOP past the ttl, a partition between one node and the others (all still
//! reach the store), a rolling restart. Every run's history is checked (no shard alive on
//! two nodes at overlapping times, tokens increasing per shard, no stale-token write
//! accepted) and no acknowledged increment may be lost.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::cluster::Cluster;
use common::shards::{check, check_acks, sharded_cluster, shards_on};
use serde_json::{Value, json};
use tenure::sharding::counter::counter_name;
use tenure::sqlite::FencedCounter;

/// One cluster at a time: four 3-node clusters with load at once starve a 2-core machine.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits until every shard in `moved` runs (started after `after`) on a node other than
/// `from`.
fn wait_moved(c: &Cluster, moved: &BTreeSet<String>, from: usize, after: i64, limit: Duration) {
    let from = c.nodes[from].addr.clone();
    c.wait_until(
        &format!("the {} shards of {from} run elsewhere", moved.len()),
        limit,
        |c| {
            let stays = check(&c.history());
            moved.iter().all(|shard| {
                stays.get(shard).is_some_and(|l| {
                    l.iter()
                        .any(|st| st.node != from && st.start > after && st.end.is_none())
                })
            })
        },
    );
}

fn now_ns() -> i64 {
    tenure::clock::boottime_now_ns() as i64
}

/// Acks keep coming after `after` (the service is back for the nodes still running).
fn wait_acks_after(c: &Cluster, after: i64, n: usize) {
    c.wait_until(
        "increments acknowledged again",
        Duration::from_secs(30),
        |c| {
            c.history()
                .iter()
                .filter(|e| e["event"] == "ack" && e["t"].as_i64().unwrap_or(0) > after)
                .count()
                >= n
        },
    );
}

/// The final safety checks of a run: the history, and no acknowledged increment lost.
fn final_checks(c: &Cluster) {
    let history = c.history();
    check(&history);
    common::assert_checked(&c.history);
    let counter = FencedCounter::open(&c.counter_file()).expect("open the counter");
    let acked = check_acks(&history, |key| {
        counter
            .get(&counter_name(key))
            .expect("read the counter")
            .map(|(v, _)| v)
            .unwrap_or(0)
    });
    assert!(acked > 0, "no increment was acknowledged at all");
    let mut counts = std::collections::BTreeMap::new();
    for e in &history {
        let kind = match (e["event"].as_str(), e["accepted"].as_bool()) {
            (Some("write"), Some(false)) => "write_refused".to_string(),
            (Some(k), _) => k.to_string(),
            _ => continue,
        };
        *counts.entry(kind).or_insert(0) += 1;
    }
    eprintln!("history of {}: {counts:?}", c.dir.path().display());
}

#[test]
fn sigkill_of_a_node_moves_all_its_shards_to_the_others() {
    let _serial = serial();
    let mut c = sharded_cluster();
    // The oldest node also runs the coordinator: its successor rebuilds the allocation.
    let victim = 0;
    let moved = shards_on(&c, victim);
    assert!(!moved.is_empty());
    c.kill(victim);
    let killed = now_ns();
    wait_moved(&c, &moved, victim, killed, Duration::from_secs(40));
    wait_acks_after(&c, killed, 200);
    final_checks(&c);
}

#[test]
fn a_node_paused_past_the_ttl_stops_its_shards_on_resume_and_its_late_writes_are_refused() {
    let _serial = serial();
    let c = sharded_cluster();
    let victim = 1;
    let moved = shards_on(&c, victim);
    c.pause(victim);
    let paused = now_ns();
    // Its leases expire (ttl 3 s) and the others take its shards over.
    wait_moved(&c, &moved, victim, paused, Duration::from_secs(40));
    c.resume(victim);
    // On resume, its lease watchdog declares every lapsed grant lost: the shards stop.
    c.wait_until(
        "the resumed node stopped the shards it lost",
        Duration::from_secs(20),
        |c| {
            let stays = check(&c.history());
            moved.iter().all(|shard| {
                stays[shard]
                    .iter()
                    .filter(|st| st.node == c.nodes[victim].addr && st.start < paused)
                    .all(|st| st.end.is_some())
            })
        },
    );
    c.wait_converged(Duration::from_secs(30));
    wait_acks_after(&c, now_ns(), 100);
    final_checks(&c);
}

#[test]
fn a_node_cut_off_from_the_others_gives_its_shards_up_and_they_move_without_overlap() {
    let _serial = serial();
    let c = sharded_cluster();
    let victim = 2;
    let moved = shards_on(&c, victim);
    c.set_link(victim, 0, true);
    c.set_link(victim, 1, true);
    let cut = now_ns();
    // Both sides still reach the store: the cut-off node is in a minority and hands its
    // shards off; the majority's coordinator moves them, and their new hosts wait for the
    // leases. Any overlap here would be a violation (no node is frozen).
    wait_moved(&c, &moved, victim, cut, Duration::from_secs(40));
    c.set_link(victim, 0, false);
    c.set_link(victim, 1, false);
    c.wait_converged(Duration::from_secs(30));
    wait_acks_after(&c, now_ns(), 100);
    final_checks(&c);
}

#[test]
fn a_rolling_restart_with_traffic_loses_no_acknowledged_increment() {
    let _serial = serial();
    let mut c = sharded_cluster();
    for i in 0..3 {
        let status = c.stop(i);
        assert!(status.success(), "node {i} left with {status:?}");
        c.spawn(i);
        c.wait_converged(Duration::from_secs(30));
        wait_acks_after(&c, now_ns(), 100);
    }
    // Every node's graceful stop handed its shards off: each of its stays ended with a
    // hand-off, none was killed.
    let stays = check(&c.history());
    assert!(
        stays
            .values()
            .flatten()
            .filter(|st| st.end.is_some())
            .all(|st| st.why == "hand-off"),
        "every shard stop was a hand-off"
    );
    final_checks(&c);
}

fn line(t: i64, node: &str, event: &str, extra: Value) -> Value {
    let mut v = json!({"t": t, "node": node, "inc": "x", "event": event});
    v.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    v
}

fn started(t: i64, node: &str, token: u64) -> Value {
    line(
        t,
        node,
        "shard_started",
        json!({"shard": "7", "token": token}),
    )
}

fn stopped(t: i64, node: &str, token: u64) -> Value {
    line(
        t,
        node,
        "shard_stopped",
        json!({"shard": "7", "token": token, "why": "x"}),
    )
}

fn write(t: i64, node: &str, token: u64, value: u64) -> Value {
    line(
        t,
        node,
        "write",
        json!({"shard": "7", "entity": "k", "token": token, "value": value, "accepted": true}),
    )
}

fn violation(history: Vec<Value>) -> String {
    let err = std::panic::catch_unwind(|| check(&history)).expect_err("a violation");
    err.downcast_ref::<String>().cloned().unwrap_or_default()
}

#[test]
fn the_checker_catches_each_kind_of_violation() {
    let (a, b) = ("127.0.0.1:1", "127.0.0.1:2");
    // A clean hand-over passes.
    check(&[
        started(1, a, 1),
        write(2, a, 1, 1),
        stopped(3, a, 1),
        started(4, b, 2),
        write(5, b, 2, 2),
    ]);
    // Overlap: b starts while a still runs.
    assert!(violation(vec![started(1, a, 1), started(2, b, 2)]).contains("two nodes at once"));
    // Tokens going back.
    assert!(
        violation(vec![started(1, a, 2), stopped(2, a, 2), started(3, b, 1)])
            .contains("tokens must increase")
    );
    // A stale write accepted after a newer one (in the counter's own order).
    assert!(
        violation(vec![write(1, b, 2, 1), write(2, a, 1, 2)])
            .contains("token 1 after one with token 2")
    );
    // A paused node that does not stop promptly after resuming.
    assert!(
        violation(vec![
            started(1, a, 1),
            line(2, a, "paused", json!({})),
            started(3, b, 2),
            line(4, a, "resumed", json!({})),
            stopped(4 + 10_000_000_000, a, 1),
        ])
        .contains("did not stop promptly")
    );
    // An entity started outside its shard's stay.
    assert!(
        violation(vec![line(
            1,
            a,
            "entity_started",
            json!({"shard": "7", "token": 1, "entity": "k"})
        )])
        .contains("outside")
    );
    // A lost acknowledged increment.
    let h = vec![
        write(1, a, 1, 5),
        line(2, a, "ack", json!({"entity": "k", "value": 5, "token": 1})),
    ];
    let lost = std::panic::catch_unwind(|| check_acks(&h, |_| 4)).expect_err("lost ack");
    assert!(
        lost.downcast_ref::<String>()
            .unwrap()
            .contains("acknowledged but the counter now holds 4")
    );
}
