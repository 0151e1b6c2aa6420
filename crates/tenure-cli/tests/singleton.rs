//! Multi-process singleton tests: the instance runs on the oldest node only under its
//! lease; SIGKILL, SIGSTOP past the ttl and graceful leave move it. Every run's history must
//! pass `tenure check`: no two instances alive at overlapping times (each inside its
//! node's hold of the lease), tokens increasing, and the fenced counter never accepting an
//! older token after a newer one.

use tenure_test_kit::cli;

use std::time::Duration;

use cli::cluster::{Cluster, Options, TestCluster};
use cli::lives::{Life, frozen, singleton_lives};

/// The instances of singleton `s1` the history shows, in start order.
fn instances(c: &Cluster) -> Vec<Life> {
    singleton_lives(&c.history(), "s1")
}

fn singleton_cluster(n: usize) -> Cluster {
    let options = Options {
        node_args: ["--singleton", "s1", "--tick", "50ms"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        ..Options::default()
    };
    // Node 0 first, the others once the singleton runs there: node 0 is then the oldest
    // member for good, so no hand-over at start-up (a node that saw itself up before an
    // older one would start the singleton and hand it over) adds an instance the tests do
    // not expect.
    let mut c = Cluster::with_options(n, &options);
    c.spawn(0);
    c.wait_until("the singleton runs", Duration::from_secs(15), |c| {
        !instances(c).is_empty()
    });
    for i in 1..n {
        c.spawn(i);
    }
    c.wait_converged(Duration::from_secs(30));
    c
}

fn host(c: &Cluster) -> usize {
    let running = instances(c)
        .into_iter()
        .rfind(|i| i.end.is_none())
        .expect("a running instance");
    c.nodes
        .iter()
        .position(|n| n.addr == running.node)
        .expect("host is a node")
}

fn running_on(c: &Cluster, node: usize, after_token: u64) -> bool {
    instances(c)
        .iter()
        .any(|i| i.node == c.nodes[node].addr && i.token > after_token && i.end.is_none())
}

#[test]
fn sigkill_of_the_host_moves_the_singleton_after_the_ttl() {
    let mut c = singleton_cluster(3);
    let first = host(&c);
    let token = instances(&c).last().unwrap().token;
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
    let instances = instances(&c);
    assert_eq!(instances.len(), 2, "{instances:?}");
    assert_eq!(instances[0].why, "killed");
    cli::assert_checked(&c.history);
}

#[test]
fn a_host_paused_past_the_ttl_finds_its_lease_lost_and_stops() {
    let c = singleton_cluster(3);
    let first = host(&c);
    let token = instances(&c).last().unwrap().token;
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
        instances(c)
            .iter()
            .any(|i| i.node == addr && i.token == token && i.end.is_some())
    });
    assert!(!frozen(&c.history(), &addr));
    let instances = instances(&c);
    let old = instances.iter().find(|i| i.token == token).unwrap();
    assert!(
        ["lease lost", "down", "no longer the oldest"]
            .iter()
            .any(|w| old.why.contains(w)),
        "stopped because its lease or its membership lapsed: {old:?}"
    );
    cli::assert_checked(&c.history);
}

#[test]
fn graceful_leave_hands_the_singleton_over() {
    let mut c = singleton_cluster(3);
    let first = host(&c);
    let token = instances(&c).last().unwrap().token;
    assert!(c.stop(first).success(), "{}", c.nodes[first].stderr());
    c.wait_until("the next oldest runs it", Duration::from_secs(15), |c| {
        (0..3)
            .filter(|i| *i != first)
            .any(|i| running_on(c, i, token))
    });
    let instances = instances(&c);
    let old = instances.iter().find(|i| i.token == token).unwrap();
    assert_eq!(old.why, "handing over", "{old:?}");
    let new = instances.last().unwrap();
    let gap_ms = (new.start - old.end.unwrap()) as f64 / 1e6;
    assert!(gap_ms >= 0.0, "no overlap: gap {gap_ms} ms");
    cli::assert_checked(&c.history);
}
