//! The LeaseActor's decisions as a pure, synchronous state machine: every timing rule of a
//! holder (acquire and retry, the local deadline, renewals, suspension, loss, release,
//! reentrancy, cooperative preemption) is decided here, once, and nowhere else.
//!
//! The machine reads no clock, awaits nothing and does no I/O. Its driver (`crate::driver`,
//! fed by the LeaseActor and the `Lease` handle) turns messages, timer firings and store
//! answers into [`Input`]s, reads the holder clock ([`HolderClock`](crate::HolderClock),
//! which counts host suspend) once per input and passes it as `now`, and carries out the
//! [`Effect`]s the machine returns: store calls, timers, replies, and the [`Event`]s that
//! are the one stream every output of a lease (supervisor events, lost-callbacks,
//! observers, metrics, logs) derives from. Tests drive the machine directly with explicit
//! instants (`machine_tests`).
//!
//! # The driver's obligations
//!
//! - **One input at a time**, each with the holder clock read when it is handled, never
//!   earlier than the `now` of the input before it.
//! - **Events first, in order.** The [`Effect::Emit`]s of one step are emitted, in order and
//!   before any other effect of the step, without another step's events in between (the
//!   watchdog steps concurrently with the actor). A grant becomes visible to handles only
//!   once its [`Event::Granted`] was traced.
//! - **Awaited calls.** A step issues at most one [`Effect::Call`], as its last effect. The
//!   driver carries it out and feeds its answer as [`Input::Answered`] before any other
//!   command. (Commands that arrive meanwhile anyway are deferred by the machine and
//!   handled after the answer.) Renewal ticks and answers and the watchdog's deadlines are
//!   not commands: they may arrive at any time, also while a call is awaited, and the
//!   machine issues no call for them (so the driver feeds them without waiting for a
//!   command's call to be answered).
//! - **Timers.** [`Effect::Arm`] (re)arms a timer that later feeds [`Input::Timer`];
//!   [`Effect::Disarm`] cancels it. A late firing of a cancelled timer is harmless.
//! - **The watchdog.** [`Effect::StartWatchdog`] asks for a task independent of the mailbox
//!   that sleeps on the holder clock until [`Machine::watchdog_wake`] and then calls
//!   [`Machine::deadline`], for as long as that returns an instant: so a loss is announced by
//!   its deadline however slow the store or long the mailbox queue.
//!
//! # The timing argument
//!
//! See [`crate::validity`]: a grant or renewal request sent at `s` (the `now` of the step
//! that issued the call, or the batcher's send instant) is believed until
//! `s + ttl - safety margin - stop budget`, strictly before the store can grant it to
//! anyone else. An answer that arrives after that instant is never believed; an unknown
//! outcome leaves the grant "maybe in the store", so the next release looks for it.

mod preemption;

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::actor::{AcquireReply, Acquired};
use crate::duration::later;
use crate::error::LeaseError;
use crate::priority::AcquireOptions;
use crate::store::{AcquireOutcome, LeaseRecord, PreemptAnswer, PreemptionRequest, Renewal};
use crate::validity::{Belief, GrantEffect, Held, LostReason};

use crate::token::FencingToken;
use preemption::Asked;
pub(crate) use preemption::{Notices, Preempting};

/// The watchdog announces a loss this much before the belief ends, so that timer lateness
/// cannot push the announcement past it.
pub(crate) const WAKE_EARLY: Duration = Duration::from_millis(2);

/// How long after the store's expiry of another owner's grant a contender tries again
/// (the answer's `expires_in` was measured before the answer travelled back).
const EXPIRY_SLACK: Duration = Duration::from_millis(20);

/// How many times a release is sent before its caller hears the store's error: a release
/// that failed (a lost answer, a store briefly away) is sent again at once with the same
/// token, so that the next holder does not wait out the whole ttl. Each try is bounded by
/// `lease-operation-timeout`; `LeaseSettings::release_answer_timeout` covers them all.
pub(crate) const RELEASE_TRIES: u32 = 3;

/// What a machine needs to know of its lease: fixed for its life.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// The lease name, as errors and events name it.
    pub name: String,
    /// The owner (compared with the requester of a preemption request).
    pub owner: String,
    /// `heartbeat-timeout - safety-margin`: how long a grant or renewal is believed after
    /// its request was sent (less the stop budget).
    pub validity: Duration,
    /// How long before the local deadline the belief ends.
    pub stop_budget: Duration,
    /// `lease-retry-interval`: the pause between attempts while trying.
    pub retry_interval: Duration,
    /// Priority, preemption and cleanup options.
    pub options: AcquireOptions,
    /// Whether trying until granted waits in the store's fair queue before each attempt
    /// (the store keeps one, and the options ask for no preemption, which waiting in line
    /// behind the holder would never make).
    pub fair: bool,
}

/// A timer of the machine that fires at an instant it chooses (renewals follow the
/// owner's grid instead: [`Effect::ArmRenewal`]). Each is armed at most once at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// The next attempt while trying until granted.
    Retry,
    /// The next poll while waiting for a lower-priority holder (preemption).
    Poll,
}

/// A store call the driver carries out, bounded by `lease-operation-timeout`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Call {
    /// Try to acquire as this actor's holder instance number `instance` (with the spec's
    /// ttl, note and options). Answered with [`Outcome::Acquire`].
    Acquire { instance: u64 },
    /// Wait in the store's fair queue as holder instance `instance` until first in line and
    /// granted, or until the driver has other input to feed. Answered with
    /// [`Outcome::InLine`]; an attempt as the same instance follows whatever the answer.
    WaitInLine { instance: u64 },
    /// Release this actor's grant: `token` if known, else whatever grant of one of this
    /// actor's holder instances the store holds (the driver reads the record to find it).
    /// Answered with [`Outcome::Release`].
    Release { token: Option<FencingToken> },
    /// Record this owner's preemption request on the grant `token`. Answered with
    /// [`Outcome::Preempt`].
    RequestPreemption { token: FencingToken, forceful: bool },
    /// Take this owner's preemption request off the grant `token` (best effort). Answered
    /// with [`Outcome::Withdrawn`].
    WithdrawPreemption { token: FencingToken },
}

/// The answer to a [`Call`].
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    Acquire(Result<AcquireOutcome, LeaseError>),
    /// The wait in line ended: `Ok` granted or given up (other input to feed), `Err` the
    /// store failed.
    InLine(Result<(), LeaseError>),
    Release(Result<bool, LeaseError>),
    Preempt(Result<PreemptAnswer, LeaseError>),
    Withdrawn,
}

/// Which grant a release may end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseScope {
    /// Whatever grant is held.
    Any,
    /// Only a grant the caller has seen: token at most this one (`None`: none seen). A
    /// newer grant, won while the release waited behind an acquire attempt, is kept.
    Seen(Option<FencingToken>),
}

impl ReleaseScope {
    /// Whether a release in this scope ends the grant with `token`.
    pub fn covers(self, token: FencingToken) -> bool {
        match self {
            ReleaseScope::Any => true,
            ReleaseScope::Seen(seen) => seen.is_some_and(|s| token <= s),
        }
    }
}

/// One input of the machine. `A` answers acquire callers, `L` release callers.
#[derive(Debug)]
pub(crate) enum Input<A, L> {
    /// Keep trying until granted, then answer `reply` (at once if held already).
    Acquire { reply: Option<A> },
    /// One attempt, answered with its outcome (or a preemption's).
    TryAcquire { reply: A },
    /// While trying, retry every `pace` instead of the retry interval (`None`: back to it).
    RetryPace(Option<Duration>),
    /// Stop trying, give the belief up and release the grant (within `scope`); answer `reply`.
    Release { reply: L, scope: ReleaseScope },
    /// The actor is gone without a graceful stop (killed, failed): give everything up and
    /// clean up in the background.
    Abandon,
    /// A timer fired.
    Timer(Timer),
    /// The renewal timer of `generation` fired.
    RenewDue { generation: u64 },
    /// The answer to a renewal of `generation`: when its batch was sent and what the store
    /// said (`None`: the batcher is gone).
    Renewed {
        generation: u64,
        answer: Option<(Instant, Result<Renewal, LeaseError>)>,
    },
    /// The answer to the awaited [`Call`].
    Answered(Outcome),
    /// A store refused a write fenced by grant `token` because it is not the lease's
    /// current grant (a journal's append, a fenced write): the store's answer, as a
    /// renewal's `NotHeld` is.
    NotCurrent { token: FencingToken },
}

/// What the driver must do. See the module docs for the order.
#[derive(Debug)]
pub(crate) enum Effect<A, L> {
    /// Emit this event to every output of the lease.
    Emit(Event),
    /// Send `answer` to an acquire caller.
    ReplyAcquire { to: A, answer: AcquireReply },
    /// Send `answer` to a release caller.
    ReplyRelease {
        to: L,
        answer: Result<bool, LeaseError>,
    },
    /// (Re)arm `timer` to fire at `at` (a holder-clock instant).
    Arm { timer: Timer, at: Instant },
    /// (Re)arm the renewal timer of `generation` for the next tick of the owner's renewal
    /// grid (shared with the owner's other leases, so that their renewals share a round
    /// trip).
    ArmRenewal { generation: u64 },
    /// Cancel `timer`.
    Disarm(Timer),
    /// Cancel the renewal timer.
    DisarmRenewal,
    /// Start the watchdog of `generation`, replacing any other.
    StartWatchdog { generation: u64 },
    /// Stop the watchdog.
    StopWatchdog,
    /// Renew grant `token` through the owner's batcher; feed the answer as
    /// [`Input::Renewed`] for `generation`. Not awaited.
    Renew {
        generation: u64,
        token: FencingToken,
    },
    /// Carry out this store call and feed its answer as [`Input::Answered`]. Always the
    /// last effect of a step.
    Call(Call),
    /// Carry out this store call in the background; its answer is not fed back (the
    /// actor is gone).
    Detach(Call),
}

/// One event of a lease's life: the single stream its supervisor events, lost-callbacks,
/// observer traces, metrics and log lines all come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// An acquire request is about to be sent.
    AcquireInvoked,
    /// The store certainly refused: `holder` holds it.
    NotGranted { holder: String },
    /// A new grant is believed until `believed_until`; `deadline` is its local deadline.
    Granted {
        generation: u64,
        token: FencingToken,
        deadline: Instant,
    },
    /// A renewal was confirmed: the local deadline is now `deadline`.
    Renewed {
        token: FencingToken,
        deadline: Instant,
    },
    /// Renewals of grant `token` started failing with `error` (once per stretch).
    Suspended { token: FencingToken, error: String },
    /// A renewal of the suspended grant `token` succeeded.
    Resumed { token: FencingToken },
    /// The belief in grant `token` ended without a release (at most once per grant).
    /// `suspended`: it was suspended then.
    Lost {
        token: FencingToken,
        reason: LostReason,
        suspended: bool,
    },
    /// The belief in grant `token` was given up to release it.
    Released {
        token: FencingToken,
        suspended: bool,
    },
    /// The store answered a release of `token` (the believed one, or `None`: whatever
    /// grant of this actor's instances it holds): `released` is `Some(true)` when a grant
    /// was released, `Some(false)` when none was held, `None` when the outcome is unknown
    /// (the [`StoreError`](Event::StoreError) emitted just before names the error).
    ReleaseAnswered {
        token: Option<FencingToken>,
        released: Option<bool>,
    },
    /// A store call's outcome is unknown (error or timeout).
    StoreError {
        operation: &'static str,
        error: String,
    },
    /// Not granted (or unknown) while trying: the next attempt follows after the pace.
    Retrying { outcome: String },
    /// A higher-priority holder request is pending on grant `token`: announce it. Its
    /// `cleanup_deadline` is an instant of the holder clock.
    PreemptionRequested {
        token: FencingToken,
        request: PreemptionRequest,
        cleanup_deadline: Instant,
    },
    /// The announced request of `by` on grant `token` is gone.
    PreemptionWithdrawn { token: FencingToken, by: String },
    /// This requester outranks `holder` and starts asking it to give the lease up.
    PreemptionStarted {
        holder: String,
        holder_priority: u64,
        priority: u64,
    },
    /// This requester's request on `holder`'s grant was recorded.
    PreemptionRecorded { holder: String, forceful: bool },
    /// An acquire or request while preempting failed; polling goes on.
    PreemptionPolling { error: String },
    /// The renewal batcher is gone: no renewal answers come any more.
    RenewalsUnanswered,
}

/// Where the machine stands, for tests (its state is the fields of [`Machine`]; this names
/// their combination).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Nothing believed, nothing asked, nothing in flight.
    Idle,
    /// Trying to acquire: an attempt in flight, a retry pending, or waiting for a
    /// lower-priority holder.
    Acquiring,
    /// A grant is believed and renewals succeed.
    Held,
    /// A grant is believed and a renewal is in flight.
    Renewing,
    /// A grant is believed, renewals are failing, the deadline has not passed.
    Suspended,
    /// The last grant was lost and nothing is being tried.
    Lost,
    /// A release is in flight.
    Releasing,
}

/// Why an acquire attempt was made: decides what its outcome leads to.
#[derive(Debug)]
enum Purpose<A> {
    /// Trying until granted (`Acquire`, a retry).
    KeepTrying,
    /// One attempt for this caller.
    Try(A),
    /// A poll while preempting.
    Poll,
}

/// What happens once the awaited withdrawal of a preemption request is answered.
#[derive(Debug)]
pub(crate) enum AfterWithdraw<A, L> {
    /// End the preemption with this answer.
    Finish(AcquireReply),
    /// Go on releasing: cancel `cancelled` (the preemption's callers), then release.
    Release { reply: L, cancelled: Vec<A> },
}

/// The store call the machine awaits, and what it was for.
#[derive(Debug)]
enum Awaiting<A, L> {
    /// The acquire request sent at `sent_at`.
    Acquire {
        sent_at: Instant,
        purpose: Purpose<A>,
    },
    /// The wait in the store's fair queue before an attempt.
    InLine { purpose: Purpose<A> },
    /// The release of an ended instance's grant, before acquiring as a new instance.
    ReleaseEnded { purpose: Purpose<A> },
    /// The release of a grant answered too late to be believed.
    ReleaseTooLate { purpose: Purpose<A> },
    /// The release asked by `reply`, of `token`, sent `tries` times so far.
    Release {
        reply: L,
        token: Option<FencingToken>,
        tries: u32,
    },
    /// A preemption request.
    Request(Asked),
    /// A withdrawal of our preemption request.
    Withdraw(AfterWithdraw<A, L>),
}

/// This actor's holder instances: one per believed grant, so that a grant that ended is
/// never re-entered and the next one gets a new token.
#[derive(Debug, Default, Clone, Copy)]
struct Instances {
    /// `n` of the current instance: the one every acquire asks as, so that it re-enters
    /// its grant with the same token, also after an unknown outcome or when an operator's
    /// release made the store grant it anew. It moves on once a grant believed under it
    /// has ended (lost, released): nothing the old grant's holder still does (entities
    /// stopping, late writes) carries the new token.
    ///
    /// An instance whose belief ended is never believed again, not even on the answer to
    /// a request it sent before the end (a reentrant acquire in flight at the deadline):
    /// that grant is released and the next instance asks. This is how the machine tells
    /// the store it no longer believes, with no flag on the request: the store only ever
    /// sees a new instance, which cannot re-enter the old grant, and is granted anew, with
    /// a higher token, once the old grant is released or expired. So after a `Lost(T)`
    /// the next grant anyone is told of carries a token above `T`. The store's part is the
    /// SPI's rule that an expired grant asked for again, by its own instance too, is a new
    /// grant with a new token ([`AcquireRequest::step`](crate::AcquireRequest::step)).
    seq: u64,
    /// A grant under the current instance has been believed.
    believed: bool,
    /// A grant of ours may be in the store without being believed (an acquire with an
    /// unknown outcome, a grant that lapsed locally): release must look.
    maybe_in_store: bool,
}

/// The LeaseActor's decisions. `A` answers acquire callers, `L` release callers.
#[derive(Debug)]
pub(crate) struct Machine<A, L> {
    cfg: Config,
    /// The grant believed, and the deadline arithmetic.
    belief: Belief,
    /// The generation whose renewals are failing, while it is suspended.
    suspended: Option<u64>,
    /// The last grant ended by a loss, and nothing was granted or released since.
    lost: bool,
    instances: Instances,
    /// Asked to keep trying until granted.
    wanted: bool,
    /// `Acquire` callers waiting for the grant.
    waiters: Vec<A>,
    /// Retry pause while trying (`None`: `lease-retry-interval`).
    retry_pace: Option<Duration>,
    retry_armed: bool,
    /// A renewal is in flight.
    renewing: bool,
    /// The holder's record from the last "held by another owner" answer.
    last_held: Option<LeaseRecord>,
    /// Waiting for a lower-priority holder (requester side of preemption).
    preempting: Option<Preempting<A>>,
    /// Preemption requests announced on the current grant (holder side).
    notices: Notices,
    awaiting: Option<Awaiting<A, L>>,
    /// Commands that arrived while a call was awaited.
    deferred: VecDeque<Input<A, L>>,
}

/// The effects of one step, collected in order.
type Out<A, L> = Vec<Effect<A, L>>;

impl<A, L> Machine<A, L> {
    /// A machine that holds nothing and does nothing until asked to acquire.
    pub(crate) fn new(cfg: Config) -> Self {
        Machine {
            belief: Belief::new(cfg.validity, cfg.stop_budget),
            cfg,
            suspended: None,
            lost: false,
            instances: Instances {
                seq: 1,
                ..Instances::default()
            },
            wanted: false,
            waiters: Vec::new(),
            retry_pace: None,
            retry_armed: false,
            renewing: false,
            last_held: None,
            preempting: None,
            notices: Notices::default(),
            awaiting: None,
            deferred: VecDeque::new(),
        }
    }

    /// The grant believed at `now`: not once its belief has ended (deadline minus stop
    /// budget), even if the loss was not announced yet.
    pub(crate) fn current(&self, now: Instant) -> Option<Held> {
        self.belief.current(now)
    }

    /// The grant believed, ignoring whether its belief has ended yet.
    pub(crate) fn held(&self) -> Option<Held> {
        self.belief.held()
    }

    /// Whether a store call is awaited (only its answer may be fed as a command).
    #[cfg(test)]
    pub(crate) fn awaiting(&self) -> bool {
        self.awaiting.is_some()
    }

    /// The phase at `now` (see [`Phase`]).
    #[cfg(test)]
    pub(crate) fn phase(&self, now: Instant) -> Phase {
        if matches!(self.awaiting, Some(Awaiting::Release { .. })) {
            return Phase::Releasing;
        }
        if let Some(h) = self.belief.current(now) {
            return match self.suspended {
                Some(g) if g == h.generation => Phase::Suspended,
                _ if self.renewing => Phase::Renewing,
                _ => Phase::Held,
            };
        }
        if self.wanted || self.preempting.is_some() || self.awaiting.is_some() {
            Phase::Acquiring
        } else if self.lost || self.belief.held().is_some() {
            // A belief that ended and whose loss the watchdog has yet to announce is lost.
            Phase::Lost
        } else {
            Phase::Idle
        }
    }

    /// When the watchdog of `generation` must wake next (a holder-clock instant), or `None`
    /// once that grant is no longer held: then the watchdog ends.
    pub(crate) fn watchdog_wake(&self, generation: u64) -> Option<Instant> {
        self.belief
            .held()
            .filter(|h| h.generation == generation)
            .map(|h| {
                let end = h.believed_until;
                end.checked_sub(WAKE_EARLY).unwrap_or(end)
            })
    }

    /// Handles `input` at `now` (the holder clock's reading); returns what the driver must
    /// do, in order.
    pub(crate) fn handle(&mut self, now: Instant, input: Input<A, L>) -> Out<A, L> {
        // Room for the effects of most steps (a grant or a release with one caller).
        let mut out = Vec::with_capacity(8);
        self.step(now, input, &mut out);
        // Commands deferred while a call was awaited, now that it is answered.
        while self.awaiting.is_none()
            && let Some(next) = self.deferred.pop_front()
        {
            self.step(now, next, &mut out);
        }
        out
    }

    fn step(&mut self, now: Instant, input: Input<A, L>, out: &mut Out<A, L>) {
        let command = matches!(
            input,
            Input::Acquire { .. }
                | Input::TryAcquire { .. }
                | Input::RetryPace(_)
                | Input::Release { .. }
                | Input::Timer(_)
        );
        if command && self.awaiting.is_some() {
            self.deferred.push_back(input);
            return;
        }
        match input {
            Input::Acquire { reply } => self.acquire(now, reply, out),
            Input::TryAcquire { reply } => {
                let Some(reply) = self.join_preempting(reply) else {
                    return;
                };
                self.attempt(now, Purpose::Try(reply), out);
            }
            Input::RetryPace(pace) => {
                self.retry_pace = pace;
                if self.wanted && self.retry_armed {
                    self.arm_retry(now, out);
                }
            }
            Input::Release { reply, scope } => self.release(reply, scope, out),
            Input::Abandon => self.abandon(out),
            Input::Timer(Timer::Retry) => {
                self.retry_armed = false;
                if self.wanted {
                    self.keep_trying(now, out);
                }
            }
            Input::Timer(Timer::Poll) => {
                if self.preempting.is_some() {
                    self.attempt(now, Purpose::Poll, out);
                }
            }
            Input::RenewDue { generation } => self.renew_due(now, generation, out),
            Input::Renewed { generation, answer } => self.renewed(now, generation, answer, out),
            Input::Answered(outcome) => self.answered(now, outcome, out),
            Input::NotCurrent { token } => {
                if let Some(held) = self.belief.held().filter(|h| h.token == token) {
                    self.not_held(held.generation, LostReason::NotHeld, out);
                }
            }
        }
    }

    /// The watchdog woke at `now`: announces the loss of a grant whose belief ends within
    /// [`WAKE_EARLY`]. Only events come of it.
    pub(crate) fn deadline(&mut self, now: Instant) -> Vec<Event> {
        let mut out = Vec::new();
        self.lapse(now + WAKE_EARLY, &mut out);
        out.into_iter()
            .filter_map(|e| match e {
                Effect::Emit(event) => Some(event),
                _ => None,
            })
            .collect()
    }

    // --- acquiring ---

    fn acquire(&mut self, now: Instant, reply: Option<A>, out: &mut Out<A, L>) {
        if let Some(held) = self.belief.current(now) {
            if let Some(to) = reply {
                out.push(Effect::ReplyAcquire {
                    to,
                    answer: granted(held),
                });
            }
            return;
        }
        self.waiters.extend(reply);
        if !self.wanted {
            self.wanted = true;
            self.keep_trying(now, out);
        }
    }

    fn keep_trying(&mut self, now: Instant, out: &mut Out<A, L>) {
        if self.preempting.is_some() {
            // Its outcome answers the waiters or schedules the next try.
            return;
        }
        self.attempt(now, Purpose::KeepTrying, out);
    }

    fn pace(&self) -> Duration {
        self.retry_pace.unwrap_or(self.cfg.retry_interval)
    }

    fn arm_retry(&mut self, now: Instant, out: &mut Out<A, L>) {
        self.arm_retry_within(now, self.pace(), out);
    }

    fn arm_retry_within(&mut self, now: Instant, pace: Duration, out: &mut Out<A, L>) {
        self.retry_armed = true;
        out.push(Effect::Arm {
            timer: Timer::Retry,
            at: later(now, pace),
        });
    }

    fn disarm_retry(&mut self, out: &mut Out<A, L>) {
        self.retry_armed = false;
        out.push(Effect::Disarm(Timer::Retry));
    }

    /// One acquire attempt. The instance asked as is the current one while its grant is
    /// believed or was never believed; a new one once a believed grant ended. The ended
    /// grant, if the store may still keep it, is released first (otherwise the new instance
    /// would wait for it to expire); if that fails, it expires after its ttl.
    fn attempt(&mut self, now: Instant, purpose: Purpose<A>, out: &mut Out<A, L>) {
        if self.instances.believed && self.belief.current(now).is_none() {
            if self.instances.maybe_in_store {
                self.call(
                    Awaiting::ReleaseEnded { purpose },
                    Call::Release { token: None },
                    out,
                );
                return;
            }
            self.next_instance();
        }
        if self.cfg.fair
            && matches!(purpose, Purpose::KeepTrying)
            && self.belief.current(now).is_none()
        {
            // First come, first served among waiters: the attempt is made once this
            // instance is first in the store's line (the store grants it there).
            let instance = self.instances.seq;
            self.call(
                Awaiting::InLine { purpose },
                Call::WaitInLine { instance },
                out,
            );
            return;
        }
        self.send_acquire(now, purpose, out);
    }

    /// Whether a grant believed under the current instance has ended (lost, released): its
    /// requests in flight are answered for an instance that must not be believed again.
    fn instance_ended(&self) -> bool {
        self.instances.believed && self.belief.held().is_none()
    }

    fn next_instance(&mut self) {
        self.instances.seq += 1;
        self.instances.believed = false;
    }

    fn send_acquire(&mut self, now: Instant, purpose: Purpose<A>, out: &mut Out<A, L>) {
        out.push(Effect::Emit(Event::AcquireInvoked));
        let instance = self.instances.seq;
        self.call(
            Awaiting::Acquire {
                sent_at: now,
                purpose,
            },
            Call::Acquire { instance },
            out,
        );
    }

    fn call(&mut self, awaiting: Awaiting<A, L>, call: Call, out: &mut Out<A, L>) {
        self.awaiting = Some(awaiting);
        out.push(Effect::Call(call));
    }

    fn answered(&mut self, now: Instant, outcome: Outcome, out: &mut Out<A, L>) {
        let Some(awaiting) = self.awaiting.take() else {
            // Nothing was asked: a driver bug, harmless to ignore.
            return;
        };
        match (awaiting, outcome) {
            (Awaiting::Acquire { sent_at, purpose }, Outcome::Acquire(answer)) => {
                self.acquire_answered(now, sent_at, purpose, answer, out)
            }
            (Awaiting::InLine { purpose }, Outcome::InLine(answer)) => {
                // Granted in line, the attempt re-enters that grant (same instance) and
                // times it from its own request; otherwise it sees the holder as any
                // attempt does. A grant the line made is ours until that attempt answers.
                self.instances.maybe_in_store = true;
                if let Err(e) = answer {
                    out.push(store_error("acquire", &e));
                }
                self.send_acquire(now, purpose, out);
            }
            (Awaiting::ReleaseEnded { purpose }, Outcome::Release(answer)) => {
                match answer {
                    Ok(_) => self.instances.maybe_in_store = false,
                    Err(e) => out.push(store_error("release", &e)),
                }
                self.next_instance();
                self.send_acquire(now, purpose, out);
            }
            (Awaiting::ReleaseTooLate { purpose }, Outcome::Release(_)) => {
                // If that release failed, the grant expires after its ttl.
                let answer = Err(LeaseError::Timeout {
                    name: self.cfg.name.clone(),
                    operation: "acquire",
                    timeout: self.cfg.validity,
                });
                self.attempted(now, purpose, answer, out);
            }
            (
                Awaiting::Release {
                    reply,
                    token,
                    tries,
                },
                Outcome::Release(answer),
            ) => {
                match &answer {
                    Ok(_) => self.instances.maybe_in_store = false,
                    Err(e) => out.push(store_error("release", e)),
                }
                if answer.is_err() && tries < RELEASE_TRIES {
                    self.call(
                        Awaiting::Release {
                            reply,
                            token,
                            tries: tries + 1,
                        },
                        Call::Release { token },
                        out,
                    );
                    return;
                }
                out.push(Effect::Emit(Event::ReleaseAnswered {
                    token,
                    released: answer.as_ref().ok().copied(),
                }));
                out.push(Effect::ReplyRelease { to: reply, answer });
            }
            (Awaiting::Request(asked), Outcome::Preempt(answer)) => {
                self.request_answered(now, asked, answer, out)
            }
            (Awaiting::Withdraw(then), Outcome::Withdrawn) => self.withdrawn(now, then, out),
            (awaiting, _) => {
                // An answer to another call than the one awaited: a driver bug. Keep
                // waiting for the right one rather than guess.
                self.awaiting = Some(awaiting);
            }
        }
    }

    fn acquire_answered(
        &mut self,
        now: Instant,
        sent_at: Instant,
        purpose: Purpose<A>,
        answer: Result<AcquireOutcome, LeaseError>,
        out: &mut Out<A, L>,
    ) {
        // Anything but a certain "held by another owner" may have left a grant of ours.
        self.instances.maybe_in_store = !matches!(answer, Ok(AcquireOutcome::Held(_)));
        let reply = match answer {
            Err(e) => {
                out.push(store_error("acquire", &e));
                Err(e)
            }
            Ok(AcquireOutcome::Held(record)) => {
                out.push(Effect::Emit(Event::NotGranted {
                    holder: record.owner.clone(),
                }));
                if let Some(h) = self.belief.held() {
                    // We believed we held it, the store says another owner does.
                    self.not_held(h.generation, LostReason::NotHeld, out);
                }
                let reply = Ok((
                    Acquired::NotGranted {
                        holder: Some(record.owner.clone()),
                        priority: record.priority,
                    },
                    None,
                ));
                self.last_held = Some(record);
                reply
            }
            Ok(AcquireOutcome::Granted(record)) => {
                // A loss due meanwhile is announced first: it may end the asking instance.
                self.lapse(now, out);
                if self.instance_ended() {
                    // Asked before the loss, answered after it: the grant is the ended
                    // instance's (the lost one extended, or a new one if the store let it
                    // lapse). Believing it could bring the lost token back after its
                    // `Lost`; give it back and ask as the next instance instead.
                    self.call(
                        Awaiting::ReleaseEnded { purpose },
                        Call::Release {
                            token: Some(record.token),
                        },
                        out,
                    );
                    return;
                }
                match self.grant(now, record.token, sent_at, out) {
                    GrantEffect::New(held) => {
                        self.instances.believed = true;
                        self.notices = Notices::new(held.generation, sent_at);
                        self.renewing = false;
                        out.push(Effect::StartWatchdog {
                            generation: held.generation,
                        });
                        out.push(Effect::ArmRenewal {
                            generation: held.generation,
                        });
                        granted(held)
                    }
                    GrantEffect::Same(held) => granted(held),
                    GrantEffect::TooLate => {
                        // Granted, but the answer took longer than the validity: unusable.
                        // Give it back.
                        self.call(
                            Awaiting::ReleaseTooLate { purpose },
                            Call::Release {
                                token: Some(record.token),
                            },
                            out,
                        );
                        return;
                    }
                }
            }
        };
        self.attempted(now, purpose, reply, out);
    }

    /// Records a grant of `token` to a request sent at `sent_at`, announcing the loss of a
    /// belief that lapsed or was replaced behind our back first.
    fn grant(
        &mut self,
        now: Instant,
        token: FencingToken,
        sent_at: Instant,
        out: &mut Out<A, L>,
    ) -> GrantEffect {
        self.lapse(now, out);
        // A different token while one is believed: the believed grant ended behind our
        // back (released by an operator, taken over); announce its loss first.
        if let Some(h) = self.belief.held().filter(|h| h.token != token) {
            self.not_held(h.generation, LostReason::NotHeld, out);
        }
        let effect = self.belief.grant(token, sent_at, now);
        if let GrantEffect::New(held) = effect {
            self.suspended = None;
            self.lost = false;
            out.push(Effect::Emit(Event::Granted {
                generation: held.generation,
                token: held.token,
                deadline: held.deadline,
            }));
        }
        effect
    }

    /// What an attempt's `reply` leads to, given why it was made.
    fn attempted(
        &mut self,
        now: Instant,
        purpose: Purpose<A>,
        reply: AcquireReply,
        out: &mut Out<A, L>,
    ) {
        let is_granted = matches!(reply, Ok((Acquired::Granted { .. }, _)));
        match purpose {
            Purpose::KeepTrying => {
                // How long the store said the other owner's grant lasts unless renewed
                // (read before `preemptable` takes the record).
                let held_for = match (&reply, &self.last_held) {
                    (Ok((Acquired::NotGranted { .. }, _)), Some(r)) => Some(r.expires_in),
                    _ => None,
                };
                if is_granted {
                    self.wanted = false;
                    self.answer_waiters(&reply, out);
                } else if let Some(record) = self.preemptable() {
                    self.start_preempting(now, record, None, out);
                } else {
                    out.push(Effect::Emit(Event::Retrying {
                        outcome: format!("{reply:?}"),
                    }));
                    // A holder that stopped renewing (crashed, cut off) loses the grant when
                    // it expires: try again then, not up to a retry interval later. Only the
                    // timing of the next try changes; the store still decides.
                    let pace =
                        held_for.map_or(self.pace(), |left| self.pace().min(left + EXPIRY_SLACK));
                    self.arm_retry_within(now, pace, out);
                }
            }
            Purpose::Try(to) => {
                if matches!(reply, Ok((Acquired::NotGranted { .. }, _)))
                    && let Some(record) = self.preemptable()
                {
                    self.start_preempting(now, record, Some(to), out);
                    return;
                }
                if is_granted && self.wanted {
                    self.wanted = false;
                    self.disarm_retry(out);
                    self.answer_waiters(&reply, out);
                }
                out.push(Effect::ReplyAcquire { to, answer: reply });
            }
            Purpose::Poll => self.polled(now, reply, out),
        }
    }

    fn answer_waiters(&mut self, reply: &AcquireReply, out: &mut Out<A, L>) {
        for to in self.waiters.drain(..) {
            out.push(Effect::ReplyAcquire {
                to,
                answer: reply.clone(),
            });
        }
    }

    // --- holding ---

    fn renew_due(&mut self, now: Instant, generation: u64, out: &mut Out<A, L>) {
        let Some(held) = self
            .belief
            .current(now)
            .filter(|h| h.generation == generation)
        else {
            // Lost or released: no more renewals of it.
            return;
        };
        if !self.renewing {
            self.renewing = true;
            out.push(Effect::Renew {
                generation,
                token: held.token,
            });
        }
        out.push(Effect::ArmRenewal { generation });
    }

    fn renewed(
        &mut self,
        now: Instant,
        generation: u64,
        answer: Option<(Instant, Result<Renewal, LeaseError>)>,
        out: &mut Out<A, L>,
    ) {
        self.renewing = false;
        match answer {
            Some((sent_at, Ok(Renewal::Renewed { request }))) => {
                if self.extend(now, generation, sent_at, out) {
                    self.observe_request(now, generation, request, sent_at, out);
                }
            }
            Some((_, Ok(Renewal::NotHeld))) => self.not_held(generation, LostReason::NotHeld, out),
            Some((sent_at, Ok(Renewal::Refused(request)))) => {
                // Announced first if no renewal showed it (forceful at once).
                self.observe_request(now, generation, Some(request), sent_at, out);
                self.not_held(generation, LostReason::Preempted, out);
            }
            Some((_, Err(e))) => {
                out.push(store_error("renew", &e));
                self.renewal_failed(now, generation, e.to_string(), out);
            }
            None => out.push(Effect::Emit(Event::RenewalsUnanswered)),
        }
    }

    /// A renewal of `generation` sent at `sent_at` succeeded: extends the belief, or
    /// announces its loss if it lapsed meanwhile. Returns whether it was extended.
    fn extend(
        &mut self,
        now: Instant,
        generation: u64,
        sent_at: Instant,
        out: &mut Out<A, L>,
    ) -> bool {
        if !self.belief.renewed(generation, sent_at, now) {
            self.lapse(now, out);
            return false;
        }
        let Some(held) = self.belief.held() else {
            return false;
        };
        out.push(Effect::Emit(Event::Renewed {
            token: held.token,
            deadline: held.deadline,
        }));
        if self.suspended == Some(generation) {
            self.suspended = None;
            out.push(Effect::Emit(Event::Resumed { token: held.token }));
        }
        true
    }

    /// A renewal of `generation` failed with `error` (outcome unknown): the grant, if still
    /// believed, is suspended (announced once per stretch of failures).
    fn renewal_failed(
        &mut self,
        now: Instant,
        generation: u64,
        error: String,
        out: &mut Out<A, L>,
    ) {
        let Some(held) = self
            .belief
            .current(now)
            .filter(|h| h.generation == generation)
        else {
            return;
        };
        if self.suspended == Some(generation) {
            return;
        }
        self.suspended = Some(generation);
        out.push(Effect::Emit(Event::Suspended {
            token: held.token,
            error,
        }));
    }

    /// Ends a belief due to end at `now`, announcing its loss.
    fn lapse(&mut self, now: Instant, out: &mut Out<A, L>) {
        if let Some(held) = self.belief.expire_due(now) {
            self.announce_lost(held, LostReason::Expired, out);
        }
    }

    /// Ends `generation` for `reason`, announcing its loss (if it is still believed).
    fn not_held(&mut self, generation: u64, reason: LostReason, out: &mut Out<A, L>) {
        if let Some(held) = self.belief.not_held(generation) {
            self.announce_lost(held, reason, out);
        }
    }

    fn announce_lost(&mut self, held: Held, reason: LostReason, out: &mut Out<A, L>) {
        let suspended = self.suspended.take().is_some();
        self.lost = true;
        out.push(Effect::Emit(Event::Lost {
            token: held.token,
            reason,
            suspended,
        }));
    }

    /// Gives the belief up voluntarily (release, stop); returns what was held.
    fn give_up(&mut self, out: &mut Out<A, L>) -> Option<Held> {
        let held = self.belief.give_up();
        if let Some(h) = held {
            let suspended = self.suspended.take().is_some();
            self.lost = false;
            out.push(Effect::Emit(Event::Released {
                token: h.token,
                suspended,
            }));
        }
        held
    }

    // --- releasing ---

    fn release(&mut self, reply: L, scope: ReleaseScope, out: &mut Out<A, L>) {
        self.wanted = false;
        if let Some(h) = self.belief.held()
            && !scope.covers(h.token)
        {
            // Won after the caller decided to release (its release waited behind the
            // attempt): the caller hears of it as a grant and decides on it then, so that a
            // grant it already acts on is never ended under it.
            self.retry_armed = false;
            out.push(Effect::Disarm(Timer::Retry));
            out.push(Effect::ReplyRelease {
                to: reply,
                answer: Ok(false),
            });
            return;
        }
        if let Some(p) = self.preempting.take() {
            out.push(Effect::Disarm(Timer::Poll));
            let target = p.target;
            self.call(
                Awaiting::Withdraw(AfterWithdraw::Release {
                    reply,
                    cancelled: p.replies,
                }),
                Call::WithdrawPreemption { token: target },
                out,
            );
            return;
        }
        self.release_grant(reply, Vec::new(), out);
    }

    /// Releasing, once a preemption under way (whose callers are `cancelled`) was
    /// withdrawn.
    fn release_grant(&mut self, reply: L, cancelled: Vec<A>, out: &mut Out<A, L>) {
        for to in cancelled.into_iter().chain(self.waiters.drain(..)) {
            out.push(Effect::ReplyAcquire {
                to,
                answer: Err(LeaseError::Cancelled {
                    name: self.cfg.name.clone(),
                }),
            });
        }
        self.retry_armed = false;
        out.push(Effect::Disarm(Timer::Retry));
        out.push(Effect::DisarmRenewal);
        out.push(Effect::StopWatchdog);
        let held = self.give_up(out);
        if held.is_none() && !self.instances.maybe_in_store {
            out.push(Effect::ReplyRelease {
                to: reply,
                answer: Ok(false),
            });
            return;
        }
        let token = held.map(|h| h.token);
        self.call(
            Awaiting::Release {
                reply,
                token,
                tries: 1,
            },
            Call::Release { token },
            out,
        );
    }

    fn abandon(&mut self, out: &mut Out<A, L>) {
        // A preemption's callers are dropped: they learn the actor is gone.
        if let Some(p) = self.preempting.take() {
            out.push(Effect::Detach(Call::WithdrawPreemption { token: p.target }));
        }
        self.wanted = false;
        self.waiters.clear();
        if matches!(
            self.awaiting,
            Some(Awaiting::Acquire { .. } | Awaiting::InLine { .. })
        ) {
            // Gone while an acquire was in flight: its outcome is unknown, so maybe granted.
            self.instances.maybe_in_store = true;
        }
        self.awaiting = None;
        self.deferred.clear();
        // Reached without a graceful release: release in the background so the lease does
        // not stay blocked for a whole ttl (a successor instance of the same owner waits
        // for it). The release names this actor's token or instances, so it can only ever
        // remove this actor's own grant.
        let held = self.give_up(out);
        if held.is_some() || self.instances.maybe_in_store {
            out.push(Effect::Detach(Call::Release {
                token: held.map(|h| h.token),
            }));
        }
    }
}

fn granted(held: Held) -> AcquireReply {
    Ok((
        Acquired::Granted { token: held.token },
        Some(held.generation),
    ))
}

fn store_error<A, L>(operation: &'static str, e: &LeaseError) -> Effect<A, L> {
    Effect::Emit(Event::StoreError {
        operation,
        error: e.to_string(),
    })
}
