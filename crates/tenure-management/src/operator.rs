//! The operator routes: `POST /cluster/members/{addr}/leave` and `/down`, the shard
//! placements `POST /cluster/shards/{type}/{shard}/pin/{addr}` and `.../unpin`, and a
//! sharded daemon's resize `POST /cluster/daemons/{name}/resize/{count}`, authenticated by
//! the bearer token `cluster.management.token`.
//!
//! | answer | when |
//! |---|---|
//! | 202 | the request was taken (a leave: the member leaves as on SIGTERM; a down: see [`Operator::down`](tenure_cluster::Operator::down)) |
//! | 400 | `{addr}` is not a `host:port` address |
//! | 401 | no `Authorization: Bearer …` header |
//! | 403 | the token is wrong, or none is configured (the routes are off) |
//! | 404 | `{addr}` is not a member in this node's view |
//! | 405 | not a POST |
//! | 409 | the member cannot do it now (already leaving, no session with it, its program takes no leave requests, not up) |
//! | 503 | the node did not answer |
//!
//! A placement (see `ShardRegion::pin_shard`) answers 202 when the shard's move began, 200
//! when it lives there already (or for an unpin), 400 for a shard id the type does not
//! have or an address that is not `host:port`, 404 for an entity type this node does not
//! serve, 409 when the coordinator refused (the node cannot take shards, the shard is
//! moving) and 503 when no coordinator answered; 401, 403 and 405 as above.
//!
//! A resize (see `tenure_sharding::daemon::resize`) answers 202 when it began (the old
//! workers stop, then the new ones start), 200 when the daemon runs that many workers
//! already, 400 for a count that is not a number, is 0 or is above the daemon's
//! `number-of-shards`, 404 for a daemon this node does not run, 409 when the coordinator
//! refused (a resize still in progress, the count could not be stored) and 503 when no
//! coordinator answered; 401, 403 and 405 as above.
//!
//! Every refusal's body says why.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tenure_cluster::{ClusterError, NodeAddr};
use tenure_sharding::ShardingError;

use crate::server::Served;

/// `POST /cluster/members/{addr}/leave`.
pub(crate) async fn leave(
    State(s): State<Served>,
    Path(addr): Path<String>,
    headers: HeaderMap,
) -> Response {
    act(s, &addr, &headers, Action::Leave).await
}

/// `POST /cluster/members/{addr}/down`.
pub(crate) async fn down(
    State(s): State<Served>,
    Path(addr): Path<String>,
    headers: HeaderMap,
) -> Response {
    act(s, &addr, &headers, Action::Down).await
}

/// How long a placement waits for the coordinator's answer.
const PLACEMENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `POST /cluster/shards/{type_name}/{shard}/pin/{addr}`.
pub(crate) async fn pin(
    State(s): State<Served>,
    Path((type_name, shard, addr)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    place(s, &type_name, &shard, Some(&addr), &headers).await
}

/// `POST /cluster/shards/{type_name}/{shard}/unpin`.
pub(crate) async fn unpin(
    State(s): State<Served>,
    Path((type_name, shard)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    place(s, &type_name, &shard, None, &headers).await
}

/// `POST /cluster/daemons/{name}/resize/{count}`.
pub(crate) async fn resize(
    State(s): State<Served>,
    Path((name, count)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Some(refusal) = refusal(&s, &headers) {
        return refusal;
    }
    let region = match s.region(&tenure_sharding::daemon::daemon_type(&name)) {
        Ok(r) => r,
        Err(why) => {
            return text(
                StatusCode::NOT_FOUND,
                format!("daemon `{name}` does not run on this node ({why})"),
            );
        }
    };
    let Ok(workers) = count.parse::<usize>() else {
        return text(
            StatusCode::BAD_REQUEST,
            format!("daemon `{name}`: `{count}` is not a number of workers"),
        );
    };
    match tenure_sharding::daemon::resize(&region, workers, PLACEMENT_TIMEOUT).await {
        Ok(true) => text(
            StatusCode::ACCEPTED,
            format!(
                "accepted: daemon `{name}` resizing to {workers} workers (the old ones stop first)"
            ),
        ),
        Ok(false) => text(
            StatusCode::OK,
            format!("daemon `{name}` runs {workers} workers already"),
        ),
        Err(e @ ShardingError::WorkerCount { .. }) => text(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e @ ShardingError::Resize { .. }) => text(StatusCode::CONFLICT, e.to_string()),
        Err(e) => text(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn place(
    s: Served,
    type_name: &str,
    shard: &str,
    to: Option<&str>,
    headers: &HeaderMap,
) -> Response {
    if let Some(refusal) = refusal(&s, headers) {
        return refusal;
    }
    let region = match s.region(type_name) {
        Ok(r) => r,
        Err(why) => return (StatusCode::NOT_FOUND, format!("{why}\n")).into_response(),
    };
    let done =
        match to {
            Some(to) => region
                .pin_shard(shard, to, PLACEMENT_TIMEOUT)
                .await
                .map(|moving| match moving {
                    true => (
                        StatusCode::ACCEPTED,
                        format!("accepted: shard {shard} of `{type_name}` pinned to {to}, moving"),
                    ),
                    false => (
                        StatusCode::OK,
                        format!("shard {shard} of `{type_name}` pinned to {to}, where it lives"),
                    ),
                }),
            None => region
                .unpin_shard(shard, PLACEMENT_TIMEOUT)
                .await
                .map(|()| {
                    (
                        StatusCode::OK,
                        format!("shard {shard} of `{type_name}` unpinned"),
                    )
                }),
        };
    match done {
        Ok((status, body)) => text(status, body),
        Err(e @ ShardingError::InvalidPlacement { .. }) => {
            text(StatusCode::BAD_REQUEST, e.to_string())
        }
        Err(e @ ShardingError::Placement { .. }) => text(StatusCode::CONFLICT, e.to_string()),
        Err(e) => text(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// Any other method on an operator route.
pub(crate) async fn post_only() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, "POST")],
        "operator routes take POST only\n",
    )
        .into_response()
}

#[derive(Clone, Copy)]
enum Action {
    Leave,
    Down,
}

async fn act(s: Served, addr: &str, headers: &HeaderMap, action: Action) -> Response {
    if let Some(refusal) = refusal(&s, headers) {
        return refusal;
    }
    let member = match NodeAddr::parse("member address", addr) {
        Ok(member) => member,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("{e}")),
    };
    let by = format!("management endpoint {}", s.addr);
    let (done, verb) = match action {
        Action::Leave => (s.operator.leave(&member, &by).await, "leaving"),
        Action::Down => (s.operator.down(&member, &by).await, "downed"),
    };
    match done {
        Ok(()) => text(StatusCode::ACCEPTED, format!("accepted: {member} {verb}")),
        Err(ClusterError::Operator { refusal, .. }) if refusal.is_not_a_member() => {
            text(StatusCode::NOT_FOUND, format!("{member}: {refusal}"))
        }
        Err(e @ ClusterError::Operator { .. }) => text(StatusCode::CONFLICT, e.to_string()),
        Err(e) => text(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// Checks the bearer token: the refusal to send, or `None` when it is right.
fn refusal(s: &Served, headers: &HeaderMap) -> Option<Response> {
    let Some(token) = &s.settings.token else {
        return Some(text(
            StatusCode::FORBIDDEN,
            "operator routes are off: cluster.management.token is not configured".into(),
        ));
    };
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Some(
            (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "missing `Authorization: Bearer <token>` (cluster.management.token)\n",
            )
                .into_response(),
        );
    };
    let presented = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match presented {
        None => Some(text(
            StatusCode::UNAUTHORIZED,
            "the Authorization header is not `Bearer <token>`".into(),
        )),
        Some(p) if token.matches(p) => None,
        Some(_) => Some(text(
            StatusCode::FORBIDDEN,
            "wrong token (not cluster.management.token)".into(),
        )),
    }
}

fn text(status: StatusCode, body: String) -> Response {
    (status, format!("{body}\n")).into_response()
}
