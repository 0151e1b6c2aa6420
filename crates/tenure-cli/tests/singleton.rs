//! Multi-process singleton tests: the instance runs on the oldest node only under its
//! lease; SIGKILL, SIGSTOP past the ttl and graceful leave move it. Every run's history is
//! checked: no two instances alive at overlapping times, tokens increasing, and the fenced
//! counter never accepting an older token after a newer one.

mod common;

use std::time::Duration;

use common::cluster::{Cluster, Options, TestCluster};
use serde_json::Value;

/// One instance of the singleton as the history shows it.
#[derive(Debug, Clone)]
pub struct Instance {
    pub node: String,
    pub token: u64,
    pub start: i64,
    /// Stopped (by its manager) or killed; None while running.
    pub end: Option<i64>,
    pub end_why: String,
    /// Frozen (SIGSTOP) from this instant, if it was paused while running.
    pub paused: Option<i64>,
    /// Thawed (SIGCONT) at this instant.
    pub resumed: Option<i64>,
}

/// How long a resumed instance whose lease lapsed may take to stop (it is told at once by
/// the lease's watchdog; the bound is generous for loaded CI machines).
const STOP_AFTER_RESUME_NS: i64 = 3_000_000_000;

fn t(e: &Value) -> i64 {
    e["t"].as_i64().expect("t")
}

/// Rebuilds the instances of singleton `name` from a history and checks the safety
/// properties; panics naming the two offending events.
pub fn check(history: &[Value], name: &str) -> Vec<Instance> {
    let mut events: Vec<&Value> = history.iter().collect();
    events.sort_by_key(|e| t(e));
    let mut instances: Vec<Instance> = Vec::new();
    let mut last_accepted: Option<(u64, i64)> = None;
    let mut starting: std::collections::HashMap<(String, u64), i64> = Default::default();
    for e in events {
        let node = e["node"].as_str().unwrap_or_default().to_string();
        let running = |instances: &mut Vec<Instance>| -> Option<usize> {
            instances
                .iter()
                .rposition(|i| i.node == node && i.end.is_none())
        };
        match e["event"].as_str().unwrap_or_default() {
            "singleton_starting" if e["singleton"] == name => {
                starting.insert((node.clone(), e["token"].as_u64().expect("token")), t(e));
            }
            "singleton_started" if e["singleton"] == name => {
                let token = e["token"].as_u64().expect("token");
                // Alive from before its spawn began, not from when the manager noted it.
                let start = starting.remove(&(node.clone(), token)).unwrap_or(t(e));
                if let Some(prev) = instances.last() {
                    assert!(
                        token > prev.token,
                        "tokens must increase: {prev:?} then {e}"
                    );
                }
                for other in instances.iter().filter(|i| i.end.is_none()) {
                    let frozen = other.paused.is_some();
                    assert!(
                        frozen,
                        "two instances alive at once: {other:?} still running when {e}"
                    );
                }
                instances.push(Instance {
                    node,
                    token,
                    start,
                    end: None,
                    end_why: String::new(),
                    paused: None,
                    resumed: None,
                });
            }
            "singleton_stopped" if e["singleton"] == name => {
                let token = e["token"].as_u64().expect("token");
                let i = instances
                    .iter()
                    .rposition(|i| i.node == node && i.token == token && i.end.is_none());
                let i = i.unwrap_or_else(|| panic!("stop without a start: {e}"));
                instances[i].end = Some(t(e));
                instances[i].end_why = e["why"].as_str().unwrap_or_default().to_string();
            }
            "killed" => {
                if let Some(i) = running(&mut instances) {
                    instances[i].end = Some(t(e));
                    instances[i].end_why = "killed".into();
                }
            }
            "paused" => {
                if let Some(i) = running(&mut instances) {
                    instances[i].paused = Some(t(e));
                }
            }
            "resumed" => {
                if let Some(i) = running(&mut instances) {
                    instances[i].resumed = Some(t(e));
                }
            }
            "tick" if e["singleton"] == name && e["accepted"] == true => {
                let token = e["token"].as_u64().expect("token");
                if let Some((last, at)) = last_accepted {
                    assert!(
                        token >= last,
                        "the fenced counter accepted token {token} after token {last} (at {at}): {e}"
                    );
                }
                last_accepted = Some((token, t(e)));
            }
            _ => {}
        }
    }
    // A paused instance may only overlap its successor while frozen: once resumed it must
    // stop promptly, without another accepted write after the successor's (checked above).
    for i in &instances {
        if let (Some(resumed), Some(end)) = (i.resumed, i.end)
            && instances
                .iter()
                .any(|later| later.token > i.token && later.start < resumed)
        {
            assert!(
                end - resumed <= STOP_AFTER_RESUME_NS,
                "a resumed instance whose successor runs did not stop promptly: {i:?}"
            );
        }
    }
    for pair in instances.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let alive_until = match (a.paused, a.end) {
            (Some(p), _) => p,
            (None, Some(end)) => end,
            (None, None) => panic!("{a:?} never ended but {b:?} started"),
        };
        assert!(
            alive_until <= b.start,
            "overlap: {a:?} alive until {alive_until}, {b:?} started at {}",
            b.start
        );
    }
    instances
}

fn singleton_cluster(n: usize) -> Cluster {
    let options = Options {
        node_args: ["--singleton", "s1", "--tick", "50ms"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        ..Options::default()
    };
    let c = Cluster::start_with(n, &options);
    c.wait_until("the singleton runs", Duration::from_secs(15), |c| {
        !check(&c.history(), "s1").is_empty()
    });
    c
}

fn host(c: &Cluster) -> usize {
    let instances = check(&c.history(), "s1");
    let running = instances
        .iter()
        .rfind(|i| i.end.is_none())
        .expect("a running instance");
    c.nodes
        .iter()
        .position(|n| n.addr == running.node)
        .expect("host is a node")
}

fn running_on(c: &Cluster, node: usize, after_token: u64) -> bool {
    check(&c.history(), "s1")
        .iter()
        .any(|i| i.node == c.nodes[node].addr && i.token > after_token && i.end.is_none())
}

#[test]
fn sigkill_of_the_host_moves_the_singleton_after_the_ttl() {
    let mut c = singleton_cluster(3);
    let first = host(&c);
    let token = check(&c.history(), "s1").last().unwrap().token;
    // Every node's proxy reaches the instance (on another node for two of them).
    let host_addr = c.nodes[first].addr.clone();
    c.wait_until(
        "every node's proxy got an answer from the host",
        Duration::from_secs(15),
        |c| {
            let h = c.history();
            c.nodes.iter().all(|n| {
                h.iter().any(|e| {
                    e["event"] == "proxy_reply"
                        && e["node"] == n.addr.as_str()
                        && e["from"] == host_addr.as_str()
                })
            })
        },
    );
    c.kill(first);
    c.wait_until(
        "a new instance on another node",
        Duration::from_secs(20),
        |c| {
            (0..3)
                .filter(|i| *i != first)
                .any(|i| running_on(c, i, token))
        },
    );
    let new_host = c.nodes[host(&c)].addr.clone();
    c.wait_until(
        "the survivors' proxies follow the new instance",
        Duration::from_secs(15),
        |c| {
            let h = c.history();
            (0..3).filter(|i| *i != first).all(|i| {
                h.iter().any(|e| {
                    e["event"] == "proxy_reply"
                        && e["node"] == c.nodes[i].addr.as_str()
                        && e["from"] == new_host.as_str()
                })
            })
        },
    );
    let instances = check(&c.history(), "s1");
    assert_eq!(instances.len(), 2, "{instances:?}");
    assert_eq!(instances[0].end_why, "killed");
    common::assert_checked(&c.history);
}

#[test]
fn a_host_paused_past_the_ttl_finds_its_lease_lost_and_stops() {
    let c = singleton_cluster(3);
    let first = host(&c);
    let token = check(&c.history(), "s1").last().unwrap().token;
    c.pause(first);
    c.wait_until(
        "a new instance while the host is frozen",
        Duration::from_secs(20),
        |c| {
            (0..3)
                .filter(|i| *i != first)
                .any(|i| running_on(c, i, token))
        },
    );
    c.resume(first);
    let addr = c.nodes[first].addr.clone();
    c.wait_until("the resumed instance stops", Duration::from_secs(10), |c| {
        check(&c.history(), "s1")
            .iter()
            .any(|i| i.node == addr && i.token == token && i.end.is_some())
    });
    let instances = check(&c.history(), "s1");
    let old = instances.iter().find(|i| i.token == token).unwrap();
    assert!(old.paused.is_some() && old.resumed.is_some(), "{old:?}");
    assert!(
        ["lease lost", "down", "no longer the oldest"]
            .iter()
            .any(|w| old.end_why.contains(w)),
        "stopped because its lease or its membership lapsed: {old:?}"
    );
    common::assert_checked(&c.history);
}

#[test]
fn graceful_leave_hands_the_singleton_over() {
    let mut c = singleton_cluster(3);
    let first = host(&c);
    let token = check(&c.history(), "s1").last().unwrap().token;
    assert!(c.stop(first).success(), "{}", c.nodes[first].stderr());
    c.wait_until("the next oldest runs it", Duration::from_secs(15), |c| {
        (0..3)
            .filter(|i| *i != first)
            .any(|i| running_on(c, i, token))
    });
    let instances = check(&c.history(), "s1");
    let old = instances.iter().find(|i| i.token == token).unwrap();
    assert_eq!(old.end_why, "handing over", "{old:?}");
    let new = instances.last().unwrap();
    let gap_ms = (new.start - old.end.unwrap()) as f64 / 1e6;
    assert!(gap_ms >= 0.0, "no overlap: gap {gap_ms} ms");
    common::assert_checked(&c.history);
}

#[test]
fn the_checker_catches_overlaps_and_stale_writes() {
    let line = |t: i64, node: &str, event: &str, token: u64, extra: &str| -> Value {
        serde_json::from_str(&format!(
            r#"{{"t":{t},"node":"{node}","event":"{event}","singleton":"s1","token":{token},"why":"x"{extra}}}"#
        ))
        .unwrap()
    };
    let overlap = vec![
        line(1, "a", "singleton_started", 1, ""),
        line(2, "b", "singleton_started", 2, ""),
    ];
    assert!(
        std::panic::catch_unwind(|| check(&overlap, "s1")).is_err(),
        "overlap caught"
    );
    let stale = vec![
        line(1, "a", "tick", 2, r#","accepted":true"#),
        line(2, "b", "tick", 1, r#","accepted":true"#),
    ];
    assert!(
        std::panic::catch_unwind(|| check(&stale, "s1")).is_err(),
        "stale write caught"
    );
    let backwards = vec![
        line(1, "a", "singleton_started", 2, ""),
        line(2, "a", "singleton_stopped", 2, ""),
        line(3, "b", "singleton_started", 1, ""),
    ];
    assert!(
        std::panic::catch_unwind(|| check(&backwards, "s1")).is_err(),
        "token order caught"
    );
    let harness = |t: i64, node: &str, event: &str| -> Value {
        serde_json::from_str(&format!(r#"{{"t":{t},"node":"{node}","event":"{event}"}}"#)).unwrap()
    };
    let slow_after_resume = vec![
        line(1, "a", "singleton_started", 1, ""),
        harness(2, "a", "paused"),
        line(3, "b", "singleton_started", 2, ""),
        harness(4, "a", "resumed"),
        line(4 + 4_000_000_000, "a", "singleton_stopped", 1, ""),
    ];
    assert!(
        std::panic::catch_unwind(|| check(&slow_after_resume, "s1")).is_err(),
        "a resumed instance running on beside its successor is caught"
    );
    let fine = vec![
        line(1, "a", "singleton_started", 1, ""),
        line(2, "a", "singleton_stopped", 1, ""),
        line(3, "b", "singleton_started", 2, ""),
    ];
    assert_eq!(check(&fine, "s1").len(), 2);
}
