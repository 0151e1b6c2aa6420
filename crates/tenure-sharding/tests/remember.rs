//! Remember-entities on one shard over a controllable (memory) store: the ids of the
//! entities a shard started are kept with its lease in the store and outlive its grant;
//! the shard's next host, or the same node after it lost and regained the lease, starts
//! them all again with no message; an entity that passivated itself is forgotten, one that
//! failed is started again after the backoff; a message to a new entity waits until its id
//! is written; and idle entities are not passivated.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use ractor::ActorRef;
use tenure_lease::{
    Fault, FencingToken, LeaseStore, MemoryStore, ProcessEnd, RememberChange, RememberedIds,
    StoreError,
};
use tenure_lease_kit::wrap::{StoreWrapper, Wrapped};
use tenure_sharding::{ShardMsg, entity_factory};
use tenure_test_kit::next_within;
use tokio::sync::mpsc;

mod probe;
use probe::{LEASE, Probe, Seen, ask, one_shard_settings, start_shard, status};

/// The memory store whose `remember` fails while `refuse` is set.
struct Refusing {
    inner: MemoryStore,
    refuse: Arc<AtomicBool>,
}

#[async_trait]
impl StoreWrapper for Refusing {
    fn wrapped(&self) -> &dyn LeaseStore {
        &self.inner
    }
    fn has_remembered_ids(&self) -> bool {
        true
    }
    async fn remember(
        &self,
        name: &str,
        owner: &str,
        token: FencingToken,
        change: &RememberChange,
    ) -> Result<bool, StoreError> {
        if self.refuse.load(Ordering::SeqCst) {
            return Err(StoreError::unavailable(
                "memory",
                "remember refused by the test",
            ));
        }
        self.inner.remember(name, owner, token, change).await
    }
    async fn remembered(&self, name: &str) -> Result<Vec<String>, StoreError> {
        self.inner.remembered(name).await
    }
}

struct Fixture {
    store: MemoryStore,
    refuse: Arc<AtomicBool>,
    seen: mpsc::UnboundedReceiver<Seen>,
    tx: mpsc::UnboundedSender<Seen>,
}

impl Fixture {
    fn new() -> Fixture {
        let (tx, seen) = mpsc::unbounded_channel();
        Fixture {
            store: MemoryStore::new(),
            refuse: Arc::new(AtomicBool::new(false)),
            seen,
            tx,
        }
    }

    /// A shard of type `probe` (one shard: every id belongs to it) on node `owner`, with
    /// remember-entities and an idle timeout of 100 ms (which remembering turns off).
    async fn shard(&self, owner: &str) -> ActorRef<ShardMsg> {
        let mut settings = one_shard_settings(
            "[sharding]\nremember-entities = true\nentity-restart-backoff = \"100ms\"\n\
             retry-interval = \"50ms\"\nidle-timeout = \"100ms\"",
        );
        assert_eq!(
            settings.idle_timeout, None,
            "no idle passivation when remembering"
        );
        // As configured without remember-entities: the shard must still not passivate.
        settings.idle_timeout = Some(Duration::from_millis(100));
        let store = Arc::new(Wrapped(Refusing {
            inner: self.store.clone(),
            refuse: self.refuse.clone(),
        }));
        let factory = entity_factory(Probe(self.tx.clone()));
        start_shard(owner, settings, store, factory, ProcessEnd::abort()).await
    }

    async fn next(&mut self) -> Seen {
        next_within(&mut self.seen, Duration::from_secs(10), "an entity event").await
    }

    /// The next `n` events, sorted (their order across entities is not defined).
    async fn next_n(&mut self, n: usize) -> Vec<Seen> {
        let mut got = Vec::with_capacity(n);
        for _ in 0..n {
            got.push(self.next().await);
        }
        got.sort_by_key(|s| format!("{s:?}"));
        got
    }

    async fn remembered(&self) -> Vec<String> {
        self.store.remembered(LEASE).await.unwrap()
    }
}

fn ids(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn remembered_entities_start_on_the_next_host_after_a_hand_off_with_no_message() {
    let mut f = Fixture::new();
    let a = f.shard("10.0.0.1:2552").await;
    for e in ["e1", "e2", "e3"] {
        assert_eq!(ask(&a, e, "hello").await.unwrap(), format!("{e}:hello"));
    }
    let first = status(&a).await.serving.expect("serving");
    let mut expected = Vec::new();
    for e in ["e1", "e2", "e3"] {
        expected.push(Seen::Started(e.into(), first));
        expected.push(Seen::Got(e.into(), first, "hello".into()));
    }
    expected.sort_by_key(|s| format!("{s:?}"));
    assert_eq!(f.next_n(6).await, expected);
    // Each id was written before its entity started.
    assert_eq!(f.remembered().await, ids(&["e1", "e2", "e3"]));

    // e3 asks to be passivated: it stops and is forgotten.
    assert_eq!(ask(&a, "e3", "passivate").await.unwrap(), "e3:passivate");
    assert_eq!(
        f.next().await,
        Seen::Got("e3".into(), first, "passivate".into())
    );
    assert_eq!(f.next().await, Seen::Stopped("e3".into(), first));

    // Hand-off: the entities stop, the lease is released; the ids stay in the store, and
    // the removal of e3 landed before the release.
    let handed = ractor::call!(a, ShardMsg::HandOff).unwrap();
    assert!(handed.released);
    assert_eq!(
        f.next_n(2).await,
        vec![
            Seen::Stopped("e1".into(), first),
            Seen::Stopped("e2".into(), first)
        ]
    );
    assert_eq!(f.remembered().await, ids(&["e1", "e2"]));
    assert_eq!(f.store.read(LEASE).await.unwrap(), None);

    // The shard's next host: no message is sent, e1 and e2 start under its grant, e3 not.
    let b = f.shard("10.0.0.2:2552").await;
    let started = f.next_n(2).await;
    let second = match &started[0] {
        Seen::Started(_, t) => *t,
        other => panic!("expected a start, got {other:?}"),
    };
    assert!(second > first, "{second} > {first}");
    assert_eq!(
        started,
        vec![
            Seen::Started("e1".into(), second),
            Seen::Started("e2".into(), second)
        ]
    );
    // Every remembered entity is started at once when the ids are read: e3 is not among them.
    let s = status(&b).await;
    assert_eq!((s.serving, s.entities), (Some(second), ids(&["e1", "e2"])));
    // A message to e3 starts it again, and it is remembered again.
    assert_eq!(ask(&b, "e3", "back").await.unwrap(), "e3:back");
    assert_eq!(
        f.next_n(2).await,
        vec![
            Seen::Got("e3".into(), second, "back".into()),
            Seen::Started("e3".into(), second)
        ]
    );
    assert_eq!(f.remembered().await, ids(&["e1", "e2", "e3"]));
    b.stop_and_wait(None, None).await.unwrap();
}

#[tokio::test]
async fn after_a_lost_lease_the_shard_starts_its_remembered_entities_again() {
    let mut f = Fixture::new();
    let shard = f.shard("10.0.0.1:2552").await;
    for e in ["a", "b"] {
        assert_eq!(ask(&shard, e, "1").await.unwrap(), format!("{e}:1"));
    }
    let first = status(&shard).await.serving.expect("serving");
    f.next_n(4).await;
    // The store stops answering: the lease is lost and both entities stop.
    f.store.set_fault(Fault::Unavailable);
    assert_eq!(
        f.next_n(2).await,
        vec![
            Seen::Stopped("a".into(), first),
            Seen::Stopped("b".into(), first)
        ]
    );
    f.store.set_fault(Fault::None);
    // The shard gets the lease again and starts them, with no message.
    let started = f.next_n(2).await;
    let Seen::Started(_, second) = started[0].clone() else {
        panic!("expected starts, got {started:?}")
    };
    assert!(second > first);
    assert_eq!(
        started,
        vec![
            Seen::Started("a".into(), second),
            Seen::Started("b".into(), second)
        ]
    );
    shard.stop_and_wait(None, None).await.unwrap();
    // Stopping the shard (its node leaving) keeps them remembered.
    assert_eq!(f.remembered().await, ids(&["a", "b"]));
}

#[tokio::test]
async fn a_failed_entity_is_started_again_after_the_backoff_and_idle_ones_stay() {
    let mut f = Fixture::new();
    let shard = f.shard("10.0.0.1:2552").await;
    assert!(ask(&shard, "flaky", "fail").await.is_err());
    let token = status(&shard).await.serving.expect("serving");
    assert_eq!(f.next().await, Seen::Started("flaky".into(), token));
    assert_eq!(
        f.next().await,
        Seen::Got("flaky".into(), token, "fail".into())
    );
    // It failed (no graceful stop runs). No message: the shard starts it again after
    // entity-restart-backoff.
    assert_eq!(f.next().await, Seen::Started("flaky".into(), token));
    assert_eq!(f.remembered().await, ids(&["flaky"]));
    // It stays, however long it is idle (idle-timeout 100 ms is off when remembering): the
    // next event is the reply to this ask, not a stop.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(ask(&shard, "flaky", "still").await.unwrap(), "flaky:still");
    assert_eq!(
        f.next().await,
        Seen::Got("flaky".into(), token, "still".into())
    );
    shard.stop_and_wait(None, None).await.unwrap();
}

#[tokio::test]
async fn a_new_entity_starts_only_once_its_id_is_written() {
    let mut f = Fixture::new();
    f.refuse.store(true, Ordering::SeqCst);
    let shard = f.shard("10.0.0.1:2552").await;
    let asked = tokio::spawn({
        let shard = shard.clone();
        async move { ask(&shard, "new", "hi").await }
    });
    // The shard serves, but the entity waits for its id to be written (the store refuses).
    let s = tenure_test_kit::eventually_async(
        "the shard serving, one entity waiting",
        Duration::from_secs(60),
        async || {
            let s = status(&shard).await;
            if s.serving.is_some() && s.waiting == 1 {
                Ok(s)
            } else {
                Err(s)
            }
        },
    )
    .await;
    assert!(s.entities.is_empty(), "{s:?}");
    assert_eq!(f.remembered().await, Vec::<String>::new());
    f.refuse.store(false, Ordering::SeqCst);
    // The writer retries: written, then started, then the message delivered.
    assert_eq!(asked.await.unwrap(), Ok("new:hi".to_string()));
    assert_eq!(f.remembered().await, ids(&["new"]));
    let token = s.serving.unwrap();
    assert_eq!(f.next().await, Seen::Started("new".into(), token));
    assert_eq!(f.next().await, Seen::Got("new".into(), token, "hi".into()));
    // A NUL in an id cannot be remembered: refused, nothing started.
    let err = ask(&shard, "bad\0id", "x").await.unwrap_err();
    assert!(err.contains("NUL"), "{err}");
    assert_eq!(status(&shard).await.entities, ids(&["new"]));
    shard.stop_and_wait(None, None).await.unwrap();
}
