//! A cluster node: the ractor_cluster node server, the agent, and the member lease.

use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorRef, ActorStatus};
use ractor_cluster::node::NodeConnectionMode;
use ractor_cluster::{IncomingEncryptionMode, NodeServer, NodeServerMessage};
use tenure_lease::{LeaseMsg, LeaseProvider};

use crate::agent::{Agent, AgentArgs, RELEASE_SLACK, Refusal};
use crate::error::ClusterError;
use crate::error::OperatorRefusal;
use crate::identity::{Incarnation, NodeAddr};
use crate::member::{ClusterEvent, MemberStatus};
use crate::placement::Placement;
use crate::protocol::{
    AgentLocal, AgentMsg, DownRequest, LeaveRequest, NodeView, OperatorReply, ask_set_link,
    ask_view,
};
use crate::readiness::{Readiness, ReadinessGate};
use crate::settings::ClusterSettings;
use crate::shutdown::{CoordinatedShutdown, Phase};
use crate::subscribe::ClusterSubscriber;
#[cfg(feature = "fault-injection")]
use crate::transport::Links;
use crate::transport::{LinkFault, Tls};

/// Subscribes to a node's cluster events; cloneable, outlives no node (subscribing after
/// the node stopped is an error).
#[derive(Clone)]
pub struct Subscriptions(ActorRef<AgentMsg>);

impl Subscriptions {
    /// As [`Node::subscribe`].
    pub fn subscribe(&self, subscriber: ClusterSubscriber) -> Result<(), ClusterError> {
        self.0
            .cast(AgentMsg::Local(AgentLocal::Subscribe(subscriber)))
            .map_err(|_| ClusterError::Actor("the node's agent has stopped".into()))
    }
}

/// Starts a [`Node`]: `Node::builder(settings).start(&provider)`.
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `start`"]
pub struct NodeBuilder {
    settings: ClusterSettings,
    incarnation: Option<Incarnation>,
}

impl NodeBuilder {
    /// Starts the node as `incarnation` rather than a new one: for a process that names
    /// it before the node starts, such as in its history writer. Give each process start
    /// its own: peers tell two runs of one address apart by it.
    pub fn incarnation(mut self, incarnation: Incarnation) -> Self {
        self.incarnation = Some(incarnation);
        self
    }

    /// As [`Node::start`].
    pub async fn start(self, provider: &LeaseProvider) -> Result<Node, ClusterError> {
        let incarnation = self.incarnation.unwrap_or_default();
        Node::start_as(self.settings, provider, incarnation).await
    }
}

/// Reads a node's view of the cluster; cloneable (for a management endpoint, a probe).
#[derive(Clone)]
pub struct Inspector(ActorRef<AgentMsg>);

impl Inspector {
    /// As [`Node::view`]; `Err` once the node stopped.
    pub async fn view(&self) -> Result<NodeView, ClusterError> {
        view_of(&self.0).await
    }
}

/// Operators' actions on a node's cluster (a management endpoint's POST routes); cloneable.
#[derive(Clone)]
pub struct Operator(ActorRef<AgentMsg>);

/// How long an operator's request waits for the node (a leave passed on to another member
/// waits for that member too).
const OPERATOR_TIMEOUT_MS: u64 = 8000;

impl Operator {
    /// Asks `member` to leave gracefully (Akka's `Cluster.leave`); `by` says who asks (logs,
    /// history). This node, or another member, which the request is passed on to: only a
    /// node can leave, since only it can hand over what it hosts. `Ok` once the member took
    /// the request (its program then leaves as on SIGTERM: see [`Node::leave_requested`]);
    /// [`ClusterError::Operator`] says why not: not a member here, already leaving, no
    /// session with it, or its program does not take leave requests.
    pub async fn leave(&self, member: &NodeAddr, by: &str) -> Result<(), ClusterError> {
        let req = LeaveRequest {
            member: member.clone(),
            by: by.to_string(),
        };
        let reply = ractor::call_t!(self.0, AgentMsg::Leave, OPERATOR_TIMEOUT_MS, req);
        answer("leave", member, reply)
    }

    /// Downs `member` (Akka's `Cluster.down`): its current membership leaves this node's
    /// view at once and every peer's as they hear of it; the member, when it hears of it,
    /// stops what it hosts and releases its leases, then rejoins as a new member or exits
    /// (`split-brain-resolver.when-down`). A member that hears nothing (frozen, cut off)
    /// keeps its leases until they expire, so what it hosted starts elsewhere only then:
    /// downing never makes two holders. `Err` as [`Operator::leave`].
    pub async fn down(&self, member: &NodeAddr, by: &str) -> Result<(), ClusterError> {
        let req = DownRequest {
            member: member.clone(),
            by: by.to_string(),
        };
        let reply = ractor::call_t!(self.0, AgentMsg::Down, OPERATOR_TIMEOUT_MS, req);
        answer("down", member, reply)
    }
}

fn answer<E: std::fmt::Display>(
    action: &'static str,
    member: &NodeAddr,
    reply: Result<OperatorReply, E>,
) -> Result<(), ClusterError> {
    match reply {
        Ok(OperatorReply { refused: None }) => Ok(()),
        Ok(OperatorReply {
            refused: Some(refusal),
        }) => Err(ClusterError::Operator {
            action,
            member: member.to_string(),
            refusal,
        }),
        Err(e) => Err(ClusterError::Actor(format!(
            "the node's agent did not answer: {e}"
        ))),
    }
}

impl OperatorRefusal {
    /// Whether the member is unknown (as opposed to known but not in a state to comply).
    pub fn is_not_a_member(&self) -> bool {
        matches!(self, OperatorRefusal::NotAMember { .. })
    }
}

async fn view_of(agent: &ActorRef<AgentMsg>) -> Result<NodeView, ClusterError> {
    ask_view(agent)
        .await
        .map_err(|e| ClusterError::Actor(format!("the node's agent did not answer: {e}")))
}

/// A running node. Dropping it does not stop it: call [`Node::leave`].
pub struct Node {
    settings: ClusterSettings,
    incarnation: Incarnation,
    agent: ActorRef<AgentMsg>,
    server: ActorRef<NodeServerMessage>,
    #[cfg(feature = "fault-injection")]
    links: Arc<Links>,
    refused: Arc<std::sync::OnceLock<Refusal>>,
    downed: Arc<std::sync::OnceLock<String>>,
    leave_requests: Arc<tokio::sync::watch::Sender<Option<String>>>,
    readiness: Readiness,
    shutdown: CoordinatedShutdown,
}

/// Keeps `gate` open exactly while the node at `me` is an up member.
fn member_readiness(me: NodeAddr, gate: ReadinessGate) -> ClusterSubscriber {
    ClusterSubscriber::new(move |event| {
        match event {
            ClusterEvent::CurrentMembers(members) => {
                match members.iter().find(|m| m.addr == me).map(|m| m.status) {
                    Some(MemberStatus::Up) => gate.open(),
                    status => gate.close(format!(
                        "not an up member: {}",
                        status.map_or("not a member", MemberStatus::as_str)
                    )),
                }
            }
            ClusterEvent::MemberUp(m) if m.addr == me => gate.open(),
            ClusterEvent::MemberLeaving(m)
            | ClusterEvent::MemberDown(m)
            | ClusterEvent::MemberRemoved(m)
                if m.addr == me =>
            {
                gate.close(format!("not an up member: {}", m.status.as_str()))
            }
            ClusterEvent::SelfDown => gate.close("not an up member: down"),
            ClusterEvent::SelfLeaving(_) => gate.close("not an up member: leaving"),
            _ => {}
        }
        true
    })
}

impl Node {
    /// A builder of a node with `settings` (from [`ClusterSettings::from_config`]).
    pub fn builder(settings: ClusterSettings) -> NodeBuilder {
        NodeBuilder {
            settings,
            incarnation: None,
        }
    }

    /// Starts a node as a new incarnation: listens on `cluster.host:cluster.port`, starts
    /// acquiring its member lease in `cluster.lease-section` of `provider`, and dials the
    /// seeds. Returns once listening; membership follows (subscribe to see it). One node
    /// per process. Its history events (docs/history.md) go to the process's history
    /// writer, when one is installed (`tenure_history::HistoryLayer`, built with this
    /// node's address and incarnation: see [`NodeBuilder::incarnation`]).
    pub async fn start(
        settings: ClusterSettings,
        provider: &LeaseProvider,
    ) -> Result<Node, ClusterError> {
        Node::start_as(settings, provider, Incarnation::new()).await
    }

    async fn start_as(
        mut settings: ClusterSettings,
        provider: &LeaseProvider,
        incarnation: Incarnation,
    ) -> Result<Node, ClusterError> {
        // Placement with the store kinds' defaults filled in: a member that writes an
        // option out and one that leaves it to its default place entities alike.
        settings.placement =
            Placement::from_config_with(provider.config(), &settings.lease_section, &|name| {
                provider.section_with_defaults(name)
            })?;
        let addr = settings.addr.clone();
        let readiness = Readiness::new();
        provider.observe(readiness.lease_observer(&addr.to_string()));
        let tls = settings.tls.as_ref().map(Tls::load).transpose()?;
        let store = provider.store(&settings.lease_section).await?;
        tenure_lease::names::check_lease_name(&settings.member_lease_name(&addr))?;

        let listen = addr.ip().unwrap_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED));
        let bind_err = |source: std::io::Error| ClusterError::Bind {
            addr: addr.to_string(),
            source,
        };
        // With TLS, connections are accepted here (handshakes off the accept loop) and the
        // node server only listens on an unused loopback port, itself TLS-protected.
        // Without, bind once ourselves for a clear error (the node server's is generic).
        let tls_listener = match &tls {
            Some(_) => Some(
                tokio::net::TcpListener::bind((listen, addr.port))
                    .await
                    .map_err(bind_err)?,
            ),
            None => {
                std::net::TcpListener::bind((listen, addr.port)).map_err(bind_err)?;
                None
            }
        };
        // Heartbeat datagrams on the same host and port number (UDP's port space is not
        // TCP's): peers know where to send them without being told.
        let heartbeats = tokio::net::UdpSocket::bind((listen, addr.port))
            .await
            .map(Arc::new)
            .map_err(|source| ClusterError::Bind {
                addr: format!("{addr} (UDP, heartbeat datagrams)"),
                source,
            })?;
        let (server_port, server_listen) = match tls_listener {
            Some(_) => (0, IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)),
            None => (addr.port, listen),
        };
        crate::codec::set_local_label(&addr.to_string());
        crate::codec::set_max_payload(settings.max_frame_size);
        let server = NodeServer::new(
            server_port,
            settings.cookie.clone(),
            settings.system.clone(),
            addr.to_string(),
            tls.as_ref()
                .map(|t| IncomingEncryptionMode::Tls(t.acceptor.clone())),
            Some(NodeConnectionMode::Isolated),
        )
        .with_listen_addr(server_listen)
        .with_max_inbound_frame_size(settings.max_frame_size);
        let (server, _) =
            Actor::spawn(None, server, ())
                .await
                .map_err(|source| ClusterError::Server {
                    addr: addr.to_string(),
                    source,
                })?;
        let accept = match (tls_listener, &tls) {
            (Some(listener), Some(tls)) => Some(tokio::spawn(crate::transport::serve_tls(
                listener,
                server.clone(),
                tls.acceptor.clone(),
                settings.handshake_timeout,
            ))),
            _ => None,
        };
        #[cfg(feature = "fault-injection")]
        let links = Arc::new(Links::default());
        let refused = Arc::new(std::sync::OnceLock::new());
        let downed = Arc::new(std::sync::OnceLock::new());
        let leave_requests = Arc::new(tokio::sync::watch::Sender::new(None));
        let args = AgentArgs {
            settings: settings.clone(),
            incarnation,
            server: server.clone(),
            heartbeats,
            tls,
            #[cfg(feature = "fault-injection")]
            links: links.clone(),
            store,
            lease_observer: provider.observer(),
            refused: refused.clone(),
            downed: downed.clone(),
            leave_requests: leave_requests.clone(),
        };
        let agent = match Actor::spawn(None, Agent, args).await {
            Ok((agent, _)) => agent,
            Err(e) => {
                server.stop(None);
                if let Some(accept) = accept {
                    accept.abort();
                }
                return Err(ClusterError::Actor(e.to_string()));
            }
        };
        // If the agent dies (its member lease actor failed), take the node server down too
        // rather than leaving a half-alive node.
        let (watched, watched_server) = (agent.clone(), server.clone());
        let accept_abort = accept.as_ref().map(|a| a.abort_handle());
        tokio::spawn(async move {
            let _ = watched.wait(None).await;
            watched_server.stop(Some("agent stopped".into()));
            if let Some(accept) = accept_abort {
                accept.abort();
            }
        });
        let member_gate = readiness.gate("this node", "not an up member yet: joining");
        let _ = agent.cast(AgentMsg::Local(AgentLocal::Subscribe(member_readiness(
            addr.clone(),
            member_gate,
        ))));
        tracing::info!(node = %addr, %incarnation, seeds = settings.seeds.len(), "node started");
        Ok(Node {
            readiness,
            shutdown: CoordinatedShutdown::new(settings.shutdown.clone()),
            settings,
            incarnation,
            agent,
            server,
            #[cfg(feature = "fault-injection")]
            links,
            refused,
            downed,
            leave_requests,
        })
    }

    /// This node's address (its identity and lease owner name).
    pub fn addr(&self) -> &NodeAddr {
        &self.settings.addr
    }

    /// This process's incarnation.
    pub fn incarnation(&self) -> Incarnation {
        self.incarnation
    }

    /// The settings the node runs with.
    pub fn settings(&self) -> &ClusterSettings {
        &self.settings
    }

    /// The link gates of this node (fault injection).
    #[cfg(feature = "fault-injection")]
    pub fn links(&self) -> &Links {
        &self.links
    }

    /// Delivers [`ClusterEvent`](crate::ClusterEvent)s to `subscriber`: first the current
    /// members, then every change in order.
    pub fn subscribe(&self, subscriber: ClusterSubscriber) -> Result<(), ClusterError> {
        self.subscriptions().subscribe(subscriber)
    }

    /// A cloneable handle to subscribe later (e.g. from a singleton's spawner).
    pub fn subscriptions(&self) -> Subscriptions {
        Subscriptions(self.agent.clone())
    }

    /// This node's current view of the cluster.
    pub async fn view(&self) -> Result<NodeView, ClusterError> {
        view_of(&self.agent).await
    }

    /// A cloneable reader of [`view`](Node::view).
    pub fn inspector(&self) -> Inspector {
        Inspector(self.agent.clone())
    }

    /// This node's readiness (see [`Readiness`]): `check()` is `Ok` only while it is an up
    /// member, every region on it registered with its coordinator and learnt the shard
    /// homes, none of its leases has been suspended too long, and it is not leaving.
    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    /// This node's coordinated shutdown: add the program's tasks to its phases; they run
    /// when the node [leaves](Node::leave) (SIGTERM, an operator's leave request).
    pub fn shutdown(&self) -> &CoordinatedShutdown {
        &self.shutdown
    }

    /// A cloneable handle for operators' leave and down requests.
    pub fn operator(&self) -> Operator {
        Operator(self.agent.clone())
    }

    /// Waits until an operator asks this node to leave ([`Operator::leave`], on this node
    /// or passed on by another member) and answers who asked. It does not leave: the caller
    /// does, with [`leave`](Node::leave). While nothing awaits it, leave requests are
    /// refused, so that an operator is never told a leave was taken that nobody carries
    /// out. [`run_until_signal`](Node::run_until_signal) awaits it.
    pub async fn leave_requested(&self) -> String {
        let mut requests = self.leave_requests.subscribe();
        match requests.wait_for(Option::is_some).await {
            Ok(by) => by.clone().unwrap_or_default(),
            // Never: the node holds the sender.
            Err(_) => std::future::pending().await,
        }
    }

    /// Sets this node's link fault with `peer`; [`LinkFault::None`] heals it (needs
    /// `cluster.fault-injection`).
    pub async fn set_link(&self, peer: &NodeAddr, fault: LinkFault) -> Result<(), ClusterError> {
        match ask_set_link(&self.agent, peer, fault)
            .await
            .map_err(|e| ClusterError::Actor(e.to_string()))?
        {
            None => Ok(()),
            Some(e) => Err(ClusterError::Actor(e)),
        }
    }

    /// Whether the node is still running (its agent fails if its member lease actor dies).
    pub fn is_running(&self) -> bool {
        !matches!(
            self.agent.get_status(),
            ActorStatus::Stopped | ActorStatus::Stopping
        )
    }

    /// Waits until the node stops on its own (it does not while healthy) and tells why:
    /// [`ClusterError::Refused`] when it was refused at join (its placement differs from a
    /// member's), [`ClusterError::Downed`] when the split brain resolver downed it and
    /// `when-down = "exit"`, else [`ClusterError::Actor`] (its member lease actor failed).
    pub async fn stopped(&self) -> ClusterError {
        let _ = self.agent.wait(None).await;
        if let Some(why) = self.downed.get() {
            return ClusterError::Downed { why: why.clone() };
        }
        match self.refused.get() {
            Some(r) => ClusterError::Refused {
                key: r.mismatch.key.clone(),
                mine: r.mismatch.mine.clone(),
                theirs: r.mismatch.theirs.clone(),
                member: r.member.to_string(),
            },
            None => ClusterError::Actor(
                "the node stopped: its member lease actor failed (see the log)".into(),
            ),
        }
    }

    /// Runs until the process gets SIGTERM or SIGINT, or an operator asks it to leave
    /// ([`leave_requested`](Node::leave_requested)), then [`leave`](Node::leave)s
    /// gracefully: the main loop of a node process. `Ok` once left after a signal; `Err`
    /// when the leave failed, when the signal handlers could not be installed (before
    /// anything else happened), or when the node stopped on its own first (as
    /// [`stopped`](Node::stopped)).
    pub async fn run_until_signal(self) -> Result<(), ClusterError> {
        use tokio::signal::unix::{SignalKind, signal};
        let handler = |kind: SignalKind, name: &str| {
            signal(kind).map_err(|e| ClusterError::Actor(format!("cannot handle {name}: {e}")))
        };
        let mut term = handler(SignalKind::terminate(), "SIGTERM")?;
        let mut int = handler(SignalKind::interrupt(), "SIGINT")?;
        tokio::select! {
            _ = term.recv() => {
                tracing::info!(node = %self.settings.addr, "SIGTERM: leaving the cluster");
            }
            _ = int.recv() => {
                tracing::info!(node = %self.settings.addr, "SIGINT: leaving the cluster");
            }
            by = self.leave_requested() => {
                tracing::info!(node = %self.settings.addr, by, "leave requested: leaving the cluster");
            }
            stopped = self.stopped() => {
                self.shut_down_stopped(&stopped).await;
                return Err(stopped);
            }
        }
        self.leave().await
    }

    /// The coordinated shutdown of a node that stopped on its own (downed, refused, its
    /// member lease actor failed; see [`stopped`](Node::stopped)): not ready, then the
    /// program's tasks phase by phase, as in [`leave`](Node::leave), with nothing to hand
    /// off (what it hosted stopped when it went down).
    pub async fn shut_down_stopped(&self, why: &ClusterError) {
        self.readiness.leaving(format!("this node stopped: {why}"));
        for phase in Phase::ALL {
            self.shutdown.run_phase(phase).await;
        }
    }

    /// Leaves gracefully, in the order of its [coordinated shutdown](CoordinatedShutdown):
    /// not ready at once; the program's tasks of the phases up to
    /// [`Phase::BeforeClusterShutdown`], and the asks in flight through its regions
    /// answered; then subscribers get `SelfLeaving` and peers a leave notice; once every
    /// hand-over guard is dropped (or `leave-timeout` passed) and the asks taken meanwhile
    /// are answered (within `service-requests-done`), the member lease is released and the
    /// sessions are closed; then the tasks of [`Phase::BeforeExit`].
    pub async fn leave(self) -> Result<(), ClusterError> {
        // Not ready before anything is handed off: a load balancer stops sending first.
        self.readiness.leaving("this node is leaving");
        for phase in [
            Phase::ServiceUnbind,
            Phase::ServiceRequestsDone,
            Phase::ServiceStop,
            Phase::BeforeClusterShutdown,
        ] {
            self.shutdown.run_phase(phase).await;
        }
        let answer = ractor::call_t!(self.agent, |r| AgentMsg::Local(AgentLocal::Leave(r)), 5000)
            .map_err(|e| ClusterError::Actor(format!("the node's agent did not answer: {e}")));
        let left = answer
            .as_ref()
            .map(|_| ())
            .map_err(|e| ClusterError::Actor(e.to_string()));
        if let Ok(answer) = answer {
            // Peers first (acknowledged, bounded), so that they see a leave and not a crash
            // when the member lease disappears; then the hand-over; then the lease.
            let notices = answer.peers.iter().map(|peer| {
                let notice = answer.notice.clone();
                async move { ractor::call_t!(peer, AgentMsg::Leaving, 2000, notice) }
            });
            let acked = futures::future::join_all(notices).await;
            let missing = acked.iter().filter(|a| a.is_err()).count();
            if missing > 0 {
                tracing::warn!(
                    missing,
                    "peers did not acknowledge the leave; they may see this node as down"
                );
            }
            if tokio::time::timeout(self.settings.leave_timeout, answer.hand_over.done())
                .await
                .is_err()
            {
                tracing::warn!(timeout = ?self.settings.leave_timeout, "hand-over did not finish within cluster.leave-timeout; leaving anyway");
            }
            // Asks taken while handing over come back through the sessions about to close.
            let requests = self.shutdown.requests();
            let bound = self.settings.shutdown.service_requests_done;
            if tokio::time::timeout(bound, requests.drained())
                .await
                .is_err()
            {
                tracing::warn!(open = requests.open(), timeout = ?bound,
                    "asks still unanswered after cluster.coordinated-shutdown.service-requests-done; leaving anyway");
            }
            if let Some(member_lease) = answer.member_lease {
                let timeout = self.settings.member_lease.lease_operation_timeout + RELEASE_SLACK;
                match ractor::call_t!(member_lease, LeaseMsg::Release, timeout.as_millis() as u64) {
                    Ok(Ok(_)) => {
                        tracing::info!(node = %self.settings.addr, "member lease released; left the cluster")
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "member lease release failed; it expires after its ttl")
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "member lease actor did not answer; the lease expires after its ttl")
                    }
                }
            }
        }
        crate::history::node_left();
        let _ = self
            .agent
            .stop_and_wait(Some("left".into()), Some(Duration::from_secs(5)))
            .await;
        let _ = self
            .server
            .stop_and_wait(Some("left".into()), Some(Duration::from_secs(5)))
            .await;
        self.shutdown.run_phase(Phase::BeforeExit).await;
        left
    }
}
