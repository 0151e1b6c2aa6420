//! Lease traces: every step of a LeaseActor's life (attempt, grant, renewal, loss, release,
//! unknown outcome) reported to an observer, e.g. a node's history for `tenure check`.
//! Observers only watch: they cannot change what the actor does.

use crate::token::FencingToken;
use std::sync::Arc;

/// One step of a lease's life, as seen by its holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseTrace {
    /// An acquire attempt was sent to the store.
    AcquireInvoked,
    /// A new grant is believed from now until `valid_until` (ns of the host's `CLOCK_BOOTTIME`).
    Granted {
        /// The grant's fencing token.
        token: FencingToken,
        /// The holder's local deadline (ns of the host's `CLOCK_BOOTTIME`).
        valid_until: i64,
    },
    /// The store certainly refused: another owner holds it.
    NotGranted {
        /// The owner the store says holds the lease.
        holder: String,
    },
    /// A renewal was confirmed: the belief now lasts until `valid_until`.
    Renewed {
        /// The grant's fencing token.
        token: FencingToken,
        /// The new local deadline (ns of the host's `CLOCK_BOOTTIME`).
        valid_until: i64,
    },
    /// Renewals of the grant `token` started failing (see
    /// [`LeaseSuspended`](crate::LeaseSuspended)).
    Suspended {
        /// The grant's fencing token.
        token: FencingToken,
        /// The renewal's error (or timeout), as text.
        error: String,
    },
    /// A renewal of the suspended grant `token` succeeded again.
    Resumed {
        /// The grant's fencing token.
        token: FencingToken,
    },
    /// The belief ended without a release (see [`LostReason`](crate::LostReason)).
    Lost {
        /// The lost grant's fencing token.
        token: FencingToken,
        /// Why: `expired`, `not_held` or `preempted`.
        reason: &'static str,
    },
    /// The holder gave its belief up to release the grant (the store's answer may follow
    /// as an [`LeaseTrace::Error`] with operation `release`).
    Released {
        /// The released grant's fencing token.
        token: FencingToken,
    },
    /// A store call whose outcome is unknown (error or timeout).
    Error {
        /// The store call: `acquire`, `renew` or `release`.
        operation: &'static str,
        /// The error (or timeout), as text.
        error: String,
    },
}

/// Where LeaseActors report their [`LeaseTrace`]s: called inline with the lease name and
/// owner, in transition order; it must not block.
#[derive(Clone)]
pub struct LeaseObserver(Arc<ObserverFn>);

type ObserverFn = dyn Fn(&str, &str, &LeaseTrace) + Send + Sync;

impl std::fmt::Debug for LeaseObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseObserver")
    }
}

impl LeaseObserver {
    /// Reports to a closure taking (lease name, owner, trace).
    pub fn new(f: impl Fn(&str, &str, &LeaseTrace) + Send + Sync + 'static) -> Self {
        LeaseObserver(Arc::new(f))
    }

    pub(crate) fn report(&self, lease: &str, owner: &str, trace: &LeaseTrace) {
        (self.0)(lease, owner, trace)
    }
}
