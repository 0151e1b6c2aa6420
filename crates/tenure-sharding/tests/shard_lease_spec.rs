//! Akka's ShardWithLeaseSpec and ClusterShardingLeaseSpec, ported to one shard on a
//! controllable (memory) store: entities start only under the shard's lease, acquisition is
//! retried after not-granted and errors, a lost lease stops every entity before the shard
//! acquires again, a shard whose lease is held elsewhere delivers nothing, hand-off
//! releases, a hand-off lets entities finish their mailboxes and gives back the messages
//! the shard kept, and passivation keeps messages for the restarted entity.

use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};
use tenure_lease::{AcquireOutcome, AcquireRequest, Fault, LeaseStore, MemoryStore, ProcessEnd};
use tenure_sharding::{AskReply, Entity, EntityContext, EntityFactory, ShardMsg, entity_factory};
use tenure_test_kit::{next_within, nothing_for};
use tokio::sync::mpsc;

mod probe;
use probe::{LEASE, Probe, Seen, ask, one_shard_settings, start_shard, status, tell};

struct Fixture {
    store: MemoryStore,
    seen: mpsc::UnboundedReceiver<Seen>,
    tx: mpsc::UnboundedSender<Seen>,
}

impl Fixture {
    fn new() -> Fixture {
        let (tx, seen) = mpsc::unbounded_channel();
        Fixture {
            store: MemoryStore::new(),
            seen,
            tx,
        }
    }

    async fn shard(&self, owner: &str, idle: Option<Duration>) -> ActorRef<ShardMsg> {
        self.shard_with(owner, idle, entity_factory(Probe(self.tx.clone())))
            .await
    }

    async fn shard_with(
        &self,
        owner: &str,
        idle: Option<Duration>,
        factory: EntityFactory,
    ) -> ActorRef<ShardMsg> {
        self.shard_buffering(owner, idle, factory, None).await
    }

    /// As [`Fixture::shard_with`], with a buffer of `buffer` messages (default otherwise).
    async fn shard_buffering(
        &self,
        owner: &str,
        idle: Option<Duration>,
        factory: EntityFactory,
        buffer: Option<usize>,
    ) -> ActorRef<ShardMsg> {
        let mut settings = one_shard_settings("");
        settings.idle_timeout = idle;
        if let Some(buffer) = buffer {
            settings.buffer_size = buffer;
        }
        let store = Arc::new(self.store.clone());
        start_shard(owner, settings, store, factory, ProcessEnd::abort()).await
    }

    async fn next(&mut self) -> Seen {
        next_within(&mut self.seen, Duration::from_secs(10), "an entity event").await
    }

    /// Nothing happens to any entity for `quiet` (a negative check over a bounded window).
    async fn nothing_for(&mut self, quiet: Duration) {
        nothing_for(&mut self.seen, quiet).await
    }

    /// Takes the lease for another owner so that shards here are not granted.
    async fn hold_elsewhere(&self) {
        let outcome = self
            .store
            .try_acquire(&AcquireRequest {
                name: LEASE.into(),
                owner: "10.0.0.9:2552".into(),
                instance: "other".into(),
                ttl: Duration::from_secs(3600),
                note: None,
                ..AcquireRequest::default()
            })
            .await
            .unwrap();
        assert!(matches!(outcome, AcquireOutcome::Granted(_)));
    }

    async fn free(&self) {
        let held = self.store.read(LEASE).await.unwrap().expect("held");
        assert!(
            self.store
                .release(LEASE, &held.owner, held.token)
                .await
                .unwrap()
        );
    }
}

#[tokio::test]
async fn entities_start_only_once_the_lease_is_granted() {
    let mut f = Fixture::new();
    f.hold_elsewhere().await;
    let shard = f.shard("10.0.0.1:2552", None).await;
    tell(&shard, "a", "hello");
    // Several retry intervals pass without a grant: the message waits, no entity runs.
    f.nothing_for(Duration::from_millis(600)).await;
    let s = status(&shard).await;
    assert_eq!((s.serving, s.entities.len(), s.waiting), (None, 0, 1));
    f.free().await;
    let Seen::Started(id, token) = f.next().await else {
        panic!("expected a start")
    };
    assert_eq!(id, "a");
    assert_eq!(f.next().await, Seen::Got("a".into(), token, "hello".into()));
    assert_eq!(status(&shard).await.serving, Some(token));
    shard.stop_and_wait(None, None).await.unwrap();
}

#[tokio::test]
async fn acquisition_is_retried_after_store_errors() {
    let mut f = Fixture::new();
    f.store.set_fault(Fault::Unavailable);
    let shard = f.shard("10.0.0.1:2552", None).await;
    let asked = tokio::spawn({
        let shard = shard.clone();
        async move { ask(&shard, "b", "x").await }
    });
    f.nothing_for(Duration::from_millis(500)).await;
    f.store.set_fault(Fault::None);
    assert!(matches!(f.next().await, Seen::Started(id, _) if id == "b"));
    assert_eq!(asked.await.unwrap(), Ok("b:x".to_string()));
    shard.stop_and_wait(None, None).await.unwrap();
}

#[tokio::test]
async fn a_lost_lease_stops_every_entity_then_the_shard_recovers_with_a_new_token() {
    let mut f = Fixture::new();
    let shard = f.shard("10.0.0.1:2552", None).await;
    for e in ["a", "b", "c"] {
        assert_eq!(ask(&shard, e, "1").await.unwrap(), format!("{e}:1"));
    }
    let mut first = None;
    for _ in 0..6 {
        match f.next().await {
            Seen::Started(_, t) => first = Some(t),
            Seen::Got(..) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    let first = first.unwrap();
    f.store.set_fault(Fault::FailRenewals);
    let mut stopped = Vec::new();
    while stopped.len() < 3 {
        match f.next().await {
            Seen::Stopped(id, t) => {
                assert_eq!(t, first);
                stopped.push(id);
            }
            other => panic!("expected the entities to stop, got {other:?}"),
        }
    }
    stopped.sort();
    assert_eq!(stopped, ["a", "b", "c"]);
    let s = status(&shard).await;
    assert!(s.entities.is_empty(), "{s:?}");
    f.store.set_fault(Fault::None);
    // The next message starts the entity again, under a newer grant.
    assert_eq!(ask(&shard, "a", "2").await.unwrap(), "a:2");
    let Seen::Started(_, second) = f.next().await else {
        panic!("expected a start")
    };
    assert!(second > first, "{second} > {first}");
    shard.stop_and_wait(None, None).await.unwrap();
}

#[tokio::test]
async fn a_shard_whose_lease_is_held_by_another_node_delivers_nothing() {
    let mut f = Fixture::new();
    let one = f.shard("10.0.0.1:2552", None).await;
    assert_eq!(ask(&one, "a", "1").await.unwrap(), "a:1");
    let Seen::Started(_, token) = f.next().await else {
        panic!()
    };
    f.next().await;
    // A second copy of the shard on another node: it never gets the lease while the first
    // holds it, so nothing reaches a second entity "a".
    let two = f.shard("10.0.0.2:2552", None).await;
    tell(&two, "a", "to the second copy");
    tell(&one, "a", "2");
    assert_eq!(f.next().await, Seen::Got("a".into(), token, "2".into()));
    f.nothing_for(Duration::from_millis(700)).await;
    assert_eq!(status(&two).await.waiting, 1);
    // Hand-off of the first: its entity stops, the lease is released, and the second copy
    // takes over with a newer token and gets the waiting message.
    let handed = ractor::call!(one, ShardMsg::HandOff).unwrap();
    assert!(handed.released);
    assert!(handed.undelivered.is_empty());
    assert_eq!(f.next().await, Seen::Stopped("a".into(), token));
    let Seen::Started(_, newer) = f.next().await else {
        panic!()
    };
    assert!(newer > token);
    assert_eq!(
        f.next().await,
        Seen::Got("a".into(), newer, "to the second copy".into())
    );
    two.stop_and_wait(None, None).await.unwrap();
    assert!(
        f.store.read(LEASE).await.unwrap().is_none(),
        "released on stop"
    );
}

#[tokio::test]
async fn a_hand_off_lets_entities_finish_their_mailbox_before_they_stop() {
    let mut f = Fixture::new();
    let shard = f.shard("10.0.0.1:2552", None).await;
    assert_eq!(ask(&shard, "a", "0").await.unwrap(), "a:0");
    let Seen::Started(_, token) = f.next().await else {
        panic!("expected a start")
    };
    f.next().await;
    // "1" and "2" sit in the entity's mailbox while it handles "slow" when the hand-off
    // comes: they are handled under the lease, not dropped.
    tell(&shard, "a", "slow");
    tell(&shard, "a", "1");
    tell(&shard, "a", "2");
    let handed = ractor::call!(shard, ShardMsg::HandOff).unwrap();
    assert!(handed.released);
    for text in ["slow", "1", "2"] {
        assert_eq!(f.next().await, Seen::Got("a".into(), token, text.into()));
    }
    assert_eq!(f.next().await, Seen::Stopped("a".into(), token));
}

#[tokio::test]
async fn a_hand_off_gives_back_the_messages_the_shard_kept_in_order() {
    let mut f = Fixture::new();
    f.hold_elsewhere().await;
    let shard = f.shard("10.0.0.1:2552", None).await;
    // No grant: both wait in the shard. The ask's caller is still waiting at hand-off.
    tell(&shard, "a", "first");
    let asking = {
        let shard = shard.clone();
        tokio::spawn(async move { ask(&shard, "b", "second").await })
    };
    while status(&shard).await.waiting < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let handed = ractor::call!(shard, ShardMsg::HandOff).unwrap();
    let kept: Vec<(String, String, bool)> = handed
        .undelivered
        .iter()
        .map(|p| {
            let text: String =
                tenure_cluster::codec::decode_inner("entity request", "probe", &p.env.payload)
                    .unwrap();
            (p.env.entity.clone(), text, p.reply.is_some())
        })
        .collect();
    assert_eq!(
        kept,
        vec![
            ("a".to_string(), "first".to_string(), false),
            ("b".to_string(), "second".to_string(), true),
        ]
    );
    assert!(handed.undelivered.iter().all(|p| p.env.shard == "0"));
    // The ask's port came back open: whoever delivers it next answers the caller.
    let port = handed
        .undelivered
        .into_iter()
        .nth(1)
        .unwrap()
        .reply
        .unwrap();
    let reply =
        tenure_cluster::codec::encode_inner("entity request", "probe", &"b:second".to_string())
            .unwrap();
    port.send(AskReply { result: Ok(reply) }).unwrap();
    assert_eq!(asking.await.unwrap().unwrap(), "b:second");
    f.nothing_for(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn passivation_keeps_messages_for_the_restarted_entity() {
    let mut f = Fixture::new();
    let shard = f
        .shard("10.0.0.1:2552", Some(Duration::from_millis(300)))
        .await;
    // The entity's passivation request reaches the shard before its reply reaches us, so
    // "after" arrives while it passivates: it waits and starts the entity again.
    assert_eq!(ask(&shard, "a", "passivate").await.unwrap(), "a:passivate");
    tell(&shard, "a", "after");
    let Seen::Started(_, t) = f.next().await else {
        panic!()
    };
    assert_eq!(f.next().await, Seen::Got("a".into(), t, "passivate".into()));
    assert_eq!(f.next().await, Seen::Stopped("a".into(), t));
    assert_eq!(f.next().await, Seen::Started("a".into(), t));
    assert_eq!(f.next().await, Seen::Got("a".into(), t, "after".into()));
    // An idle entity is passivated after the idle timeout without asking.
    tell(&shard, "b", "once");
    loop {
        if let Seen::Stopped(id, _) = f.next().await
            && id == "b"
        {
            break;
        }
    }
    let s = status(&shard).await;
    assert!(!s.entities.contains(&"b".to_string()), "{s:?}");
    shard.stop_and_wait(None, None).await.unwrap();
}

#[tokio::test]
async fn passivation_lets_an_entity_finish_its_mailbox_before_it_stops() {
    let mut f = Fixture::new();
    let shard = f.shard("10.0.0.1:2552", None).await;
    // "passivate", "slow" and "2" sit in the entity's mailbox while it handles the first
    // "slow"; the shard acts on the passivation request while the entity handles the
    // second "slow": that one and "2" are handled before the entity stops, not dropped
    // with its mailbox.
    tell(&shard, "a", "slow");
    tell(&shard, "a", "passivate");
    tell(&shard, "a", "slow");
    tell(&shard, "a", "2");
    let Seen::Started(_, t) = f.next().await else {
        panic!("expected a start")
    };
    for text in ["slow", "passivate", "slow", "2"] {
        assert_eq!(f.next().await, Seen::Got("a".into(), t, text.into()));
    }
    assert_eq!(f.next().await, Seen::Stopped("a".into(), t));
    shard.stop_and_wait(None, None).await.unwrap();
}

#[tokio::test]
async fn an_ask_whose_caller_gave_up_leaves_the_shard_buffer() {
    let f = Fixture::new();
    f.hold_elsewhere().await;
    let factory = entity_factory(Probe(f.tx.clone()));
    let shard = f
        .shard_buffering("10.0.0.1:2552", None, factory, Some(1))
        .await;
    let ask = |entity: &'static str| {
        let shard = shard.clone();
        async move {
            let payload =
                tenure_cluster::codec::encode_inner("entity request", "probe", &"hi".to_string())
                    .unwrap();
            shard
                .call(
                    |r: RpcReplyPort<AskReply>| ShardMsg::Deliver {
                        entity: entity.into(),
                        payload,
                        reply: Some(r),
                    },
                    Some(Duration::from_millis(100)),
                )
                .await
                .unwrap()
        }
    };
    // The shard waits for its lease: the only place in its buffer is taken by an ask that
    // times out.
    assert!(matches!(ask("a").await, CallResult::Timeout));
    // Its caller gave up, so its place is free again: the next ask waits too (and times
    // out) instead of being refused because the buffer is full.
    match ask("b").await {
        CallResult::Timeout => {}
        CallResult::Success(AskReply { result }) => {
            panic!("the second ask was answered at once: {result:?}")
        }
        CallResult::SenderError => panic!("the second ask was dropped"),
    }
    assert_eq!(status(&shard).await.waiting, 1, "only the second ask waits");
    shard.stop_and_wait(None, None).await.unwrap();
}

/// Its `start` takes a minute (user code, e.g. loading state); reports when it begins and
/// when its start is abandoned (the future dropped by a kill).
struct SlowStart(mpsc::UnboundedSender<&'static str>);

struct Abandoned(mpsc::UnboundedSender<&'static str>);

impl Drop for Abandoned {
    fn drop(&mut self) {
        let _ = self.0.send("start abandoned");
    }
}

impl Entity for SlowStart {
    type Request = String;
    type Reply = String;
    type State = ();

    async fn start(&self, _ctx: &EntityContext) -> Result<(), ActorProcessingErr> {
        let _ = self.0.send("start began");
        let guard = Abandoned(self.0.clone());
        tokio::time::sleep(Duration::from_secs(60)).await;
        std::mem::forget(guard);
        Ok(())
    }

    async fn handle(
        &self,
        _ctx: &EntityContext,
        _state: &mut (),
        request: String,
    ) -> Result<String, ActorProcessingErr> {
        Ok(request)
    }
}

/// An entity's slow `start` never holds up its shard: the shard keeps answering while the
/// entity starts, and a lost lease is handled at once, the starting entity killed within
/// the stop budget.
#[tokio::test]
async fn a_slow_entity_start_does_not_delay_the_shard() {
    let f = Fixture::new();
    let (tx, mut life) = mpsc::unbounded_channel();
    let shard = f
        .shard_with("10.0.0.1:2552", None, entity_factory(SlowStart(tx)))
        .await;
    let asked = tokio::spawn({
        let shard = shard.clone();
        async move { ask(&shard, "slow", "hello").await }
    });
    let began = tokio::time::timeout(Duration::from_secs(10), life.recv()).await;
    assert_eq!(began.unwrap(), Some("start began"));
    // The shard answers at once while the entity starts; the message waits for it.
    let s = ractor::call_t!(shard, ShardMsg::Status, 500)
        .expect("the shard answers while an entity starts");
    assert!(s.serving.is_some(), "{s:?}");
    assert_eq!(
        (s.entities.clone(), s.waiting),
        (vec!["slow".to_string()], 1),
        "{s:?}"
    );
    // The store goes away: the loss comes the stop budget (800 ms) before the local
    // deadline (1.3 s after the last renewal), and the starting entity is killed after
    // stop-timeout (its stop would only be seen after its start).
    f.store.set_fault(Fault::Unavailable);
    let abandoned = tokio::time::timeout(Duration::from_secs(3), life.recv()).await;
    assert_eq!(abandoned.unwrap(), Some("start abandoned"));
    let s = status(&shard).await;
    // The message waits for the next grant.
    assert_eq!(
        (s.serving, s.entities.len(), s.waiting),
        (None, 0, 1),
        "{s:?}"
    );
    asked.abort();
    shard.stop_and_wait(None, None).await.unwrap();
}
