//! What cannot be stopped ends the process. A supervisor stops what it runs under a lease
//! (entities, a singleton instance) within its [stop budget](crate::StopBudget): a graceful
//! stop, then a kill. Code that blocks a thread outside an await outlives an actor kill, and
//! under a lease being lost it must not run on once another holder may be granted the lease.
//! So, by default, the process ends before the lease's local deadline (`abort(3)`), as HBase
//! region servers and Chubby clients end themselves when their session is gone; the
//! process's death ends the blocked thread with it, and the lease expires in the store.
//!
//! Graceful moves (a hand-off, a leave) never end the process: they keep the lease, renewed,
//! until what outlived its kill has ended.
//!
//! A supervisor decides this when it handles the loss, and a [`LossWatch`] of its lease
//! decides it too, from a task of its own: blocked code can hold up the supervisor itself
//! (tokio runs the task the blocking code woke last on the blocked thread, and a new actor
//! wakes its supervisor as it starts), and the process must end all the same. Both report
//! through one [`Terminator`], so the process ends once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ractor::{ActorCell, ActorId, ActorStatus};
use serde::Deserialize;

use crate::actor::LeaseView;
use crate::events::LeaseState;
use crate::stop_budget::StopBudget;
use crate::token::FencingToken;

/// `when-kill-fails` (in `[sharding]` and `[singleton]`): what a supervisor does when
/// something it runs under a lease that is being lost outlives its kill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WhenKillFails {
    /// `"abort"`: log it with what outlived its kill, its lease and token, record it in the
    /// history (`process_abort`), and end the process with `abort(3)` (SIGABRT: exit status
    /// 134 in a shell) before the lease's local deadline.
    #[default]
    Abort,
    /// `"run-on-unsafe"`: log it and let it run on. UNSAFE: once the local deadline has
    /// passed another holder may be granted the lease and act while this one still does;
    /// only resources that check fencing tokens stay protected.
    RunOnUnsafe,
}

/// Something that outlived its kill under a lease being lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unstoppable {
    /// The lease it runs under.
    pub lease: String,
    /// The token of the grant it runs under.
    pub token: FencingToken,
    /// What it is, for people: e.g. `entity key-7 of counter shard 3`.
    pub what: String,
}

impl std::fmt::Display for Unstoppable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (lease {}, token {})",
            self.what,
            self.lease,
            self.token.get()
        )
    }
}

/// How a supervisor ends the process when something outlived its kill under a lease being
/// lost ([`WhenKillFails::Abort`]): [`ProcessEnd::abort`] by default; tests give a hook
/// instead.
#[derive(Clone)]
pub struct ProcessEnd {
    end: Arc<dyn Fn(&Unstoppable) + Send + Sync>,
    watchdog: bool,
}

impl ProcessEnd {
    /// Ends the process at once with [`std::process::abort`]: no destructor, no flush, no
    /// await; every thread, the blocked one included, ends with it. The [`LossWatch`]es
    /// of its terminator also watch from the process's watchdog thread.
    pub fn abort() -> Self {
        ProcessEnd {
            end: Arc::new(|_| std::process::abort()),
            watchdog: true,
        }
    }

    /// Calls `hook` instead of ending the process: for tests. The supervisor goes on once it
    /// returns, as with [`WhenKillFails::RunOnUnsafe`]. Without
    /// [`with_watchdog`](Self::with_watchdog), only the runtime's tasks call it.
    pub fn with_hook(hook: impl Fn(&Unstoppable) + Send + Sync + 'static) -> Self {
        ProcessEnd {
            end: Arc::new(hook),
            watchdog: false,
        }
    }

    /// Also watches from the process's watchdog thread, as [`abort`](Self::abort) does.
    /// The watchdog reads the host's clock: not for tests on tokio's paused time.
    pub fn with_watchdog(mut self) -> Self {
        self.watchdog = true;
        self
    }

    /// Ends the process because of `what`; returns only with a hook. The caller has
    /// logged and recorded it already.
    pub fn end(&self, what: &Unstoppable) {
        (self.end)(what)
    }
}

/// Reports what outlived its kill and, with [`WhenKillFails::Abort`], ends the process:
/// once, however many of a supervisor's paths (its own stop, its [`LossWatch`], its
/// stopping) find it, until [`Terminator::rearm`].
#[derive(Clone)]
pub struct Terminator(Arc<TerminatorInner>);

struct TerminatorInner {
    policy: WhenKillFails,
    /// The setting, for the log (`sharding.when-kill-fails`).
    key: String,
    end: ProcessEnd,
    done: AtomicBool,
}

impl Terminator {
    /// Follows `policy` (the setting `key`): with `abort`, emits the history's
    /// `process_abort` then calls `end`.
    pub fn new(policy: WhenKillFails, key: impl Into<String>, end: ProcessEnd) -> Self {
        Terminator(Arc::new(TerminatorInner {
            policy,
            key: key.into(),
            end,
            done: AtomicBool::new(false),
        }))
    }

    /// `what` outlived its kill while its lease is being lost (`why`): logs it and, with
    /// `abort`, records it and ends the process (returning only with a hook). `false` if it
    /// was reported already.
    pub fn terminate(&self, what: &Unstoppable, why: &str) -> bool {
        let t = &self.0;
        if t.done.swap(true, Ordering::SeqCst) {
            return false;
        }
        match t.policy {
            WhenKillFails::Abort => {
                tracing::error!(%what, why, key = %t.key,
                    "outlived its kill while its lease is being lost: ending the process before the lease's deadline");
                // The history writer appends inline, with one write(2) per line, so the
                // line is in the file before `end` runs (abort(3) flushes nothing).
                crate::history::process_abort(what);
                t.end.end(what);
            }
            WhenKillFails::RunOnUnsafe => {
                tracing::error!(%what, why, key = %t.key,
                    "outlived its kill while its lease is being lost: it runs on past the lease (run-on-unsafe is UNSAFE)");
            }
        }
        true
    }

    /// Everything that outlived its kill has ended (the process went on: a hook, or
    /// `run-on-unsafe`): the next one is reported again.
    pub fn rearm(&self) {
        self.0.done.store(false, Ordering::SeqCst);
    }

    /// Whether its loss watches also watch from the watchdog thread.
    fn watchdog(&self) -> bool {
        self.0.end.watchdog && self.0.policy == WhenKillFails::Abort
    }
}

/// An actor run under a grant, as a [`LossWatch`] knows it.
struct Watched {
    cell: ActorCell,
    token: FencingToken,
    what: String,
}

/// Watches a lease from a task of its own, for the actors run under its grants: once the
/// grant with token `T` stops being believed (lost, or given up), it waits the stop
/// budget's kill instant and kill wait from when it saw that ([`StopBudget::deadlines`]),
/// then ends the process through its [`Terminator`] if any actor watched under `T` has not
/// terminated. The supervisor stops them meanwhile; this ends the process also when the
/// supervisor itself is held up. Stops watching when dropped.
///
/// That task needs a free worker of the runtime, and blocked code can take every one (an
/// entity blocked on one worker, a slow inline store call or another blocked entity on the
/// other). So, when the terminator ends the process for real ([`ProcessEnd::abort`]), the
/// process's watchdog thread also judges each grant at its local deadline minus the stop
/// budget's exit wait: a grant whose deadline has not moved on by then is lost, and any
/// actor watched under it that has not terminated ends the process then.
pub struct LossWatch {
    actors: Arc<Mutex<HashMap<ActorId, Watched>>>,
    task: tokio::task::JoinHandle<()>,
    /// This watch's place in the watchdog thread's list, while the watch lives.
    _dogged: Option<Arc<watchdog::Dogged>>,
}

impl LossWatch {
    /// Watches `view`'s lease (named `lease`) with `budget`, ending the process through
    /// `terminator`.
    pub fn start(
        view: &LeaseView,
        lease: &str,
        budget: StopBudget,
        terminator: Terminator,
    ) -> LossWatch {
        let actors: Arc<Mutex<HashMap<ActorId, Watched>>> = Arc::default();
        let dogged = terminator.watchdog().then(|| {
            watchdog::watch(watchdog::Dogged::new(
                view.clone(),
                lease.to_string(),
                actors.clone(),
                terminator.clone(),
                budget.exit_wait,
            ))
        });
        let mut states = view.watch_state();
        let (view, lease, watched) = (view.clone(), lease.to_string(), actors.clone());
        let task = tokio::spawn(async move {
            let mut believed = view.token();
            loop {
                if states.changed().await.is_err() {
                    return;
                }
                let state = *states.borrow_and_update();
                let now = match state {
                    LeaseState::Held | LeaseState::Suspended => view.token(),
                    LeaseState::Lost | LeaseState::NotHeld => None,
                };
                // A watch shows the latest state only: a grant followed at once by another
                // is a change of token, seen as such.
                let Some(gone) = believed.filter(|t| Some(*t) != now) else {
                    believed = now;
                    continue;
                };
                believed = now;
                let at = budget.deadlines(tokio::time::Instant::now());
                let (watched, lease, terminator) =
                    (watched.clone(), lease.clone(), terminator.clone());
                tokio::spawn(async move {
                    tokio::time::sleep_until(at.give_up).await;
                    if let Some(what) = running(&watched, &lease, gone) {
                        terminator.terminate(&what, "the lease's loss watch found it running");
                    }
                });
            }
        });
        LossWatch {
            actors,
            task,
            _dogged: dogged,
        }
    }

    /// Watches actor `cell`, run under grant `token`; `what` names it for people.
    pub fn watch(&self, cell: ActorCell, token: FencingToken, what: String) {
        lock(&self.actors).insert(cell.get_id(), Watched { cell, token, what });
    }

    /// Stops watching actor `actor` (it terminated).
    pub fn forget(&self, actor: ActorId) {
        lock(&self.actors).remove(&actor);
    }
}

impl Drop for LossWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What watched under grant `token` of `lease` has not terminated, if anything.
fn running(
    watched: &Mutex<HashMap<ActorId, Watched>>,
    lease: &str,
    token: FencingToken,
) -> Option<Unstoppable> {
    let mut running: Vec<String> = {
        let mut list = lock(watched);
        list.retain(|_, w| !terminated(&w.cell));
        list.values()
            .filter(|w| w.token == token)
            .map(|w| w.what.clone())
            .collect()
    };
    running.sort();
    (!running.is_empty()).then(|| Unstoppable {
        lease: lease.to_string(),
        token,
        what: running.join(", "),
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `cell` and every descendant of it have terminated.
fn terminated(cell: &ActorCell) -> bool {
    cell.get_status() == ActorStatus::Stopped && cell.get_children().iter().all(terminated)
}

mod watchdog;

impl Default for ProcessEnd {
    fn default() -> Self {
        ProcessEnd::abort()
    }
}

impl std::fmt::Debug for ProcessEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProcessEnd")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set in the child process of [`the_default_ends_the_process_with_sigabrt`].
    const CHILD: &str = "TENURE_TEST_PROCESS_END_CHILD";

    #[test]
    fn the_default_ends_the_process_with_sigabrt() {
        let what = Unstoppable {
            lease: "test-shard-counter-3".into(),
            token: FencingToken::new(7),
            what: "entity key-7 of counter shard 3".into(),
        };
        if std::env::var_os(CHILD).is_some() {
            ProcessEnd::default().end(&what);
            // Reached only if the process went on: the parent sees exit status 0.
            return;
        }
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "unstoppable::tests::the_default_ends_the_process_with_sigabrt",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("run this test in a child process");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(6), "SIGABRT, not {status:?}");
    }

    #[test]
    fn a_hook_is_called_instead_and_the_setting_reads_its_two_values() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let end = ProcessEnd::with_hook({
            let seen = seen.clone();
            move |u| seen.lock().unwrap().push(u.to_string())
        });
        end.end(&Unstoppable {
            lease: "l".into(),
            token: FencingToken::new(3),
            what: "singleton s1".into(),
        });
        assert_eq!(*seen.lock().unwrap(), ["singleton s1 (lease l, token 3)"]);
        #[derive(Deserialize)]
        struct S {
            w: WhenKillFails,
        }
        let read = |v: &str| toml::from_str::<S>(&format!("w = {v:?}")).map(|s| s.w);
        assert_eq!(read("abort").unwrap(), WhenKillFails::Abort);
        assert_eq!(read("run-on-unsafe").unwrap(), WhenKillFails::RunOnUnsafe);
        let err = read("run-on").err().unwrap().to_string();
        assert!(
            err.contains("abort") && err.contains("run-on-unsafe"),
            "{err}"
        );
    }
}

#[cfg(test)]
mod watch_tests {
    use std::time::Duration;

    use ractor::{Actor, ActorProcessingErr, ActorRef};

    use super::*;
    use crate::memory::{Fault, MemoryStore};
    use crate::{Acquired, LeaseActor, LeaseEventSink, LeaseMsg, LeaseSettings, LeaseSpec};

    /// An actor that runs until stopped.
    struct Idle;

    impl Actor for Idle {
        type Msg = ();
        type State = ();
        type Arguments = ();
        async fn pre_start(&self, _: ActorRef<()>, _: ()) -> Result<(), ActorProcessingErr> {
            Ok(())
        }
    }

    struct Watched {
        store: MemoryStore,
        lease: ActorRef<LeaseMsg>,
        view: LeaseView,
        watch: LossWatch,
        ends: Arc<Mutex<Vec<Unstoppable>>>,
    }

    impl Watched {
        /// A lease (ttl 1.5 s, the stop budget of a 300 ms stop-timeout), not yet held; a
        /// watch of it whose terminator reports to `ends`.
        async fn new() -> Watched {
            Watched::ending(|end| end).await
        }

        /// [`new`](Self::new), with the terminator's hook made by `end` of a plain one.
        async fn ending(end: impl FnOnce(ProcessEnd) -> ProcessEnd) -> Watched {
            let store = MemoryStore::new();
            let settings = LeaseSettings {
                heartbeat_timeout: Duration::from_millis(1500),
                heartbeat_interval: Duration::from_millis(200),
                lease_operation_timeout: Duration::from_millis(500),
                lease_retry_interval: Duration::from_millis(100),
                safety_margin: Duration::from_millis(200),
                lock_delay: Duration::ZERO,
            };
            let budget = StopBudget::for_actors(Duration::from_millis(300));
            let spec = LeaseSpec::new("test-watch", "o", Arc::new(store.clone()), settings)
                .unwrap()
                .with_checked_stop_budget(&budget, "lease.memory", "stop-timeout")
                .unwrap();
            let (lease, view) = LeaseActor::start(spec, LeaseEventSink::ignore(), None)
                .await
                .unwrap();
            let ends: Arc<Mutex<Vec<Unstoppable>>> = Arc::default();
            let terminator = Terminator::new(
                WhenKillFails::Abort,
                "test.when-kill-fails",
                end(ProcessEnd::with_hook({
                    let ends = ends.clone();
                    move |what| ends.lock().unwrap().push(what.clone())
                })),
            );
            let watch = LossWatch::start(&view, "test-watch", budget, terminator);
            Watched {
                store,
                lease,
                view,
                watch,
                ends,
            }
        }

        /// Acquires the lease and starts an idle actor watched under the grant.
        async fn actor_under_a_grant(&self, what: &str) -> ActorRef<()> {
            let reply = ractor::call!(self.lease, |r| LeaseMsg::Acquire { reply: Some(r) });
            let (Acquired::Granted { token }, _) = reply.unwrap().unwrap() else {
                panic!("granted")
            };
            let (actor, _) = Actor::spawn(None, Idle, ()).await.unwrap();
            self.watch.watch(actor.get_cell(), token, what.into());
            actor
        }

        async fn lost(&self) {
            let mut states = self.view.watch_state();
            while *states.borrow_and_update() != LeaseState::Lost {
                states.changed().await.unwrap();
            }
        }

        fn ends(&self) -> Vec<Unstoppable> {
            self.ends.lock().unwrap().clone()
        }
    }

    /// Nobody stops the watched actor after the loss: the watch ends the process.
    #[tokio::test]
    async fn a_loss_with_an_actor_still_running_ends_the_process() {
        let w = Watched::new().await;
        let actor = w.actor_under_a_grant("actor idle").await;
        w.store.set_fault(Fault::FailRenewals);
        w.lost().await;
        // The stop budget's kill instant and kill wait pass: 500 ms.
        for _ in 0..300 {
            if !w.ends().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let ends = w.ends();
        assert_eq!(ends.len(), 1, "{ends:?}");
        assert_eq!(
            (ends[0].lease.as_str(), ends[0].what.as_str()),
            ("test-watch", "actor idle")
        );
        actor.stop(None);
    }

    /// The watched actor stops within the budget (as its supervisor stops it), or before
    /// a release: nothing ends.
    #[tokio::test]
    async fn actors_stopped_in_time_end_nothing() {
        let w = Watched::new().await;
        let actor = w.actor_under_a_grant("actor idle").await;
        w.store.set_fault(Fault::FailRenewals);
        w.lost().await;
        actor.stop_and_wait(None, None).await.unwrap();
        // Past the kill instant and kill wait (500 ms) and more.
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert!(w.ends().is_empty());
        w.store.set_fault(Fault::None);
        let again = w.actor_under_a_grant("actor again").await;
        again.stop_and_wait(None, None).await.unwrap();
        let released = ractor::call!(w.lease, LeaseMsg::Release).unwrap();
        assert!(released.unwrap());
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert!(w.ends().is_empty());
    }

    /// Every worker of the runtime is held up by blocked code, so neither the supervisor nor
    /// the loss watch's task can run, and nothing renews the lease: the watchdog thread
    /// ends the process while the workers are still blocked.
    #[test]
    fn the_watchdog_ends_the_process_while_every_worker_is_blocked() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let blocked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (w, _actor) = rt.block_on(async {
            let w = Watched::ending({
                let blocked = blocked.clone();
                move |end| {
                    let plain = end.clone();
                    ProcessEnd::with_hook(move |what| {
                        let mut what = what.clone();
                        what.what = format!(
                            "{} with {} workers blocked",
                            what.what,
                            blocked.load(Ordering::SeqCst)
                        );
                        plain.end(&what);
                    })
                    .with_watchdog()
                }
            })
            .await;
            let actor = w.actor_under_a_grant("actor idle").await;
            (w, actor)
        });
        let all_blocked = Arc::new(std::sync::Barrier::new(3));
        for _ in 0..2 {
            let (blocked, all_blocked, ends) =
                (blocked.clone(), all_blocked.clone(), w.ends.clone());
            rt.spawn(async move {
                blocked.fetch_add(1, Ordering::SeqCst);
                all_blocked.wait();
                // Blocked (no await) until something ends the process, or 10 ttls.
                for _ in 0..1500 {
                    if !ends.lock().unwrap().is_empty() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                blocked.fetch_sub(1, Ordering::SeqCst);
            });
        }
        all_blocked.wait();
        while blocked.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(Duration::from_millis(10));
        }
        let ends = w.ends();
        assert!(!ends.is_empty(), "nothing ended the process");
        assert_eq!(
            (ends[0].lease.as_str(), ends[0].what.as_str()),
            ("test-watch", "actor idle with 2 workers blocked"),
            "{ends:?}"
        );
        drop(w);
        rt.shutdown_background();
    }
}
