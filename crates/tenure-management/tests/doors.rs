//! The endpoint's doors over real HTTP, on a one-node cluster: a request naming a foreign
//! host (a page reaching the endpoint through DNS rebinding) is refused with 421, heads
//! too large with 431 and bodies with 413; idle connections, new or kept alive, are closed
//! after `idle-timeout`; and many idle connections do not exhaust the endpoint: at most
//! `max-connections` are served at once, and a real request is served all the same.

use std::net::SocketAddr;
use std::time::Duration;

use tenure_management::LeaseTable;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod common;
use common::start_management;

const MAX_CONNECTIONS: usize = 4;

/// Sends `request` on a fresh connection and reads until the endpoint closes it: the
/// status code and the whole answer.
async fn exchange(addr: SocketAddr, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request.as_bytes()).await.unwrap();
    let answer = until_closed(&mut stream, request).await;
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"));
    (status, answer)
}

/// `GET path` naming `host`.
async fn get_as(addr: SocketAddr, host: &str, path: &str) -> (u16, String) {
    exchange(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    )
    .await
}

/// Everything the endpoint sends until it closes the connection; fails the test if it
/// keeps it open for a minute (a bound on the wait, not a timing assertion: the idle
/// timeout is 300 ms).
async fn until_closed(stream: &mut TcpStream, what: &str) -> String {
    let mut answer = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .unwrap_or_else(|_| panic!("the endpoint kept the connection open: {what:?}"));
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_refuses_foreign_hosts_and_survives_idle_connections() {
    let (node, provider) = tenure_test_kit::node::one_node(
        "management-doors-0123456789abcdef0",
        &format!(
            r#"[cluster.management]
enabled = true
bind = "127.0.0.1:0"
allowed-hosts = ["ops.example"]
max-connections = {MAX_CONNECTIONS}
max-header-bytes = 4096
idle-timeout = "300ms"
"#
        ),
    )
    .await;
    let management = start_management(&node, &provider, LeaseTable::default()).await;
    let addr = management.addr();
    let p = addr.port();

    // Hosts: addresses, localhost, the node's cluster host and the allowed names answer;
    // any other name is refused, also in an absolute request target.
    for host in [
        format!("127.0.0.1:{p}"),
        format!("localhost:{p}"),
        format!("[::1]:{p}"),
        "ops.example".to_string(),
        format!("OPS.example:{p}"),
    ] {
        let (status, answer) = get_as(addr, &host, "/health/alive").await;
        assert_eq!(status, 200, "{host}: {answer}");
    }
    for path in ["/cluster/members", "/leases", "/metrics", "/"] {
        let (status, answer) = get_as(addr, &format!("rebound.evil.example:{p}"), path).await;
        assert_eq!(status, 421, "{path}: {answer}");
        assert!(
            answer.contains("rebound.evil.example") && answer.contains("allowed-hosts"),
            "{answer}"
        );
    }
    let (status, answer) = exchange(
        addr,
        &format!(
            "GET http://evil.example:{p}/leases HTTP/1.1\r\nHost: 127.0.0.1:{p}\r\nConnection: close\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(status, 421, "{answer}");

    // A head larger than max-header-bytes, and a body.
    let (status, answer) = exchange(
        addr,
        &format!(
            "GET /health/alive HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Filler: {}\r\nConnection: close\r\n\r\n",
            "x".repeat(5000)
        ),
    )
    .await;
    assert_eq!(status, 431, "{answer}");
    let (status, answer) = exchange(
        addr,
        "POST /cluster/members/127.0.0.1:1/leave HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\nhello",
    )
    .await;
    assert_eq!(status, 413, "{answer}");

    // A connection that sends nothing is closed; so is one kept alive after a request.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert_eq!(until_closed(&mut silent, "silent").await, "");
    let mut kept = TcpStream::connect(addr).await.unwrap();
    kept.write_all(b"GET /health/alive HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let answer = until_closed(&mut kept, "kept alive").await;
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("alive\n"),
        "{answer}"
    );

    // Three times max-connections idle connections at once: at most max-connections are
    // served at any time (the rest wait to be accepted), every one is closed in turn, and
    // a request is served.
    let mut idle = Vec::new();
    for _ in 0..3 * MAX_CONNECTIONS {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    let closing = tokio::spawn(async move {
        for mut stream in idle {
            until_closed(&mut stream, "idle").await;
        }
    });
    let mut most = 0;
    while !closing.is_finished() {
        most = most.max(management.open_connections());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    closing.await.unwrap();
    assert!(most <= MAX_CONNECTIONS, "{most} connections served at once");
    let (status, answer) = get_as(addr, "127.0.0.1", "/health/alive").await;
    assert_eq!(status, 200, "{answer}");

    drop(management);
    node.leave().await.unwrap();
}
