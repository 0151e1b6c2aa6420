//! Availability during partitions, with the split brain resolver at its default
//! (lease-majority): 3 or 2 `tenure node` processes host the example sharded counter and
//! the ticker singleton, every node asks every key at a fixed rate (open loop) and probes
//! the singleton through its proxy every second. Service is judged *during* the fault, key
//! by key and node by node, from the requests recorded in the history; every history must
//! pass `tenure check`. The time from the fault to full service is printed (the partition
//! bench reports it over many runs); the tests assert service within the fault window.
//!
//! Which nodes the resolver downs under faults of a single link is protocol, checked in
//! the deterministic simulator on many seeds at these tests' timings
//! (`tenure-cluster`'s `sim::links` tests): a partial partition
//! (`a_partial_partition_downs_an_end_of_the_cut_link_and_the_middle_stays`), one-way loss
//! (`one_way_loss_downs_the_node_that_is_not_heard`), and a link flapping faster
//! (`a_link_flapping_faster_than_a_decision_downs_nobody`) or slower
//! (`a_link_flapping_slower_than_a_decision_never_downs_the_node_that_hears_everyone`)
//! than a decision. The faults here are those whose property is service through real
//! processes and sessions.

use tenure_test_kit::cli;

use std::time::Duration;

use cli::cluster::Cluster;
use cli::lives::shard_lives;
use cli::service::{
    ASK_TIMEOUT_NS, KEYS, full_service_after, loaded_cluster, now_ns, proxy_replies, served_keys,
    wait_all_keys_served,
};
use cli::shards::{live_shards, load_requests};
use tenure::history::Event;

/// How long a fault lasts. The harness's timing (unreachable-after 1.5 s, stable-after
/// 1.5 s, minority delay 1 s, member ttl 3 s) puts full service back within about 6 s; the
/// second half of the fault is where every key must be served.
const FAULT: Duration = Duration::from_secs(20);
const SERVED_FROM_NS: i64 = 10_000_000_000;

/// A copy of the cluster's history that outlives the test (for a failure message).
fn kept_history(c: &Cluster) -> String {
    let copy = std::env::temp_dir().join(format!(
        "tenure-partition-{}-{}.jsonl",
        std::process::id(),
        now_ns()
    ));
    let _ = std::fs::copy(&c.history, &copy);
    copy.display().to_string()
}

/// The nodes that neither downed themselves (or saw themselves down) nor were killed
/// between `from` and `to`.
fn stayed_up(c: &Cluster, from: i64, to: i64) -> Vec<usize> {
    let history = c.history();
    (0..c.nodes.len())
        .filter(|i| {
            !history.iter().any(|e| {
                e["node"] == c.nodes[*i].addr.as_str()
                    && ["sbr_down_self", "self_down", "killed"]
                        .iter()
                        .any(|k| e["event"] == *k)
                    && e["t"].as_i64().is_some_and(|t| t >= from && t <= to)
            })
        })
        .collect()
}

/// Waits out the fault and the asks issued in it, then judges service during the fault:
/// every key through every node in `survivors` and every other node that stayed up (a
/// node the resolver did not have to down must serve too), in the second half of the
/// fault, and the singleton through their proxies, answered from one of them.
fn assert_served_during(c: &Cluster, survivors: &[usize], fault: i64, what: &str) {
    let history = c.history();
    let requests = load_requests(&history);
    let end = fault + FAULT.as_nanos() as i64;
    let mut serving = survivors.to_vec();
    serving.extend(stayed_up(c, fault, end));
    serving.sort_unstable();
    serving.dedup();
    let nodes: Vec<String> = serving.iter().map(|i| c.nodes[*i].addr.clone()).collect();
    let back = full_service_after(&requests, &nodes, fault, end);
    eprintln!(
        "{what}: every key served from every surviving node again {back:?} s after the fault"
    );
    for addr in &nodes {
        let served = served_keys(
            &requests,
            addr,
            fault + SERVED_FROM_NS,
            end - ASK_TIMEOUT_NS,
        );
        let missing: Vec<String> = (0..KEYS)
            .map(|i| format!("key-{i}"))
            .filter(|k| !served.contains(k))
            .collect();
        assert!(
            missing.is_empty(),
            "{what}: keys never answered through {addr} in the second half of the fault: {missing:?} (history kept in {}):{}",
            kept_history(c),
            resolver_story(c)
        );
        let answered: Vec<&str> = proxy_replies(&history, addr, fault + SERVED_FROM_NS).collect();
        assert!(
            answered.iter().any(|from| nodes.iter().any(|n| n == from)),
            "{what}: the singleton did not answer {addr}'s proxy from a surviving node in the second half of the fault: {answered:?} (history kept in {}):{}",
            kept_history(c),
            resolver_story(c)
        );
    }
}

/// Runs one fault on a loaded cluster of `n` nodes: `fault` injects it, service is judged
/// on `survivors` during it, `heal` lifts it (if it can be lifted); then every node still
/// running must be up in every view and answer every key, and the history must pass
/// `tenure check`. Returns the cluster for more checks.
fn during(
    n: usize,
    what: &str,
    survivors: &[usize],
    fault: impl FnOnce(&mut Cluster),
    heal: impl FnOnce(&mut Cluster),
) -> Cluster {
    let mut c = loaded_cluster(n);
    let kept = shards_of(&c, survivors);
    let at = now_ns();
    let started = std::time::Instant::now();
    fault(&mut c);
    std::thread::sleep(
        (FAULT + Duration::from_nanos(ASK_TIMEOUT_NS as u64)).saturating_sub(started.elapsed()),
    );
    assert_served_during(&c, survivors, at, what);
    assert_kept(&c, &kept, at + FAULT.as_nanos() as i64, what);
    heal(&mut c);
    c.wait_converged(Duration::from_secs(30));
    let healed = now_ns();
    wait_all_keys_served(
        &c,
        healed,
        "after healing, every running node answers every key",
        Duration::from_secs(30),
    );
    cli::assert_checked(&c.history);
    c
}

/// The shard lives running on `nodes` now: (shard, node, token).
fn shards_of(c: &Cluster, nodes: &[usize]) -> Vec<(String, String, u64)> {
    live_shards(&c.history())
        .into_iter()
        .filter(|l| nodes.iter().any(|i| c.nodes[*i].addr == l.node))
        .map(|l| (l.subject, l.node, l.token))
        .collect()
}

/// The surviving side kept its own shards through the fault (a coordinator fail-over
/// included): none of those lives ended before `fault_end` (the end of the fault's window; the
/// check runs later, and what ends after the window is not the fault's doing), unless a
/// rebalance between survivors moved it (a `shard_moving` from its node while it lived).
fn assert_kept(c: &Cluster, kept: &[(String, String, u64)], fault_end: i64, what: &str) {
    assert!(
        !kept.is_empty(),
        "{what}: the survivors hosted shards before the fault"
    );
    let history = c.history();
    let lives = shard_lives(&history);
    for (shard, node, token) in kept {
        let life = lives
            .iter()
            .find(|l| l.subject == *shard && l.node == *node && l.token == *token)
            .expect("a life seen before the fault");
        let rebalanced = history.iter().any(|e| {
            e["event"] == "shard_moving"
                && e["shard"] == shard.as_str()
                && e["from"] == node.as_str()
                && e["t"]
                    .as_i64()
                    .is_some_and(|t| t >= life.start && life.end.is_some_and(|end| t <= end))
        });
        assert!(
            life.end.is_none_or(|t| t > fault_end) || rebalanced,
            "{what}: shard {shard} on surviving node {node} stopped during the fault: {life:?} (history kept in {}):{}",
            kept_history(c),
            resolver_story(c)
        );
    }
}

/// Whether node `i` recorded that it downed itself.
fn downed_itself(c: &Cluster, i: usize) -> bool {
    c.history()
        .iter()
        .any(|e| e["event"] == "sbr_down_self" && e["node"] == c.nodes[i].addr.as_str())
}

/// The resolver's story in the history, for a failure message: link faults, reachability
/// changes, the resolver lease's grants, downings (with why) and rejoins, one line each,
/// by node index, in seconds from the first link fault.
fn resolver_story(c: &Cluster) -> String {
    const TOLD: [&str; 9] = [
        "link_cut",
        "link_healed",
        "unreachable",
        "reachable",
        "sbr_downed",
        "sbr_down_self",
        "self_down",
        "sbr_rejoining",
        "lease_granted",
    ];
    let history = c.history();
    let index = |addr: &serde_json::Value| {
        addr.as_str()
            .and_then(|a| c.nodes.iter().position(|n| n.addr == a))
            .map_or_else(|| addr.to_string(), |i| format!("node {i}"))
    };
    let told: Vec<&serde_json::Value> = history
        .iter()
        .filter(|e| TOLD.iter().any(|k| e["event"] == *k))
        .filter(|e| {
            e["event"] != "lease_granted"
                || e["lease"].as_str().is_some_and(|l| l.ends_with("-sbr"))
        })
        .collect();
    let from = told
        .iter()
        .find(|e| e["event"] == "link_cut")
        .and_then(|e| e["t"].as_i64())
        .unwrap_or(0);
    let mut out = String::new();
    for e in told {
        let t = e["t"].as_i64().unwrap_or(0);
        out.push_str(&format!(
            "\n  {:+8.3} s {}: {}",
            (t - from) as f64 / 1e9,
            index(&e["node"]),
            e["event"].as_str().unwrap_or_default()
        ));
        for key in ["member", "fault", "strategy", "why", "owner"] {
            if !e[key].is_null() {
                let value = match key {
                    "member" | "owner" => index(&e[key]),
                    _ => e[key]
                        .as_str()
                        .map_or_else(|| e[key].to_string(), String::from),
                };
                out.push_str(&format!(" {key}={value}"));
            }
        }
    }
    out
}

/// The resolver downed every node of `went` and none of `stayed`; a failure tells the
/// resolver's story.
fn assert_downed(c: &Cluster, went: &[usize], stayed: &[usize], what: &str) {
    for i in went {
        assert!(
            downed_itself(c, *i),
            "{what}: node {i} never downed itself (history kept in {}):{}",
            kept_history(c),
            resolver_story(c)
        );
    }
    for i in stayed {
        assert!(
            !downed_itself(c, *i),
            "{what}: node {i} downed itself (history kept in {}):{}",
            kept_history(c),
            resolver_story(c)
        );
    }
}

#[test]
fn the_oldest_node_cut_off_downs_itself_and_the_others_serve_every_key_and_the_singleton() {
    // Node 0 is the oldest: it hosts the singleton and the coordinator.
    let c = during(
        3,
        "oldest node cut off",
        &[1, 2],
        |c| {
            c.set_link(0, 1, true);
            c.set_link(0, 2, true);
        },
        |c| {
            c.set_link(0, 1, false);
            c.set_link(0, 2, false);
        },
    );
    assert_downed(&c, &[0], &[1, 2], "oldest node cut off");
}

#[test]
fn the_youngest_node_dropped_off_downs_itself_and_the_others_serve() {
    let c = during(
        3,
        "youngest node's links dropped",
        &[0, 1],
        |c| {
            c.drop_link(2, 0);
            c.drop_link(2, 1);
        },
        |c| {
            c.set_link(2, 0, false);
            c.set_link(2, 1, false);
        },
    );
    assert_downed(&c, &[2], &[0, 1], "youngest node's links dropped");
}

#[test]
fn two_of_three_nodes_killed_at_once_leave_the_last_one_serving() {
    // The survivor is a minority: it waits acquire-lease-delay-for-minority, then wins the
    // free resolver lease.
    let c = during(
        3,
        "two of three nodes killed",
        &[2],
        |c| {
            c.kill(0);
            c.kill(1);
        },
        |_| {},
    );
    assert_downed(&c, &[], &[2], "two of three nodes killed");
}

#[test]
fn a_two_node_cluster_keeps_the_survivor_and_its_shards_when_the_oldest_crashes() {
    // Node 0 is the oldest: it hosts the coordinator, which fails over to node 1.
    let c = during(
        2,
        "2-node cluster, oldest killed",
        &[1],
        |c| c.kill(0),
        |_| {},
    );
    assert_downed(&c, &[], &[1], "2-node cluster, oldest killed");
}

#[test]
fn a_store_outage_longer_than_the_member_ttl_downs_every_node_and_all_rejoin_in_one_age_order() {
    let c = loaded_cluster(3);
    // The SQLite lease file write-locked for every node (a stuck writer, a backup): no
    // lease can be renewed or granted, so every node loses its member lease and stops what
    // it hosts; nobody can win the resolver lease either, and nobody needs to: every node
    // still hears every node.
    let lock = rusqlite::Connection::open(c.lease_store()).expect("open the lease file");
    lock.busy_timeout(Duration::from_secs(10))
        .expect("busy timeout");
    lock.execute_batch("BEGIN EXCLUSIVE")
        .expect("write-lock the lease file");
    c.record_about("store", Event::StoreLocked {});
    let locked = now_ns();
    std::thread::sleep(tenure_cli::demo::cluster::MEMBER_TTL * 3);
    lock.execute_batch("COMMIT").expect("unlock the lease file");
    c.record_about("store", Event::StoreUnlocked {});
    let history = c.history();
    for n in &c.nodes {
        assert!(
            history.iter().any(|e| e["event"] == "self_down"
                && e["node"] == n.addr.as_str()
                && e["t"].as_i64().is_some_and(|t| t > locked)),
            "{} saw itself down during the outage",
            n.addr
        );
    }
    assert!(
        !history.iter().any(|e| e["event"] == "sbr_down_self"),
        "the resolver downed nobody: the nodes kept hearing each other"
    );
    c.wait_converged(Duration::from_secs(30));
    // Every view orders the members the same way (new join tickets, one order).
    let orders: Vec<Vec<String>> = (0..3)
        .map(|i| {
            c.members(i)
                .expect("a view")
                .into_iter()
                .map(|m| m.addr)
                .collect()
        })
        .collect();
    assert!(
        orders.iter().all(|o| *o == orders[0]),
        "one age order after the outage: {orders:?}"
    );
    let healed = now_ns();
    wait_all_keys_served(
        &c,
        healed,
        "after the outage, every node answers every key",
        Duration::from_secs(30),
    );
    cli::assert_checked(&c.history);
}

#[test]
fn heartbeats_do_not_queue_behind_a_stalled_session_so_nobody_is_unreachable_or_downed() {
    // The sessions (TCP) between nodes 0 and 1 get stuck both ways, as behind a frame that
    // never finishes or in a middlebox, while their heartbeat datagrams flow and a new
    // connection would work. Heartbeats on the sessions alone would go silent and make 0
    // and 1 indirectly connected (a partial partition, as when the same gate holds the
    // datagrams too); with the datagrams every node keeps hearing every node:
    // nobody is marked unreachable, nobody is downed. The stuck sessions carry no
    // heartbeat for 3 x unreachable-after, so they are closed and dialled again: service
    // comes back during the fault.
    let c = loaded_cluster(3);
    let at = now_ns();
    c.stall_session(0, 1);
    // Longer than unreachable-after + stable-after + the minority's delay, twice over.
    std::thread::sleep(FAULT / 2);
    let end = now_ns();
    let history = c.history();
    // The sessions really stalled: asks through node 0 went unanswered (those for keys
    // whose shards live on node 1, or that the coordinator routes there).
    let requests = load_requests(&history);
    let unanswered = requests
        .iter()
        .filter(|r| r.node == c.nodes[0].addr && r.issued >= at && r.issued < end - ASK_TIMEOUT_NS)
        .filter(|r| !r.acked())
        .count();
    assert!(
        unanswered > 0,
        "the session stall held node 0's asks to node 1 (history kept in {})",
        kept_history(&c)
    );
    let unreachable: Vec<&serde_json::Value> = history
        .iter()
        .filter(|e| {
            ["unreachable", "sbr_downed", "sbr_down_self"]
                .iter()
                .any(|k| e["event"] == *k)
                && e["t"].as_i64().is_some_and(|t| t >= at && t <= end)
        })
        .collect();
    assert!(
        unreachable.is_empty(),
        "a stalled session made a node unreachable or downed one: {unreachable:?} (history kept in {})",
        kept_history(&c)
    );
    // Still during the fault: the stuck sessions were replaced.
    wait_all_keys_served(
        &c,
        now_ns(),
        "during the session stall, every node answers every key again",
        Duration::from_secs(30),
    );
    assert!(
        c.nodes[0].stderr().contains("closing a stale session")
            || c.nodes[1].stderr().contains("closing a stale session"),
        "a stuck session was closed"
    );
    c.set_link(0, 1, false);
    c.wait_converged(Duration::from_secs(30));
    let healed = now_ns();
    wait_all_keys_served(
        &c,
        healed,
        "after the session stall, every node answers every key",
        Duration::from_secs(30),
    );
    assert_downed(&c, &[], &[0, 1, 2], "session stall");
    cli::assert_checked(&c.history);
}
