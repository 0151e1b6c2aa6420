//! The agent: one remotable actor per node that owns the node's membership. Its jobs live
//! in one module each; [`Agent::handle`] only dispatches:
//!
//! - [`mesh`]: sessions, dials with backoff, hellos, peers;
//! - [`membership`]: join tickets, the member lease, up / lost / rejoin, leave;
//! - [`heartbeat`]: heartbeats (datagrams and session casts) and reachability, every
//!   `peer-heartbeat-interval`; [`monitor`]: whom they go to (the ring of monitors), which
//!   reachability rows they carry, and indirect probes;
//! - [`events`]: what changed, to subscribers, metrics, logs and the history;
//! - [`inspect`]: the node's view answered to clients and the CLI;
//! - [`downing`]: the split brain resolver's side; [`resolver_lease`]: the resolver lease of
//!   lease-majority, acquired or watched as [`resolver_attempt`]'s machine says;
//!   [`operator`]: operators' leave and down;
//! - [`fault`]: link faults on request (feature `fault-injection`).

use std::sync::Arc;

use ractor::concurrency::JoinHandle;
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent, pg};
use ractor_cluster::NodeServerMessage;
use tenure_lease::{LeaseObserver, LeaseStore};

use crate::identity::{Incarnation, NodeAddr};
use crate::member::Membership;
use crate::protocol::{AgentLocal, AgentMsg, Inspect};
use crate::settings::ClusterSettings;
use crate::subscribe::ClusterSubscriber;
#[cfg(feature = "fault-injection")]
use crate::transport::Links;
use crate::transport::Tls;

#[cfg(test)]
mod cost;
mod downing;
mod events;
mod fault;
pub(crate) mod heartbeat;
mod inspect;
mod membership;
mod mesh;
mod monitor;
mod operator;
pub(crate) mod resolver_attempt;
pub(crate) mod resolver_lease;

pub(crate) use membership::{LeaveAnswer, RELEASE_SLACK, Refusal};

/// The pg group every node's agent joins, in the scope of its system.
pub(crate) const AGENT_GROUP: &str = "agent";

/// The pg scope of a system's cluster actors.
pub fn scope(system: &str) -> String {
    format!("tenure/{system}")
}

pub(crate) struct Agent;

pub(crate) struct AgentArgs {
    pub settings: ClusterSettings,
    pub incarnation: Incarnation,
    pub server: ActorRef<NodeServerMessage>,
    /// The heartbeat datagram socket, bound on the node's cluster host and port.
    pub heartbeats: Arc<tokio::net::UdpSocket>,
    pub tls: Option<Tls>,
    #[cfg(feature = "fault-injection")]
    pub links: Arc<Links>,
    pub store: Arc<dyn LeaseStore>,
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

pub(crate) struct AgentState {
    s: ClusterSettings,
    me: NodeAddr,
    incarnation: Incarnation,
    scope: String,
    store: Arc<dyn LeaseStore>,
    lease_observer: Option<LeaseObserver>,
    /// Stamps this node's heartbeats, hellos and reachability rows ([`crate::clocks`]).
    clock: crate::clocks::NodeClock,
    /// This node's view of the members.
    view: Membership,
    /// The heartbeat datagrams ([`heartbeat`]).
    datagrams: heartbeat::Datagrams,
    /// Failure detection and the resolver's input ([`crate::detector`]): the ring of
    /// monitors, heartbeats, probes, the reachability table and the resolver's step.
    detector: crate::detector::Detector,
    /// Picks the helpers of indirect probes.
    rng: fastrand::Rng,
    /// Sessions, peers and dials ([`mesh`]).
    mesh: mesh::Mesh,
    /// The member lease of the current membership ([`membership`]).
    member_lease: membership::MemberLease,
    /// The listing of the other member leases ([`membership`]).
    listing: membership::Listing,
    /// The split brain resolver, unless `active-strategy = "off"`.
    downing: Option<downing::Downing>,
    /// Memberships downed on an operator's request, with the notice a member heartbeating
    /// under one of them is sent (it says why, where the resolver's `YouAreDown` would not).
    operator_downs:
        std::collections::BTreeMap<(NodeAddr, Incarnation, u64), crate::protocol::MemberDowned>,
    refused: Arc<std::sync::OnceLock<Refusal>>,
    downed: Arc<std::sync::OnceLock<String>>,
    leave_requests: Arc<tokio::sync::watch::Sender<Option<String>>>,
    subscribers: Vec<ClusterSubscriber>,
    leaving: bool,
    timers: Vec<JoinHandle<()>>,
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
        #[cfg(feature = "fault-injection")]
        let mesh = mesh::Mesh::start(&myself, a.server, a.tls, a.links).await?;
        #[cfg(not(feature = "fault-injection"))]
        let mesh = mesh::Mesh::start(&myself, a.server, a.tls).await?;
        let datagrams = heartbeat::Datagrams::new(
            a.heartbeats,
            &a.settings.system,
            &a.settings.cookie,
            a.settings.unreachable_after / 2,
        )?;
        let scope = scope(&a.settings.system);
        pg::join_scoped(scope.clone(), AGENT_GROUP.into(), vec![myself.get_cell()]);
        pg::monitor_scope(scope.clone(), myself.get_cell());
        let timers = vec![
            myself.send_interval(a.settings.heartbeat_interval, || {
                AgentMsg::Local(AgentLocal::Tick)
            }),
            myself.send_interval(a.settings.membership_interval, || {
                AgentMsg::Local(AgentLocal::Poll)
            }),
            datagrams.spawn_receiver(myself.clone()),
        ];
        let me = a.settings.addr.clone();
        crate::history::node_started();
        let _ = myself.cast(AgentMsg::Local(AgentLocal::Poll));
        membership::spawn_ticket(
            &myself,
            &a.settings,
            a.store.clone(),
            a.lease_observer.clone(),
        );
        let _ = myself.cast(AgentMsg::Local(AgentLocal::Tick));
        Ok(AgentState {
            clock: crate::clocks::NodeClock::new(tokio::time::Instant::now()),
            view: Membership::new(me.clone(), a.incarnation, a.settings.roles.clone())
                .with_app_version(a.settings.app_version.clone()),
            me,
            incarnation: a.incarnation,
            scope,
            store: a.store,
            lease_observer: a.lease_observer,
            datagrams,
            detector: crate::detector::Detector::new(
                a.settings.addr.clone(),
                a.incarnation,
                crate::detector::DetectorSettings {
                    monitored_by: a.settings.monitored_by,
                    indirect_probes: a.settings.indirect_probes,
                    unreachable_after: a.settings.unreachable_after,
                    sync_interval: a.settings.reachability_sync_interval,
                    heartbeat_interval: a.settings.heartbeat_interval,
                },
                a.settings.split_brain_resolver.clone(),
                tokio::time::Instant::now(),
            ),
            rng: fastrand::Rng::new(),
            mesh,
            member_lease: membership::MemberLease {
                ticketing: true,
                ..Default::default()
            },
            listing: Default::default(),
            downing: a
                .settings
                .split_brain_resolver
                .is_some()
                .then(downing::Downing::new),
            operator_downs: Default::default(),
            refused: a.refused,
            downed: a.downed,
            leave_requests: a.leave_requests,
            subscribers: Vec::new(),
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
        state.mesh.stop();
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
            AgentMsg::Heartbeat(hb) => state.on_heartbeat(hb, heartbeat::Via::Session),
            AgentMsg::Probe(probe) => state.on_probe(probe),
            AgentMsg::YouAreDown(notice) => state.on_you_are_down(&myself, notice),
            AgentMsg::Leaving(l, reply) => state.on_peer_leaving(l, reply),
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

impl AgentState {
    /// What the agent sends itself or gets from its own node, to the module it concerns.
    async fn on_local(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        local: AgentLocal,
    ) -> Result<(), ActorProcessingErr> {
        match local {
            AgentLocal::Session(change, ses) => self.on_session(myself, change, *ses),
            AgentLocal::HandshakeDue(node_id) => self.on_handshake_due(node_id),
            AgentLocal::Dialed { peer, result } => self.on_dialed(peer, result),
            AgentLocal::Ticket(ticket) => self.on_ticket(myself, ticket).await?,
            AgentLocal::MemberLease { ticket, event } => {
                self.on_member_lease(myself, ticket, event)
            }
            AgentLocal::JoinCheck { token, listed } => {
                self.on_join_check(myself, token, listed).await?
            }
            AgentLocal::Poll => self.poll(myself),
            AgentLocal::Listed(result) => self.on_listed(result),
            AgentLocal::Leave(reply) => self.start_leaving(reply),
            AgentLocal::Tick => self.tick(myself),
            AgentLocal::Datagram(hb) => self.on_datagram(hb),
            AgentLocal::HeartbeatAddr {
                peer,
                incarnation,
                addr,
            } => self.on_heartbeat_addr(peer, incarnation, addr),
            AgentLocal::SbrLease { attempt, won } => self.on_sbr_lease(myself, attempt, won),
            AgentLocal::Subscribe(sub) => self.subscribe(sub),
        }
        Ok(())
    }
}
