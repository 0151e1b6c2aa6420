//! The process's watchdog thread: judges each watched grant at its local deadline minus the
//! exit wait, from a thread of its own, so that a runtime whose workers are all held up by
//! blocked code still ends the process in time (see [`LossWatch`](super::LossWatch)).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Duration;

use ractor::ActorId;
use tokio::time::Instant;

use super::{Terminator, Watched, lock, running};
use crate::actor::LeaseView;
use crate::token::FencingToken;

/// The longest the thread sleeps without a deadline to wake for: a grant first believed
/// while it sleeps is seen within this, far sooner than any grant's deadline.
const IDLE_WAKE: Duration = Duration::from_millis(250);

/// One [`LossWatch`](super::LossWatch) as the watchdog judges it.
pub(super) struct Dogged {
    view: LeaseView,
    lease: String,
    actors: Arc<Mutex<HashMap<ActorId, Watched>>>,
    terminator: Terminator,
    exit_wait: Duration,
    judging: Mutex<Judging>,
}

/// The grant a [`Dogged`] waits to judge, and the last one it judged.
#[derive(Default)]
struct Judging {
    /// The newest grant seen, with the latest local deadline seen for it.
    grant: Option<(FencingToken, Instant)>,
    judged: Option<FencingToken>,
}

impl Dogged {
    pub(super) fn new(
        view: LeaseView,
        lease: String,
        actors: Arc<Mutex<HashMap<ActorId, Watched>>>,
        terminator: Terminator,
        exit_wait: Duration,
    ) -> Self {
        Dogged {
            view,
            lease,
            actors,
            terminator,
            exit_wait,
            judging: Mutex::default(),
        }
    }

    /// Judges the grant it waits for if its time has come; how long until it must look
    /// again, if it waits for one.
    fn look(&self) -> Option<Duration> {
        let clock = self.view.holder_clock();
        let now = clock.now();
        let mut judging = lock(&self.judging);
        let seen = self
            .view
            .held_grant()
            .filter(|(token, _)| Some(*token) != judging.judged);
        judging.grant = match (judging.grant, seen) {
            (Some((token, deadline)), Some((same, moved))) if token == same => {
                Some((token, deadline.max(moved)))
            }
            (None, seen) => seen,
            (waiting, _) => waiting,
        };
        let (token, deadline) = judging.grant?;
        let judge_at = deadline.checked_sub(self.exit_wait).unwrap_or(deadline);
        if now < judge_at {
            return Some(judge_at - now);
        }
        judging.judged = Some(token);
        judging.grant = None;
        drop(judging);
        if now >= deadline {
            // The process did not run from before the judging instant until past the
            // deadline (a freeze, a suspend, or starved of the CPU): ending it now would
            // not keep the deadline, and the supervisor stops what runs as after a pause.
            tracing::warn!(lease = %self.lease, token = token.get(),
                late_ms = (now - deadline).as_millis() as u64,
                "the watchdog woke past the grant's local deadline: the process did not run");
            return None;
        }
        if let Some(what) = running(&self.actors, &self.lease, token) {
            self.terminator.terminate(
                &what,
                "the watchdog found it running at the lease's local deadline",
            );
        }
        None
    }
}

struct Watchdog {
    watched: Mutex<Vec<Weak<Dogged>>>,
    wake: Condvar,
}

/// Puts `dogged` in the watchdog thread's list (starting the thread on first use) for as
/// long as the returned `Arc` lives.
pub(super) fn watch(dogged: Dogged) -> Arc<Dogged> {
    static DOG: OnceLock<Option<Arc<Watchdog>>> = OnceLock::new();
    let dogged = Arc::new(dogged);
    let dog = DOG.get_or_init(|| {
        let dog = Arc::new(Watchdog {
            watched: Mutex::default(),
            wake: Condvar::new(),
        });
        let runs = dog.clone();
        match std::thread::Builder::new()
            .name("tenure-watchdog".into())
            .spawn(move || run(&runs))
        {
            Ok(_) => Some(dog),
            Err(e) => {
                tracing::error!(error = %e,
                    "cannot start the watchdog thread: loss watches run on the runtime alone");
                None
            }
        }
    });
    if let Some(dog) = dog {
        lock(&dog.watched).push(Arc::downgrade(&dogged));
        dog.wake.notify_one();
    }
    dogged
}

fn run(dog: &Watchdog) {
    let mut watched = lock(&dog.watched);
    loop {
        watched.retain(|w| w.strong_count() > 0);
        let next = watched
            .iter()
            .filter_map(Weak::upgrade)
            .filter_map(|d| d.look())
            .fold(IDLE_WAKE, Duration::min);
        watched = dog
            .wake
            .wait_timeout(watched, next)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}
