//! The LeaseActor: the home of one lease's [machine]. The machine decides everything
//! (acquire and retry, the local deadline, renewals, suspension, loss, release,
//! preemption); its driver ([`crate::driver`]) feeds it inputs and carries out its effects:
//! store calls, renewals through the owner's [`RenewalBatcher`], timers and the watchdog
//! ([`crate::alarms`]), replies. This actor feeds the driver what reaches its mailbox
//! (commands of other senders, retry and poll timers); a [`Lease`](crate::Lease) handle
//! feeds its own commands on its caller's task. Renewals pass by the mailbox: their ticks
//! and answers are fed where they happen, so that no command, however slow its store call,
//! delays a renewal. The machine's events reach every output from one place
//! ([`SharedBelief`]).
//!
//! It releases when it stops: gracefully in `post_stop`, and from `Drop` of its state when
//! it is killed or fails (ractor skips `post_stop` then, e.g. when its supervisor dies).

use std::sync::Arc;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SpawnErr};
use tokio::time::Instant;
use tracing::Instrument;

use crate::driver::Driver;
use crate::error::{ConfigError, LeaseError};
use crate::events::{LeaseEventSink, LeaseState, LostCallback, SharedBelief};
use crate::machine::{self, Input, Machine, ReleaseScope, Timer};
use crate::names::{check_lease_name, store_name};
use crate::priority::AcquireOptions;
use crate::renewal::RenewalBatcher;
use crate::settings::LeaseSettings;
use crate::store::LeaseStore;
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
    /// `emergency` without the maximum priority, or priorities on a store without
    /// [`PreemptionRequests`](crate::PreemptionRequests).
    pub fn with_options(mut self, options: AcquireOptions) -> Result<Self, ConfigError> {
        options.validate(&*self.store)?;
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
    /// As `Release`, for a caller that acts on grants (starts work under a token): only a
    /// grant it has seen is released, one with a token at most `seen`. A grant won while
    /// this message waited behind an acquire attempt is kept and announced as usual
    /// (`LeaseGranted`), for the caller to act on or release then; trying stops either way.
    /// `Ok(true)` released, `Ok(false)` nothing seen was held, `Err` unknown.
    ReleaseSeen {
        /// The newest token the caller has seen (`None`: none).
        seen: Option<FencingToken>,
        /// Where to answer.
        reply: RpcReplyPort<Result<bool, LeaseError>>,
    },
    /// Keep this note with every later acquire (`None`: keep the store's). A held grant's
    /// note changes at its next acquire attempt (a `TryAcquire` re-enters at once), never
    /// at a renewal.
    SetNote(Option<String>),
    /// A store refused a write fenced by grant `0` because it is not the lease's current
    /// grant (a journal's append, a fenced write). If that is the grant believed, the
    /// belief ends at once, as when a renewal is answered that the lease is not held:
    /// `LeaseLost` with reason `NotHeld`, then nothing until the next acquire. Ignored for
    /// any other token (a grant already lost, or one never held).
    NotCurrent(FencingToken),
    #[doc(hidden)]
    RetryAcquire,
    #[doc(hidden)]
    PreemptPoll,
    /// Feed the commands a handle queued (see `crate::driver`).
    #[doc(hidden)]
    FeedQueued,
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

/// Arguments of a LeaseActor.
pub struct LeaseActorArgs {
    pub(crate) driver: Arc<Driver>,
}

/// A read-only view of a LeaseActor's belief, for `check_lease` without messaging it.
#[derive(Clone)]
pub struct LeaseView {
    belief: Arc<SharedBelief>,
    pub(crate) driver: Arc<Driver>,
}

impl LeaseView {
    /// `true` only while a grant is believed: before its local deadline minus the stop
    /// budget, and before any loss was announced. Never blocks and never talks to the store.
    /// One atomic load and one clock reading (`CLOCK_BOOTTIME` on the host).
    pub fn check_lease(&self) -> bool {
        self.belief.check()
    }

    /// `true` only while the grant with `token` is believed: as
    /// [`check_lease`](Self::check_lease), for that grant only. Never blocks.
    pub fn check_grant(&self, token: FencingToken) -> bool {
        self.belief.token() == Some(token)
    }

    /// The fencing token of the grant believed now. Never blocks.
    pub fn token(&self) -> Option<FencingToken> {
        self.belief.token()
    }

    /// The local deadline of the grant believed now, as an instant of tokio's clock (given
    /// the host suspends seen so far): whatever runs under it must have ended by then (the
    /// belief itself ends the stop budget earlier, and counts suspends as they happen).
    pub fn deadline(&self) -> Option<Instant> {
        self.belief
            .current()
            .map(|h| self.belief.clock().to_tokio(h.deadline))
    }

    /// The grant believed, even if its belief just ended: its token and local deadline on
    /// the [`holder_clock`](Self::holder_clock).
    pub(crate) fn held_grant(&self) -> Option<(FencingToken, Instant)> {
        self.belief.held().map(|h| (h.token, h.deadline))
    }

    /// The clock the lease's deadlines are measured on.
    pub(crate) fn holder_clock(&self) -> &crate::clock::HolderClock {
        self.belief.clock()
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
            LeaseState::Held | LeaseState::Suspended if !self.belief.check() => LeaseState::Lost,
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
        let machine = Machine::new(machine::Config {
            name: spec.name.clone(),
            owner: spec.owner.clone(),
            validity: spec.settings.validity(),
            stop_budget: spec.stop_budget,
            retry_interval: spec.settings.lease_retry_interval,
            options: spec.options.clone(),
            fair: spec.store.as_fair_queue().is_some()
                && spec.options == crate::AcquireOptions::default(),
        });
        let belief = Arc::new(SharedBelief::new(
            spec.name.clone(),
            spec.batcher.clock().clone(),
            machine,
            sink,
            spec.owner.clone(),
            spec.observer.clone(),
        ));
        let driver = Driver::new(spec, belief.clone());
        let args = LeaseActorArgs {
            driver: driver.clone(),
        };
        let (actor, _) = match supervisor {
            Some(sup) => Actor::spawn_linked(None, LeaseActor, args, sup).await?,
            None => Actor::spawn(None, LeaseActor, args).await?,
        };
        Ok((actor, LeaseView { belief, driver }))
    }
}

/// The state of a LeaseActor: the driver of its machine, shared with its handles.
pub struct LeaseActorState {
    driver: Arc<Driver>,
}

impl Drop for LeaseActorState {
    fn drop(&mut self) {
        // Reached without post_stop when the actor was killed or failed (and after
        // post_stop, when there is nothing left to do).
        self.driver.abandon();
    }
}

impl Actor for LeaseActor {
    type Msg = LeaseMsg;
    type State = LeaseActorState;
    type Arguments = LeaseActorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<LeaseMsg>,
        args: LeaseActorArgs,
    ) -> Result<LeaseActorState, ActorProcessingErr> {
        args.driver.started(myself);
        Ok(LeaseActorState {
            driver: args.driver,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<LeaseMsg>,
        msg: LeaseMsg,
        state: &mut LeaseActorState,
    ) -> Result<(), ActorProcessingErr> {
        let driver = &state.driver;
        let input = match msg {
            LeaseMsg::Acquire { reply } => Input::Acquire { reply },
            LeaseMsg::TryAcquire(reply) => Input::TryAcquire { reply },
            LeaseMsg::RetryPace(pace) => Input::RetryPace(pace),
            LeaseMsg::SetNote(note) => {
                let _ = driver.set_note(note);
                return Ok(());
            }
            LeaseMsg::Release(reply) => Input::Release {
                reply: ReleaseCaller::Port(reply),
                scope: ReleaseScope::Any,
            },
            LeaseMsg::ReleaseSeen { seen, reply } => Input::Release {
                reply: ReleaseCaller::Port(reply),
                scope: ReleaseScope::Seen(seen),
            },
            LeaseMsg::NotCurrent(token) => Input::NotCurrent { token },
            LeaseMsg::RetryAcquire => Input::Timer(Timer::Retry),
            LeaseMsg::PreemptPoll => Input::Timer(Timer::Poll),
            LeaseMsg::FeedQueued => {
                driver
                    .feed_queued()
                    .instrument(lease_span(driver.spec()))
                    .await;
                return Ok(());
            }
        };
        driver
            .feed(input)
            .instrument(lease_span(driver.spec()))
            .await;
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<LeaseMsg>,
        state: &mut LeaseActorState,
    ) -> Result<(), ActorProcessingErr> {
        let release = Input::Release {
            reply: ReleaseCaller::Stop,
            scope: ReleaseScope::Any,
        };
        state.driver.stop(release).await;
        Ok(())
    }
}

/// One span per lease: every log line of its driver names the lease and its owner.
pub(crate) fn lease_span(spec: &LeaseSpec) -> tracing::Span {
    tracing::info_span!("lease", name = %spec.name, owner = %spec.owner)
}
