//! A singleton that counts ticks into a fenced store, on a 3-node local cluster.
//!
//! Run: `cargo run -p tenure-cli --example singleton_ticks`. The program starts three node
//! processes (itself, in node mode) on 127.0.0.1 sharing a temp SQLite lease store. The
//! oldest node holds the lease `tenure-singleton-ticks` and runs the demo's ticker
//! ([`tenure_cli::demo::ticker`]), which adds one to a fenced counter every 100 ms with its
//! lease's fencing token. After a while the program SIGKILLs
//! the node that holds it: once the lease expires (3 s), the next oldest takes over with a
//! newer token, and the counter keeps counting. A write carrying an older token would be
//! refused by the counter itself.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tenure::TenureConfig;
use tenure::cluster::{ClusterSettings, Node};
use tenure::singleton::spawner;
use tenure_cli::demo::FencedCounter;
use tenure_cli::demo::example_nodes::{free_ports, node_mode, spawn_node, stop_nodes};
use tenure_cli::demo::ticker::{Ticker, TickerArgs};

const NAME: &str = "ticks";

fn config(dir: &Path, port: u16, seed: u16) -> String {
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
cookie = "singleton-ticks-example-0123456789ab"
seeds = ["127.0.0.1:{seed}"]
member-lease-ttl = "3s"
member-lease-interval = "500ms"
membership-interval = "300ms"
"#,
        dir = dir.display()
    )
}

/// Node mode: one cluster node hosting the ticker singleton, until SIGTERM.
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
    let me = node.addr().to_string();
    let make = spawner(move |token| {
        println!("[{me}] singleton started with fencing token {token}");
        let args = TickerArgs {
            name: NAME.into(),
            token,
            counter: counter.clone(),
            interval: Duration::from_millis(100),
            node: me.clone(),
        };
        (Ticker, args)
    });
    tenure::singleton::start_on_node(&node, &provider, NAME, make).await?;
    node.run_until_signal().await?;
    Ok(())
}

fn show(counter: &FencedCounter, label: &str) {
    match counter.get(NAME) {
        Ok(Some((value, token))) => {
            println!("{label}: counter = {value}, last written with token {token}")
        }
        Ok(None) => println!("{label}: counter not written yet"),
        Err(e) => println!("{label}: {e}"),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Some((config, counter)) = node_mode() {
        return node(config, counter).await;
    }
    let dir = tempfile::tempdir()?;
    let ports = free_ports(3)?;
    let mut children = Vec::new();
    for i in 0..3 {
        let config = config(dir.path(), ports[i], ports[0]);
        children.push(spawn_node(dir.path(), i, &config)?);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let counter = FencedCounter::open(&dir.path().join("counter.sqlite"))?;
    for s in 1..=5 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        show(&counter, &format!("t+{s}s"));
    }
    println!("SIGKILL of the first node (the oldest, which hosts the singleton)");
    children[0].kill()?;
    children[0].wait()?;
    for s in 6..=12 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        show(&counter, &format!("t+{s}s"));
    }
    stop_nodes(&mut children[1..])?;
    show(&counter, "done");
    Ok(())
}
