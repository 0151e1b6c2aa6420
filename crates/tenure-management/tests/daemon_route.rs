//! The daemon resize route of the management endpoint on a real node (one-node cluster on
//! an in-process store) over real HTTP. A test binary of its own: the endpoint test checks
//! process-wide metrics that a second node in its process would change.

use std::time::Duration;

use tenure_management::LeaseTable;
use tenure_test_kit::http::{call, get, post};

mod common;
use common::start_management;

/// A worker that only runs.
struct Idle;

impl tenure_sharding::daemon::DaemonWorker for Idle {
    type State = ();

    async fn start(
        &self,
        _: usize,
        _: usize,
        _: &tenure_sharding::EntityContext,
    ) -> Result<(), ractor::ActorProcessingErr> {
        Ok(())
    }
}

/// `POST /cluster/daemons/{name}/resize/{count}`: 202 when the resize began, 409 while it
/// runs, 200 once the daemon runs that many; 400 naming the daemon and the count for 0,
/// above `number-of-shards` or not a number; 404 for a daemon the node does not run; 401
/// without the token and 405 for a GET.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_is_resized_through_its_route() {
    let (node, provider) = tenure_test_kit::node::start_node(
        |port| {
            let head = tenure_test_kit::node::memory_head("management-daemon-resize");
            format!(
                r#"{head}heartbeat-timeout = "6s"
heartbeat-interval = "300ms"
[cluster]
port = {port}
cookie = "management-resize-0123456789abcdef0"
seeds = ["127.0.0.1:{port}"]
member-lease-ttl = "6s"
member-lease-interval = "300ms"
[cluster.management]
enabled = true
bind = "127.0.0.1:0"
token = "management-secret"
[sharding]
retry-interval = "100ms"
[sharding.daemon-route]
number-of-shards = 4
"#
            )
        },
        |_| {},
    )
    .await;
    let management = start_management(&node, &provider, LeaseTable::default()).await;
    let addr = management.addr();
    let daemon = tenure_sharding::daemon::start_daemon(
        &node,
        &provider,
        "route",
        2,
        Idle,
        Duration::from_millis(100),
    )
    .await
    .unwrap();
    management.add_region(daemon.region().clone());
    let token = "management-secret";
    let resize = |count: &str| format!("/cluster/daemons/route/resize/{count}");

    // The coordinator has read the daemon's count from the store (until then a resize is
    // refused with 409, "try again").
    while daemon
        .current_count(Duration::from_secs(5))
        .await
        .ok()
        .flatten()
        .is_none()
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Up to 3: begun; asked again, refused while the old workers stop, then done.
    let (status, body) = post(addr, &resize("3"), token).await;
    assert_eq!(status, 202, "{body}");
    assert!(
        body.contains("`route`") && body.contains("3 workers"),
        "{body}"
    );
    let answered = loop {
        let (status, body) = post(addr, &resize("3"), token).await;
        match status {
            409 => assert!(body.contains("being resized"), "{body}"),
            _ => break (status, body),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(answered.0, 200, "{}", answered.1);
    assert_eq!(
        daemon
            .current_count(Duration::from_secs(5))
            .await
            .unwrap()
            .map(|c| c.count),
        Some(3)
    );

    // Bad counts name the daemon and the count.
    for bad in ["0", "5", "many"] {
        let (status, body) = post(addr, &resize(bad), token).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(
            body.contains("`route`") && body.contains(bad),
            "{bad}: {body}"
        );
    }
    let (status, body) = post(addr, "/cluster/daemons/nothing/resize/2", token).await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body.contains("daemon `nothing` does not run on this node (no entity type `")
            && body.contains("known: "),
        "{body}"
    );
    let (status, _) = call(addr, "POST", &resize("2"), None).await;
    assert_eq!(status, 401);
    assert_eq!(get(addr, &resize("2")).await.0, 405);
    daemon.stop().await;
    node.leave().await.unwrap();
}
