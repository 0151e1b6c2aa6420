//! The sharding history checker: rebuilds, per shard, when each node ran it (from
//! `shard_started` to `shard_stopped`, a kill, or the end of the history) and asserts:
//! no shard alive on two nodes at overlapping times (an interval of a frozen node may
//! overlap only while it is frozen, and must end promptly once it is resumed), tokens
//! increasing per shard, entities started only inside their shard's interval, and, per
//! counter key in the counter's own order (its values), no accepted write carrying an
//! older token than an earlier accepted one.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use serde_json::Value;

use super::cluster::{Cluster, Options, TestCluster};

/// How long a resumed node whose shard lease lapsed may take to stop the shard (it is told
/// at once by the lease's watchdog; generous for loaded CI machines).
pub const STOP_AFTER_RESUME_NS: i64 = 3_000_000_000;

/// One stay of a shard on a node.
#[derive(Debug, Clone)]
pub struct Stay {
    pub node: String,
    pub token: u64,
    pub start: i64,
    pub end: Option<i64>,
    pub why: String,
    /// Frozen from / thawed at, if its node was paused while it ran.
    pub paused: Option<i64>,
    pub resumed: Option<i64>,
}

fn t(e: &Value) -> i64 {
    e["t"].as_i64().expect("t")
}

fn s(e: &Value, k: &str) -> String {
    e[k].as_str().unwrap_or_default().to_string()
}

/// Checks `history` (every node's lines, any order); panics naming the offending events.
/// Returns the stays per shard.
pub fn check(history: &[Value]) -> BTreeMap<String, Vec<Stay>> {
    let mut events: Vec<&Value> = history.iter().collect();
    events.sort_by_key(|e| t(e));
    let mut stays: BTreeMap<String, Vec<Stay>> = BTreeMap::new();
    for e in &events {
        let node = s(e, "node");
        let open_on = |stays: &mut BTreeMap<String, Vec<Stay>>, f: &mut dyn FnMut(&mut Stay)| {
            for list in stays.values_mut() {
                for st in list
                    .iter_mut()
                    .filter(|st| st.node == node && st.end.is_none())
                {
                    f(st);
                }
            }
        };
        match e["event"].as_str().unwrap_or_default() {
            "shard_started" => {
                let shard = s(e, "shard");
                let token = e["token"].as_u64().expect("token");
                let list = stays.entry(shard.clone()).or_default();
                if let Some(prev) = list.last() {
                    assert!(
                        token > prev.token,
                        "shard {shard}: tokens must increase: {prev:?} then {e}"
                    );
                }
                for other in list.iter().filter(|st| st.end.is_none()) {
                    assert!(
                        other.paused.is_some() && other.node != node,
                        "shard {shard} alive on two nodes at once: {other:?} still running when {e}"
                    );
                }
                list.push(Stay {
                    node,
                    token,
                    start: t(e),
                    end: None,
                    why: String::new(),
                    paused: None,
                    resumed: None,
                });
            }
            "shard_stopped" => {
                let shard = s(e, "shard");
                let token = e["token"].as_u64().expect("token");
                let st = stays
                    .get_mut(&shard)
                    .and_then(|l| {
                        l.iter_mut()
                            .rfind(|st| st.node == node && st.token == token && st.end.is_none())
                    })
                    .unwrap_or_else(|| panic!("shard {shard}: stop without a start: {e}"));
                st.end = Some(t(e));
                st.why = s(e, "why");
            }
            "entity_started" => {
                let shard = s(e, "shard");
                let token = e["token"].as_u64().expect("token");
                let inside = stays.get(&shard).is_some_and(|l| {
                    l.iter()
                        .any(|st| st.node == node && st.token == token && st.end.is_none())
                });
                assert!(inside, "entity started outside its shard's stay: {e}");
            }
            "killed" => open_on(&mut stays, &mut |st| {
                st.end = Some(t(e));
                st.why = "killed".into();
            }),
            "paused" => open_on(&mut stays, &mut |st| st.paused = Some(t(e))),
            "resumed" => open_on(&mut stays, &mut |st| st.resumed = Some(t(e))),
            _ => {}
        }
    }
    for (shard, list) in &stays {
        for st in list {
            if let (Some(resumed), Some(end)) = (st.resumed, st.end)
                && list
                    .iter()
                    .any(|later| later.token > st.token && later.start < resumed)
            {
                assert!(
                    end - resumed <= STOP_AFTER_RESUME_NS,
                    "shard {shard}: a resumed stay whose successor runs did not stop promptly: {st:?}"
                );
            }
        }
    }
    check_writes(history);
    stays
}

/// Per counter key, accepted writes in the counter's order (their values) never go back
/// to an older token (`tenure check`'s stale-write rule), and no value is given twice.
pub fn check_writes(history: &[Value]) {
    let events: Vec<tenure_cli::check::Event> = history
        .iter()
        .filter(|e| e["event"] == "write")
        .map(|e| tenure_cli::check::Event::from_json(e.clone(), 0).expect("a history line"))
        .collect();
    // Only the stale-write rule applies to writes alone (the action rule needs the holds).
    if let Some(v) = tenure_cli::check::check(&events)
        .violations
        .iter()
        .find(|v| v.kind == tenure_cli::check::ViolationKind::StaleWrite)
    {
        panic!("{v}");
    }
    let mut values: HashMap<String, Vec<(u64, &Value)>> = HashMap::new();
    for e in history
        .iter()
        .filter(|e| e["event"] == "write" && e["accepted"] == true)
    {
        let value = e["value"].as_u64().expect("value");
        values.entry(s(e, "entity")).or_default().push((value, e));
    }
    for (key, mut writes) in values {
        writes.sort_by_key(|w| w.0);
        for pair in writes.windows(2) {
            let ((v1, e1), (v2, e2)) = (&pair[0], &pair[1]);
            assert!(
                v1 != v2,
                "key {key}: value {v1} accepted twice: {e1} and {e2}"
            );
        }
    }
}

/// Acknowledged increments are not lost (`tenure check --counter`'s rule): per key, every
/// acknowledged value was accepted by the counter, no value was acknowledged twice, and the
/// counter's final value is at least every acknowledged one. `final_value` reads the
/// counter. Returns how many acknowledgements were checked.
pub fn check_acks(history: &[Value], final_value: impl Fn(&str) -> u64) -> usize {
    let events: Vec<tenure_cli::check::Event> = history
        .iter()
        .filter(|e| e["event"] == "write" || e["event"] == "ack")
        .map(|e| tenure_cli::check::Event::from_json(e.clone(), 0).expect("a history line"))
        .collect();
    let acks = tenure_cli::check::check_acks(&events, &|key| Some(final_value(key)));
    if let Some(v) = acks.violations.first() {
        panic!("{v}");
    }
    acks.acked
}

pub const SHARDING: &str = r#"
[sharding]
number-of-shards = 100
retry-interval = "300ms"
unreachable-reallocate-after = "2s"
minority-hand-off-after = "2s"
rebalance-interval = "1s"
stop-timeout = "1s"
hand-off-timeout = "6s"
"#;

/// Keys of the load: enough to reach every one of the 100 shards.
pub const KEYS: usize = 600;

/// The shards the load's keys fall in.
pub fn loaded_shards() -> BTreeSet<String> {
    (0..KEYS)
        .map(|i| tenure::sharding::shard_of(&format!("key-{i}"), 100))
        .collect()
}

/// A 3-node harness cluster hosting the example sharded counter, every node driving
/// increments of `KEYS` keys, once every loaded shard runs and every node got acks.
pub fn sharded_cluster() -> Cluster {
    let options = Options {
        node_args: [
            "--sharded-counter".to_string(),
            "--load-keys".to_string(),
            KEYS.to_string(),
            "--load-interval".to_string(),
            "20ms".to_string(),
        ]
        .to_vec(),
        tail: SHARDING.to_string(),
        ..Options::default()
    };
    let c = Cluster::start_with(3, &options);
    c.wait_until(
        "every loaded shard runs, on every node, and increments are acknowledged on every node",
        Duration::from_secs(60),
        |c| {
            let h = c.history();
            let live = live_shards(&check(&h));
            live.len() == loaded_shards().len()
                && c.nodes.iter().all(|n| {
                    live.iter().any(|(_, st)| st.node == n.addr)
                        && h.iter()
                            .any(|e| e["event"] == "ack" && e["node"] == n.addr.as_str())
                })
        },
    );
    c
}

/// Shards with a stay that has not ended, and that stay.
pub fn live_shards(stays: &std::collections::BTreeMap<String, Vec<Stay>>) -> Vec<(String, Stay)> {
    stays
        .iter()
        .filter_map(|(shard, l)| {
            l.last()
                .filter(|st| st.end.is_none())
                .map(|st| (shard.clone(), st.clone()))
        })
        .collect()
}

/// The shards running (not frozen) on node `node`.
pub fn shards_on(c: &Cluster, node: usize) -> BTreeSet<String> {
    live_shards(&check(&c.history()))
        .into_iter()
        .filter(|(_, st)| st.node == c.nodes[node].addr && st.paused.is_none())
        .map(|(s, _)| s)
        .collect()
}
