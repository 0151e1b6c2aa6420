//! A singleton instance that outlives its kill: its handler blocks its thread outside any
//! await, where an actor kill cannot reach it. One node, a controllable (memory) store, a
//! history the checker judges. A hand-over keeps the lease until the instance has ended; a
//! lease being lost ends the process before the lease's local deadline (here a hook stands
//! in for `abort`).
//!
//! The runtime has several worker threads: the blocked instance holds one, the manager and
//! its lease run on the others.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tenure_cluster::{ClusterEvent, HandOver, Incarnation, Member, MemberStatus, NodeAddr};
use tenure_history::{Entry, Event};
use tenure_lease::{
    Fault, FencingToken, LeaseSettings, LeaseSpec, LeaseStore, MemoryStore, ProcessEnd, Unstoppable,
};
use tenure_lease_kit::conformance::holder_test_settings;
use tenure_singleton::{ManagerMsg, SingletonManager, SingletonSettings, SingletonSpec, spawner};
use tenure_test_kit::next_within;
use tenure_test_kit::{Gate, TestHistory, recorded};
use tokio::sync::mpsc;

#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Started(FencingToken),
    /// Its state is gone: it ended (stopped, or killed once its thread came back).
    Ended(FencingToken),
}

/// Reports its life; `Block` blocks its thread at the gate.
struct Blocking;

struct Block;
impl ractor::Message for Block {}

/// The instance's state: reports its end when dropped.
struct Life {
    token: FencingToken,
    gate: Arc<Gate>,
    seen: mpsc::UnboundedSender<Seen>,
}

impl Drop for Life {
    fn drop(&mut self) {
        let _ = self.seen.send(Seen::Ended(self.token));
    }
}

impl Actor for Blocking {
    type Msg = Block;
    type State = Life;
    type Arguments = Life;

    async fn pre_start(&self, _: ActorRef<Block>, life: Life) -> Result<Life, ActorProcessingErr> {
        let _ = life.seen.send(Seen::Started(life.token));
        Ok(life)
    }

    async fn handle(
        &self,
        _: ActorRef<Block>,
        _: Block,
        life: &mut Life,
    ) -> Result<(), ActorProcessingErr> {
        life.gate.block();
        Ok(())
    }
}

/// A test that fails lets the blocked thread go, so that its runtime can shut down.
impl Drop for Fixture {
    fn drop(&mut self) {
        self.gate.open();
    }
}

/// The kit's holder settings, retried every 200 ms.
fn lease_settings() -> LeaseSettings {
    LeaseSettings {
        lease_retry_interval: Duration::from_millis(200),
        ..holder_test_settings()
    }
}

fn me() -> NodeAddr {
    NodeAddr::parse("test", "127.0.0.1:1").unwrap()
}

struct Fixture {
    store: Arc<MemoryStore>,
    manager: ActorRef<ManagerMsg>,
    gate: Arc<Gate>,
    seen: mpsc::UnboundedReceiver<Seen>,
    lease: String,
    scope: String,
    name: String,
    history: TestHistory,
    /// What the manager ended the process for (its hook).
    ends: Arc<Mutex<Vec<Unstoppable>>>,
}

impl Fixture {
    async fn new(history: TestHistory, name: &str) -> Fixture {
        let store = Arc::new(MemoryStore::new());
        let lease = format!("test-singleton-{name}");
        let gate = Arc::new(Gate::default());
        let (tx, seen) = mpsc::unbounded_channel();
        let config = tenure_lease::TenureConfig::from_toml_str("", "test").unwrap();
        let mut settings = SingletonSettings::from_config(&config, name, "memory").unwrap();
        settings.lease = lease_settings();
        // The stop budget (300 ms + 500 ms) fits the 1.5 s ttl.
        settings.stop_timeout = Duration::from_millis(300);
        let scope = format!("test-outlived-{name}");
        let spawn_gate = gate.clone();
        let ends: Arc<Mutex<Vec<Unstoppable>>> = Arc::default();
        // Records why and lets the blocked thread go, as the process's death would end it.
        let process_end = ProcessEnd::with_hook({
            let (ends, gate) = (ends.clone(), gate.clone());
            move |what| {
                ends.lock().unwrap().push(what.clone());
                gate.open();
            }
        });
        let spec = SingletonSpec {
            name: name.into(),
            settings,
            lease: LeaseSpec::new(&lease, &me().to_string(), store.clone(), lease_settings())
                .unwrap(),
            me: me(),
            scope: scope.clone(),
            spawner: spawner(move |token| {
                let life = Life {
                    token,
                    gate: spawn_gate.clone(),
                    seen: tx.clone(),
                };
                (Blocking, life)
            }),
            process_end,
        };
        let manager = SingletonManager::start(spec, None).await.unwrap();
        let member = Member {
            addr: me(),
            incarnation: Incarnation(1),
            age: 1,
            status: MemberStatus::Up,
            reachable: true,
            roles: Vec::new(),
            app_version: Default::default(),
        };
        manager
            .cast(ClusterEvent::CurrentMembers(vec![member]).into())
            .unwrap();
        Fixture {
            store,
            manager,
            gate,
            seen,
            lease,
            scope,
            name: name.into(),
            history,
            ends,
        }
    }

    async fn next(&mut self) -> Seen {
        next_within(&mut self.seen, Duration::from_secs(10), "an instance event").await
    }

    /// Waits for the instance to start, then blocks its thread; returns its token.
    async fn blocked_instance(&mut self) -> FencingToken {
        let Seen::Started(token) = self.next().await else {
            panic!("expected a start")
        };
        // It has joined its group once its start is recorded.
        self.wait_recorded("singleton_started", |e| {
            matches!(e, Event::SingletonStarted(_))
        })
        .await;
        let group = tenure_singleton::instance_group(&self.name, token);
        let members = ractor::pg::get_scoped_members(&self.scope, &group);
        let instance: ActorRef<Block> = members.first().expect("the instance").clone().into();
        instance.cast(Block).unwrap();
        self.gate.wait_blocked().await;
        token
    }

    async fn wait_recorded(&self, what: &str, want: impl Fn(&Event) -> bool) -> Entry {
        self.history.wait_for(what, want).await
    }

    async fn holder(&self) -> Option<String> {
        self.store.read(&self.lease).await.unwrap().map(|r| r.owner)
    }

    fn ends(&self) -> Vec<Unstoppable> {
        self.ends.lock().unwrap().clone()
    }
}

/// A lost lease whose instance outlives its kill: the process ends (the hook, which here
/// lets the blocked thread go) before the lease's local deadline; the checker finds every
/// life inside its hold.
#[test]
fn a_lost_lease_with_an_instance_that_outlived_its_kill_ends_the_process_in_time() {
    recorded(
        &me().to_string(),
        &Incarnation::new().to_string(),
        async |history| {
            let mut f = Fixture::new(history, "lost").await;
            let token = f.blocked_instance().await;
            f.store.set_fault(Fault::FailRenewals);
            // If the process went on, the thread is let go once the deadline has surely passed.
            let valid_until = f
                .history
                .await_end_after_the_loss(|| !f.ends().is_empty())
                .await;
            f.gate.open();
            assert_eq!(f.next().await, Seen::Ended(token));
            f.wait_recorded("singleton_stopped", |e| {
                matches!(e, Event::SingletonStopped(_))
            })
            .await;
            f.store.set_fault(Fault::None);
            f.history.record(Event::NodeLeft {});
            assert_eq!(f.history.violations(), Vec::<String>::new());
            let ends = f.ends();
            assert_eq!(ends.len(), 1, "{ends:?}");
            assert_eq!(
                (ends[0].lease.as_str(), ends[0].token, ends[0].what.as_str()),
                (f.lease.as_str(), token, "singleton lost")
            );
            let abort = f
                .wait_recorded("process_abort", |e| matches!(e, Event::ProcessAbort { .. }))
                .await;
            assert!(abort.t < valid_until, "aborted before the deadline");
        },
    );
}

/// Leaving while the instance outlives its kill: the hand-over waits, the lease stays held
/// and renewed, and is released once the instance has ended.
#[test]
fn a_hand_over_keeps_the_lease_until_an_instance_that_outlived_its_kill_ends() {
    recorded(
        &me().to_string(),
        &Incarnation::new().to_string(),
        async |history| {
            let mut f = Fixture::new(history, "leave").await;
            let token = f.blocked_instance().await;
            let (guard, wait) = HandOver::new();
            f.manager
                .cast(ClusterEvent::SelfLeaving(guard).into())
                .unwrap();
            let mut done = tokio::spawn(wait.done());
            // Longer than the ttl: held and renewed while the instance runs.
            assert!(
                tokio::time::timeout(Duration::from_millis(1600), &mut done)
                    .await
                    .is_err(),
                "the hand-over finished while the instance still runs"
            );
            let me = me().to_string();
            assert_eq!(f.holder().await.as_deref(), Some(me.as_str()));
            f.gate.open();
            assert_eq!(f.next().await, Seen::Ended(token));
            tokio::time::timeout(Duration::from_secs(5), done)
                .await
                .expect("the hand-over finished once the instance ended")
                .unwrap();
            assert_eq!(f.holder().await, None, "released");
            assert!(f.ends().is_empty(), "a hand-over never ends the process");
            assert_eq!(f.history.violations(), Vec::<String>::new());
        },
    );
}

/// The manager stopping while its instance outlived its kill would release the lease with
/// its lease actor: the process ends first.
#[test]
fn a_manager_stopping_while_its_instance_outlived_its_kill_ends_the_process() {
    recorded(
        &me().to_string(),
        &Incarnation::new().to_string(),
        async |history| {
            let mut f = Fixture::new(history, "stopping").await;
            let token = f.blocked_instance().await;
            let (guard, _wait) = HandOver::new();
            f.manager
                .cast(ClusterEvent::SelfLeaving(guard).into())
                .unwrap();
            f.wait_recorded("singleton_zombie", |e| {
                matches!(e, Event::SingletonZombie(_))
            })
            .await;
            assert!(f.ends().is_empty(), "a hand-over never ends the process");
            f.manager.stop_and_wait(None, None).await.unwrap();
            let ends = f.ends();
            assert_eq!(ends.len(), 1, "{ends:?}");
            assert_eq!(
                (ends[0].lease.as_str(), ends[0].token),
                (f.lease.as_str(), token)
            );
            f.wait_recorded("process_abort", |e| matches!(e, Event::ProcessAbort { .. }))
                .await;
        },
    );
}
