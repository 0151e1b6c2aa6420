//! Placement at join: the settings that decide where an entity lives
//! must be the same on every member; a node whose settings differ is refused at join.
//! (A test binary of its own: it does not load the machine while cluster.rs's timing
//! tests run.)

use tenure_test_kit::cli;

use std::time::Duration;

use cli::cluster::{Cluster, Options, TestCluster};

fn status_of(c: &Cluster, viewer: usize, addr: &str) -> Option<String> {
    c.members(viewer)?
        .into_iter()
        .find(|m| m.addr == addr)
        .map(|m| m.status)
}

/// Issue 15, item 6: a node whose settings place entities differently (here another
/// `number-of-shards`) would run an entity under another shard lease than the cluster's
/// nodes do. It is refused at join, naming the key and both values, and never counts as a
/// member anywhere.
#[test]
fn a_node_with_another_number_of_shards_is_refused_at_join() {
    let mut c = Cluster::start(2);
    let other = Options {
        tail: "[sharding]\nnumber-of-shards = 30\n".into(),
        ..Options::default()
    };
    let seed = c.nodes[0].addr.clone();
    let i = c.add_node(&seed, &other);
    c.spawn(i);
    let status = c.wait_exit(i, Duration::from_secs(30));
    let err = c.nodes[i].stderr();
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{err}");
    assert!(
        err.contains("refused to join the cluster: `sharding.number-of-shards` is 30 on this node but 100 on member"),
        "{err}"
    );
    let addr = c.nodes[i].addr.clone();
    let h = c.history();
    assert!(
        h.iter()
            .any(|e| e["event"] == "node_refused" && e["node"] == addr.as_str()),
        "the refusal is in the history"
    );
    let up_anywhere: Vec<_> = h
        .iter()
        .filter(|e| e["event"] == "member_up" && e["member"] == addr.as_str())
        .collect();
    assert!(up_anywhere.is_empty(), "never up: {up_anywhere:?}");
    for viewer in 0..2 {
        assert!(
            status_of(&c, viewer, &addr).is_none_or(|s| s != "up"),
            "node {viewer} does not count it"
        );
    }
    cli::assert_checked(&c.history);
}

/// Two nodes with different placements joining at once: each writes its member lease
/// before it lists the others', so at least one of them sees the other and refuses itself;
/// they never both stay.
#[test]
fn two_nodes_with_different_placements_joining_at_once_never_both_stay() {
    let mut c = Cluster::new(1);
    let other = Options {
        tail: "[sharding]\nnumber-of-shards = 30\n".into(),
        ..Options::default()
    };
    let seed = c.nodes[0].addr.clone();
    c.add_node(&seed, &other);
    c.spawn(0);
    c.spawn(1);
    // Each takes its join ticket and member lease within a second or two; give the
    // refusal as long again to land.
    std::thread::sleep(Duration::from_secs(8));
    let mut refused = 0;
    for i in 0..2 {
        let err = c.nodes[i].stderr();
        if err.contains("refused to join the cluster: `sharding.number-of-shards`") {
            let status = c.wait_exit(i, Duration::from_secs(10));
            assert_eq!(status.and_then(|s| s.code()), Some(2), "{err}");
            refused += 1;
        }
    }
    assert!(refused >= 1, "at least one refused itself");
    let still: Vec<usize> = (0..2).filter(|i| c.is_running(*i)).collect();
    assert!(still.len() <= 1, "never both stay: {still:?}");
    cli::assert_checked(&c.history);
}
