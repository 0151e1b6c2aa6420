//! One lease's timers and its watchdog, kept by one task for the life of its driver.
//!
//! The machine arms and disarms timers on nearly every grant and release (the renewal
//! tick, the watchdog). A task per timer would cost two spawns and two aborts per
//! acquire+release, and each wakes a parked worker thread: on the thin lease path that is
//! most of what the Lease API costs beyond the store call. Here arming is a
//! write under a lock, and the task is woken only when a timer is armed earlier than the
//! instant it sleeps until; a disarmed timer is simply gone when the task next looks.
//!
//! A lease acquired and released again and again within one heartbeat interval arms and
//! disarms its renewal for the same tick of the owner's renewal grid each time. Were the
//! task idle between (nothing armed), every acquire would wake it, and since the caller's
//! next store call then takes the worker's LIFO slot, the task would be handed to another
//! worker thread: a cross-thread wake-up per acquire. So a task that finds nothing armed
//! still sleeps until the last renewal tick it was armed for, if that is yet to come, and
//! is woken only for timers armed before it; it goes idle once that tick passed.
//!
//! The watchdog keeps its guarantee: the task is independent of the actor's mailbox and of
//! any feed, sleeps on the holder clock (woken shortly after a host suspend that passed the
//! deadline) and calls [`SharedBelief::deadline`] when the belief of the watched generation
//! is about to end, however slow the store or long the mailbox queue.
//!
//! Renewal ticks pass by the mailbox too: the task hands them to its `renew_due` callback
//! (the driver, which feeds them at once), so that a command whose store call is slow
//! delays no renewal. Retry and poll timers are commands: they go to the actor's mailbox
//! and take their turn after the commands before them.

use std::sync::{Arc, Mutex};

use ractor::ActorRef;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::actor::LeaseMsg;
use crate::events::SharedBelief;
use crate::machine::Timer;

/// The timers of one lease (see the module docs). Dropping it ends its task.
pub(crate) struct Alarms {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

/// Feeds the renewal tick of a generation (see the module docs).
pub(crate) type RenewDue = Box<dyn Fn(u64) + Send + Sync>;

/// A timer that came due.
enum Due {
    Retry,
    Poll,
    Renew(u64),
}

struct Shared {
    slots: Mutex<Slots>,
    wake: Notify,
    belief: Arc<SharedBelief>,
}

/// What is armed (tokio's clock, but the watchdog's generation: its instants are the
/// belief's, on the holder clock) and what the task is doing.
#[derive(Default)]
struct Slots {
    retry: Option<Instant>,
    poll: Option<Instant>,
    renew: Option<(Instant, u64)>,
    /// The instant of the last renewal armed, kept when it is disarmed: the task sleeps
    /// until it rather than idly while it is to come (see the module docs).
    renew_tick: Option<Instant>,
    watchdog: Option<u64>,
    sleep: Sleep,
}

/// The task: looking at the slots (it will see any change), asleep until an instant, or
/// asleep until woken.
#[derive(Default, Clone, Copy)]
enum Sleep {
    #[default]
    Awake,
    Until(Instant),
    Idle,
}

impl Slots {
    /// Whether the task must be woken for something due at `at` (tokio's clock).
    fn wakes_for(&self, at: Instant) -> bool {
        match self.sleep {
            Sleep::Awake => false,
            Sleep::Until(until) => at < until,
            Sleep::Idle => true,
        }
    }

    /// Takes the timers due at `now`.
    fn take_due(&mut self, now: Instant) -> Vec<Due> {
        let mut due = Vec::new();
        if self.retry.is_some_and(|at| at <= now) {
            self.retry = None;
            due.push(Due::Retry);
        }
        if self.poll.is_some_and(|at| at <= now) {
            self.poll = None;
            due.push(Due::Poll);
        }
        if let Some((at, generation)) = self.renew
            && at <= now
        {
            self.renew = None;
            due.push(Due::Renew(generation));
        }
        due
    }

    /// The earliest armed timer.
    fn next(&self) -> Option<Instant> {
        [self.retry, self.poll, self.renew.map(|(at, _)| at)]
            .into_iter()
            .flatten()
            .min()
    }

    /// Until when the task sleeps on tokio's clock (the watchdog aside), given that no armed
    /// timer is due at `now`: the earliest armed timer or the kept renewal tick, if either
    /// is to come; `None`: until woken.
    fn sleep_until(&self, now: Instant) -> Option<Instant> {
        let tick = self.renew_tick.filter(|at| *at > now);
        [self.next(), tick].into_iter().flatten().min()
    }
}

impl Alarms {
    /// Starts the task of one lease: due retry and poll timers are sent to `actor`, due
    /// renewals to `renew_due`, the watchdog calls `belief.deadline()`.
    pub(crate) fn start(
        belief: Arc<SharedBelief>,
        actor: ActorRef<LeaseMsg>,
        renew_due: RenewDue,
    ) -> Alarms {
        let shared = Arc::new(Shared {
            slots: Mutex::new(Slots::default()),
            wake: Notify::new(),
            belief,
        });
        let task = tokio::spawn(run(shared.clone(), actor, renew_due));
        Alarms { shared, task }
    }

    /// (Re)arms `timer` to fire at `at` (tokio's clock).
    pub(crate) fn arm(&self, timer: Timer, at: Instant) {
        self.change(|s| {
            match timer {
                Timer::Retry => s.retry = Some(at),
                Timer::Poll => s.poll = Some(at),
            }
            Some(at)
        });
    }

    pub(crate) fn disarm(&self, timer: Timer) {
        self.change(|s| {
            match timer {
                Timer::Retry => s.retry = None,
                Timer::Poll => s.poll = None,
            }
            None
        });
    }

    /// Arms the renewal timer of `generation` at `at` (tokio's clock).
    pub(crate) fn arm_renewal(&self, generation: u64, at: Instant) {
        self.change(|s| {
            s.renew = Some((at, generation));
            s.renew_tick = Some(at);
            Some(at)
        });
    }

    pub(crate) fn disarm_renewal(&self) {
        self.change(|s| {
            s.renew = None;
            None
        });
    }

    /// Watches the belief of grant `generation` until it ends or another is watched.
    pub(crate) fn watch(&self, generation: u64) {
        let belief = &self.shared.belief;
        self.change(|s| {
            s.watchdog = Some(generation);
            belief
                .watchdog_wake(generation)
                .map(|wake| belief.clock().to_tokio(wake))
        });
    }

    pub(crate) fn unwatch(&self) {
        self.change(|s| {
            s.watchdog = None;
            None
        });
    }

    /// Applies `f`, which returns the instant of anything it armed, and wakes the task if
    /// that is earlier than the instant it sleeps until.
    fn change(&self, f: impl FnOnce(&mut Slots) -> Option<Instant>) {
        let wake = {
            let mut slots = lock(&self.shared.slots);
            f(&mut slots).is_some_and(|at| slots.wakes_for(at))
        };
        if wake {
            self.shared.wake.notify_one();
        }
    }
}

impl Alarms {
    /// Ends the task: no timer fires and no watchdog runs any more.
    pub(crate) fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for Alarms {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run(shared: Arc<Shared>, actor: ActorRef<LeaseMsg>, renew_due: RenewDue) {
    let belief = &shared.belief;
    let clock = belief.clock().clone();
    loop {
        let due = {
            let mut slots = lock(&shared.slots);
            slots.sleep = Sleep::Awake;
            slots.take_due(Instant::now())
        };
        for due in due {
            match due {
                Due::Retry => {
                    let _ = actor.cast(LeaseMsg::RetryAcquire);
                }
                Due::Poll => {
                    let _ = actor.cast(LeaseMsg::PreemptPoll);
                }
                Due::Renew(generation) => renew_due(generation),
            }
        }
        let watched = lock(&shared.slots).watchdog;
        let wake = watched.and_then(|generation| belief.watchdog_wake(generation));
        if wake.is_some_and(|wake| clock.now() >= wake) {
            belief.deadline();
            continue;
        }
        let (next, wake) = {
            let mut slots = lock(&shared.slots);
            // Looked at again under the lock that arming takes: nothing armed from here
            // on can be missed (it finds the task asleep and wakes it if need be).
            if slots.watchdog != watched {
                continue;
            }
            if wake.is_none() {
                slots.watchdog = None;
            }
            let now = Instant::now();
            if slots.next().is_some_and(|at| at <= now) {
                continue;
            }
            let next = slots.sleep_until(now);
            let until = [next, wake.map(|w| clock.to_tokio(w))]
                .into_iter()
                .flatten()
                .min();
            slots.sleep = until.map_or(Sleep::Idle, Sleep::Until);
            (next, wake)
        };
        tokio::select! {
            _ = shared.wake.notified() => {}
            _ = sleep_until(next) => {}
            _ = async {
                match wake {
                    Some(wake) => clock.sleep_until(wake).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_disarmed_renewal_keeps_the_task_asleep_until_its_tick() {
        let now = Instant::now();
        let tick = now + Duration::from_secs(6);
        let mut slots = Slots {
            renew: Some((tick, 1)),
            renew_tick: Some(tick),
            ..Slots::default()
        };
        slots.renew = None;
        assert_eq!(slots.sleep_until(now), Some(tick));
        slots.sleep = Sleep::Until(tick);
        // Armed again for the same tick (a new grant within the interval): no wake-up.
        assert!(!slots.wakes_for(tick));
        // Anything earlier still wakes the task.
        assert!(slots.wakes_for(now + Duration::from_secs(1)));
        let earlier = now + Duration::from_secs(2);
        slots.retry = Some(earlier);
        assert_eq!(slots.sleep_until(now), Some(earlier));
        slots.retry = None;
        // Once the tick passed, nothing is armed: idle until woken.
        assert_eq!(slots.sleep_until(tick), None);
    }
}
