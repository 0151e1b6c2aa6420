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

/// `GET path` on the endpoint at `node`, decoded as JSON.
async fn get_json<T: DeserializeOwned>(node: &str, path: &str) -> Result<T, CliError> {
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
        let request = hyper::Request::get(path)
            .header(hyper::header::HOST, addr.to_string())
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
    let (status, body) = tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| fail(format!("no answer within {TIMEOUT:?}")))??;
    if status != StatusCode::OK {
        return Err(fail(format!(
            "GET {path}: {status}: {}",
            String::from_utf8_lossy(&body).trim()
        )));
    }
    serde_json::from_slice(&body).map_err(|e| fail(format!("GET {path}: unexpected answer: {e}")))
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
