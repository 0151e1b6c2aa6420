//! `tenure cluster shards` and `tenure cluster leases`: a node's shard map and leases, read
//! from its management endpoint.
//!
//! Why the management endpoint and not the cluster protocol that `tenure cluster members`
//! speaks: the leases a node holds are known to its lease provider's observers (the
//! endpoint's lease table), and its entity types to whoever started their regions (the
//! endpoint serves them), not to the node's cluster agent, the only actor a client can
//! reach through the cluster protocol. Asking the endpoint keeps one implementation of both
//! queries (the CLI prints exactly the endpoint's JSON, decoded into the same types), needs
//! no cookie or TLS files, and adds no cluster message. The cost: `--node` is the node's
//! management address (`cluster.management.bind`), and the endpoint must be enabled.

use std::time::Duration;

use http_body_util::BodyExt;
use hyper::StatusCode;
use serde::de::DeserializeOwned;
use tenure::cluster::NodeAddr;
use tenure::sharding::ShardMap;
use tenure_management::LeaseRow;

use crate::exit::{CliError, Outcome};

/// How long a query waits for the endpoint (it waits up to 3 s for the shard map itself).
const TIMEOUT: Duration = Duration::from_secs(10);

/// `method path` on the endpoint at `node` (with `bearer` as its `Authorization`), bounded
/// by [`TIMEOUT`]: the answer's status and body. `Err` names the endpoint and what failed.
async fn exchange(
    node: &str,
    method: hyper::Method,
    path: &str,
    bearer: Option<&str>,
) -> Result<(StatusCode, hyper::body::Bytes), CliError> {
    let addr = NodeAddr::parse("--node", node)?;
    let fail = |detail: String| {
        CliError::Command(format!(
            "management endpoint {addr} (cluster.management.bind; is cluster.management.enabled on?): {detail}"
        ))
    };
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr.to_string())
            .await
            .map_err(|e| fail(format!("cannot connect: {e}")))?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| fail(e.to_string()))?;
        tokio::spawn(connection);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, addr.to_string());
        if let Some(token) = bearer {
            request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request
            .body(http_body_util::Empty::<hyper::body::Bytes>::new())
            .map_err(|e| fail(e.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| fail(e.to_string()))?
            .to_bytes();
        Ok::<_, CliError>((status, body))
    };
    tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| fail(format!("no answer within {TIMEOUT:?}")))?
}

/// `GET path` on the endpoint at `node`, decoded as JSON.
async fn get_json<T: DeserializeOwned>(node: &str, path: &str) -> Result<T, CliError> {
    let (status, body) = exchange(node, hyper::Method::GET, path, None).await?;
    if status != StatusCode::OK {
        return Err(CliError::Command(format!(
            "management endpoint {node}: GET {path}: {status}: {}",
            String::from_utf8_lossy(&body).trim()
        )));
    }
    serde_json::from_slice(&body).map_err(|e| {
        CliError::Command(format!(
            "management endpoint {node}: GET {path}: unexpected answer: {e}"
        ))
    })
}

/// `tenure cluster pin-shard --node ADDR --type T --shard S (--to NODE | --unpin)`: pins a
/// shard to a node through the endpoint's token-guarded placement route (the token is
/// `cluster.management.token` of the config). Exit 0 when taken (the move began, or it
/// lives there already), 2 with the endpoint's reason otherwise.
pub async fn pin_shard(
    config: &tenure::TenureConfig,
    node: &str,
    type_name: &str,
    shard: &str,
    to: Option<&str>,
) -> Result<Outcome, CliError> {
    let path = match to {
        Some(to) => format!("/cluster/shards/{type_name}/{shard}/pin/{to}"),
        None => format!("/cluster/shards/{type_name}/{shard}/unpin"),
    };
    operate(config, node, &path, "placing a shard").await
}

/// `tenure cluster resize-daemon --node ADDR --daemon NAME --count N`: resizes a sharded
/// daemon process through the endpoint's token-guarded resize route. Exit 0 when taken
/// (the resize began, or it runs that many workers already), 2 with the endpoint's reason
/// otherwise (a count of 0 or above the daemon's number-of-shards, a resize in progress).
pub async fn resize_daemon(
    config: &tenure::TenureConfig,
    node: &str,
    daemon: &str,
    count: usize,
) -> Result<Outcome, CliError> {
    let path = format!("/cluster/daemons/{daemon}/resize/{count}");
    operate(config, node, &path, "resizing a daemon").await
}

/// POSTs to operator route `path` of the endpoint at `node` with the config's
/// `cluster.management.token`, and prints its answer; `what` names the action when the
/// token is missing.
async fn operate(
    config: &tenure::TenureConfig,
    node: &str,
    path: &str,
    what: &str,
) -> Result<Outcome, CliError> {
    let settings = tenure_management::ManagementSettings::from_config(config)?;
    let Some(token) = settings.token else {
        return Err(CliError::Command(format!(
            "{what} needs cluster.management.token (the bearer token of the endpoint's operator routes) in the config"
        )));
    };
    let (status, body) = exchange(node, hyper::Method::POST, path, Some(token.secret())).await?;
    let answer = String::from_utf8_lossy(&body).trim().to_string();
    if status.is_success() {
        println!("{answer}");
        Ok(Outcome::Success)
    } else {
        Err(CliError::Command(format!(
            "management endpoint {node}: POST {path}: {status}: {answer}"
        )))
    }
}

fn print_json<T: serde::Serialize>(value: &T) -> Result<(), CliError> {
    println!(
        "{}",
        serde_json::to_string(value).map_err(|e| CliError::Command(e.to_string()))?
    );
    Ok(())
}

/// `tenure cluster shards --node ADDR [--type T] [--json]`.
pub async fn shards(node: &str, type_name: Option<&str>, json: bool) -> Result<Outcome, CliError> {
    let maps: Vec<ShardMap> = match type_name {
        Some(t) => vec![get_json(node, &format!("/cluster/shards/{t}")).await?],
        None => get_json(node, "/cluster/shards").await?,
    };
    if json {
        print_json(&maps)?;
    } else if maps.is_empty() {
        println!("no entity types on this node");
    } else {
        for map in &maps {
            print!("{}", render_shards(map));
        }
    }
    Ok(Outcome::Success)
}

/// `tenure cluster leases --node ADDR [--json]`.
pub async fn leases(node: &str, json: bool) -> Result<Outcome, CliError> {
    let rows: Vec<LeaseRow> = get_json(node, "/leases").await?;
    if json {
        print_json(&rows)?;
    } else {
        print!("{}", render_leases(node, &rows));
    }
    Ok(Outcome::Success)
}

fn render_shards(map: &ShardMap) -> String {
    let source = if map.from_coordinator {
        "homes from the coordinator"
    } else {
        "no coordinator answered: homes as this node last learned them"
    };
    let mut out = format!(
        "shard map of `{}` from {} ({source}): {} shards\n",
        map.type_name,
        map.node,
        map.shards.len()
    );
    out.push_str(&format!("{:<24} {:>6}\n", "NODE", "SHARDS"));
    for r in &map.regions {
        out.push_str(&format!("{:<24} {:>6}\n", r.node, r.shards));
    }
    out.push_str(&format!(
        "{:<8} {:<24} {:>20} {:>8}  {}\n",
        "SHARD", "HOME", "TOKEN", "ENTITIES", "IDS"
    ));
    for s in &map.shards {
        let home = s.home.as_deref().unwrap_or("?");
        let (token, count, ids) = match &s.hosted {
            Some(h) => (
                h.token
                    .map(|t| t.to_string())
                    .unwrap_or_else(|| "acquiring".into()),
                h.entities.len().to_string(),
                h.entities.join(" "),
            ),
            None => ("-".into(), "-".into(), String::new()),
        };
        out.push_str(&format!(
            "{:<8} {:<24} {:>20} {:>8}  {}\n",
            s.shard, home, token, count, ids
        ));
    }
    out
}

fn render_leases(node: &str, rows: &[LeaseRow]) -> String {
    let mut out = format!("leases of the node with endpoint {node}: {}\n", rows.len());
    out.push_str(&format!(
        "{:<48} {:<12} {:>20} {:>10}  {}\n",
        "LEASE", "STATE", "TOKEN", "FOR", "OWNER"
    ));
    for r in rows {
        let token = r.token.map(|t| t.to_string()).unwrap_or_else(|| "-".into());
        let since = format!("{:.1}s", r.for_ms as f64 / 1000.0);
        out.push_str(&format!(
            "{:<48} {:<12} {:>20} {:>10}  {}",
            r.lease,
            r.state.as_str(),
            token,
            since,
            r.owner
        ));
        if let Some(e) = &r.error {
            out.push_str(&format!("  ({e})"));
        }
        out.push('\n');
    }
    out
}
