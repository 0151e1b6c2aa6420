//! Two nodes in two processes sharing one SQLite file: one hosts an entity type, the other
//! (this process) sends to it through a proxy-only region, so that every message crosses
//! the network. ractor's registry is per process, so one process is one node; the hosting
//! process is the test or bench binary itself, run again with an environment variable.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use tenure::TenureConfig;
use tenure::cluster::{ClusterSettings, Node};
use tenure::sharding::{EntityFactory, ShardRegion};

use super::cluster::{PortHold, hold_ports};

/// The config of one of the two nodes: `port`, dialling `seed`, with `roles` (a TOML list
/// body, e.g. `"\"echo\""`); entity type `type_name` (role `type_name`, `shards` shards) and
/// the SQLite file in `dir`.
pub fn config(
    dir: &Path,
    port: u16,
    seed: u16,
    roles: &str,
    type_name: &str,
    shards: usize,
) -> String {
    format!(
        "[tenure]\ndefault-lease-section = \"sqlite\"\n[lease.sqlite]\npath = \"{}/leases.sqlite\"\n\
         heartbeat-timeout = \"5s\"\nheartbeat-interval = \"1s\"\nlease-retry-interval = \"200ms\"\n\
         [cluster]\nport = {port}\ncookie = \"pair-cookie-0123456789abcdef012345\"\nseeds = [\"127.0.0.1:{seed}\"]\nroles = [{roles}]\n\
         member-lease-ttl = \"5s\"\nmember-lease-interval = \"1s\"\nmembership-interval = \"300ms\"\n\
         [sharding.{type_name}]\nrole = \"{type_name}\"\nnumber-of-shards = {shards}\nretry-interval = \"200ms\"\nidle-timeout = \"off\"\n",
        dir.display()
    )
}

/// Starts a node with `config` and its region of `type_name`, hosting with `factory`
/// (`None`: proxy-only).
pub async fn start(
    config: &TenureConfig,
    type_name: &str,
    factory: Option<EntityFactory>,
) -> (Node, ShardRegion) {
    let provider = tenure::provider(config.clone()).expect("provider");
    let node = Node::start(
        ClusterSettings::from_config(config).expect("cluster settings"),
        &provider,
    )
    .await
    .expect("start the node");
    let region = tenure::sharding::start_on_node(&node, &provider, type_name, factory)
        .await
        .expect("start the region");
    (node, region)
}

/// The two nodes' loopback ports, the hosting node's then this process's, each held (see
/// [`PortHold`]) until its node is about to bind it: no other process can take a port
/// between choosing it and the node's start.
pub struct Ports {
    numbers: [u16; 2],
    holds: [Option<PortHold>; 2],
}

/// Two free loopback ports, held until [`spawn_host`] and [`start_sender`] start the nodes
/// on them (panics when there are not two free).
pub fn ports() -> Ports {
    let [host, sender]: [PortHold; 2] = hold_ports(2).try_into().expect("two held ports");
    Ports {
        numbers: [host.port(), sender.port()],
        holds: [Some(host), Some(sender)],
    }
}

/// The hosting process, killed when dropped (also when the test or bench panics).
pub struct Host(Child);

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Writes the hosting node's config (the first of `ports`, entity type `type_name` with
/// `shards` shards) in `dir`, runs this binary again with `args` and `var` naming that
/// config (letting go of the port held for it just before), and waits for its `ready` line
/// (its other output is skipped).
pub fn spawn_host(
    dir: &Path,
    ports: &mut Ports,
    type_name: &str,
    shards: usize,
    args: &[&str],
    var: &str,
) -> Host {
    let path = dir.join("host.toml");
    let roles = format!("\"{type_name}\"");
    std::fs::write(
        &path,
        config(
            dir,
            ports.numbers[0],
            ports.numbers[0],
            &roles,
            type_name,
            shards,
        ),
    )
    .expect("write the host's config");
    ports.holds[0] = None;
    let mut child = Host(
        Command::new(std::env::current_exe().expect("this binary"))
            .args(args)
            .env(var, &path)
            .env("TENURE_LOG", "error")
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the hosting node"),
    );
    let mut out = BufReader::new(child.0.stdout.take().expect("piped stdout"));
    let mut line = String::new();
    while !line.contains("ready") {
        line.clear();
        let n = out.read_line(&mut line).expect("read the host's output");
        assert!(n > 0, "the hosting node exited before it was ready");
    }
    child
}

/// Starts this process's node on the second of `ports` (letting go of the port held for it
/// just before), proxy-only for `type_name` with `shards` shards, dialling the hosting node.
pub async fn start_sender(
    dir: &Path,
    ports: Ports,
    type_name: &str,
    shards: usize,
) -> (Node, ShardRegion) {
    let [host, sender] = ports.numbers;
    let config =
        TenureConfig::from_toml_str(&config(dir, sender, host, "", type_name, shards), "pair")
            .expect("the sender's config");
    drop(ports);
    start(&config, type_name, None).await
}
