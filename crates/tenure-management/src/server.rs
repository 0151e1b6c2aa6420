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
use tenure_cluster::{ClusterEvent, ClusterSubscriber, Inspector, MemberStatus, Node, Operator};
use tenure_sharding::ShardRegion;
use tokio::task::JoinHandle;

use crate::leases::LeaseTable;
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

/// How long `/cluster/shards` waits for a region, its shards and the coordinator.
const SHARD_MAP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

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
    pub(crate) settings: ManagementSettings,
    down: DownLog,
    regions: Regions,
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
    /// unless one is installed already. `Err` when it cannot listen.
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
        let served = Served {
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
            .route("/leases", get(leases_of))
            .route("/metrics", get(metrics_text))
            .fallback(not_found)
            .with_state(served);
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(%addr, error = %e, "management endpoint stopped");
            }
        });
        tracing::info!(%addr, "management endpoint serving");
        Ok(Management {
            addr,
            task,
            regions,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
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
    let view = match s.node.view().await {
        Ok(view) => view,
        Err(e) => return unavailable(format!("the node does not answer: {e}")),
    };
    let me = view.members.iter().find(|m| m.addr == view.node);
    match me.map(|m| m.status) {
        Some(MemberStatus::Up) => {}
        status => {
            let status = status.map_or("not a member".to_string(), |s| format!("{s:?}"));
            return unavailable(format!("this node is not an up member: {status}"));
        }
    }
    let suspended = s.leases.suspended_for(s.settings.ready_suspended_after);
    if let Some(l) = suspended.first() {
        return unavailable(format!(
            "lease {} suspended for {} ms (renewals failing: {})",
            l.lease,
            l.for_ms,
            l.error.as_deref().unwrap_or("unknown")
        ));
    }
    (StatusCode::OK, "ready\n").into_response()
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
    let maps = futures::future::join_all(regions.iter().map(|r| r.shard_map(SHARD_MAP_TIMEOUT)));
    match maps.await.into_iter().collect::<Result<Vec<_>, _>>() {
        Ok(maps) => Json(maps).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    }
}

async fn shard_map_of(State(s): State<Served>, Path(type_name): Path<String>) -> Response {
    let region = {
        let regions = s.regions.lock().unwrap_or_else(|e| e.into_inner());
        match regions.get(&type_name) {
            Some(r) => r.clone(),
            None => {
                let known: Vec<&str> = regions.keys().map(String::as_str).collect();
                return (
                    StatusCode::NOT_FOUND,
                    format!(
                        "no entity type `{type_name}` on this node (known: {})\n",
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                )
                    .into_response();
            }
        }
    };
    match region.shard_map(SHARD_MAP_TIMEOUT).await {
        Ok(map) => Json(map).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
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
            "no route {}: try /, /health/alive, /health/ready, /cluster/members, /cluster/shards, /leases, /metrics, or POST /cluster/members/{{host:port}}/leave or /down\n",
            uri.path()
        ),
    )
        .into_response()
}
