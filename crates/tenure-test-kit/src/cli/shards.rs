//! The sharded counter's test cluster and what its history shows running where. Safety
//! (shards on one node at a time, tokens, entities inside their shards, stale writes, prompt
//! stops after a freeze) is judged by `tenure check` alone ([`super::assert_checked`]).

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;

use super::cluster::{Cluster, Options, TestCluster};
use super::lives::{Life, shard_lives};

/// Acknowledged increments are not lost (`tenure check --counter`'s rule): per key, every
/// acknowledged value was accepted by the counter, no value was acknowledged twice, and the
/// counter's final value is at least every acknowledged one. `final_value` reads the
/// counter. Returns how many acknowledgements were checked.
pub fn check_acks(history: &[Value], final_value: impl Fn(&str) -> u64) -> usize {
    let events: Vec<tenure::history::Entry> = history
        .iter()
        .map(|e| tenure::history::Entry::from_json(e.clone(), 0).expect("a history line"))
        .collect();
    let acks = tenure::history::check::check_acks(&events, &|key| Some(final_value(key)));
    if let Some(v) = acks.violations.first() {
        panic!("{v}");
    }
    acks.acked
}

/// The `[sharding]` section of these tests: 100 shards and short timings.
pub const SHARDING: &str = r#"
[sharding]
number-of-shards = 100
retry-interval = "300ms"
unreachable-reallocate-after = "2s"
rebalance-interval = "1s"
stop-timeout = "500ms"
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
        // A bench run being traced keeps its history.
        history: std::env::var_os("TENURE_BENCH_HISTORY").map(Into::into),
        ..Options::default()
    };
    let c = Cluster::start_with(3, &options);
    c.wait_until(
        "every loaded shard runs, on every node, and increments are acknowledged on every node",
        Duration::from_secs(60),
        |c| {
            let h = c.history();
            let live = live_shards(&h);
            live.len() == loaded_shards().len()
                && c.nodes.iter().all(|n| {
                    live.iter().any(|l| l.node == n.addr)
                        && h.iter()
                            .any(|e| e["event"] == "ack" && e["node"] == n.addr.as_str())
                })
        },
    );
    c
}

/// The shards running now: per shard, its latest life if it has not ended.
pub fn live_shards(history: &[Value]) -> Vec<Life> {
    let mut latest: std::collections::BTreeMap<String, Life> = Default::default();
    for l in shard_lives(history) {
        latest.insert(l.subject.clone(), l);
    }
    latest.into_values().filter(|l| l.end.is_none()).collect()
}

/// Options of a harness cluster hosting the example counter with `shards` shards, every
/// node asking each of `keys` keys `rate` times a second (open loop, each ask given
/// `timeout`, e.g. `"3s"`); `sharding` adds lines to `[sharding]` (it must set
/// `rebalance-interval`).
pub fn open_loop_options(
    shards: usize,
    keys: usize,
    rate: u64,
    timeout: &str,
    sharding: &str,
) -> Options {
    Options {
        node_args: [
            "--sharded-counter",
            "--load-keys",
            &keys.to_string(),
            "--load-rate",
            &rate.to_string(),
            "--load-timeout",
            timeout,
        ]
        .map(String::from)
        .to_vec(),
        tail: format!(
            "[sharding]\nnumber-of-shards = {shards}\nretry-interval = \"300ms\"\n\
             stop-timeout = \"500ms\"\nhand-off-timeout = \"6s\"\n{sharding}\n"
        ),
        // A leaving node waits for its shards' hand-offs up to leave-timeout and then exits
        // whatever is still in its entities' mailboxes: it must outlast a hand-off's drain
        // (up to hand-off-timeout on a loaded machine), not the harness's 3 s.
        overrides: vec![("leave-timeout".into(), "\"8s\"".into())],
        ..Options::default()
    }
}

/// The requests of the load recorded in `history` (`ack` / `no_ack` with `issued`).
pub fn load_requests(history: &[Value]) -> Vec<tenure_cli::availability::Request> {
    let events: Vec<tenure::history::Entry> = history
        .iter()
        .map(|e| tenure::history::Entry::from_json(e.clone(), 0).expect("a history line"))
        .collect();
    tenure_cli::availability::requests(&events)
}

/// Makes node `i` of `c` host the sharded counter without driving load of its own (a node
/// that joins to take shards, so that the offered load stays the same).
pub fn idle_host(c: &mut Cluster, i: usize) {
    c.nodes[i].args = vec![
        "--sharded-counter".to_string(),
        "--counter".to_string(),
        c.counter_file().display().to_string(),
    ];
}

/// The shards node `addr` ran at instant `at` (ns of `CLOCK_BOOTTIME`): for a node just
/// killed, those it ran when it died (a rebalance may have moved some away shortly before,
/// so the shards it ran a moment earlier are not the ones to wait for).
pub fn shards_at(history: &[Value], addr: &str, at: i64) -> BTreeSet<String> {
    shard_lives(history)
        .into_iter()
        .filter(|l| l.node == addr && l.start < at && l.end.is_none_or(|e| e >= at))
        .map(|l| l.subject)
        .collect()
}

/// When the latest `killed` of the history happened.
pub fn last_kill(history: &[Value]) -> i64 {
    history
        .iter()
        .filter(|e| e["event"] == "killed")
        .filter_map(|e| e["t"].as_i64())
        .max()
        .expect("a kill in the history")
}
