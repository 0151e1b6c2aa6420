//! Lease metrics through the [`metrics`] facade (a program installs a recorder, e.g. a
//! Prometheus exporter; without one they cost next to nothing). The grant, loss and
//! held metrics are derived from the lease traces, so they count exactly what the
//! histories record; the store's are counted where its calls are made.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `tenure_lease_grants_total` | counter | | new grants believed |
//! | `tenure_lease_losses_total` | counter | `reason` | grants lost (`expired`, `not_held`, `preempted`) |
//! | `tenure_lease_store_errors_total` | counter | `operation` | store calls with an unknown outcome |
//! | `tenure_leases_held` | gauge | | grants believed now |
//! | `tenure_leases_suspended` | gauge | | grants whose renewals are failing now |
//! | `tenure_lease_renewal_seconds` | histogram | `store` | round trip of one (batched) renewal |
//! | `tenure_store_requests_total` | counter | `operation` | store calls made (a batched renewal is one; `bounded` calls and renewals) |

use std::time::Duration;

use crate::trace::LeaseTrace;

/// Counts one lease trace; `was_suspended` tells whether the grant it ends was suspended.
pub(crate) fn on_trace(trace: &LeaseTrace, was_suspended: bool) {
    match trace {
        LeaseTrace::Granted { .. } => {
            metrics::counter!("tenure_lease_grants_total").increment(1);
            metrics::gauge!("tenure_leases_held").increment(1.0);
        }
        LeaseTrace::Lost { reason, .. } => {
            metrics::counter!("tenure_lease_losses_total", "reason" => *reason).increment(1);
            ended(was_suspended);
        }
        LeaseTrace::Released { .. } => ended(was_suspended),
        LeaseTrace::Suspended { .. } => metrics::gauge!("tenure_leases_suspended").increment(1.0),
        LeaseTrace::Resumed { .. } => metrics::gauge!("tenure_leases_suspended").decrement(1.0),
        LeaseTrace::Error { operation, .. } => {
            metrics::counter!("tenure_lease_store_errors_total", "operation" => *operation)
                .increment(1);
        }
        LeaseTrace::AcquireInvoked | LeaseTrace::NotGranted { .. } | LeaseTrace::Renewed { .. } => {
        }
    }
}

fn ended(was_suspended: bool) {
    metrics::gauge!("tenure_leases_held").decrement(1.0);
    if was_suspended {
        metrics::gauge!("tenure_leases_suspended").decrement(1.0);
    }
}

/// Counts one call made to a store (`operation` as errors name it: `renew`, `list`, …).
pub(crate) fn store_request(operation: &'static str) {
    metrics::counter!("tenure_store_requests_total", "operation" => operation).increment(1);
}

/// Records the round trip of one batched renewal on a store of kind `store`.
pub(crate) fn renewal(store: &'static str, took: Duration) {
    metrics::histogram!("tenure_lease_renewal_seconds", "store" => store)
        .record(took.as_secs_f64());
}
