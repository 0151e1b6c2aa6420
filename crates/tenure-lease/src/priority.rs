//! Priority acquire options (cooperative preemption, Apache Helix's priority lock made
//! safe). The protocol itself runs in the LeaseActor, over the store's
//! [`request_preemption`](crate::LeaseStore::request_preemption).

use std::time::Duration;

use crate::error::ConfigError;
use crate::store::{EMERGENCY_PRIORITY, LeaseStore};

/// How a lease is acquired relative to other owners. The default (priority 0, nothing
/// else) is a plain lease: it never preempts anybody and is preempted by any higher
/// priority.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AcquireOptions {
    /// Higher wins. A requester with a strictly higher priority than the holder's asks it
    /// to give the lease up; equal or lower is simply not granted. [`EMERGENCY_PRIORITY`]
    /// (`u64::MAX`) is reserved for operators.
    pub priority: u64,
    /// How long this owner needs to clean up when it is preempted later: requesters wait at
    /// most this long (and at most their own `waiting_timeout`) for a voluntary release.
    /// With the default 0 a non-forceful requester gives up at once (`CleanupTimedOut`) and a
    /// forceful one makes its request forceful at once (granted within one ttl).
    pub cleanup_timeout: Duration,
    /// How long this owner waits for a lower-priority holder to release (`None`: no bound
    /// of its own, only the holder's cleanup timeout).
    pub waiting_timeout: Option<Duration>,
    /// When the wait ends without a release: `false` gives up
    /// ([`LeaseError::CleanupTimedOut`](crate::LeaseError::CleanupTimedOut), nothing
    /// changes); `true` makes the request forceful: the holder's renewals are refused, and
    /// the lease is granted here once its last renewal has expired (at most one ttl later).
    pub forceful: bool,
    /// Only with `priority == EMERGENCY_PRIORITY`: take a lower-priority grant over at once
    /// with a new token. The old holder learns it at its next renewal and believes in the
    /// lease until its local deadline at the latest: until then **only fencing tokens**
    /// protect guarded resources.
    pub emergency: bool,
}

impl AcquireOptions {
    /// Options with `priority` and every other field at its default (no cleanup time, no
    /// waiting bound of its own, not forceful, not an emergency).
    pub fn with_priority(priority: u64) -> Self {
        AcquireOptions {
            priority,
            ..AcquireOptions::default()
        }
    }

    /// These options with `cleanup_timeout` (see the field).
    pub fn cleanup_timeout(mut self, cleanup_timeout: Duration) -> Self {
        self.cleanup_timeout = cleanup_timeout;
        self
    }

    /// These options with `waiting_timeout` (see the field).
    pub fn waiting_timeout(mut self, waiting_timeout: Option<Duration>) -> Self {
        self.waiting_timeout = waiting_timeout;
        self
    }

    /// These options, forceful or not (see the field).
    pub fn forceful(mut self, forceful: bool) -> Self {
        self.forceful = forceful;
        self
    }

    /// These options, an emergency takeover or not (see the field; only with
    /// [`EMERGENCY_PRIORITY`]).
    pub fn emergency(mut self, emergency: bool) -> Self {
        self.emergency = emergency;
        self
    }

    /// Checks the options against each other, their durations (at most 365 days), and
    /// against what `store` can do (anything but the defaults needs a store with
    /// [`PreemptionRequests`](crate::PreemptionRequests)). Errors name the option.
    pub fn validate(&self, store: &dyn LeaseStore) -> Result<(), ConfigError> {
        self.check(store.kind(), store.as_preemption_requests().is_some())
    }

    /// [`validate`](AcquireOptions::validate) for a store of kind `kind` that keeps
    /// preemption requests or not (`preempts`).
    fn check(&self, kind: &str, preempts: bool) -> Result<(), ConfigError> {
        if self.emergency && self.priority != EMERGENCY_PRIORITY {
            return Err(ConfigError::invalid(
                "emergency",
                format!(
                    "only with the maximum priority {EMERGENCY_PRIORITY} (got priority {})",
                    self.priority
                ),
            ));
        }
        crate::duration::check(self.cleanup_timeout)
            .map_err(|e| ConfigError::duration("cleanup-timeout", e))?;
        if let Some(wait) = self.waiting_timeout {
            crate::duration::check(wait)
                .map_err(|e| ConfigError::duration("waiting-timeout", e))?;
        }
        if *self != AcquireOptions::default() && !preempts {
            return Err(ConfigError::invalid(
                "priority",
                format!("the {kind} store does not support priorities and preemption"),
            ));
        }
        Ok(())
    }

    /// Whether a requester with these options asks a holder of priority `holder` to give
    /// the lease up (otherwise it is simply not granted).
    pub fn outranks(&self, holder: u64) -> bool {
        self.priority > holder
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREEMPTING: bool = true;

    #[test]
    fn emergency_needs_the_maximum_priority() {
        let mut o = AcquireOptions {
            emergency: true,
            priority: 7,
            ..AcquireOptions::default()
        };
        let err = o.check("memory", PREEMPTING).unwrap_err();
        assert!(err.to_string().contains("`emergency`"), "{err}");
        o.priority = EMERGENCY_PRIORITY;
        o.check("memory", PREEMPTING).unwrap();
    }

    #[test]
    fn durations_beyond_a_year_are_refused_naming_the_option() {
        for (options, key) in [
            (
                AcquireOptions {
                    cleanup_timeout: Duration::MAX,
                    ..AcquireOptions::default()
                },
                "cleanup-timeout",
            ),
            (
                AcquireOptions {
                    waiting_timeout: Some(Duration::from_secs(400 * 24 * 3600)),
                    ..AcquireOptions::default()
                },
                "waiting-timeout",
            ),
        ] {
            let err = options.check("memory", PREEMPTING).unwrap_err();
            assert!(
                err.to_string().contains(key) && err.to_string().contains("365 days"),
                "{err}"
            );
        }
    }

    #[test]
    fn priorities_need_a_store_that_keeps_them() {
        AcquireOptions::default()
            .check("etcd", !PREEMPTING)
            .unwrap();
        let err = AcquireOptions {
            priority: 1,
            ..AcquireOptions::default()
        }
        .check("etcd", !PREEMPTING)
        .unwrap_err();
        assert!(err.to_string().contains("etcd store"), "{err}");
    }
}
