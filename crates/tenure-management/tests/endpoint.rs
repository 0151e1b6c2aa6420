//! The management endpoint of a real node (one-node cluster on an in-process store) over
//! real HTTP: liveness, the members, the member lease and metrics; readiness is off while
//! a sharding region has not registered with a coordinator, and turns off
//! while the store fails the node's renewals (its member lease suspended) and on again
//! once it heals; unknown paths get a 404 naming them; a node without entity types has an
//! empty shard map; an operator's leave is refused until the program awaits leave requests.

use std::net::SocketAddr;
use std::time::Duration;

use tenure_lease::MemoryStore;
use tenure_lease::memory::Fault;
use tenure_management::LeaseTable;
use tenure_test_kit::eventually_async;
use tenure_test_kit::http::{get, post};

mod common;
use common::start_management;

/// Polls `GET path` until `done` holds (at most a minute; each wait is a bounded poll, not
/// a timing assertion).
async fn until(addr: SocketAddr, path: &str, done: impl Fn(u16, &str) -> bool) -> String {
    eventually_async(
        &format!("the expected answer to GET {path}"),
        Duration::from_secs(60),
        async || match get(addr, path).await {
            (status, body) if done(status, &body) => Ok(body),
            last => Err(last),
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reports_members_leases_metrics_and_readiness_over_http() {
    assert!(tenure_management::install_metrics());
    let leases = LeaseTable::default();
    let (node, provider) = tenure_test_kit::node::start_node(
        |port| {
            let head = tenure_test_kit::node::memory_head("management-endpoint");
            format!(
                r#"{head}heartbeat-timeout = "6s"
heartbeat-interval = "300ms"
lease-operation-timeout = "200ms"
[cluster]
port = {port}
cookie = "management-test-0123456789abcdef0"
seeds = ["127.0.0.1:{port}"]
member-lease-ttl = "6s"
member-lease-interval = "300ms"
membership-interval = "200ms"
[cluster.management]
enabled = true
bind = "127.0.0.1:0"
ready-suspended-after = "300ms"
token = "management-secret"
"#
            )
        },
        |provider| provider.observe(leases.observer()),
    )
    .await;
    let port = node.addr().port;
    let management = start_management(&node, &provider, leases).await;
    let addr = management.addr();

    assert_eq!(get(addr, "/health/alive").await, (200, "alive\n".into()));
    until(addr, "/health/ready", |s, _| s == 200).await;
    // A region whose coordinator never answers (no node hosts its type): not serving.
    let orphan = tenure_sharding::start_on_node(&node, &provider, "orphan", None)
        .await
        .unwrap();
    let (status, reason) = get(addr, "/health/ready").await;
    assert_eq!(status, 503, "{reason}");
    assert!(reason.contains("region of `orphan`"), "{reason}");
    orphan.stop().await;
    drop(orphan);
    until(addr, "/health/ready", |s, _| s == 200).await;
    let members = until(addr, "/cluster/members", |s, b| {
        s == 200 && b.contains("\"Up\"")
    })
    .await;
    let view: serde_json::Value = serde_json::from_str(&members).unwrap();
    assert_eq!(view["members"].as_array().unwrap().len(), 1, "{members}");
    assert_eq!(
        view["members"][0]["addr"],
        format!("127.0.0.1:{port}"),
        "{members}"
    );
    let (status, body) = get(addr, "/leases").await;
    assert_eq!(status, 200);
    let rows: serde_json::Value = serde_json::from_str(&body).unwrap();
    let member_lease = format!("tenure-member-127.0.0.1:{port}");
    assert!(
        rows.as_array()
            .unwrap()
            .iter()
            .any(|r| r["lease"] == member_lease.as_str() && r["state"] == "held"),
        "{body}"
    );
    let (status, metrics) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(metrics.contains("tenure_lease_grants_total"), "{metrics}");
    assert!(metrics.contains("tenure_leases_held"), "{metrics}");
    assert!(
        metrics.contains("tenure_cluster_members{status=\"up\"} 1"),
        "{metrics}"
    );

    // The store fails every renewal: the member lease is suspended, the node not ready.
    let store = MemoryStore::shared("management-endpoint");
    store.set_fault(Fault::FailRenewals);
    let reason = until(addr, "/health/ready", |s, _| s == 503).await;
    assert!(
        reason.contains(&member_lease) && reason.contains("suspended"),
        "{reason}"
    );
    store.set_fault(Fault::None);
    until(addr, "/health/ready", |s, _| s == 200).await;

    let (status, page) = get(addr, "/").await;
    assert_eq!(status, 200);
    assert!(
        page.contains("/cluster/members") && page.contains("<table"),
        "{page}"
    );

    let (status, body) = get(addr, "/nope").await;
    assert_eq!(status, 404);
    assert!(body.contains("/nope"), "{body}");

    // No entity type was added: an empty shard map list, and a 404 naming none.
    assert_eq!(get(addr, "/cluster/shards").await, (200, "[]".into()));
    let (status, body) = get(addr, "/cluster/shards/counter").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        body, "no entity type `counter` on this node (known: none)\n",
        "{body}"
    );

    // A leave is refused while nothing awaits Node::leave_requested, and taken once
    // something does.
    let leave = format!("/cluster/members/127.0.0.1:{port}/leave");
    let (status, body) = post(addr, &leave, "management-secret").await;
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("leave_requested"), "{body}");
    let (by, (status, body)) = tokio::join!(
        node.leave_requested(),
        post(addr, &leave, "management-secret")
    );
    assert_eq!(status, 202, "{body}");
    assert_eq!(by, format!("management endpoint {addr}"));
    drop(management);
    node.leave().await.unwrap();
}
