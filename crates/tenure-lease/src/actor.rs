//! The LeaseActor: the driver of one lease's [machine]. The machine decides
//! everything (acquire and retry, the local deadline, renewals, suspension, loss, release,
//! preemption); this actor turns its messages, timer firings and store answers into the
//! machine's inputs, and carries out the effects: store calls (awaited in the handler, as
//! the machine waits for their answers), renewals through the owner's [`RenewalBatcher`],
//! timers, replies, and a watchdog task that feeds the machine the local deadline
//! independently of the mailbox. The machine's events reach every output from one place
//! ([`SharedBelief`]).
//!
//! It releases when it stops: gracefully in `post_stop`, and from `Drop` of its state when
//! it is killed or fails (ractor skips `post_stop` then, e.g. when its supervisor dies).

use std::sync::Arc;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SpawnErr};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{ConfigError, LeaseError};
use crate::events::{LeaseEventSink, LeaseState, LostCallback, SharedBelief};
use crate::machine::{self, Call, Effect, Input, Machine, Outcome, Timer};
use crate::names::{check_lease_name, store_name};
use crate::priority::AcquireOptions;
use crate::renewal::{RenewAnswer, RenewalBatcher};
use crate::settings::LeaseSettings;
use crate::store::{
    AcquireRequest, HeldLease, LeaseStore, PreemptAnswer, PreemptionRequest, bounded,
};
use crate::token::FencingToken;
use crate::trace::LeaseObserver;

/// Everything a LeaseActor needs to hold one lease.
#[derive(Clone)]
pub struct LeaseSpec {
    /// The lease name as users give it.
    pub name: String,
    /// The name under which the store holds it (sanitised when needed).
    pub store_name: String,
    /// The owner (a cluster node's `host:port`).
    pub owner: String,
    /// The store the lease lives in.
    pub store: Arc<dyn LeaseStore>,
    /// The lease's timing: ttl, renewal and retry intervals, operation timeout, safety margin.
    pub settings: LeaseSettings,
    /// The renewal batcher of this owner on this store.
    pub batcher: RenewalBatcher,
    /// Free text kept with the grant (who and why), and sent with preemption requests.
    pub note: Option<String>,
    /// Where the LeaseActor reports its traces (histories), if anywhere.
    pub observer: Option<LeaseObserver>,
    /// Priority, cleanup and waiting timeouts (default: a plain lease).
    pub options: AcquireOptions,
    /// How long before the local deadline the belief ends and `LeaseLost` is announced, so
    /// that what the holder runs under the lease has terminated by the deadline (see
    /// [`StopBudget`](crate::StopBudget)). Zero by default.
    pub stop_budget: std::time::Duration,
}

impl std::fmt::Debug for LeaseSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseSpec")
            .field("name", &self.name)
            .field("store_name", &self.store_name)
            .field("owner", &self.owner)
            .field("store", &self.store.kind())
            .field("settings", &self.settings)
            .field("options", &self.options)
            .field("stop_budget", &self.stop_budget)
            .finish()
    }
}

impl LeaseSpec {
    /// A spec with a batcher of its own. Use [`LeaseSpec::with_batcher`] (or the provider)
    /// when one owner holds many leases, so their renewals share round trips.
    pub fn new(
        name: &str,
        owner: &str,
        store: Arc<dyn LeaseStore>,
        settings: LeaseSettings,
    ) -> Result<Self, ConfigError> {
        let batcher = RenewalBatcher::new(store.clone(), owner.to_string(), settings);
        LeaseSpec::with_batcher(name, owner, store, settings, batcher)
    }

    /// A spec renewing through `batcher` (which must be for the same store, owner and settings).
    pub fn with_batcher(
        name: &str,
        owner: &str,
        store: Arc<dyn LeaseStore>,
        settings: LeaseSettings,
        batcher: RenewalBatcher,
    ) -> Result<Self, ConfigError> {
        check_lease_name(name)?;
        if owner.is_empty() || owner.chars().any(char::is_control) {
            return Err(ConfigError::invalid(
                "owner",
                format!("owner {owner:?} must be non-empty without control characters"),
            ));
        }
        settings.validate("lease")?;
        Ok(LeaseSpec {
            store_name: store_name(name, &store.name_rules()),
            name: name.to_string(),
            owner: owner.to_string(),
            store,
            settings,
            batcher,
            note: None,
            observer: None,
            options: AcquireOptions::default(),
            stop_budget: std::time::Duration::ZERO,
        })
    }

    /// The same spec (store, owner, settings, batcher, note, observer) for lease `name`.
    pub fn renamed(&self, name: &str) -> Result<Self, ConfigError> {
        check_lease_name(name)?;
        Ok(LeaseSpec {
            store_name: store_name(name, &self.store.name_rules()),
            name: name.to_string(),
            ..self.clone()
        })
    }

    /// Reports this lease's traces to `observer`.
    pub fn with_observer(mut self, observer: LeaseObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Acquires with `options` (priority, preemption). Errors name the offending option:
    /// `emergency` without the maximum priority, or priorities on a store without the
    /// `preemption` capability.
    pub fn with_options(mut self, options: AcquireOptions) -> Result<Self, ConfigError> {
        options.validate(self.store.kind(), self.store.capabilities())?;
        self.options = options;
        Ok(self)
    }

    /// Ends the belief, and announces `LeaseLost`, `budget` before each local deadline
    /// (normally a [`StopBudget`](crate::StopBudget)'s total, checked against the settings
    /// with [`LeaseSettings::check_stop_budget`]). From then on `check_lease()` is false: the
    /// holder must stop acting, and has until the deadline to finish stopping.
    pub fn with_stop_budget(mut self, budget: std::time::Duration) -> Self {
        self.stop_budget = budget;
        self
    }

    /// [`with_stop_budget`](Self::with_stop_budget) with `budget`'s total, once
    /// [`LeaseSettings::check_stop_budget`] accepted it for this spec's settings (errors
    /// name `budget_key` and `lease_key`'s `heartbeat-timeout`).
    pub fn with_checked_stop_budget(
        self,
        budget: &crate::StopBudget,
        lease_key: &str,
        budget_key: &str,
    ) -> Result<Self, ConfigError> {
        self.settings
            .check_stop_budget(lease_key, budget_key, budget)?;
        Ok(self.with_stop_budget(budget.total()))
    }

    /// Keeps `note` with each grant.
    pub fn with_note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }
}

/// The certain result of an acquire attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// Held now, with this grant's fencing token (the same token if it was held already).
    Granted {
        /// The grant's fencing token.
        token: FencingToken,
    },
    /// Another owner holds it (named when the store said who) with a priority at least
    /// this requester's (0 on stores without priorities).
    NotGranted {
        /// The holder, when the store said who.
        holder: Option<String>,
        /// The holder's priority.
        priority: u64,
    },
}

/// An acquire answer and, when granted, the generation of the grant.
pub type AcquireReply = Result<(Acquired, Option<u64>), LeaseError>;

/// Messages of the LeaseActor. Only the first five are for users.
pub enum LeaseMsg {
    /// Keep trying (every `lease-retry-interval`) until granted, then announce
    /// `LeaseGranted` and answer `reply` if given. A no-op answer if held already.
    Acquire {
        /// Where to answer once granted (or failed); `None`: announce the grant only.
        reply: Option<RpcReplyPort<AcquireReply>>,
    },
    /// One attempt, answered with its outcome. A requester that outranks the holder asks it
    /// to give the lease up and answers once granted, or with `CleanupTimedOut` /
    /// `Overtaken` (see [`AcquireOptions`]).
    TryAcquire(RpcReplyPort<AcquireReply>),
    /// While trying, retry every `pace` instead of `lease-retry-interval` (`None`: back to
    /// it), e.g. faster while the holder is known to be handing over. A pending retry is
    /// rescheduled at the new pace.
    RetryPace(Option<std::time::Duration>),
    /// Stop trying, give the belief up and release the grant: `Ok(true)` released,
    /// `Ok(false)` nothing was held, `Err` unknown (the grant then expires after its ttl).
    Release(RpcReplyPort<Result<bool, LeaseError>>),
    /// Keep this note with every later acquire (`None`: keep the store's). A held grant's
    /// note changes at its next acquire attempt (a `TryAcquire` re-enters at once), never
    /// at a renewal.
    SetNote(Option<String>),
    #[doc(hidden)]
    RetryAcquire,
    #[doc(hidden)]
    PreemptPoll,
    #[doc(hidden)]
    RenewDue { generation: u64 },
    #[doc(hidden)]
    RenewDone {
        generation: u64,
        answer: Option<RenewAnswer>,
    },
}

impl ractor::Message for LeaseMsg {}

/// An `Acquire` or `TryAcquire` caller, as the machine answers it.
pub(crate) type AcquireCaller = RpcReplyPort<AcquireReply>;

/// Who asked for a release: a `Release` caller, or the actor's own graceful stop.
pub(crate) enum ReleaseCaller {
    Port(RpcReplyPort<Result<bool, LeaseError>>),
    Stop,
}

impl std::fmt::Debug for ReleaseCaller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReleaseCaller::Port(_) => "Port",
            ReleaseCaller::Stop => "Stop",
        })
    }
}

type MachineInput = Input<AcquireCaller, ReleaseCaller>;
type MachineEffect = Effect<AcquireCaller, ReleaseCaller>;

/// Arguments of a LeaseActor.
pub struct LeaseActorArgs {
    pub spec: LeaseSpec,
    pub(crate) belief: Arc<SharedBelief>,
}

/// A read-only view of a LeaseActor's belief, for `check_lease` without messaging it.
#[derive(Clone)]
pub struct LeaseView {
    belief: Arc<SharedBelief>,
}

impl LeaseView {
    /// `true` only while a grant is believed: before its local deadline minus the stop
    /// budget, and before any loss was announced. Never blocks and never talks to the store.
    pub fn check_lease(&self) -> bool {
        self.belief.current().is_some()
    }

    /// The fencing token of the grant believed now.
    pub fn token(&self) -> Option<FencingToken> {
        self.belief.current().map(|h| h.token)
    }

    /// The local deadline of the grant believed now, as an instant of tokio's clock (given
    /// the host suspends seen so far): whatever runs under it must have ended by then (the
    /// belief itself ends the stop budget earlier, and counts suspends as they happen).
    pub fn deadline(&self) -> Option<Instant> {
        self.belief
            .current()
            .map(|h| self.belief.clock().to_tokio(h.deadline))
    }

    /// Calls `cb` once the grant with `token` is lost (at once if it was already).
    pub(crate) fn on_lost(&self, token: FencingToken, cb: LostCallback) {
        self.belief.on_lost(token, cb);
    }

    /// Drops the lost-callbacks of the grant believed now (it is being released).
    pub(crate) fn forget_lost(&self) {
        self.belief.forget_lost();
    }

    /// Where the lease stands now (see [`LeaseState`]). Never blocks. A grant whose belief
    /// has just ended is `Lost` here even before its loss is announced (as `check_lease`).
    pub fn state(&self) -> LeaseState {
        match self.belief.state() {
            LeaseState::Held | LeaseState::Suspended if self.belief.current().is_none() => {
                LeaseState::Lost
            }
            state => state,
        }
    }

    /// The state now and every change after it, in order of the transitions (a watch
    /// channel: a slow reader sees the latest state, not every one).
    pub fn watch_state(&self) -> tokio::sync::watch::Receiver<LeaseState> {
        self.belief.watch_state()
    }
}

/// The LeaseActor. Spawn it with [`LeaseActor::start`].
pub struct LeaseActor;

impl LeaseActor {
    /// Spawns a LeaseActor for `spec` delivering events to `sink`, linked to `supervisor`
    /// when given. It does nothing until asked to acquire.
    pub async fn start(
        spec: LeaseSpec,
        sink: LeaseEventSink,
        supervisor: Option<ActorCell>,
    ) -> Result<(ActorRef<LeaseMsg>, LeaseView), SpawnErr> {
        let observer = spec.observer.clone().map(|o| (spec.owner.clone(), o));
        let machine = Machine::new(machine::Config {
            name: spec.name.clone(),
            owner: spec.owner.clone(),
            validity: spec.settings.validity(),
            stop_budget: spec.stop_budget,
            retry_interval: spec.settings.lease_retry_interval,
            options: spec.options.clone(),
        });
        let belief = Arc::new(SharedBelief::new(
            spec.name.clone(),
            spec.batcher.clock().clone(),
            machine,
            sink,
            observer,
        ));
        let args = LeaseActorArgs {
            spec,
            belief: belief.clone(),
        };
        let (actor, _) = match supervisor {
            Some(sup) => Actor::spawn_linked(None, LeaseActor, args, sup).await?,
            None => Actor::spawn(None, LeaseActor, args).await?,
        };
        Ok((actor, LeaseView { belief }))
    }
}

/// Unique per LeaseActor on this host: the prefix of its holder instances.
fn new_instance_base() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{:x}-{nanos:x}-{n:x}", std::process::id())
}

/// The state of a LeaseActor: its shared machine and the timers and tasks that carry out
/// the machine's effects.
pub struct LeaseActorState {
    spec: LeaseSpec,
    belief: Arc<SharedBelief>,
    /// Prefix of this actor's holder instances (`<base>.<n>`, `n` chosen by the machine): no
    /// other actor, process or node incarnation of the owner shares it, so none of them can
    /// take an unexpired grant of this actor's (the store refuses another instance like
    /// another owner).
    instance_base: String,
    retry_timer: Option<JoinHandle<()>>,
    poll_timer: Option<JoinHandle<()>>,
    renew_timer: Option<JoinHandle<()>>,
    watchdog: Option<JoinHandle<()>>,
}

impl Drop for LeaseActorState {
    fn drop(&mut self) {
        for timer in [
            &mut self.retry_timer,
            &mut self.poll_timer,
            &mut self.renew_timer,
            &mut self.watchdog,
        ] {
            stop(timer);
        }
        // Reached without post_stop when the actor was killed or failed (and after
        // post_stop, when there is nothing left to do): the machine gives everything up
        // and names the store calls to make in the background.
        let effects = self.belief.step(Input::Abandon);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for effect in effects {
            if let Effect::Detach(call) = effect {
                let spec = self.spec.clone();
                let base = self.instance_base.clone();
                rt.spawn(async move {
                    let outcome = execute(&spec, &base, call).await;
                    if let Outcome::Release(released) = outcome {
                        tracing::info!(lease = %spec.name, ?released, "released after the lease actor was killed");
                    }
                });
            }
        }
    }
}

fn stop(timer: &mut Option<JoinHandle<()>>) {
    if let Some(t) = timer.take() {
        t.abort();
    }
}

/// Carries out one store call of the machine, bounded by the operation timeout. Always
/// polled by a spawned task (the actor's, or a detached call's), so a blocking store may
/// run the call inline (see [`crate::blocking`]).
async fn execute(spec: &LeaseSpec, base: &str, call: Call) -> Outcome {
    crate::blocking::allow_inline(execute_call(spec, base, call)).await
}

async fn execute_call(spec: &LeaseSpec, base: &str, call: Call) -> Outcome {
    match call {
        Call::Acquire { instance } => {
            let request = AcquireRequest {
                name: spec.store_name.clone(),
                owner: spec.owner.clone(),
                instance: format!("{base}.{instance}"),
                ttl: spec.settings.store_ttl(),
                note: spec.note.clone(),
                priority: spec.options.priority,
                cleanup_timeout: spec.options.cleanup_timeout,
                emergency: spec.options.emergency,
            };
            let answer = bounded(
                &spec.name,
                "acquire",
                spec.settings.lease_operation_timeout,
                spec.store.try_acquire(&request),
            )
            .await;
            Outcome::Acquire(answer)
        }
        Call::Release { token } => Outcome::Release(release_ours(spec, base, token).await),
        Call::RequestPreemption { token, forceful } => {
            Outcome::Preempt(request_preemption(spec, base, token, forceful).await)
        }
        Call::WithdrawPreemption { token } => {
            withdraw_request(spec, token).await;
            Outcome::Withdrawn
        }
    }
}

/// Releases this actor's grant: the believed one (`token`), or else whatever grant of one
/// of this actor's instances (`<base>.<n>`) the store holds.
async fn release_ours(
    spec: &LeaseSpec,
    base: &str,
    token: Option<FencingToken>,
) -> Result<bool, LeaseError> {
    if let Some(token) = token {
        return release_in_store(spec, token).await;
    }
    let record = bounded(
        &spec.name,
        "release",
        spec.settings.lease_operation_timeout,
        spec.store.read(&spec.store_name),
    )
    .await?;
    match record {
        Some(r) if r.owner == spec.owner && r.instance.starts_with(&format!("{base}.")) => {
            release_in_store(spec, r.token).await
        }
        _ => Ok(false),
    }
}

async fn release_in_store(spec: &LeaseSpec, token: FencingToken) -> Result<bool, LeaseError> {
    bounded(
        &spec.name,
        "release",
        spec.settings.lease_operation_timeout,
        spec.store.release(&spec.store_name, &spec.owner, token),
    )
    .await
}

async fn request_preemption(
    spec: &LeaseSpec,
    base: &str,
    token: FencingToken,
    forceful: bool,
) -> Result<PreemptAnswer, LeaseError> {
    let request = PreemptionRequest {
        by: spec.owner.clone(),
        instance: base.to_string(),
        priority: spec.options.priority,
        forceful,
        note: spec.note.clone(),
    };
    bounded(
        &spec.name,
        "request preemption",
        spec.settings.lease_operation_timeout,
        spec.store
            .request_preemption(&spec.store_name, token, &request),
    )
    .await
}

/// Takes `spec.owner`'s request off grant `token` (best effort: a request left behind ends
/// with the grant).
async fn withdraw_request(spec: &LeaseSpec, token: FencingToken) {
    let withdrawn = bounded(
        &spec.name,
        "withdraw preemption",
        spec.settings.lease_operation_timeout,
        spec.store
            .withdraw_preemption(&spec.store_name, token, &spec.owner),
    )
    .await;
    tracing::info!(lease = %spec.name, token = token.get(), ?withdrawn, "preemption request withdrawn");
}

impl LeaseActorState {
    /// Feeds `input` to the machine and carries out its effects; an awaited store call's
    /// answer is fed back at once, until the machine awaits nothing.
    async fn feed(&mut self, myself: &ActorRef<LeaseMsg>, input: MachineInput) {
        let mut effects = self.belief.step(input);
        loop {
            let mut call = None;
            for effect in effects {
                match effect {
                    Effect::Call(c) => call = Some(c),
                    other => self.carry_out(myself, other),
                }
            }
            let Some(call) = call else {
                return;
            };
            let outcome = execute(&self.spec, &self.instance_base, call).await;
            effects = self.belief.step(Input::Answered(outcome));
        }
    }

    fn carry_out(&mut self, myself: &ActorRef<LeaseMsg>, effect: MachineEffect) {
        match effect {
            // Emitted by the step itself, in order, before any other effect.
            Effect::Emit(_) => {}
            Effect::ReplyAcquire { to, answer } => {
                let _ = to.send(answer);
            }
            Effect::ReplyRelease { to, answer } => match to {
                ReleaseCaller::Port(port) => {
                    let _ = port.send(answer);
                }
                ReleaseCaller::Stop => {
                    if let Err(e) = answer {
                        tracing::warn!(lease = %self.spec.name, error = %e, "release on stop failed; the grant expires after its ttl");
                    }
                }
            },
            Effect::Arm { timer, at } => {
                let at = self.belief.clock().to_tokio(at);
                let (slot, msg): (_, fn() -> LeaseMsg) = match timer {
                    Timer::Retry => (&mut self.retry_timer, || LeaseMsg::RetryAcquire),
                    Timer::Poll => (&mut self.poll_timer, || LeaseMsg::PreemptPoll),
                };
                stop(slot);
                *slot = Some(schedule(myself, at, msg));
            }
            Effect::Disarm(Timer::Retry) => stop(&mut self.retry_timer),
            Effect::Disarm(Timer::Poll) => stop(&mut self.poll_timer),
            Effect::ArmRenewal { generation } => {
                stop(&mut self.renew_timer);
                let at = self.spec.batcher.next_tick(Instant::now());
                self.renew_timer = Some(schedule(myself, at, move || LeaseMsg::RenewDue {
                    generation,
                }));
            }
            Effect::DisarmRenewal => stop(&mut self.renew_timer),
            Effect::StartWatchdog { generation } => {
                stop(&mut self.watchdog);
                let belief = self.belief.clone();
                self.watchdog = Some(tokio::spawn(async move {
                    // Independent of the mailbox, so a slow store call or a long queue cannot
                    // delay the loss past the deadline. The holder clock wakes it shortly
                    // after a host suspend that passed the deadline, which a monotonic timer
                    // would not.
                    let clock = belief.clock().clone();
                    while let Some(wake) = belief.watchdog_wake(generation) {
                        clock.sleep_until(wake).await;
                        belief.deadline();
                    }
                }));
            }
            Effect::StopWatchdog => stop(&mut self.watchdog),
            Effect::Renew { generation, token } => {
                let answer = self.spec.batcher.renew(HeldLease {
                    name: self.spec.store_name.clone(),
                    token,
                });
                let me = myself.clone();
                tokio::spawn(async move {
                    let answer: Option<RenewAnswer> = answer.await.ok();
                    let _ = me.cast(LeaseMsg::RenewDone { generation, answer });
                });
            }
            Effect::Call(call) | Effect::Detach(call) => {
                // Not reached for `Call` (fed back by `feed`); a detached call while the
                // actor lives runs in the background.
                let spec = self.spec.clone();
                let base = self.instance_base.clone();
                tokio::spawn(async move {
                    execute(&spec, &base, call).await;
                });
            }
        }
    }
}

/// Casts `msg()` to `myself` at `at` (tokio's clock).
fn schedule(
    myself: &ActorRef<LeaseMsg>,
    at: Instant,
    msg: impl FnOnce() -> LeaseMsg + Send + 'static,
) -> JoinHandle<()> {
    let me = myself.clone();
    tokio::spawn(async move {
        tokio::time::sleep_until(at).await;
        let _ = me.cast(msg());
    })
}

impl Actor for LeaseActor {
    type Msg = LeaseMsg;
    type State = LeaseActorState;
    type Arguments = LeaseActorArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<LeaseMsg>,
        args: LeaseActorArgs,
    ) -> Result<LeaseActorState, ActorProcessingErr> {
        Ok(LeaseActorState {
            spec: args.spec,
            belief: args.belief,
            instance_base: new_instance_base(),
            retry_timer: None,
            poll_timer: None,
            renew_timer: None,
            watchdog: None,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<LeaseMsg>,
        msg: LeaseMsg,
        state: &mut LeaseActorState,
    ) -> Result<(), ActorProcessingErr> {
        use tracing::Instrument;
        // One span per lease: every log line of its actor names the lease and its owner.
        let span = tracing::info_span!("lease", name = %state.spec.name, owner = %state.spec.owner);
        let input = match msg {
            LeaseMsg::Acquire { reply } => Input::Acquire { reply },
            LeaseMsg::TryAcquire(reply) => Input::TryAcquire { reply },
            LeaseMsg::RetryPace(pace) => Input::RetryPace(pace),
            LeaseMsg::SetNote(note) => {
                state.spec.note = note;
                return Ok(());
            }
            LeaseMsg::Release(reply) => Input::Release {
                reply: ReleaseCaller::Port(reply),
            },
            LeaseMsg::RetryAcquire => {
                state.retry_timer = None;
                Input::Timer(Timer::Retry)
            }
            LeaseMsg::PreemptPoll => {
                state.poll_timer = None;
                Input::Timer(Timer::Poll)
            }
            LeaseMsg::RenewDue { generation } => {
                state.renew_timer = None;
                Input::RenewDue { generation }
            }
            LeaseMsg::RenewDone { generation, answer } => Input::Renewed { generation, answer },
        };
        state.feed(&myself, input).instrument(span).await;
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<LeaseMsg>,
        state: &mut LeaseActorState,
    ) -> Result<(), ActorProcessingErr> {
        let release = Input::Release {
            reply: ReleaseCaller::Stop,
        };
        state.feed(&myself, release).await;
        Ok(())
    }
}
