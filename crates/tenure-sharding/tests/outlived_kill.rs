//! Entities that outlive their kill: a handler blocking its thread outside any await, where
//! an actor kill cannot reach it. One shard on a controllable (memory) store, recording a
//! history that the checker judges. A graceful move (hand-off, passivation) keeps the
//! shard's lease until the entity has ended; a lease being lost ends the process before the
//! lease's local deadline (here a hook stands in for `abort`), or with the unsafe opt-out at
//! least never starts the entity a second time while it runs.
//!
//! The runtime has several worker threads: the blocked entity holds one, the shard and its
//! lease run on the others.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::{ActorProcessingErr, ActorRef};
use tenure_cluster::Incarnation;
use tenure_history::{Entry, Event};
use tenure_lease::{
    Fault, FencingToken, LeaseStore, MemoryStore, ProcessEnd, Unstoppable, WhenKillFails,
};
use tenure_sharding::{Entity, EntityContext, ShardMsg, ShardingSettings, entity_factory};
use tenure_test_kit::{Gate, TestHistory, eventually_async, recorded};
use tenure_test_kit::{next_within, nothing_for};
use tokio::sync::mpsc;

mod probe;
use probe::{LEASE, one_shard_settings, start_shard, tell};

const OWNER: &str = "10.0.0.1:2552";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Started(String, FencingToken),
    Got(String, FencingToken, String),
    /// Its state is gone: it ended (stopped, or killed once its thread came back).
    Ended(String, FencingToken),
}

/// Reports its life and messages; `"block"` blocks its thread at the gate, and so does the
/// `start` of an entity whose id begins with `blocked-start`.
struct Blocking {
    gate: Arc<Gate>,
    seen: mpsc::UnboundedSender<Seen>,
}

/// An entity's state: reports the entity's end when dropped.
struct Life {
    id: String,
    token: FencingToken,
    seen: mpsc::UnboundedSender<Seen>,
}

impl Drop for Life {
    fn drop(&mut self) {
        let _ = self.seen.send(Seen::Ended(self.id.clone(), self.token));
    }
}

impl Entity for Blocking {
    type Request = String;
    type Reply = String;
    type State = Life;

    async fn start(&self, ctx: &EntityContext) -> Result<Life, ActorProcessingErr> {
        if ctx.entity_id.starts_with("blocked-start") {
            self.gate.block();
        }
        let _ = self
            .seen
            .send(Seen::Started(ctx.entity_id.clone(), ctx.token));
        Ok(Life {
            id: ctx.entity_id.clone(),
            token: ctx.token,
            seen: self.seen.clone(),
        })
    }

    async fn handle(
        &self,
        ctx: &EntityContext,
        _life: &mut Life,
        request: String,
    ) -> Result<String, ActorProcessingErr> {
        if request == "block" {
            // A user's synchronous call: nothing of the runtime runs on this thread meanwhile.
            self.gate.block();
        } else {
            let _ = self
                .seen
                .send(Seen::Got(ctx.entity_id.clone(), ctx.token, request.clone()));
        }
        Ok(request)
    }
}

/// A test that fails lets the blocked thread go, so that its runtime can shut down.
impl Drop for Fixture {
    fn drop(&mut self) {
        self.gate.open();
    }
}

struct Fixture {
    store: MemoryStore,
    gate: Arc<Gate>,
    seen: mpsc::UnboundedReceiver<Seen>,
    tx: mpsc::UnboundedSender<Seen>,
    history: TestHistory,
    /// What the shard ended the process for (its hook).
    ends: Arc<Mutex<Vec<Unstoppable>>>,
}

impl Fixture {
    fn new(history: TestHistory) -> Fixture {
        let (tx, seen) = mpsc::unbounded_channel();
        Fixture {
            store: MemoryStore::new(),
            gate: Arc::default(),
            seen,
            tx,
            history,
            ends: Arc::default(),
        }
    }

    /// One shard of `probe` (stop budget 300 ms + 500 ms in the 1.5 s ttl), with
    /// `configure` applied to its settings. Its process end is a hook that records why and
    /// lets the blocked thread go, as the process's death would end it.
    async fn shard(&self, configure: impl FnOnce(&mut ShardingSettings)) -> ActorRef<ShardMsg> {
        let mut settings = one_shard_settings("");
        settings.idle_timeout = None;
        configure(&mut settings);
        let factory = entity_factory(Blocking {
            gate: self.gate.clone(),
            seen: self.tx.clone(),
        });
        let process_end = ProcessEnd::with_hook({
            let (ends, gate) = (self.ends.clone(), self.gate.clone());
            move |what| {
                ends.lock().unwrap().push(what.clone());
                gate.open();
            }
        });
        let store = Arc::new(self.store.clone());
        start_shard(OWNER, settings, store, factory, process_end).await
    }

    async fn next(&mut self) -> Seen {
        next_within(&mut self.seen, Duration::from_secs(10), "an entity event").await
    }

    /// Nothing happens to any entity for `quiet` (a negative check over a bounded window).
    async fn nothing_for(&mut self, quiet: Duration) {
        nothing_for(&mut self.seen, quiet).await
    }

    /// Takes events until every one of `want` was seen, in any order; returns them all.
    async fn until_seen(&mut self, want: &[Seen]) -> Vec<Seen> {
        let mut seen = Vec::new();
        while !want.iter().all(|w| seen.contains(w)) {
            seen.push(self.next().await);
        }
        seen
    }

    /// Starts entity `a` and blocks its thread at the gate; returns its token.
    async fn blocked_entity(&mut self, shard: &ActorRef<ShardMsg>) -> FencingToken {
        tell(shard, "a", "hello");
        let Seen::Started(_, token) = self.next().await else {
            panic!("expected a start")
        };
        assert_eq!(
            self.next().await,
            Seen::Got("a".into(), token, "hello".into())
        );
        tell(shard, "a", "block");
        self.gate.wait_blocked().await;
        token
    }

    fn history(&self) -> Vec<Entry> {
        self.history.read()
    }

    /// Waits until the history shows an event matching `want`; returns it.
    async fn wait_recorded(&self, what: &str, want: impl Fn(&Event) -> bool) -> Entry {
        self.history.wait_for(what, want).await
    }

    /// Who the store says holds the lease now.
    async fn holder(&self) -> Option<String> {
        self.store.read(LEASE).await.unwrap().map(|r| r.owner)
    }

    /// The kinds of the history's events, in order, that `keep` keeps.
    fn kinds(&self, keep: impl Fn(&Event) -> bool) -> Vec<String> {
        self.history()
            .iter()
            .filter(|e| keep(&e.event))
            .map(|e| e.kind())
            .collect()
    }

    fn ends(&self) -> Vec<Unstoppable> {
        self.ends.lock().unwrap().clone()
    }
}

/// The lease's own events and the entity's life, in order.
fn lease_or_entity(e: &Event) -> bool {
    matches!(
        e,
        Event::LeaseReleased { .. }
            | Event::EntityStopped(_)
            | Event::EntityZombie(_)
            | Event::ProcessAbort { .. }
    )
}

/// A hand-off whose entity outlives its kill keeps the shard's lease, renewed, past
/// `hand-off-timeout` (then it answers that it did not release); the lease is released
/// once the entity has ended, and only then.
#[test]
fn a_hand_off_keeps_the_lease_until_an_entity_that_outlived_its_kill_ends() {
    recorded(OWNER, &Incarnation::new().to_string(), async |history| {
        let mut f = Fixture::new(history);
        let shard = f
            .shard(|s| s.hand_off_timeout = Duration::from_secs(2))
            .await;
        let token = f.blocked_entity(&shard).await;
        let handed = ractor::call_t!(shard, ShardMsg::HandOff, 20_000).unwrap();
        assert!(
            !handed.released,
            "the hand-off released the shard's lease while entity a still runs"
        );
        // Longer than the ttl: the lease is renewed, not left to expire.
        tokio::time::sleep(Duration::from_millis(1600)).await;
        assert_eq!(f.holder().await.as_deref(), Some(OWNER), "still held");
        f.gate.open();
        assert_eq!(f.next().await, Seen::Ended("a".into(), token));
        eventually_async(
            "the lease released once the entity ended",
            Duration::from_secs(10),
            async || match f.holder().await {
                None => Ok(()),
                held => Err(held),
            },
        )
        .await;
        assert_eq!(
            f.kinds(lease_or_entity),
            ["entity_zombie", "entity_stopped", "lease_released"]
        );
        assert!(
            f.ends().is_empty(),
            "a graceful move never ends the process"
        );
        assert_eq!(f.history.violations(), Vec::<String>::new());
    });
}

/// Within `hand-off-timeout`, the hand-off waits for an entity that outlived its kill and
/// then releases: the answer says so. The blocked entity drains until the hand-off-timeout
/// less twice the stop budget (800 ms) and is killed then: 7.4 s in, 1.6 s before the
/// answer is due.
#[test]
fn a_hand_off_waits_for_an_entity_that_outlived_its_kill_then_releases() {
    recorded(OWNER, &Incarnation::new().to_string(), async |history| {
        let mut f = Fixture::new(history);
        let shard = f
            .shard(|s| s.hand_off_timeout = Duration::from_secs(9))
            .await;
        let token = f.blocked_entity(&shard).await;
        let handing = {
            let shard = shard.clone();
            tokio::spawn(async move { ractor::call_t!(shard, ShardMsg::HandOff, 60_000) })
        };
        f.wait_recorded("entity_zombie", |e| matches!(e, Event::EntityZombie(_)))
            .await;
        let status = ractor::call_t!(shard, ShardMsg::Status, 5_000).expect("the shard answers");
        assert_eq!(status.entities, ["a"], "{status:?}");
        assert!(!handing.is_finished(), "answered while entity a still runs");
        assert_eq!(f.holder().await.as_deref(), Some(OWNER), "still held");
        f.gate.open();
        assert_eq!(f.next().await, Seen::Ended("a".into(), token));
        let handed = handing.await.unwrap().unwrap();
        assert!(handed.released);
        assert_eq!(
            f.kinds(lease_or_entity),
            ["entity_zombie", "entity_stopped", "lease_released"]
        );
        assert_eq!(f.history.violations(), Vec::<String>::new());
    });
}

/// The shard itself stopping (its region or node going away) while an entity outlived its
/// kill would release the lease with it: the process ends first.
#[test]
fn a_shard_stopping_while_an_entity_outlived_its_kill_ends_the_process() {
    recorded(OWNER, &Incarnation::new().to_string(), async |history| {
        let mut f = Fixture::new(history);
        let shard = f
            .shard(|s| s.hand_off_timeout = Duration::from_millis(100))
            .await;
        let token = f.blocked_entity(&shard).await;
        let handed = ractor::call_t!(shard, ShardMsg::HandOff, 20_000).unwrap();
        assert!(!handed.released);
        assert!(f.ends().is_empty());
        shard.stop_and_wait(None, None).await.unwrap();
        let ends = f.ends();
        assert_eq!(ends.len(), 1, "{ends:?}");
        assert_eq!((ends[0].lease.as_str(), ends[0].token), (LEASE, token));
        assert_eq!(
            f.kinds(lease_or_entity)[..2],
            ["entity_zombie", "process_abort"]
        );
    });
}

/// A lost lease whose entity outlives its kill: the process ends (the hook, which here
/// lets the blocked thread go) before the lease's local deadline. Judged by the checker:
/// every life ends inside the hold.
#[test]
fn a_lost_lease_with_an_entity_that_outlived_its_kill_ends_the_process_in_time() {
    recorded(OWNER, &Incarnation::new().to_string(), async |history| {
        let mut f = Fixture::new(history);
        let shard = f.shard(|_| {}).await;
        let token = f.blocked_entity(&shard).await;
        f.store.set_fault(Fault::FailRenewals);
        // If the process went on, the thread is let go once the deadline has surely passed.
        let valid_until = f
            .history
            .await_end_after_the_loss(|| !f.ends().is_empty())
            .await;
        f.gate.open();
        f.until_seen(&[Seen::Ended("a".into(), token)]).await;
        f.store.set_fault(Fault::None);
        f.history.record(Event::NodeLeft {});
        assert_eq!(f.history.violations(), Vec::<String>::new());
        let ends = f.ends();
        assert_eq!(ends.len(), 1, "{ends:?}");
        assert_eq!(
            (ends[0].lease.as_str(), ends[0].token, ends[0].what.as_str()),
            (LEASE, token, "entity a of probe shard 0")
        );
        let abort = f
            .wait_recorded("process_abort", |e| matches!(e, Event::ProcessAbort { .. }))
            .await;
        assert!(abort.t < valid_until, "aborted before the deadline");
        shard.stop_and_wait(None, None).await.unwrap();
    });
}

/// An entity whose `start` blocks its thread outlives its kill as well: a lost lease ends
/// the process in time.
#[test]
fn an_entity_blocked_in_its_start_is_no_different() {
    recorded(OWNER, &Incarnation::new().to_string(), async |history| {
        let mut f = Fixture::new(history);
        let shard = f.shard(|_| {}).await;
        tell(&shard, "blocked-start-1", "hello");
        f.gate.wait_blocked().await;
        f.store.set_fault(Fault::FailRenewals);
        let abort = f
            .wait_recorded("process_abort", |e| matches!(e, Event::ProcessAbort { .. }))
            .await;
        let valid_until = f.history.deadline_of_the_lost_grant();
        assert!(abort.t < valid_until, "aborted before the deadline");
        let ends = f.ends();
        assert_eq!(ends.len(), 1, "{ends:?}");
        assert_eq!(ends[0].what, "entity blocked-start-1 of probe shard 0");
        // The hook let it go: it ends, its start never having finished under a live grant.
        let Seen::Started(_, token) = f.next().await else {
            panic!("expected its start to finish")
        };
        assert_eq!(ends[0].token, token);
        f.until_seen(&[Seen::Ended("blocked-start-1".into(), token)])
            .await;
        f.store.set_fault(Fault::None);
        f.history.record(Event::NodeLeft {});
        assert_eq!(f.history.violations(), Vec::<String>::new());
        shard.stop_and_wait(None, None).await.unwrap();
    });
}

/// With the unsafe opt-out the process goes on, but the shard never starts the entity a
/// second time while the first still runs: it acquires its lease again only once the
/// entity ended.
#[test]
fn after_a_loss_an_entity_that_outlived_its_kill_is_never_started_twice() {
    recorded(OWNER, &Incarnation::new().to_string(), async |history| {
        let mut f = Fixture::new(history);
        let shard = f
            .shard(|s| s.when_kill_fails = WhenKillFails::RunOnUnsafe)
            .await;
        let token = f.blocked_entity(&shard).await;
        f.store.set_fault(Fault::FailRenewals);
        f.wait_recorded("lease_lost", |e| matches!(e, Event::LeaseLost { .. }))
            .await;
        f.store.set_fault(Fault::None);
        tell(&shard, "a", "again");
        // Several retry intervals: a shard that acquired again would start `a` now.
        f.nothing_for(Duration::from_millis(1500)).await;
        assert!(
            f.ends().is_empty(),
            "run-on-unsafe does not end the process"
        );
        f.gate.open();
        assert_eq!(f.next().await, Seen::Ended("a".into(), token));
        // Granted again once it ended (a newer token, or the same one re-entered while the
        // store still kept it).
        let Seen::Started(id, again) = f.next().await else {
            panic!("expected a start")
        };
        assert_eq!(id, "a");
        assert_eq!(f.next().await, Seen::Got("a".into(), again, "again".into()));
        shard.stop_and_wait(None, None).await.unwrap();
    });
}

/// An idle entity blocked in a handler is passivated: messages for it wait, and no second
/// incarnation starts until it has ended.
#[test]
fn passivating_a_blocked_entity_never_starts_it_twice() {
    recorded(OWNER, &Incarnation::new().to_string(), async |history| {
        let mut f = Fixture::new(history);
        let shard = f
            .shard(|s| s.idle_timeout = Some(Duration::from_millis(200)))
            .await;
        let token = f.blocked_entity(&shard).await;
        // Idle since its last message: passivated while blocked.
        tokio::time::sleep(Duration::from_millis(600)).await;
        tell(&shard, "a", "after");
        f.nothing_for(Duration::from_millis(1000)).await;
        f.gate.open();
        // The old incarnation's state may be dropped after the new one started: its code ran
        // to its end before the shard learnt of it.
        let seen = f
            .until_seen(&[
                Seen::Ended("a".into(), token),
                Seen::Got("a".into(), token, "after".into()),
            ])
            .await;
        assert_eq!(
            seen.iter()
                .filter(|s| matches!(s, Seen::Started(..)))
                .count(),
            1,
            "{seen:?}"
        );
        shard.stop_and_wait(None, None).await.unwrap();
        assert_eq!(f.history.violations(), Vec::<String>::new());
    });
}
