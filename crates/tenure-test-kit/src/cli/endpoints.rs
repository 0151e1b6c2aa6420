//! Harness clusters with each node's management endpoint on: the launcher, each endpoint's
//! address (from the node's log) and plain HTTP/1.1 requests to it.

use std::net::SocketAddr;
use std::time::Duration;

use super::cluster::{Cluster, Options, TestCluster};
use crate::eventually;
pub use crate::http::request;

/// Starts `n` nodes with `options` and the management endpoint on (`management`: more lines
/// of `[cluster.management]`), each endpoint on port 0 (no port to race for: the node logs
/// the one it got, see [`endpoint_of`]). Returns without waiting for the nodes to converge.
pub fn start_with_endpoints(n: usize, options: &Options, management: &str) -> Cluster {
    let mut options = options.clone();
    options.tail.push_str(&format!(
        "\n[cluster.management]\nenabled = true\n{management}\n"
    ));
    let mut c = Cluster::with_options(n, &options);
    for node in &mut c.nodes {
        node.env.push((
            "TENURE_CLUSTER__MANAGEMENT__BIND".into(),
            "127.0.0.1:0".into(),
        ));
    }
    c.start_all();
    c
}

/// Node `i`'s management endpoint, from its log since its latest start (waits up to 30 s
/// for the line, then fails loudly with the log).
pub fn endpoint_of(c: &Cluster, i: usize) -> SocketAddr {
    eventually(
        &format!("node {i} logs its management endpoint"),
        Duration::from_secs(30),
        || {
            let log = c.nodes[i].stderr();
            log.lines()
                .find(|l| l.contains("management endpoint serving"))
                .and_then(|l| {
                    plain(l)
                        .split_once("addr=")?
                        .1
                        .split_whitespace()
                        .next()?
                        .parse()
                        .ok()
                })
                .ok_or(log)
        },
    )
}

/// `line` without terminal colour codes (SGR sequences, ESC [ … m).
pub fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(ch) = chars.next() {
        if ch == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(ch);
        }
    }
    out
}
