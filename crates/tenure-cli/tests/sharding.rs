//! Multi-process sharding tests: 3 `tenure node` processes host the example sharded
//! counter (100 shards) while every node drives increments through its region. Faults:
//! SIGKILL, SIGSTOP past the ttl, a partition between one node and the others (all still
//! reach the store), a rolling restart; and rebalances under open-loop load when nodes
//! join a loaded one, where every key must stay reachable from every node. Every run's
//! history must pass `tenure check` (no shard alive on two nodes at overlapping times,
//! tokens increasing per shard, every entity inside its shard and its lease, no
//! stale-token write accepted) and no acknowledged increment may be lost.

use tenure_test_kit::cli;

use std::collections::BTreeSet;
use std::time::Duration;

use cli::cluster::{Cluster, TestCluster};
use cli::lives::shard_lives;
use cli::shards::{
    check_acks, idle_host, last_kill, live_shards, load_requests, open_loop_options,
    sharded_cluster, shards_at,
};
use tenure_cli::demo::FencedCounter;
use tenure_cli::demo::counter::counter_name;

/// Waits until every shard in `moved` runs (started after `after`) on a node other than
/// `from`.
fn wait_moved(c: &Cluster, moved: &BTreeSet<String>, from: usize, after: i64, limit: Duration) {
    let from = c.nodes[from].addr.clone();
    c.wait_until(
        &format!("the {} shards of {from} run elsewhere", moved.len()),
        limit,
        |c| {
            let lives = shard_lives(&c.history());
            moved.iter().all(|shard| {
                lives.iter().any(|l| {
                    l.subject == *shard && l.node != from && l.start > after && l.end.is_none()
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
    cli::assert_checked(&c.history);
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
    let mut c = sharded_cluster();
    // The oldest node also runs the coordinator: its successor rebuilds the allocation.
    let victim = 0;
    c.kill(victim);
    let history = c.history();
    let killed = last_kill(&history);
    // What it ran when it died: a rebalance may have moved a shard away just before.
    let moved = shards_at(&history, &c.nodes[victim].addr, killed);
    assert!(!moved.is_empty());
    wait_moved(&c, &moved, victim, killed, Duration::from_secs(40));
    wait_acks_after(&c, killed, 200);
    final_checks(&c);
}

#[test]
fn a_node_paused_past_the_ttl_stops_its_shards_on_resume_and_its_late_writes_are_refused() {
    let c = sharded_cluster();
    let victim = 1;
    c.pause(victim);
    let paused = now_ns();
    // What it ran when it froze: a rebalance may have moved a shard away just before.
    let moved = shards_at(&c.history(), &c.nodes[victim].addr, paused);
    // Its leases expire (ttl 3 s) and the others take its shards over.
    wait_moved(&c, &moved, victim, paused, Duration::from_secs(40));
    c.resume(victim);
    // On resume, its lease watchdog declares every lapsed grant lost: the shards stop.
    c.wait_until(
        "the resumed node stopped the shards it lost",
        Duration::from_secs(20),
        |c| {
            shard_lives(&c.history())
                .iter()
                .filter(|l| moved.contains(&l.subject))
                .filter(|l| l.node == c.nodes[victim].addr && l.start < paused)
                .all(|l| l.end.is_some())
        },
    );
    c.wait_converged(Duration::from_secs(30));
    wait_acks_after(&c, now_ns(), 100);
    final_checks(&c);
}

#[test]
fn a_node_cut_off_from_the_others_gives_its_shards_up_and_they_move_without_overlap() {
    let c = sharded_cluster();
    let victim = 2;
    c.set_link(victim, 0, true);
    c.set_link(victim, 1, true);
    let cut = now_ns();
    // What it ran when it was cut off (not a moment before: a rebalance may have moved a
    // shard away meanwhile, and a later move's life would not start after the cut).
    let moved = shards_at(&c.history(), &c.nodes[victim].addr, cut);
    // Both sides still reach the store: the split brain resolver downs the cut-off node
    // (the other side wins the resolver lease), which stops its shards and releases their
    // leases; the majority's coordinator moves them, and their new hosts wait for the
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
    let lives = shard_lives(&c.history());
    let not_handed_off: Vec<_> = lives
        .iter()
        .filter(|l| l.end.is_some() && l.why != "hand-off")
        .collect();
    assert!(
        not_handed_off.is_empty(),
        "every shard stop was a hand-off: {not_handed_off:?}"
    );
    final_checks(&c);
}

/// Shards, keys and open-loop load of the rebalance test: 24 keys reach all 9 shards; each
/// node asks every key once a second, each ask given 5 s. Every increment is a synchronous
/// write to one SQLite counter file that the three nodes take turns on: the load leaves
/// that file idle most of the time. At 2 and 4 asks a second, on a 2-core machine loaded
/// 4 to 7 times over, a node's writes waited seconds for their turn (its lease renewals,
/// in another file, stayed on time), and asks timed out on shards that had not moved, or
/// in the mailbox of an entity whose hand-off drain ran past `stop-timeout`.
const REBALANCE_SHARDS: usize = 9;
const REBALANCE_KEYS: usize = 24;
const LOAD_TIMEOUT_NS: i64 = 5_000_000_000;

/// After a shard moved, every key is still asked and answered from every node for this long
/// in the test's window of that move.
const AFTER_MOVE_NS: i64 = 2_000_000_000;

#[test]
fn rebalances_under_open_loop_load_keep_every_key_answered_from_every_node() {
    let options = open_loop_options(
        REBALANCE_SHARDS,
        REBALANCE_KEYS,
        1,
        "5s",
        "rebalance-interval = \"1s\"",
    );
    let mut c = Cluster::with_options(3, &options);
    // Node 0 alone hosts every shard, under its own load.
    c.spawn(0);
    c.wait_until(
        "node 0 hosts all 9 shards and its increments are acknowledged",
        Duration::from_secs(60),
        |c| {
            let h = c.history();
            live_shards(&h).len() == REBALANCE_SHARDS && h.iter().any(|e| e["event"] == "ack")
        },
    );
    // Two nodes join, with load of their own: the coordinator rebalances 9/0/0 to 3/3/3 in
    // rounds of one move (a tenth of 9 shards rounds down to one), each round following the
    // last as soon as its shard has moved, while all three nodes ask every key.
    let joined = now_ns();
    c.spawn(1);
    c.spawn(2);
    c.wait_converged(Duration::from_secs(30));
    c.wait_until(
        "the shards are rebalanced to 3 per node",
        Duration::from_secs(60),
        |c| {
            let live = live_shards(&c.history());
            live.len() == REBALANCE_SHARDS
                && c.nodes
                    .iter()
                    .all(|n| live.iter().filter(|l| l.node == n.addr).count() == 3)
        },
    );
    let balanced = now_ns();
    // Every request issued up to the end of the last window has ended (answered or timed
    // out) once its timeout passed.
    std::thread::sleep(Duration::from_nanos(
        (AFTER_MOVE_NS + LOAD_TIMEOUT_NS + 500_000_000) as u64,
    ));
    let history = c.history();
    // The moves: a shard stopped for a hand-off, and its next life (on another node).
    let mut lives: std::collections::BTreeMap<String, Vec<cli::lives::Life>> = Default::default();
    for l in shard_lives(&history) {
        lives.entry(l.subject.clone()).or_default().push(l);
    }
    let moves: Vec<(String, i64, i64)> = lives
        .iter()
        .flat_map(|(shard, list)| {
            list.iter()
                .zip(list.iter().skip(1))
                .filter_map(|(gone, next)| {
                    let stopped = gone.end?;
                    (gone.why == "hand-off" && stopped > joined && stopped < balanced)
                        .then(|| (shard.clone(), stopped, next.start))
                })
        })
        .collect();
    assert!(
        moves.len() >= 6,
        "at least 6 shards moved to the new nodes: {moves:?}"
    );
    let requests = load_requests(&history);
    let end = balanced + AFTER_MOVE_NS;
    // Availability during the change: no request from any node, for any key, went
    // unanswered from the join until after the last move.
    let unanswered: Vec<String> = tenure_cli::availability::issued_in(&requests, joined, end)
        .into_iter()
        .filter(|r| !r.acked())
        .map(|r| {
            format!(
                "{} key {} (shard {}) issued {} ms after the join: {}",
                r.node,
                r.entity,
                r.shard,
                (r.issued - joined) / 1_000_000,
                r.failure.as_deref().unwrap_or_default()
            )
        })
        .collect();
    assert!(
        unanswered.is_empty(),
        "{} of the requests issued during the rebalances got no answer, e.g.:\n{}",
        unanswered.len(),
        unanswered[..unanswered.len().min(20)].join("\n")
    );
    // Key by key, from every node: answered within the window of every move.
    for (shard, stopped, restarted) in &moves {
        let window =
            tenure_cli::availability::issued_in(&requests, *stopped, *restarted + AFTER_MOVE_NS);
        for node in &c.nodes {
            for i in 0..REBALANCE_KEYS {
                let key = format!("key-{i}");
                assert!(
                    window
                        .iter()
                        .any(|r| r.node == node.addr && r.entity == key && r.acked()),
                    "{key} got no answer on {} in the window of the move of shard {shard}",
                    node.addr
                );
            }
        }
    }
    let failed = c.stop_all(Duration::from_secs(20));
    assert!(failed.is_empty(), "nodes {failed:?} did not leave cleanly");
    final_checks(&c);
}

/// A node without load joins a loaded cluster, takes its share of shards, and leaves
/// gracefully again, three times. Asks of the other nodes that were on their way to it (or
/// relayed through it) while it left are answered: its region keeps the node until nothing
/// it accepted depends on it any more, and the other regions stop sending to it first.
#[test]
fn graceful_leaves_under_open_loop_load_lose_no_request_of_the_other_nodes() {
    const SHARDS: usize = 12;
    // Enough keys to reach all 12 shards (shards start on demand).
    const KEYS: usize = 65;
    // Each ask is given 5 s, as in the rebalance test: what is judged is that no request
    // is lost while a node leaves, not how fast its shards' hand-offs run on a loaded
    // 2-core machine (where a hand-off's drain, release and new grant took over 2 s).
    let options = open_loop_options(SHARDS, KEYS, 2, "5s", "rebalance-interval = \"1s\"");
    let mut c = Cluster::with_options(4, &options);
    idle_host(&mut c, 3);
    for i in 0..3 {
        c.spawn(i);
    }
    c.wait_converged(Duration::from_secs(30));
    // How many shards run on node `i`, when all of them run.
    let on = |c: &Cluster, i: usize| {
        let live = live_shards(&c.history());
        (live.len() == SHARDS).then(|| live.iter().filter(|l| l.node == c.nodes[i].addr).count())
    };
    c.wait_until("every shard runs", Duration::from_secs(60), |c| {
        on(c, 0).is_some()
    });
    let mut leaves = Vec::new();
    for round in 0..3 {
        if round == 0 {
            c.spawn(3);
        } else {
            c.restart(3);
        }
        c.wait_until("node 3 hosts shards", Duration::from_secs(60), |c| {
            on(c, 3).is_some_and(|n| n > 0)
        });
        let left = now_ns();
        assert!(c.stop(3).success(), "node 3 left cleanly");
        c.wait_until(
            "every shard runs on nodes 0-2",
            Duration::from_secs(60),
            |c| on(c, 3) == Some(0),
        );
        leaves.push((left, now_ns()));
    }
    // Every request issued during the last leave has ended.
    std::thread::sleep(Duration::from_nanos(
        (AFTER_MOVE_NS + LOAD_TIMEOUT_NS + 500_000_000) as u64,
    ));
    let requests = load_requests(&c.history());
    let leaver = c.nodes[3].addr.clone();
    let unanswered: Vec<String> = leaves
        .iter()
        .flat_map(|(left, back)| {
            tenure_cli::availability::issued_in(&requests, *left, *back + AFTER_MOVE_NS)
        })
        .filter(|r| r.node != leaver && !r.acked())
        .map(|r| {
            format!(
                "{} key {} (shard {}): {}",
                r.node,
                r.entity,
                r.shard,
                r.failure.as_deref().unwrap_or_default()
            )
        })
        .collect();
    assert!(
        unanswered.is_empty(),
        "requests issued while node 3 left got no answer:\n{}",
        unanswered.join("\n")
    );
    let failed = c.stop_all(Duration::from_secs(20));
    assert!(failed.is_empty(), "nodes {failed:?} did not leave cleanly");
    final_checks(&c);
}

/// Where each worker of the example daemon runs now: its last `entity_started` on a node
/// not followed by its `entity_stopped` there, with when it started.
fn live_workers(
    history: &[serde_json::Value],
) -> std::collections::BTreeMap<String, (String, i64)> {
    let mut live = std::collections::BTreeMap::new();
    for e in history {
        if e["type"] != "daemon-demo" {
            continue;
        }
        let (Some(entity), Some(node)) = (e["entity"].as_str(), e["node"].as_str()) else {
            continue;
        };
        match e["event"].as_str() {
            Some("entity_started") => {
                live.insert(
                    entity.to_string(),
                    (node.to_string(), e["t"].as_i64().unwrap_or(0)),
                );
            }
            Some("entity_stopped") if live.get(entity).is_some_and(|(n, _)| n == node) => {
                live.remove(entity);
            }
            _ => {}
        }
    }
    live
}

#[test]
fn a_killed_nodes_daemon_workers_run_elsewhere_with_no_traffic_but_keep_alives() {
    let workers = 6;
    let options = cli::cluster::Options {
        node_args: vec!["--daemon".to_string(), workers.to_string()],
        tail: cli::shards::SHARDING.to_string(),
        ..Default::default()
    };
    let mut c = Cluster::start_with(3, &options);
    c.wait_until("every daemon worker runs", Duration::from_secs(60), |c| {
        live_workers(&c.history()).len() == workers
    });
    let live = live_workers(&c.history());
    // The node running the most workers (the workers spread over the three nodes).
    let victim = (0..3)
        .max_by_key(|&i| live.values().filter(|(n, _)| *n == c.nodes[i].addr).count())
        .expect("three nodes");
    let from = c.nodes[victim].addr.clone();
    let moved: BTreeSet<String> = live
        .iter()
        .filter(|(_, (n, _))| *n == from)
        .map(|(w, _)| w.clone())
        .collect();
    assert!(!moved.is_empty(), "{from} runs no worker: {live:?}");
    c.kill(victim);
    let killed = now_ns();
    c.wait_until(
        &format!("the {} workers of {from} run elsewhere", moved.len()),
        Duration::from_secs(60),
        |c| {
            let live = live_workers(&c.history());
            moved.iter().all(|w| {
                live.get(w)
                    .is_some_and(|(n, started)| *n != from && *started > killed)
            })
        },
    );
    let now = live_workers(&c.history());
    eprintln!("workers of {from}: {moved:?}, killed at {killed}; now: {now:?}");
    assert_eq!(now.len(), workers, "every worker runs: {now:?}");
    cli::assert_checked(&c.history);
}
