//! The endpoint's doors: how connections are taken (at most `max-connections` at once,
//! closed after `idle-timeout` without a complete request head, heads of at most
//! `max-header-bytes`) and what every request must show (a `Host` this endpoint answers
//! to, no body). The process serving them holds the node's leases: a client that opens
//! connections and keeps them idle must not take its descriptors.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// How connections are taken.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Connections served at once.
    pub max_connections: usize,
    /// The largest request head, in bytes.
    pub max_header_bytes: usize,
    /// How long a connection may go without a complete request head.
    pub idle_timeout: Duration,
}

/// The connections being served now; shared with [`crate::Management`].
#[derive(Debug, Clone, Default)]
pub(crate) struct OpenConnections(Arc<AtomicUsize>);

impl OpenConnections {
    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Serves `app` on `listener` within `limits` until the task is aborted. A connection is
/// accepted only while fewer than `max-connections` are served: the others wait in the
/// kernel's listen queue, costing this process nothing.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    open: OpenConnections,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout)
        .max_header_size(limits.max_header_bytes)
        .keep_alive(true);
    let mut at_limit_told = false;
    loop {
        if slots.available_permits() == 0 && !at_limit_told {
            at_limit_told = true;
            tracing::warn!(
                max = limits.max_connections,
                "management endpoint: cluster.management.max-connections connections open; new ones wait"
            );
        }
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, most likely: wait rather than spin.
                tracing::warn!(error = %e, "management endpoint: cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if slots.available_permits() > 0 {
            at_limit_told = false;
        }
        open.0.fetch_add(1, Ordering::SeqCst);
        metrics::gauge!("tenure_management_connections").increment(1.0);
        let connection =
            http.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(app.clone()));
        let open = open.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(%peer, error = %e, "management endpoint: connection ended");
            }
            open.0.fetch_sub(1, Ordering::SeqCst);
            metrics::gauge!("tenure_management_connections").decrement(1.0);
            drop(slot);
        });
    }
}

/// The host names a request may name (besides IP addresses and `localhost`).
#[derive(Debug, Clone)]
pub(crate) struct Hosts(Arc<BTreeSet<String>>);

impl Hosts {
    /// `allowed` (lower case) and the node's cluster host.
    pub(crate) fn new(allowed: &[String], cluster_host: &str) -> Hosts {
        let mut names: BTreeSet<String> = allowed.iter().cloned().collect();
        names.insert(cluster_host.trim_end_matches('.').to_ascii_lowercase());
        Hosts(Arc::new(names))
    }

    /// Whether a request naming `authority` (`host` or `host:port`) is for this endpoint:
    /// an IP address (a page reaching the endpoint by DNS rebinding names its own host,
    /// never an address), `localhost`, or one of the names.
    pub(crate) fn admits(&self, authority: &str) -> bool {
        let host = host_of(authority);
        if host.parse::<IpAddr>().is_ok() {
            return true;
        }
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        host == "localhost" || self.0.contains(&host)
    }
}

/// The host part of `host`, `host:port`, `[v6]` or `[v6]:port`.
fn host_of(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => authority,
    }
}

/// Refuses a request that names a host this endpoint does not answer to (421), or that
/// has a body (413: no route takes one, and a body trickled in slowly would hold the
/// connection past `idle-timeout`). Both answers close the connection.
pub(crate) async fn doors(State(hosts): State<Hosts>, request: Request, next: Next) -> Response {
    let named = request
        .uri()
        .authority()
        .map(|a| a.as_str().to_string())
        .into_iter()
        .chain(
            request
                .headers()
                .get_all(header::HOST)
                .iter()
                .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned()),
        )
        .find(|h| !hosts.admits(h));
    if let Some(host) = named {
        return closing(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "this endpoint does not answer to host `{host}` (a page reaching it through DNS rebinding?): if it is yours, add it to cluster.management.allowed-hosts\n"
            ),
        );
    }
    let sized = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .is_some_and(|l| l.as_bytes() != b"0");
    if sized || request.headers().contains_key(header::TRANSFER_ENCODING) {
        return closing(
            StatusCode::PAYLOAD_TOO_LARGE,
            "no route of this endpoint takes a request body\n".to_string(),
        );
    }
    next.run(request).await
}

fn closing(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_admit_addresses_localhost_and_the_names_given() {
        let hosts = Hosts::new(&["ops.example".to_string()], "Node-A.internal");
        for ok in [
            "127.0.0.1",
            "127.0.0.1:8558",
            "10.1.2.3:80",
            "[::1]:8558",
            "[fe80::1]",
            "localhost",
            "LOCALHOST:8558",
            "localhost.",
            "ops.example",
            "ops.example:8080",
            "node-a.internal:8558",
        ] {
            assert!(hosts.admits(ok), "{ok}");
        }
        for refused in [
            "evil.example",
            "evil.example:8558",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "ops.example.evil",
            "",
        ] {
            assert!(!hosts.admits(refused), "{refused}");
        }
    }
}
