//! The connection mesh: the ractor sessions with other nodes (as the node server reports
//! them), dials with backoff to seeds, members and gossiped addresses, hellos that turn an
//! authenticated session into a known peer, and closing stale or incompatible sessions.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use ractor::{ActorId, ActorRef, pg};
use ractor_cluster::node::NodeServerSessionInformation;
use ractor_cluster::{NodeEventSubscription, NodeServerMessage, NodeSessionMessage};
use tokio::time::Instant;

use super::{AGENT_GROUP, AgentState};
use crate::backoff::Backoff;
use crate::identity::{Incarnation, NodeAddr};
use crate::protocol::{
    AgentLocal, AgentMsg, COMPATIBLE_PROTOCOLS, Hello, PROTOCOL_VERSION, SessionChange,
};
#[cfg(feature = "fault-injection")]
use crate::transport::Links;
use crate::transport::Tls;

/// The sessions, peers and dials of one node.
pub(super) struct Mesh {
    pub server: ActorRef<NodeServerMessage>,
    pub tls: Option<Tls>,
    /// The link gates of fault injection.
    #[cfg(feature = "fault-injection")]
    pub links: std::sync::Arc<Links>,
    pub sessions: HashMap<u64, Session>,
    pub peers: HashMap<NodeAddr, Peer>,
    /// Sessions this node said hello on.
    pub greeted: BTreeSet<u64>,
    /// When a hello was last re-requested from a peer we hear without knowing it.
    pub regreeted: HashMap<NodeAddr, Instant>,
    /// When sessions with a peer were last closed as stale (at most once per 3 x
    /// unreachable-after).
    pub stale_closed: HashMap<NodeAddr, Instant>,
    /// Addresses peers told of that are not (yet) members: dialled too.
    pub gossip: BTreeSet<NodeAddr>,
    pub dials: HashMap<NodeAddr, Dial>,
    /// Hellos that arrived before their session was known here.
    pub pending_hellos: HashMap<NodeAddr, Hello>,
}

impl Mesh {
    /// Subscribes `agent` to the session events of `server` and reads the sessions opened
    /// before (they get no events).
    pub async fn start(
        agent: &ActorRef<AgentMsg>,
        server: ActorRef<NodeServerMessage>,
        tls: Option<Tls>,
        #[cfg(feature = "fault-injection")] links: std::sync::Arc<Links>,
    ) -> Result<Mesh, ractor::ActorProcessingErr> {
        server.cast(NodeServerMessage::SubscribeToEvents {
            id: SUBSCRIPTION.into(),
            subscription: Box::new(Forward(agent.clone())),
        })?;
        // Sessions opened before the subscription took effect get no events: read them.
        let existing = ractor::call_t!(server, NodeServerMessage::GetSessions, 5000)?;
        let sessions = existing
            .into_values()
            .map(|ses| {
                let session = Session {
                    peer: ses.peer_name.as_ref().and_then(|n| node_of(&n.name)),
                    authenticated: true,
                    ready: true,
                    dialled: None,
                    peer_addr: ses.peer_addr,
                    actor: ses.actor,
                };
                (ses.node_id, session)
            })
            .collect();
        Ok(Mesh {
            server,
            tls,
            #[cfg(feature = "fault-injection")]
            links,
            sessions,
            peers: HashMap::new(),
            greeted: BTreeSet::new(),
            regreeted: HashMap::new(),
            stale_closed: HashMap::new(),
            gossip: BTreeSet::new(),
            dials: HashMap::new(),
            pending_hellos: HashMap::new(),
        })
    }

    /// Stops the session events.
    pub fn stop(&self) {
        let _ = self
            .server
            .cast(NodeServerMessage::UnsubscribeToEvents(SUBSCRIPTION.into()));
    }
}

/// The agent's subscription to the node server's session events.
const SUBSCRIPTION: &str = "tenure-agent";

/// A ractor session with another process (node or client).
pub(super) struct Session {
    /// The peer's node address, once authenticated (None for non-node peers such as the CLI).
    pub peer: Option<NodeAddr>,
    pub authenticated: bool,
    pub ready: bool,
    /// The address we dialled, for outbound sessions.
    pub dialled: Option<NodeAddr>,
    pub peer_addr: String,
    pub actor: ActorRef<NodeSessionMessage>,
}

/// A node that said hello: its life and the agent to reach it by.
pub(super) struct Peer {
    pub incarnation: Incarnation,
    pub node_id: u64,
    pub agent: ActorRef<AgentMsg>,
    /// When a heartbeat last came on the session (or the session said hello).
    pub session_heard: Instant,
}

/// The dialling of one address: backoff after failures, whether a dial is under way.
pub(super) struct Dial {
    pub backoff: Backoff,
    pub next_at: Instant,
    pub in_flight: bool,
}

struct Forward(ActorRef<AgentMsg>);

impl Forward {
    fn send(&self, change: SessionChange, ses: NodeServerSessionInformation) {
        let _ = self
            .0
            .cast(AgentMsg::Local(AgentLocal::Session(change, Box::new(ses))));
    }
}

impl NodeEventSubscription for Forward {
    fn node_session_opened(&self, ses: NodeServerSessionInformation) {
        self.send(SessionChange::Opened, ses);
    }
    fn node_session_disconnected(&self, ses: NodeServerSessionInformation) {
        self.send(SessionChange::Disconnected, ses);
    }
    fn node_session_authenticated(&self, ses: NodeServerSessionInformation) {
        self.send(SessionChange::Authenticated, ses);
    }
    fn node_session_ready(&self, ses: NodeServerSessionInformation) {
        self.send(SessionChange::Ready, ses);
    }
}

/// The node address in a ractor node name `<system>@<host:port>`, if it is one.
fn node_of(name: &str) -> Option<NodeAddr> {
    let (_, addr) = name.split_once('@')?;
    NodeAddr::parse("peer name", addr).ok()
}

impl AgentState {
    /// This node's hello to `peer`, with the secret of their session's datagrams.
    pub(super) fn hello(&mut self, peer: &NodeAddr) -> Hello {
        Hello {
            protocol: PROTOCOL_VERSION,
            system: self.s.system.clone(),
            node: self.me.clone(),
            incarnation: self.incarnation,
            known: self.view.peers().cloned().collect(),
            want_reply: false,
            roles: self.s.roles.clone(),
            clock: self.clock.stamp(Instant::now()),
            datagram_secret: self.datagrams.secret_for(peer),
        }
    }

    pub(super) fn agent_of(&self, node_id: u64) -> Option<ActorRef<AgentMsg>> {
        pg::get_scoped_members(&self.scope, &AGENT_GROUP.to_string())
            .into_iter()
            .find(|c| matches!(c.get_id(), ActorId::Remote { node_id: n, .. } if n == node_id))
            .map(ActorRef::from)
    }

    /// Retries the hellos that came before their session or agent was known.
    pub(super) fn retry_pending_hellos(&mut self) {
        for (_, h) in std::mem::take(&mut self.mesh.pending_hellos) {
            self.on_hello(h);
        }
    }

    /// Says hello on session `node_id` once it is ready and its agent is known.
    pub(super) fn greet(&mut self, node_id: u64) {
        let Some(peer) = self
            .mesh
            .sessions
            .get(&node_id)
            .filter(|s| s.ready)
            .and_then(|s| s.peer.clone())
        else {
            return;
        };
        if self.mesh.greeted.contains(&node_id) {
            return;
        }
        if let Some(agent) = self.agent_of(node_id) {
            self.mesh.greeted.insert(node_id);
            let _ = agent.cast(AgentMsg::Hello(self.hello(&peer)));
        }
    }

    /// Asks `peer` for a hello (at most once a second): we hear it but never got one, e.g.
    /// its hello travelled on a session that then lost ractor's duplicate election.
    pub(super) fn request_hello(&mut self, peer: &NodeAddr) {
        let now = Instant::now();
        if self
            .mesh
            .regreeted
            .get(peer)
            .is_some_and(|t| now.duration_since(*t) < Duration::from_secs(1))
        {
            return;
        }
        let target = self
            .mesh
            .sessions
            .iter()
            .filter(|(_, s)| s.authenticated && s.peer.as_ref() == Some(peer))
            .find_map(|(id, _)| self.agent_of(*id));
        if let Some(agent) = target {
            self.mesh.regreeted.insert(peer.clone(), now);
            let mut hello = self.hello(peer);
            hello.want_reply = true;
            let _ = agent.cast(AgentMsg::Hello(hello));
        }
    }

    pub(super) fn on_hello(&mut self, h: Hello) {
        if !COMPATIBLE_PROTOCOLS.contains(&h.protocol) || h.system != self.s.system {
            let why = if h.system != self.s.system {
                format!(
                    "it belongs to system {:?}, this node to {:?}",
                    h.system, self.s.system
                )
            } else {
                format!(
                    "it speaks cluster protocol {}, this node (app-version {}) speaks {PROTOCOL_VERSION} and talks to protocols {}..={}: upgrade through a release that talks to both",
                    h.protocol,
                    self.s.app_version,
                    COMPATIBLE_PROTOCOLS.start(),
                    COMPATIBLE_PROTOCOLS.end()
                )
            };
            tracing::error!(
                peer = %h.node,
                peer_protocol = h.protocol,
                our_protocol = PROTOCOL_VERSION,
                peer_system = %h.system,
                our_system = %self.s.system,
                "refusing peer {}: {why}; closing the session",
                h.node
            );
            // Redial it only after the longest backoff.
            self.close_sessions_with(&h.node, "incompatible peer");
            let max = self.s.reconnect_backoff_max;
            self.dial_state(&h.node).next_at = Instant::now() + max;
            return;
        }
        let Some((node_id, agent)) = self
            .mesh
            .sessions
            .iter()
            .filter(|(_, s)| s.authenticated && s.peer.as_ref() == Some(&h.node))
            .find_map(|(id, _)| self.agent_of(*id).map(|a| (*id, a)))
        else {
            // Its session events or its agent's pg entry are still on their way.
            self.mesh.pending_hellos.insert(h.node.clone(), h);
            return;
        };
        let now = Instant::now();
        for addr in &h.known {
            if *addr != self.me && self.view.get(addr).is_none() {
                self.mesh.gossip.insert(addr.clone());
            }
        }
        // The hello came on an authenticated session (with TLS, an encrypted one): the
        // secret it gives keys this session's datagrams, and its stamp is what this node
        // knows of the peer's clock.
        if let Some(secret) = &h.datagram_secret {
            self.datagrams.accept_secret(&h.node, h.incarnation, secret);
        }
        self.datagrams
            .clocks
            .hello(&h.node, h.incarnation, h.clock, now);
        let fresh = self
            .mesh
            .peers
            .get(&h.node)
            .is_none_or(|p| p.incarnation != h.incarnation);
        self.mesh.peers.insert(
            h.node.clone(),
            Peer {
                incarnation: h.incarnation,
                node_id,
                agent,
                session_heard: now,
            },
        );
        self.detector.on_hello(&h.node, now);
        if fresh {
            tracing::info!(peer = %h.node, incarnation = %h.incarnation, "peer connected");
            if let Some(d) = self.mesh.dials.get_mut(&h.node) {
                d.backoff.reset();
            }
        }
        let events = self.view.hello(&h.node, h.incarnation, &h.roles);
        self.emit(events);
        if h.want_reply {
            let hello = self.hello(&h.node);
            if let Some(p) = self.mesh.peers.get(&h.node) {
                let _ = p.agent.cast(AgentMsg::Hello(hello));
            }
            self.mesh.greeted.insert(node_id);
        } else {
            self.greet(node_id);
        }
    }

    /// Stops every session with `peer`; true if there was one.
    pub(super) fn close_sessions_with(&self, peer: &NodeAddr, why: &str) -> bool {
        let mut closed = false;
        for s in self
            .mesh
            .sessions
            .values()
            .filter(|s| s.peer.as_ref() == Some(peer))
        {
            s.actor.stop(Some(why.to_string()));
            closed = true;
        }
        closed
    }

    /// Closes the sessions with `peer` as stale (at most once per 3 x unreachable-after); it
    /// is redialled while it is a member or seed.
    pub(super) fn close_stale_sessions(&mut self, peer: &NodeAddr, why: &str) {
        let now = Instant::now();
        let pause = self.s.unreachable_after * 3;
        if self
            .mesh
            .stale_closed
            .get(peer)
            .is_some_and(|t| now.duration_since(*t) < pause)
        {
            return;
        }
        if self.close_sessions_with(peer, &format!("stale session: {why}")) {
            tracing::info!(%peer, why, "closing a stale session; will redial");
            self.mesh.stale_closed.insert(peer.clone(), now);
        }
    }

    /// A session that has not authenticated `handshake-timeout` after it opened is closed:
    /// a client that connects and stays silent (or never completes the cookie's challenge)
    /// would otherwise hold a descriptor of this process for good.
    pub(super) fn on_handshake_due(&mut self, node_id: u64) {
        let Some(s) = self
            .mesh
            .sessions
            .get(&node_id)
            .filter(|s| !s.authenticated)
        else {
            return;
        };
        tracing::warn!(
            peer = %s.peer_addr,
            direction = if s.dialled.is_some() { "outbound" } else { "inbound" },
            timeout = ?self.s.handshake_timeout,
            "closing a connection that did not authenticate within cluster.handshake-timeout"
        );
        s.actor
            .stop(Some("no authentication within handshake-timeout".into()));
    }

    pub(super) fn on_session(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        change: SessionChange,
        ses: NodeServerSessionInformation,
    ) {
        let id = ses.node_id;
        match change {
            SessionChange::Opened => {
                myself.send_after(self.s.handshake_timeout, move || {
                    AgentMsg::Local(AgentLocal::HandshakeDue(id))
                });
                let dialled = (!ses.is_server)
                    .then(|| NodeAddr::parse("dialled", &ses.peer_addr).ok())
                    .flatten();
                self.mesh.sessions.insert(
                    id,
                    Session {
                        peer: None,
                        authenticated: false,
                        ready: false,
                        dialled,
                        peer_addr: ses.peer_addr,
                        actor: ses.actor,
                    },
                );
            }
            SessionChange::Authenticated | SessionChange::Ready => {
                let peer = ses.peer_name.as_ref().and_then(|n| node_of(&n.name));
                let s = self.mesh.sessions.entry(id).or_insert_with(|| Session {
                    peer: None,
                    authenticated: false,
                    ready: false,
                    dialled: None,
                    peer_addr: ses.peer_addr.clone(),
                    actor: ses.actor.clone(),
                });
                s.authenticated = true;
                s.peer = peer;
                if change == SessionChange::Ready {
                    s.ready = true;
                    self.greet(id);
                }
                self.retry_pending_hellos();
            }
            SessionChange::Disconnected => {
                self.mesh.greeted.remove(&id);
                let Some(s) = self.mesh.sessions.remove(&id) else {
                    return;
                };
                let named = ses.peer_name.as_ref().and_then(|n| node_of(&n.name));
                let duplicate = named.as_ref().is_some_and(|addr| {
                    self.mesh
                        .sessions
                        .values()
                        .any(|o| o.authenticated && o.peer.as_ref() == Some(addr))
                });
                if !s.authenticated && duplicate {
                    tracing::debug!(peer = %s.peer_addr, "duplicate session closed (ractor keeps one per pair)");
                } else if !s.authenticated {
                    tracing::warn!(
                        peer = %s.peer_addr,
                        direction = if s.dialled.is_some() { "outbound" } else { "inbound" },
                        "session closed before authentication: wrong cookie, TLS mismatch, or not a Tenure node"
                    );
                    if let Some(d) = s.dialled.as_ref().and_then(|a| self.mesh.dials.get_mut(a)) {
                        d.next_at = Instant::now() + d.backoff.failed();
                    }
                }
                let Some(addr) = s.peer else { return };
                let left = self
                    .mesh
                    .sessions
                    .values()
                    .any(|o| o.peer.as_ref() == Some(&addr));
                if !left {
                    self.datagrams.session_ended(&addr);
                }
                if self.mesh.peers.get(&addr).is_some_and(|p| p.node_id == id) {
                    // Another session with the same peer (a lost election) may survive.
                    let other = self
                        .mesh
                        .sessions
                        .iter()
                        .filter(|(_, o)| o.authenticated && o.peer.as_ref() == Some(&addr))
                        .find_map(|(oid, _)| self.agent_of(*oid).map(|a| (*oid, a)));
                    match other {
                        Some((oid, agent)) => {
                            if let Some(p) = self.mesh.peers.get_mut(&addr) {
                                p.node_id = oid;
                                p.agent = agent;
                            }
                        }
                        None => {
                            tracing::info!(peer = %addr, "session closed; will redial");
                            self.mesh.peers.remove(&addr);
                            let events = self.view.session_closed(&addr);
                            self.emit(events);
                            let d = self.dial_state(&addr);
                            d.next_at = Instant::now() + d.backoff.failed();
                        }
                    }
                }
            }
        }
    }

    pub(super) fn dial_state(&mut self, addr: &NodeAddr) -> &mut Dial {
        let (min, max) = (self.s.reconnect_backoff_min, self.s.reconnect_backoff_max);
        self.mesh.dials.entry(addr.clone()).or_insert_with(|| Dial {
            backoff: Backoff::new(min, max),
            next_at: Instant::now(),
            in_flight: false,
        })
    }

    pub(super) fn on_dialed(
        &mut self,
        peer: NodeAddr,
        result: Result<(), crate::transport::DialError>,
    ) {
        let dial_timeout = self.s.dial_timeout;
        let is_seed = self.s.seeds.contains(&peer);
        let d = self.dial_state(&peer);
        d.in_flight = false;
        match result {
            // Connected: authentication follows; do not redial before it had time to finish.
            Ok(()) => d.next_at = Instant::now() + dial_timeout,
            Err(e) => {
                let wait = d.backoff.failed();
                d.next_at = Instant::now() + wait;
                let n = d.backoff.failures();
                if n == 1 || n.is_multiple_of(10) {
                    tracing::info!(%peer, seed = is_seed, failures = n, retry_in = ?wait, error = %e, "cannot reach node; retrying");
                } else {
                    tracing::debug!(%peer, failures = n, error = %e, "cannot reach node");
                }
                if !is_seed && n >= 5 && self.view.get(&peer).is_none() {
                    self.mesh.gossip.remove(&peer);
                }
            }
        }
    }

    /// Dials the seeds, members and gossiped addresses this node has no session with, whose
    /// backoff has passed.
    pub(super) fn dial_due(&mut self, myself: &ActorRef<AgentMsg>, now: Instant) {
        let targets: BTreeSet<NodeAddr> = self
            .s
            .seeds
            .iter()
            .chain(self.view.peers())
            .chain(self.mesh.gossip.iter())
            .filter(|a| **a != self.me)
            .cloned()
            .collect();
        for addr in targets {
            // A session we dialled counts under the dialled address too (a seed given
            // under another name than the node's own).
            let connected = self
                .mesh
                .sessions
                .values()
                .any(|s| s.peer.as_ref() == Some(&addr) || s.dialled.as_ref() == Some(&addr));
            if connected {
                continue;
            }
            let d = self.dial_state(&addr);
            if d.in_flight || d.next_at > now {
                continue;
            }
            d.in_flight = true;
            let server = self.mesh.server.clone();
            #[cfg(feature = "fault-injection")]
            let gate = self.mesh.links.gate(&addr);
            let tls = self.mesh.tls.clone();
            let timeout = self.s.dial_timeout;
            let me = myself.clone();
            tokio::spawn(async move {
                #[cfg(feature = "fault-injection")]
                let result =
                    crate::transport::dial_gated(&server, &addr, gate, tls.as_ref(), timeout).await;
                #[cfg(not(feature = "fault-injection"))]
                let result = crate::transport::dial(&server, &addr, tls.as_ref(), timeout).await;
                let _ = me.cast(AgentMsg::Local(AgentLocal::Dialed { peer: addr, result }));
            });
        }
    }
}
