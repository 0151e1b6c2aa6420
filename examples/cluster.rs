//! A two-node cluster on the `tenure` crate alone: a singleton and a sharded entity.
//!
//! Run: `cargo run --example cluster`. The program starts a second process of itself as
//! the first node (the seed), then joins it as the second node; both share a SQLite lease
//! file in a temporary directory. Each node hosts the sharded entity type `greeter` and the
//! singleton `announcer`: the oldest node runs the singleton, each greeter runs on one node
//! under its shard's lease. The program greets a few people through its region (the reply
//! names the node that answered), then the first node leaves gracefully: its shards and the
//! singleton move to the second node, and the greetings go on there.

use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenure::TenureConfig;
use tenure::cluster::{ClusterError, ClusterSettings, Node};
use tenure::ractor::ActorProcessingErr;
use tenure::sharding::{Entity, EntityContext, ShardRegion, entity_factory};
use tenure::singleton::{Singleton, SingletonContext, SingletonRef};
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};

const PEOPLE: [&str; 4] = ["alice", "bob", "carol", "dave"];

/// A greeter: one per person, counting the greetings it gave (in memory: a moved greeter
/// starts counting again; a durable entity would not).
struct Greeter;

#[derive(Serialize, Deserialize)]
struct Greet;

#[derive(Serialize, Deserialize)]
struct Greeting {
    text: String,
}

impl Entity for Greeter {
    type Request = Greet;
    type Reply = Greeting;
    type State = u64;

    async fn start(&self, _ctx: &EntityContext) -> Result<u64, ActorProcessingErr> {
        Ok(0)
    }

    async fn handle(
        &self,
        ctx: &EntityContext,
        greetings: &mut u64,
        _request: Greet,
    ) -> Result<Greeting, ActorProcessingErr> {
        *greetings += 1;
        Ok(Greeting {
            text: format!(
                "hello {} (greeting {} from {}, shard {}, token {})",
                ctx.entity_id, greetings, ctx.node, ctx.shard_id, ctx.token
            ),
        })
    }
}

/// The singleton: says where it runs, under which token, as it starts, and answers with
/// that when asked.
struct Announcer {
    me: String,
    started: UnboundedSender<String>,
}

#[derive(Serialize, Deserialize)]
struct WhereAreYou;

impl Singleton for Announcer {
    type Request = WhereAreYou;
    type Reply = String;
    type State = String;

    async fn start(&self, ctx: &SingletonContext) -> Result<String, ActorProcessingErr> {
        let announcement = format!(
            "singleton announcer runs on {} with token {}",
            self.me, ctx.token
        );
        println!("{announcement}");
        // Nobody may be listening (the first node does not): that is fine.
        let _ = self.started.send(announcement.clone());
        Ok(announcement)
    }

    async fn handle(
        &self,
        _ctx: &SingletonContext,
        announcement: &mut String,
        _request: WhereAreYou,
    ) -> Result<String, ActorProcessingErr> {
        Ok(announcement.clone())
    }
}

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
cookie = "cluster-example-cookie-0123456789abcdef"
seeds = ["127.0.0.1:{seed}"]
member-lease-ttl = "3s"
member-lease-interval = "500ms"
membership-interval = "300ms"
[sharding.greeter]
number-of-shards = 8
retry-interval = "300ms"
"#,
        dir = dir.display()
    )
}

/// Starts a node from `config`, hosting the greeters and the announcer (which tells
/// `started` when it starts on this node); with a handle to the announcer wherever it runs.
async fn start_node(
    config: &str,
    started: UnboundedSender<String>,
) -> Result<(Node, ShardRegion, SingletonRef<Announcer>), Box<dyn std::error::Error>> {
    let config = TenureConfig::from_toml_str(config, "example")?;
    let provider = tenure::provider(config.clone())?;
    let node = Node::builder(ClusterSettings::from_config(&config)?)
        .start(&provider)
        .await?;
    let announcer = Announcer {
        me: node.addr().to_string(),
        started,
    };
    tenure::singleton::start_singleton(&node, &provider, "announcer", announcer).await?;
    let announcer = SingletonRef::on_node(&node, &provider, "announcer").await?;
    let region =
        tenure::sharding::start_on_node(&node, &provider, "greeter", Some(entity_factory(Greeter)))
            .await?;
    Ok((node, region, announcer))
}

/// Greets everyone once, retrying a greeting whose shard is moving, for at most a minute.
async fn greet_everyone(region: &ShardRegion) -> Result<(), String> {
    for person in PEOPLE {
        let give_up = tokio::time::Instant::now() + Duration::from_secs(60);
        let greeter = region.entity_ref::<Greeter>(person);
        loop {
            match greeter.ask(&Greet, Duration::from_secs(5)).await {
                Ok(greeting) => {
                    println!("{}", greeting.text);
                    break;
                }
                Err(e) if tokio::time::Instant::now() < give_up => {
                    println!("{person}: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Err(e) => return Err(format!("{person} not greeted within a minute: {e}")),
            }
        }
    }
    Ok(())
}

/// The first node: the seed, which leaves gracefully after `lifetime`.
async fn first_node(config: String, lifetime: Duration) -> Result<(), Box<dyn std::error::Error>> {
    let (node, _region, _announcer) = start_node(&config, unbounded_channel().0).await?;
    tokio::time::sleep(lifetime).await;
    println!("the first node leaves");
    node.leave().await?;
    Ok(())
}

/// A loopback port free when looked at (another program may take it before a node binds
/// it: the caller then tries another).
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Whether `e` is a node's bind of a port that another program took first.
fn port_taken(e: &(dyn std::error::Error + 'static)) -> bool {
    matches!(
        e.downcast_ref::<ClusterError>(),
        Some(ClusterError::Bind { source, .. }) if source.kind() == std::io::ErrorKind::AddrInUse
    )
}

/// Starts the first node as a process of its own on a free port and waits until it
/// listens: the process and its port. A first node that ends before it listens (its port
/// taken meanwhile) is started again on another port.
async fn first_node_process(dir: &Path) -> Result<(Child, u16), Box<dyn std::error::Error>> {
    for _ in 0..10 {
        let seed = free_port()?;
        let mut first = spawn_first_node(&config(dir, seed, seed), Duration::from_secs(6))?;
        let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", seed))
                .await
                .is_ok()
            {
                return Ok((first, seed));
            }
            if let Some(ended) = first.try_wait()? {
                eprintln!("the first node ended before it listened ({ended}): another port");
                break;
            }
            if tokio::time::Instant::now() > give_up {
                first.kill()?;
                return Err("the first node did not listen within 30 s".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Err("the first node ended before it listened, on 10 ports in a row".into())
}

fn spawn_first_node(config: &str, lifetime: Duration) -> std::io::Result<Child> {
    Command::new(std::env::current_exe()?)
        .env("TENURE_EXAMPLE_FIRST_NODE", config)
        .env(
            "TENURE_EXAMPLE_LIFETIME_MS",
            lifetime.as_millis().to_string(),
        )
        .spawn()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let (Ok(config), Ok(lifetime)) = (
        std::env::var("TENURE_EXAMPLE_FIRST_NODE"),
        std::env::var("TENURE_EXAMPLE_LIFETIME_MS"),
    ) {
        return first_node(config, Duration::from_millis(lifetime.parse()?)).await;
    }
    let dir = tempfile::tempdir()?;
    // The first node must be the oldest: join once it listens.
    let (mut first, seed) = first_node_process(dir.path()).await?;
    let (started, mut announced) = unbounded_channel();
    let mut attempts = 0;
    let (node, region, announcer) = loop {
        let port = free_port()?;
        match start_node(&config(dir.path(), port, seed), started.clone()).await {
            Ok(node) => break node,
            Err(e) if port_taken(&*e) && attempts < 10 => attempts += 1,
            Err(e) => {
                first.kill()?;
                return Err(e);
            }
        }
    };
    let greetings = async {
        greet_everyone(&region).await?;
        let left = first.wait().map_err(|e| e.to_string())?;
        if !left.success() {
            return Err(format!("the first node did not leave cleanly: {left}"));
        }
        println!("only this node is left");
        greet_everyone(&region).await?;
        match tokio::time::timeout(Duration::from_secs(30), announced.recv()).await {
            Ok(Some(_)) => {}
            _ => return Err("the singleton did not move to this node within 30 s".to_string()),
        }
        let answer = announcer
            .ask(&WhereAreYou, Duration::from_secs(10))
            .await
            .map_err(|e| e.to_string())?;
        println!("asked, the announcer says: {answer}");
        Ok(())
    };
    let result = greetings.await;
    if first.try_wait()?.is_none() {
        first.kill()?;
        first.wait()?;
    }
    node.leave().await?;
    Ok(result?)
}
