//! The management endpoint of `tenure node` on 3-node clusters, over real HTTP and in a
//! real headless browser (Debian's `chromium`): every node is ready and lists the others
//! up; after a SIGKILL of one node, another node's live page shows it down, and the metrics
//! count the event. The shard map lists every allocated shard once across the cluster with
//! its home, the CLI prints what the endpoint answers, the live page draws the shard map,
//! and the operator routes refuse requests without the right token and down or remove a
//! member with it.

use tenure_test_kit::{cli, eventually};

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use cli::cluster::{Cluster, Options};
use cli::endpoints::{self, endpoint_of, start_with_endpoints};
use tenure::FencingToken;
use tenure::sharding::ShardMap;
use tenure_management::LeaseRow;

const CHROMIUM: &str = "/usr/bin/chromium";

/// How long what the endpoint answers may take to settle on a loaded machine.
const SLACK: Duration = Duration::from_secs(30);

/// The operator token of the second test's cluster.
const TOKEN: &str = "operator-secret";

/// `method path` on `addr` with an optional bearer token: status code and body.
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> Option<(u16, String)> {
    endpoints::request(addr, method, path, token, Duration::from_secs(15))
}

/// `GET path` on `addr`: status code and body.
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    request(addr, "GET", path, None)
}

/// `POST path` on `addr` with `token`: status code and body (the request must be answered).
fn post(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    request(addr, "POST", path, token)
        .unwrap_or_else(|| panic!("POST http://{addr}{path}: no answer"))
}

/// Polls until `done` holds on `GET path` (a bounded wait: a minute, then a loud failure).
fn until(addr: SocketAddr, path: &str, done: impl Fn(u16, &str) -> bool) -> String {
    eventually(
        &format!("the expected answer to GET http://{addr}{path}"),
        Duration::from_secs(60),
        || match get(addr, path) {
            Some((status, body)) if done(status, &body) => Ok(body),
            last => Err(last),
        },
    )
}

/// The page's DOM after its scripts ran, as rendered by headless chromium.
fn rendered(url: &str) -> String {
    assert!(
        std::path::Path::new(CHROMIUM).exists(),
        "{CHROMIUM} not found: install Debian's `chromium` (apt-get install -y chromium), as .ci/test.sh does"
    );
    let out = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=3000",
            "--dump-dom",
            url,
        ])
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A 3-node cluster hosting the sharded counter (each node loading `key-0` … `key-7`) with
/// the endpoint on, plus `management` in `[cluster.management]`, started and converged;
/// and each node's endpoint.
fn cluster_with_endpoints(management: &str) -> (Cluster, Vec<SocketAddr>) {
    let options = Options {
        tail: cli::shards::SHARDING.to_string(),
        node_args: ["--sharded-counter", "--load-keys", "8"]
            .map(String::from)
            .to_vec(),
        ..Options::default()
    };
    let c = start_with_endpoints(
        3,
        &options,
        &format!("ready-suspended-after = \"1s\"\n{management}"),
    );
    c.wait_converged(Duration::from_secs(60));
    let endpoints: Vec<SocketAddr> = (0..c.nodes.len()).map(|i| endpoint_of(&c, i)).collect();
    for endpoint in &endpoints {
        until(*endpoint, "/health/ready", |s, _| s == 200);
    }
    (c, endpoints)
}

#[test]
fn every_node_serves_its_endpoint_and_the_live_page_shows_a_killed_node_down() {
    let (mut c, endpoints) = cluster_with_endpoints("");
    for endpoint in &endpoints {
        assert_eq!(get(*endpoint, "/health/alive").map(|(s, _)| s), Some(200));
        until(*endpoint, "/health/ready", |s, _| s == 200);
        until(*endpoint, "/cluster/members", |s, b| {
            s == 200 && b.matches("\"Up\"").count() == 3
        });
    }
    let killed = c.nodes[2].addr.clone();
    let page = rendered(&format!("http://{}/", endpoints[0]));
    assert!(page.contains(&killed), "{page}");
    // Without a token configured, the operator routes are off, and say so.
    let (status, body) = post(
        endpoints[0],
        &format!("/cluster/members/{killed}/down"),
        Some(TOKEN),
    );
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("cluster.management.token is not configured"),
        "{body}"
    );

    let t0 = Instant::now();
    c.kill(2);
    until(endpoints[0], "/cluster/members", |s, b| {
        s == 200 && b.contains(&format!("\"down\":[{{\"addr\":\"{killed}\""))
    });
    let page = rendered(&format!("http://{}/", endpoints[0]));
    let row = page
        .split("<tr>")
        .find(|r| r.contains(&killed))
        .unwrap_or_else(|| panic!("no row of {killed}: {page}"));
    assert!(row.contains(">Down<"), "{row}");
    println!(
        "the live page showed {killed} down {:.1} s after its SIGKILL",
        t0.elapsed().as_secs_f64()
    );
    let (_, metrics) = get(endpoints[0], "/metrics").expect("metrics");
    assert!(
        metrics.contains("tenure_cluster_members{status=\"down\"} 1")
            || metrics.contains("tenure_cluster_events_total{kind=\"member_down\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("tenure_lease_grants_total"), "{metrics}");
    for sharding in [
        "tenure_sharding_asks_total{type=\"counter\",outcome=\"ok\"}",
        "tenure_sharding_shard_serving{type=\"counter\"",
        "tenure_sharding_entities{type=\"counter\"",
    ] {
        assert!(metrics.contains(sharding), "{sharding} in {metrics}");
    }
    c.stop_all(Duration::from_secs(10));
}

/// Every node's shard map of the counter, typed; `None` if a node does not answer 200.
fn shard_maps(endpoints: &[SocketAddr]) -> Option<Vec<ShardMap>> {
    endpoints
        .iter()
        .map(|e| {
            let (status, body) = get(*e, "/cluster/shards/counter")?;
            (status == 200).then(|| serde_json::from_str(&body).expect("a shard map"))
        })
        .collect()
}

/// The allocation (shard → home) when every node's map agrees with it: every node has the
/// coordinator's allocation, the same one, holding every shard of `expected`; and every
/// allocated shard is hosted (under a lease token) by exactly one node: its home. Else why
/// not.
fn agreed(
    maps: &[ShardMap],
    expected: &BTreeSet<String>,
) -> Result<BTreeMap<String, String>, String> {
    let homes = |m: &ShardMap| -> BTreeMap<String, Option<String>> {
        m.shards
            .iter()
            .map(|s| (s.shard.clone(), s.home.clone()))
            .collect()
    };
    let first = homes(&maps[0]);
    for m in maps {
        if !m.from_coordinator {
            return Err(format!("{}: no coordinator's allocation", m.node));
        }
        if homes(m) != first {
            return Err(format!("{} and {} disagree", maps[0].node, m.node));
        }
    }
    let allocation: BTreeMap<String, String> = first
        .into_iter()
        .map(|(shard, home)| Some((shard, home?)))
        .collect::<Option<_>>()
        .ok_or("a shard without a home")?;
    if let Some(missing) = expected.iter().find(|s| !allocation.contains_key(*s)) {
        return Err(format!("shard {missing} not allocated"));
    }
    for (shard, home) in &allocation {
        let hosts: Vec<&str> = maps
            .iter()
            .filter(|m| {
                m.hosted()
                    .any(|(e, h)| e.shard == *shard && h.token.is_some())
            })
            .map(|m| m.node.as_str())
            .collect();
        if hosts != [home.as_str()] {
            return Err(format!("shard {shard} (home {home}) hosted on {hosts:?}"));
        }
    }
    Ok(allocation)
}

/// Runs `tenure ARGS` with node 0's config; its stdout (it must succeed).
fn cli(c: &Cluster, args: &[&str]) -> String {
    let out = c.command(0, args).output().expect("run tenure");
    assert!(
        out.status.success(),
        "tenure {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The members of the view at `endpoint` as (address, status, age).
fn members_at(endpoint: SocketAddr) -> Option<Vec<(String, String, u64)>> {
    let (status, body) = get(endpoint, "/cluster/members")?;
    if status != 200 {
        return None;
    }
    let view: serde_json::Value = serde_json::from_str(&body).ok()?;
    view["members"]
        .as_array()?
        .iter()
        .map(|m| {
            Some((
                m["addr"].as_str()?.to_string(),
                m["status"].as_str()?.to_string(),
                m["age"].as_u64()?,
            ))
        })
        .collect()
}

/// Polls `endpoint`'s member view until `done` holds (a bounded wait that fails loudly).
fn until_members(
    endpoint: SocketAddr,
    what: &str,
    done: impl Fn(&[(String, String, u64)]) -> bool,
) {
    eventually(
        &format!("{what} in the view of {endpoint}"),
        Duration::from_secs(60),
        || match members_at(endpoint) {
            Some(members) if done(&members) => Ok(()),
            last => Err(last),
        },
    );
}

#[test]
fn the_shard_map_cli_queries_live_page_and_operator_routes() {
    let (mut c, endpoints) = cluster_with_endpoints(&format!("token = \"{TOKEN}\""));
    let addrs: Vec<String> = c.nodes.iter().map(|n| n.addr.clone()).collect();

    // Every loaded shard is allocated, and hosted exactly once, by its home.
    let expected: BTreeSet<String> = (0..8)
        .map(|i| tenure::sharding::shard_of(&format!("key-{i}"), 100))
        .collect();
    let allocation = eventually("the shard maps to agree", Duration::from_secs(90), || {
        agreed(&shard_maps(&endpoints).ok_or("no answer")?, &expected)
    });
    let (_, all) = get(endpoints[0], "/cluster/shards").expect("/cluster/shards");
    let all: Vec<ShardMap> = serde_json::from_str(&all).expect("shard maps");
    assert_eq!(all.len(), 1, "one entity type: {all:?}");
    assert_eq!(all[0].type_name, "counter");
    let (status, body) = get(endpoints[0], "/cluster/shards/nothing").expect("answer");
    assert_eq!(status, 404, "{body}");
    assert!(
        body.contains("nothing") && body.contains("counter"),
        "{body}"
    );

    // The CLI prints what the endpoint answers.
    let endpoint = endpoints[1].to_string();
    eventually(
        "tenure cluster shards --json = GET /cluster/shards",
        SLACK,
        || {
            let project =
            |maps: Vec<ShardMap>| -> Vec<(String, Option<String>, Option<Option<FencingToken>>)> {
                maps.into_iter()
                    .flat_map(|m| m.shards)
                    .map(|s| (s.shard, s.home, s.hosted.map(|h| h.token)))
                    .collect()
            };
            let printed: Vec<ShardMap> = serde_json::from_str(&cli(
                &c,
                &["cluster", "shards", "--node", &endpoint, "--json"],
            ))
            .map_err(|e| e.to_string())?;
            let (_, body) = get(endpoints[1], "/cluster/shards").ok_or("no answer")?;
            let served: Vec<ShardMap> = serde_json::from_str(&body).map_err(|e| e.to_string())?;
            let (printed, served) = (project(printed), project(served));
            (printed == served)
                .then_some(())
                .ok_or(format!("{printed:?} != {served:?}"))
        },
    );
    eventually(
        "tenure cluster shards prints every shard with its home",
        SLACK,
        || {
            let text = cli(&c, &["cluster", "shards", "--node", &endpoint]);
            if !text.contains(&format!("shard map of `counter` from {}", addrs[1])) {
                return Err(format!("no title in:\n{text}"));
            }
            let (_, body) = get(endpoints[1], "/cluster/shards/counter").ok_or("no answer")?;
            let map: ShardMap = serde_json::from_str(&body).map_err(|e| e.to_string())?;
            for s in &map.shards {
                let home = s.home.as_deref().unwrap_or("?");
                let printed = text
                    .lines()
                    .any(|l| l.starts_with(&format!("{} ", s.shard)) && l.contains(home));
                if !printed {
                    return Err(format!("shard {} on {home} in:\n{text}", s.shard));
                }
            }
            Ok(())
        },
    );
    eventually("tenure cluster leases --json = GET /leases", SLACK, || {
        let project =
            |rows: Vec<LeaseRow>| -> Vec<(String, String, &'static str, Option<FencingToken>)> {
                rows.into_iter()
                    .map(|r| (r.lease, r.owner, r.state.as_str(), r.token))
                    .collect()
            };
        let printed: Vec<LeaseRow> = serde_json::from_str(&cli(
            &c,
            &["cluster", "leases", "--node", &endpoint, "--json"],
        ))
        .map_err(|e| e.to_string())?;
        let (_, body) = get(endpoints[1], "/leases").ok_or("no answer")?;
        let served: Vec<LeaseRow> = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        let (printed, served) = (project(printed), project(served));
        (printed == served)
            .then_some(())
            .ok_or(format!("{printed:?} != {served:?}"))
    });
    let text = cli(&c, &["cluster", "leases", "--node", &endpoint]);
    let member_lease = format!("tenure-member-{}", addrs[1]);
    assert!(
        text.lines()
            .any(|l| l.starts_with(&member_lease) && l.contains("held")),
        "{member_lease} held in:\n{text}"
    );

    // The live page draws the shard map: every allocated shard, coloured by its home.
    let page = rendered(&format!("http://{}/", endpoints[0]));
    assert!(page.contains("data-type=\"counter\""), "{page}");
    assert_eq!(
        page.matches("data-home=\"").count(),
        allocation.len(),
        "one square per allocated shard: {page}"
    );
    for home in allocation.values().collect::<BTreeSet<_>>() {
        assert!(
            page.contains(&format!("data-home=\"{home}\"")),
            "{home} in {page}"
        );
    }

    // Operator routes: refused without the right token, a bad address or a non-member.
    let downed = addrs[2].clone();
    let down_path = format!("/cluster/members/{downed}/down");
    let (status, body) = post(endpoints[0], &down_path, None);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("Authorization: Bearer"), "{body}");
    let (status, body) = post(endpoints[0], &down_path, Some("not-the-token"));
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("wrong token"), "{body}");
    let (status, body) = post(endpoints[0], "/cluster/members/nowhere/down", Some(TOKEN));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("nowhere"), "{body}");
    let (status, body) = post(
        endpoints[0],
        "/cluster/members/127.0.0.1:1/leave",
        Some(TOKEN),
    );
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("not a member"), "{body}");
    let (status, body) = get(endpoints[0], &down_path).expect("answer");
    assert_eq!(status, 405, "{body}");

    // Down: the member's membership leaves the other views; it downs itself and, with
    // when-down = "rejoin", comes back as a new member.
    let members = members_at(endpoints[1]).expect("view");
    let age = members
        .iter()
        .find(|(a, _, _)| *a == downed)
        .map(|(_, _, age)| *age)
        .expect("the member to down is in the view");
    let (status, body) = post(endpoints[0], &down_path, Some(TOKEN));
    assert_eq!(status, 202, "{body}");
    for endpoint in &endpoints[..2] {
        until_members(*endpoint, "the downed membership leaves", |m| {
            !m.iter().any(|(a, _, g)| *a == downed && *g == age)
        });
    }
    until_members(
        endpoints[1],
        "the downed node rejoins as a new member",
        |m| {
            m.iter().filter(|(_, s, _)| s == "Up").count() == 3
                && m.iter().any(|(a, _, g)| *a == downed && *g != age)
        },
    );
    let history = c.history();
    assert!(
        history.iter().any(|e| e["event"] == "sbr_down_self"
            && e["node"] == downed.as_str()
            && e["why"]
                .as_str()
                .is_some_and(|w| w.contains("downed by an operator"))),
        "the downed node recorded why it went down: {:?}",
        history
            .iter()
            .filter(|e| e["node"] == downed.as_str()
                && e["event"].as_str().is_some_and(|k| k.contains("down")))
            .collect::<Vec<_>>()
    );
    assert!(
        history
            .iter()
            .any(|e| e["event"] == "operator_downed" && e["member"] == downed.as_str()),
        "the other nodes recorded the operator's down"
    );

    // Leave, asked of another node: the request is passed on, the member leaves and exits.
    let leaver = addrs[1].clone();
    let (status, body) = post(
        endpoints[0],
        &format!("/cluster/members/{leaver}/leave"),
        Some(TOKEN),
    );
    assert_eq!(status, 202, "{body}");
    let exit = c.wait_exit(1, Duration::from_secs(30));
    assert!(
        exit.is_some_and(|s| s.success()),
        "the leaver exits 0 after its leave: {exit:?}\n{}",
        c.nodes[1].stderr()
    );
    until_members(endpoints[0], "the leaver is gone", |m| {
        !m.iter().any(|(a, _, _)| *a == leaver)
    });
    let (_, view) = get(endpoints[0], "/cluster/members").expect("view");
    assert!(
        !view.contains(&format!("{{\"addr\":\"{leaver}\"")),
        "it left, not went down: {view}"
    );
    c.stop_all(Duration::from_secs(10));
}

/// External shard allocation through the endpoint and the CLI: a shard pinned to another
/// node moves there through the hand-off and stays there through the rebalances that
/// follow; bad input is refused with a reason naming the shard or the node, and nothing
/// moves; every move passes `tenure check`.
#[test]
fn pinning_a_shard_through_the_endpoint_and_the_cli_moves_it_and_keeps_it_there() {
    let (mut c, endpoints) = cluster_with_endpoints(&format!("token = \"{TOKEN}\""));
    let addrs: Vec<String> = c.nodes.iter().map(|n| n.addr.clone()).collect();
    let expected: BTreeSet<String> = (0..8)
        .map(|i| tenure::sharding::shard_of(&format!("key-{i}"), 100))
        .collect();
    let agreed_now = || {
        eventually("the shard maps to agree", Duration::from_secs(90), || {
            agreed(&shard_maps(&endpoints).ok_or("no answer")?, &expected)
        })
    };
    // Balanced (at most one shard apart, where rebalancing stops), so that nothing moves
    // while the refusals are checked.
    let allocation = eventually(
        "the shards balanced over the nodes",
        Duration::from_secs(90),
        || {
            let now = agreed(&shard_maps(&endpoints).ok_or("no answer")?, &expected)?;
            let per_node: Vec<usize> = addrs
                .iter()
                .map(|a| now.values().filter(|h| *h == a).count())
                .collect();
            let (most, least) = (per_node.iter().max(), per_node.iter().min());
            (most.zip(least).is_some_and(|(m, l)| m - l <= 1))
                .then_some(now)
                .ok_or(format!("{per_node:?}"))
        },
    );
    // Two loaded shards, each pinned to a node other than its home.
    let mut loaded = expected.iter();
    let (first, second) = (loaded.next().unwrap(), loaded.next().unwrap());
    let elsewhere = |shard: &str, allocation: &BTreeMap<String, String>| {
        addrs
            .iter()
            .find(|a| **a != allocation[shard])
            .unwrap()
            .clone()
    };
    let wait_home = |shard: &str, node: &str| {
        eventually(
            &format!("shard {shard} hosted by {node} only"),
            Duration::from_secs(60),
            || {
                let now = agreed(&shard_maps(&endpoints).ok_or("no answer")?, &expected)?;
                (now[shard] == node).then_some(()).ok_or(format!("{now:?}"))
            },
        )
    };

    // Refusals: no token, a shard the type does not have, an address that is not one, a
    // node that is not a member; an unknown type.
    let pin = |shard: &str, to: &str| format!("/cluster/shards/counter/{shard}/pin/{to}");
    let (status, _) = post(endpoints[0], &pin(first, &addrs[1]), None);
    assert_eq!(status, 401);
    let (status, body) = post(endpoints[0], &pin("100", &addrs[1]), Some(TOKEN));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("`100`") && body.contains("0 to 99"), "{body}");
    let (status, body) = post(endpoints[0], &pin(first, "not-an-address"), Some(TOKEN));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("not-an-address"), "{body}");
    let (status, body) = post(endpoints[0], &pin(first, "127.0.0.1:1"), Some(TOKEN));
    assert_eq!(status, 409, "{body}");
    assert!(
        body.contains("127.0.0.1:1") && body.contains(&format!("shard {first}")),
        "{body}"
    );
    let (status, body) = post(
        endpoints[0],
        &format!("/cluster/shards/nothing/{first}/pin/{}", addrs[1]),
        Some(TOKEN),
    );
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        agreed_now(),
        allocation,
        "a refused placement moves nothing"
    );

    // Through the endpoint.
    let target = elsewhere(first, &allocation);
    let (status, body) = post(endpoints[0], &pin(first, &target), Some(TOKEN));
    assert_eq!(status, 202, "{body}");
    wait_home(first, &target);
    let (status, body) = post(endpoints[1], &pin(first, &target), Some(TOKEN));
    assert_eq!(status, 200, "pinned where it lives: {body}");

    // Through the CLI (node 0's config holds the token).
    let now = agreed_now();
    let target2 = elsewhere(second, &now);
    let endpoint = endpoints[2].to_string();
    let out = cli(
        &c,
        &[
            "cluster",
            "pin-shard",
            "--node",
            &endpoint,
            "--type",
            "counter",
            "--shard",
            second,
            "--to",
            &target2,
        ],
    );
    assert!(out.contains("pinned"), "{out}");
    wait_home(second, &target2);
    let bad = c
        .command(
            0,
            &[
                "cluster",
                "pin-shard",
                "--node",
                &endpoint,
                "--type",
                "counter",
                "--shard",
                "nope",
                "--to",
                &target2,
            ],
        )
        .output()
        .expect("run tenure");
    assert_eq!(bad.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("`nope`") && stderr.contains("400"),
        "{stderr}"
    );

    // Rebalances (every second) leave both pinned shards where they are.
    std::thread::sleep(Duration::from_secs(4));
    let later = agreed_now();
    assert_eq!(
        (
            later[first.as_str()].as_str(),
            later[second.as_str()].as_str()
        ),
        (target.as_str(), target2.as_str()),
        "{later:?}"
    );
    let failed = c.stop_all(Duration::from_secs(20));
    assert!(failed.is_empty(), "nodes {failed:?} did not leave cleanly");
    cli::assert_checked(&c.history);
}

/// A sharded daemon resized through the CLI (one node running the demo's daemon `demo`
/// of 2 workers): up to 3 is taken; 0 and above the daemon's number-of-shards (100) are
/// refused with exit 2 and a reason naming the daemon and the count.
#[test]
fn resizing_a_daemon_through_the_cli() {
    let options = Options {
        node_args: vec!["--daemon".into(), "2".into()],
        ..Options::default()
    };
    let mut c = start_with_endpoints(1, &options, &format!("token = \"{TOKEN}\""));
    c.wait_converged(Duration::from_secs(60));
    let endpoint = endpoint_of(&c, 0);
    until(endpoint, "/health/ready", |s, _| s == 200);
    let node = endpoint.to_string();
    let resize = |count: &str| {
        [
            "cluster",
            "resize-daemon",
            "--node",
            &node,
            "--daemon",
            "demo",
            "--count",
            count,
        ]
        .map(String::from)
    };
    let args = resize("3");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = cli(&c, &args);
    assert!(out.contains("`demo`") && out.contains("3 workers"), "{out}");
    for bad in ["0", "101"] {
        let args = resize(bad);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let refused = c.command(0, &args).output().expect("run tenure");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("`demo`")
                && stderr.contains(&format!("{bad} workers"))
                && stderr.contains("400"),
            "{stderr}"
        );
    }
    let failed = c.stop_all(Duration::from_secs(20));
    assert!(failed.is_empty(), "nodes {failed:?} did not leave cleanly");
}
