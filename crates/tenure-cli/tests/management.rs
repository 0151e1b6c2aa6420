//! The management endpoint of `tenure node` on a 3-node cluster, over real HTTP and in a
//! real headless browser (Debian's `chromium`): every node is ready and lists the others
//! up; after a SIGKILL of one node, another node's live page shows it down, and the metrics
//! count the event.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::{Cluster, Options, TestCluster, free_ports};

const CHROMIUM: &str = "/usr/bin/chromium";

/// `GET path` on `addr` (HTTP/1.1, one connection): status code and body.
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let status = answer.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, answer.split_once("\r\n\r\n")?.1.to_string()))
}

/// Polls until `done` holds on `GET path` (a bounded wait: a minute, then a loud failure).
fn until(addr: SocketAddr, path: &str, done: impl Fn(u16, &str) -> bool) -> String {
    let limit = Instant::now() + Duration::from_secs(60);
    while Instant::now() < limit {
        if let Some((status, body)) = get(addr, path)
            && done(status, &body)
        {
            return body;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("GET http://{addr}{path} never reached the expected answer");
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

#[test]
fn every_node_serves_its_endpoint_and_the_live_page_shows_a_killed_node_down() {
    let options = Options {
        tail: format!(
            "{}\n[cluster.management]\nenabled = true\nready-suspended-after = \"1s\"\n",
            common::shards::SHARDING
        ),
        node_args: ["--sharded-counter", "--load-keys", "8"]
            .map(String::from)
            .to_vec(),
        ..Options::default()
    };
    let mut c = Cluster::with_options(3, &options);
    let ports = free_ports(3);
    let endpoints: Vec<SocketAddr> = ports
        .iter()
        .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
        .collect();
    for (node, endpoint) in c.nodes.iter_mut().zip(&endpoints) {
        node.env.push((
            "TENURE_CLUSTER__MANAGEMENT__BIND".into(),
            endpoint.to_string(),
        ));
    }
    c.start_all();
    c.wait_converged(Duration::from_secs(60));
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
