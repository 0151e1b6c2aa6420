//! `tenure node` and `tenure cluster …`.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use tenure::cluster::transport::LinkFault;
use tenure::cluster::{ClusterClient, ClusterSettings, MemberStatus, Node, NodeAddr, NodeView};
use tenure::sharding::counter::Counter;
use tenure::sqlite::FencedCounter;
use tenure::{LeaseProvider, TenureConfig};
use tenure_singleton::spawner;
use tenure_singleton::ticker::{CountRequest, Ticker, TickerArgs, TickerMsg};
use tokio::signal::unix::{SignalKind, signal};

use crate::exit::{CliError, Outcome};
use crate::load::Load;
use crate::slow_stop::{SlowStopSwitch, SlowStoppingActor, SlowStoppingEntity};

/// What `tenure node` hosts besides membership.
pub struct Hosting<'a> {
    pub history: Option<&'a Path>,
    /// Names of ticker singletons to host (the example singleton).
    pub singletons: &'a [String],
    /// The fenced counter file the tickers write.
    pub counter: &'a Path,
    pub tick: Duration,
    /// Host the example sharded counter.
    pub sharded_counter: bool,
    /// The increment load driven through this node's region.
    pub load: Option<Load>,
    /// Fault injection: the example entities and singletons stop slowly while it is on.
    pub slow_stop: Option<SlowStopSwitch>,
}

/// Runs a node until SIGTERM / Ctrl-C, then leaves gracefully; a second signal forces exit.
pub async fn node(
    config: &TenureConfig,
    provider: &LeaseProvider,
    hosting: Hosting<'_>,
) -> Result<Outcome, CliError> {
    let history = hosting.history;
    let settings = ClusterSettings::from_config(config)?;
    if hosting.slow_stop.is_some() && !settings.fault_injection {
        return Err(CliError::Command(
            "--slow-stop-when is fault injection: it needs cluster.fault-injection = true".into(),
        ));
    }
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
    let node = Node::start(settings, provider, history).await?;
    let management = match leases {
        Some(table) => Some(
            tenure_management::Management::start(&node, table, management)
                .await
                .map_err(|e| CliError::Command(e.to_string()))?,
        ),
        None => None,
    };
    if !hosting.singletons.is_empty() {
        let counter = FencedCounter::open(hosting.counter)?;
        for name in hosting.singletons {
            let (counter, name_owned, node_name, history, tick, slow) = (
                counter.clone(),
                name.clone(),
                node.addr().to_string(),
                node.history().cloned(),
                hosting.tick,
                hosting.slow_stop.clone(),
            );
            let make_args = move |token| TickerArgs {
                name: name_owned.clone(),
                token,
                counter: counter.clone(),
                interval: tick,
                node: node_name.clone(),
                history: history.clone(),
            };
            let spawner = match slow {
                Some(switch) => spawner(move |token| {
                    let inner = Ticker;
                    let actor = SlowStoppingActor {
                        inner,
                        switch: switch.clone(),
                    };
                    (actor, make_args(token))
                }),
                None => spawner(move |token| (Ticker, make_args(token))),
            };
            tenure_singleton::start_on_node(&node, provider, name, spawner)
                .await
                .map_err(|e| CliError::Command(e.to_string()))?;
            probe_through_proxy(&node, provider, name).await?;
        }
    }
    if hosting.sharded_counter || hosting.load.is_some() {
        let factory = hosting
            .sharded_counter
            .then(|| FencedCounter::open(hosting.counter))
            .transpose()?
            .map(|counter| match hosting.slow_stop.clone() {
                Some(switch) => tenure::sharding::entity_factory(SlowStoppingEntity {
                    inner: Counter { counter },
                    switch,
                }),
                None => tenure::sharding::entity_factory(Counter { counter }),
            });
        let region = tenure::sharding::start_on_node(&node, provider, COUNTER_TYPE, factory)
            .await
            .map_err(|e| CliError::Command(e.to_string()))?;
        if let Some(m) = &management {
            m.add_region(region.clone());
        }
        if let Some(load) = hosting.load {
            let start = usize::from(node.addr().port).wrapping_mul(7919);
            crate::load::drive(region, node.history().cloned(), start, load);
        }
    }
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
        why = node.stopped() => return Err(why.into()),
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

/// Every second, asks the singleton for its count through a proxy on this node and records
/// the answer (`proxy_reply`, with the node that answered) in the history: shows `call`
/// reaching the instance from every node.
async fn probe_through_proxy(
    node: &Node,
    provider: &LeaseProvider,
    name: &str,
) -> Result<(), CliError> {
    let proxy = tenure_singleton::proxy_on_node::<TickerMsg>(node, provider, name)
        .await
        .map_err(|e| CliError::Command(e.to_string()))?;
    let (history, name) = (node.history().cloned(), name.to_string());
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            match proxy
                .call(
                    |r| TickerMsg::Count(CountRequest {}, r),
                    Duration::from_secs(1),
                )
                .await
            {
                Ok(reply) => {
                    if let Some(h) = &history {
                        h.record(tenure::history::Event::ProxyReply {
                            singleton: name.clone(),
                            from: reply.node.clone(),
                            token: Some(reply.token),
                            value: reply.value,
                        });
                    }
                }
                Err(e) => tracing::debug!(error = %e, "proxy probe"),
            }
        }
    });
    Ok(())
}

/// The entity type of the example sharded counter.
const COUNTER_TYPE: &str = "counter";

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
