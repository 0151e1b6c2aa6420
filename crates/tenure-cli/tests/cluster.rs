//! Multi-process cluster tests: membership, reachability, faults, leave, cookies.

use tenure_test_kit::cli;

use std::time::{Duration, Instant};

use cli::cluster::{Cluster, Options, TestCluster};
use serde_json::Value;

fn status_of(c: &Cluster, viewer: usize, addr: &str) -> Option<(String, bool, u64)> {
    c.members(viewer)?
        .into_iter()
        .find(|m| m.addr == addr)
        .map(|m| (m.status, m.reachable, m.incarnation))
}

fn events<'a>(history: &'a [Value], node: &str, event: &str, member: &str) -> Vec<&'a Value> {
    history
        .iter()
        .filter(|e| e["node"] == node && e["event"] == event && e["member"] == member)
        .collect()
}

/// The "done when": 5 nodes converge; SIGKILL is seen as down by all; SIGSTOP is
/// seen as unreachable and (after SIGCONT) the node is back; a restarted node is a new
/// incarnation.
#[test]
fn five_nodes_converge_and_survive_kill_pause_and_restart() {
    let mut c = Cluster::start(5);
    let views: Vec<_> = (0..5).map(|i| c.members(i).unwrap()).collect();
    for v in &views {
        assert_eq!(v.len(), 5, "{v:?}");
    }
    // Everyone agrees on the age order (who is oldest).
    let order = |v: &Vec<cli::cluster::Row>| v.iter().map(|m| m.addr.clone()).collect::<Vec<_>>();
    assert!(
        views.iter().all(|v| order(v) == order(&views[0])),
        "age order differs: {views:?}"
    );

    // SIGKILL node 4: every other node marks it down and drops it.
    let killed = c.nodes[4].addr.clone();
    let old_inc = status_of(&c, 0, &killed).unwrap().2;
    c.kill(4);
    c.wait_until(
        "all see the killed node gone",
        Duration::from_secs(20),
        |c| {
            (0..4).all(|i| {
                c.members(i)
                    .is_some_and(|m| m.iter().all(|m| m.addr != killed))
            })
        },
    );
    let h = c.history();
    for i in 0..4 {
        assert_eq!(
            events(&h, &c.nodes[i].addr, "member_down", &killed).len(),
            1,
            "node {i} saw it down once"
        );
    }

    // SIGSTOP node 3 past the member ttl: unreachable first, then down; after SIGCONT it
    // finds its lease lost (self-down) and joins again as the youngest member.
    let paused = c.nodes[3].addr.clone();
    c.pause(3);
    c.wait_until(
        "all see the paused node unreachable",
        Duration::from_secs(20),
        |c| (0..3).all(|i| status_of(c, i, &paused).is_none_or(|s| !s.1)),
    );
    c.wait_until(
        "all see the paused node down",
        Duration::from_secs(20),
        |c| {
            (0..3).all(|i| {
                c.members(i)
                    .is_some_and(|m| m.iter().all(|m| m.addr != paused))
            })
        },
    );
    c.resume(3);
    c.wait_converged(Duration::from_secs(30));
    let h = c.history();
    let self_downs = h
        .iter()
        .filter(|e| e["node"] == paused.as_str() && e["event"] == "self_down")
        .count();
    let lives: Vec<String> = h
        .iter()
        .filter(|e| e["node"] == paused.as_str() && e["event"] != "lease_renewed")
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        self_downs,
        1,
        "the resumed node knew it had been down, once:\n{}",
        lives.join("\n")
    );
    for i in 0..3 {
        let unreachable = events(&h, &c.nodes[i].addr, "unreachable", &paused);
        let down = events(&h, &c.nodes[i].addr, "member_down", &paused);
        assert!(!unreachable.is_empty() && !down.is_empty(), "node {i}");
        assert!(
            unreachable[0]["t"].as_i64() < down[0]["t"].as_i64(),
            "unreachable before down on node {i}"
        );
    }
    // Younger than every member that kept its membership: a survivor starved past its own
    // member ttl on a loaded machine rejoins too (with a younger age still), and is left
    // out of the comparison.
    let rejoined: Vec<&str> = (0..3)
        .map(|i| c.nodes[i].addr.as_str())
        .filter(|addr| {
            h.iter()
                .any(|e| e["node"] == *addr && e["event"] == "self_down")
        })
        .collect();
    let members = c.members(0).unwrap();
    let youngest = members
        .iter()
        .rev()
        .find(|m| m.addr == paused || !rejoined.contains(&m.addr.as_str()))
        .unwrap()
        .addr
        .clone();
    assert_eq!(
        youngest,
        paused,
        "a rejoined node is younger than every member that kept its membership (members {:?}, survivors that rejoined {rejoined:?})",
        members.iter().map(|m| &m.addr).collect::<Vec<_>>()
    );

    // Restart the killed node on the same address: a new incarnation joins.
    c.spawn(4);
    c.wait_converged(Duration::from_secs(30));
    let new_inc = status_of(&c, 0, &killed).unwrap().2;
    assert_ne!(new_inc, old_inc, "a restarted node is a new incarnation");
}

/// SIGSTOP shorter than the member ttl (10 s here): unreachable, then reachable again,
/// never down.
#[test]
fn a_short_pause_is_unreachable_then_reachable_not_down() {
    let options = Options {
        overrides: vec![("member-lease-ttl".into(), "\"10s\"".into())],
        ..Options::default()
    };
    let c = Cluster::start_with(3, &options);
    let paused = c.nodes[2].addr.clone();
    c.pause(2);
    c.wait_until(
        "both see the paused node unreachable",
        Duration::from_secs(8),
        |c| (0..2).all(|i| status_of(c, i, &paused).is_some_and(|s| !s.1)),
    );
    c.resume(2);
    c.wait_converged(Duration::from_secs(20));
    let h = c.history();
    for i in 0..2 {
        let node = &c.nodes[i].addr;
        assert!(
            !events(&h, node, "unreachable", &paused).is_empty(),
            "node {i}: unreachable"
        );
        assert!(
            !events(&h, node, "reachable", &paused).is_empty(),
            "node {i}: reachable again"
        );
        assert!(
            events(&h, node, "member_down", &paused).is_empty(),
            "node {i}: a pause within the ttl is not a crash"
        );
    }
    assert!(
        h.iter().all(|e| e["event"] != "self_down"),
        "nobody lost its member lease"
    );
}

/// Cutting the traffic between two nodes (TCP stays open) makes each unreachable to the
/// other only; healing restores it. Membership (via the store) is unaffected.
#[test]
fn a_cut_link_is_unreachable_on_both_sides_and_heals() {
    let c = Cluster::start(3);
    let (a, b) = (c.nodes[0].addr.clone(), c.nodes[1].addr.clone());
    c.set_link(0, 1, true);
    c.wait_until(
        "0 and 1 see each other unreachable",
        Duration::from_secs(10),
        |c| status_of(c, 0, &b).is_some_and(|s| !s.1) && status_of(c, 1, &a).is_some_and(|s| !s.1),
    );
    let third = c.nodes[2].addr.clone();
    assert!(
        status_of(&c, 0, &third).unwrap().1,
        "the third node stays reachable"
    );
    assert_eq!(
        status_of(&c, 0, &b).unwrap().0,
        "up",
        "a partition is not a crash: still up"
    );
    let view = c.view(0).unwrap();
    let cut = view["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["addr"] == b.as_str())
        .unwrap()["link_cut"]
        .clone();
    assert_eq!(cut, Value::Bool(true));
    c.set_link(0, 1, false);
    c.wait_converged(Duration::from_secs(15));
}

/// SIGTERM: the node leaves (peers see leaving, then removed, never down), exits 0 and
/// releases its member lease.
#[test]
fn graceful_leave_releases_the_member_lease() {
    let mut c = Cluster::start(3);
    let leaver = c.nodes[2].addr.clone();
    let status = c.stop(2);
    assert!(
        status.success(),
        "exit status {status:?}:\n{}",
        c.nodes[2].stderr()
    );
    c.wait_converged(Duration::from_secs(15));
    let h = c.history();
    for i in 0..2 {
        let node = &c.nodes[i].addr;
        assert_eq!(
            events(&h, node, "member_leaving", &leaver).len(),
            1,
            "node {i} saw it leaving"
        );
        let removed = events(&h, node, "member_removed", &leaver);
        assert_eq!(removed.len(), 1);
        assert_eq!(removed[0]["status"], "leaving");
        assert!(
            events(&h, node, "member_down", &leaver).is_empty(),
            "a leave is not a crash"
        );
    }
    let out = c
        .command(0, &["lease", "show", &format!("tenure-member-{leaver}")])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "member lease released: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A node with the wrong cookie shares the store but never becomes a member; both sides
/// log the refusal, and the CLI with the wrong cookie gets a clear error.
#[test]
fn a_wrong_cookie_never_joins() {
    let mut c = Cluster::new(2);
    let seed = c.nodes[0].addr.clone();
    let bad = c.add_node(&seed, &Options::default());
    let text = std::fs::read_to_string(&c.nodes[bad].config)
        .unwrap()
        .replace("harness-cookie-", "wrong-cookie-");
    std::fs::write(&c.nodes[bad].config, text).unwrap();
    c.spawn(0);
    c.spawn(1);
    c.wait_until("the good nodes converge", Duration::from_secs(20), |c| {
        (0..2).all(|i| {
            c.members(i)
                .is_some_and(|m| m.len() == 2 && m.iter().all(|m| m.status == "up" && m.reachable))
        })
    });
    c.spawn(bad);
    let bad_addr = c.nodes[bad].addr.clone();
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        for i in 0..2 {
            let m = c.members(i).unwrap();
            assert!(
                m.iter().all(|m| m.addr != bad_addr),
                "node {i} lists the wrong-cookie node: {m:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let refused = "session closed before authentication";
    assert!(
        c.nodes[bad].stderr().contains(refused),
        "bad node logs:\n{}",
        c.nodes[bad].stderr()
    );
    c.wait_until("the seed logs the refusal", Duration::from_secs(5), |c| {
        c.nodes[0].stderr().contains(refused)
    });
    assert!(
        c.nodes[0].stderr().contains("another cookie"),
        "the seed says why it ignores the lease"
    );
    let out = c
        .command(bad, &["cluster", "members", "--node", &seed])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&seed) && err.contains("cookie"), "{err}");
}

/// Six nodes on a ring of monitors where each watches only its 2 ring neighbours
/// (`monitored-by-nr-of-members = 2`): a SIGKILLed node is heartbeated by 2 nodes only, yet
/// every survivor sees it unreachable (the other 3 from the rows of its watchers, spread
/// as deltas along the ring) and then gone.
#[test]
fn on_a_ring_of_two_monitors_every_node_sees_a_killed_node_unreachable_and_gone() {
    let options = Options {
        cluster_extra: "monitored-by-nr-of-members = 2\n".into(),
        // Long enough that the unreachable rows reach every node before the lease lapses.
        overrides: vec![("member-lease-ttl".into(), "\"8s\"".into())],
        ..Options::default()
    };
    let mut c = Cluster::start_with(6, &options);
    let killed = c.nodes[5].addr.clone();
    c.kill(5);
    c.wait_until(
        "all see the killed node gone",
        Duration::from_secs(30),
        |c| {
            (0..5).all(|i| {
                c.members(i)
                    .is_some_and(|m| m.iter().all(|m| m.addr != killed))
            })
        },
    );
    let h = c.history();
    for i in 0..5 {
        assert!(
            !events(&h, &c.nodes[i].addr, "unreachable", &killed).is_empty(),
            "node {i} saw the killed node unreachable before it was gone"
        );
    }
}

/// A node whose process ends without the harness (here a SIGKILL from outside it) is no
/// longer counted as running, and a wait fails at once naming the node, how it ended and
/// its log's tail, instead of running out its time; reaped, it starts again.
#[test]
fn a_node_that_ended_by_itself_fails_waits_at_once_and_starts_again_once_reaped() {
    let mut c = Cluster::start(2);
    let pid = c.nodes[1].pid().expect("node 1 runs");
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("SIGKILL node 1");
    let started = Instant::now();
    while c.ended(1).is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the harness never saw node 1 end"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!c.is_running(1), "an ended node is not running");
    assert_eq!(c.ended(1), Some(cli::cluster::NodeEnd::Signaled(9)));
    // A limit no run reaches: the wait must give up because the node is gone, not time out.
    let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        c.wait_converged(Duration::from_secs(3600))
    }));
    let message = waited
        .expect_err("the wait cannot succeed with a node gone")
        .downcast::<String>()
        .map(|m| *m)
        .unwrap_or_default();
    assert!(
        message.contains("node 1") && message.contains("ended by itself: signal 9"),
        "the wait names the node and how it ended: {message}"
    );
    assert!(
        message.contains("its log ends:"),
        "with its log's tail: {message}"
    );
    let status = c.reap_ended(1).expect("node 1 ended");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9));
    assert_eq!(c.ended(1), None, "reaped");
    c.spawn(1);
    c.wait_converged(Duration::from_secs(30));
}
