//! The agent: one remotable actor per node that owns the node's membership. It holds the
//! member lease (through a LeaseActor), lists the other member leases, greets and
//! heartbeats peers, dials them (with backoff) and tells subscribers what changed.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use ractor::concurrency::JoinHandle;
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent, pg};
use ractor_cluster::node::NodeServerSessionInformation;
use ractor_cluster::{NodeEventSubscription, NodeServerMessage, NodeSessionMessage};
use tenure_lease::store::bounded;
use tenure_lease::{
    Lease, LeaseActor, LeaseEvent, LeaseEventSink, LeaseMsg, LeaseObserver, LeaseRecord, LeaseSpec,
    LeaseStore,
};
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::history::History;
use crate::identity::{Incarnation, NodeAddr};
use crate::member::{ClusterEvent, Listed, Member, Membership};
use crate::placement::{Placement, PlacementMismatch};
use crate::protocol::{
    AgentMsg, FaultReply, Heartbeat, Hello, Inspect, Leaving, LeavingAck, Local, MemberInfo,
    NodeView, PROTOCOL_VERSION, SessionChange, SetLink,
};
use crate::settings::ClusterSettings;
use crate::subscribe::{ClusterSubscriber, HandOver, HandOverWait};
use crate::transport::{LinkFault, Links, Tls, dial};
use tenure_lease::history::{AboutMember, Event, Link};

mod downing;
mod operator;

/// The pg group every node's agent joins, in the scope of its system.
pub(crate) const AGENT_GROUP: &str = "agent";

/// The pg scope of a system's cluster actors.
pub fn scope(system: &str) -> String {
    format!("tenure/{system}")
}

/// The note kept with a member lease: who holds it, in which life, its join ticket, and
/// the settings that decide where its entities live.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct MemberNote {
    pub node: NodeAddr,
    pub incarnation: Incarnation,
    pub age: u64,
    #[serde(default)]
    pub roles: Vec<String>,
    pub placement: Placement,
    /// Keyed digest of the above with the cookie: only nodes with the cluster's cookie
    /// can write a member lease the others accept.
    pub proof: String,
}

impl MemberNote {
    fn new(
        key: &str,
        system: &str,
        node: NodeAddr,
        incarnation: Incarnation,
        age: u64,
        roles: Vec<String>,
        placement: Placement,
    ) -> MemberNote {
        let mut note = MemberNote {
            node,
            incarnation,
            age,
            roles,
            placement,
            proof: String::new(),
        };
        note.proof = note.expected_proof(key, system);
        note
    }

    /// The proof a node with cookie (and CA) `key` in `system` would have written.
    fn expected_proof(&self, key: &str, system: &str) -> String {
        use sha2::{Digest, Sha256};
        let roles = self.roles.join(",");
        let placement = serde_json::to_string(&self.placement).unwrap_or_default();
        let digest = Sha256::digest(format!(
            "tenure-member\n{key}\n{system}\n{}\n{}\n{}\n{roles}\n{placement}",
            self.node, self.incarnation, self.age
        ));
        digest[..12].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A member whose placement differs from this node's, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub member: NodeAddr,
    pub mismatch: PlacementMismatch,
}

/// The key of member proofs: the cookie, and the CA fingerprint when TLS is on (so that
/// plain-text or other-CA nodes sharing the store are not members either).
fn proof_key(cookie: &str, tls: Option<&Tls>) -> String {
    format!(
        "{cookie}\n{}",
        tls.map(|t| t.ca_fingerprint.as_str())
            .unwrap_or("plaintext")
    )
}

/// Takes a join ticket: grants of one lease name get strictly increasing tokens, so
/// acquiring (and at once releasing) `<system>-join` numbers joins in order. The ticket is
/// the member's age. The lease's own retrying does the waiting; `None` if the agent stopped
/// first.
async fn take_ticket(spec: LeaseSpec, agent: ActorRef<AgentMsg>) -> Option<u64> {
    let lease = match Lease::start(spec).await {
        Ok(lease) => lease,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the join ticket lease");
            return None;
        }
    };
    let ticket = tokio::select! {
        got = lease.acquire_wait() => got.map_err(|e| tracing::warn!(error = %e, "no join ticket")).ok(),
        _ = agent.wait(None) => None,
    };
    if let Err(e) = lease.release().await {
        tracing::debug!(error = %e, "join ticket not released; it expires");
    }
    ticket
}

pub(crate) struct Agent;

pub(crate) struct AgentArgs {
    pub settings: ClusterSettings,
    pub incarnation: Incarnation,
    pub server: ActorRef<NodeServerMessage>,
    pub tls: Option<Tls>,
    pub links: Arc<Links>,
    pub store: Arc<dyn LeaseStore>,
    pub history: Option<History>,
    /// Where the member lease and join tickets report their traces (the provider's
    /// observers: the history, a management endpoint).
    pub lease_observer: Option<LeaseObserver>,
    /// Set when this node is refused at join (its placement differs from a member's).
    pub refused: Arc<std::sync::OnceLock<Refusal>>,
    /// Set (to why) when the split brain resolver downed this node and it exits.
    pub downed: Arc<std::sync::OnceLock<String>>,
    /// Set to who asked when an operator asks this node to leave (`Node::leave_requested`).
    pub leave_requests: Arc<tokio::sync::watch::Sender<Option<String>>>,
}

struct Session {
    /// The peer's node address, once authenticated (None for non-node peers such as the CLI).
    peer: Option<NodeAddr>,
    authenticated: bool,
    ready: bool,
    /// The address we dialled, for outbound sessions.
    dialled: Option<NodeAddr>,
    peer_addr: String,
    actor: ActorRef<NodeSessionMessage>,
}

struct Peer {
    incarnation: Incarnation,
    node_id: u64,
    agent: ActorRef<AgentMsg>,
}

struct Dial {
    backoff: Backoff,
    next_at: Instant,
    in_flight: bool,
}

pub(crate) struct AgentState {
    s: ClusterSettings,
    me: NodeAddr,
    incarnation: Incarnation,
    scope: String,
    server: ActorRef<NodeServerMessage>,
    tls: Option<Tls>,
    links: Arc<Links>,
    store: Arc<dyn LeaseStore>,
    /// The LeaseActor of the member lease, once a join ticket was taken.
    member_lease: Option<ActorRef<LeaseMsg>>,
    /// The join ticket of the current membership (this node's age).
    ticket: Option<u64>,
    /// A join ticket is being taken.
    ticketing: bool,
    history: Option<History>,
    lease_observer: Option<LeaseObserver>,
    /// Member leases of nodes with another cookie, already warned about.
    foreign: std::collections::HashSet<(NodeAddr, Incarnation)>,
    /// Member leases of nodes that place entities differently, already warned about.
    misplaced: std::collections::HashSet<(NodeAddr, Incarnation)>,
    /// The token of this node's member lease grant whose placement check is under way:
    /// the node counts itself up only once it passed.
    verifying: Option<u64>,
    refused: Arc<std::sync::OnceLock<Refusal>>,
    downed: Arc<std::sync::OnceLock<String>>,
    leave_requests: Arc<tokio::sync::watch::Sender<Option<String>>>,
    /// Memberships downed on an operator's request, with the notice a member heartbeating
    /// under one of them is sent (it says why, where the resolver's `YouAreDown` would not).
    operator_downs:
        std::collections::BTreeMap<(NodeAddr, Incarnation, u64), crate::protocol::MemberDowned>,
    /// The split brain resolver, unless `active-strategy = "off"`.
    downing: Option<downing::Downing>,
    /// Hellos that arrived before their session was known here.
    pending_hellos: HashMap<NodeAddr, Hello>,
    view: Membership,
    reach: crate::reachability::Reachability,
    sessions: HashMap<u64, Session>,
    peers: HashMap<NodeAddr, Peer>,
    greeted: BTreeSet<u64>,
    /// When a hello was last re-requested from a peer we hear without knowing it.
    regreeted: HashMap<NodeAddr, Instant>,
    /// When sessions with a peer were last closed as stale (at most once per 3 x unreachable-after).
    stale_closed: HashMap<NodeAddr, Instant>,
    gossip: BTreeSet<NodeAddr>,
    dials: HashMap<NodeAddr, Dial>,
    subscribers: Vec<ClusterSubscriber>,
    polling: bool,
    /// The last listing failed (logged once per outage).
    list_failing: bool,
    leaving: bool,
    timers: Vec<JoinHandle<()>>,
}

struct Forward(ActorRef<AgentMsg>);

impl Forward {
    fn send(&self, change: SessionChange, ses: NodeServerSessionInformation) {
        let _ = self
            .0
            .cast(AgentMsg::Local(Local::Session(change, Box::new(ses))));
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

impl Actor for Agent {
    type Msg = AgentMsg;
    type State = AgentState;
    type Arguments = AgentArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<AgentMsg>,
        a: AgentArgs,
    ) -> Result<AgentState, ActorProcessingErr> {
        a.server.cast(NodeServerMessage::SubscribeToEvents {
            id: "tenure-agent".into(),
            subscription: Box::new(Forward(myself.clone())),
        })?;
        // Sessions opened before the subscription took effect get no events: read them.
        let existing = ractor::call_t!(a.server, NodeServerMessage::GetSessions, 5000)?;
        let sessions: HashMap<u64, Session> = existing
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
        let scope = scope(&a.settings.system);
        pg::join_scoped(scope.clone(), AGENT_GROUP.into(), vec![myself.get_cell()]);
        pg::monitor_scope(scope.clone(), myself.get_cell());
        let timers = vec![
            myself.send_interval(a.settings.heartbeat_interval, || {
                AgentMsg::Local(Local::Tick)
            }),
            myself.send_interval(a.settings.membership_interval, || {
                AgentMsg::Local(Local::Poll)
            }),
        ];
        let me = a.settings.addr.clone();
        if let Some(h) = &a.history {
            h.record(Event::NodeStarted {});
        }
        let _ = myself.cast(AgentMsg::Local(Local::Poll));
        spawn_ticket(
            &myself,
            &a.settings,
            a.store.clone(),
            a.lease_observer.clone(),
        );
        let _ = myself.cast(AgentMsg::Local(Local::Tick));
        Ok(AgentState {
            view: Membership::new(me.clone(), a.incarnation, a.settings.roles.clone()),
            me,
            incarnation: a.incarnation,
            scope,
            server: a.server,
            tls: a.tls,
            links: a.links,
            store: a.store,
            member_lease: None,
            ticket: None,
            ticketing: true,
            history: a.history,
            lease_observer: a.lease_observer,
            pending_hellos: HashMap::new(),
            foreign: Default::default(),
            misplaced: Default::default(),
            verifying: None,
            refused: a.refused,
            downed: a.downed,
            leave_requests: a.leave_requests,
            operator_downs: Default::default(),
            downing: a
                .settings
                .split_brain_resolver
                .clone()
                .map(downing::Downing::new),
            reach: Default::default(),
            sessions,
            peers: HashMap::new(),
            regreeted: HashMap::new(),
            stale_closed: HashMap::new(),
            greeted: BTreeSet::new(),
            gossip: BTreeSet::new(),
            dials: HashMap::new(),
            subscribers: Vec::new(),
            polling: false,
            list_failing: false,
            leaving: false,
            timers,
            s: a.settings,
        })
    }

    async fn post_stop(
        &self,
        myself: ActorRef<AgentMsg>,
        state: &mut AgentState,
    ) -> Result<(), ActorProcessingErr> {
        for t in &state.timers {
            t.abort();
        }
        let _ = state.server.cast(NodeServerMessage::UnsubscribeToEvents(
            "tenure-agent".into(),
        ));
        pg::demonitor_scope(state.scope.clone(), myself.get_id());
        pg::leave_scoped(
            state.scope.clone(),
            AGENT_GROUP.into(),
            vec![myself.get_cell()],
        );
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<AgentMsg>,
        msg: AgentMsg,
        state: &mut AgentState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            AgentMsg::Hello(h) => state.on_hello(h),
            AgentMsg::Heartbeat(hb) => state.on_heartbeat(hb),
            AgentMsg::YouAreDown(notice) => state.on_you_are_down(&myself, notice),
            AgentMsg::Leaving(l, reply) => {
                state.reach.heard(&l.node, Instant::now());
                let events = state.view.leaving(&l.node, l.incarnation);
                state.emit(events);
                let _ = reply.send(LeavingAck {});
            }
            AgentMsg::Inspect(Inspect {}, reply) => {
                let _ = reply.send(state.node_view());
            }
            AgentMsg::SetLink(fault, reply) => {
                let _ = reply.send(state.set_link(fault));
            }
            AgentMsg::Leave(req, reply) => state.on_leave_request(req, reply),
            AgentMsg::Down(req, reply) => {
                let _ = reply.send(state.on_down_request(&myself, req));
            }
            AgentMsg::Downed(notice) => state.on_member_downed(&myself, notice),
            AgentMsg::Local(local) => {
                use tracing::Instrument;
                // Every log line of the node's membership work names the node.
                let span = tracing::info_span!("node", addr = %state.me);
                state.on_local(&myself, local).instrument(span).await?
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<AgentMsg>,
        event: SupervisionEvent,
        state: &mut AgentState,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ProcessGroupChanged(pg::GroupChangeMessage::Join(
                scope,
                group,
                cells,
            )) if scope == state.scope && group == AGENT_GROUP => {
                for cell in cells {
                    if let ActorId::Remote { node_id, .. } = cell.get_id() {
                        state.greet(node_id);
                    }
                }
                state.retry_pending_hellos();
            }
            SupervisionEvent::ActorFailed(cell, err) if state.is_member_lease(&cell) => {
                return Err(format!("member lease actor failed: {err}").into());
            }
            SupervisionEvent::ActorTerminated(cell, _, reason)
                if state.is_member_lease(&cell) && !state.leaving =>
            {
                return Err(format!("member lease actor stopped: {reason:?}").into());
            }
            _ => {}
        }
        Ok(())
    }
}

fn spawn_ticket(
    myself: &ActorRef<AgentMsg>,
    s: &ClusterSettings,
    store: Arc<dyn LeaseStore>,
    observer: Option<LeaseObserver>,
) {
    let spec = LeaseSpec::new(
        &format!("{}-join", s.system),
        &s.addr.to_string(),
        store,
        s.member_lease,
    )
    .map(|spec| match observer {
        Some(o) => spec.with_observer(o),
        None => spec,
    })
    .map(|spec| spec.with_note("join ticket (released at once)"));
    let me = myself.clone();
    match spec {
        Ok(spec) => {
            let pause = s.member_lease.lease_retry_interval;
            tokio::spawn(async move {
                let ticket = take_ticket(spec, me.clone()).await;
                if ticket.is_none() {
                    // Asked again after this pause, so that a failing start does not spin.
                    tokio::time::sleep(pause).await;
                }
                let _ = me.cast(AgentMsg::Local(Local::Ticket(ticket)));
            });
        }
        Err(e) => tracing::error!(error = %e, "cannot take a join ticket"),
    }
}

impl AgentState {
    /// Takes a join ticket, unless one is being taken already (two tickets would start two
    /// member lease actors, the second waiting forever on the first's grant).
    pub(super) fn request_ticket(&mut self, myself: &ActorRef<AgentMsg>) {
        if self.ticketing {
            return;
        }
        self.ticketing = true;
        spawn_ticket(
            myself,
            &self.s,
            self.store.clone(),
            self.lease_observer.clone(),
        );
    }

    fn is_member_lease(&self, cell: &ractor::ActorCell) -> bool {
        self.member_lease
            .as_ref()
            .is_some_and(|l| l.get_id() == cell.get_id())
    }

    /// Starts holding the member lease for a membership numbered `ticket`.
    async fn join(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        ticket: u64,
    ) -> Result<(), ActorProcessingErr> {
        let note = serde_json::to_string(&MemberNote::new(
            &proof_key(&self.s.cookie, self.tls.as_ref()),
            &self.s.system,
            self.me.clone(),
            self.incarnation,
            ticket,
            self.s.roles.clone(),
            self.s.placement.clone(),
        ))?;
        let spec = LeaseSpec::new(
            &self.s.member_lease_name(&self.me),
            &self.me.to_string(),
            self.store.clone(),
            self.s.member_lease,
        )?
        .with_note(note);
        let spec = match &self.lease_observer {
            Some(o) => spec.with_observer(o.clone()),
            None => spec,
        };
        let agent = myself.clone();
        let sink = LeaseEventSink::new(move |event| {
            let _ = agent.cast(AgentMsg::Local(Local::MemberLease { ticket, event }));
        });
        let (lease, _) = LeaseActor::start(spec, sink, Some(myself.get_cell())).await?;
        lease.cast(LeaseMsg::Acquire { reply: None })?;
        tracing::info!(node = %self.me, age = ticket, "joining: acquiring the member lease");
        self.ticket = Some(ticket);
        self.member_lease = Some(lease);
        Ok(())
    }

    fn hello(&self) -> Hello {
        Hello {
            protocol: PROTOCOL_VERSION,
            system: self.s.system.clone(),
            node: self.me.clone(),
            incarnation: self.incarnation,
            known: self.view.peers().cloned().collect(),
            want_reply: false,
            roles: self.s.roles.clone(),
        }
    }

    fn agent_of(&self, node_id: u64) -> Option<ActorRef<AgentMsg>> {
        pg::get_scoped_members(&self.scope, &AGENT_GROUP.to_string())
            .into_iter()
            .find(|c| matches!(c.get_id(), ActorId::Remote { node_id: n, .. } if n == node_id))
            .map(ActorRef::from)
    }

    /// Retries the hellos that came before their session or agent was known.
    fn retry_pending_hellos(&mut self) {
        for (_, h) in std::mem::take(&mut self.pending_hellos) {
            self.on_hello(h);
        }
    }

    /// Says hello on session `node_id` once it is ready and its agent is known.
    fn greet(&mut self, node_id: u64) {
        let ready = self
            .sessions
            .get(&node_id)
            .is_some_and(|s| s.ready && s.peer.is_some());
        if !ready || self.greeted.contains(&node_id) {
            return;
        }
        if let Some(agent) = self.agent_of(node_id) {
            self.greeted.insert(node_id);
            let _ = agent.cast(AgentMsg::Hello(self.hello()));
        }
    }

    /// Asks `peer` for a hello (at most once a second): we hear it but never got one, e.g.
    /// its hello travelled on a session that then lost ractor's duplicate election.
    fn request_hello(&mut self, peer: &NodeAddr) {
        let now = Instant::now();
        if self
            .regreeted
            .get(peer)
            .is_some_and(|t| now.duration_since(*t) < Duration::from_secs(1))
        {
            return;
        }
        let target = self
            .sessions
            .iter()
            .filter(|(_, s)| s.authenticated && s.peer.as_ref() == Some(peer))
            .find_map(|(id, _)| self.agent_of(*id));
        if let Some(agent) = target {
            self.regreeted.insert(peer.clone(), now);
            let mut hello = self.hello();
            hello.want_reply = true;
            let _ = agent.cast(AgentMsg::Hello(hello));
        }
    }

    fn on_hello(&mut self, h: Hello) {
        if h.protocol != PROTOCOL_VERSION || h.system != self.s.system {
            tracing::error!(
                peer = %h.node,
                peer_protocol = h.protocol,
                our_protocol = PROTOCOL_VERSION,
                peer_system = %h.system,
                our_system = %self.s.system,
                "refusing peer: incompatible protocol version or another system; closing the session"
            );
            // Redial it only after the longest backoff.
            self.close_sessions_with(&h.node, "incompatible peer");
            let max = self.s.reconnect_backoff_max;
            self.dial_state(&h.node).next_at = Instant::now() + max;
            return;
        }
        let Some((node_id, agent)) = self
            .sessions
            .iter()
            .filter(|(_, s)| s.authenticated && s.peer.as_ref() == Some(&h.node))
            .find_map(|(id, _)| self.agent_of(*id).map(|a| (*id, a)))
        else {
            // Its session events or its agent's pg entry are still on their way.
            self.pending_hellos.insert(h.node.clone(), h);
            return;
        };
        let now = Instant::now();
        for addr in h.known {
            if addr != self.me && self.view.get(&addr).is_none() {
                self.gossip.insert(addr);
            }
        }
        let fresh = self
            .peers
            .get(&h.node)
            .is_none_or(|p| p.incarnation != h.incarnation);
        self.peers.insert(
            h.node.clone(),
            Peer {
                incarnation: h.incarnation,
                node_id,
                agent,
            },
        );
        if fresh {
            tracing::info!(peer = %h.node, incarnation = %h.incarnation, "peer connected");
            if let Some(d) = self.dials.get_mut(&h.node) {
                d.backoff.reset();
            }
        }
        let events = self.view.hello(&h.node, h.incarnation, &h.roles);
        self.emit(events);
        self.reach.heard(&h.node, now);
        if h.want_reply {
            if let Some(p) = self.peers.get(&h.node) {
                let _ = p.agent.cast(AgentMsg::Hello(self.hello()));
            }
            self.greeted.insert(node_id);
        } else {
            self.greet(node_id);
        }
    }

    /// Stops every session with `peer`; true if there was one.
    fn close_sessions_with(&self, peer: &NodeAddr, why: &str) -> bool {
        let mut closed = false;
        for s in self
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
    fn close_stale_sessions(&mut self, peer: &NodeAddr, why: &str) {
        let now = Instant::now();
        let pause = self.s.unreachable_after * 3;
        if self
            .stale_closed
            .get(peer)
            .is_some_and(|t| now.duration_since(*t) < pause)
        {
            return;
        }
        if self.close_sessions_with(peer, &format!("stale session: {why}")) {
            tracing::info!(%peer, why, "closing a stale session; will redial");
            self.stale_closed.insert(peer.clone(), now);
        }
    }

    fn on_heartbeat(&mut self, hb: Heartbeat) {
        let known = self
            .peers
            .get(&hb.node)
            .is_some_and(|p| p.incarnation == hb.incarnation);
        if !known {
            self.request_hello(&hb.node);
            return;
        }
        self.tell_if_downed(&hb.node, hb.incarnation, hb.age);
        if let Some(d) = self.downing.as_mut() {
            d.heard(&hb.node, hb.hears.contains(&self.me), Instant::now());
        }
        self.merge_rows(hb.reach);
        self.reach.heard(&hb.node, Instant::now());
        if self.view.get(&hb.node).is_some_and(|m| !m.reachable) {
            let events = self.view.set_reachable(&hb.node, true);
            self.emit(events);
        }
    }

    async fn on_local(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        local: Local,
    ) -> Result<(), ActorProcessingErr> {
        match local {
            Local::Session(change, ses) => self.on_session(change, *ses),
            Local::Ticket(ticket) => {
                self.ticketing = false;
                // A ticket taken before this node downed itself: it rejoins with a new one.
                let downed = self.downing.as_ref().is_some_and(|d| d.is_downed());
                if self.leaving || downed {
                    return Ok(());
                }
                match ticket {
                    Some(ticket) => {
                        // One member lease actor at a time: an earlier membership's goes.
                        if let Some(old) = self.member_lease.take() {
                            old.unlink(myself.get_cell());
                            old.stop(Some("replaced by a new membership".into()));
                        }
                        self.join(myself, ticket).await?;
                    }
                    None if self.member_lease.is_none() => self.request_ticket(myself),
                    None => {}
                }
            }
            Local::MemberLease { ticket, event } if self.ticket != Some(ticket) => {
                tracing::debug!(ticket, ?event, "event of an earlier membership's member lease ignored");
            }
            Local::MemberLease {
                event: LeaseEvent::Granted(g),
                ..
            } => {
                tracing::info!(node = %self.me, token = g.token, "member lease granted: checking placement against the members");
                self.verifying = Some(g.token);
                self.list_for_join(myself, g.token, Duration::ZERO);
            }
            Local::JoinCheck { token, listed } => {
                if self.verifying != Some(token) {
                    // Lost meanwhile: the next grant is checked anew.
                    return Ok(());
                }
                match listed {
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot list member leases to check placement; retrying");
                        self.list_for_join(myself, token, self.s.membership_interval);
                    }
                    Ok(records) => match self.placement_refusal(&records) {
                        Some(refusal) => return self.refuse(refusal).await,
                        None => {
                            self.verifying = None;
                            let age = self.ticket.unwrap_or_default();
                            tracing::info!(node = %self.me, token, age, "placement agrees with every member: up");
                            let events = self.view.self_granted(age);
                            if let Some(d) = self.downing.as_mut() {
                                d.membership_up(Instant::now());
                            }
                            self.emit(events);
                        }
                    },
                }
            }
            Local::MemberLease {
                event: LeaseEvent::Lost(l),
                ..
            } => {
                self.verifying = None;
                tracing::warn!(node = %self.me, token = l.token, reason = %l.reason, "member lease lost: this node is down");
                let events = self.view.self_lost();
                self.emit(events);
                if let Some(d) = self.downing.as_mut() {
                    d.membership_ended();
                }
                let downed = self.downing.as_ref().is_some_and(|d| d.is_downed());
                if !self.leaving && !downed {
                    // Rejoin as a new (youngest) membership: new ticket, new lease actor.
                    if let Some(old) = self.member_lease.take() {
                        old.unlink(myself.get_cell());
                        old.stop(Some("member lease lost".into()));
                    }
                    self.ticket = None;
                    self.request_ticket(myself);
                }
            }
            // Member leases are plain (priority 0): a forceful preemption arrives as a loss.
            Local::MemberLease {
                event:
                    LeaseEvent::PreemptionRequested(_)
                    | LeaseEvent::PreemptionWithdrawn(_)
                    // Renewals failing before the deadline: the grant is still ours, and
                    // the stop budget acts on a loss, not on doubt.
                    | LeaseEvent::Suspended(_)
                    | LeaseEvent::Resumed(_),
                ..
            } => {}
            Local::Tick => self.tick(myself),
            Local::Poll => {
                if !self.polling {
                    self.polling = true;
                    let store = self.store.clone();
                    let prefix = self.s.member_prefix();
                    let timeout = self.s.member_lease.lease_operation_timeout;
                    let me = myself.clone();
                    tokio::spawn(async move {
                        let listed = bounded(&prefix, "list", timeout, store.list(&prefix))
                            .await
                            .map_err(|e| e.to_string());
                        let _ = me.cast(AgentMsg::Local(Local::Listed(listed)));
                    });
                }
            }
            Local::Listed(result) => {
                self.polling = false;
                match result {
                    Ok(records) => {
                        if std::mem::take(&mut self.list_failing) {
                            tracing::info!("member leases can be listed again");
                        }
                        let listing = self.parse_listing(&records);
                        let events = self.view.listed(&listing);
                        self.emit(events);
                    }
                    Err(e) if !self.list_failing => {
                        self.list_failing = true;
                        tracing::warn!(error = %e, "cannot list member leases; the view is not updated until the store answers");
                    }
                    Err(e) => tracing::debug!(error = %e, "cannot list member leases"),
                }
            }
            Local::Dialed { peer, result } => self.on_dialed(peer, result),
            Local::SbrLease { attempt, won } => self.on_sbr_lease(myself, attempt, won),
            Local::Subscribe(sub) => {
                if sub.deliver(ClusterEvent::CurrentMembers(self.view.members())) {
                    self.subscribers.push(sub);
                }
            }
            Local::Leave(reply) => {
                self.leaving = true;
                let (guard, wait) = HandOver::new();
                let events = self.view.self_leaving(guard);
                self.emit(events);
                let notice = Leaving {
                    node: self.me.clone(),
                    incarnation: self.incarnation,
                };
                let peers = self.peers.values().map(|p| p.agent.clone()).collect();
                let _ = reply.send(LeaveAnswer {
                    hand_over: wait,
                    member_lease: self.member_lease.clone(),
                    peers,
                    notice,
                });
            }
        }
        Ok(())
    }

    /// The member leases written by nodes with our cookie.
    fn parse_listing(&mut self, records: &[LeaseRecord]) -> Vec<Listed> {
        let mut listed = Vec::new();
        for r in records {
            let Some(note) = r
                .note
                .as_deref()
                .and_then(|n| serde_json::from_str::<MemberNote>(n).ok())
            else {
                continue;
            };
            let Ok(owner) = NodeAddr::parse("member lease owner", &r.owner) else {
                continue;
            };
            let key = proof_key(&self.s.cookie, self.tls.as_ref());
            if owner != note.node || note.expected_proof(&key, &self.s.system) != note.proof {
                if self.foreign.insert((owner.clone(), note.incarnation)) {
                    tracing::warn!(member = %owner, incarnation = %note.incarnation, "ignoring a member lease written with another cookie or TLS CA: that node is not a member");
                }
                continue;
            }
            // A node that places entities differently is refused at its join (or refuses
            // itself); until then it must not count as a member here either.
            if owner != self.me
                && let Some(m) = self.s.placement.mismatch(&note.placement)
            {
                if self.misplaced.insert((owner.clone(), note.incarnation)) {
                    tracing::warn!(member = %owner, key = %m.key, mine = %m.mine, theirs = %m.theirs, "ignoring a member lease of a node that places entities differently: that node is not a member");
                }
                continue;
            }
            listed.push(Listed {
                addr: owner,
                incarnation: note.incarnation,
                age: note.age,
                roles: note.roles,
            });
        }
        listed
    }

    /// Lists the member leases (after `wait`) for the placement check of grant `token`.
    ///
    /// Why two nodes joining at once with different placements cannot both get in: each
    /// writes its member lease (with its placement) and only then lists the member leases.
    /// The store orders the four operations; if A's listing does not show B's lease, it
    /// came before B's write, so B's listing, after B's write, shows A's lease, and B
    /// refuses itself. A node already up renews its lease, so every joiner sees it.
    fn list_for_join(&self, myself: &ActorRef<AgentMsg>, token: u64, wait: Duration) {
        let store = self.store.clone();
        let prefix = self.s.member_prefix();
        let timeout = self.s.member_lease.lease_operation_timeout;
        let me = myself.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let listed = bounded(&prefix, "list", timeout, store.list(&prefix))
                .await
                .map_err(|e| e.to_string());
            let _ = me.cast(AgentMsg::Local(Local::JoinCheck { token, listed }));
        });
    }

    /// The first listed member (with our cookie, another address) whose placement differs
    /// from this node's.
    fn placement_refusal(&self, records: &[LeaseRecord]) -> Option<Refusal> {
        let key = proof_key(&self.s.cookie, self.tls.as_ref());
        records.iter().find_map(|r| {
            let note: MemberNote = serde_json::from_str(r.note.as_deref()?).ok()?;
            let genuine = note.node.to_string() == r.owner
                && note.expected_proof(&key, &self.s.system) == note.proof;
            if !genuine || note.node == self.me {
                return None;
            }
            let mismatch = self.s.placement.mismatch(&note.placement)?;
            Some(Refusal {
                member: note.node,
                mismatch,
            })
        })
    }

    /// Refuses this node: records why, gives the member lease back and stops the agent
    /// (and with it the node). It never counted itself up.
    async fn refuse(&mut self, refusal: Refusal) -> Result<(), ActorProcessingErr> {
        let m = &refusal.mismatch;
        tracing::error!(node = %self.me, member = %refusal.member, key = %m.key, mine = %m.mine, theirs = %m.theirs,
            "refused to join: this node places entities differently from a member");
        if let Some(h) = &self.history {
            h.record(Event::NodeRefused {
                member: refusal.member.to_string(),
                key: m.key.clone(),
                mine: m.mine.clone(),
                theirs: m.theirs.clone(),
            });
        }
        let _ = self.refused.set(refusal);
        self.verifying = None;
        self.leaving = true;
        if let Some(lease) = self.member_lease.take() {
            let timeout = self.s.member_lease.lease_operation_timeout + RELEASE_SLACK;
            let _ = lease
                .stop_and_wait(Some("refused to join".into()), Some(timeout))
                .await;
        }
        Err("refused to join: its placement differs from a member's".into())
    }

    fn on_session(&mut self, change: SessionChange, ses: NodeServerSessionInformation) {
        let id = ses.node_id;
        match change {
            SessionChange::Opened => {
                let dialled = (!ses.is_server)
                    .then(|| NodeAddr::parse("dialled", &ses.peer_addr).ok())
                    .flatten();
                self.sessions.insert(
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
                let s = self.sessions.entry(id).or_insert_with(|| Session {
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
                self.greeted.remove(&id);
                let Some(s) = self.sessions.remove(&id) else {
                    return;
                };
                let named = ses.peer_name.as_ref().and_then(|n| node_of(&n.name));
                let duplicate = named.as_ref().is_some_and(|addr| {
                    self.sessions
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
                    if let Some(d) = s.dialled.as_ref().and_then(|a| self.dials.get_mut(a)) {
                        d.next_at = Instant::now() + d.backoff.failed();
                    }
                }
                let Some(addr) = s.peer else { return };
                if self.peers.get(&addr).is_some_and(|p| p.node_id == id) {
                    // Another session with the same peer (a lost election) may survive.
                    let other = self
                        .sessions
                        .iter()
                        .filter(|(_, o)| o.authenticated && o.peer.as_ref() == Some(&addr))
                        .find_map(|(oid, _)| self.agent_of(*oid).map(|a| (*oid, a)));
                    match other {
                        Some((oid, agent)) => {
                            if let Some(p) = self.peers.get_mut(&addr) {
                                p.node_id = oid;
                                p.agent = agent;
                            }
                        }
                        None => {
                            tracing::info!(peer = %addr, "session closed; will redial");
                            self.peers.remove(&addr);
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

    fn dial_state(&mut self, addr: &NodeAddr) -> &mut Dial {
        let (min, max) = (self.s.reconnect_backoff_min, self.s.reconnect_backoff_max);
        self.dials.entry(addr.clone()).or_insert_with(|| Dial {
            backoff: Backoff::new(min, max),
            next_at: Instant::now(),
            in_flight: false,
        })
    }

    fn on_dialed(&mut self, peer: NodeAddr, result: Result<(), String>) {
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
                    self.gossip.remove(&peer);
                }
            }
        }
    }

    /// Every `heartbeat-interval`: heartbeats out, reachability, dials.
    fn tick(&mut self, myself: &ActorRef<AgentMsg>) {
        let now = Instant::now();
        let hb = Heartbeat {
            node: self.me.clone(),
            incarnation: self.incarnation,
            age: if self.view.me().status == crate::member::MemberStatus::Up {
                self.view.me().age
            } else {
                0
            },
            reach: self.downing.as_ref().map(|d| d.rows()).unwrap_or_default(),
            hears: self
                .downing
                .as_ref()
                .map(|d| d.hearing(now, self.s.unreachable_after))
                .unwrap_or_default(),
        };
        for p in self.peers.values() {
            let _ = p.agent.cast(AgentMsg::Heartbeat(hb.clone()));
        }
        for (addr, reachable) in self.reach.states(now, self.s.unreachable_after) {
            let events = self.view.set_reachable(&addr, reachable);
            self.emit(events);
            // ractor_cluster never times a session out: a session silent this long is
            // probably half-open (peer host gone, partition). Close it so that a redial (or
            // the peer's next life) gets a fresh one instead of losing an election to it.
            let stale = self
                .reach
                .silence(&addr, now)
                .is_some_and(|d| d > self.s.unreachable_after * 3);
            if stale {
                self.close_stale_sessions(&addr, "silent for 3 x unreachable-after");
            }
        }
        self.resolve(myself, now);
        if self.leaving {
            return;
        }
        let targets: BTreeSet<NodeAddr> = self
            .s
            .seeds
            .iter()
            .chain(self.view.peers())
            .chain(self.gossip.iter())
            .filter(|a| **a != self.me)
            .cloned()
            .collect();
        for addr in targets {
            // A session we dialled counts under the dialled address too (a seed given
            // under another name than the node's own).
            let connected = self
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
            let server = self.server.clone();
            let gate = self.links.gate(&addr);
            let tls = self.tls.clone();
            let timeout = self.s.dial_timeout;
            let me = myself.clone();
            tokio::spawn(async move {
                let result = dial(&server, &addr, gate, tls.as_ref(), timeout).await;
                let _ = me.cast(AgentMsg::Local(Local::Dialed { peer: addr, result }));
            });
        }
    }

    fn emit(&mut self, events: Vec<ClusterEvent>) {
        let now = Instant::now();
        let changed = !events.is_empty();
        for event in events {
            self.observe(&event, now);
            self.subscribers.retain(|s| s.deliver(event.clone()));
        }
        if changed {
            crate::metrics::membership(self.view.me(), &self.view.members());
        }
    }

    /// Bookkeeping, logging and history of one event.
    fn observe(&mut self, event: &ClusterEvent, now: Instant) {
        let (kind, member): (&str, Option<&Member>) = match event {
            ClusterEvent::MemberJoined(m) => ("member_joined", Some(m)),
            ClusterEvent::MemberUp(m) => ("member_up", Some(m)),
            ClusterEvent::MemberLeaving(m) => ("member_leaving", Some(m)),
            ClusterEvent::MemberDown(m) => ("member_down", Some(m)),
            ClusterEvent::MemberRemoved(m) => ("member_removed", Some(m)),
            ClusterEvent::Unreachable(m) => ("unreachable", Some(m)),
            ClusterEvent::Reachable(m) => ("reachable", Some(m)),
            ClusterEvent::SelfDown => ("self_down", None),
            ClusterEvent::SelfLeaving(_) => ("self_leaving", None),
            ClusterEvent::CurrentMembers(_) => return,
        };
        crate::metrics::event(kind);
        if let Some(m) = member {
            if m.addr != self.me {
                match event {
                    ClusterEvent::MemberJoined(_) | ClusterEvent::MemberUp(_) => {
                        self.reach.watch(&m.addr, now)
                    }
                    ClusterEvent::MemberRemoved(_) => {
                        self.reach.forget(&m.addr);
                        if m.status == crate::member::MemberStatus::Down {
                            self.close_stale_sessions(&m.addr, "its member lease lapsed");
                        }
                    }
                    _ => {}
                }
            }
            // Members come, go and crash in the normal life of a cluster: info, not warn.
            tracing::info!(node = %self.me, member = %m.addr, incarnation = %m.incarnation, age = m.age, "{kind}")
        } else if matches!(event, ClusterEvent::SelfDown) {
            // This node is out of the cluster without having asked to leave.
            tracing::warn!(node = %self.me, "{kind}");
        } else {
            tracing::info!(node = %self.me, "{kind}");
        }
        if let Some(h) = &self.history {
            let about = member.map_or_else(AboutMember::default, |m| {
                AboutMember::of(
                    m.addr.to_string(),
                    m.incarnation.to_string(),
                    m.age,
                    m.status.as_str().to_string(),
                )
            });
            let recorded = match event {
                ClusterEvent::MemberJoined(_) => Event::MemberJoined(about),
                ClusterEvent::MemberUp(_) => Event::MemberUp(about),
                ClusterEvent::MemberLeaving(_) => Event::MemberLeaving(about),
                ClusterEvent::MemberDown(_) => Event::MemberDown(about),
                ClusterEvent::MemberRemoved(_) => Event::MemberRemoved(about),
                ClusterEvent::Unreachable(_) => Event::Unreachable(about),
                ClusterEvent::Reachable(_) => Event::Reachable(about),
                ClusterEvent::SelfDown => Event::SelfDown {},
                ClusterEvent::SelfLeaving(_) => Event::SelfLeaving {},
                ClusterEvent::CurrentMembers(_) => return,
            };
            h.record(recorded);
        }
    }

    fn node_view(&self) -> NodeView {
        let now = Instant::now();
        let cut = self.links.cut_peers();
        let members = self
            .view
            .members()
            .into_iter()
            .map(|m| {
                let me = m.addr == self.me;
                MemberInfo {
                    sessions: self
                        .sessions
                        .values()
                        .filter(|s| s.authenticated && s.peer.as_ref() == Some(&m.addr))
                        .count() as u32,
                    silence_ms: (!me)
                        .then(|| self.reach.silence(&m.addr, now))
                        .flatten()
                        .map(|d| d.as_millis() as u64),
                    link_cut: cut.contains(&m.addr),
                    roles: m.roles.clone(),
                    addr: m.addr,
                    incarnation: m.incarnation,
                    age: m.age,
                    status: m.status,
                    reachable: m.reachable,
                }
            })
            .collect();
        NodeView {
            system: self.s.system.clone(),
            node: self.me.clone(),
            incarnation: self.incarnation,
            members,
        }
    }

    fn set_link(&mut self, change: SetLink) -> FaultReply {
        if !self.s.fault_injection {
            return FaultReply {
                error: Some(
                    "fault injection is disabled on this node (cluster.fault-injection = false)"
                        .into(),
                ),
            };
        }
        let SetLink { peer, fault } = change;
        let cut = fault != LinkFault::None;
        tracing::warn!(node = %self.me, %peer, fault = fault.as_str(), "fault injection: link {}", if cut { "cut" } else { "healed" });
        self.links.gate(&peer).set(fault);
        if let Some(h) = &self.history {
            let link = Link::on_node(peer.to_string(), fault.as_str().to_string());
            h.record(if cut {
                Event::LinkCut(link)
            } else {
                Event::LinkHealed(link)
            });
        }
        FaultReply { error: None }
    }
}

/// How long `Node::leave` waits for the member lease release beyond the operation timeout.
pub(crate) const RELEASE_SLACK: Duration = Duration::from_secs(1);

/// What a leave request answers: what `Node::leave` needs for the rest of the sequence.
pub(crate) struct LeaveAnswer {
    pub hand_over: HandOverWait,
    pub member_lease: Option<ActorRef<LeaseMsg>>,
    /// The peers' agents, to be told (and to acknowledge) before the lease is released.
    pub peers: Vec<ActorRef<AgentMsg>>,
    pub notice: Leaving,
}
