//! The messages nodes exchange (through their agents) and the local messages of the agent.

use ractor::{ActorRef, RactorErr, RpcReplyPort};
use ractor_cluster::node::NodeServerSessionInformation;
use serde::{Deserialize, Serialize};
use tenure_lease::{FencingToken, LeaseEvent, LeaseRecord};

use crate::identity::{Incarnation, NodeAddr};
use crate::member::MemberStatus;
use crate::subscribe::ClusterSubscriber;

/// Version of this protocol, carried in [`Hello`]. `Hello`'s first field must stay a `u32`
/// version.
pub const PROTOCOL_VERSION: u32 = 5;

/// The protocol versions this build talks to: a peer whose [`Hello`] carries another is
/// refused, and both sides log both versions. A release that changes the protocol keeps
/// the previous version in this range, so that a rolling update passes through it; the
/// application's own `cluster.app-version` plays no part here.
pub const COMPATIBLE_PROTOCOLS: std::ops::RangeInclusive<u32> = PROTOCOL_VERSION..=PROTOCOL_VERSION;

/// Sent by each side when a session is ready: who we are and whom we know (transitive
/// discovery).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: u32,
    pub system: String,
    pub node: NodeAddr,
    pub incarnation: Incarnation,
    pub known: Vec<NodeAddr>,
    /// Answer with a hello of your own (we hear you but never got yours).
    pub want_reply: bool,
    /// The sender's `cluster.roles`.
    pub roles: Vec<String>,
    /// A stamp of the sender's clock (see [`crate::clocks`]): the receiver's estimate of it.
    pub clock: u64,
    /// The secret the sender seals its heartbeat datagrams to the receiver with, for this
    /// session (see [`crate::transport::datagram`]); `None` when it has no random source,
    /// and then its heartbeats reach the receiver on the session only.
    pub datagram_secret: Option<crate::transport::datagram::SessionSecret>,
}

/// Liveness beacon, every `cluster.peer-heartbeat-interval`, to each peer on the sender's ring of
/// monitors ([`crate::ring`]), as a UDP datagram (see [`crate::transport::datagram`]) and,
/// while the datagrams do not get through either way (and once every `unreachable-after`),
/// cast on the session too. It carries the reachability rows that changed lately, or the
/// whole table when the receiver asked for it ([`crate::sbr::Spread`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Heartbeat {
    pub node: NodeAddr,
    pub incarnation: Incarnation,
    /// A stamp of the sender's clock (see [`crate::clocks`]): both copies of one heartbeat
    /// carry the same, and a receiver applies only a number above the last, and not too far
    /// ahead of the sender's clock as it knows it.
    pub seq: u64,
    /// The sender's membership (its age; 0 while not up).
    pub age: u64,
    /// On the wire, a sequence of [`crate::sbr::ReachRow`] (the sharing is this process's).
    #[serde(with = "shared_rows")]
    pub reach: Vec<crate::sbr::SharedRow>,
    /// The digest of the sender's whole reachability table, once these rows are in it: a
    /// receiver whose table then differs asks for the whole table.
    pub digest: u64,
    /// The sender's table differed from the receiver's digest: send the whole table.
    pub want_table: bool,
    /// The sender heard a heartbeat from the receiver within `unreachable-after`: a downed
    /// node rejoins only once the nodes it must hear also hear it.
    pub hears_you: bool,
    /// Heartbeat datagrams from the receiver reach the sender: while they do (and the
    /// receiver's reach it), neither sends its heartbeats on the session too.
    pub your_datagrams_arrive: bool,
}

/// Shared rows ([`crate::sbr::SharedRow`]) written and read as plain rows: the wire format
/// of a heartbeat is the same as with `Vec<ReachRow>`.
mod shared_rows {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serializer};

    use crate::sbr::{ReachRow, SharedRow};

    pub(super) fn serialize<S: Serializer>(rows: &[SharedRow], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(rows.iter().map(|r| &**r))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<SharedRow>, D::Error> {
        Ok(Vec::<ReachRow>::deserialize(d)?
            .into_iter()
            .map(Arc::new)
            .collect())
    }
}

/// An indirect probe (SWIM's ping-req): `origin` has not heard `target` (its life
/// `incarnation`) for a while and asks a helper to probe it; the target answers the helper,
/// which passes the answer on. An answered probe shows the target alive and only the direct
/// link slow, so the origin waits longer before calling it unreachable.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Probe {
    /// The origin's number for this probe round.
    pub id: u64,
    pub origin: NodeAddr,
    pub target: NodeAddr,
    pub incarnation: Incarnation,
    pub step: ProbeStep,
}

/// Where a [`Probe`] is on its way.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ProbeStep {
    /// Origin to helper: probe the target for me.
    Request,
    /// Helper to target.
    Ping { helper: NodeAddr },
    /// Target to helper, and helper to origin: the target answered.
    Ack { helper: NodeAddr },
}

/// Sent to a node that heartbeats under a membership (`age`) the sender downed: its side
/// of a partition lost, and it must down itself too.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct YouAreDown {
    pub by: NodeAddr,
    pub age: u64,
}

/// The sender is leaving gracefully; its member lease is released once it handed over.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Leaving {
    pub node: NodeAddr,
    pub incarnation: Incarnation,
}

/// Acknowledges a [`Leaving`] notice once the receiver's view shows the sender leaving.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LeavingAck {}

/// Asks a node for its view.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Inspect {}

/// One member in a node's view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberInfo {
    /// Its cluster address.
    pub addr: NodeAddr,
    /// Its incarnation.
    pub incarnation: Incarnation,
    /// Age order: the fencing token of its member lease (0 while joining).
    pub age: u64,
    /// Where it is in its life.
    pub status: MemberStatus,
    /// Whether heartbeats from it arrive (always true for the node itself).
    pub reachable: bool,
    /// Its `cluster.roles`.
    pub roles: Vec<String>,
    /// Milliseconds since anything arrived from it (none for this node itself).
    pub silence_ms: Option<u64>,
    /// Open ractor sessions with it (1 when the mesh is healthy).
    pub sessions: u32,
    /// Whether this node's link to it is cut by fault injection.
    pub link_cut: bool,
}

/// A node's view of the cluster, oldest member first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeView {
    /// The `[tenure] system` the node belongs to.
    pub system: String,
    /// The node's cluster address.
    pub node: NodeAddr,
    /// The node's incarnation.
    pub incarnation: Incarnation,
    /// The members in its view, oldest first.
    pub members: Vec<MemberInfo>,
}

/// Sets this node's link fault with `peer` (needs `cluster.fault-injection`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SetLink {
    pub peer: NodeAddr,
    pub fault: crate::transport::LinkFault,
}

/// An operator asks that `member` leave gracefully (sent to the agent of the node whose
/// management endpoint took the request, which passes it on when `member` is another node:
/// only a node can leave, since only it can hand over what it hosts).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaveRequest {
    pub member: NodeAddr,
    /// Who asked (for logs and history), e.g. `management 127.0.0.1:8558`.
    pub by: String,
}

/// An operator downs `member` (Akka's `Cluster.down`): its current membership ends in every
/// view that hears of it, and the member itself downs itself when it hears of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DownRequest {
    pub member: NodeAddr,
    pub by: String,
}

/// A node downed the membership (`member`, `incarnation`, `age`) on an operator's request:
/// the receiver drops that membership from its view too (a later membership of the same
/// node is not affected).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberDowned {
    pub member: NodeAddr,
    pub incarnation: Incarnation,
    pub age: u64,
    pub by: NodeAddr,
    /// Why, for the logs and the history of every node.
    pub why: String,
}

/// The answer to an operator's request: `None` accepted, else why not.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OperatorReply {
    pub refused: Option<crate::error::OperatorRefusal>,
}

/// `error` says why a fault command was refused.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FaultReply {
    pub error: Option<String>,
}

/// Asks `agent` for its view of the cluster. `Err`: no answer came (the agent stopped, or
/// did not answer within 5 s).
pub(crate) async fn ask_view(agent: &ActorRef<AgentMsg>) -> Result<NodeView, RactorErr<AgentMsg>> {
    ractor::call_t!(agent, AgentMsg::Inspect, 5000, Inspect {})
}

/// Asks `agent` to set its link fault with `peer`. `Ok(None)`: set; `Ok(Some(why))`: the
/// agent refused (fault injection is off); `Err`: no answer came (the agent stopped, or
/// did not answer within 5 s).
pub(crate) async fn ask_set_link(
    agent: &ActorRef<AgentMsg>,
    peer: &NodeAddr,
    fault: crate::transport::LinkFault,
) -> Result<Option<String>, RactorErr<AgentMsg>> {
    let change = SetLink {
        peer: peer.clone(),
        fault,
    };
    let reply: FaultReply = ractor::call_t!(agent, AgentMsg::SetLink, 5000, change)?;
    Ok(reply.error)
}

crate::cluster_message! {
    /// Messages of a node's agent (the one remotable actor of the cluster layer).
    pub enum AgentMsg {
        cast Hello(Hello),
        cast Heartbeat(Heartbeat),
        cast Probe(Probe),
        cast YouAreDown(YouAreDown),
        cast Downed(MemberDowned),
        call Leaving(Leaving) -> LeavingAck,
        call Inspect(Inspect) -> NodeView,
        call SetLink(SetLink) -> FaultReply,
        call Leave(LeaveRequest) -> OperatorReply,
        call Down(DownRequest) -> OperatorReply,
        local Local(AgentLocal),
    }
}

/// A session event forwarded from the ractor_cluster node server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionChange {
    Opened,
    Authenticated,
    Ready,
    Disconnected,
}

/// Messages an agent sends itself or gets from its own node.
pub enum AgentLocal {
    Session(SessionChange, Box<NodeServerSessionInformation>),
    /// `handshake-timeout` has passed since session `node_id` opened: closed unless it
    /// authenticated.
    HandshakeDue(u64),
    /// An event of the member lease actor started for the membership with join ticket
    /// `ticket` (events of an earlier membership's actor are ignored).
    MemberLease {
        ticket: u64,
        event: LeaseEvent,
    },
    /// A join ticket was taken (`None`: it could not be): start holding the member lease
    /// with this age.
    Ticket(Option<u64>),
    Tick,
    /// A heartbeat datagram whose MAC verified (not yet checked for freshness).
    Datagram(Heartbeat),
    /// Where `peer` (its life `incarnation`) takes heartbeat datagrams, once its host name
    /// resolved (`Err`: why it did not).
    HeartbeatAddr {
        peer: NodeAddr,
        incarnation: Incarnation,
        addr: Result<std::net::SocketAddr, crate::agent::heartbeat::ResolveError>,
    },
    Poll,
    /// What a membership poll found (`Err`: the store's error, naming the prefix).
    Listed(Result<Polled, tenure_lease::LeaseError>),
    /// The member leases listed after this node's member lease (grant `token`) was
    /// granted, for its placement check.
    JoinCheck {
        token: FencingToken,
        listed: Result<Vec<LeaseRecord>, tenure_lease::LeaseError>,
    },
    Dialed {
        peer: NodeAddr,
        result: Result<(), crate::transport::DialError>,
    },
    Subscribe(ClusterSubscriber),
    /// The split brain resolver's lease attempt `attempt` ended: `Ok(true)` this node's
    /// side holds the resolver lease, `Ok(false)` the other side does, `Err` unknown.
    SbrLease {
        attempt: u64,
        won: Result<bool, crate::agent::resolver_lease::ResolverLeaseError>,
    },
    Leave(RpcReplyPort<crate::agent::LeaveAnswer>),
}

/// What one membership poll found.
#[derive(Debug)]
pub(crate) struct Polled {
    /// The member leases, when the poll listed them; `None` when the store said they had
    /// not changed since the version the node holds.
    pub records: Option<Vec<LeaseRecord>>,
    /// The change version to hold from now on; `None` on a store without
    /// [`GrantChanges`](tenure_lease::GrantChanges).
    pub version: Option<tenure_lease::ChangeVersion>,
}
