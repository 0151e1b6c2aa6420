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
            Heard::BeginHandOffs(shards) => rounds.entry(region).or_default().push(shards.clone()),
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
    let stored = crate::placement::pins_of(&f.store.remembered(COORDINATOR_LEASE).await.unwrap());
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
