//! Plain HTTP/1.1 requests to a node's management endpoint: one connection a request, the
//! status code and the body. Blocking ([`request`]) for the multi-process harness, and
//! awaiting ([`get`], [`post`]) for tests that run the node in their own tokio runtime.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// How long the awaiting requests wait to connect and between reads: slack for a loaded
/// machine (the endpoint answers in milliseconds), not a property of the tests.
const WAIT: Duration = Duration::from_secs(30);

/// `method path` on `addr` (HTTP/1.1, one connection, no body) with an optional bearer
/// token, waiting at most `wait` to connect and between reads: the status code and body,
/// or `None` when the endpoint did not answer (refused, closed, timed out).
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    wait: Duration,
) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, wait).ok()?;
    stream.set_read_timeout(Some(wait)).ok()?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let status = answer.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, answer.split_once("\r\n\r\n")?.1.to_string()))
}

/// [`request`] from async code (on a blocking thread, so the runtime's workers keep
/// serving the endpoint): the status code and body; panics naming the request when the
/// endpoint does not answer within 30 s.
pub async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> (u16, String) {
    let (method, path, token) = (
        method.to_string(),
        path.to_string(),
        token.map(str::to_string),
    );
    let what = format!("{method} http://{addr}{path}");
    tokio::task::spawn_blocking(move || request(addr, &method, &path, token.as_deref(), WAIT))
        .await
        .unwrap_or_else(|e| panic!("{what}: the request's thread failed: {e}"))
        .unwrap_or_else(|| panic!("{what}: no answer"))
}

/// `GET path` on `addr` (see [`call`]): the status code and body.
pub async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    call(addr, "GET", path, None).await
}

/// `POST path` on `addr` with the bearer token `token` (see [`call`]): the status code and
/// body.
pub async fn post(addr: SocketAddr, path: &str, token: &str) -> (u16, String) {
    call(addr, "POST", path, Some(token)).await
}
