//! `examples/sharded_counter.rs` runs on a 3-node local cluster driven by a proxy-only
//! node: every key counts 1..=6 without a gap or a repeat, across the SIGKILL of a
//! hosting node, and the keys that lived there are served by another node afterwards;
//! alice's shard, pinned to the third node before round 3, is served there in round 3.

use std::collections::BTreeMap;
use tenure_test_kit::example::run_example;

#[test]
fn the_sharded_counter_example_counts_every_key_through_a_node_failure() {
    let text = run_example("sharded_counter");
    let killed = text
        .lines()
        .find_map(|l| l.strip_prefix("SIGKILL of node "))
        .expect("the example killed a node")
        .to_string();
    // key -> [(round, value, token, node)]
    let mut seen: BTreeMap<String, Vec<(u32, u64, u64, String)>> = BTreeMap::new();
    for l in text.lines() {
        let Some((head, rest)) = l.split_once(": ") else {
            continue;
        };
        let Some(round) = head.strip_prefix("round ").and_then(|r| r.parse().ok()) else {
            continue;
        };
        let Some((key, rest)) = rest.split_once(" = ") else {
            continue;
        };
        let value = rest.split_whitespace().next().unwrap().parse().unwrap();
        let token = rest
            .split("token ")
            .nth(1)
            .unwrap()
            .split(',')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let node = rest
            .split("on ")
            .last()
            .unwrap()
            .trim_end_matches(')')
            .to_string();
        seen.entry(key.to_string())
            .or_default()
            .push((round, value, token, node));
    }
    assert_eq!(seen.len(), 4, "{text}");
    let pinned_to = text
        .lines()
        .find_map(|l| l.strip_prefix("pinned shard "))
        .and_then(|l| l.split(" to ").nth(1))
        .and_then(|l| l.split(' ').next())
        .expect("the example pinned alice's shard")
        .to_string();
    assert!(
        seen["alice"].iter().any(|r| r.0 == 3 && r.3 == pinned_to),
        "alice is served on {pinned_to} in round 3: {text}"
    );
    for (key, rows) in &seen {
        let values: Vec<u64> = rows.iter().map(|r| r.1).collect();
        assert_eq!(values, [1, 2, 3, 4, 5, 6], "{key}: {text}");
        assert!(
            rows.windows(2).all(|w| w[0].2 <= w[1].2),
            "{key}: tokens never go back"
        );
        assert!(
            rows.iter().filter(|r| r.0 > 3).all(|r| r.3 != killed),
            "{key}: served by the killed node after the kill: {text}"
        );
    }
}
