//! What regions and the coordinator say to each other across nodes: one serde payload per
//! variant, encoded by the cluster codec. Never rename a variant (its name is the wire tag).

use serde::{Deserialize, Serialize};
use tenure_cluster::ClusterEvent;
use tenure_lease::FencingToken;

/// A message for an entity: its shard, its id, and the request encoded by the type's codec.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope {
    /// The entity's shard id.
    pub shard: String,
    /// The entity id.
    pub entity: String,
    /// The request, encoded by the entity type's codec.
    pub payload: Vec<u8>,
    /// Regions this message passed through (a bound against routing loops while homes
    /// change).
    pub hops: u8,
}

/// The answer to an [`Envelope`] sent with `ask`: the encoded reply, or why there is none.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AskReply {
    /// The encoded reply, or why there is none.
    pub result: Result<Vec<u8>, AskFailure>,
}

/// Why an ask got no reply from its entity, as its sender's region learns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum AskFailure {
    /// The bounded buffer of one shard (in a region waiting for the shard's home, or in the
    /// shard waiting for its lease) was full: the message was refused, never delivered.
    #[error("shard {shard} of `{type_name}`: buffer full ({capacity} messages wait)")]
    BufferFull {
        /// The entity type.
        type_name: String,
        /// The shard whose buffer was full.
        shard: String,
        /// The buffer's capacity (`buffer-size`).
        capacity: usize,
    },
    /// Anything else (the entity failed, could not start, the shard has no stable home).
    #[error("{0}")]
    Other(String),
}

impl AskReply {
    /// Answers an ask (if `reply` is one) with the error `why`.
    pub fn fail(reply: Option<ractor::RpcReplyPort<AskReply>>, why: String) {
        Self::refuse(reply, AskFailure::Other(why));
    }

    /// Answers an ask (if `reply` is one) with `failure`.
    pub fn refuse(reply: Option<ractor::RpcReplyPort<AskReply>>, failure: AskFailure) {
        if let Some(port) = reply {
            let _ = port.send(AskReply {
                result: Err(failure),
            });
        }
    }
}

/// Whether the caller of an ask kept since `since` stopped waiting: its reply port closed,
/// or the ask's own timeout passed since then. A tell (no port) never expires.
pub(crate) fn ask_expired(
    reply: Option<&ractor::RpcReplyPort<AskReply>>,
    since: tokio::time::Instant,
) -> bool {
    reply.is_some_and(|r| r.is_closed() || r.get_timeout().is_some_and(|t| since.elapsed() >= t))
}

/// Refuses a message because the buffer of its shard is full: an ask gets
/// [`AskFailure::BufferFull`]; a tell is counted (`tenure_sharding_tells_dropped_total`)
/// and logged with its entity type and shard. Returns whether a tell was dropped.
pub(crate) fn refuse_buffer_full(
    type_name: &str,
    shard: &str,
    entity: &str,
    capacity: usize,
    reply: Option<ractor::RpcReplyPort<AskReply>>,
) -> bool {
    let failure = AskFailure::BufferFull {
        type_name: type_name.to_string(),
        shard: shard.to_string(),
        capacity,
    };
    let tell = reply.is_none();
    if tell {
        crate::metrics::tell_dropped(type_name);
        tracing::warn!(entity_type = %type_name, shard, entity, "tell dropped: {failure}");
    }
    AskReply::refuse(reply, failure);
    tell
}

/// Coordinator → region: host this shard (acquire its lease, then serve it).
///
/// Every coordinator → region message carries `coordinator`, the fencing token of the
/// coordinator's singleton lease: a region ignores messages from a coordinator older than
/// the newest it heard from (one that lost its lease and has not stopped yet).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostShard {
    pub shard: String,
    pub coordinator: FencingToken,
}

/// Coordinator → region: where a shard lives (`None`: not known yet, ask again later).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShardHome {
    pub shard: String,
    pub home: Option<String>,
    pub coordinator: FencingToken,
}

/// Coordinator → region, once per wave of allocations (what the coordinator decided while
/// handling the messages that had reached it): the shards the region is to host (as
/// [`HostShard`]) and the homes it learns (as [`ShardHome`]), each shard named once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShardHomes {
    pub host: Vec<String>,
    pub homes: Vec<(String, Option<String>)>,
    pub coordinator: FencingToken,
}

/// Coordinator → every region, before a rebalance hands `shard` off: forget where it lives
/// and keep its messages until the coordinator names its new home (Akka's BeginHandOff).
/// The region that hosts it keeps serving it until [`HandOff`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BeginHandOff {
    pub shard: String,
    pub coordinator: FencingToken,
}

/// Region → coordinator: [`BeginHandOff`] applied (`region`: its node).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HandOffBegun {
    pub shard: String,
    pub region: String,
}

/// Coordinator → every region, once per rebalance round: [`BeginHandOff`] for each of
/// `shards`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BeginHandOffs {
    pub shards: Vec<String>,
    pub coordinator: FencingToken,
}

/// Region → coordinator: [`BeginHandOffs`] applied (`region`: its node).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HandOffsBegun {
    pub region: String,
}

/// Coordinator → region: stop the shard, release its lease, then answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HandOff {
    pub shard: String,
    pub coordinator: FencingToken,
}

/// Region → coordinator: the hand-off is done (`released`: its lease was released, so the
/// next host need not wait for it to expire).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HandOffDone {
    pub shard: String,
    pub released: bool,
}

/// A leaving region → every other region of its type, once it hosts nothing and keeps no
/// message: stop sending to region `node` (forget the homes there, and refuse it as a home
/// from now on). The answer means that every message the other region sent to it before
/// left already (it travels ahead of the answer on the same session), and that every
/// message it had sent to the other region has arrived there.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Vacating {
    pub node: String,
}

/// The answer to [`Vacating`] (`region`: the answering region's node).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Vacated {
    pub region: String,
}

/// Region → coordinator: who it is and every shard it hosts (or is acquiring), as a region
/// registered before [`RegisterChanges`]; a coordinator takes it as a registration of every
/// shard.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Register {
    /// The region's node (`host:port`).
    pub region: String,
    pub shards: Vec<String>,
    /// Whether it may be given shards (not proxy-only, not leaving, not down).
    pub available: bool,
}

/// Region → coordinator, every `retry-interval`: who it is, whether it may be given shards,
/// and the shards it hosts (or is acquiring), as the changes since its registration `base`
/// to this coordinator, or all of them (`base` `None`: its first registration to this
/// coordinator instance, or the coordinator asked for all with [`RegisterAgain`]). A
/// coordinator applies changes only onto registration `base` itself (each region's
/// registrations reach it in order); otherwise it asks for all.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RegisterChanges {
    /// The region's node (`host:port`).
    pub region: String,
    /// This registration's number, increasing within the region's life.
    pub seq: u64,
    /// The registration these changes follow; `None`: `added` holds every shard.
    pub base: Option<u64>,
    /// Shards hosted since `base` (every shard hosted when `base` is `None`).
    pub added: Vec<String>,
    /// Shards no longer hosted since `base`.
    pub removed: Vec<String>,
    /// Whether it may be given shards (not proxy-only, not leaving, not down).
    pub available: bool,
}

/// Coordinator → region: the changes it sent do not follow a registration this coordinator
/// has (a new coordinator, a lost message): register every shard now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RegisterAgain {
    pub coordinator: FencingToken,
}

/// Tells for entities of several shards, from a region to the region of their shards' home
/// (one message per node for a round of daemon keep-alives), each routed as a
/// [`RegionMsg::Deliver`] of its own.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelopes {
    pub envelopes: Vec<Envelope>,
}

/// Region → coordinator: where does `shard` live? Answered with a [`ShardHome`] cast to the
/// region of `region`; while the shard moves, once its new home is known.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GetShardHome {
    pub shard: String,
    pub region: String,
}

/// Asks the coordinator for its allocation.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AllocationRequest {}

/// An operator's placement of a shard (external shard allocation): move `shard` to the
/// region of `to` through the lossless hand-off and keep it there (`to` = `None`: let the
/// allocation strategy place it again).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PinShard {
    /// The shard id.
    pub shard: String,
    /// The node (`host:port`) whose region is to host it; `None` unpins.
    pub to: Option<String>,
}

/// The coordinator's answer to a [`PinShard`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinReply {
    /// `Ok(true)`: a move (or a first allocation) to the pinned region began; `Ok(false)`:
    /// nothing to move (it lives there already, or an unpin); `Err`: refused, and why.
    pub result: Result<bool, String>,
}

/// An operator's resize of a sharded daemon process: run `count` workers from now on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResizeDaemon {
    /// The new number of workers.
    pub count: usize,
}

/// The coordinator's answer to a [`ResizeDaemon`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResizeReply {
    /// `Ok(true)`: the resize began (the old workers stop, then the new ones start);
    /// `Ok(false)`: the daemon runs that many workers already; `Err`: refused, and why.
    pub result: Result<bool, String>,
}

/// A daemon's workers as its coordinator decided them: `count` workers of `revision`
/// (each resize makes the next revision); while `stopping`, every worker of the earlier
/// revisions is being stopped and none may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonCount {
    /// Bumped by every resize.
    pub revision: u64,
    /// The number of workers.
    pub count: usize,
    /// The workers of earlier revisions are being stopped: no worker may start.
    pub stopping: bool,
}

/// Asks a daemon's coordinator for its [`DaemonCount`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DaemonCountRequest {}

/// The coordinator's answer to a [`DaemonCountRequest`]: `None` when the type is not a
/// daemon's, or the coordinator has not read the count from the store yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonCountReply {
    /// The count, if known.
    pub count: Option<DaemonCount>,
}

/// The coordinator's allocation: `(shard, region)` pairs, and the regions it may use.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// `(shard, region)`: each allocated shard and the region (`host:port`) it lives on.
    pub homes: Vec<(String, String)>,
    /// The regions (`host:port`) the coordinator may allocate to.
    pub regions: Vec<String>,
}

/// A message a region accepted and has not delivered yet; an ask carries its reply port.
pub struct Pending {
    /// The message.
    pub env: Envelope,
    /// Where an ask's reply goes; `None` for a tell.
    pub reply: Option<ractor::RpcReplyPort<AskReply>>,
    /// Held while a message sent on this node travels the routed path (see
    /// [`Routes`](crate::Routes)); `None` for messages from other nodes.
    pub(crate) ticket: Option<crate::direct::Ticket>,
}

/// What a region tells about itself: its running shards (to be asked for their status)
/// and the homes it knows.
pub struct RegionSnapshot {
    pub shards: Vec<(String, ractor::ActorRef<crate::shard::ShardMsg>)>,
    pub homes: Vec<(String, String)>,
    /// Messages the region keeps per shard while it learns the shard's home.
    pub waiting: Vec<(String, usize)>,
    /// Tells it refused since it started, because their shard's buffer was full.
    pub dropped_tells: u64,
}

/// Local messages of a region.
pub enum RegionLocal {
    /// A message sent on this node (by a [`ShardRegion`](crate::ShardRegion) handle).
    Route(Pending),
    /// Tells sent on this node together (a round of daemon keep-alives): those for shards
    /// of one other node leave in one [`Envelopes`] message.
    RouteAll(Vec<Pending>),
    Cluster(ClusterEvent),
    Tick,
    Snapshot(ractor::RpcReplyPort<RegionSnapshot>),
    /// A local shard finished its hand-off: `undelivered` are the messages it had accepted
    /// and not delivered (they go to the shard's next home, ahead of anything newer); then
    /// `reply` (the coordinator's, if it asked) gets the outcome.
    HandedOff {
        shard: String,
        released: bool,
        undelivered: Vec<Pending>,
        reply: Option<ractor::RpcReplyPort<HandOffDone>>,
    },
    /// An ask this region relayed for another node was answered (or its caller stopped
    /// waiting): its answer no longer needs this node.
    Relayed,
    /// A leaving region's round of [`Vacating`] ended (every other region answered, or
    /// the round's bound passed); `forwarded` counts what the region had forwarded when
    /// the round began.
    Vacated {
        forwarded: u64,
    },
}

tenure_cluster::cluster_message! {
    /// Messages of a shard region (the only remotable actor of an entity type on a node).
    ///
    /// - `Deliver`: a tell for an entity, from a region or this node's handle.
    /// - `Host`: from the coordinator: host the shard.
    /// - `Home`: from the coordinator: where a shard lives.
    /// - `Ask`: an ask for an entity; answered with its encoded reply or why there is none.
    /// - `HandOffShard`: from the coordinator: stop the shard, release its lease, then
    ///   answer.
    /// - `BeginHandOffShard`: from the coordinator before a rebalance: forget where the
    ///   shard lives, keep its messages until its new home is named.
    /// - `Vacate`: from a leaving region that hosts and keeps nothing any more: stop
    ///   sending to it.
    /// - `Homes`: from the coordinator, once per wave of allocations: the shards to host
    ///   and the homes of others.
    /// - `RegisterAll`: from the coordinator: register every hosted shard now.
    /// - `DeliverAll`: tells for entities of several shards hosted here (a round of daemon
    ///   keep-alives).
    /// - `BeginHandOffShards`: from the coordinator, once per rebalance round:
    ///   `BeginHandOffShard` for each shard of the round.
    /// - `Local`: messages from this node only (cluster events, ticks, hand-off outcomes).
    ///
    /// The coordinator sends `Homes` and `BeginHandOffShards`, not `Host`, `Home` and
    /// `BeginHandOffShard`, which regions still take.
    // The macro takes no attributes on variants (its cast/call/local groups would be
    // ambiguous), so the variants are documented in the list above.
    #[allow(missing_docs)]
    pub enum RegionMsg {
        cast Deliver(Envelope),
        cast Host(HostShard),
        cast Home(ShardHome),
        cast Homes(ShardHomes),
        cast RegisterAll(RegisterAgain),
        cast DeliverAll(Envelopes),
        call Ask(Envelope) -> AskReply,
        call HandOffShard(HandOff) -> HandOffDone,
        call BeginHandOffShard(BeginHandOff) -> HandOffBegun,
        call Vacate(Vacating) -> Vacated,
        call BeginHandOffShards(BeginHandOffs) -> HandOffsBegun,
        local Local(RegionLocal),
    }
}

impl From<ClusterEvent> for RegionMsg {
    fn from(e: ClusterEvent) -> Self {
        RegionMsg::Local(RegionLocal::Cluster(e))
    }
}

/// What a new coordinator reads from the store before it allocates anything.
pub struct Listing {
    /// The type's shard leases: shard → holder.
    pub held: Vec<(String, String)>,
    /// The ids remembered with the coordinator's own lease (its pins).
    pub remembered: Vec<String>,
}

/// Local messages of the coordinator.
pub enum CoordinatorLocal {
    Cluster(ClusterEvent),
    Tick,
    Rebalance,
    /// The end of a wave of allocations: each region is told what it learnt in it.
    Flush,
    /// Hand-offs of moving shards ended (their old hosts answered, or the hand-off timeout
    /// passed): each shard, and whether its lease was released.
    HandOffsEnded(Vec<(String, bool)>),
    /// What a new coordinator read from the store before it allocates anything (`Err`:
    /// the store's error, naming the lease or prefix).
    Listed(Result<Listing, tenure_lease::LeaseError>),
    /// The ids remembered with the coordinator's lease (its pins), read again after the
    /// listing failed.
    PinsRead(Vec<String>),
    /// remember-entities: the shards with remembered entities, read from the store at
    /// start.
    RememberedShards(Vec<String>),
}

tenure_cluster::cluster_message! {
    /// Messages of a shard coordinator.
    ///
    /// - `RegisterRegion`: a region's registration with every shard it hosts (regions
    ///   send `RegisterChanges`; a coordinator still takes it).
    /// - `GetHome`: from a region: where does the shard live?
    /// - `RegisterChanges`: from a region, every `retry-interval`: who it is and the
    ///   changes to the shards it hosts.
    /// - `GetAllocation`: the coordinator's allocation and the regions it may use.
    /// - `PinShard`: an operator's placement of a shard (external shard allocation).
    /// - `ResizeDaemon`, `GetDaemonCount`: a sharded daemon's number of workers, changed
    ///   and read (the daemon's pingers and workers ask it).
    /// - `Local`: messages from this node only (cluster events, ticks, rebalances,
    ///   hand-off ends).
    // The macro takes no attributes on variants (its cast/call/local groups would be
    // ambiguous), so the variants are documented in the list above.
    #[allow(missing_docs)]
    pub enum CoordinatorMsg {
        cast RegisterRegion(Register),
        cast GetHome(GetShardHome),
        cast RegisterChanges(RegisterChanges),
        call GetAllocation(AllocationRequest) -> Allocation,
        call PinShard(PinShard) -> PinReply,
        call ResizeDaemon(ResizeDaemon) -> ResizeReply,
        call GetDaemonCount(DaemonCountRequest) -> DaemonCountReply,
        local Local(CoordinatorLocal),
    }
}

impl From<ClusterEvent> for CoordinatorMsg {
    fn from(e: ClusterEvent) -> Self {
        CoordinatorMsg::Local(CoordinatorLocal::Cluster(e))
    }
}
