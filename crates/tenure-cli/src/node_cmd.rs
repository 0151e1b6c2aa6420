//! `tenure node` and `tenure cluster …`.

use std::io::Write;

use tenure::cluster::transport::LinkFault;
use tenure::cluster::{
    ClusterClient, ClusterSettings, Incarnation, MemberStatus, Node, NodeAddr, NodeView,
};
use tenure::{LeaseProvider, TenureConfig};
use tenure_management::Management;
use tokio::signal::unix::{SignalKind, signal};

use crate::exit::{CliError, Outcome};

/// Runs a node, as `incarnation`, until SIGTERM / Ctrl-C, then leaves gracefully; a second
/// signal forces exit.
/// `host` runs once the node and its management endpoint (when enabled) started, before the
/// node prints its "started" line; its error ends the node.
pub async fn node(
    config: &TenureConfig,
    provider: &LeaseProvider,
    incarnation: Incarnation,
    host: impl AsyncFnOnce(&Node, Option<&Management>) -> Result<(), CliError>,
) -> Result<Outcome, CliError> {
    let settings = ClusterSettings::from_config(config)?;
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| CliError::Command(format!("cannot watch SIGTERM: {e}")))?;
    let mut int = signal(SignalKind::interrupt())
        .map_err(|e| CliError::Command(format!("cannot watch SIGINT: {e}")))?;
    let management = tenure_management::ManagementSettings::from_config(config)?;
    let leases = management.enabled.then(|| {
        // Before the node starts, so that its first grants are counted and listed.
        tenure_management::install_metrics();
        let table = tenure_management::LeaseTable::default();
        provider.observe(table.observer());
        table
    });
    let node = Node::builder(settings)
        .incarnation(incarnation)
        .start(provider)
        .await?;
    let management = match leases {
        Some(table) => Some(
            Management::start(&node, table, management)
                .await
                .map_err(|e| CliError::Command(e.to_string()))?,
        ),
        None => None,
    };
    host(&node, management.as_ref()).await?;
    println!(
        "node {} incarnation {} started",
        node.addr(),
        node.incarnation()
    );
    let _ = std::io::stdout().flush();
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
        by = node.leave_requested() => eprintln!("tenure: leave requested by {by}"),
        why = node.stopped() => {
            node.shut_down_stopped(&why).await;
            return Err(why.into());
        }
    }
    eprintln!("tenure: leaving the cluster (signal again to exit at once)");
    tokio::select! {
        left = node.leave() => {
            left?;
            Ok(Outcome::Success)
        }
        _ = term.recv() => forced(),
        _ = int.recv() => forced(),
    }
}

fn forced() -> Result<Outcome, CliError> {
    eprintln!("tenure: forced exit; the member lease expires after its ttl");
    Ok(Outcome::Error)
}

fn parse_node(key: &str, text: &str) -> Result<NodeAddr, CliError> {
    Ok(NodeAddr::parse(key, text)?)
}

/// `tenure cluster members --node ADDR`: the node's view.
pub async fn members(config: &TenureConfig, node: &str, json: bool) -> Result<Outcome, CliError> {
    let settings = ClusterSettings::from_config(config)?;
    let addr = parse_node("--node", node)?;
    let client = ClusterClient::connect(&settings, &addr).await?;
    let view = client.view().await;
    client.close().await;
    let view = view?;
    if json {
        println!(
            "{}",
            serde_json::to_string(&view).map_err(|e| CliError::Command(e.to_string()))?
        );
    } else {
        print!("{}", render(&view));
    }
    Ok(Outcome::Success)
}

/// `tenure cluster fault --node ADDR --cut PEER [--mode M] | --heal PEER`.
pub async fn fault(
    config: &TenureConfig,
    node: &str,
    peer: &str,
    fault: LinkFault,
) -> Result<Outcome, CliError> {
    let settings = ClusterSettings::from_config(config)?;
    let addr = parse_node("--node", node)?;
    let flag = if fault == LinkFault::None {
        "--heal"
    } else {
        "--cut"
    };
    let peer = parse_node(flag, peer)?;
    let client = ClusterClient::connect(&settings, &addr).await?;
    let result = client.set_link(&peer, fault).await;
    client.close().await;
    result?;
    Ok(Outcome::Success)
}

fn render(view: &NodeView) -> String {
    let mut out = format!(
        "view of {} (incarnation {}, system {}): {} members\n",
        view.node,
        view.incarnation,
        view.system,
        view.members.len()
    );
    out.push_str(&format!(
        "{:<3} {:<24} {:<8} {:>6} {:<11} {:>9} {:>8}  {}\n",
        "#", "ADDRESS", "STATUS", "AGE", "REACHABLE", "SILENCE", "SESSIONS", "INCARNATION"
    ));
    for (i, m) in view.members.iter().enumerate() {
        let me = m.addr == view.node;
        let status = match m.status {
            MemberStatus::Up if me => "up*",
            s => s.as_str(),
        };
        let reach = match (me, m.reachable, m.link_cut) {
            (true, _, _) => "self",
            (false, true, false) => "yes",
            (false, true, true) => "yes (cut)",
            (false, false, false) => "NO",
            (false, false, true) => "NO (cut)",
        };
        let silence = m
            .silence_ms
            .map(|ms| format!("{ms}ms"))
            .unwrap_or_else(|| "-".into());
        let sessions = if me {
            "-".to_string()
        } else {
            m.sessions.to_string()
        };
        out.push_str(&format!(
            "{:<3} {:<24} {:<8} {:>6} {:<11} {:>9} {:>8}  {}\n",
            i + 1,
            m.addr.to_string(),
            status,
            m.age,
            reach,
            silence,
            sessions,
            m.incarnation
        ));
    }
    out
}
