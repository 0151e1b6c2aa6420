//! The singleton manager: one per node and singleton. The oldest up member (with the role)
//! acquires the singleton's lease and only then starts the instance; on a lost lease it
//! stops the instance, waits for it (and its children) to terminate, and only then tries
//! again; when leaving it stops the instance, releases the lease and lets the node go on.
//!
//! Timing: the LeaseActor announces a loss the manager's stop budget before the local
//! deadline (`stop-timeout` plus a kill wait, an exit wait and delivery slack), and the
//! manager never awaits the instance's own code (its `pre_start` runs in its own task), so
//! the instance and its descendants have terminated, by a graceful stop or else a kill, by
//! the deadline.
//!
//! An actor of the instance that outlives even its kill (its thread blocked outside an
//! await) is kept as the zombie: the lease is neither released nor acquired again, and a
//! hand-over is not done, until it has ended. If the lease is being lost meanwhile, or the
//! manager itself stops (its lease actor then releases), the process ends first
//! (`when-kill-fails = "abort"`), within the exit wait before the lease's local deadline;
//! the manager's [`LossWatch`] decides the same from a task of its own, for a manager held
//! up behind the blocked thread itself.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{
    Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SpawnErr, SupervisionEvent, pg,
};
use tenure_cluster::{ClusterEvent, HandOver, Member, MemberStatus, NodeAddr};
use tenure_lease::{
    FencingToken, LeaseActor, LeaseEvent, LeaseEventSink, LeaseMsg, LeaseSpec, LeaseView,
    LossWatch, ProcessEnd, Terminator, Unstoppable,
};

use crate::history;
use crate::settings::SingletonSettings;

/// What a singleton instance is started with.
#[derive(Debug, Clone)]
pub struct SingletonContext {
    /// The singleton's name.
    pub name: String,
    /// The fencing token of the grant this instance runs under: present it with every
    /// write to a resource that checks tokens.
    pub token: FencingToken,
    /// The manager; the instance must be linked to it.
    pub supervisor: ActorCell,
}

/// The task of an actor spawned without waiting for its `pre_start` (ractor's
/// `spawn_linked_instant`): it ends when `pre_start` finished (`Ok`, then the actor is
/// linked to its supervisor) or failed (also when the actor was killed meanwhile).
pub type StartHandle =
    ractor::concurrency::JoinHandle<Result<ractor::concurrency::JoinHandle<()>, SpawnErr>>;

/// How the start behind `started` ended: `Ok` running, `Err` why it failed.
pub async fn start_outcome(started: StartHandle) -> Result<(), StartError> {
    match started.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(StartError::PreStart(e)),
        Err(e) => Err(StartError::Task(e)),
    }
}

/// Why an actor spawned without waiting for its `pre_start` did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Its `pre_start` failed, or it was killed while starting.
    #[error("the actor failed to start: {0}")]
    PreStart(#[source] SpawnErr),
    /// The task that waited for the start panicked or was cancelled.
    #[error("the actor's start task ended without an outcome: {0}")]
    Task(#[source] tokio::task::JoinError),
}

/// An instance whose `pre_start` may still be running: its cell at once (so that it can be
/// stopped or killed while starting), and its [`StartHandle`].
pub struct StartingInstance {
    /// The instance's actor cell.
    pub cell: ActorCell,
    /// Ends when `pre_start` finished or failed.
    pub started: StartHandle,
}

/// Spawns an instance (linked to `ctx.supervisor` once started) without waiting for its
/// `pre_start`: user code must never hold up the manager.
pub type Spawner =
    Arc<dyn Fn(SingletonContext) -> Result<StartingInstance, SpawnErr> + Send + Sync>;

/// A [`Spawner`] from a function building the actor and its arguments for a token.
pub fn spawner<A, F>(make: F) -> Spawner
where
    A: Actor,
    F: Fn(FencingToken) -> (A, A::Arguments) + Send + Sync + 'static,
{
    Arc::new(move |ctx: SingletonContext| {
        let (actor, args) = make(ctx.token);
        let (r, started) =
            ractor::ActorRuntime::spawn_linked_instant(None, actor, args, ctx.supervisor)?;
        Ok(StartingInstance {
            cell: r.get_cell(),
            started,
        })
    })
}

/// The pg group the instance of singleton `name` running under `token` joins (in the
/// cluster's scope). Proxies pick the group with the highest token, so an old instance
/// still visible in pg is never preferred to a newer one.
pub fn instance_group(name: &str, token: FencingToken) -> String {
    format!("{}{token:020}", instance_group_prefix(name))
}

/// The prefix of [`instance_group`] names of singleton `name`.
pub fn instance_group_prefix(name: &str) -> String {
    format!("singleton/{name}@")
}

/// Everything a manager needs.
pub struct SingletonSpec {
    /// The singleton's name.
    pub name: String,
    /// The singleton's settings.
    pub settings: SingletonSettings,
    /// The lease `<system>-singleton-<name>`, owned by this node's `host:port`.
    pub lease: LeaseSpec,
    /// This node.
    pub me: NodeAddr,
    /// The cluster's pg scope ([`tenure_cluster::scope`]).
    pub scope: String,
    /// Starts an instance under a grant.
    pub spawner: Spawner,
    /// How the process ends when the instance outlives its kill while the lease is being
    /// lost (`when-kill-fails = "abort"`): [`ProcessEnd::abort`] but in tests.
    pub process_end: ProcessEnd,
}

/// Where this node's manager stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SingletonStatus {
    /// Whether this node is the oldest eligible member.
    pub oldest: bool,
    /// The token of the instance running here.
    pub running: Option<FencingToken>,
}

/// Messages of the manager (local only: subscribe it to the node's cluster events).
pub enum ManagerMsg {
    /// An event of the node's cluster membership.
    Cluster(ClusterEvent),
    /// An event of the singleton's lease.
    Lease(LeaseEvent),
    /// The pause after a failed instance is over.
    #[doc(hidden)]
    RestartDue,
    /// The actor that survived its kill (actor `0`) has ended.
    #[doc(hidden)]
    ZombieEnded(ractor::ActorId),
    /// The `pre_start` of the instance with `token` (actor `actor`) ended.
    #[doc(hidden)]
    InstanceStarted {
        token: FencingToken,
        actor: ractor::ActorId,
        result: Result<(), StartError>,
    },
    /// Where this manager stands.
    Status(RpcReplyPort<SingletonStatus>),
}

impl ractor::Message for ManagerMsg {}

impl From<ClusterEvent> for ManagerMsg {
    fn from(e: ClusterEvent) -> Self {
        ManagerMsg::Cluster(e)
    }
}

impl From<LeaseEvent> for ManagerMsg {
    fn from(e: LeaseEvent) -> Self {
        ManagerMsg::Lease(e)
    }
}

/// The manager actor. Start it with [`SingletonManager::start`].
pub struct SingletonManager;

struct Running {
    cell: ActorCell,
    token: FencingToken,
    /// Its `pre_start` has finished: it is linked and joined its pg group.
    started: bool,
}

pub struct ManagerState {
    spec: SingletonSpec,
    myself: ActorRef<ManagerMsg>,
    members: BTreeMap<NodeAddr, Member>,
    lease: ActorRef<LeaseMsg>,
    view: LeaseView,
    /// The lease actor was asked to keep trying (it stops by itself once granted).
    wanted: bool,
    /// The newest token a release was asked for: no instance starts under it or an older
    /// one, since that release may still be waiting in the lease actor's mailbox.
    released_up_to: Option<FencingToken>,
    /// The retry pace last given to the lease actor.
    pace: Option<Duration>,
    /// An instance (or descendant) that survived its kill, with its token: nothing is
    /// released or re-acquired, and no hand-over done, until it has terminated.
    zombie: Option<(ActorCell, FencingToken)>,
    /// Ends the process (once) for an instance that outlived its kill under a lease being
    /// lost: shared with `watch`.
    terminator: Terminator,
    /// Watches the lease for the instance from a task of its own.
    watch: LossWatch,
    /// Pause after an instance failed (or could not be spawned) before the next one.
    restart_pause: Option<tokio::task::JoinHandle<()>>,
    running: Option<Running>,
    /// Held while this node leaves; dropped once the instance stopped and the lease is released.
    hand_over: Option<HandOver>,
    leaving: bool,
    down: bool,
}

impl SingletonManager {
    /// Spawns the manager (linked to `supervisor` when given). Deliver the node's cluster
    /// events to it: `node.subscribe(ClusterSubscriber::to_actor(manager))`.
    pub async fn start(
        spec: SingletonSpec,
        supervisor: Option<ActorCell>,
    ) -> Result<ActorRef<ManagerMsg>, SpawnErr> {
        let (r, _) = match supervisor {
            Some(s) => Actor::spawn_linked(None, SingletonManager, spec, s).await?,
            None => Actor::spawn(None, SingletonManager, spec).await?,
        };
        Ok(r)
    }
}

impl Actor for SingletonManager {
    type Msg = ManagerMsg;
    type State = ManagerState;
    type Arguments = SingletonSpec;

    async fn pre_start(
        &self,
        myself: ActorRef<ManagerMsg>,
        spec: SingletonSpec,
    ) -> Result<ManagerState, ActorProcessingErr> {
        let mut spec = spec;
        spec.lease = spec.lease.with_checked_stop_budget(
            &spec.settings.stop_budget(),
            &format!("lease.{}", spec.settings.lease_section),
            "singleton.stop-timeout",
        )?;
        let (lease, view) = LeaseActor::start(
            spec.lease.clone(),
            LeaseEventSink::to_actor(myself.clone()),
            Some(myself.get_cell()),
        )
        .await?;
        let terminator = terminator(&spec);
        let watch = LossWatch::start(
            &view,
            &spec.lease.name,
            spec.settings.stop_budget(),
            terminator.clone(),
        );
        Ok(ManagerState {
            spec,
            myself: myself.clone(),
            members: BTreeMap::new(),
            lease,
            view,
            wanted: false,
            released_up_to: None,
            pace: None,
            zombie: None,
            terminator,
            watch,
            restart_pause: None,
            running: None,
            hand_over: None,
            leaving: false,
            down: false,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<ManagerMsg>,
        state: &mut ManagerState,
    ) -> Result<(), ActorProcessingErr> {
        state.stop_instance("manager stopped").await;
        // Stopping, the manager stops its lease actor, which releases the lease.
        state.kill_failed("the manager stopped");
        state.release().await;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ManagerMsg>,
        msg: ManagerMsg,
        state: &mut ManagerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ManagerMsg::Cluster(event) => state.on_cluster(event),
            ManagerMsg::Lease(LeaseEvent::Lost(lost)) => {
                let at = state
                    .spec
                    .settings
                    .stop_budget()
                    .deadlines(tokio::time::Instant::now());
                if state
                    .running
                    .as_ref()
                    .is_some_and(|r| r.token == lost.token)
                {
                    tracing::warn!(singleton = %state.spec.name, token = lost.token.get(), reason = %lost.reason,
                        "lease lost: stopping the singleton, then trying to re-acquire");
                    state.record(history::singleton_lease_lost, lost.token, &lost.reason.to_string());
                    state.stop_instance("lease lost").await;
                }
                if let Some((cell, token)) = state.zombie.clone()
                    && token == lost.token
                {
                    // Also a zombie of an earlier stop: it must be gone by the deadline.
                    let left = at
                        .give_up
                        .saturating_duration_since(tokio::time::Instant::now());
                    if cell.wait(Some(left)).await.is_ok() {
                        state.zombie_ended(cell.get_id()).await;
                    } else {
                        state.kill_failed(&format!("lease lost: {}", lost.reason));
                    }
                }
                // An instance still running runs under a newer grant (this loss waited in
                // the mailbox while the lease actor acquired again), as does a newer grant
                // believed: giving the lease back now would end it under its instance.
                if state.running.is_none() && state.view.token().is_none_or(|t| t == lost.token)
                {
                    state.release().await;
                }
            }
            // Acted on in `evaluate`, and only while the grant is still believed.
            ManagerMsg::Lease(LeaseEvent::Granted(_)) => state.wanted = false,
            // Singleton leases are plain (priority 0): a forceful preemption arrives as a loss.
            ManagerMsg::Lease(
                LeaseEvent::PreemptionRequested(_)
                | LeaseEvent::PreemptionWithdrawn(_)
                // Renewals failing before the deadline: the grant is still ours, and the
                // stop budget acts on a loss, not on doubt.
                | LeaseEvent::Suspended(_)
                | LeaseEvent::Resumed(_),
            ) => {}
            ManagerMsg::RestartDue => state.restart_pause = None,
            ManagerMsg::ZombieEnded(actor) => state.zombie_ended(actor).await,
            ManagerMsg::InstanceStarted {
                token,
                actor,
                result,
            } => state.instance_started(&myself, token, actor, result).await,
            ManagerMsg::Status(reply) => {
                let _ = reply.send(SingletonStatus {
                    oldest: state.is_oldest(),
                    running: state.running.as_ref().map(|r| r.token),
                });
            }
        }
        state.evaluate(&myself).await;
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<ManagerMsg>,
        event: SupervisionEvent,
        state: &mut ManagerState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, why) = match &event {
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                (cell.clone(), format!("stopped: {reason:?}"))
            }
            SupervisionEvent::ActorFailed(cell, err) => (cell.clone(), format!("failed: {err}")),
            _ => return Ok(()),
        };
        if state
            .zombie
            .as_ref()
            .is_some_and(|(z, _)| z.get_id() == cell.get_id())
        {
            state.zombie_ended(cell.get_id()).await;
        } else if cell.get_id() == state.lease.get_id() {
            // The lease actor died (a bug): its grant is given up without a Lost event, so
            // stop the instance now, then hold the lease through a new lease actor.
            tracing::error!(singleton = %state.spec.name, why, "lease actor ended; stopping the singleton and restarting the lease actor");
            state.stop_instance("lease actor ended").await;
            let (lease, view) = LeaseActor::start(
                state.spec.lease.clone(),
                LeaseEventSink::to_actor(myself.clone()),
                Some(myself.get_cell()),
            )
            .await?;
            state.watch = LossWatch::start(
                &view,
                &state.spec.lease.name,
                state.spec.settings.stop_budget(),
                state.terminator.clone(),
            );
            state.lease = lease;
            state.view = view;
            state.wanted = false;
            state.pace = None;
        } else if let Some(running) = state.running.take_if(|r| r.cell.get_id() == cell.get_id()) {
            // The instance ended on its own: wait for its children, give the grant back (a
            // restart gets a new token), and start again after a pause.
            tracing::warn!(singleton = %state.spec.name, token = running.token.get(), why, "singleton instance ended on its own; restarting it");
            pg::leave_scoped(
                state.spec.scope.clone(),
                instance_group(&state.spec.name, running.token),
                vec![running.cell.clone()],
            );
            // An ended actor kills its children; wait for the kills to land.
            if state.await_family(&running, &why).await {
                state.release().await;
            }
            state.pause_restarts(&myself);
        } else {
            return Ok(());
        }
        state.evaluate(&myself).await;
        Ok(())
    }
}

impl Drop for ManagerState {
    fn drop(&mut self) {
        // Dropped without post_stop (killed, or its runtime shutting down): its lease actor
        // goes with it, and the lease with the actor.
        self.kill_failed("the manager was dropped");
    }
}

impl ManagerState {
    fn on_cluster(&mut self, event: ClusterEvent) {
        match event {
            ClusterEvent::CurrentMembers(members) => {
                self.members = members.into_iter().map(|m| (m.addr.clone(), m)).collect();
            }
            ClusterEvent::MemberJoined(m)
            | ClusterEvent::MemberUp(m)
            | ClusterEvent::MemberLeaving(m)
            | ClusterEvent::Unreachable(m)
            | ClusterEvent::Reachable(m) => {
                self.members.insert(m.addr.clone(), m);
            }
            ClusterEvent::MemberDown(m) if m.addr == self.spec.me => {
                self.members.insert(m.addr.clone(), m);
            }
            ClusterEvent::MemberDown(m) | ClusterEvent::MemberRemoved(m) => {
                if m.addr != self.spec.me {
                    self.members.remove(&m.addr);
                }
            }
            ClusterEvent::SelfDown => self.down = true,
            ClusterEvent::SelfLeaving(guard) => {
                self.leaving = true;
                self.hand_over = Some(guard);
            }
        }
        if let Some(me) = self.members.get(&self.spec.me)
            && me.status == MemberStatus::Up
        {
            self.down = false;
        }
    }

    /// Where the singleton runs: see [`designated`].
    fn oldest(&self) -> Option<&Member> {
        designated(self.members.values(), self.spec.settings.role.as_deref())
    }

    fn is_oldest(&self) -> bool {
        !self.leaving && !self.down && self.oldest().is_some_and(|m| m.addr == self.spec.me)
    }

    /// An older member is leaving: it hands over soon, so retry at the hand-over pace.
    fn handing_over(&self) -> bool {
        let my_age = self
            .members
            .get(&self.spec.me)
            .map(|m| m.age)
            .unwrap_or(u64::MAX);
        self.members
            .values()
            .any(|m| m.status == MemberStatus::Leaving && m.age < my_age)
    }

    async fn evaluate(&mut self, myself: &ActorRef<ManagerMsg>) {
        let oldest = self.is_oldest();
        if self.running.is_some() && (!oldest || !self.view.check_lease()) {
            let me_leaving = self
                .members
                .get(&self.spec.me)
                .is_some_and(|m| m.status == MemberStatus::Leaving);
            let why = if self.leaving || me_leaving {
                "handing over"
            } else if self.down {
                "this node is down"
            } else {
                "no longer the oldest"
            };
            self.stop_instance(why).await;
            self.release().await;
        }
        if !oldest && self.running.is_none() && (self.wanted || self.view.check_lease()) {
            self.release().await;
        }
        if self.leaving
            && self.running.is_none()
            && self.zombie.is_none()
            && self.hand_over.is_some()
        {
            self.release().await;
            if self.hand_over.take().is_some() {
                tracing::info!(singleton = %self.spec.name, "handed over");
            }
        }
        if oldest && self.running.is_none() && self.zombie.is_none() && self.restart_pause.is_none()
        {
            // Start only on a grant believed now (a grant released meanwhile or lapsed
            // before its event was handled is not one) and newer than any release asked
            // for (a release that timed out may still end it).
            if let Some(token) = self
                .view
                .token()
                .filter(|t| self.released_up_to.is_none_or(|r| *t > r))
            {
                self.start_instance(myself, token).await;
                return;
            }
            // Faster retries while an older member hands the lease over.
            let pace = self
                .handing_over()
                .then_some(self.spec.settings.hand_over_retry_interval);
            if pace != self.pace {
                self.pace = pace;
                let _ = self.lease.cast(LeaseMsg::RetryPace(pace));
            }
            if !self.wanted {
                tracing::debug!(singleton = %self.spec.name, "oldest: acquiring the lease before starting the singleton");
                self.wanted = true;
                let _ = self.lease.cast(LeaseMsg::Acquire { reply: None });
            }
        }
    }

    /// Waits `lease-retry-interval` before the next instance (after one failed).
    fn pause_restarts(&mut self, myself: &ActorRef<ManagerMsg>) {
        let me = myself.clone();
        let pause = self.spec.settings.lease.lease_retry_interval;
        if let Some(previous) = self.restart_pause.replace(tokio::spawn(async move {
            tokio::time::sleep(pause).await;
            let _ = me.cast(ManagerMsg::RestartDue);
        })) {
            previous.abort();
        }
    }

    async fn start_instance(&mut self, myself: &ActorRef<ManagerMsg>, token: FencingToken) {
        // Its life begins now: its `pre_start` may already act under the token.
        self.record(history::singleton_starting, token, "");
        let ctx = SingletonContext {
            name: self.spec.name.clone(),
            token,
            supervisor: myself.get_cell(),
        };
        match (self.spec.spawner)(ctx) {
            Ok(starting) => {
                self.watch.watch(
                    starting.cell.clone(),
                    token,
                    format!("singleton {}", self.spec.name),
                );
                let (me, actor) = (myself.clone(), starting.cell.get_id());
                tokio::spawn(async move {
                    let result = start_outcome(starting.started).await;
                    let _ = me.cast(ManagerMsg::InstanceStarted {
                        token,
                        actor,
                        result,
                    });
                });
                self.running = Some(Running {
                    cell: starting.cell,
                    token,
                    started: false,
                });
            }
            Err(e) => {
                tracing::error!(singleton = %self.spec.name, error = %e, "cannot start the singleton; releasing the lease and retrying");
                self.record(
                    history::singleton_stopped,
                    token,
                    &format!("spawn failed: {e}"),
                );
                self.release().await;
                self.pause_restarts(myself);
            }
        }
    }

    /// The `pre_start` of the instance with `token` (actor `actor`) ended.
    async fn instance_started(
        &mut self,
        myself: &ActorRef<ManagerMsg>,
        token: FencingToken,
        actor: ractor::ActorId,
        result: Result<(), StartError>,
    ) {
        let Some(running) = self
            .running
            .as_mut()
            .filter(|r| !r.started && r.token == token && r.cell.get_id() == actor)
        else {
            // Stopped meanwhile (its end is already recorded).
            return;
        };
        match result {
            Ok(()) => {
                running.started = true;
                pg::join_scoped(
                    self.spec.scope.clone(),
                    instance_group(&self.spec.name, token),
                    vec![running.cell.clone()],
                );
                tracing::info!(singleton = %self.spec.name, token = token.get(), "lease granted: singleton started");
                self.record(history::singleton_started, token, "");
            }
            Err(e) => {
                tracing::error!(singleton = %self.spec.name, error = %e, "the singleton failed to start; releasing the lease and retrying");
                let running = self.running.take().expect("checked above");
                if self
                    .await_family(&running, &format!("start failed: {e}"))
                    .await
                {
                    self.release().await;
                }
                self.pause_restarts(myself);
            }
        }
    }

    /// After the instance ended by itself (or failed to start): waits a kill wait for its
    /// descendants, which ractor kills with it, and records its end. `false` if one
    /// survived (kept as the zombie: nothing is released until it ends).
    async fn await_family(&mut self, running: &Running, why: &str) -> bool {
        let deadline = tokio::time::Instant::now() + self.spec.settings.stop_budget().kill_wait;
        for cell in descendants(&running.cell) {
            cell.kill();
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if cell.wait(Some(left)).await.is_err() {
                tracing::error!(singleton = %self.spec.name, actor = ?cell.get_id(), "a child of the ended instance survived a kill (blocked outside an await?); the lease stays held until it ends");
                self.set_zombie(cell, running.token, why);
                return false;
            }
        }
        self.record(history::singleton_stopped, running.token, why);
        true
    }

    /// Stops the instance and waits until it and all its descendants have terminated,
    /// within the stop budget: one `stop-timeout` for a graceful stop (children first), then
    /// a kill of whatever still runs and a short wait for it to land. An actor that survives
    /// even the kill is kept as the zombie: the lease is neither released nor re-acquired
    /// until it ends.
    async fn stop_instance(&mut self, why: &str) {
        let Some(running) = self.running.take() else {
            return;
        };
        let timeout = self.spec.settings.stop_timeout;
        let at = self
            .spec
            .settings
            .stop_budget()
            .deadlines(tokio::time::Instant::now());
        pg::leave_scoped(
            self.spec.scope.clone(),
            instance_group(&self.spec.name, running.token),
            vec![running.cell.clone()],
        );
        let mut family = vec![running.cell.clone()];
        family.extend(descendants(&running.cell));
        let left = at
            .kill
            .saturating_duration_since(tokio::time::Instant::now());
        running
            .cell
            .stop_children_and_wait(Some(why.to_string()), Some(left))
            .await;
        running.cell.stop(Some(why.to_string()));
        let mut alive = Vec::new();
        for cell in family {
            let left = at
                .kill
                .saturating_duration_since(tokio::time::Instant::now());
            if cell.wait(Some(left)).await.is_err() {
                tracing::warn!(singleton = %self.spec.name, actor = ?cell.get_id(), ?timeout, "did not stop within stop-timeout; killing it");
                cell.kill();
                alive.push(cell);
            }
        }
        for cell in alive {
            let left = at
                .give_up
                .saturating_duration_since(tokio::time::Instant::now());
            if cell.wait(Some(left)).await.is_err() {
                tracing::error!(singleton = %self.spec.name, actor = ?cell.get_id(), "survived a kill (blocked outside an await?); the lease stays held until it ends");
                self.set_zombie(cell, running.token, why);
                return;
            }
        }
        tracing::info!(singleton = %self.spec.name, token = running.token.get(), why, "singleton stopped");
        self.record(history::singleton_stopped, running.token, why);
    }

    /// `cell` of the instance with `token` survived its kill during a stop for `why`: kept
    /// as the zombie, recorded, and watched until it ends.
    fn set_zombie(&mut self, cell: ActorCell, token: FencingToken, why: &str) {
        self.record(history::singleton_zombie, token, why);
        self.watch
            .watch(cell.clone(), token, format!("singleton {}", self.spec.name));
        let me = self.myself.clone();
        let watched = cell.clone();
        tokio::spawn(async move {
            let _ = watched.wait(None).await;
            let _ = me.cast(ManagerMsg::ZombieEnded(watched.get_id()));
        });
        self.zombie = Some((cell, token));
    }

    /// The zombie (actor `actor`) has ended: its end is recorded and the lease released
    /// (a hand-over or a restart may go on).
    async fn zombie_ended(&mut self, actor: ractor::ActorId) {
        let Some((_, token)) = self.zombie.take_if(|(z, _)| z.get_id() == actor) else {
            return;
        };
        self.terminator.rearm();
        tracing::warn!(singleton = %self.spec.name, "the stuck instance has ended");
        self.record(
            history::singleton_stopped,
            token,
            "survived its kill, ended later",
        );
        self.release().await;
    }

    /// The zombie runs while the lease is being lost (`why`), or while the manager itself
    /// stops (its lease actor then releases): ends the process with the default
    /// `when-kill-fails` (see [`Terminator`]); with `run-on-unsafe` only logs it.
    fn kill_failed(&mut self, why: &str) {
        let Some((_, token)) = &self.zombie else {
            return;
        };
        let what = Unstoppable {
            lease: self.spec.lease.name.clone(),
            token: *token,
            what: format!("singleton {}", self.spec.name),
        };
        self.terminator.terminate(&what, why);
    }

    /// Releases the lease (a no-op when nothing of ours may be in the store), retrying a
    /// few times; never while a zombie instance may still run.
    async fn release(&mut self) {
        if self.zombie.is_some() {
            return;
        }
        // Releasing also stops the lease actor's acquire attempts.
        self.wanted = false;
        // Only grants seen so far: one won while this release waits behind an acquire
        // attempt is announced and decided on then, never ended under its instance.
        let seen = self.view.token().max(self.released_up_to);
        self.released_up_to = seen;
        // The lease actor sends a failed release again itself before it answers.
        let timeout = self.spec.settings.lease.release_answer_timeout();
        let release = |reply| LeaseMsg::ReleaseSeen { seen, reply };
        match self.lease.call(release, Some(timeout)).await {
            Ok(ractor::rpc::CallResult::Success(Ok(true))) => {
                tracing::info!(singleton = %self.spec.name, "lease released");
            }
            Ok(ractor::rpc::CallResult::Success(Ok(false))) => {}
            Ok(ractor::rpc::CallResult::Success(Err(e))) => {
                tracing::error!(singleton = %self.spec.name, error = %e, "failed to release the lease; the singleton cannot run elsewhere until it expires");
            }
            _ => {
                tracing::error!(singleton = %self.spec.name, "the lease actor did not answer the release; the singleton cannot run elsewhere until the lease expires");
            }
        }
    }

    fn record(&self, event: fn(&str, FencingToken, &str), token: FencingToken, why: &str) {
        event(&self.spec.name, token, why);
    }
}

/// The manager's [`Terminator`], by `singleton.when-kill-fails`.
fn terminator(spec: &SingletonSpec) -> Terminator {
    Terminator::new(
        spec.settings.when_kill_fails,
        "singleton.when-kill-fails",
        spec.process_end.clone(),
    )
}

/// Every descendant of `cell` now (children, their children, ...).
fn descendants(cell: &ActorCell) -> Vec<ActorCell> {
    let mut family = cell.get_children();
    let mut i = 0;
    while i < family.len() {
        let children = family[i].get_children();
        family.extend(children);
        i += 1;
    }
    family
}

/// The member the singleton runs on: the oldest up member with `role`, among those of the
/// newest application version (`cluster.app-version`), so that during a rolling update it
/// moves to the new version once, not at every restart.
fn designated<'a>(
    members: impl Iterator<Item = &'a Member> + Clone,
    role: Option<&str>,
) -> Option<&'a Member> {
    let candidates = members.filter(|m| m.status == MemberStatus::Up && m.has_role(role));
    let newest = candidates.clone().map(|m| &m.app_version).max()?;
    candidates
        .filter(|m| m.app_version == *newest)
        .min_by(|a, b| (a.age, &a.addr).cmp(&(b.age, &b.addr)))
}

#[cfg(test)]
mod tests {
    use tenure_cluster::{AppVersion, Incarnation, NodeAddr};

    use super::*;

    fn member(port: u16, age: u64, version: &str) -> Member {
        Member {
            addr: NodeAddr::parse("test", &format!("127.0.0.1:{port}")).unwrap(),
            incarnation: Incarnation(port as u64),
            age,
            status: MemberStatus::Up,
            reachable: true,
            roles: Vec::new(),
            app_version: AppVersion::new(version),
        }
    }

    fn runs_on(members: &[Member]) -> Option<u16> {
        designated(members.iter(), None).map(|m| m.addr.port)
    }

    /// A rolling update of a, b, c (oldest first) from 1 to 2, each node restarted in
    /// turn and joining youngest: the singleton moves twice (a leaves; a' is the first of
    /// version 2), not at every restart.
    #[test]
    fn a_rolling_update_moves_the_singleton_at_most_twice() {
        let (a, b, c) = (
            member(1, 1, "1.0.0"),
            member(2, 2, "1.0.0"),
            member(3, 3, "1.0.0"),
        );
        let (a2, b2, c2) = (
            member(1, 4, "2.0.0"),
            member(2, 5, "2.0.0"),
            member(3, 6, "2.0.0"),
        );
        let steps = [
            vec![a.clone(), b.clone(), c.clone()],
            vec![b.clone(), c.clone()],
            vec![b.clone(), c.clone(), a2.clone()],
            vec![c.clone(), a2.clone()],
            vec![c.clone(), a2.clone(), b2.clone()],
            vec![a2.clone(), b2.clone()],
            vec![a2.clone(), b2.clone(), c2.clone()],
        ];
        let hosts: Vec<Option<u16>> = steps.iter().map(|s| runs_on(s)).collect();
        assert_eq!(
            hosts,
            [
                Some(1),
                Some(2),
                Some(1),
                Some(1),
                Some(1),
                Some(1),
                Some(1)
            ]
        );
        let moves = hosts.windows(2).filter(|w| w[0] != w[1]).count();
        assert_eq!(moves, 2);
    }

    #[test]
    fn one_version_keeps_the_oldest_and_leaving_members_do_not_count() {
        let mut members = vec![
            member(1, 3, "1.0.0"),
            member(2, 1, "1.0.0"),
            member(3, 2, "1.0.0"),
        ];
        assert_eq!(runs_on(&members), Some(2));
        members[1].status = MemberStatus::Leaving;
        assert_eq!(runs_on(&members), Some(3));
        members[0].app_version = AppVersion::new("1.0.1");
        assert_eq!(
            runs_on(&members),
            Some(1),
            "the newest version wins over age"
        );
    }
}
