//! What a LeaseActor tells whoever uses the lease, and the shared belief those events
//! are derived from.

use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use crate::clock::HolderClock;
use crate::trace::{LeaseObserver, LeaseTrace};
use crate::validity::{Belief, GrantEffect, Held, LostReason};

/// The lease was granted (announced once per grant, before any loss of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseGranted {
    /// The lease name.
    pub name: String,
    /// The fencing token of this grant: present it to guarded resources.
    pub token: u64,
}

/// The holder no longer believes it holds the lease. Sent at most once per grant, never
/// before the grant was announced, and no later than the local deadline minus the lease's
/// stop budget: what runs under the grant must have terminated by the deadline itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseLost {
    /// The lease name.
    pub name: String,
    /// The token of the grant that was lost.
    pub token: u64,
    /// Why the belief ended.
    pub reason: LostReason,
}

/// Renewals of a held grant are failing (an error or no answer within
/// `lease-operation-timeout`) while its local deadline has not passed: the grant may still
/// be held, or may be about to be lost. Act with care (Curator's SUSPENDED). Sent at most
/// once per stretch of failures, after the grant's `LeaseGranted`; followed by
/// [`LeaseResumed`] when a renewal succeeds again, or by [`LeaseLost`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSuspended {
    /// The lease name.
    pub name: String,
    /// The token of the grant whose renewals fail.
    pub token: u64,
    /// The failure that suspended it.
    pub error: String,
}

/// A renewal of a suspended grant succeeded: it is held again, with the same token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseResumed {
    /// The lease name.
    pub name: String,
    /// The token of the grant, the same as before the suspension.
    pub token: u64,
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
pub struct PreemptionRequested {
    /// The lease name.
    pub name: String,
    /// The token of the grant asked for.
    pub token: u64,
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
pub struct PreemptionWithdrawn {
    /// The lease name.
    pub name: String,
    /// The token of the grant the request was about.
    pub token: u64,
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

/// The belief shared by a LeaseActor, its watchdog and its handles. Every transition that
/// produces an event happens under `order`, so events reach the sink in transition order.
/// Its instants are on `clock` (the holder clock, which counts host suspend).
pub(crate) struct SharedBelief {
    name: String,
    clock: HolderClock,
    belief: Mutex<Belief>,
    order: Mutex<()>,
    sink: LeaseEventSink,
    /// The owner and observer that traces are reported to, if any.
    observer: Option<(String, LeaseObserver)>,
    /// The state published to handles; changed only under `order`.
    state: tokio::sync::watch::Sender<LeaseState>,
    /// The generation whose renewals are failing, while it is suspended.
    suspended: Mutex<Option<u64>>,
    /// The newest generation whose grant was traced: handles see a grant only from then
    /// on, so nothing acts under a grant before the history records it.
    announced: std::sync::atomic::AtomicU64,
}

impl SharedBelief {
    pub(crate) fn new(
        name: String,
        clock: HolderClock,
        belief: Belief,
        sink: LeaseEventSink,
        observer: Option<(String, LeaseObserver)>,
    ) -> Self {
        SharedBelief {
            name,
            clock,
            belief: Mutex::new(belief),
            order: Mutex::new(()),
            sink,
            observer,
            state: tokio::sync::watch::Sender::new(LeaseState::NotHeld),
            suspended: Mutex::new(None),
            announced: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The state last published.
    pub(crate) fn state(&self) -> LeaseState {
        *self.state.borrow()
    }

    /// The state now, and changes to come.
    pub(crate) fn watch_state(&self) -> tokio::sync::watch::Receiver<LeaseState> {
        self.state.subscribe()
    }

    fn publish(&self, state: LeaseState) {
        *self.suspended.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.state.send_replace(state);
    }

    /// A renewal of `generation` failed with `error` (outcome unknown): the grant, if still
    /// believed, is suspended (announced once per stretch of failures).
    pub(crate) fn renewal_failed(&self, generation: u64, error: &str) {
        let _order = self.ordered();
        let Some(held) = self
            .belief()
            .current(self.clock.now())
            .filter(|h| h.generation == generation)
        else {
            return;
        };
        let mut suspended = self.suspended.lock().unwrap_or_else(|e| e.into_inner());
        if *suspended == Some(generation) {
            return;
        }
        *suspended = Some(generation);
        drop(suspended);
        self.state.send_replace(LeaseState::Suspended);
        tracing::warn!(lease = %self.name, token = held.token, %error, "lease suspended: renewals failing");
        self.trace(LeaseTrace::Suspended {
            token: held.token,
            error: error.to_string(),
        });
        self.sink.deliver(LeaseEvent::Suspended(LeaseSuspended {
            name: self.name.clone(),
            token: held.token,
            error: error.to_string(),
        }));
    }

    /// The clock of this belief's instants.
    pub(crate) fn clock(&self) -> &HolderClock {
        &self.clock
    }

    /// Reports `trace` to the metrics and the observer, if any.
    pub(crate) fn trace(&self, trace: LeaseTrace) {
        let was_suspended = self
            .suspended
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        crate::metrics::on_trace(&trace, was_suspended);
        if let Some((owner, observer)) = &self.observer {
            observer.report(&self.name, owner, &trace);
        }
    }

    fn belief(&self) -> std::sync::MutexGuard<'_, Belief> {
        self.belief.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ordered(&self) -> std::sync::MutexGuard<'_, ()> {
        self.order.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn announce_lost(&self, held: Held, reason: LostReason) {
        tracing::warn!(lease = %self.name, token = held.token, %reason, "lease lost");
        self.trace(LeaseTrace::Lost {
            token: held.token,
            reason: reason.kind(),
        });
        self.publish(LeaseState::Lost);
        self.sink.deliver(LeaseEvent::Lost(LeaseLost {
            name: self.name.clone(),
            token: held.token,
            reason,
        }));
    }

    /// Announces the loss of a grant whose belief has ended at `now` (its deadline minus the
    /// stop budget). Returns whether one lapsed.
    pub(crate) fn lapse(&self, now: Instant) -> bool {
        let _order = self.ordered();
        let lapsed = self.belief().expire_due(now);
        if let Some(held) = lapsed {
            self.announce_lost(held, LostReason::Expired);
        }
        lapsed.is_some()
    }

    /// Records a grant answer; announces a new grant.
    pub(crate) fn grant(&self, token: u64, sent_at: Instant) -> GrantEffect {
        let now = self.clock.now();
        let _order = self.ordered();
        let (lapsed, replaced, effect) = {
            let mut b = self.belief();
            let lapsed = b.expire_due(now);
            // A different token while one is believed: the believed grant ended behind our
            // back (released by an operator, taken over); announce its loss first.
            let replaced = match b.held() {
                Some(h) if h.token != token => b.not_held(h.generation),
                _ => None,
            };
            (lapsed, replaced, b.grant(token, sent_at, now))
        };
        if let Some(held) = lapsed {
            self.announce_lost(held, LostReason::Expired);
        }
        if let Some(held) = replaced {
            self.announce_lost(held, LostReason::NotHeld);
        }
        if let GrantEffect::New(held) = effect {
            tracing::info!(lease = %self.name, token = held.token, "lease granted");
            // The trace first: whoever learns of the grant (state watchers, the sink) acts
            // after it, so a history never shows an action under a grant before the grant.
            self.trace(LeaseTrace::Granted {
                token: held.token,
                valid_until: self.clock.boottime_ns(held.deadline),
            });
            self.announced
                .fetch_max(held.generation, std::sync::atomic::Ordering::SeqCst);
            self.publish(LeaseState::Held);
            self.sink.deliver(LeaseEvent::Granted(LeaseGranted {
                name: self.name.clone(),
                token: held.token,
            }));
        }
        effect
    }

    /// Records a successful renewal of `generation` sent at `sent_at`.
    pub(crate) fn renewed(&self, generation: u64, sent_at: Instant) -> bool {
        let now = self.clock.now();
        let _order = self.ordered();
        let renewed = {
            let mut b = self.belief();
            b.renewed(generation, sent_at, now)
                .then(|| b.held())
                .flatten()
        };
        if let Some(held) = renewed {
            self.trace(LeaseTrace::Renewed {
                token: held.token,
                valid_until: self.clock.boottime_ns(held.deadline),
            });
            let was_suspended = self
                .suspended
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some_and(|g| g == generation);
            if was_suspended {
                self.publish(LeaseState::Held);
                tracing::info!(lease = %self.name, token = held.token, "lease resumed: a renewal succeeded");
                self.trace(LeaseTrace::Resumed { token: held.token });
                self.sink.deliver(LeaseEvent::Resumed(LeaseResumed {
                    name: self.name.clone(),
                    token: held.token,
                }));
            }
            return true;
        }
        drop(_order);
        self.lapse(now);
        false
    }

    /// The store said `generation` is not held: announce the loss.
    pub(crate) fn not_held(&self, generation: u64) {
        let _order = self.ordered();
        let ended = self.belief().not_held(generation);
        if let Some(held) = ended {
            self.announce_lost(held, LostReason::NotHeld);
        }
    }

    /// A forceful preemption request refused the renewal of `generation`: announce the loss.
    pub(crate) fn preempted(&self, generation: u64) {
        let _order = self.ordered();
        let ended = self.belief().not_held(generation);
        if let Some(held) = ended {
            self.announce_lost(held, LostReason::Preempted);
        }
    }

    /// Delivers a preemption notice about `generation`, only while it is still believed
    /// (never after its loss).
    pub(crate) fn notify(&self, generation: u64, event: LeaseEvent) {
        let _order = self.ordered();
        let believed = self
            .belief()
            .current(self.clock.now())
            .is_some_and(|h| h.generation == generation);
        if believed {
            self.sink.deliver(event);
        }
    }

    /// Gives the belief up without an event (release, stop); returns what was held.
    pub(crate) fn give_up(&self) -> Option<Held> {
        let _order = self.ordered();
        let held = self.belief().give_up();
        if let Some(h) = held {
            self.trace(LeaseTrace::Released { token: h.token });
            self.publish(LeaseState::NotHeld);
        }
        held
    }

    /// The grant believed now, if any, once its grant was traced. Never blocks on anything
    /// but a short critical section.
    pub(crate) fn current(&self) -> Option<Held> {
        let announced = self.announced.load(std::sync::atomic::Ordering::SeqCst);
        self.belief()
            .current(self.clock.now())
            .filter(|h| h.generation <= announced)
    }

    /// The grant believed, even if its belief just ended and nobody announced it yet.
    pub(crate) fn held(&self) -> Option<Held> {
        self.belief().held()
    }
}
