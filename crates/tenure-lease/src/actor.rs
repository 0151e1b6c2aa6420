//! The LeaseActor: the one place where lease timing lives. It acquires (once, or retrying
//! every `lease-retry-interval` until granted), renews on its owner's heartbeat grid through
//! the [`RenewalBatcher`], keeps the local deadline with a watchdog task that does not
//! depend on the mailbox, tells its sink `LeaseGranted` / `LeaseLost`, and releases when it
//! stops: gracefully in `post_stop`, and from `Drop` of its state when it is killed or
//! fails (ractor skips `post_stop` then, e.g. when its supervisor dies).

mod preemption;

use std::sync::Arc;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SpawnErr};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{ConfigError, LeaseError};
use crate::events::{LeaseEventSink, LeaseState, SharedBelief};
use crate::names::{check_lease_name, store_name};
use crate::priority::AcquireOptions;
use crate::renewal::{RenewAnswer, RenewalBatcher};
use crate::settings::LeaseSettings;
use crate::store::{
    AcquireOutcome, AcquireRequest, HeldLease, LeaseRecord, LeaseStore, Renewal, bounded,
};
use crate::trace::{LeaseObserver, LeaseTrace};
use crate::validity::{Belief, GrantEffect, Held};

/// Everything a LeaseActor needs to hold one lease.
#[derive(Clone)]
pub struct LeaseSpec {
    /// The lease name as users give it.
    pub name: String,
    /// The name under which the store holds it (sanitised when needed).
    pub store_name: String,
    /// The owner (a cluster node's `host:port`).
    pub owner: String,
    pub store: Arc<dyn LeaseStore>,
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
    Granted { token: u64 },
    /// Another owner holds it (named when the store said who) with a priority at least
    /// this requester's (0 on stores without priorities).
    NotGranted {
        holder: Option<String>,
        priority: u64,
    },
}

/// How long after the store's expiry of another owner's grant a contender tries again
/// (its answer's `expires_in` was measured before the answer travelled back).
const EXPIRY_SLACK: std::time::Duration = std::time::Duration::from_millis(20);

/// An acquire answer and, when granted, the generation of the grant.
pub type AcquireReply = Result<(Acquired, Option<u64>), LeaseError>;

/// Messages of the LeaseActor. Only the first four are for users.
pub enum LeaseMsg {
    /// Keep trying (every `lease-retry-interval`) until granted, then announce
    /// `LeaseGranted` and answer `reply` if given. A no-op answer if held already.
    Acquire {
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
    pub fn token(&self) -> Option<u64> {
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

    pub(crate) fn held(&self) -> Option<Held> {
        self.belief.held()
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
        let validity = spec.settings.validity();
        let observer = spec.observer.clone().map(|o| (spec.owner.clone(), o));
        let belief = Arc::new(SharedBelief::new(
            spec.name.clone(),
            spec.batcher.clock().clone(),
            Belief::new(validity, spec.stop_budget),
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

/// The watchdog announces a loss this much before the belief ends, so that timer lateness
/// cannot push the announcement past it.
const WAKE_EARLY: std::time::Duration = std::time::Duration::from_millis(2);

/// The state of a LeaseActor.
pub struct LeaseActorState {
    spec: LeaseSpec,
    belief: Arc<SharedBelief>,
    /// Prefix of this actor's holder instances (`<base>.<n>`): no other actor, process or
    /// node incarnation of the owner shares it, so none of them can take an unexpired grant
    /// of this actor's (the store refuses another instance like another owner).
    instance_base: String,
    /// `n` of the current instance: the one every acquire asks as, so that it re-enters its
    /// grant with the same token, also after an unknown outcome or when an operator's
    /// release made the store grant it anew. It moves on once a grant believed under it has
    /// ended (lost, released): the next grant then gets a new token, and nothing the old
    /// grant's holder still does (entities stopping, late writes) carries the new token.
    instance_seq: u64,
    /// A grant under the current instance has been believed.
    instance_believed: bool,
    /// A grant of ours may be in the store without being believed (an acquire with an
    /// unknown outcome, a grant that lapsed locally): release must look.
    maybe_in_store: bool,
    /// Asked to keep trying until granted.
    wanted: bool,
    /// Retry pause while trying (`None`: `lease-retry-interval`).
    retry_pace: Option<std::time::Duration>,
    waiters: Vec<RpcReplyPort<AcquireReply>>,
    retry_timer: Option<JoinHandle<()>>,
    renew_timer: Option<JoinHandle<()>>,
    watchdog: Option<JoinHandle<()>>,
    renew_in_flight: bool,
    /// The holder's record from the last "held by another owner" answer.
    last_held: Option<LeaseRecord>,
    /// Waiting for a lower-priority holder (requester side of preemption).
    preempting: Option<preemption::Preempting>,
    /// Preemption requests announced on the current grant (holder side).
    notices: preemption::Notices,
}

impl Drop for LeaseActorState {
    fn drop(&mut self) {
        for timer in [&self.retry_timer, &self.renew_timer, &self.watchdog]
            .into_iter()
            .flatten()
        {
            timer.abort();
        }
        // Reached without post_stop when the actor was killed or failed: release in the
        // background so the lease does not stay blocked for a whole ttl (a successor
        // instance of the same owner waits for it). The release names this instance's
        // token, so it can only ever remove this actor's own grant.
        if let Some(target) = self.abandon_preempting() {
            let spec = self.spec.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move { preemption::withdraw_request(&spec, target).await });
            }
        }
        let held = self.belief.give_up();
        if held.is_some() || self.maybe_in_store {
            let spec = self.spec.clone();
            let base = self.instance_base.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let released = release_ours(&spec, &base, held.map(|h| h.token)).await;
                    tracing::info!(lease = %spec.name, ?released, "released after the lease actor was killed");
                });
            }
        }
    }
}

/// Releases this actor's grant: the believed one (`token`), or else whatever grant of one
/// of this actor's instances (`<base>.<n>`) the store holds.
async fn release_ours(
    spec: &LeaseSpec,
    base: &str,
    token: Option<u64>,
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

async fn release_in_store(spec: &LeaseSpec, token: u64) -> Result<bool, LeaseError> {
    bounded(
        &spec.name,
        "release",
        spec.settings.lease_operation_timeout,
        spec.store.release(&spec.store_name, &spec.owner, token),
    )
    .await
}

impl LeaseActorState {
    fn stop_timer(timer: &mut Option<JoinHandle<()>>) {
        if let Some(t) = timer.take() {
            t.abort();
        }
    }

    fn schedule(
        &self,
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

    /// The instance the next acquire asks as: the current one while its grant is believed
    /// or was never believed; a new one once a believed grant ended. The ended grant, if
    /// the store may still keep it, is released first (otherwise the new instance would
    /// wait for it to expire); if that fails, it expires after its ttl.
    async fn instance_for_attempt(&mut self) -> String {
        if self.instance_believed && self.belief.current().is_none() {
            if self.maybe_in_store {
                match release_ours(&self.spec, &self.instance_base, None).await {
                    Ok(_) => self.maybe_in_store = false,
                    Err(e) => self.belief.trace(LeaseTrace::Error {
                        operation: "release",
                        error: e.to_string(),
                    }),
                }
            }
            self.instance_seq += 1;
            self.instance_believed = false;
        }
        format!("{}.{}", self.instance_base, self.instance_seq)
    }

    /// One acquire attempt, bounded by the operation timeout.
    async fn attempt(&mut self, myself: &ActorRef<LeaseMsg>) -> AcquireReply {
        let instance = self.instance_for_attempt().await;
        let spec = &self.spec;
        let request = AcquireRequest {
            name: spec.store_name.clone(),
            owner: spec.owner.clone(),
            instance,
            ttl: spec.settings.heartbeat_timeout,
            note: spec.note.clone(),
            priority: spec.options.priority,
            cleanup_timeout: spec.options.cleanup_timeout,
            emergency: spec.options.emergency,
        };
        // On the holder clock, which counts host suspend (see `crate::clock`).
        let sent_at = self.belief.clock().now();
        self.belief.trace(LeaseTrace::AcquireInvoked);
        let answer = bounded(
            &spec.name,
            "acquire",
            spec.settings.lease_operation_timeout,
            spec.store.try_acquire(&request),
        )
        .await;
        // Anything but a certain "held by another owner" may have left a grant of ours.
        self.maybe_in_store = !matches!(answer, Ok(AcquireOutcome::Held(_)));
        match answer {
            Err(e) => {
                self.belief.trace(LeaseTrace::Error {
                    operation: "acquire",
                    error: e.to_string(),
                });
                Err(e)
            }
            Ok(AcquireOutcome::Held(record)) => {
                self.belief.trace(LeaseTrace::NotGranted {
                    holder: record.owner.clone(),
                });
                if let Some(h) = self.belief.held() {
                    // We believed we held it, the store says another owner does.
                    self.belief.not_held(h.generation);
                }
                let reply = Acquired::NotGranted {
                    holder: Some(record.owner.clone()),
                    priority: record.priority,
                };
                self.last_held = Some(record);
                Ok((reply, None))
            }
            Ok(AcquireOutcome::Granted(record)) => {
                match self.belief.grant(record.token, sent_at) {
                    GrantEffect::New(held) => {
                        self.instance_believed = true;
                        self.notices = preemption::Notices::new(held.generation, sent_at);
                        self.on_new_grant(myself, held);
                        Ok((
                            Acquired::Granted { token: held.token },
                            Some(held.generation),
                        ))
                    }
                    GrantEffect::Same(held) => Ok((
                        Acquired::Granted { token: held.token },
                        Some(held.generation),
                    )),
                    GrantEffect::TooLate => {
                        // Granted, but the answer took longer than the validity: unusable.
                        // Give it back; if that fails it expires after its ttl.
                        let _ = release_in_store(&self.spec, record.token).await;
                        Err(LeaseError::Timeout {
                            name: self.spec.name.clone(),
                            operation: "acquire",
                            timeout: self.spec.settings.validity(),
                        })
                    }
                }
            }
        }
    }

    fn on_new_grant(&mut self, myself: &ActorRef<LeaseMsg>, held: Held) {
        Self::stop_timer(&mut self.watchdog);
        Self::stop_timer(&mut self.renew_timer);
        self.renew_in_flight = false;
        let belief = self.belief.clone();
        let generation = held.generation;
        self.watchdog = Some(tokio::spawn(async move {
            // Independent of the mailbox, so a slow store call or a long queue cannot delay
            // the loss past the deadline. The holder clock wakes it shortly after a host
            // suspend that passed the deadline, which a monotonic timer would not.
            let clock = belief.clock().clone();
            while let Some(h) = belief.held().filter(|h| h.generation == generation) {
                let end = h.believed_until;
                let wake = end.checked_sub(WAKE_EARLY).unwrap_or(end);
                clock.sleep_until(wake).await;
                belief.lapse(clock.now() + WAKE_EARLY);
            }
        }));
        let at = self.spec.batcher.next_tick(Instant::now());
        self.renew_timer =
            Some(self.schedule(myself, at, move || LeaseMsg::RenewDue { generation }));
    }

    fn answer_waiters(&mut self, reply: &AcquireReply) {
        for waiter in self.waiters.drain(..) {
            let _ = waiter.send(reply.clone());
        }
    }

    async fn keep_trying(&mut self, myself: &ActorRef<LeaseMsg>) {
        if self.preempting.is_some() {
            // Its outcome answers the waiters or schedules the next try.
            return;
        }
        let reply = self.attempt(myself).await;
        // How long the store said the other owner's grant lasts unless renewed.
        let held_for = match &reply {
            Ok((Acquired::NotGranted { .. }, _)) => self.last_held.as_ref().map(|r| r.expires_in),
            _ => None,
        };
        match &reply {
            Ok((Acquired::Granted { .. }, _)) => {
                self.wanted = false;
                self.answer_waiters(&reply);
            }
            _ if let Some(record) = self.preemptable() => {
                self.start_preempting(myself, record, None).await;
            }
            other => {
                tracing::debug!(lease = %self.spec.name, outcome = ?other, "acquire not granted; will retry");
                let pace = self
                    .retry_pace
                    .unwrap_or(self.spec.settings.lease_retry_interval);
                // A holder that stopped renewing (crashed, cut off) loses the grant when
                // it expires: try again then, not up to a retry interval later. Only the
                // timing of the next try changes; the store still decides.
                let pace = held_for.map_or(pace, |left| pace.min(left + EXPIRY_SLACK));
                let at = Instant::now() + pace;
                self.retry_timer = Some(self.schedule(myself, at, || LeaseMsg::RetryAcquire));
            }
        }
    }

    async fn release(&mut self) -> Result<bool, LeaseError> {
        self.wanted = false;
        self.stop_preempting().await;
        Self::stop_timer(&mut self.retry_timer);
        Self::stop_timer(&mut self.renew_timer);
        Self::stop_timer(&mut self.watchdog);
        for waiter in self.waiters.drain(..) {
            let _ = waiter.send(Err(LeaseError::Cancelled {
                name: self.spec.name.clone(),
            }));
        }
        let held = self.belief.give_up();
        if held.is_none() && !self.maybe_in_store {
            return Ok(false);
        }
        let released = release_ours(&self.spec, &self.instance_base, held.map(|h| h.token)).await;
        match &released {
            Ok(_) => self.maybe_in_store = false,
            Err(e) => self.belief.trace(LeaseTrace::Error {
                operation: "release",
                error: e.to_string(),
            }),
        }
        tracing::info!(lease = %self.spec.name, token = ?held.map(|h| h.token), ?released, "lease released");
        released
    }
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
            instance_seq: 1,
            instance_believed: false,
            maybe_in_store: false,
            wanted: false,
            waiters: Vec::new(),
            retry_pace: None,
            retry_timer: None,
            renew_timer: None,
            watchdog: None,
            renew_in_flight: false,
            last_held: None,
            preempting: None,
            notices: preemption::Notices::default(),
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
        on_message(myself, msg, state).instrument(span).await
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<LeaseMsg>,
        state: &mut LeaseActorState,
    ) -> Result<(), ActorProcessingErr> {
        if let Err(e) = state.release().await {
            tracing::warn!(lease = %state.spec.name, error = %e, "release on stop failed; the grant expires after its ttl");
        }
        Ok(())
    }
}

/// What the LeaseActor does with one message (inside its lease's span).
async fn on_message(
    myself: ActorRef<LeaseMsg>,
    msg: LeaseMsg,
    state: &mut LeaseActorState,
) -> Result<(), ActorProcessingErr> {
    match msg {
        LeaseMsg::Acquire { reply } => {
            if let Some(held) = state.belief.current() {
                if let Some(reply) = reply {
                    let _ = reply.send(Ok((
                        Acquired::Granted { token: held.token },
                        Some(held.generation),
                    )));
                }
                return Ok(());
            }
            state.waiters.extend(reply);
            if !state.wanted {
                state.wanted = true;
                state.keep_trying(&myself).await;
            }
        }
        LeaseMsg::RetryAcquire => {
            state.retry_timer = None;
            if state.wanted {
                state.keep_trying(&myself).await;
            }
        }
        LeaseMsg::TryAcquire(reply) => {
            let Some(reply) = state.join_preempting(reply) else {
                return Ok(());
            };
            let answer = state.attempt(&myself).await;
            if matches!(answer, Ok((Acquired::NotGranted { .. }, _)))
                && let Some(record) = state.preemptable()
            {
                state.start_preempting(&myself, record, Some(reply)).await;
                return Ok(());
            }
            if matches!(answer, Ok((Acquired::Granted { .. }, _))) && state.wanted {
                state.wanted = false;
                LeaseActorState::stop_timer(&mut state.retry_timer);
                state.answer_waiters(&answer);
            }
            let _ = reply.send(answer);
        }
        LeaseMsg::PreemptPoll => state.preempt_poll(&myself).await,
        LeaseMsg::RetryPace(pace) => {
            state.retry_pace = pace;
            if state.wanted && state.retry_timer.is_some() {
                LeaseActorState::stop_timer(&mut state.retry_timer);
                let at = Instant::now() + pace.unwrap_or(state.spec.settings.lease_retry_interval);
                state.retry_timer = Some(state.schedule(&myself, at, || LeaseMsg::RetryAcquire));
            }
        }
        LeaseMsg::Release(reply) => {
            let released = state.release().await;
            let _ = reply.send(released);
        }
        LeaseMsg::RenewDue { generation } => {
            state.renew_timer = None;
            let Some(held) = state
                .belief
                .current()
                .filter(|h| h.generation == generation)
            else {
                return Ok(());
            };
            if !state.renew_in_flight {
                state.renew_in_flight = true;
                let answer = state.spec.batcher.renew(HeldLease {
                    name: state.spec.store_name.clone(),
                    token: held.token,
                });
                let me = myself.clone();
                tokio::spawn(async move {
                    let answer = answer.await.ok();
                    let _ = me.cast(LeaseMsg::RenewDone { generation, answer });
                });
            }
            let at = state.spec.batcher.next_tick(Instant::now());
            state.renew_timer =
                Some(state.schedule(&myself, at, move || LeaseMsg::RenewDue { generation }));
        }
        LeaseMsg::RenewDone { generation, answer } => {
            state.renew_in_flight = false;
            match answer {
                Some((sent_at, Ok(Renewal::Renewed { request }))) => {
                    if state.belief.renewed(generation, sent_at) {
                        state.observe_request(generation, request, sent_at);
                    }
                }
                Some((_, Ok(Renewal::NotHeld))) => state.belief.not_held(generation),
                Some((sent_at, Ok(Renewal::Refused(request)))) => {
                    // Announced first if no renewal showed it (forceful at once).
                    state.observe_request(generation, Some(request), sent_at);
                    state.belief.preempted(generation);
                }
                Some((_, Err(e))) => {
                    state.belief.trace(LeaseTrace::Error {
                        operation: "renew",
                        error: e.to_string(),
                    });
                    state.belief.renewal_failed(generation, &e.to_string());
                }
                None => {
                    tracing::warn!(lease = %state.spec.name, "renewal batcher stopped")
                }
            }
        }
    }
    Ok(())
}
