//! Akka's ClusterSingletonLeaseSpec, ported: one node, a controllable (memory) store, a
//! probe singleton reporting its starts and stops.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tenure_cluster::{ClusterEvent, HandOver, Incarnation, Member, MemberStatus, NodeAddr};
use tenure_lease::{
    AcquireOutcome, AcquireRequest, Fault, FencingToken, LeaseEvent, LeaseLost, LeaseSettings,
    LeaseSpec, LeaseStore, LostReason, MemoryStore,
};
use tenure_lease_kit::conformance::holder_test_settings;
use tenure_singleton::{
    InstanceMsg, ManagerMsg, ProxyError, Singleton, SingletonContext, SingletonManager,
    SingletonProxy, SingletonRef, SingletonSettings, SingletonSpec, Spawner, singleton_spawner,
    spawner,
};
use tokio::sync::mpsc;

#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Started(FencingToken),
    Stopped(FencingToken),
    Got(FencingToken, String),
}

struct Probe;

/// Messages of the probe singleton.
pub enum ProbeMsg {
    /// The instance reports the text with its token.
    Say(String),
}
impl ractor::Message for ProbeMsg {}

impl Actor for Probe {
    type Msg = ProbeMsg;
    type State = (FencingToken, mpsc::UnboundedSender<Seen>);
    type Arguments = (FencingToken, mpsc::UnboundedSender<Seen>);
    async fn pre_start(
        &self,
        _: ActorRef<ProbeMsg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let _ = args.1.send(Seen::Started(args.0));
        Ok(args)
    }
    async fn post_stop(
        &self,
        _: ActorRef<ProbeMsg>,
        s: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let _ = s.1.send(Seen::Stopped(s.0));
        Ok(())
    }
    async fn handle(
        &self,
        _: ActorRef<ProbeMsg>,
        m: ProbeMsg,
        s: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let ProbeMsg::Say(text) = m;
        let _ = s.1.send(Seen::Got(s.0, text));
        Ok(())
    }
}

/// The kit's holder settings, retried every 200 ms.
fn lease_settings() -> LeaseSettings {
    LeaseSettings {
        lease_retry_interval: Duration::from_millis(200),
        ..holder_test_settings()
    }
}

fn addr(port: u16) -> NodeAddr {
    NodeAddr::parse("test", &format!("127.0.0.1:{port}")).unwrap()
}

fn member(port: u16, age: u64, status: MemberStatus) -> Member {
    Member {
        addr: addr(port),
        incarnation: Incarnation(port as u64),
        age,
        status,
        reachable: true,
        roles: Vec::new(),
        app_version: Default::default(),
    }
}

struct Fixture {
    store: Arc<MemoryStore>,
    manager: ActorRef<ManagerMsg>,
    seen: mpsc::UnboundedReceiver<Seen>,
    lease: String,
    scope: String,
}

async fn fixture(name: &str, members: Vec<Member>, prepare: impl FnOnce(&MemoryStore)) -> Fixture {
    let (tx, seen) = mpsc::unbounded_channel();
    let spawner = spawner(move |token| (Probe, (token, tx.clone())));
    fixture_spawning(name, members, prepare, spawner, seen).await
}

/// [`fixture`] whose instances `spawner` makes, their probe's reports on `seen`.
async fn fixture_spawning(
    name: &str,
    members: Vec<Member>,
    prepare: impl FnOnce(&MemoryStore),
    spawner: Spawner,
    seen: mpsc::UnboundedReceiver<Seen>,
) -> Fixture {
    let store = Arc::new(MemoryStore::new());
    prepare(&store);
    let lease = format!("test-singleton-{name}");
    let settings = SingletonSettings {
        role: None,
        lease_section: "memory".into(),
        lease: lease_settings(),
        hand_over_retry_interval: Duration::from_millis(50),
        // The stop budget (300 ms + 500 ms of kill wait and slack) fits the 1.5 s ttl.
        stop_timeout: Duration::from_millis(300),
        buffer_size: 2,
        when_kill_fails: tenure_lease::WhenKillFails::Abort,
    };
    let scope = format!("test-{name}");
    let spec = SingletonSpec {
        name: name.into(),
        settings,
        lease: LeaseSpec::new(
            &lease,
            &addr(1).to_string(),
            store.clone(),
            lease_settings(),
        )
        .unwrap(),
        me: addr(1),
        scope: scope.clone(),
        spawner,
        process_end: tenure_lease::ProcessEnd::abort(),
    };
    let manager = SingletonManager::start(spec, None).await.unwrap();
    manager
        .cast(ClusterEvent::CurrentMembers(members).into())
        .unwrap();
    Fixture {
        store,
        manager,
        seen,
        lease,
        scope,
    }
}

async fn next(seen: &mut mpsc::UnboundedReceiver<Seen>, within: Duration) -> Option<Seen> {
    tokio::time::timeout(within, seen.recv())
        .await
        .ok()
        .flatten()
}

fn hold_by_other(store: &MemoryStore, name: &str) -> FencingToken {
    let req = AcquireRequest {
        name: name.into(),
        owner: "other:1".into(),
        instance: "other".into(),
        ttl: Duration::from_secs(60),
        note: None,
        ..AcquireRequest::default()
    };
    let outcome = futures::executor::block_on(store.try_acquire(&req)).unwrap();
    match outcome {
        AcquireOutcome::Granted(r) => r.token,
        AcquireOutcome::Held(_) => panic!("free lease expected"),
    }
}

#[tokio::test]
async fn not_started_until_the_lease_is_granted_and_retried_while_not_granted() {
    let mut other = FencingToken::new(0);
    let mut f = fixture("wait", vec![member(1, 1, MemberStatus::Up)], |s| {
        other = hold_by_other(s, "test-singleton-wait")
    })
    .await;
    assert_eq!(
        next(&mut f.seen, Duration::from_secs(1)).await,
        None,
        "not started while another owner holds the lease"
    );
    assert!(f.store.release(&f.lease, "other:1", other).await.unwrap());
    let started = next(&mut f.seen, Duration::from_secs(3)).await;
    assert!(
        matches!(started, Some(Seen::Started(t)) if t > other),
        "started after a retry with a newer token: {started:?}"
    );
}

#[tokio::test]
async fn not_started_while_the_store_fails_and_retried() {
    let mut f = fixture("error", vec![member(1, 1, MemberStatus::Up)], |s| {
        s.set_fault(Fault::Unavailable)
    })
    .await;
    assert_eq!(
        next(&mut f.seen, Duration::from_secs(1)).await,
        None,
        "an error is not a grant"
    );
    f.store.set_fault(Fault::None);
    assert!(matches!(
        next(&mut f.seen, Duration::from_secs(3)).await,
        Some(Seen::Started(_))
    ));
}

#[tokio::test]
async fn a_lost_lease_stops_the_singleton_before_it_is_reacquired_and_started_again() {
    let mut f = fixture("lost", vec![member(1, 1, MemberStatus::Up)], |_| {}).await;
    let Some(Seen::Started(first)) = next(&mut f.seen, Duration::from_secs(3)).await else {
        panic!("not started")
    };
    f.store.set_fault(Fault::FailRenewals);
    assert_eq!(
        next(&mut f.seen, Duration::from_secs(5)).await,
        Some(Seen::Stopped(first)),
        "stopped on loss"
    );
    f.store.set_fault(Fault::None);
    let again = next(&mut f.seen, Duration::from_secs(5)).await;
    assert!(
        matches!(again, Some(Seen::Started(t)) if t > first),
        "started again with a newer token: {again:?}"
    );
}

/// The loss of an earlier grant that reaches the manager once a newer grant is believed
/// (its event waited in the mailbox behind other messages while the lease actor acquired
/// again) stops nothing and gives nothing back: releasing then would end the newer grant
/// while its instance runs.
#[tokio::test]
async fn a_late_loss_of_an_earlier_grant_leaves_the_newer_grant_and_its_instance() {
    let mut f = fixture("late-loss", vec![member(1, 1, MemberStatus::Up)], |_| {}).await;
    let Some(Seen::Started(token)) = next(&mut f.seen, Duration::from_secs(3)).await else {
        panic!("not started")
    };
    let earlier = FencingToken::new(token.get() - 1);
    let late = LeaseLost::new(f.lease.clone(), earlier, LostReason::NotHeld);
    f.manager
        .cast(ManagerMsg::Lease(LeaseEvent::Lost(late)))
        .unwrap();
    // Answered after the loss was handled: the manager takes its messages in order.
    let status = ractor::call!(f.manager, ManagerMsg::Status).unwrap();
    assert_eq!(status.running, Some(token), "the instance still runs");
    let record = f.store.read(&f.lease).await.unwrap();
    assert!(
        record
            .as_ref()
            .is_some_and(|r| r.token == token && r.owner == addr(1).to_string()),
        "the newer grant is still held: {record:?}"
    );
}

#[tokio::test]
async fn leaving_stops_the_singleton_and_releases_the_lease() {
    let mut f = fixture("leave", vec![member(1, 1, MemberStatus::Up)], |_| {}).await;
    let Some(Seen::Started(token)) = next(&mut f.seen, Duration::from_secs(3)).await else {
        panic!("not started")
    };
    let (guard, wait) = HandOver::new();
    f.manager
        .cast(ClusterEvent::SelfLeaving(guard).into())
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), wait.done())
        .await
        .expect("hand-over finished");
    assert_eq!(
        f.seen.try_recv().ok(),
        Some(Seen::Stopped(token)),
        "stopped before the hand-over completed"
    );
    assert_eq!(
        f.store.read(&f.lease).await.unwrap(),
        None,
        "lease released"
    );
}

#[tokio::test]
async fn only_the_oldest_starts_it_and_the_next_oldest_takes_over() {
    let older = member(2, 1, MemberStatus::Up);
    let mut f = fixture(
        "oldest",
        vec![older.clone(), member(1, 2, MemberStatus::Up)],
        |_| {},
    )
    .await;
    assert_eq!(
        next(&mut f.seen, Duration::from_millis(700)).await,
        None,
        "not the oldest"
    );
    assert_eq!(
        f.store.read(&f.lease).await.unwrap(),
        None,
        "no lease taken by a younger member"
    );
    f.manager
        .cast(
            ClusterEvent::MemberLeaving(Member {
                status: MemberStatus::Leaving,
                ..older.clone()
            })
            .into(),
        )
        .unwrap();
    assert!(
        matches!(
            next(&mut f.seen, Duration::from_secs(3)).await,
            Some(Seen::Started(_))
        ),
        "the next oldest starts it"
    );
    // A member older than us appearing again (it cannot, ages only grow) would move it.
    f.manager
        .cast(ClusterEvent::MemberUp(older).into())
        .unwrap();
    assert!(matches!(
        next(&mut f.seen, Duration::from_secs(3)).await,
        Some(Seen::Stopped(_))
    ));
}

#[tokio::test]
async fn the_proxy_buffers_in_order_until_an_instance_exists_and_refuses_beyond_its_buffer() {
    let scope = "test-proxy".to_string();
    let proxy = SingletonProxy::<ProbeMsg>::start(&scope, "proxy", 2)
        .await
        .unwrap();
    let mut other = FencingToken::new(0);
    let mut f = fixture("proxy", vec![member(1, 1, MemberStatus::Up)], |s| {
        other = hold_by_other(s, "test-singleton-proxy")
    })
    .await;
    assert_eq!(f.scope, scope);
    proxy.send(ProbeMsg::Say("one".into())).await.unwrap();
    proxy.send(ProbeMsg::Say("two".into())).await.unwrap();
    let full = proxy.send(ProbeMsg::Say("three".into())).await.unwrap_err();
    assert!(
        full.to_string().contains("buffer full") && full.to_string().contains("proxy"),
        "{full}"
    );
    assert!(f.store.release(&f.lease, "other:1", other).await.unwrap());
    let Some(Seen::Started(token)) = next(&mut f.seen, Duration::from_secs(3)).await else {
        panic!("not started")
    };
    assert_eq!(
        next(&mut f.seen, Duration::from_secs(2)).await,
        Some(Seen::Got(token, "one".into()))
    );
    assert_eq!(
        next(&mut f.seen, Duration::from_secs(2)).await,
        Some(Seen::Got(token, "two".into()))
    );
    proxy.send(ProbeMsg::Say("four".into())).await.unwrap();
    assert_eq!(
        next(&mut f.seen, Duration::from_secs(2)).await,
        Some(Seen::Got(token, "four".into()))
    );
}

/// A singleton in the entity's shape: a running total, reporting its starts and stops.
struct Total(mpsc::UnboundedSender<Seen>);

#[derive(serde::Serialize, serde::Deserialize)]
enum Change {
    Add(u64),
    Fail,
}

impl Singleton for Total {
    type Request = Change;
    type Reply = (u64, u64);
    type State = u64;

    async fn start(&self, ctx: &SingletonContext) -> Result<u64, ActorProcessingErr> {
        let _ = self.0.send(Seen::Started(ctx.token));
        Ok(0)
    }

    async fn handle(
        &self,
        ctx: &SingletonContext,
        total: &mut u64,
        change: Change,
    ) -> Result<(u64, u64), ActorProcessingErr> {
        match change {
            Change::Add(n) => {
                *total += n;
                Ok((*total, ctx.token.get()))
            }
            Change::Fail => Err("asked to fail".into()),
        }
    }

    async fn stop(&self, ctx: &SingletonContext, _total: &mut u64) {
        let _ = self.0.send(Seen::Stopped(ctx.token));
    }
}

/// Told and asked through a typed handle, the instance keeps its state between requests;
/// a failing request is answered with the failure and ends the instance, and the manager
/// starts a new one under a new grant with a fresh state.
#[tokio::test]
async fn a_typed_singleton_answers_through_its_handle_and_a_failure_restarts_it() {
    let scope = "test-typed".to_string();
    let proxy = SingletonProxy::<InstanceMsg>::start(&scope, "typed", 8)
        .await
        .unwrap();
    let total = SingletonRef::<Total>::new(proxy);
    let (tx, seen) = mpsc::unbounded_channel();
    let mut other = FencingToken::new(0);
    let mut f = fixture_spawning(
        "typed",
        vec![member(1, 1, MemberStatus::Up)],
        |s| other = hold_by_other(s, "test-singleton-typed"),
        singleton_spawner(Total(tx)),
        seen,
    )
    .await;
    assert_eq!(f.scope, scope);
    let wait = Duration::from_secs(3);
    // No instance while another owner holds the lease: an ask waits for one, up to its
    // timeout.
    let none = total
        .ask(&Change::Add(1), Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(
        matches!(&none, ProxyError::NoInstance { name, .. } if name == "typed"),
        "{none}"
    );
    let asked = tokio::spawn({
        let total = total.clone();
        async move { total.ask(&Change::Add(2), Duration::from_secs(10)).await }
    });
    assert!(f.store.release(&f.lease, "other:1", other).await.unwrap());
    let Some(Seen::Started(first)) = next(&mut f.seen, Duration::from_secs(3)).await else {
        panic!("not started")
    };
    assert_eq!(asked.await.unwrap().unwrap(), (2, first.get()));
    total.tell(&Change::Add(3)).await.unwrap();
    assert_eq!(
        total.ask(&Change::Add(0), wait).await.unwrap(),
        (5, first.get())
    );

    let failed = total
        .ask(&Change::Fail, wait)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        failed.contains("typed") && failed.contains("asked to fail"),
        "{failed}"
    );
    // A failure is no graceful stop: `stop` does not run.
    let Some(Seen::Started(second)) = next(&mut f.seen, Duration::from_secs(5)).await else {
        panic!("not started again")
    };
    assert!(second > first, "{second:?} after {first:?}");
    assert_eq!(
        total.ask(&Change::Add(1), wait).await.unwrap(),
        (1, second.get())
    );
    f.manager.stop(None);
}
