//! The HTTP server (axum) and its routes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tenure_cluster::{
    ClusterEvent, ClusterSubscriber, Inspector, MemberStatus, Node, Operator, Readiness,
};
use tenure_sharding::ShardRegion;
use tokio::task::JoinHandle;

use crate::leases::LeaseTable;
use crate::serve::{Hosts, Limits, OpenConnections, doors, serve};
use crate::settings::ManagementSettings;

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManagementError {
    /// The bind address could not be listened on.
    #[error("management endpoint: cannot listen on {addr} (cluster.management.bind): {source}")]
    Bind {
        /// The address from `cluster.management.bind`.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The node stopped before the endpoint could follow its membership.
    #[error("management endpoint: {0}")]
    Node(String),
}

/// A running management endpoint; dropping it stops serving.
pub struct Management {
    addr: SocketAddr,
    task: JoinHandle<()>,
    regions: Regions,
    open: OpenConnections,
}

impl std::fmt::Debug for Management {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Management")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// The regions whose shard maps `/cluster/shards` serves, by entity type.
pub(crate) type Regions = Arc<Mutex<BTreeMap<String, ShardRegion>>>;

impl Drop for Management {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
pub(crate) struct Served {
    pub(crate) node: Inspector,
    pub(crate) operator: Operator,
    /// This endpoint's address, named as who asked in operators' requests.
    pub(crate) addr: SocketAddr,
    leases: LeaseTable,
    readiness: Readiness,
    pub(crate) settings: ManagementSettings,
    down: DownLog,
    regions: Regions,
}

/// This node has no region of the entity type asked for (a 404).
#[derive(Debug, thiserror::Error)]
#[error("no entity type `{type_name}` on this node (known: {})", known_types(.known))]
pub(crate) struct UnknownType {
    /// The type asked for.
    pub(crate) type_name: String,
    /// The types this node serves.
    pub(crate) known: Vec<String>,
}

fn known_types(known: &[String]) -> String {
    if known.is_empty() {
        "none".to_string()
    } else {
        known.join(", ")
    }
}

impl Served {
    /// This node's region of `type_name`, or [`UnknownType`] naming the types it serves.
    pub(crate) fn region(&self, type_name: &str) -> Result<ShardRegion, UnknownType> {
        let regions = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = regions.get(type_name) {
            return Ok(r.clone());
        }
        Err(UnknownType {
            type_name: type_name.to_string(),
            known: regions.keys().cloned().collect(),
        })
    }
}

/// Members that went down (crashed, frozen or cut off: not a graceful leave) and left the
/// view since the endpoint started, until they come back up.
#[derive(Clone, Default)]
struct DownLog(Arc<Mutex<BTreeMap<String, Instant>>>);

impl DownLog {
    fn subscriber(&self) -> ClusterSubscriber {
        let log = self.clone();
        ClusterSubscriber::new(move |event| {
            let mut down = log.0.lock().unwrap_or_else(|e| e.into_inner());
            match event {
                ClusterEvent::MemberRemoved(m) if m.status == MemberStatus::Down => {
                    down.insert(m.addr.to_string(), Instant::now());
                }
                ClusterEvent::MemberJoined(m) | ClusterEvent::MemberUp(m) => {
                    down.remove(&m.addr.to_string());
                }
                _ => {}
            }
            true
        })
    }

    fn rows(&self) -> Vec<serde_json::Value> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(addr, at)| {
                serde_json::json!({"addr": addr, "for_ms": at.elapsed().as_millis() as u64})
            })
            .collect()
    }
}

/// Installs the Prometheus recorder that `/metrics` renders as the process's `metrics`
/// recorder, once; call it before the node starts so that its first grants are counted
/// ([`Management::start`] calls it too). `false` when the program installed a recorder of
/// its own first (then `/metrics` says so).
pub fn install_metrics() -> bool {
    prometheus().is_some()
}

fn prometheus() -> Option<&'static PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok().map(|_| handle)
        })
        .as_ref()
}

impl Management {
    /// Serves `node`'s endpoint on `settings.bind` (port 0: any free port, see
    /// [`addr`](Management::addr)), with the leases `leases` keeps (see
    /// [`LeaseTable::observer`]). Installs a Prometheus `metrics` recorder for the process
    /// unless one is installed already. Requests must name a host it answers to (an IP
    /// address, `localhost`, `node`'s cluster host or one of `allowed-hosts`) and carry no
    /// body; connections are limited by `max-connections`, `max-header-bytes` and
    /// `idle-timeout` (see the crate's docs). `Err` when it cannot listen.
    pub async fn start(
        node: &Node,
        leases: LeaseTable,
        settings: ManagementSettings,
    ) -> Result<Management, ManagementError> {
        let bind = settings.bind;
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .map_err(|source| ManagementError::Bind { addr: bind, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| ManagementError::Bind { addr: bind, source })?;
        prometheus();
        let down = DownLog::default();
        node.subscribe(down.subscriber())
            .map_err(|e| ManagementError::Node(e.to_string()))?;
        let regions = Regions::default();
        let hosts = Hosts::new(&settings.allowed_hosts, &node.addr().host);
        let limits = Limits {
            max_connections: settings.max_connections,
            max_header_bytes: settings.max_header_bytes,
            idle_timeout: settings.idle_timeout,
        };
        node.readiness()
            .set_suspended_after(settings.ready_suspended_after);
        let served = Served {
            readiness: node.readiness().clone(),
            node: node.inspector(),
            operator: node.operator(),
            addr,
            leases,
            settings,
            down,
            regions: regions.clone(),
        };
        let app = Router::new()
            .route("/", get(page))
            .route("/health/alive", get(alive))
            .route("/health/ready", get(ready))
            .route("/cluster/members", get(members))
            .route(
                "/cluster/members/{addr}/leave",
                post(crate::operator::leave).fallback(crate::operator::post_only),
            )
            .route(
                "/cluster/members/{addr}/down",
                post(crate::operator::down).fallback(crate::operator::post_only),
            )
            .route("/cluster/shards", get(shard_maps))
            .route("/cluster/shards/{type_name}", get(shard_map_of))
            .route(
                "/cluster/shards/{type_name}/{shard}/pin/{addr}",
                post(crate::operator::pin).fallback(crate::operator::post_only),
            )
            .route(
                "/cluster/shards/{type_name}/{shard}/unpin",
                post(crate::operator::unpin).fallback(crate::operator::post_only),
            )
            .route(
                "/cluster/daemons/{name}/resize/{count}",
                post(crate::operator::resize).fallback(crate::operator::post_only),
            )
            .route("/leases", get(leases_of))
            .route("/metrics", get(metrics_text))
            .fallback(not_found)
            .with_state(served)
            .layer(axum::middleware::from_fn_with_state(hosts, doors));
        let open = OpenConnections::default();
        let task = tokio::spawn(serve(listener, app, limits, open.clone()));
        tracing::info!(%addr, "management endpoint serving");
        Ok(Management {
            addr,
            task,
            regions,
            open,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The connections it serves now (at most `max-connections`).
    pub fn open_connections(&self) -> usize {
        self.open.get()
    }

    /// Serves `region`'s shard map at `/cluster/shards` (and `/cluster/shards/<type>`),
    /// replacing an earlier region of the same entity type.
    pub fn add_region(&self, region: ShardRegion) {
        self.regions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(region.type_name().to_string(), region);
    }
}

/// The live page: members, shard map and leases of this node, redrawn twice a second.
async fn page() -> axum::response::Html<&'static str> {
    axum::response::Html(include_str!("page.html"))
}

async fn alive() -> &'static str {
    "alive\n"
}

async fn ready(State(s): State<Served>) -> Response {
    match s.readiness.check() {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(not) => unavailable(not.reason),
    }
}

fn unavailable(reason: String) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("not ready: {reason}\n"),
    )
        .into_response()
}

async fn members(State(s): State<Served>) -> Response {
    match s.node.view().await {
        Ok(view) => {
            let mut json = serde_json::to_value(view).unwrap_or_default();
            json["down"] = serde_json::Value::Array(s.down.rows());
            Json(json).into_response()
        }
        Err(e) => unavailable(format!("the node does not answer: {e}")),
    }
}

/// Every entity type's shard map, by type name.
async fn shard_maps(State(s): State<Served>) -> Response {
    let regions: Vec<ShardRegion> = s
        .regions
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .cloned()
        .collect();
    let timeout = s.settings.shard_map_timeout;
    let maps = futures::future::join_all(regions.iter().map(|r| r.shard_map(timeout)));
    match within(timeout, maps).await {
        Ok(maps) => match maps.into_iter().collect::<Result<Vec<_>, _>>() {
            Ok(maps) => Json(maps).into_response(),
            Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
        },
        Err(late) => late,
    }
}

/// `answer`, unless it takes longer than `timeout` (`shard-map-timeout`): then a 503 that
/// says so. A region's own waits are bounded per call; this bounds the request, whatever
/// the number of regions and shards.
async fn within<T>(
    timeout: std::time::Duration,
    answer: impl std::future::Future<Output = T>,
) -> Result<T, Response> {
    tokio::time::timeout(timeout, answer).await.map_err(|_| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the shard map did not come within cluster.management.shard-map-timeout ({timeout:?})\n"
            ),
        )
            .into_response()
    })
}

async fn shard_map_of(State(s): State<Served>, Path(type_name): Path<String>) -> Response {
    let region = match s.region(&type_name) {
        Ok(r) => r,
        Err(why) => return (StatusCode::NOT_FOUND, format!("{why}\n")).into_response(),
    };
    let timeout = s.settings.shard_map_timeout;
    match within(timeout, region.shard_map(timeout)).await {
        Ok(Ok(map)) => Json(map).into_response(),
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
        Err(late) => late,
    }
}

async fn leases_of(State(s): State<Served>) -> Response {
    Json(s.leases.rows()).into_response()
}

async fn metrics_text() -> Response {
    match prometheus() {
        Some(handle) => handle.render().into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "no metrics here: the program installed its own metrics recorder\n",
        )
            .into_response(),
    }
}

async fn not_found(uri: Uri) -> Response {
    (
        StatusCode::NOT_FOUND,
        format!(
            "no route {}: try /, /health/alive, /health/ready, /cluster/members, /cluster/shards, /leases, /metrics, or POST /cluster/members/{{host:port}}/leave or /down, /cluster/shards/{{type}}/{{shard}}/pin/{{host:port}} or /unpin, /cluster/daemons/{{name}}/resize/{{count}}\n",
            uri.path()
        ),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard map that never comes (a region or coordinator that does not answer) is
    /// answered 503 once shard-map-timeout has passed, not waited for.
    #[tokio::test(start_paused = true)]
    async fn a_shard_map_that_never_comes_is_answered_503_after_the_timeout() {
        let timeout = std::time::Duration::from_secs(3);
        let started = tokio::time::Instant::now();
        let late = within(timeout, std::future::pending::<()>())
            .await
            .unwrap_err();
        assert_eq!(late.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            started.elapsed(),
            timeout,
            "paused time: exactly the timeout"
        );
        assert_eq!(within(timeout, async { 7 }).await.ok(), Some(7));
    }
}
