//! A sharded counter on a 3-node local cluster, driven from a fourth, proxy-only node.
//!
//! Run: `cargo run -p tenure-cli --example sharded_counter`. The program starts three node
//! processes (itself, in node mode) on 127.0.0.1 sharing a temp SQLite lease store; each
//! hosts the entity type `counter` (role `counter`, 16 shards: the demo's
//! [`tenure_cli::demo::counter`]). It then joins the cluster itself as a node without the
//! role (a proxy-only region) and increments a few keys through its region: each key's
//! entity runs on one node, under its shard's lease, and writes the counter file with that
//! lease's fencing token. After a few rounds it SIGKILLs a hosting node: that node's shards
//! move to the others once their leases expire (3 s), and the counting goes on from where it
//! stopped. Before the kill it pins alice's shard to the third node (an operator's
//! placement) and lets it go again after one round.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tenure::TenureConfig;
use tenure::cluster::{ClusterSettings, Node};
use tenure::sharding::{ShardRegion, entity_factory};
use tenure_cli::demo::FencedCounter;
use tenure_cli::demo::counter::{Counter, CounterRequest};
use tenure_cli::demo::example_nodes::{free_ports, node_mode, spawn_node, stop_nodes};

const KEYS: [&str; 4] = ["alice", "bob", "carol", "dave"];

fn config(dir: &Path, port: u16, seed: u16, roles: &str) -> String {
    format!(
        r#"[tenure]
default-lease-section = "sqlite"
[lease.sqlite]
path = "{dir}/leases.sqlite"
heartbeat-timeout = "3s"
heartbeat-interval = "500ms"
lease-retry-interval = "300ms"
lease-operation-timeout = "1s"
[cluster]
port = {port}
cookie = "sharded-counter-example-0123456789ab"
seeds = ["127.0.0.1:{seed}"]
roles = [{roles}]
member-lease-ttl = "3s"
member-lease-interval = "500ms"
membership-interval = "300ms"
[sharding.counter]
role = "counter"
number-of-shards = 16
retry-interval = "300ms"
"#,
        dir = dir.display()
    )
}

/// Node mode: one cluster node hosting counter entities, until SIGTERM.
async fn node(
    config_path: PathBuf,
    counter_path: PathBuf,
) -> Result<(), Box<dyn std::error::Error>> {
    let config = TenureConfig::load(Some(&config_path))?;
    let provider = tenure::provider(config.clone())?;
    let node = Node::builder(ClusterSettings::from_config(&config)?)
        .start(&provider)
        .await?;
    let counter = FencedCounter::open(&counter_path)?;
    tenure::sharding::start_on_node(
        &node,
        &provider,
        "counter",
        Some(entity_factory(Counter { counter })),
    )
    .await?;
    node.run_until_signal().await?;
    Ok(())
}

/// One increment of every key, retried until acknowledged (its shard may be moving), for
/// at most a minute.
async fn round(region: &ShardRegion, label: &str) -> Result<(), String> {
    for key in KEYS {
        let give_up = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if tokio::time::Instant::now() > give_up {
                return Err(format!("{label}: {key} not acknowledged within a minute"));
            }
            // Typed by the entity: the request must be a CounterRequest, the reply is a
            // CounterReply.
            let counter = region.entity_ref::<Counter>(key);
            match counter
                .ask(&CounterRequest::Increment, Duration::from_secs(5))
                .await
            {
                Ok(r) if r.accepted => {
                    println!(
                        "{label}: {key} = {} (shard {}, token {}, on {})",
                        r.value.unwrap_or(0),
                        counter.shard(),
                        r.token,
                        r.node
                    );
                    break;
                }
                Ok(_) => println!("{label}: {key}: refused (stale token), retrying"),
                Err(e) => {
                    println!("{label}: {key}: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }
    Ok(())
}

/// Pins `key`'s shard to the node at `to` and waits (at most a minute) until the
/// coordinator's allocation places it there.
async fn pin(region: &ShardRegion, key: &str, to: &str) -> Result<(), Box<dyn std::error::Error>> {
    let shard = region.entity_ref::<Counter>(key).shard();
    // Moves the shard through the lossless hand-off; `false`: it lives there already.
    let moving: bool = region.pin_shard(&shard, to, Duration::from_secs(5)).await?;
    println!("pinned shard {shard} of {key} to {to} (moving: {moving})");
    let give_up = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let map = region.shard_map(Duration::from_secs(2)).await?;
        let home = map.shards.iter().find(|e| e.shard == shard);
        if map.from_coordinator && home.and_then(|e| e.home.as_deref()) == Some(to) {
            return Ok(());
        }
        if tokio::time::Instant::now() > give_up {
            return Err(format!("shard {shard} not on {to} within a minute").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Some((config, counter)) = node_mode() {
        return node(config, counter).await;
    }
    let dir = tempfile::tempdir()?;
    let ports = free_ports(4)?;
    let mut children = Vec::new();
    for i in 0..3 {
        let config = config(dir.path(), ports[i], ports[0], "\"counter\"");
        children.push(spawn_node(dir.path(), i, &config)?);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // This process: a fourth node without the role, so its region only routes.
    let config =
        TenureConfig::from_toml_str(&config(dir.path(), ports[3], ports[0], ""), "example")?;
    let provider = tenure::provider(config.clone())?;
    let node = Node::builder(ClusterSettings::from_config(&config)?)
        .start(&provider)
        .await?;
    let region = tenure::sharding::start_on_node(&node, &provider, "counter", None).await?;
    let rounds = async {
        for r in 1..=2 {
            round(&region, &format!("round {r}")).await?;
        }
        let to = format!("127.0.0.1:{}", ports[2]);
        pin(&region, "alice", &to)
            .await
            .map_err(|e| e.to_string())?;
        round(&region, "round 3").await?;
        let shard = region.entity_ref::<Counter>("alice").shard();
        region
            .unpin_shard(&shard, Duration::from_secs(5))
            .await
            .map_err(|e| e.to_string())?;
        println!("SIGKILL of node 127.0.0.1:{}", ports[0]);
        children[0].kill().map_err(|e| e.to_string())?;
        children[0].wait().map_err(|e| e.to_string())?;
        for r in 4..=6 {
            round(&region, &format!("round {r}")).await?;
        }
        Ok::<(), String>(())
    };
    let result = rounds.await;
    node.leave().await?;
    stop_nodes(&mut children)?;
    Ok(result?)
}
