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
//! With remember-entities, the coordinator also reads at start which shards have
//! remembered entities (the ids kept with each shard lease in the store) and allocates
//! those shards, and every shard it ever allocated, without waiting for a message: a
//! shard's entities come back even when its node and the coordinator died together and its
//! lease lapsed before the new coordinator listed it. It waits for the regions of the
//! members up to register first (at most `rebalance-interval`), so that those shards are
//! spread over them.
//!
//! A rebalance moves a shard in Akka's steps: every region is told first (BeginHandOff:
//! it forgets the shard's home and keeps its messages), then the old host hands it off
//! (stops it, releases its lease, gives back what it had not delivered), then the new host
//! is told to host it, and every region that asked meanwhile learns the new home.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tenure_cluster::{
    ClusterEvent, ClusterSubscriber, History, Member, MemberStatus, Subscriptions,
};
use tenure_lease::history::Event;
use tenure_lease::{FencingToken, LeaseStore};
use tokio::time::Instant;

use crate::allocation::{AllocationStrategy, Regions};
use crate::messages::{
    Allocation, BeginHandOff, CoordinatorLocal, CoordinatorMsg, GetShardHome, HandOff, HostShard,
    RegionMsg, Register, ShardHome,
};
use crate::region::region_ref;
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
    /// Cluster events of the node it runs on.
    pub subscriptions: Subscriptions,
    /// Where moves are recorded (`shard_moving`, `shard_moved`), when the node keeps a
    /// history.
    pub history: Option<History>,
    /// The fencing token of the coordinator's singleton lease grant (0 outside a cluster).
    pub token: FencingToken,
    /// The shard leases' store and `[tenure] system`, to list who holds each shard.
    pub store: Arc<dyn LeaseStore>,
    /// The `[tenure] system` name (prefix of the shard lease names).
    pub system: String,
    /// Bound on the listing (the lease section's `lease-operation-timeout`).
    pub list_timeout: std::time::Duration,
}

/// The coordinator actor (the singleton instance).
pub struct Coordinator;

struct RegionEntry {
    available: bool,
}

/// A shard moving for a rebalance.
struct Move {
    from: String,
    to: String,
    /// Regions that asked for the shard's home meanwhile: told once it has one.
    waiting: BTreeSet<String>,
}

pub struct CoordinatorState {
    args: CoordinatorArgs,
    myself: ActorRef<CoordinatorMsg>,
    members: BTreeMap<String, Member>,
    unreachable_since: HashMap<String, Instant>,
    regions: BTreeMap<String, RegionEntry>,
    /// Shard → region (`host:port`) it is allocated to.
    homes: BTreeMap<String, String>,
    /// When a Host was last sent for a shard.
    host_sent: HashMap<String, Instant>,
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
    /// When this coordinator started.
    started: Instant,
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
        Ok(CoordinatorState {
            args,
            myself,
            members: BTreeMap::new(),
            unreachable_since: HashMap::new(),
            regions: BTreeMap::new(),
            homes: BTreeMap::new(),
            host_sent: HashMap::new(),
            moving: BTreeMap::new(),
            askers: BTreeSet::new(),
            listed: false,
            list_attempts: 1,
            holders: BTreeSet::new(),
            deferred: Vec::new(),
            timers,
            remembered: BTreeSet::new(),
            started: Instant::now(),
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
            CoordinatorMsg::RegisterRegion(report) => state.on_register(report),
            CoordinatorMsg::GetHome(GetShardHome { shard, region }) => {
                if !state.regions.contains_key(&region) {
                    state.askers.insert(region.clone());
                }
                state.get_home(shard, region);
            }
            CoordinatorMsg::Local(CoordinatorLocal::Listed(result)) => state.on_listed(result),
            CoordinatorMsg::Local(CoordinatorLocal::RememberedShards(shards)) => {
                tracing::info!(entity_type = %state.args.type_name, shards = shards.len(), "shards with remembered entities read");
                state.remembered.extend(shards);
                state.reallocate_lost();
            }
            CoordinatorMsg::GetAllocation(_, reply) => {
                let regions = state.allocatable().into_iter().collect();
                let _ = reply.send(Allocation {
                    homes: state
                        .homes
                        .iter()
                        .map(|(s, r)| (s.clone(), r.clone()))
                        .collect(),
                    regions,
                });
            }
            CoordinatorMsg::Local(CoordinatorLocal::Cluster(event)) => state.on_cluster(event),
            CoordinatorMsg::Local(CoordinatorLocal::Tick) => state.reallocate_lost(),
            CoordinatorMsg::Local(CoordinatorLocal::Rebalance) => state.rebalance(),
            CoordinatorMsg::Local(CoordinatorLocal::HandOffEnded { shard, released }) => {
                if let Some(Move { from, to, waiting }) = state.moving.remove(&shard) {
                    tracing::info!(entity_type = %state.args.type_name, shard, from, to, released, "shard handed off for a rebalance");
                    if state.allocatable().contains(&to) {
                        state.host(&shard, &to);
                    }
                    // `to` may have gone meanwhile: then the shard is allocated anew.
                    let home = state.home_of(&shard);
                    state.record(|entity_type| Event::ShardMoved {
                        entity_type,
                        shard: shard.clone(),
                        from: from.clone(),
                        to: home.clone(),
                        released,
                    });
                    for region in waiting {
                        state.tell_home(&shard, home.clone(), &region);
                    }
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
                self.tell_home(&shard, home, &region);
            }
        }
    }

    /// The shard leases listed: each held shard's home is its holder's region.
    fn on_listed(&mut self, result: Result<Vec<(String, String)>, String>) {
        if self.listed {
            return;
        }
        match result {
            Ok(held) => {
                tracing::info!(entity_type = %self.args.type_name, held = held.len(), "allocation rebuilt from the shard leases");
                for (shard, holder) in held {
                    if !self.regions.contains_key(&holder) {
                        self.holders.insert(holder.clone());
                    }
                    self.homes.insert(shard, holder);
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
            }
        }
        self.listed = true;
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
            }
            ClusterEvent::Unreachable(m) => {
                self.unreachable_since
                    .entry(m.addr.to_string())
                    .or_insert_with(Instant::now);
                self.members.insert(m.addr.to_string(), m);
            }
            ClusterEvent::Reachable(m) => {
                self.unreachable_since.remove(&m.addr.to_string());
                self.members.insert(m.addr.to_string(), m);
            }
            ClusterEvent::MemberJoined(m)
            | ClusterEvent::MemberUp(m)
            | ClusterEvent::MemberLeaving(m) => {
                self.members.insert(m.addr.to_string(), m);
            }
            ClusterEvent::MemberDown(m) | ClusterEvent::MemberRemoved(m) => {
                let addr = m.addr.to_string();
                self.members.remove(&addr);
                self.regions.remove(&addr);
                self.askers.remove(&addr);
                self.unreachable_since.remove(&addr);
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

    /// Regions new shards may go to: alive and reachable now.
    fn allocatable(&self) -> BTreeSet<String> {
        self.regions
            .keys()
            .filter(|r| self.alive(r) && !self.unreachable_since.contains_key(*r))
            .cloned()
            .collect()
    }

    fn load(&self) -> Regions {
        let mut regions: Regions = self
            .allocatable()
            .into_iter()
            .map(|r| (r, Vec::new()))
            .collect();
        for (shard, region) in &self.homes {
            if let Some(shards) = regions.get_mut(region) {
                shards.push(shard.clone());
            }
        }
        regions
    }

    /// Where `shard` lives, allocating it if it has no home; `None` while it moves or
    /// when no region can take it.
    fn home_of(&mut self, shard: &str) -> Option<String> {
        if self.moving.contains_key(shard) {
            return None;
        }
        if let Some(home) = self.homes.get(shard)
            && self.alive(home)
        {
            return Some(home.clone());
        }
        let to = self.args.strategy.allocate(shard, &self.load())?;
        self.host(shard, &to);
        Some(to)
    }

    /// Tells `region` where `shard` lives (`None`: not known yet).
    fn tell_home(&self, shard: &str, home: Option<String>, region: &str) {
        if let Some(r) = region_ref(&self.args.scope, &self.args.type_name, region) {
            let _ = r.cast(RegionMsg::Home(ShardHome {
                shard: shard.to_string(),
                home,
                coordinator: self.args.token,
            }));
        }
    }

    /// Records the event `of` this coordinator's entity type.
    fn record(&self, of: impl FnOnce(String) -> Event) {
        if let Some(h) = &self.args.history {
            h.record(of(self.args.type_name.clone()));
        }
    }

    /// Records `region` as the home of `shard`, tells it to host the shard, and tells every
    /// other registered region where the shard lives (a region that registers later learns
    /// it then). Every region then knows every home, not only those it asked: when a node
    /// goes, the regions ask the next home of each of its shards at once (the region's
    /// orphans), so that even a coordinator that failed over with that node, and found the
    /// shard's lease lapsed, restarts the shard without waiting for a message to it.
    fn host(&mut self, shard: &str, region: &str) {
        tracing::debug!(entity_type = %self.args.type_name, shard, region, "shard allocated");
        if self.args.settings.remember_entities {
            self.remembered.insert(shard.to_string());
        }
        self.homes.insert(shard.to_string(), region.to_string());
        self.host_sent.insert(shard.to_string(), Instant::now());
        if let Some(r) = region_ref(&self.args.scope, &self.args.type_name, region) {
            let _ = r.cast(RegionMsg::Host(HostShard {
                shard: shard.to_string(),
                coordinator: self.args.token,
            }));
        }
        for other in self.regions.keys().filter(|r| *r != region) {
            self.tell_home(shard, Some(region.to_string()), other);
        }
    }

    fn on_register(&mut self, report: Register) {
        let region = report.region.clone();
        let reported: BTreeSet<String> = report.shards.into_iter().collect();
        let first = self
            .regions
            .insert(
                region.clone(),
                RegionEntry {
                    available: report.available,
                },
            )
            .is_none();
        if first {
            // A region new to this coordinator learns every home known so far, as if it
            // had been registered when each was allocated (see `host`); not those of
            // moving shards, whose messages must wait for the move to end.
            for (shard, home) in &self.homes {
                if *home != region && !self.moving.contains_key(shard) {
                    self.tell_home(shard, Some(home.clone()), &region);
                }
            }
        }
        self.askers.remove(&region);
        self.holders.remove(&region);
        for shard in &reported {
            if self.moving.contains_key(shard) {
                continue;
            }
            match self.homes.get(shard).cloned() {
                None if self.alive(&region) => {
                    // A new coordinator learns the allocation from the regions.
                    self.homes.insert(shard.clone(), region.clone());
                }
                Some(home) if home == region => {}
                _ => {
                    // Hosted (or being acquired) where it no longer belongs: stop it there;
                    // its lease then goes to the shard's home.
                    tracing::info!(entity_type = %self.args.type_name, shard, region, "telling a region to stop a shard allocated elsewhere");
                    self.stop_misplaced(shard, &region);
                }
            }
        }
        // Shards this region should host but does not (a lost Host, a restarted node).
        let resend = self.args.settings.retry_interval * 3;
        let missing: Vec<String> = self
            .homes
            .iter()
            .filter(|(s, r)| **r == region && !reported.contains(*s))
            .filter(|(s, _)| self.host_sent.get(*s).is_none_or(|t| t.elapsed() >= resend))
            .map(|(s, _)| s.clone())
            .collect();
        if self.alive(&region) {
            for shard in missing {
                self.host(&shard, &region);
            }
        }
        self.reallocate_lost();
    }

    /// Moves the shards of regions that are no longer alive to the least loaded ones; with
    /// remember-entities, allocates the remembered shards without a home.
    fn reallocate_lost(&mut self) {
        if !self.listed {
            return;
        }
        let lost: Vec<(String, String)> = self
            .homes
            .iter()
            .filter(|(_, r)| !self.alive(r))
            .map(|(s, r)| (s.clone(), r.clone()))
            .collect();
        for (shard, from) in lost {
            self.homes.remove(&shard);
            if let Some(to) = self.args.strategy.allocate(&shard, &self.load()) {
                tracing::info!(entity_type = %self.args.type_name, shard, from, to, "moving the shard of a lost region");
                self.host(&shard, &to);
            }
        }
        self.allocate_remembered();
    }

    /// remember-entities: gives every remembered shard without a home one, so that its
    /// entities start with no message; once the regions of the members up registered (or
    /// `rebalance-interval` after this coordinator started), so that they spread.
    fn allocate_remembered(&mut self) {
        let homeless: Vec<String> = self
            .remembered
            .iter()
            .filter(|s| !self.homes.contains_key(*s) && !self.moving.contains_key(*s))
            .cloned()
            .collect();
        if homeless.is_empty() || !self.regions_registered() {
            return;
        }
        for shard in homeless {
            match self.args.strategy.allocate(&shard, &self.load()) {
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
        let room = self
            .args
            .settings
            .max_simultaneous_rebalance
            .saturating_sub(self.moving.len());
        if !settled || room == 0 || !self.listed {
            return;
        }
        let in_progress: BTreeSet<String> = self.moving.keys().cloned().collect();
        for (shard, from, to) in self
            .args
            .strategy
            .rebalance(&self.load(), &in_progress, room)
        {
            tracing::debug!(entity_type = %self.args.type_name, shard, from, to, "rebalance: moving a shard");
            crate::metrics::rebalance_move(&self.args.type_name);
            self.record(|entity_type| Event::ShardMoving {
                entity_type,
                shard: shard.clone(),
                from: from.clone(),
                to: to.clone(),
            });
            self.homes.remove(&shard);
            self.moving.insert(
                shard.clone(),
                Move {
                    from: from.clone(),
                    to,
                    waiting: BTreeSet::new(),
                },
            );
            self.move_shard(&shard, &from);
        }
    }

    /// The steps of a rebalance after the decision: every region (registered, or one that
    /// asked for a home) is told that `shard`'s hand-off begins and answers (each waited
    /// for at most `hand-off-timeout`), so that none sends it to `from` any more; then
    /// `from` hands it off; then `HandOffEnded` comes back to this coordinator.
    fn move_shard(&self, shard: &str, from: &str) {
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
        let (shard, from) = (shard.to_string(), from.to_string());
        let (scope, type_name, me) = (scope.clone(), type_name.clone(), self.myself.clone());
        tokio::spawn(async move {
            let mut acks = tokio::task::JoinSet::new();
            for region in regions {
                let shard = shard.clone();
                acks.spawn(async move {
                    region
                        .call(
                            |port| {
                                RegionMsg::BeginHandOffShard(
                                    BeginHandOff {
                                        shard,
                                        coordinator: token,
                                    },
                                    port,
                                )
                            },
                            Some(timeout),
                        )
                        .await
                });
            }
            while acks.join_next().await.is_some() {}
            let released = hand_off_call(&scope, &type_name, &shard, &from, token, timeout).await;
            let _ = me.cast(CoordinatorMsg::Local(CoordinatorLocal::HandOffEnded {
                shard,
                released,
            }));
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

/// Lists the type's shard leases after `delay` and reports shard → holder
/// (`CoordinatorLocal::Listed`). A name the store changed (its naming rules) is skipped: its
/// shard is learnt from its region's report instead.
fn list_shard_leases(
    args: &CoordinatorArgs,
    me: &ActorRef<CoordinatorMsg>,
    delay: std::time::Duration,
) {
    let prefix = tenure_lease::names::shard_lease(&args.system, &args.type_name, "");
    let (store, timeout, me) = (args.store.clone(), args.list_timeout, me.clone());
    let (system, type_name) = (args.system.clone(), args.type_name.clone());
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let rules = store.name_rules();
        let listed = tenure_lease::store::bounded(&prefix, "list", timeout, store.list(&prefix))
            .await
            .map(|records| {
                records
                    .into_iter()
                    .filter_map(|r| {
                        let shard = r.name.strip_prefix(&prefix)?;
                        let name = tenure_lease::names::shard_lease(&system, &type_name, shard);
                        (tenure_lease::names::store_name(&name, &rules) == r.name)
                            .then(|| (shard.to_string(), r.owner))
                    })
                    .collect()
            })
            .map_err(|e| e.to_string());
        let _ = me.cast(CoordinatorMsg::Local(CoordinatorLocal::Listed(listed)));
    });
}

/// remember-entities: reads the ids remembered with every shard lease of the type and
/// reports the shards that have some (`CoordinatorLocal::RememberedShards`), trying a shard
/// again every `retry-interval` while the store fails.
fn read_remembered_shards(args: &CoordinatorArgs, me: &ActorRef<CoordinatorMsg>) {
    use futures::stream::{self, StreamExt};

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
                    let call = store.remembered(&name);
                    match tenure_lease::store::bounded(&name, "read remembered ids", timeout, call)
                        .await
                    {
                        Ok(ids) => return (!ids.is_empty()).then_some(shard),
                        Err(tenure_lease::LeaseError::Store {
                            source: e @ tenure_lease::StoreError::Unsupported { .. },
                            ..
                        }) => {
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

    use tenure_cluster::{ClusterSettings, Node};
    use tenure_lease::{LeaseProvider, MemoryStore, StoreRegistry, TenureConfig};
    use tokio::sync::mpsc;

    use super::*;
    use crate::allocation::LeastShards;
    use crate::region::region_group;
    use crate::test_regions::RegionDouble;

    /// A region that only reports the homes it is told: (its address, shard, home).
    fn homes_told(
        addr: &str,
        told: mpsc::UnboundedSender<(String, String, String)>,
    ) -> RegionDouble<(String, String, String)> {
        let addr = addr.to_string();
        RegionDouble::new(told, move |msg| match msg {
            RegionMsg::Host(HostShard { shard, .. }) => Some((addr.clone(), shard, addr.clone())),
            RegionMsg::Home(ShardHome { shard, home, .. }) => {
                home.map(|h| (addr.clone(), shard, h))
            }
            _ => None,
        })
    }

    /// What a region double was told: each shard named in one message, with the home it
    /// was given (`Some(itself)` for a shard it is to host).
    type Told = (String, Vec<(String, Option<String>)>);

    /// A region double at `addr` that reports every message of the coordinator (`Told`), and
    /// answers `Vacate` (a barrier: everything sent to it before has been reported).
    fn counting(addr: &str, told: mpsc::UnboundedSender<Told>) -> RegionDouble<Told> {
        let addr = addr.to_string();
        RegionDouble::new(told, move |msg| {
            let named = match msg {
                RegionMsg::Host(HostShard { shard, .. }) => vec![(shard, Some(addr.clone()))],
                RegionMsg::Home(ShardHome { shard, home, .. }) => vec![(shard, home)],
                RegionMsg::Vacate(_, reply) => {
                    let _ = reply.send(crate::messages::Vacated {
                        region: addr.clone(),
                    });
                    return None;
                }
                _ => Vec::new(),
            };
            Some((addr.clone(), named))
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
        }
    }

    /// A one-node cluster (memory store), a coordinator of type `probe` (token 1) and
    /// region doubles on this node and on `others` fake members up, every one registered
    /// and available, with `sharding` added to the `[sharding]` section.
    struct Fixture {
        node: Node,
        coordinator: ActorRef<CoordinatorMsg>,
        regions: Vec<ActorRef<RegionMsg>>,
        addrs: Vec<String>,
        heard: mpsc::UnboundedReceiver<Told>,
    }

    impl Fixture {
        async fn start(scope: &str, others: usize, sharding: &str) -> Fixture {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let config = TenureConfig::from_toml_str(
                &format!(
                    "[tenure]\ndefault-lease-section = \"memory\"\n\
                     [lease.memory]\nheartbeat-timeout = \"3s\"\nheartbeat-interval = \"500ms\"\n\
                     [cluster]\nport = {port}\ncookie = \"coordinator-test\"\n\
                     member-lease-ttl = \"3s\"\nmember-lease-interval = \"500ms\"\n\
                     [sharding]\n{sharding}\n"
                ),
                "test",
            )
            .unwrap();
            let registry = ["sqlite", "postgres", "etcd", "zookeeper"]
                .into_iter()
                .fold(StoreRegistry::new(), |r, kind| r.left_out(kind, kind));
            let provider = LeaseProvider::new(config.clone(), registry).unwrap();
            let node = Node::start(
                ClusterSettings::from_config(&config).unwrap(),
                &provider,
                None,
            )
            .await
            .unwrap();
            let (told, heard) = mpsc::unbounded_channel();
            let mut addrs = vec![node.addr().to_string()];
            addrs.extend((0..others).map(|i| format!("127.0.0.1:{}", i + 2)));
            let mut regions = Vec::new();
            for addr in &addrs {
                let (actor, _) = Actor::spawn(None, counting(addr, told.clone()), ())
                    .await
                    .unwrap();
                ractor::pg::join_scoped(
                    scope.to_string(),
                    region_group("probe", addr),
                    vec![actor.get_cell()],
                );
                regions.push(actor);
            }
            let settings = ShardingSettings::from_config(&config, "probe", "memory").unwrap();
            let args = CoordinatorArgs {
                type_name: "probe".into(),
                scope: scope.into(),
                strategy: Arc::new(LeastShards { threshold: 1 }),
                settings: Arc::new(settings),
                subscriptions: node.subscriptions(),
                history: None,
                token: FencingToken::new(1),
                store: Arc::new(MemoryStore::new()),
                system: "test".into(),
                list_timeout: Duration::from_secs(1),
            };
            let (coordinator, _) = Actor::spawn(None, Coordinator, args).await.unwrap();
            let mut f = Fixture {
                node,
                coordinator,
                regions,
                addrs,
                heard,
            };
            for addr in f.addrs.clone() {
                f.register(&addr, &[]);
            }
            // This node's member first (the coordinator's first view of the members comes
            // from its node), then the others.
            f.wait_allocatable(1).await;
            for addr in &f.addrs[1..] {
                f.coordinator
                    .cast(CoordinatorMsg::Local(CoordinatorLocal::Cluster(
                        ClusterEvent::MemberUp(member(addr)),
                    )))
                    .unwrap();
            }
            f.wait_allocatable(f.addrs.len()).await;
            f.told().await;
            f
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
            for _ in 0..600 {
                if self.allocation().await.regions.len() >= n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("fewer than {n} regions became allocatable");
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

        async fn stop(self) {
            self.coordinator.stop(None);
            for r in self.regions {
                r.stop(None);
            }
            self.node.leave().await.unwrap();
        }
    }

    /// A burst of requests for the homes of many shards is one wave of allocations: each
    /// region is told the homes it learns (and the shards it is to host) in one message,
    /// so the coordinator sends O(regions) messages per wave, not O(regions x shards).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
        for (region, named) in &told {
            *per_region.entry(region.clone()).or_default() += 1;
            learnt
                .entry(region.clone())
                .or_default()
                .extend(named.iter().cloned());
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
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = TenureConfig::from_toml_str(
            &format!(
                "[tenure]\ndefault-lease-section = \"memory\"\n\
                 [lease.memory]\nheartbeat-timeout = \"3s\"\nheartbeat-interval = \"500ms\"\n\
                 [cluster]\nport = {port}\ncookie = \"coordinator-test-0123456789abcdef\"\n\
                 member-lease-ttl = \"3s\"\nmember-lease-interval = \"500ms\"\n"
            ),
            "test",
        )
        .unwrap();
        let registry = ["sqlite", "postgres", "etcd", "zookeeper"]
            .into_iter()
            .fold(StoreRegistry::new(), |r, kind| r.left_out(kind, kind));
        let provider = LeaseProvider::new(config.clone(), registry).unwrap();
        let node = Node::start(
            ClusterSettings::from_config(&config).unwrap(),
            &provider,
            None,
        )
        .await
        .unwrap();
        let scope = "coordinator-homes-test";
        let (told, mut heard) = mpsc::unbounded_channel();
        let host = node.addr().to_string();
        let (asker, bystander) = ("127.0.0.1:2".to_string(), "127.0.0.1:3".to_string());
        let mut regions = Vec::new();
        for addr in [&host, &asker, &bystander] {
            let (actor, _) = Actor::spawn(None, homes_told(addr, told.clone()), ())
                .await
                .unwrap();
            ractor::pg::join_scoped(
                scope.to_string(),
                region_group("probe", addr),
                vec![actor.get_cell()],
            );
            regions.push(actor);
        }
        let settings = ShardingSettings::from_config(&config, "probe", "memory").unwrap();
        let args = CoordinatorArgs {
            type_name: "probe".into(),
            scope: scope.into(),
            settings: Arc::new(settings),
            strategy: Arc::new(LeastShards { threshold: 1 }),
            subscriptions: node.subscriptions(),
            history: None,
            token: FencingToken::new(1),
            store: Arc::new(MemoryStore::new()),
            system: "test".into(),
            list_timeout: Duration::from_secs(1),
        };
        let (coordinator, _) = Actor::spawn(None, Coordinator, args).await.unwrap();
        for addr in [&host, &asker, &bystander] {
            coordinator
                .cast(CoordinatorMsg::RegisterRegion(Register {
                    region: addr.clone(),
                    shards: Vec::new(),
                    available: *addr == host,
                }))
                .unwrap();
        }
        // Asked again until answered, as a region asks every tick: the node's own member
        // may not be up yet when the coordinator hears the first request.
        let mut learnt = BTreeSet::new();
        for _ in 0..300 {
            if learnt.len() == 3 {
                break;
            }
            coordinator
                .cast(CoordinatorMsg::GetHome(GetShardHome {
                    shard: "5".into(),
                    region: asker.clone(),
                }))
                .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            while let Ok((region, shard, home)) = heard.try_recv() {
                assert_eq!((shard.as_str(), home.as_str()), ("5", host.as_str()));
                learnt.insert(region);
            }
        }
        assert_eq!(
            learnt,
            BTreeSet::from([host.clone(), asker.clone(), bystander.clone()]),
            "the regions that learnt the home of shard 5"
        );
        // A region registering later learns it as it registers.
        let late = "127.0.0.1:4".to_string();
        let (actor, _) = Actor::spawn(None, homes_told(&late, told.clone()), ())
            .await
            .unwrap();
        ractor::pg::join_scoped(
            scope.to_string(),
            region_group("probe", &late),
            vec![actor.get_cell()],
        );
        regions.push(actor);
        coordinator
            .cast(CoordinatorMsg::RegisterRegion(Register {
                region: late.clone(),
                shards: Vec::new(),
                available: false,
            }))
            .unwrap();
        // (Answers to the asker's repeated requests may still come in meanwhile.)
        let told_late = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(told) = heard.recv().await {
                if told.0 == late {
                    return Some(told);
                }
            }
            None
        })
        .await;
        assert_eq!(
            told_late.ok().flatten(),
            Some((late, "5".to_string(), host.clone())),
            "what a region registering later was told"
        );
        coordinator.stop(None);
        for r in regions {
            r.stop(None);
        }
        node.leave().await.unwrap();
    }
}
