use std::collections::BTreeMap;

use ractor::ActorProcessingErr;
use tenure_lease::TenureConfig;

use super::*;
use crate::test_regions::{RegionDouble, proxy_region};
use crate::{Entity, EntityContext, ShardRegion, ShardingError};

/// Never started in these tests: it only types their entity references.
struct Echo;

impl Entity for Echo {
    type Request = String;
    type Reply = String;
    type State = ();

    async fn start(&self, _: &EntityContext) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _: &EntityContext,
        _: &mut (),
        request: String,
    ) -> Result<String, ActorProcessingErr> {
        Ok(request)
    }
}

async fn snapshot(region: &ShardRegion) -> RegionSnapshot {
    ractor::call!(region.actor(), |r| RegionMsg::Local(RegionLocal::Snapshot(
        r
    )))
    .unwrap()
}

fn waiting(s: &RegionSnapshot) -> BTreeMap<String, usize> {
    s.waiting.iter().cloned().collect()
}

/// A coordinator that only reports the shards it is asked the home of.
struct HomeAsks(tokio::sync::mpsc::UnboundedSender<String>);

impl Actor for HomeAsks {
    type Msg = CoordinatorMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(
        &self,
        _: ActorRef<CoordinatorMsg>,
        _: (),
    ) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<CoordinatorMsg>,
        msg: CoordinatorMsg,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        if let CoordinatorMsg::GetHome(GetShardHome { shard, .. }) = msg {
            let _ = self.0.send(shard);
        }
        Ok(())
    }
}

fn member(addr: &str, status: MemberStatus) -> Member {
    Member {
        addr: tenure_cluster::NodeAddr::parse("member", addr).unwrap(),
        incarnation: tenure_cluster::Incarnation(1),
        age: 1,
        status,
        reachable: true,
        roles: Vec::new(),
        app_version: Default::default(),
    }
}

/// A coordinator that reports each registration it gets: how many shard ids it
/// carried, and the shards its region hosts according to it.
struct Registrations {
    to: tokio::sync::mpsc::UnboundedSender<(usize, BTreeSet<String>)>,
}

impl Actor for Registrations {
    type Msg = CoordinatorMsg;
    type State = BTreeSet<String>;
    type Arguments = ();

    async fn pre_start(
        &self,
        _: ActorRef<CoordinatorMsg>,
        _: (),
    ) -> Result<BTreeSet<String>, ActorProcessingErr> {
        Ok(BTreeSet::new())
    }

    async fn handle(
        &self,
        _: ActorRef<CoordinatorMsg>,
        msg: CoordinatorMsg,
        hosted: &mut BTreeSet<String>,
    ) -> Result<(), ActorProcessingErr> {
        let carried = match msg {
            CoordinatorMsg::RegisterRegion(crate::messages::Register { shards, .. }) => {
                let carried = shards.len();
                *hosted = shards.into_iter().collect();
                carried
            }
            CoordinatorMsg::RegisterChanges(RegisterChanges {
                base,
                added,
                removed,
                ..
            }) => {
                if base.is_none() {
                    hosted.clear();
                }
                let carried = added.len() + removed.len();
                hosted.extend(added);
                for shard in removed {
                    hosted.remove(&shard);
                }
                carried
            }
            _ => return Ok(()),
        };
        let _ = self.to.send((carried, hosted.clone()));
        Ok(())
    }
}

/// A region hosting `probe` on a memory store, with `config`.
async fn hosting_region(scope: &str, config: &str) -> ActorRef<RegionMsg> {
    let config = TenureConfig::from_toml_str(
        &format!("[tenure]\ndefault-lease-section = \"memory\"\n{config}"),
        "test",
    )
    .unwrap();
    let registry = ["sqlite", "postgres", "etcd", "zookeeper"]
        .into_iter()
        .fold(tenure_lease::StoreRegistry::new(), |r, kind| {
            r.left_out(kind, kind)
        });
    let provider = tenure_lease::LeaseProvider::new(config.clone(), registry).unwrap();
    let settings = Arc::new(ShardingSettings::from_config(&config, "probe", "memory").unwrap());
    let me = "127.0.0.1:1";
    let template = provider
        .spec(
            &tenure_lease::names::shard_lease("test", "probe", "0"),
            "memory",
            me,
        )
        .await
        .unwrap();
    let coordinator =
        SingletonProxy::<CoordinatorMsg>::start(scope, "sharding-probe-coordinator", 10)
            .await
            .unwrap();
    let args = RegionArgs {
        type_name: "probe".into(),
        me: me.into(),
        scope: scope.into(),
        system: "test".into(),
        settings,
        hosting: Some((crate::entity_factory(Echo), template)),
        coordinator,
        routes: Arc::default(),
        readiness: tenure_cluster::Readiness::new().gate("region", "starting"),
    };
    Actor::spawn(None, Region, args).await.unwrap().0
}

/// A region's registration, sent every `retry-interval`, carries the shards that
/// changed since the coordinator last had its report, not every shard it hosts: once
/// the coordinator knows its 40 shards, retries with nothing changed carry none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_retry_carries_only_the_changes() {
    let scope = "region-register-changes";
    let (tx, mut registered) = tokio::sync::mpsc::unbounded_channel();
    let (coordinator, _) = Actor::spawn(None, Registrations { to: tx }, ())
        .await
        .unwrap();
    pg::join_scoped(
        scope.to_string(),
        tenure_singleton::instance_group("sharding-probe-coordinator", FencingToken::new(1)),
        vec![coordinator.get_cell()],
    );
    let region = hosting_region(scope, "[sharding]\nretry-interval = \"50ms\"").await;
    let shards: BTreeSet<String> = (0..40).map(|i| i.to_string()).collect();
    for shard in &shards {
        region
            .cast(RegionMsg::Host(HostShard {
                shard: shard.clone(),
                coordinator: FencingToken::new(1),
            }))
            .unwrap();
    }
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(30), registered.recv())
            .await
            .expect("a registration within 30 s")
            .expect("the coordinator runs")
    };
    while next().await.1 != shards {}
    let mut carried = Vec::new();
    for _ in 0..5 {
        let (n, hosted) = next().await;
        assert_eq!(
            hosted, shards,
            "what the coordinator knows the region hosts"
        );
        carried.push(n);
    }
    assert_eq!(
        carried, [0; 5],
        "shard ids carried by registrations with nothing changed"
    );
    // A new coordinator instance gets every shard once, then changes.
    let (tx, mut registered) = tokio::sync::mpsc::unbounded_channel();
    let (successor, _) = Actor::spawn(None, Registrations { to: tx }, ())
        .await
        .unwrap();
    pg::join_scoped(
        scope.to_string(),
        tenure_singleton::instance_group("sharding-probe-coordinator", FencingToken::new(2)),
        vec![successor.get_cell()],
    );
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(30), registered.recv())
            .await
            .expect("a registration within 30 s")
            .expect("the coordinator runs")
    };
    assert_eq!(
        next().await,
        (40, shards.clone()),
        "the first to a new coordinator"
    );
    assert_eq!(next().await, (0, shards.clone()));
    // Asked for every shard (it lacks the base of the changes): all of them at once.
    region
        .cast(RegionMsg::RegisterAll(RegisterAgain {
            coordinator: FencingToken::new(2),
        }))
        .unwrap();
    let mut after = next().await;
    if after.0 == 0 {
        // A retry that had left before the request.
        after = next().await;
    }
    assert_eq!(after, (40, shards.clone()), "the registration asked for");
    region.stop_and_wait(None, None).await.unwrap();
    coordinator.stop(None);
    successor.stop(None);
}

/// A coordinator that failed over with a node does not know that node's shards (their
/// leases lapsed before it listed them): the regions that knew them ask their home,
/// with no message for them, so that they start again elsewhere at once.
#[tokio::test(start_paused = true)]
async fn a_shard_whose_home_went_down_is_asked_a_new_home_with_no_message_for_it() {
    let scope = "region-orphans";
    let (asks, mut asked) = tokio::sync::mpsc::unbounded_channel();
    let (coordinator, _) = Actor::spawn(None, HomeAsks(asks), ()).await.unwrap();
    ractor::pg::join_scoped(
        scope.to_string(),
        tenure_singleton::instance_group("sharding-probe-coordinator", FencingToken::new(1)),
        vec![coordinator.get_cell()],
    );
    let region = proxy_region(scope, "[sharding]\nretry-interval = \"100ms\"").await;
    let other = "127.0.0.1:2";
    let cast = |msg: RegionMsg| region.actor().cast(msg).unwrap();
    cast(RegionMsg::Local(RegionLocal::Cluster(
        ClusterEvent::CurrentMembers(vec![member(other, MemberStatus::Up)]),
    )));
    cast(RegionMsg::Home(ShardHome {
        shard: "7".into(),
        home: Some(other.into()),
        coordinator: FencingToken::new(1),
    }));
    assert_eq!(
        snapshot(&region).await.homes,
        vec![("7".into(), other.into())]
    );
    cast(RegionMsg::Local(RegionLocal::Cluster(
        ClusterEvent::MemberDown(member(other, MemberStatus::Down)),
    )));
    let first = tokio::time::timeout(Duration::from_secs(60), asked.recv()).await;
    assert_eq!(
        first.ok().flatten().as_deref(),
        Some("7"),
        "the region never asked the new home of the shard its lost node hosted"
    );
    coordinator.stop(None);
}

/// A handle's messages to an entity of another node go to that node's region directly
/// only after this region forwarded one there, and take the region again (kept until
/// the shard's next home is named) once the shard begins a hand-off or its node becomes
/// unreachable.
#[tokio::test]
async fn a_remote_route_opens_at_a_forward_and_closes_when_the_shard_moves_or_its_node_is_lost() {
    let scope = "region-remote-routes";
    let other = "127.0.0.1:2";
    let (tx, mut received) = tokio::sync::mpsc::unbounded_channel();
    let (other_region, _) = Actor::spawn(None, RegionDouble::envelopes(tx), ())
        .await
        .unwrap();
    pg::join_scoped(
        scope.to_string(),
        region_group("probe", other),
        vec![other_region.get_cell()],
    );
    let region = proxy_region(scope, "").await;
    let alice = region.entity_ref::<Echo>("alice");
    let shard = alice.shard();
    let coordinator = FencingToken::new(1);
    let cast = |msg: RegionMsg| region.actor().cast(msg).unwrap();
    let home = || {
        cast(RegionMsg::Home(ShardHome {
            shard: shard.clone(),
            home: Some(other.into()),
            coordinator,
        }))
    };
    let mut note = 0u8;
    let mut tell = || {
        note += 1;
        alice.tell(&note.to_string()).unwrap();
    };
    // Everything the other region got so far (in order).
    let mut seen = Vec::new();
    let mut delivered = async || {
        ractor::call!(other_region, |r| RegionMsg::Vacate(
            Vacating {
                node: "127.0.0.1:1".into()
            },
            r
        ))
        .unwrap();
        while let Ok(env) = received.try_recv() {
            assert_eq!(env.hops, 1);
            seen.push(
                tenure_cluster::codec::decode_inner::<String>(
                    "entity request",
                    "probe",
                    &env.payload,
                )
                .unwrap(),
            );
        }
        seen.clone()
    };
    cast(RegionMsg::Local(RegionLocal::Cluster(
        ClusterEvent::CurrentMembers(vec![member(other, MemberStatus::Up)]),
    )));
    home();
    tell();
    snapshot(&region).await;
    assert!(region.routes.remote_open(&shard), "not opened by a forward");
    tell();
    assert_eq!(delivered().await, ["1", "2"]);

    ractor::call!(region.actor(), |r| RegionMsg::BeginHandOffShard(
        BeginHandOff {
            shard: shard.clone(),
            coordinator
        },
        r
    ))
    .unwrap();
    assert!(
        !region.routes.remote_open(&shard),
        "open while the shard moves"
    );
    tell();
    assert_eq!(
        waiting(&snapshot(&region).await),
        BTreeMap::from([(shard.clone(), 1)])
    );
    assert_eq!(
        delivered().await,
        ["1", "2"],
        "a message overtook the hand-off"
    );

    // The home named again: the kept message first, then the route opens again.
    home();
    snapshot(&region).await;
    tell();
    assert_eq!(delivered().await, ["1", "2", "3", "4"]);
    assert!(region.routes.remote_open(&shard));

    cast(RegionMsg::Local(RegionLocal::Cluster(
        ClusterEvent::Unreachable(member(other, MemberStatus::Up)),
    )));
    snapshot(&region).await;
    assert!(
        !region.routes.remote_open(&shard),
        "open to an unreachable node"
    );
    tell();
    assert_eq!(
        waiting(&snapshot(&region).await),
        BTreeMap::from([(shard.clone(), 1)])
    );
    assert_eq!(delivered().await, ["1", "2", "3", "4"]);
    region.actor().stop_and_wait(None, None).await.unwrap();
    other_region.stop(None);
}

#[tokio::test(start_paused = true)]
async fn an_ask_to_a_shard_without_a_home_times_out_naming_it_and_is_not_kept() {
    let region = proxy_region(
        "region-ask-expiry",
        "[sharding]\nretry-interval = \"500ms\"",
    )
    .await;
    let alice = region.entity_ref::<Echo>("alice");
    let timeout = Duration::from_secs(2);
    let err = alice.ask(&"hello".to_string(), timeout).await.unwrap_err();
    let ShardingError::Timeout {
        type_name,
        shard,
        entity,
        timeout: t,
    } = &err
    else {
        panic!("not a timeout: {err}");
    };
    assert_eq!(
        (type_name.as_str(), shard.clone(), entity.as_str(), *t),
        ("probe", alice.shard(), "alice", timeout)
    );
    let text = err.to_string();
    assert!(
        text.contains("probe") && text.contains("alice") && text.contains(&alice.shard()),
        "{text}"
    );
    // An ask whose port stays open past its timeout (a remote asker's: its node session
    // holds the port) is dropped all the same.
    let (tx, _kept_open) = tokio::sync::oneshot::channel();
    let env = region.envelope("bob", &"hello".to_string()).unwrap();
    region
        .actor()
        .cast(RegionMsg::Ask(env, (tx, timeout).into()))
        .unwrap();
    let bob = region.shard_of("bob");
    assert!(waiting(&snapshot(&region).await).contains_key(&bob));
    tokio::time::sleep(timeout).await;
    // The region drops them at its next tick at the latest.
    tenure_test_kit::eventually_async(
        "the region to drop the asks past their timeout",
        Duration::from_millis(1500),
        async || {
            let left = waiting(&snapshot(&region).await);
            if left.is_empty() { Ok(()) } else { Err(left) }
        },
    )
    .await;
    region.actor().stop_and_wait(None, None).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_full_shard_buffer_refuses_with_the_type_and_shard_and_spares_other_shards() {
    let region = proxy_region("region-shard-buffers", "[sharding]\nbuffer-size = 1").await;
    let full = region.entity_ref::<Echo>("a");
    let other_id = (0..)
        .map(|i| format!("b{i}"))
        .find(|id| region.shard_of(id) != full.shard())
        .unwrap();
    let other = region.entity_ref::<Echo>(other_id.clone());
    full.tell(&"first".to_string()).unwrap();
    let err = full
        .ask(&"second".to_string(), Duration::from_secs(5))
        .await
        .unwrap_err();
    match &err {
        ShardingError::BufferFull {
            type_name,
            shard,
            entity,
            capacity,
        } => assert_eq!(
            (
                type_name.as_str(),
                shard.clone(),
                entity.as_str(),
                *capacity
            ),
            ("probe", full.shard(), "a", 1)
        ),
        other => panic!("not a full buffer: {other}"),
    }
    assert!(
        err.to_string().contains(&format!("shard {}", full.shard())),
        "{err}"
    );
    // A tell beyond it is dropped and counted.
    full.tell(&"third".to_string()).unwrap();
    let s = snapshot(&region).await;
    assert_eq!(s.dropped_tells, 1);
    assert_eq!(waiting(&s), BTreeMap::from([(full.shard(), 1)]));
    // Another shard has a buffer of its own: its ask waits (and times out).
    let err = other
        .ask(&"elsewhere".to_string(), Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ShardingError::Timeout { entity, .. } if *entity == other_id),
        "{err}"
    );
    region.actor().stop_and_wait(None, None).await.unwrap();
}

/// A request whose serializer fails.
struct Unencodable;

impl serde::Serialize for Unencodable {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("the serializer refused it"))
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_that_cannot_be_encoded_is_refused_naming_the_entity_and_the_codecs_error() {
    let region = proxy_region("region-unencodable", "").await;
    let err = region.tell("bob", &Unencodable).unwrap_err();
    let ShardingError::Encode {
        type_name,
        entity,
        source,
    } = &err
    else {
        panic!("not an encode error: {err}");
    };
    assert_eq!((type_name.as_str(), entity.as_str()), ("probe", "bob"));
    assert!(
        matches!(source, tenure_cluster::codec::EncodeError::Serialize { .. }),
        "{source:?}"
    );
    assert!(
        err.to_string().contains("the serializer refused it"),
        "{err}"
    );
    region.actor().stop_and_wait(None, None).await.unwrap();
}
