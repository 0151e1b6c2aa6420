//! The shard coordinator: a lease-guarded singleton (one per entity type in the cluster)
//! that allocates shards to regions, moves the shards of regions that are down (the split
//! brain resolver downs the losing side of a partition), leaving, or unreachable past
//! `unreachable-reallocate-after`, and rebalances. It keeps no state of its own: a new
//! coordinator rebuilds the allocation from the shard leases it lists in the store (who
//! holds each shard), before answering any region, so a coordinator fail-over moves no
//! shard of a surviving node; the regions' reports fill in the rest. Its messages carry its
//! lease's fencing token, and regions ignore an older coordinator's. It never needs to be
//! right for safety: a shard runs only under its lease, so a wrong or early move only
//! makes the new host wait for that lease.
//!
//! Its work grows with what changes, not with the number of shards: it keeps each region's
//! shards along with each shard's home (no load map is rebuilt per allocation); what a wave
//! of allocations decides (everything decided while handling the messages that had reached
//! it) goes to each region in one message; each region registers the changes to its shards
//! since its last registration (all of them once per coordinator instance); and it scans
//! regions, not shards, on its ticks.
//!
//! With remember-entities, the coordinator also reads at start which shards have
//! remembered entities (the ids kept with each shard lease in the store) and allocates
//! those shards, and every shard it ever allocated, without waiting for a message: a
//! shard's entities come back even when its node and the coordinator died together and its
//! lease lapsed before the new coordinator listed it. It waits for the regions of the
//! members up to register first (at most `rebalance-interval`), so that those shards are
//! spread over them.
//!
//! A rebalance moves a round of shards in Akka's steps: every region is told first
//! (BeginHandOff: it forgets the shards' homes and keeps their messages), then each old host
//! hands its shard off (stops it, releases its lease, gives back what it had not
//! delivered), then the new host is told to host it, and every region that asked meanwhile
//! learns the new home. The next round is decided once every shard of this one has moved.
//!
//! An operator may pin a shard to a region (Akka's external shard allocation): the shard
//! moves there through the same hand-off, is allocated there whenever it needs a home, and
//! no rebalance moves it away; when that region cannot take it (gone, unreachable, an
//! older application version) the strategy places it meanwhile, and a rebalance brings it
//! back once the region can. Pins are remembered with the coordinator's own lease in the
//! store ([`crate::placement`]): a new coordinator (fail-over) reads them with the shard
//! leases, before it allocates anything, and keeps honouring them.
//!
//! A sharded daemon's coordinator also keeps the daemon's number of workers there. A
//! resize stores the next revision as stopping, hands off every shard it knows to be
//! hosted (held leases, homes, reports) and allocates nothing until all are stopped (or
//! their nodes gone), then stores the revision as running; a coordinator that finds a
//! resize in progress when it starts does the same. Workers ask it before they start (see
//! [`crate::daemon`]).

mod homes;
mod members;
mod pins;
mod reads;
mod rebalance;
mod registration;
mod resize;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tenure_cluster::{
    ClusterError, ClusterEvent, ClusterSubscriber, Member, MemberStatus, Subscriptions,
};
use tenure_lease::{FencingToken, LeaseStore};
use tokio::time::Instant;

use crate::allocation::{AllocationStrategy, Regions};
use crate::history;
use crate::messages::{
    Allocation, BeginHandOffs, CoordinatorLocal, CoordinatorMsg, DaemonCount, DaemonCountReply,
    GetShardHome, HandOff, Listing, PinReply, PinShard, RegionMsg, Register, RegisterAgain,
    ResizeDaemon, ResizeReply, ShardHomes,
};
use crate::region::region_ref;
use crate::remember::{IdWriter, RememberStore};
use crate::settings::ShardingSettings;
use reads::{list_shard_leases, pins_at, read_remembered_shards};

/// What a coordinator instance runs with.
#[derive(Clone)]
pub struct CoordinatorArgs {
    /// The entity type.
    pub type_name: String,
    /// The cluster's pg scope.
    pub scope: String,
    /// The entity type's sharding settings.
    pub settings: Arc<ShardingSettings>,
    /// Decides where shards go and which move.
    pub strategy: Arc<dyn AllocationStrategy>,
    /// Cluster events of the node it runs on (its [`Subscriptions`]).
    pub subscriptions: Arc<dyn ClusterEvents>,
    /// The fencing token of the coordinator's singleton lease grant (0 outside a cluster).
    pub token: FencingToken,
    /// The shard leases' store and `[tenure] system`, to list who holds each shard.
    pub store: Arc<dyn LeaseStore>,
    /// The `[tenure] system` name (prefix of the shard lease names).
    pub system: String,
    /// Bound on the listing (the lease section's `lease-operation-timeout`).
    pub list_timeout: std::time::Duration,
    /// The coordinator's singleton lease, with which its pins are remembered.
    pub lease: CoordinatorLease,
    /// For a sharded daemon's type, the number of workers it runs until a resize is stored
    /// (`None`: the type is not a daemon's).
    pub daemon: Option<usize>,
}

/// Where a coordinator hears of the cluster's members: all it needs of the node it runs
/// on. A node's [`Subscriptions`] in a cluster; in the coordinator's unit tests, a double
/// that delivers the members the test chooses, so that no node has to start.
pub trait ClusterEvents: Send + Sync {
    /// Delivers to `subscriber` the current members ([`ClusterEvent::CurrentMembers`]),
    /// then every change in order. `Err` when none can be delivered (the node stopped).
    fn subscribe(&self, subscriber: ClusterSubscriber) -> Result<(), ClusterError>;
}

impl ClusterEvents for Subscriptions {
    fn subscribe(&self, subscriber: ClusterSubscriber) -> Result<(), ClusterError> {
        Subscriptions::subscribe(self, subscriber)
    }
}

/// The coordinator's singleton lease as its store holds it: the pins are remembered with it
/// (see docs/sharding.md), each change under the grant whose token the coordinator runs
/// with.
#[derive(Clone)]
pub struct CoordinatorLease {
    /// The store of the lease (that of its singleton's lease section).
    pub store: Arc<dyn LeaseStore>,
    /// The lease's name as the store holds it (`LeaseSpec::store_name`).
    pub name: String,
    /// Its owner: this node's `host:port`.
    pub owner: String,
}

/// The coordinator actor (the singleton instance).
pub struct Coordinator;

/// A registered region.
struct RegionEntry {
    available: bool,
    /// The shards it hosts (or acquires), as its registration `seq` reported them.
    reported: BTreeSet<String>,
    seq: u64,
}

/// A shard moving for a rebalance.
struct Move {
    from: String,
    to: String,
    /// Regions that asked for the shard's home meanwhile: told once it has one.
    waiting: BTreeSet<String>,
}

/// What a region is told of a shard at the end of a wave.
enum Told {
    /// Host it.
    Host,
    /// It lives there (`None`: not known yet).
    Home(Option<String>),
}

/// A registration, full or as changes.
struct Registration {
    region: String,
    seq: u64,
    /// `None`: every shard is in `added`.
    base: Option<u64>,
    added: Vec<String>,
    removed: Vec<String>,
    available: bool,
}

pub struct CoordinatorState {
    args: CoordinatorArgs,
    myself: ActorRef<CoordinatorMsg>,
    members: BTreeMap<String, Member>,
    unreachable_since: HashMap<String, Instant>,
    regions: BTreeMap<String, RegionEntry>,
    /// Shard homes, each region's shards, and the regions new shards may go to.
    homes: Regions,
    /// Shards told to their home and not (or no longer) in its registration: when the
    /// last `Host` for each was sent (`None`: never, by this coordinator). Sent again every
    /// three `retry-interval`s while its region is alive and does not report it.
    unconfirmed: BTreeMap<String, Option<Instant>>,
    /// Shards a region runs where they do not belong: when it was last asked to hand
    /// each off.
    misplaced: BTreeMap<(String, String), Instant>,
    /// Shards being handed off for a rebalance.
    moving: BTreeMap<String, Move>,
    /// Regions that asked for a home without having registered (yet): they are told of
    /// hand-offs too.
    askers: BTreeSet<String>,
    /// Whether the shard leases were listed (or could not be, after retries): until then
    /// nothing is allocated and home requests wait in `deferred`.
    listed: bool,
    list_attempts: u32,
    /// Holders found in the listing that have not registered yet: alive until they report.
    holders: BTreeSet<String>,
    deferred: Vec<(String, String)>,
    timers: Vec<ractor::concurrency::JoinHandle<()>>,
    /// remember-entities: shards to keep allocated, with no message needed (those with
    /// remembered entities at start, and every shard allocated since).
    remembered: BTreeSet<String>,
    /// remember-entities: remembered shards without a home, to allocate once regions can
    /// take them.
    unplaced: BTreeSet<String>,
    /// When this coordinator started.
    started: Instant,
    /// What each region is to be told at the end of the current wave, per shard.
    outbox: BTreeMap<String, BTreeMap<String, Told>>,
    /// Shards an operator pinned, and the region each is pinned to.
    pinned: BTreeMap<String, String>,
    /// Whether the pins were read from the store (pins are refused until then).
    pins_read: bool,
    /// Writes the changes of the pins and the daemon's count, under this coordinator's
    /// grant.
    placement: IdWriter,
    /// A sharded daemon's workers (`None`: the type is not a daemon's).
    daemon: Option<DaemonCount>,
    /// A daemon's shards being stopped for a resize, and the region each is stopped on.
    stopping: BTreeMap<String, String>,
}

impl Actor for Coordinator {
    type Msg = CoordinatorMsg;
    type State = CoordinatorState;
    type Arguments = CoordinatorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<CoordinatorMsg>,
        args: CoordinatorArgs,
    ) -> Result<CoordinatorState, ActorProcessingErr> {
        args.subscriptions
            .subscribe(ClusterSubscriber::to_actor(myself.clone()))?;
        let timers = vec![
            myself.send_interval(args.settings.retry_interval, || {
                CoordinatorMsg::Local(CoordinatorLocal::Tick)
            }),
            myself.send_interval(args.settings.rebalance_interval, || {
                CoordinatorMsg::Local(CoordinatorLocal::Rebalance)
            }),
        ];
        tracing::info!(entity_type = %args.type_name, token = args.token.get(), "shard coordinator started: listing the shard leases");
        list_shard_leases(&args, &myself, std::time::Duration::ZERO);
        if args.settings.remember_entities {
            read_remembered_shards(&args, &myself);
        }
        let type_name = args.type_name.clone();
        let placement = IdWriter::start(pins_at(&args), args.token, move |change, written| {
            if !written {
                tracing::warn!(entity_type = %type_name, pins = change.len(), "pins not stored: this coordinator's grant is not current any more");
            }
        });
        Ok(CoordinatorState {
            myself,
            members: BTreeMap::new(),
            unreachable_since: HashMap::new(),
            regions: BTreeMap::new(),
            homes: Regions::new(),
            unconfirmed: BTreeMap::new(),
            misplaced: BTreeMap::new(),
            moving: BTreeMap::new(),
            askers: BTreeSet::new(),
            listed: false,
            list_attempts: 1,
            holders: BTreeSet::new(),
            deferred: Vec::new(),
            timers,
            remembered: BTreeSet::new(),
            unplaced: BTreeSet::new(),
            started: Instant::now(),
            outbox: BTreeMap::new(),
            pinned: BTreeMap::new(),
            pins_read: false,
            placement,
            daemon: args.daemon.map(|count| DaemonCount {
                revision: 0,
                count,
                stopping: false,
            }),
            stopping: BTreeMap::new(),
            args,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<CoordinatorMsg>,
        state: &mut CoordinatorState,
    ) -> Result<(), ActorProcessingErr> {
        for t in state.timers.drain(..) {
            t.abort();
        }
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<CoordinatorMsg>,
        msg: CoordinatorMsg,
        state: &mut CoordinatorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            CoordinatorMsg::RegisterChanges(r) => state.on_register(Registration {
                region: r.region,
                seq: r.seq,
                base: r.base,
                added: r.added,
                removed: r.removed,
                available: r.available,
            }),
            CoordinatorMsg::RegisterRegion(Register {
                region,
                shards,
                available,
            }) => {
                let seq = state.regions.get(&region).map_or(0, |r| r.seq);
                state.on_register(Registration {
                    region,
                    seq,
                    base: None,
                    added: shards,
                    removed: Vec::new(),
                    available,
                })
            }
            CoordinatorMsg::GetHome(GetShardHome { shard, region }) => {
                if !state.regions.contains_key(&region) {
                    state.askers.insert(region.clone());
                }
                state.get_home(shard, region);
            }
            CoordinatorMsg::Local(CoordinatorLocal::Listed(result)) => state.on_listed(result),
            CoordinatorMsg::Local(CoordinatorLocal::RememberedShards(shards)) => {
                tracing::info!(entity_type = %state.args.type_name, shards = shards.len(), "shards with remembered entities read");
                for shard in shards {
                    if state.homes.home(&shard).is_none() && !state.moving.contains_key(&shard) {
                        state.unplaced.insert(shard.clone());
                    }
                    state.remembered.insert(shard);
                }
                state.reallocate_lost();
            }
            CoordinatorMsg::GetAllocation(_, reply) => {
                let _ = reply.send(Allocation {
                    homes: state
                        .homes
                        .homes()
                        .map(|(s, r)| (s.to_string(), r.to_string()))
                        .collect(),
                    regions: state.homes.iter().map(|(r, _)| r.to_string()).collect(),
                });
            }
            CoordinatorMsg::PinShard(PinShard { shard, to }, reply) => {
                let result = match to {
                    Some(to) => state.pin(&shard, &to),
                    None => state.unpin(&shard),
                };
                let what = format!("the pin of shard {shard}");
                state.answer_once_stored(result, what, move |result| {
                    let _ = reply.send(PinReply { result });
                });
            }
            CoordinatorMsg::ResizeDaemon(ResizeDaemon { count }, reply) => {
                let result = state.resize(count);
                let what = format!("the resize to {count} workers");
                state.answer_once_stored(result, what, move |result| {
                    let _ = reply.send(ResizeReply { result });
                });
            }
            CoordinatorMsg::GetDaemonCount(_, reply) => {
                let count = state.daemon.filter(|_| state.pins_read);
                let _ = reply.send(DaemonCountReply { count });
            }
            CoordinatorMsg::Local(CoordinatorLocal::PinsRead(ids)) => {
                state.pins_read(&ids);
                state.resume_stopping();
            }
            CoordinatorMsg::Local(CoordinatorLocal::Cluster(event)) => state.on_cluster(event),
            CoordinatorMsg::Local(CoordinatorLocal::Tick) => {
                state.retry_stopping();
                state.reallocate_lost();
                state.resend_hosts();
                state.retry_misplaced();
            }
            CoordinatorMsg::Local(CoordinatorLocal::Rebalance) => state.rebalance(),
            CoordinatorMsg::Local(CoordinatorLocal::Flush) => state.flush(),
            CoordinatorMsg::Local(CoordinatorLocal::HandOffsEnded(ended)) => {
                for (shard, released) in ended {
                    // A daemon's shard stopped for a resize, or its lease lapses with its
                    // region (the hand-off is retried on the next tick otherwise).
                    if let Some(region) = state.stopping.get(&shard)
                        && (released || state.worker_gone(region))
                    {
                        state.stopping.remove(&shard);
                    }
                    // A rebalance's move (a resize began meanwhile: it ends with no home).
                    state.hand_off_ended(shard, released);
                }
                state.finish_resize();
                if state.moving.is_empty() {
                    state.rebalance();
                }
            }
        }
        Ok(())
    }
}
