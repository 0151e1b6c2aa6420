//! What a LeaseActor tells whoever uses the lease, and the one place it is told: the
//! [`SharedBelief`] holds the LeaseActor's [machine](crate::machine) and turns each of its
//! events into every output (supervisor events, lost-callbacks, history events, observer
//! traces, metrics, log lines, the state handles watch).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use crate::actor::{AcquireCaller, ReleaseCaller};
use crate::clock::HolderClock;
use crate::machine::{Effect, Event, Input, Machine};
use crate::published::Published;
use crate::token::FencingToken;
use crate::trace::{LeaseObserver, LeaseTrace};
use crate::validity::{Held, LostReason};

/// The lease was granted (announced once per grant, before any loss of it).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseGranted {
    /// The lease name.
    pub name: String,
    /// The fencing token of this grant: present it to guarded resources.
    pub token: FencingToken,
}

/// The holder no longer believes it holds the lease. Sent at most once per grant, never
/// before the grant was announced, and no later than the local deadline minus the lease's
/// stop budget: what runs under the grant must have terminated by the deadline itself.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseLost {
    /// The lease name.
    pub name: String,
    /// The token of the grant that was lost.
    pub token: FencingToken,
    /// Why the belief ended.
    pub reason: LostReason,
}

impl LeaseLost {
    /// The loss of the grant `token` of lease `name`, for `reason`: as a lease actor sends
    /// it (for test doubles and adapters that feed a supervisor's mailbox).
    pub fn new(name: impl Into<String>, token: FencingToken, reason: LostReason) -> Self {
        LeaseLost {
            name: name.into(),
            token,
            reason,
        }
    }
}

/// Renewals of a held grant are failing (an error or no answer within
/// `lease-operation-timeout`) while its local deadline has not passed: the grant may still
/// be held, or may be about to be lost. Act with care (Curator's SUSPENDED). Sent at most
/// once per stretch of failures, after the grant's `LeaseGranted`; followed by
/// [`LeaseResumed`] when a renewal succeeds again, or by [`LeaseLost`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseSuspended {
    /// The lease name.
    pub name: String,
    /// The token of the grant whose renewals fail.
    pub token: FencingToken,
    /// The failure that suspended it.
    pub error: String,
}

/// A renewal of a suspended grant succeeded: it is held again, with the same token.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseResumed {
    /// The lease name.
    pub name: String,
    /// The token of the grant, the same as before the suspension.
    pub token: FencingToken,
}

/// Where a lease stands, as its holder sees it (a [`Lease`](crate::Lease)'s
/// [`state`](crate::Lease::state) and [`watch_state`](crate::Lease::watch_state)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LeaseState {
    /// No grant: never acquired, released, or waiting to be granted.
    #[default]
    NotHeld,
    /// Granted, and renewals succeed: act under the grant's token.
    Held,
    /// Granted, but renewals have been failing since the last success; the local deadline
    /// has not passed. The grant is still ours until then: finish or pause risky work.
    Suspended,
    /// The grant was lost (expired, not held, preempted) and nothing was granted since.
    Lost,
}

/// A higher-priority owner asked the holder to give the lease up (cooperative
/// preemption): clean up and release before `cleanup_deadline`. Sent once per request
/// (requesting owner and priority) while the grant is held, after its `LeaseGranted`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PreemptionRequested {
    /// The lease name.
    pub name: String,
    /// The token of the grant asked for.
    pub token: FencingToken,
    /// The requesting owner.
    pub by: String,
    /// The requester's priority.
    pub priority: u64,
    /// The requester will not wait: renewals are refused once it is recorded forceful.
    pub forceful: bool,
    /// The requester's message, if any.
    pub note: Option<String>,
    /// The holder's own cleanup timeout counted from before the request can have been
    /// recorded (the last renewal that did not show it was sent): no requester gives up
    /// waiting, or turns forceful, earlier than this instant (of tokio's clock, given the
    /// host suspends seen when the request was announced).
    pub cleanup_deadline: Instant,
}

/// The pending preemption request announced by [`PreemptionRequested`] is gone while the
/// grant is still held: withdrawn by its requester (it gave up waiting) or overtaken by
/// another (announced next).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PreemptionWithdrawn {
    /// The lease name.
    pub name: String,
    /// The token of the grant the request was about.
    pub token: FencingToken,
    /// The owner whose request is gone.
    pub by: String,
}

/// An event of a lease's life, as delivered to its [`LeaseEventSink`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEvent {
    /// See [`LeaseGranted`].
    Granted(LeaseGranted),
    /// See [`LeaseLost`].
    Lost(LeaseLost),
    /// See [`PreemptionRequested`].
    PreemptionRequested(PreemptionRequested),
    /// See [`PreemptionWithdrawn`].
    PreemptionWithdrawn(PreemptionWithdrawn),
    /// See [`LeaseSuspended`].
    Suspended(LeaseSuspended),
    /// See [`LeaseResumed`].
    Resumed(LeaseResumed),
}

/// Where a LeaseActor delivers its events. Called inline, in event order: it must not block.
#[derive(Clone)]
pub struct LeaseEventSink(Arc<dyn Fn(LeaseEvent) + Send + Sync>);

impl std::fmt::Debug for LeaseEventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseEventSink")
    }
}

impl LeaseEventSink {
    /// Delivers events to a closure.
    pub fn new(f: impl Fn(LeaseEvent) + Send + Sync + 'static) -> Self {
        LeaseEventSink(Arc::new(f))
    }

    /// Delivers events as messages to an actor (typically the LeaseActor's supervisor).
    pub fn to_actor<M>(actor: ractor::ActorRef<M>) -> Self
    where
        M: ractor::Message + From<LeaseEvent>,
    {
        LeaseEventSink::new(move |event| {
            if actor.cast(M::from(event)).is_err() {
                tracing::debug!(actor = ?actor.get_id(), "lease event for a stopped actor dropped");
            }
        })
    }

    /// Drops every event.
    pub fn ignore() -> Self {
        LeaseEventSink::new(|_| {})
    }

    pub(crate) fn deliver(&self, event: LeaseEvent) {
        (self.0)(event)
    }
}

/// The LeaseActor's machine, as its actor, its watchdog and its handles share it.
pub(crate) type LeaseMachine = Machine<AcquireCaller, ReleaseCaller>;

pub(crate) type LostCallback = Box<dyn FnOnce(LeaseLost) + Send>;

/// Lost-callbacks (of [`Lease::acquire_with_lost`](crate::Lease::acquire_with_lost) and
/// [`Grant`](crate::Grant)) waiting for the loss of the grant with their token.
#[derive(Default)]
struct LostCallbacks {
    /// The highest token whose loss was announced.
    lost_up_to: Option<FencingToken>,
    waiting: Vec<(FencingToken, LostCallback)>,
    last_lost: Option<LeaseLost>,
}

/// The machine of a LeaseActor, shared by the actor (which feeds it messages and store
/// answers), its watchdog (which feeds it deadlines) and its handles (which read the
/// belief), together with the one place its events are emitted.
///
/// Every step, and the emission of its events, happens under `order`, so events reach
/// every output in transition order, also when the watchdog steps while the actor awaits a
/// store call. Outputs are called outside the machine's own lock: a sink or callback may
/// call `check_lease`. Instants are on `clock` (the holder clock, which counts host
/// suspend).
pub(crate) struct SharedBelief {
    name: String,
    clock: HolderClock,
    machine: Mutex<LeaseMachine>,
    order: Mutex<()>,
    sink: LeaseEventSink,
    /// The owner the lease is held for, as its traces name it.
    owner: String,
    /// Where traces are also reported, if anywhere.
    observer: Option<LeaseObserver>,
    /// The state published to handles; changed only under `order`.
    state: tokio::sync::watch::Sender<LeaseState>,
    /// The newest generation whose grant was traced: handles see a grant only from then
    /// on, so nothing acts under a grant before the history records it. (The machine
    /// believes a grant from the step that records it; its events are emitted right after,
    /// outside the machine's lock.)
    announced: AtomicU64,
    /// The announced grant believed, for checks that take no lock; published under `order`
    /// after every step, before the step's events are emitted.
    published: Published,
    lost: Mutex<LostCallbacks>,
}

impl SharedBelief {
    pub(crate) fn new(
        name: String,
        clock: HolderClock,
        machine: LeaseMachine,
        sink: LeaseEventSink,
        owner: String,
        observer: Option<LeaseObserver>,
    ) -> Self {
        SharedBelief {
            name,
            published: Published::new(clock.clone()),
            clock,
            machine: Mutex::new(machine),
            order: Mutex::new(()),
            sink,
            owner,
            observer,
            state: tokio::sync::watch::Sender::new(LeaseState::NotHeld),
            announced: AtomicU64::new(0),
            lost: Mutex::default(),
        }
    }

    /// Feeds `input` to the machine at the holder clock's now, emits the step's events, and
    /// hands its other effects, in order, to `carry_out`, before any other step: so the
    /// effects of steps fed from different tasks (a command's, a renewal's) are carried out
    /// in the order of the steps, and a timer armed for an ended grant never overrides one
    /// armed for a later grant. `carry_out` must not block.
    pub(crate) fn step<R>(
        &self,
        input: Input<AcquireCaller, ReleaseCaller>,
        carry_out: impl FnOnce(Vec<Effect<AcquireCaller, ReleaseCaller>>) -> R,
    ) -> R {
        let _order = self.ordered();
        let now = self.clock.now();
        let mut effects = self.machine().handle(now, input);
        self.publish_belief();
        for effect in effects.extract_if(.., |e| matches!(e, Effect::Emit(_))) {
            if let Effect::Emit(event) = effect {
                self.emit(event);
            }
        }
        carry_out(effects)
    }

    /// The watchdog woke: feeds the machine a deadline and emits what came of it.
    pub(crate) fn deadline(&self) {
        let _order = self.ordered();
        let now = self.clock.now();
        let events = self.machine().deadline(now);
        self.publish_belief();
        for event in events {
            self.emit(event);
        }
    }

    /// When the watchdog of `generation` must wake next (see
    /// [`Machine::watchdog_wake`](crate::machine::Machine::watchdog_wake)).
    pub(crate) fn watchdog_wake(&self, generation: u64) -> Option<Instant> {
        self.machine().watchdog_wake(generation)
    }

    /// The state last published.
    pub(crate) fn state(&self) -> LeaseState {
        *self.state.borrow()
    }

    /// The state now, and changes to come.
    pub(crate) fn watch_state(&self) -> tokio::sync::watch::Receiver<LeaseState> {
        self.state.subscribe()
    }

    /// The clock of this belief's instants.
    pub(crate) fn clock(&self) -> &HolderClock {
        &self.clock
    }

    fn machine(&self) -> std::sync::MutexGuard<'_, LeaseMachine> {
        self.machine.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ordered(&self) -> std::sync::MutexGuard<'_, ()> {
        self.order.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes the grant the machine believes, once its grant was traced, for
    /// [`check`](Self::check) and [`token`](Self::token). Called under `order`.
    fn publish_belief(&self) {
        let announced = self.announced.load(Ordering::SeqCst);
        let held = self.held().filter(|h| h.generation <= announced);
        self.published
            .publish(held.map(|h| (h.token, h.believed_until)));
    }

    /// Whether a grant is believed now, once its grant was traced: false once its loss was
    /// published or its belief's end passed on the holder clock. One atomic load and one
    /// clock reading; never blocks.
    pub(crate) fn check(&self) -> bool {
        self.published.held()
    }

    /// The token of the grant believed now (as [`check`](Self::check)).
    pub(crate) fn token(&self) -> Option<FencingToken> {
        self.published.token()
    }

    /// The grant believed now, if any, once its grant was traced. Never blocks on anything
    /// but a short critical section.
    pub(crate) fn current(&self) -> Option<Held> {
        let announced = self.announced.load(Ordering::SeqCst);
        self.machine()
            .current(self.clock.now())
            .filter(|h| h.generation <= announced)
    }

    /// The grant believed, even if its belief just ended and nobody announced it yet.
    pub(crate) fn held(&self) -> Option<Held> {
        self.machine().held()
    }

    /// Calls `cb` once the grant with `token` is lost (at once if it was already).
    pub(crate) fn on_lost(&self, token: FencingToken, cb: LostCallback) {
        let fire_now = {
            let mut slot = self.lost.lock().unwrap_or_else(|e| e.into_inner());
            if slot.lost_up_to.is_some_and(|t| t >= token) {
                slot.last_lost.clone().map(|ev| (ev, cb))
            } else {
                slot.waiting.push((token, cb));
                None
            }
        };
        if let Some((ev, cb)) = fire_now {
            cb(ev);
        }
    }

    /// Drops the lost-callbacks of the grant believed now (it is being released).
    pub(crate) fn forget_lost(&self) {
        let mut slot = self.lost.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = self.held() {
            slot.waiting.retain(|(t, _)| *t != h.token);
        }
    }

    fn publish(&self, state: LeaseState) {
        self.state.send_replace(state);
    }

    /// Reports `trace` to the metrics, the history and the observer, if any; `suspended`:
    /// the grant it ends was suspended.
    fn trace(&self, trace: LeaseTrace, suspended: bool) {
        crate::metrics::on_trace(&trace, suspended);
        crate::history::emit(&self.name, &self.owner, &trace);
        if let Some(observer) = &self.observer {
            observer.report(&self.name, &self.owner, &trace);
        }
    }

    /// The one place a lease's events reach its outputs. Called under `order`.
    fn emit(&self, event: Event) {
        let name = &self.name;
        match event {
            Event::AcquireInvoked => self.trace(LeaseTrace::AcquireInvoked, false),
            Event::NotGranted { holder } => self.trace(LeaseTrace::NotGranted { holder }, false),
            Event::Granted {
                generation,
                token,
                deadline,
            } => {
                tracing::info!(lease = %name, token = token.get(), "lease granted");
                // The trace first: whoever learns of the grant (handles, state watchers, the
                // sink) acts after it, so a history never shows an action under a grant
                // before the grant.
                let valid_until = self.clock.boottime_ns(deadline);
                self.trace(LeaseTrace::Granted { token, valid_until }, false);
                self.announced.fetch_max(generation, Ordering::SeqCst);
                self.publish_belief();
                self.publish(LeaseState::Held);
                self.sink.deliver(LeaseEvent::Granted(LeaseGranted {
                    name: name.clone(),
                    token,
                }));
            }
            Event::Renewed { token, deadline } => {
                let valid_until = self.clock.boottime_ns(deadline);
                self.trace(LeaseTrace::Renewed { token, valid_until }, false);
            }
            Event::Suspended { token, error } => {
                self.publish(LeaseState::Suspended);
                tracing::warn!(lease = %name, token = token.get(), %error, "lease suspended: renewals failing");
                let trace = LeaseTrace::Suspended {
                    token,
                    error: error.clone(),
                };
                self.trace(trace, true);
                self.sink.deliver(LeaseEvent::Suspended(LeaseSuspended {
                    name: name.clone(),
                    token,
                    error,
                }));
            }
            Event::Resumed { token } => {
                self.publish(LeaseState::Held);
                tracing::info!(lease = %name, token = token.get(), "lease resumed: a renewal succeeded");
                self.trace(LeaseTrace::Resumed { token }, false);
                self.sink.deliver(LeaseEvent::Resumed(LeaseResumed {
                    name: name.clone(),
                    token,
                }));
            }
            Event::Lost {
                token,
                reason,
                suspended,
            } => {
                tracing::warn!(lease = %name, token = token.get(), %reason, "lease lost");
                let kind = reason.kind();
                self.trace(
                    LeaseTrace::Lost {
                        token,
                        reason: kind,
                    },
                    suspended,
                );
                self.publish(LeaseState::Lost);
                let lost = LeaseLost {
                    name: name.clone(),
                    token,
                    reason,
                };
                self.sink.deliver(LeaseEvent::Lost(lost.clone()));
                self.call_lost_callbacks(lost);
            }
            Event::Released { token, suspended } => {
                self.trace(LeaseTrace::Released { token }, suspended);
                self.publish(LeaseState::NotHeld);
            }
            Event::ReleaseAnswered { token, released } => {
                tracing::info!(lease = %name, ?token, ?released, "lease released");
            }
            Event::StoreError { operation, error } => {
                self.trace(LeaseTrace::Error { operation, error }, false);
            }
            Event::Retrying { outcome } => {
                tracing::debug!(lease = %name, %outcome, "acquire not granted; will retry");
            }
            Event::PreemptionRequested {
                token,
                request,
                cleanup_deadline,
            } => {
                self.sink
                    .deliver(LeaseEvent::PreemptionRequested(PreemptionRequested {
                        name: name.clone(),
                        token,
                        by: request.by,
                        priority: request.priority,
                        forceful: request.forceful,
                        note: request.note,
                        cleanup_deadline: self.clock.to_tokio(cleanup_deadline),
                    }));
            }
            Event::PreemptionWithdrawn { token, by } => {
                self.sink
                    .deliver(LeaseEvent::PreemptionWithdrawn(PreemptionWithdrawn {
                        name: name.clone(),
                        token,
                        by,
                    }));
            }
            Event::PreemptionStarted {
                holder,
                holder_priority,
                priority,
            } => {
                tracing::info!(lease = %name, %holder, holder_priority, priority,
                    "asking the lower-priority holder to give the lease up");
            }
            Event::PreemptionRecorded { holder, forceful } => {
                tracing::info!(lease = %name, %holder, forceful, "preemption requested");
            }
            Event::PreemptionPolling { error } => {
                tracing::debug!(lease = %name, %error, "acquire or request while preempting failed; polling on");
            }
            Event::RenewalsUnanswered => {
                tracing::warn!(lease = %name, "renewal batcher stopped");
            }
        }
    }

    fn call_lost_callbacks(&self, lost: LeaseLost) {
        let due: Vec<LostCallback> = {
            let mut slot = self.lost.lock().unwrap_or_else(|e| e.into_inner());
            slot.lost_up_to = slot.lost_up_to.max(Some(lost.token));
            slot.last_lost = Some(lost.clone());
            let (due, keep) = std::mem::take(&mut slot.waiting)
                .into_iter()
                .partition(|(token, _)| *token <= lost.token);
            slot.waiting = keep;
            due.into_iter().map(|(_, cb)| cb).collect()
        };
        for cb in due {
            cb(lost.clone());
        }
    }
}
