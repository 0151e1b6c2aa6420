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

impl CoordinatorState {
    fn get_home(&mut self, shard: String, region: String) {
        if !self.listed {
            self.deferred.push((shard, region));
            return;
        }
        match self.moving.get_mut(&shard) {
            // Answered when the move ends (Akka defers GetShardHome the same way).
            Some(m) => {
                m.waiting.insert(region);
            }
            None => {
                let home = self.home_of(&shard);
                self.tell(&region, &shard, Told::Home(home));
            }
        }
    }

    /// The shard leases listed and the pins read: each held shard's home is its holder's
    /// region.
    fn on_listed(&mut self, result: Result<Listing, tenure_lease::LeaseError>) {
        if self.listed {
            return;
        }
        match result {
            Ok(Listing { held, remembered }) => {
                self.pins_read(&remembered);
                tracing::info!(entity_type = %self.args.type_name, held = held.len(), "allocation rebuilt from the shard leases");
                for (shard, holder) in held {
                    if !self.regions.contains_key(&holder) {
                        self.holders.insert(holder.clone());
                    }
                    // Confirmed once its holder reports it (a holder that restarted may
                    // not run it any more).
                    let reported = self
                        .regions
                        .get(&holder)
                        .is_some_and(|r| r.reported.contains(&shard));
                    if !reported {
                        self.unconfirmed.insert(shard.clone(), None);
                    }
                    self.unplaced.remove(&shard);
                    self.homes.set_home(&shard, &holder);
                }
            }
            Err(e) if self.list_attempts < 3 => {
                tracing::warn!(entity_type = %self.args.type_name, error = %e, "cannot list the shard leases; retrying");
                self.list_attempts += 1;
                list_shard_leases(&self.args, &self.myself, self.args.settings.retry_interval);
                return;
            }
            Err(e) => {
                tracing::warn!(entity_type = %self.args.type_name, error = %e, "cannot list the shard leases; allocating from the regions' reports alone");
                read_pins(&self.args, &self.myself);
            }
        }
        self.listed = true;
        self.resume_stopping();
        for (shard, region) in std::mem::take(&mut self.deferred) {
            self.get_home(shard, region);
        }
        self.reallocate_lost();
    }

    fn on_cluster(&mut self, event: ClusterEvent) {
        match event {
            ClusterEvent::CurrentMembers(members) => {
                self.members = members
                    .into_iter()
                    .map(|m| (m.addr.to_string(), m))
                    .collect();
                let now = Instant::now();
                for m in self.members.values().filter(|m| !m.reachable) {
                    self.unreachable_since.insert(m.addr.to_string(), now);
                }
                let registered: Vec<String> = self.regions.keys().cloned().collect();
                for region in registered {
                    self.refresh(&region);
                }
            }
            ClusterEvent::Unreachable(m) => {
                let addr = m.addr.to_string();
                self.unreachable_since
                    .entry(addr.clone())
                    .or_insert_with(Instant::now);
                self.members.insert(addr.clone(), m);
                self.refresh(&addr);
            }
            ClusterEvent::Reachable(m) => {
                let addr = m.addr.to_string();
                self.unreachable_since.remove(&addr);
                self.members.insert(addr.clone(), m);
                self.refresh(&addr);
            }
            ClusterEvent::MemberJoined(m)
            | ClusterEvent::MemberUp(m)
            | ClusterEvent::MemberLeaving(m) => {
                let addr = m.addr.to_string();
                self.members.insert(addr.clone(), m);
                self.refresh(&addr);
            }
            ClusterEvent::MemberDown(m) | ClusterEvent::MemberRemoved(m) => {
                let addr = m.addr.to_string();
                self.members.remove(&addr);
                self.regions.remove(&addr);
                self.askers.remove(&addr);
                self.unreachable_since.remove(&addr);
                self.misplaced.retain(|(region, _), _| *region != addr);
                // A daemon's workers there stopped with it (their leases lapse).
                self.stopping.retain(|_, region| *region != addr);
                self.finish_resize();
                self.set_allocatable(&addr, false, false);
            }
            ClusterEvent::SelfDown | ClusterEvent::SelfLeaving(_) => {}
        }
        self.reallocate_lost();
    }

    /// A region that may keep its shards: its member is up, it reported itself
    /// available, and it has not been unreachable for too long.
    fn alive(&self, region: &str) -> bool {
        let up = self.members.get(region).is_some_and(|m| {
            m.status == MemberStatus::Up && m.has_role(self.args.settings.role.as_deref())
        });
        let available = self
            .regions
            .get(region)
            .map_or(self.holders.contains(region), |r| r.available);
        let silent_too_long = self
            .unreachable_since
            .get(region)
            .is_some_and(|t| t.elapsed() >= self.args.settings.unreachable_reallocate_after);
        up && available && !silent_too_long
    }

    /// Whether `region` may be given new shards from now on (alive, registered and
    /// reachable), as the allocation strategy sees it.
    fn refresh(&mut self, region: &str) {
        let allocatable = self.regions.contains_key(region)
            && self.alive(region)
            && !self.unreachable_since.contains_key(region);
        let new_version = self
            .members
            .get(region)
            .is_some_and(|m| self.homes.set_version(region, m.app_version.clone()));
        self.set_allocatable(region, allocatable, new_version);
    }

    /// Records whether `region` may be given shards (before the newest-version filter),
    /// and in the history each change, and each new version (`new_version`) of one that may.
    fn set_allocatable(&mut self, region: &str, allocatable: bool, new_version: bool) {
        if self.homes.set_allocatable(region, allocatable) || (allocatable && new_version) {
            let version = self.homes.version(region).to_string();
            history::region_allocatable(&self.args.type_name, region, &version, allocatable);
        }
    }

    /// Where `shard` lives, allocating it if it has no home; `None` while it moves or
    /// when no region can take it.
    fn home_of(&mut self, shard: &str) -> Option<String> {
        if self.moving.contains_key(shard) || self.resizing() {
            return None;
        }
        if let Some(home) = self.homes.home(shard)
            && self.alive(home)
        {
            return Some(home.to_string());
        }
        let to = self.allocate(shard)?;
        self.host(shard, &to);
        Some(to)
    }

    /// Where a shard without a home goes: the region it is pinned to when that can take
    /// it, else where the strategy says.
    fn allocate(&self, shard: &str) -> Option<String> {
        if self.resizing() {
            return None;
        }
        match self.pinned.get(shard) {
            Some(pin) if self.homes.is_allocatable(pin) => Some(pin.clone()),
            _ => self.args.strategy.allocate(shard, &self.homes),
        }
    }

    /// The ids remembered with this coordinator's lease, read from the store: its pins,
    /// and a daemon's count.
    fn pins_read(&mut self, ids: &[String]) {
        if self.pins_read {
            return;
        }
        self.pins_read = true;
        self.pinned = crate::placement::pins_of(ids);
        if let Some(daemon) = &mut self.daemon
            && let Some(stored) = crate::placement::count_of(ids)
        {
            tracing::info!(entity_type = %self.args.type_name, revision = stored.revision, count = stored.count, stopping = stored.stopping, "daemon count read from the store");
            *daemon = stored;
        }
        tracing::info!(entity_type = %self.args.type_name, pins = self.pinned.len(), "pins read from the store");
    }

    /// Whether pins may change now; `Err` says why not.
    fn check_pins(&self, shard: &str) -> Result<(), String> {
        let type_name = &self.args.type_name;
        if !self.pins_read {
            return Err(format!(
                "the coordinator of `{type_name}` has not read the pins from the store yet: try again"
            ));
        }
        crate::remember::ids_of(&*self.args.lease.store)
            .map(|_| ())
            .map_err(|e| format!("shard {shard} of `{type_name}` cannot be pinned: {e}"))
    }

    /// Removes the pin of `shard`, in the store too (see [`pin`](Self::pin)): `Ok(false)`.
    fn unpin(&mut self, shard: &str) -> Result<bool, String> {
        self.check_pins(shard)?;
        if let Some(from) = self.pinned.remove(shard) {
            self.placement
                .send(crate::placement::repin(shard, Some(&from), None));
        }
        tracing::info!(entity_type = %self.args.type_name, shard, "shard unpinned");
        Ok(false)
    }

    /// Pins `shard` to the region of `to` and moves it there (see the module's docs).
    /// `Ok(true)` when a move or a first allocation began, `Ok(false)` when it lives there
    /// already; `Err` names what is wrong (nothing is pinned then).
    fn pin(&mut self, shard: &str, to: &str) -> Result<bool, String> {
        let type_name = &self.args.type_name;
        let shards = self.args.settings.number_of_shards;
        if !shard.parse::<usize>().is_ok_and(|n| n < shards) {
            return Err(format!(
                "`{shard}` is not a shard of `{type_name}` (its shards are 0 to {})",
                shards.saturating_sub(1)
            ));
        }
        if !self.listed {
            return Err(format!(
                "the coordinator of `{type_name}` is still rebuilding its allocation: try again"
            ));
        }
        self.check_pins(shard)?;
        if !self.homes.is_allocatable(to) {
            let why = if !self.regions.contains_key(to) {
                "has no region of this type registered with the coordinator"
            } else if !self.alive(to) || self.unreachable_since.contains_key(to) {
                "is not up and reachable, or its region takes no shards"
            } else {
                "runs an older application version than the newest present"
            };
            let can: Vec<&str> = self.homes.iter().map(|(r, _)| r).collect();
            return Err(format!(
                "cannot pin shard {shard} of `{type_name}` to {to}: it {why} (nodes that can take shards: {})",
                can.join(", ")
            ));
        }
        if let Some(m) = self.moving.get(shard) {
            return Err(format!(
                "shard {shard} of `{type_name}` is moving from {} to {}: try again once it arrived",
                m.from, m.to
            ));
        }
        let before = self.pinned.insert(shard.to_string(), to.to_string());
        if before.as_deref() != Some(to) {
            self.placement
                .send(crate::placement::repin(shard, before.as_deref(), Some(to)));
        }
        tracing::info!(entity_type = %type_name, shard, to, "shard pinned");
        match self.homes.home(shard).map(str::to_string) {
            Some(home) if home == to => Ok(false),
            Some(from) => {
                self.begin_moves(vec![(shard.to_string(), from, to.to_string())]);
                Ok(true)
            }
            None => {
                self.host(shard, to);
                Ok(true)
            }
        }
    }

    /// Answers `result` through `reply` once every change of the pins or the daemon's
    /// count made so far is stored (an `Err` at once); `what` names the change in the
    /// error when it could not be stored. An operator told `Ok` can rely on the next
    /// coordinator keeping it.
    fn answer_once_stored(
        &self,
        result: Result<bool, String>,
        what: String,
        reply: impl FnOnce(Result<bool, String>) + Send + 'static,
    ) {
        let Ok(changed) = result else {
            reply(result);
            return;
        };
        let stored = self.placement.flush();
        let (type_name, lease) = (self.args.type_name.clone(), self.args.lease.name.clone());
        tokio::spawn(async move {
            reply(if stored.await {
                Ok(changed)
            } else {
                Err(format!(
                    "{what} of `{type_name}` was not stored with the coordinator's lease `{lease}` (its grant is not current any more, or the store keeps no remembered ids): ask again"
                ))
            });
        });
    }

    /// Whether a daemon's old workers are being stopped for a resize: nothing is allocated
    /// meanwhile.
    fn resizing(&self) -> bool {
        self.daemon.is_some_and(|d| d.stopping)
    }

    /// A sharded daemon's resize to `count` workers (Akka's `ShardedDaemonProcess`
    /// resize): the next revision is stored as stopping, every shard of the type is handed
    /// off (its worker stops under its lease) and none is allocated, and once all are
    /// stopped the revision is stored as running and its workers start. `Ok(true)`: begun;
    /// `Ok(false)`: it runs `count` workers already; `Err` names the daemon and why.
    fn resize(&mut self, count: usize) -> Result<bool, String> {
        let type_name = &self.args.type_name;
        let Some(current) = self.daemon else {
            return Err(format!(
                "`{type_name}` is not a sharded daemon's entity type"
            ));
        };
        let most = self.args.settings.number_of_shards;
        if count == 0 || count > most {
            return Err(format!(
                "daemon `{type_name}` cannot run {count} workers: it runs 1 to {most} (its number-of-shards)"
            ));
        }
        if !self.listed || !self.pins_read {
            return Err(format!(
                "the coordinator of `{type_name}` is still reading its state from the store: try again"
            ));
        }
        crate::remember::ids_of(&*self.args.lease.store).map_err(|e| {
            format!("daemon `{type_name}` cannot be resized to {count} workers: {e}")
        })?;
        if current.stopping {
            return Err(format!(
                "daemon `{type_name}` is being resized to {} workers: try again once its old workers stopped",
                current.count
            ));
        }
        if count == current.count {
            return Ok(false);
        }
        let next = DaemonCount {
            revision: current.revision + 1,
            count,
            stopping: true,
        };
        tracing::info!(entity_type = %type_name, from = current.count, to = count, revision = next.revision, "daemon resize: stopping every worker");
        self.placement
            .send(crate::placement::recount(Some(&current), &next));
        self.daemon = Some(next);
        self.stop_workers();
        Ok(true)
    }

    /// Hands off every shard of the daemon's type this coordinator knows to be hosted (by
    /// its home, or by a region's report); none is allocated until all are stopped.
    fn stop_workers(&mut self) {
        let mut round: BTreeMap<String, String> = BTreeMap::new();
        let homes: Vec<(String, String)> = self
            .homes
            .homes()
            .map(|(s, r)| (s.to_string(), r.to_string()))
            .collect();
        for (shard, home) in homes {
            self.homes.remove_home(&shard);
            self.unconfirmed.remove(&shard);
            round.insert(shard, home);
        }
        for (region, entry) in &self.regions {
            for shard in &entry.reported {
                round.entry(shard.clone()).or_insert_with(|| region.clone());
            }
        }
        self.stop_shards(round.into_iter().collect());
        self.finish_resize();
    }

    /// Whether a daemon's worker on `region` counts as stopped without its hand-off: its
    /// member is down, or unreachable past `unreachable-reallocate-after` (its shard lease
    /// lapses with it), or this coordinator has not heard of it within
    /// `rebalance-interval` of its start (a holder in the listing that left before). A
    /// leaving member's region still hands its shards off.
    fn worker_gone(&self, region: &str) -> bool {
        match self.members.get(region) {
            Some(m) => {
                matches!(m.status, MemberStatus::Down | MemberStatus::Removed)
                    || self.unreachable_since.get(region).is_some_and(|t| {
                        t.elapsed() >= self.args.settings.unreachable_reallocate_after
                    })
            }
            None => self.started.elapsed() >= self.args.settings.rebalance_interval,
        }
    }

    /// Hands off `shards` (shard, region) for a resize.
    fn stop_shards(&mut self, shards: Vec<(String, String)>) {
        let round: Vec<(String, String)> = shards
            .into_iter()
            .filter(|(_, region)| !self.worker_gone(region))
            .collect();
        for (shard, region) in &round {
            self.stopping.insert(shard.clone(), region.clone());
        }
        if !round.is_empty() {
            self.move_shards(round);
        }
    }

    /// A coordinator that read a resize in progress (it failed over during one) stops
    /// the workers again, once it knows where they run.
    fn resume_stopping(&mut self) {
        if self.listed && self.pins_read && self.resizing() && self.stopping.is_empty() {
            self.stop_workers();
        }
    }

    /// Hands off again the shards whose hand-off for a resize was not confirmed; those of
    /// regions that are gone count as stopped (their leases lapse with them).
    fn retry_stopping(&mut self) {
        if self.stopping.is_empty() {
            return;
        }
        let again: Vec<(String, String)> = std::mem::take(&mut self.stopping).into_iter().collect();
        self.stop_shards(again);
        self.finish_resize();
    }

    /// Ends a resize once every old worker stopped (and no rebalance's move is in flight):
    /// the revision is stored as running, and its workers may start.
    fn finish_resize(&mut self) {
        if !self.resizing() || !self.stopping.is_empty() || !self.moving.is_empty() {
            return;
        }
        let Some(before) = self.daemon else {
            return;
        };
        let running = DaemonCount {
            stopping: false,
            ..before
        };
        tracing::info!(entity_type = %self.args.type_name, count = running.count, revision = running.revision, "daemon resize: the old workers stopped; the new ones start");
        self.placement
            .send(crate::placement::recount(Some(&before), &running));
        self.daemon = Some(running);
        self.reallocate_lost();
    }

    /// Tells `region`, at the end of this wave, what to make of `shard` (what it was told
    /// of the shard earlier in the wave is replaced).
    fn tell(&mut self, region: &str, shard: &str, told: Told) {
        self.answer(region);
        if let Some(told_here) = self.outbox.get_mut(region) {
            told_here.insert(shard.to_string(), told);
        }
    }

    /// Sends `region` a message at the end of this wave, even if it learns nothing in it.
    fn answer(&mut self, region: &str) {
        if self.outbox.is_empty() {
            // Handled once the messages that reached the coordinator before it are: the
            // wave is everything they decide.
            let _ = self
                .myself
                .cast(CoordinatorMsg::Local(CoordinatorLocal::Flush));
        }
        self.outbox.entry(region.to_string()).or_default();
    }

    /// Sends each region what it learnt in this wave, in one message.
    fn flush(&mut self) {
        for (region, told) in std::mem::take(&mut self.outbox) {
            let Some(r) = region_ref(&self.args.scope, &self.args.type_name, &region) else {
                continue;
            };
            let (mut host, mut homes) = (Vec::new(), Vec::new());
            for (shard, t) in told {
                match t {
                    Told::Host => host.push(shard),
                    Told::Home(home) => homes.push((shard, home)),
                }
            }
            let _ = r.cast(RegionMsg::Homes(ShardHomes {
                host,
                homes,
                coordinator: self.args.token,
            }));
        }
    }

    /// Records `region` as the home of `shard`, tells it to host the shard, and tells every
    /// other registered region where the shard lives (a region that registers later learns
    /// it then). Every region then knows every home, not only those it asked: when a node
    /// goes, the regions ask the next home of each of its shards at once (the region's
    /// orphans), so that even a coordinator that failed over with that node, and found the
    /// shard's lease lapsed, restarts the shard without waiting for a message to it. A copy
    /// of the shard that another region reports running is asked to hand off.
    fn host(&mut self, shard: &str, region: &str) {
        history::shard_allocated(&self.args.type_name, shard, region);
        if self.args.settings.remember_entities {
            self.remembered.insert(shard.to_string());
        }
        self.unplaced.remove(shard);
        self.homes.set_home(shard, region);
        self.unconfirmed
            .insert(shard.to_string(), Some(Instant::now()));
        self.tell(region, shard, Told::Host);
        let others: Vec<String> = self
            .regions
            .keys()
            .filter(|r| *r != region)
            .cloned()
            .collect();
        for other in others {
            self.tell(&other, shard, Told::Home(Some(region.to_string())));
            if self.regions[&other].reported.contains(shard) {
                self.misplace(shard, &other);
            }
        }
    }

    /// A registration: full (the first to this coordinator, or asked for), or the changes
    /// since the registration this coordinator has of the region (else it asks for a full
    /// one). Its work is proportional to the shards it names.
    fn on_register(&mut self, r: Registration) {
        let region = r.region;
        let (added, removed) = match r.base {
            None => {
                let hosted: BTreeSet<String> = r.added.into_iter().collect();
                let before = self
                    .regions
                    .get(&region)
                    .map(|e| e.reported.clone())
                    .unwrap_or_default();
                (
                    hosted.difference(&before).cloned().collect(),
                    before.difference(&hosted).cloned().collect(),
                )
            }
            Some(base) if self.regions.get(&region).is_some_and(|e| e.seq == base) => {
                (r.added, r.removed)
            }
            Some(base) => {
                tracing::debug!(entity_type = %self.args.type_name, region, base, "registration changes without their base: asking the region for all its shards");
                if let Some(rr) = region_ref(&self.args.scope, &self.args.type_name, &region) {
                    let _ = rr.cast(RegionMsg::RegisterAll(RegisterAgain {
                        coordinator: self.args.token,
                    }));
                }
                return;
            }
        };
        let first = !self.regions.contains_key(&region);
        let entry = self
            .regions
            .entry(region.clone())
            .or_insert_with(|| RegionEntry {
                available: r.available,
                reported: BTreeSet::new(),
                seq: r.seq,
            });
        entry.available = r.available;
        entry.seq = r.seq;
        if first {
            // A region new to this coordinator learns every home known so far, as if it
            // had been registered when each was allocated (see `host`); not those of
            // moving shards, which have none.
            let known: Vec<(String, String)> = self
                .homes
                .homes()
                .filter(|(_, home)| *home != region)
                .map(|(s, h)| (s.to_string(), h.to_string()))
                .collect();
            for (shard, home) in known {
                self.tell(&region, &shard, Told::Home(Some(home)));
            }
            // Answered even when no home is known yet: the answer is what tells the region
            // it registered (its readiness).
            self.answer(&region);
        }
        self.askers.remove(&region);
        self.holders.remove(&region);
        self.refresh(&region);
        for shard in removed {
            self.forget_report(&region, &shard);
        }
        for shard in added {
            self.take_report(&region, shard);
        }
        if r.base.is_none() {
            // Shards this region should host but does not (a lost Host, a restarted node).
            let missing: Vec<String> = self
                .homes
                .hosted_by(&region)
                .iter()
                .filter(|s| !self.regions[&region].reported.contains(*s))
                .cloned()
                .collect();
            for shard in missing {
                self.unconfirmed.entry(shard).or_insert(None);
            }
        }
        self.reallocate_lost();
    }

    /// `region` reports that it hosts (or acquires) `shard`.
    fn take_report(&mut self, region: &str, shard: String) {
        if let Some(e) = self.regions.get_mut(region) {
            e.reported.insert(shard.clone());
        }
        self.judge_report(region, &shard);
    }

    /// What to make of `region` hosting `shard`: its home learnt (a new coordinator learns
    /// the allocation from the regions), its `Host` confirmed, or a copy to stop.
    fn judge_report(&mut self, region: &str, shard: &str) {
        if self.moving.contains_key(shard) {
            return;
        }
        if self.resizing() {
            // No worker runs while a daemon's old workers stop.
            if !self.stopping.contains_key(shard) {
                self.stop_shards(vec![(shard.to_string(), region.to_string())]);
            }
            return;
        }
        match self.homes.home(shard) {
            None if self.alive(region) => {
                self.unplaced.remove(shard);
                self.homes.set_home(shard, region);
                self.misplaced
                    .remove(&(region.to_string(), shard.to_string()));
            }
            Some(home) if home == region => {
                self.unconfirmed.remove(shard);
                self.misplaced
                    .remove(&(region.to_string(), shard.to_string()));
            }
            // Hosted (or being acquired) where it no longer belongs: stop it there; its
            // lease then goes to the shard's home.
            _ => self.misplace(shard, region),
        }
    }

    /// `region` reports that it no longer hosts `shard`.
    fn forget_report(&mut self, region: &str, shard: &str) {
        if let Some(e) = self.regions.get_mut(region) {
            e.reported.remove(shard);
        }
        self.misplaced
            .remove(&(region.to_string(), shard.to_string()));
        if self.homes.home(shard) == Some(region) {
            // Its home stopped it (its lease was lost, it failed): told to host it again.
            self.unconfirmed.entry(shard.to_string()).or_insert(None);
        }
    }

    /// Asks `region` to hand off `shard`, which it runs where the shard does not belong
    /// (once it is reachable), and again every three `retry-interval`s while it reports it.
    fn misplace(&mut self, shard: &str, region: &str) {
        let key = (region.to_string(), shard.to_string());
        if self.unreachable_since.contains_key(region) {
            // Asked once it is reachable again (see `retry_misplaced`).
            self.misplaced.entry(key).or_insert_with(Instant::now);
            return;
        }
        tracing::info!(entity_type = %self.args.type_name, shard, region, "telling a region to stop a shard allocated elsewhere");
        self.misplaced.insert(key, Instant::now());
        self.stop_misplaced(shard, region);
    }

    fn retry_misplaced(&mut self) {
        let again = self.args.settings.retry_interval * 3;
        let due: Vec<(String, String)> = self
            .misplaced
            .iter()
            .filter(|((region, _), at)| {
                at.elapsed() >= again && !self.unreachable_since.contains_key(region)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for (region, shard) in due {
            let reported = self
                .regions
                .get(&region)
                .is_some_and(|r| r.reported.contains(&shard));
            if reported {
                self.judge_report(&region, &shard);
            } else {
                self.misplaced.remove(&(region, shard));
            }
        }
    }

    /// Sends `Host` again for the shards their home has not reported within three
    /// `retry-interval`s of the last one (a lost `Host`, a shard that stopped there).
    fn resend_hosts(&mut self) {
        let again = self.args.settings.retry_interval * 3;
        let mut due = Vec::new();
        self.unconfirmed.retain(|shard, sent| {
            let Some(home) = self.homes.home(shard) else {
                return false;
            };
            if sent.is_none_or(|t| t.elapsed() >= again) {
                due.push((shard.clone(), home.to_string()));
            }
            true
        });
        for (shard, home) in due {
            if self.alive(&home) {
                self.unconfirmed.insert(shard.clone(), Some(Instant::now()));
                self.tell(&home, &shard, Told::Host);
            }
        }
    }

    /// Moves the shards of regions that are no longer alive to the least loaded ones; with
    /// remember-entities, allocates the remembered shards without a home. Scans regions,
    /// not shards.
    fn reallocate_lost(&mut self) {
        if !self.listed {
            return;
        }
        let lost: Vec<String> = self
            .homes
            .home_regions()
            .filter(|r| !self.alive(r))
            .map(str::to_string)
            .collect();
        for from in lost {
            let shards: Vec<String> = self.homes.hosted_by(&from).iter().cloned().collect();
            for shard in shards {
                self.homes.remove_home(&shard);
                self.unconfirmed.remove(&shard);
                match self.allocate(&shard) {
                    Some(to) => {
                        tracing::info!(entity_type = %self.args.type_name, shard, from, to, "moving the shard of a lost region");
                        self.host(&shard, &to);
                    }
                    None if self.remembered.contains(&shard) => {
                        self.unplaced.insert(shard);
                    }
                    None => {}
                }
            }
        }
        self.allocate_remembered();
    }

    /// remember-entities: gives every remembered shard without a home one, so that its
    /// entities start with no message; once the regions of the members up registered (or
    /// `rebalance-interval` after this coordinator started), so that they spread.
    fn allocate_remembered(&mut self) {
        if self.unplaced.is_empty() || !self.regions_registered() {
            return;
        }
        let unplaced: Vec<String> = self.unplaced.iter().cloned().collect();
        for shard in unplaced {
            if self.homes.home(&shard).is_some() || self.moving.contains_key(&shard) {
                self.unplaced.remove(&shard);
                continue;
            }
            match self.allocate(&shard) {
                Some(to) => {
                    tracing::debug!(entity_type = %self.args.type_name, shard, to, "allocating a shard with remembered entities");
                    self.host(&shard, &to);
                }
                None => return,
            }
        }
    }

    /// Whether every member up and reachable that may host the type has a region that
    /// registered, or this coordinator has waited `rebalance-interval` for them.
    fn regions_registered(&self) -> bool {
        self.started.elapsed() >= self.args.settings.rebalance_interval
            || self
                .members
                .values()
                .filter(|m| {
                    m.status == MemberStatus::Up
                        && m.reachable
                        && m.has_role(self.args.settings.role.as_deref())
                })
                .all(|m| self.regions.contains_key(&m.addr.to_string()))
    }

    /// Decides a rebalance round, when every member is up, reachable and (if it may host
    /// the type) registered and available, and starts its moves.
    fn rebalance(&mut self) {
        let settled = self.members.values().all(|m| {
            m.status == MemberStatus::Up
                && m.reachable
                && (!m.has_role(self.args.settings.role.as_deref())
                    || self
                        .regions
                        .get(&m.addr.to_string())
                        .is_some_and(|r| r.available))
        });
        if !settled || !self.listed || self.resizing() {
            return;
        }
        let in_progress: BTreeSet<String> = self.moving.keys().cloned().collect();
        // Pinned shards away from their region go back once it can take them; the
        // strategy's moves leave every pinned shard where it is.
        let mut decided: Vec<(String, String, String)> = self
            .pinned
            .iter()
            .filter(|(shard, pin)| !in_progress.contains(*shard) && self.homes.is_allocatable(pin))
            .filter_map(|(shard, pin)| {
                let home = self.homes.home(shard)?;
                (home != pin).then(|| (shard.clone(), home.to_string(), pin.clone()))
            })
            .collect();
        decided.extend(
            self.args
                .strategy
                .rebalance(&self.homes, &in_progress)
                .into_iter()
                .filter(|(shard, _, _)| !self.pinned.contains_key(shard)),
        );
        self.begin_moves(decided);
    }

    /// Starts a round of moves `(shard, from, to)` through the hand-off (those that are not
    /// on `from`, or whose `to` cannot take shards, are logged and left).
    fn begin_moves(&mut self, decided: Vec<(String, String, String)>) {
        let mut round = Vec::new();
        for (shard, from, to) in decided {
            let valid = self.homes.home(&shard) == Some(from.as_str())
                && self.homes.is_allocatable(&to)
                && from != to;
            if !valid {
                tracing::warn!(entity_type = %self.args.type_name, shard, from, to, "rebalance: the strategy moved a shard that is not on `from`, or to a region that cannot take it; ignored");
                continue;
            }
            tracing::debug!(entity_type = %self.args.type_name, shard, from, to, "moving a shard");
            crate::metrics::rebalance_move(&self.args.type_name);
            history::shard_moving(&self.args.type_name, &shard, &from, &to);
            self.homes.remove_home(&shard);
            self.unconfirmed.remove(&shard);
            self.moving.insert(
                shard.clone(),
                Move {
                    from: from.clone(),
                    to,
                    waiting: BTreeSet::new(),
                },
            );
            round.push((shard, from));
        }
        if !round.is_empty() {
            tracing::info!(entity_type = %self.args.type_name, shards = round.len(), "a round of moves begins");
            self.move_shards(round);
        }
    }

    /// A moving shard's hand-off ended: it goes to its new home (or is allocated anew when
    /// that went meanwhile), and the regions that asked meanwhile learn where. (Once the
    /// round's last shard has moved, the next round is decided at once.)
    fn hand_off_ended(&mut self, shard: String, released: bool) {
        let Some(Move { from, to, waiting }) = self.moving.remove(&shard) else {
            return;
        };
        tracing::info!(entity_type = %self.args.type_name, shard, from, to, released, "shard handed off for a rebalance");
        if released && let Some(e) = self.regions.get_mut(&from) {
            // Its old host said so: no copy of it runs there to stop.
            e.reported.remove(&shard);
        }
        if self.homes.is_allocatable(&to) && !self.resizing() {
            self.host(&shard, &to);
        }
        let home = self.home_of(&shard);
        if home.is_none() && self.remembered.contains(&shard) {
            self.unplaced.insert(shard.clone());
        }
        history::shard_moved(
            &self.args.type_name,
            &shard,
            &from,
            home.as_deref(),
            released,
        );
        for region in waiting {
            self.tell(&region, &shard, Told::Home(home.clone()));
        }
    }

    /// The steps of a rebalance round after the decision: every region (registered, or one
    /// that asked for a home) is told, in one message, that the round's hand-offs begin,
    /// and answers (each waited for at most `hand-off-timeout`), so that none sends those
    /// shards to their old homes any more; then each old home hands its shard off, and the
    /// ends come back to this coordinator (`HandOffsEnded`), those that ended together in
    /// one message, so that their new homes reach each region together. What this wave
    /// told the regions leaves first.
    fn move_shards(&mut self, round: Vec<(String, String)>) {
        self.flush();
        let scope = &self.args.scope;
        let type_name = &self.args.type_name;
        let regions: Vec<ActorRef<RegionMsg>> = self
            .regions
            .keys()
            .chain(self.askers.iter())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter_map(|r| region_ref(scope, type_name, r))
            .collect();
        let timeout = self.args.settings.hand_off_timeout;
        let token = self.args.token;
        let (scope, type_name, me) = (scope.clone(), type_name.clone(), self.myself.clone());
        tokio::spawn(async move {
            let shards: Vec<String> = round.iter().map(|(s, _)| s.clone()).collect();
            let begun = regions.into_iter().map(|region| {
                let shards = shards.clone();
                async move {
                    region
                        .call(
                            |port| {
                                RegionMsg::BeginHandOffShards(
                                    BeginHandOffs {
                                        shards,
                                        coordinator: token,
                                    },
                                    port,
                                )
                            },
                            Some(timeout),
                        )
                        .await
                }
            });
            futures::future::join_all(begun).await;
            let mut hand_offs: FuturesUnordered<_> = round
                .into_iter()
                .map(|(shard, from)| {
                    let (scope, type_name) = (&scope, &type_name);
                    async move {
                        let released =
                            hand_off_call(scope, type_name, &shard, &from, token, timeout).await;
                        (shard, released)
                    }
                })
                .collect();
            while let Some(first) = hand_offs.next().await {
                let mut ended = vec![first];
                while let Some(Some(more)) = hand_offs.next().now_or_never() {
                    ended.push(more);
                }
                let _ = me.cast(CoordinatorMsg::Local(CoordinatorLocal::HandOffsEnded(
                    ended,
                )));
            }
        });
    }

    /// Asks `region` to hand off `shard`, a copy it runs where the shard does not belong.
    fn stop_misplaced(&self, shard: &str, region: &str) {
        let (scope, type_name) = (self.args.scope.clone(), self.args.type_name.clone());
        let (shard, region) = (shard.to_string(), region.to_string());
        let timeout = self.args.settings.hand_off_timeout;
        let token = self.args.token;
        tokio::spawn(async move {
            hand_off_call(&scope, &type_name, &shard, &region, token, timeout).await;
        });
    }
}

/// Asks `region` to hand `shard` off and waits up to `timeout`; `true` when it answered
/// that the shard's lease was released.
async fn hand_off_call(
    scope: &str,
    type_name: &str,
    shard: &str,
    region: &str,
    coordinator: FencingToken,
    timeout: std::time::Duration,
) -> bool {
    let Some(r) = region_ref(scope, type_name, region) else {
        return false;
    };
    matches!(
        r.call(
            |port| RegionMsg::HandOffShard(
                HandOff {
                    shard: shard.to_string(),
                    coordinator,
                },
                port
            ),
            Some(timeout),
        )
        .await,
        Ok(ractor::rpc::CallResult::Success(done)) if done.released
    )
}

/// Where the ids remembered with the coordinator's lease (its pins) are read and written.
fn pins_at(args: &CoordinatorArgs) -> RememberStore {
    RememberStore {
        store: args.lease.store.clone(),
        name: args.lease.name.clone(),
        owner: args.lease.owner.clone(),
        timeout: args.list_timeout,
        retry: args.settings.retry_interval,
    }
}

/// Lists the type's shard leases after `delay`, and reads the ids remembered with the
/// coordinator's lease, and reports shard → holder and those ids
/// (`CoordinatorLocal::Listed`). A name the store changed (its naming rules) is skipped: its
/// shard is learnt from its region's report instead. A store that keeps no remembered ids
/// has no pins.
fn list_shard_leases(
    args: &CoordinatorArgs,
    me: &ActorRef<CoordinatorMsg>,
    delay: std::time::Duration,
) {
    let prefix = tenure_lease::names::shard_lease(&args.system, &args.type_name, "");
    let (store, timeout, me) = (args.store.clone(), args.list_timeout, me.clone());
    let (system, type_name) = (args.system.clone(), args.type_name.clone());
    let pins = pins_at(args);
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let rules = store.name_rules();
        let listed = async {
            let records =
                tenure_lease::store::bounded(&prefix, "list", timeout, store.list(&prefix)).await?;
            let held = records
                .into_iter()
                .filter_map(|r| {
                    let shard = r.name.strip_prefix(&prefix)?;
                    let name = tenure_lease::names::shard_lease(&system, &type_name, shard);
                    (tenure_lease::names::store_name(&name, &rules) == r.name)
                        .then(|| (shard.to_string(), r.owner))
                })
                .collect();
            let remembered = read_pin_ids(&pins).await?;
            Ok::<_, tenure_lease::LeaseError>(Listing { held, remembered })
        };
        let _ = me.cast(CoordinatorMsg::Local(CoordinatorLocal::Listed(
            listed.await,
        )));
    });
}

/// The ids remembered with the coordinator's lease (none on a store that keeps none).
async fn read_pin_ids(at: &RememberStore) -> Result<Vec<String>, tenure_lease::LeaseError> {
    match at.remembered().await {
        Err(tenure_lease::LeaseError::Config(e)) => {
            tracing::warn!(lease = %at.name, error = %e, "no pins: the store keeps no remembered ids");
            Ok(Vec::new())
        }
        read => read,
    }
}

/// Reads the ids remembered with the coordinator's lease, every `retry-interval` until the
/// store answers or the coordinator stopped, and reports them (`CoordinatorLocal::PinsRead`):
/// for a coordinator that allocates without the listing, which read them too.
fn read_pins(args: &CoordinatorArgs, me: &ActorRef<CoordinatorMsg>) {
    let (pins, me, type_name) = (pins_at(args), me.clone(), args.type_name.clone());
    tokio::spawn(async move {
        loop {
            match read_pin_ids(&pins).await {
                Ok(ids) => {
                    let _ = me.cast(CoordinatorMsg::Local(CoordinatorLocal::PinsRead(ids)));
                    return;
                }
                Err(e) => {
                    if matches!(
                        me.get_status(),
                        ractor::ActorStatus::Stopping | ractor::ActorStatus::Stopped
                    ) {
                        return;
                    }
                    tracing::warn!(entity_type = %type_name, error = %e, "cannot read the pins; retrying");
                    tokio::time::sleep(pins.retry).await;
                }
            }
        }
    });
}

/// remember-entities: reads the ids remembered with every shard lease of the type and
/// reports the shards that have some (`CoordinatorLocal::RememberedShards`), trying a shard
/// again every `retry-interval` while the store fails.
fn read_remembered_shards(args: &CoordinatorArgs, me: &ActorRef<CoordinatorMsg>) {
    use futures::stream;

    let (store, timeout, me) = (args.store.clone(), args.list_timeout, me.clone());
    let retry = args.settings.retry_interval;
    let rules = store.name_rules();
    let names: Vec<(String, String)> = (0..args.settings.number_of_shards)
        .map(|i| {
            let shard = i.to_string();
            let lease = tenure_lease::names::shard_lease(&args.system, &args.type_name, &shard);
            (shard, tenure_lease::names::store_name(&lease, &rules))
        })
        .collect();
    let type_name = args.type_name.clone();
    tokio::spawn(async move {
        let read = |(shard, name): (String, String)| {
            let (store, type_name, me) = (store.clone(), type_name.clone(), me.clone());
            async move {
                loop {
                    let read = match crate::remember::ids_of(&*store) {
                        Ok(ids) => {
                            let call = ids.remembered(&name);
                            tenure_lease::store::bounded(
                                &name,
                                "read remembered ids",
                                timeout,
                                call,
                            )
                            .await
                        }
                        Err(e) => Err(e),
                    };
                    match read {
                        Ok(ids) => return (!ids.is_empty()).then_some(shard),
                        Err(e @ tenure_lease::LeaseError::Config(_)) => {
                            tracing::error!(entity_type = %type_name, error = %e, "remember-entities needs a store that keeps remembered ids");
                            return None;
                        }
                        Err(e) => {
                            if matches!(
                                me.get_status(),
                                ractor::ActorStatus::Stopping | ractor::ActorStatus::Stopped
                            ) {
                                return None;
                            }
                            tracing::warn!(entity_type = %type_name, shard, error = %e, "cannot read the remembered entities of a shard; retrying");
                            tokio::time::sleep(retry).await;
                        }
                    }
                }
            }
        };
        let shards: Vec<String> = stream::iter(names)
            .map(read)
            .buffer_unordered(16)
            .filter_map(|s| async move { s })
            .collect()
            .await;
        let _ = me.cast(CoordinatorMsg::Local(CoordinatorLocal::RememberedShards(
            shards,
        )));
    });
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tenure_lease::{AcquireOutcome, AcquireRequest, MemoryStore, RememberedIds};
    use tenure_test_kit::eventually_async;
    use tokio::sync::mpsc;

    use super::*;
    use crate::allocation::LeastShards;
    use crate::messages::{HostShard, RegisterChanges, ShardHome};
    use crate::region::region_group;
    use crate::test_regions::RegionDouble;

    /// What a region double heard from the coordinator, in one message.
    #[derive(Debug, Clone, PartialEq)]
    enum Heard {
        /// Shards, each with the home it was given (`Some(itself)`: host it).
        Homes(Vec<(String, Option<String>)>),
        /// Register every shard.
        RegisterAll,
        /// The hand-offs of a rebalance round begin.
        BeginHandOffs(Vec<String>),
        /// Hand this shard off.
        HandOff(String),
        Other,
    }

    /// A region double's address and what it heard.
    type Told = (String, Heard);

    /// A region double at `addr` that reports every message of the coordinator, answers
    /// the coordinator's calls (a hand-off releases its lease), and answers `Vacate` (a
    /// barrier: everything sent to it before has been reported).
    fn counting(addr: &str, told: mpsc::UnboundedSender<Told>) -> RegionDouble<Told> {
        let addr = addr.to_string();
        RegionDouble::new(told, move |msg| {
            let heard = match msg {
                RegionMsg::Host(HostShard { shard, .. }) => {
                    Heard::Homes(vec![(shard, Some(addr.clone()))])
                }
                RegionMsg::Home(ShardHome { shard, home, .. }) => Heard::Homes(vec![(shard, home)]),
                RegionMsg::Homes(ShardHomes { host, homes, .. }) => Heard::Homes(
                    host.into_iter()
                        .map(|shard| (shard, Some(addr.clone())))
                        .chain(homes)
                        .collect(),
                ),
                RegionMsg::RegisterAll(_) => Heard::RegisterAll,
                RegionMsg::BeginHandOffShards(BeginHandOffs { shards, .. }, reply) => {
                    let _ = reply.send(crate::messages::HandOffsBegun {
                        region: addr.clone(),
                    });
                    Heard::BeginHandOffs(shards)
                }
                RegionMsg::HandOffShard(HandOff { shard, .. }, reply) => {
                    let _ = reply.send(crate::messages::HandOffDone {
                        shard: shard.clone(),
                        released: true,
                    });
                    Heard::HandOff(shard)
                }
                RegionMsg::Vacate(_, reply) => {
                    let _ = reply.send(crate::messages::Vacated {
                        region: addr.clone(),
                    });
                    return None;
                }
                _ => Heard::Other,
            };
            Some((addr.clone(), heard))
        })
    }

    fn member(addr: &str) -> Member {
        Member {
            addr: tenure_cluster::NodeAddr::parse("member", addr).unwrap(),
            incarnation: tenure_cluster::Incarnation(1),
            age: 1,
            status: MemberStatus::Up,
            reachable: true,
            roles: Vec::new(),
            app_version: Default::default(),
        }
    }

    /// The coordinator's lease in the fixtures' store.
    const COORDINATOR_LEASE: &str = "test-singleton-sharding-probe-coordinator";

    /// A new grant of the coordinator's lease in `store` (the previous holder's released),
    /// as a coordinator taking over gets it.
    async fn coordinator_grant(store: &MemoryStore, owner: &str) -> FencingToken {
        if let Some(held) = store.read(COORDINATOR_LEASE).await.unwrap() {
            assert!(
                store
                    .release(COORDINATOR_LEASE, &held.owner, held.token)
                    .await
                    .unwrap()
            );
        }
        let outcome = store
            .try_acquire(&AcquireRequest {
                name: COORDINATOR_LEASE.into(),
                owner: owner.into(),
                instance: format!("coordinator-{}", rand_instance()),
                ttl: Duration::from_secs(3600),
                ..AcquireRequest::default()
            })
            .await
            .unwrap();
        let AcquireOutcome::Granted(record) = outcome else {
            panic!("the coordinator's lease is free: {outcome:?}");
        };
        record.token
    }

    /// A distinct holder instance per grant.
    fn rand_instance() -> u64 {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// The node a fixture's coordinator runs on, as the coordinator sees it: a first view
    /// of the members that holds this node's member alone, up; every other change of the
    /// members is one the test sends the coordinator itself.
    struct ThisNode(Member);

    impl ClusterEvents for ThisNode {
        fn subscribe(&self, subscriber: ClusterSubscriber) -> Result<(), ClusterError> {
            subscriber.deliver(ClusterEvent::CurrentMembers(vec![self.0.clone()]));
            Ok(())
        }
    }

    /// The address of the fixtures' own node (the other members' are `127.0.0.1:2` and
    /// up, and a pin test names `127.0.0.1:1` as a node that is no member).
    const ME: &str = "127.0.0.1:100";

    /// A coordinator of type `probe` (holding a grant of its lease in a memory store of its
    /// own) on a node double ([`ThisNode`]), and region doubles on this node and on
    /// `others` fake members up, every one registered and available, with `sharding`
    /// added to the `[sharding]` section.
    struct Fixture {
        store: MemoryStore,
        args: CoordinatorArgs,
        scope: String,
        coordinator: ActorRef<CoordinatorMsg>,
        regions: Vec<ActorRef<RegionMsg>>,
        addrs: Vec<String>,
        told: mpsc::UnboundedSender<Told>,
        heard: mpsc::UnboundedReceiver<Told>,
    }

    impl Fixture {
        async fn start(scope: &str, others: usize, sharding: &str) -> Fixture {
            Fixture::start_with(scope, others, sharding, None).await
        }

        /// As `start`, for a sharded daemon's type of `daemon` workers when `Some`.
        async fn start_with(
            scope: &str,
            others: usize,
            sharding: &str,
            daemon: Option<usize>,
        ) -> Fixture {
            // The lease section a node of the test kit runs with (the sharding settings
            // are checked against it).
            let toml = format!(
                "[tenure]\ndefault-lease-section = \"memory\"\n\
                 [lease.memory]\nheartbeat-timeout = \"3s\"\nheartbeat-interval = \"500ms\"\n\
                 [sharding]\n{sharding}\n"
            );
            let config = tenure_lease::TenureConfig::from_toml_str(&toml, "test").unwrap();
            let (told, heard) = mpsc::unbounded_channel();
            let settings = ShardingSettings::from_config(&config, "probe", "memory").unwrap();
            let store = MemoryStore::new();
            let args = CoordinatorArgs {
                type_name: "probe".into(),
                scope: scope.into(),
                strategy: Arc::new(LeastShards::from_settings(&settings)),
                settings: Arc::new(settings),
                subscriptions: Arc::new(ThisNode(member(ME))),
                token: coordinator_grant(&store, ME).await,
                store: Arc::new(store.clone()),
                system: "test".into(),
                list_timeout: Duration::from_secs(1),
                lease: CoordinatorLease {
                    store: Arc::new(store.clone()),
                    name: COORDINATOR_LEASE.into(),
                    owner: ME.into(),
                },
                daemon,
            };
            let (coordinator, _) = Actor::spawn(None, Coordinator, args.clone()).await.unwrap();
            let mut f = Fixture {
                store,
                args,
                scope: scope.to_string(),
                coordinator,
                regions: Vec::new(),
                addrs: Vec::new(),
                told,
                heard,
            };
            // This node's member first (the coordinator's first view of the members comes
            // from its node), then the others.
            f.add_region(ME).await;
            f.wait_allocatable(1).await;
            for i in 0..others {
                f.add_region(&format!("127.0.0.1:{}", i + 2)).await;
            }
            f.wait_allocatable(f.addrs.len()).await;
            f.wait_rebuilt().await;
            f.told().await;
            f
        }

        /// Waits until the coordinator has rebuilt its state from the store (listed the
        /// shard leases and read its pins), as one elected in a cluster has long before
        /// the first message of a test: an unpin is refused until the pins are read, and
        /// they are read with the listing. The probe names no shard, so it changes nothing.
        async fn wait_rebuilt(&self) {
            eventually_async(
                "the coordinator to read its state from the store",
                Duration::from_secs(12),
                async || {
                    ractor::call!(self.coordinator, |r| CoordinatorMsg::PinShard(
                        PinShard {
                            shard: "no-shard".into(),
                            to: None,
                        },
                        r
                    ))
                    .unwrap()
                    .result
                },
            )
            .await;
        }

        /// A region double at `addr`, registered and available, its member up.
        async fn add_region(&mut self, addr: &str) {
            let (actor, _) = Actor::spawn(None, counting(addr, self.told.clone()), ())
                .await
                .unwrap();
            ractor::pg::join_scoped(
                self.scope.clone(),
                region_group("probe", addr),
                vec![actor.get_cell()],
            );
            self.regions.push(actor);
            self.addrs.push(addr.to_string());
            self.register(addr, &[]);
            if addr != ME {
                self.coordinator
                    .cast(CoordinatorMsg::Local(CoordinatorLocal::Cluster(
                        ClusterEvent::MemberUp(member(addr)),
                    )))
                    .unwrap();
            }
        }

        /// Shards per region in the coordinator's allocation.
        async fn counts(&self) -> BTreeMap<String, usize> {
            let mut counts: BTreeMap<String, usize> =
                self.addrs.iter().map(|a| (a.clone(), 0)).collect();
            for (_, home) in self.allocation().await.homes {
                *counts.entry(home).or_default() += 1;
            }
            counts
        }

        fn register(&self, addr: &str, shards: &[&str]) {
            self.coordinator
                .cast(CoordinatorMsg::RegisterRegion(Register {
                    region: addr.to_string(),
                    shards: shards.iter().map(|s| s.to_string()).collect(),
                    available: true,
                }))
                .unwrap();
        }

        async fn allocation(&self) -> Allocation {
            ractor::call!(self.coordinator, |r| CoordinatorMsg::GetAllocation(
                crate::messages::AllocationRequest {},
                r
            ))
            .unwrap()
        }

        /// Waits until `n` regions may be given shards.
        async fn wait_allocatable(&self, n: usize) {
            let what = format!("{n} regions to be allocatable");
            eventually_async(&what, Duration::from_secs(30), async || {
                let regions = self.allocation().await.regions;
                (regions.len() >= n).then_some(()).ok_or(regions)
            })
            .await
        }

        /// Every message the regions were told so far: the coordinator has handled what
        /// was sent to it before (two calls: a flush it sent itself comes after the first),
        /// and each region has handled what the coordinator sent it.
        async fn told(&mut self) -> Vec<Told> {
            self.allocation().await;
            self.allocation().await;
            for (region, addr) in self.regions.iter().zip(&self.addrs) {
                ractor::call!(region, |r| RegionMsg::Vacate(
                    crate::messages::Vacating { node: addr.clone() },
                    r
                ))
                .unwrap();
            }
            let mut told = Vec::new();
            while let Ok(t) = self.heard.try_recv() {
                told.push(t);
            }
            told
        }

        /// A coordinator fail-over: this one stops, and a new one starts under a new grant
        /// of the coordinator's lease; every region double's member is up again and
        /// registers with the shards `hosted` gives it (none for those it does not name).
        /// Returns what the regions were told meanwhile.
        async fn fail_over(&mut self, hosted: &[(&str, &[&str])]) -> Vec<Told> {
            self.coordinator.stop_and_wait(None, None).await.unwrap();
            let owner = self.args.lease.owner.clone();
            self.args.token = coordinator_grant(&self.store, &owner).await;
            let (coordinator, _) = Actor::spawn(None, Coordinator, self.args.clone())
                .await
                .unwrap();
            self.coordinator = coordinator;
            // This node's member first, as in `start`.
            let mut addrs = self.addrs.clone();
            addrs.sort_by_key(|a| a != ME);
            for addr in addrs {
                self.register(&addr, &[]);
                if addr == ME {
                    self.wait_allocatable(1).await;
                } else {
                    self.coordinator
                        .cast(CoordinatorMsg::Local(CoordinatorLocal::Cluster(
                            ClusterEvent::MemberUp(member(&addr)),
                        )))
                        .unwrap();
                }
            }
            self.wait_allocatable(self.addrs.len()).await;
            self.wait_rebuilt().await;
            // Their shards once they are up: a region's report is its shards' home only
            // while the region may keep shards.
            for (addr, shards) in hosted {
                self.register(addr, shards);
            }
            self.told().await
        }

        async fn stop(self) {
            self.coordinator.stop(None);
            for r in self.regions {
                r.stop(None);
            }
        }
    }

    /// A burst of requests for the homes of many shards is one wave of allocations: each
    /// region is told the homes it learns (and the shards it is to host) in one message,
    /// so the coordinator sends O(regions) messages per wave, not O(regions x shards).
    // One thread: the 100 requests are all in the coordinator's mailbox before it handles
    // the first, as a burst from many regions would be.
    #[tokio::test(flavor = "current_thread")]
    async fn a_wave_of_allocations_tells_each_region_once() {
        let mut f = Fixture::start(
            "coordinator-wave-test",
            4,
            "retry-interval = \"1h\"\nrebalance-interval = \"1h\"",
        )
        .await;
        let asker = f.addrs[1].clone();
        let shards = 100;
        for shard in 0..shards {
            f.coordinator
                .cast(CoordinatorMsg::GetHome(GetShardHome {
                    shard: shard.to_string(),
                    region: asker.clone(),
                }))
                .unwrap();
        }
        let told = f.told().await;
        let homes = f.allocation().await.homes;
        assert_eq!(homes.len(), shards, "every shard asked for has a home");
        let mut per_region: BTreeMap<String, usize> = BTreeMap::new();
        let mut learnt: BTreeMap<String, BTreeMap<String, Option<String>>> = BTreeMap::new();
        for (region, heard) in &told {
            *per_region.entry(region.clone()).or_default() += 1;
            if let Heard::Homes(named) = heard {
                learnt
                    .entry(region.clone())
                    .or_default()
                    .extend(named.iter().cloned());
            }
        }
        assert_eq!(
            per_region,
            f.addrs.iter().map(|a| (a.clone(), 1)).collect(),
            "messages per region for one wave of {shards} allocations"
        );
        for (region, known) in &learnt {
            let expected: BTreeMap<String, Option<String>> = homes
                .iter()
                .map(|(s, h)| (s.clone(), Some(h.clone())))
                .collect();
            assert_eq!(known, &expected, "what {region} learnt of the homes");
        }
        f.stop().await;
    }

    /// A shard allocated on request of one region: the host, the asker and every other
    /// registered region learn its home, and so does a region that registers later, so
    /// that any of them can ask its next home when the host goes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_registered_region_learns_the_home_of_an_allocated_shard() {
        let scope = "coordinator-homes-test";
        let mut f = Fixture::start(scope, 2, "").await;
        let asker = f.addrs[1].clone();
        f.coordinator
            .cast(CoordinatorMsg::GetHome(GetShardHome {
                shard: "5".into(),
                region: asker.clone(),
            }))
            .unwrap();
        let told = f.told().await;
        let home = f.allocation().await.homes;
        let [(shard, home)] = &home[..] else {
            panic!("one shard allocated: {home:?}");
        };
        let named = Heard::Homes(vec![(shard.clone(), Some(home.clone()))]);
        let learnt: BTreeSet<String> = told
            .iter()
            .filter(|(_, heard)| *heard == named)
            .map(|(region, _)| region.clone())
            .collect();
        assert_eq!(
            learnt,
            f.addrs.iter().cloned().collect(),
            "the regions that learnt the home of shard 5"
        );
        // A region registering later learns it as it registers.
        let late = "127.0.0.1:9".to_string();
        let (tx, mut heard) = mpsc::unbounded_channel();
        let (actor, _) = Actor::spawn(None, counting(&late, tx), ()).await.unwrap();
        ractor::pg::join_scoped(
            scope.to_string(),
            region_group("probe", &late),
            vec![actor.get_cell()],
        );
        f.register(&late, &[]);
        f.told().await;
        ractor::call!(actor, |r| RegionMsg::Vacate(
            crate::messages::Vacating { node: late.clone() },
            r
        ))
        .unwrap();
        assert_eq!(
            heard.try_recv().ok(),
            Some((late, named)),
            "what a region registering later was told"
        );
        actor.stop(None);
        f.stop().await;
    }

    /// A registration's changes apply onto the registration they name as their base; a
    /// retry with nothing changed costs the coordinator nothing and sends no region
    /// anything; changes onto a registration the coordinator does not have (a lost one, one
    /// sent to an earlier coordinator) get the region asked for every shard.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn registration_changes_apply_onto_their_base_and_others_ask_for_every_shard() {
        let mut f = Fixture::start(
            "coordinator-register-changes",
            1,
            "retry-interval = \"1h\"\nrebalance-interval = \"1h\"",
        )
        .await;
        let a = f.addrs[1].clone();
        let changes = |seq: u64, base: Option<u64>, added: &[&str], removed: &[&str]| {
            CoordinatorMsg::RegisterChanges(RegisterChanges {
                region: a.clone(),
                seq,
                base,
                added: added.iter().map(|s| s.to_string()).collect(),
                removed: removed.iter().map(|s| s.to_string()).collect(),
                available: true,
            })
        };
        let homes = async |f: &Fixture| -> Vec<(String, String)> { f.allocation().await.homes };
        let on_a = |shards: &[&str]| -> Vec<(String, String)> {
            shards.iter().map(|s| (s.to_string(), a.clone())).collect()
        };
        // Every shard once: the coordinator learns their homes from it.
        f.coordinator
            .cast(changes(1, None, &["1", "2", "3"], &[]))
            .unwrap();
        assert_eq!(homes(&f).await, on_a(&["1", "2", "3"]));
        // Changes onto registration 1 (shard 3 keeps its home there: it is hosted again).
        f.coordinator
            .cast(changes(2, Some(1), &["4"], &["3"]))
            .unwrap();
        assert_eq!(homes(&f).await, on_a(&["1", "2", "3", "4"]));
        for seq in 3..8 {
            f.coordinator
                .cast(changes(seq, Some(seq - 1), &[], &[]))
                .unwrap();
        }
        assert_eq!(f.told().await, [], "told for retries with nothing changed");
        // Onto a registration the coordinator does not have: nothing applied, all asked for.
        f.coordinator
            .cast(changes(9, Some(5), &["5"], &[]))
            .unwrap();
        assert_eq!(f.told().await, [(a.clone(), Heard::RegisterAll)]);
        assert_eq!(homes(&f).await, on_a(&["1", "2", "3", "4"]));
        f.coordinator
            .cast(changes(10, None, &["1", "2", "4", "5"], &[]))
            .unwrap();
        assert_eq!(homes(&f).await, on_a(&["1", "2", "3", "4", "5"]));
        f.coordinator
            .cast(changes(11, Some(10), &[], &["5"]))
            .unwrap();
        assert_eq!(f.told().await, [], "a base it has again");
        f.stop().await;
    }

    /// 3 regions join 6 that host 600 shards: one rebalance tick starts a round of the
    /// reference's limits (a tenth of the shards), and each round that ends unbalanced is
    /// followed by the next at once, with no tick: 4 rounds (60, 60, 60, 18) leave 66 or
    /// 67 shards on every region. Each region hears of each round in one message, and each
    /// moved shard's old home is asked once to hand it off.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn three_regions_joining_six_get_their_share_in_rounds_chained_without_ticks() {
        let mut f = Fixture::start(
            "coordinator-rebalance-rounds",
            5,
            "retry-interval = \"1h\"\nrebalance-interval = \"1h\"",
        )
        .await;
        let asker = f.addrs[0].clone();
        for shard in 0..600 {
            f.coordinator
                .cast(CoordinatorMsg::GetHome(GetShardHome {
                    shard: shard.to_string(),
                    region: asker.clone(),
                }))
                .unwrap();
        }
        f.told().await;
        let old: Vec<String> = f.addrs.clone();
        assert!(f.counts().await.values().all(|n| *n == 100));
        for i in 0..3 {
            f.add_region(&format!("127.0.0.1:{}", 20 + i)).await;
        }
        f.wait_allocatable(9).await;
        f.told().await;
        // One rebalance tick, repeated only until its round has begun.
        let mut begun = false;
        eventually_async(
            "every region to hold 66 or 67 shards",
            Duration::from_secs(30),
            async || {
                if !begun {
                    f.coordinator
                        .cast(CoordinatorMsg::Local(CoordinatorLocal::Rebalance))
                        .unwrap();
                    begun = f.allocation().await.homes.len() < 600;
                }
                let counts = f.counts().await;
                counts
                    .values()
                    .all(|n| *n == 66 || *n == 67)
                    .then_some(())
                    .ok_or(counts)
            },
        )
        .await;
        let told = f.told().await;
        let mut rounds: BTreeMap<&str, Vec<Vec<String>>> = BTreeMap::new();
        let mut hand_offs: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
        for (region, heard) in &told {
            match heard {
                Heard::BeginHandOffs(shards) => {
                    rounds.entry(region).or_default().push(shards.clone())
                }
                Heard::HandOff(shard) => {
                    assert!(
                        hand_offs.entry(region).or_default().insert(shard.clone()),
                        "{region} asked twice to hand off {shard}"
                    );
                }
                _ => {}
            }
        }
        let first = &rounds[asker.as_str()];
        let sizes: Vec<usize> = first.iter().map(Vec::len).collect();
        assert_eq!(sizes, [60, 60, 60, 18], "the rounds");
        assert_eq!(rounds.len(), 9, "regions told of the rounds");
        assert!(
            rounds.values().all(|r| r == first),
            "every region told of every round once"
        );
        let moved: BTreeSet<String> = first.iter().flatten().cloned().collect();
        assert_eq!(moved.len(), 198, "no shard moved twice");
        assert!(
            hand_offs.keys().all(|r| old.iter().any(|o| o == r)),
            "{hand_offs:?}"
        );
        assert_eq!(
            hand_offs
                .values()
                .flatten()
                .cloned()
                .collect::<BTreeSet<_>>(),
            moved,
            "each moved shard's old home asked once to hand it off"
        );
        f.stop().await;
    }

    /// A pinned shard moves to its region through a hand-off; while that region is gone
    /// the strategy places it elsewhere, and once it is back a rebalance returns the shard
    /// to it (and leaves it there). A pin to a region that cannot take shards is refused,
    /// naming the shard and the region.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pinned_shard_moves_to_its_region_and_comes_back_after_it_was_gone() {
        let mut f = Fixture::start(
            "coordinator-pin-test",
            2,
            "retry-interval = \"1h\"\nrebalance-interval = \"1h\"",
        )
        .await;
        let pin = async |f: &Fixture, shard: &str, to: &str| -> Result<bool, String> {
            ractor::call!(f.coordinator, |r| CoordinatorMsg::PinShard(
                PinShard {
                    shard: shard.into(),
                    to: Some(to.into()),
                },
                r
            ))
            .unwrap()
            .result
        };
        let home = async |f: &Fixture, shard: &str| -> Option<String> {
            f.allocation()
                .await
                .homes
                .into_iter()
                .find(|(s, _)| s == shard)
                .map(|(_, h)| h)
        };
        let until_home = async |f: &Fixture, shard: &str, want: &str| {
            let what = format!("shard {shard} to live on {want}");
            eventually_async(&what, Duration::from_secs(12), async || {
                let allocation = f.allocation().await;
                let home = allocation.homes.iter().find(|(s, _)| s == shard);
                home.filter(|(_, h)| h == want)
                    .map(|_| ())
                    .ok_or(allocation)
            })
            .await
        };
        f.coordinator
            .cast(CoordinatorMsg::GetHome(GetShardHome {
                shard: "5".into(),
                region: f.addrs[0].clone(),
            }))
            .unwrap();
        let first = eventually_async(
            "shard 5 to have a home",
            Duration::from_secs(12),
            async || home(&f, "5").await.ok_or("no home"),
        )
        .await;
        let target = f.addrs.iter().find(|a| **a != first).unwrap().clone();
        let refused = pin(&f, "5", "127.0.0.1:1").await.unwrap_err();
        assert!(
            refused.contains("shard 5") && refused.contains("127.0.0.1:1"),
            "{refused}"
        );
        assert_eq!(pin(&f, "5", &target).await, Ok(true));
        until_home(&f, "5", &target).await;
        let told = f.told().await;
        assert!(
            told.contains(&(first.clone(), Heard::HandOff("5".into()))),
            "the old home handed shard 5 off: {told:?}"
        );
        assert_eq!(pin(&f, "5", &target).await, Ok(false), "it lives there");
        // Its region goes: the strategy places it elsewhere.
        f.coordinator
            .cast(CoordinatorMsg::Local(CoordinatorLocal::Cluster(
                ClusterEvent::MemberRemoved(member(&target)),
            )))
            .unwrap();
        eventually_async(
            "shard 5 to live elsewhere than its pin's region",
            Duration::from_secs(12),
            async || match home(&f, "5").await {
                Some(h) if h != target => Ok(()),
                last => Err(last),
            },
        )
        .await;
        // It comes back: the next rebalance returns the shard to it.
        f.coordinator
            .cast(CoordinatorMsg::Local(CoordinatorLocal::Cluster(
                ClusterEvent::MemberUp(member(&target)),
            )))
            .unwrap();
        f.register(&target, &[]);
        f.wait_allocatable(3).await;
        f.coordinator
            .cast(CoordinatorMsg::Local(CoordinatorLocal::Rebalance))
            .unwrap();
        until_home(&f, "5", &target).await;
        // Rebalances leave it there.
        for _ in 0..3 {
            f.coordinator
                .cast(CoordinatorMsg::Local(CoordinatorLocal::Rebalance))
                .unwrap();
        }
        f.told().await;
        assert_eq!(home(&f, "5").await.as_deref(), Some(target.as_str()));
        f.stop().await;
    }

    /// Pins outlive their coordinator: pinned shards stay on their region through a
    /// fail-over, a new coordinator's rebalances leave them there, and one of them that
    /// needs a home again goes back to its pin, not where the strategy would put it. An
    /// unpin removes the pin from the store; a coordinator whose grant is not current any
    /// more cannot store a pin, and says so.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pins_survive_a_coordinator_fail_over() {
        let mut f = Fixture::start(
            "coordinator-pin-fail-over",
            2,
            "retry-interval = \"1h\"\nrebalance-interval = \"1h\"",
        )
        .await;
        let target = f.addrs[2].clone();
        let place = async |f: &Fixture, shard: &str, to: Option<&str>| -> Result<bool, String> {
            ractor::call!(f.coordinator, |r| CoordinatorMsg::PinShard(
                PinShard {
                    shard: shard.into(),
                    to: to.map(str::to_string),
                },
                r
            ))
            .unwrap()
            .result
        };
        let homes = async |f: &Fixture| -> BTreeMap<String, String> {
            f.allocation().await.homes.into_iter().collect()
        };
        // Four shards pinned to the target (each allocated there at once), two more
        // allocated by the strategy elsewhere.
        for shard in ["0", "1", "2", "3"] {
            assert_eq!(
                place(&f, shard, Some(&target)).await,
                Ok(true),
                "pin {shard}"
            );
        }
        for shard in ["4", "5"] {
            f.coordinator
                .cast(CoordinatorMsg::GetHome(GetShardHome {
                    shard: shard.into(),
                    region: f.addrs[0].clone(),
                }))
                .unwrap();
        }
        f.told().await;
        let before = homes(&f).await;
        assert_eq!(before.len(), 6, "{before:?}");
        assert!(
            ["4", "5"].iter().all(|s| before[*s] != target),
            "{before:?}"
        );

        // The coordinator fails over; the target's region lost shard 3 meanwhile.
        let on = |region: &str| -> Vec<&str> {
            before
                .iter()
                .filter(|(s, r)| *r == region && *s != "3")
                .map(|(s, _)| s.as_str())
                .collect()
        };
        let hosted: Vec<(String, Vec<&str>)> = f.addrs.iter().map(|a| (a.clone(), on(a))).collect();
        let hosted: Vec<(&str, &[&str])> = hosted
            .iter()
            .map(|(a, s)| (a.as_str(), s.as_slice()))
            .collect();
        f.fail_over(&hosted).await;

        // Shard 3 needs a home: the least loaded regions are the others, the pin says the
        // target.
        f.coordinator
            .cast(CoordinatorMsg::GetHome(GetShardHome {
                shard: "3".into(),
                region: f.addrs[0].clone(),
            }))
            .unwrap();
        f.told().await;
        assert_eq!(
            homes(&f).await.get("3"),
            Some(&target),
            "shard 3 reallocated"
        );

        // The target holds 4 shards, the others 1 each: the strategy would move some.
        for _ in 0..3 {
            f.coordinator
                .cast(CoordinatorMsg::Local(CoordinatorLocal::Rebalance))
                .unwrap();
        }
        let told = f.told().await;
        assert!(
            !told.iter().any(|(_, h)| matches!(h, Heard::HandOff(_))),
            "a rebalance moved a shard: {told:?}"
        );
        let after = homes(&f).await;
        for shard in ["0", "1", "2", "3"] {
            assert_eq!(after.get(shard), Some(&target), "shard {shard}: {after:?}");
        }

        // An unpin leaves the store too.
        assert_eq!(place(&f, "0", None).await, Ok(false));
        let stored =
            crate::placement::pins_of(&f.store.remembered(COORDINATOR_LEASE).await.unwrap());
        assert_eq!(
            stored.keys().map(String::as_str).collect::<Vec<_>>(),
            ["1", "2", "3"],
            "pins in the store"
        );

        // A coordinator that lost its grant cannot store a pin.
        let held = f.store.read(COORDINATOR_LEASE).await.unwrap().unwrap();
        assert!(
            f.store
                .release(COORDINATOR_LEASE, &held.owner, held.token)
                .await
                .unwrap()
        );
        let refused = place(&f, "4", Some(&target)).await.unwrap_err();
        assert!(
            refused.contains("shard 4") && refused.contains(COORDINATOR_LEASE),
            "{refused}"
        );
        f.stop().await;
    }

    /// A coordinator that takes over a daemon's resize in progress (its predecessor stored
    /// the new count as stopping, then failed) stops every worker whose shard lease it
    /// finds held, then
    /// stores the count as running and answers it; until then it allocates nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_resize_in_progress_is_finished_by_the_next_coordinator() {
        let mut f = Fixture::start_with(
            "coordinator-resize-fail-over",
            1,
            "retry-interval = \"1h\"\nrebalance-interval = \"1h\"",
            Some(3),
        )
        .await;
        let count = async |f: &Fixture| -> Option<DaemonCount> {
            ractor::call!(f.coordinator, |r| CoordinatorMsg::GetDaemonCount(
                crate::messages::DaemonCountRequest {},
                r
            ))
            .unwrap()
            .count
        };
        assert_eq!(
            count(&f).await,
            Some(DaemonCount {
                revision: 0,
                count: 3,
                stopping: false
            })
        );
        // The resize to 5 began under this coordinator's grant; it fails before stopping
        // the workers, which run on.
        let stopping = DaemonCount {
            revision: 1,
            count: 5,
            stopping: true,
        };
        assert!(
            f.store
                .remember(
                    COORDINATOR_LEASE,
                    &f.args.lease.owner,
                    f.args.token,
                    &crate::placement::recount(None, &stopping),
                )
                .await
                .unwrap()
        );
        let (a, b) = (f.addrs[0].clone(), f.addrs[1].clone());
        // The workers' shard leases, as their regions hold them.
        for (shard, holder) in [("0", &a), ("1", &b), ("2", &a)] {
            let granted = f
                .store
                .try_acquire(&AcquireRequest {
                    name: tenure_lease::names::shard_lease("test", "probe", shard),
                    owner: holder.clone(),
                    instance: "region".into(),
                    ttl: Duration::from_secs(3600),
                    ..AcquireRequest::default()
                })
                .await
                .unwrap();
            assert!(matches!(granted, AcquireOutcome::Granted(_)));
        }
        // No registration names a shard yet: the shard leases are all the new coordinator
        // knows of the workers.
        let mut told = f.fail_over(&[]).await;
        let running = DaemonCount {
            stopping: false,
            ..stopping
        };
        eventually_async(
            "the daemon to run 5 workers",
            Duration::from_secs(12),
            async || match count(&f).await {
                Some(c) if c == running => Ok(()),
                last => Err(last),
            },
        )
        .await;
        told.extend(f.told().await);
        let mut stopped: Vec<String> = told
            .iter()
            .filter_map(|(_, h)| match h {
                Heard::HandOff(shard) => Some(shard.clone()),
                _ => None,
            })
            .collect();
        stopped.sort();
        assert_eq!(stopped, ["0", "1", "2"], "{told:?}");
        assert_eq!(count(&f).await, Some(running));
        // Stored by the coordinator's writer, which answers no one: once it has written.
        eventually_async(
            "the daemon's count stored as running",
            Duration::from_secs(12),
            async || {
                let stored = f.store.remembered(COORDINATOR_LEASE).await.unwrap();
                match crate::placement::count_of(&stored) {
                    Some(c) if c == running => Ok(()),
                    _ => Err(stored),
                }
            },
        )
        .await;
        // Resized: 0 and above number-of-shards are refused, naming the daemon and count.
        for bad in [0, 101] {
            let refused = ractor::call!(f.coordinator, |r| CoordinatorMsg::ResizeDaemon(
                ResizeDaemon { count: bad },
                r
            ))
            .unwrap()
            .result
            .unwrap_err();
            assert!(
                refused.contains("`probe`") && refused.contains(&format!("{bad} workers")),
                "{refused}"
            );
        }
        f.stop().await;
    }
}
