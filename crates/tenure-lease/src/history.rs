//! The lease core's history events (docs/history.md, "Lease events"): each [`LeaseTrace`]
//! of a LeaseActor, emitted by its one emitter as a `tracing` event on [`TARGET`] with typed
//! fields. A process records them by installing a history writer (`tenure_history`'s
//! `HistoryLayer`); without one, an emission costs a disabled callsite's check.
//!
//! The layers above emit theirs on the same target from a `history` module of their own, so
//! that this crate names no layer above it.

use crate::trace::LeaseTrace;
use crate::unstoppable::Unstoppable;

/// The `tracing` target of every history event, of every layer.
pub const TARGET: &str = "tenure::history";

/// Emits `trace`, of lease `lease` held for `owner`, as its `lease_*` history event.
pub fn emit(lease: &str, owner: &str, trace: &LeaseTrace) {
    match trace {
        LeaseTrace::AcquireInvoked => {
            tracing::info!(target: TARGET, event = "lease_acquire", lease, owner)
        }
        LeaseTrace::Granted { token, valid_until } => {
            tracing::info!(target: TARGET, event = "lease_granted", lease, owner,
                token = token.get(), valid_until)
        }
        LeaseTrace::NotGranted { holder } => {
            tracing::info!(target: TARGET, event = "lease_not_granted", lease, owner,
                holder = holder.as_str())
        }
        LeaseTrace::Renewed { token, valid_until } => {
            tracing::info!(target: TARGET, event = "lease_renewed", lease, owner,
                token = token.get(), valid_until)
        }
        LeaseTrace::Lost { token, reason } => {
            tracing::info!(target: TARGET, event = "lease_lost", lease, owner,
                token = token.get(), reason)
        }
        LeaseTrace::Suspended { token, error } => {
            tracing::info!(target: TARGET, event = "lease_suspended", lease, owner,
                token = token.get(), error = error.as_str())
        }
        LeaseTrace::Resumed { token } => {
            tracing::info!(target: TARGET, event = "lease_resumed", lease, owner,
                token = token.get())
        }
        LeaseTrace::Released { token } => {
            tracing::info!(target: TARGET, event = "lease_released", lease, owner,
                token = token.get())
        }
        LeaseTrace::Error { operation, error } => {
            tracing::info!(target: TARGET, event = "lease_error", lease, owner,
                op = operation, error = error.as_str())
        }
    }
}

/// `process_abort`: the process ends itself at once (`abort(3)`) because `what` outlived
/// its kill while its grant is being lost.
pub fn process_abort(what: &Unstoppable) {
    tracing::info!(target: TARGET, event = "process_abort", lease = what.lease.as_str(),
        token = what.token.get(), what = what.what.as_str());
}

#[cfg(test)]
mod tests {
    use tenure_history::{Event, Recorder};

    use super::*;
    use crate::FencingToken;

    #[test]
    fn every_trace_is_its_documented_lease_event() {
        let token = FencingToken::new(7);
        let l = || "s-singleton-t".to_string();
        let o = || "a:1".to_string();
        let traces = [
            (
                LeaseTrace::AcquireInvoked,
                Event::LeaseAcquire {
                    lease: l(),
                    owner: o(),
                },
            ),
            (
                LeaseTrace::Granted {
                    token,
                    valid_until: -5,
                },
                Event::LeaseGranted {
                    lease: l(),
                    owner: o(),
                    token: 7,
                    valid_until: -5,
                },
            ),
            (
                LeaseTrace::NotGranted {
                    holder: "b:2".into(),
                },
                Event::LeaseNotGranted {
                    lease: l(),
                    owner: o(),
                    holder: "b:2".into(),
                },
            ),
            (
                LeaseTrace::Renewed {
                    token,
                    valid_until: 9,
                },
                Event::LeaseRenewed {
                    lease: l(),
                    owner: o(),
                    token: 7,
                    valid_until: 9,
                },
            ),
            (
                LeaseTrace::Lost {
                    token,
                    reason: "expired",
                },
                Event::LeaseLost {
                    lease: l(),
                    owner: o(),
                    token: 7,
                    reason: "expired".into(),
                },
            ),
            (
                LeaseTrace::Suspended {
                    token,
                    error: "timeout".into(),
                },
                Event::LeaseSuspended {
                    lease: l(),
                    owner: o(),
                    token: 7,
                    error: "timeout".into(),
                },
            ),
            (
                LeaseTrace::Resumed { token },
                Event::LeaseResumed {
                    lease: l(),
                    owner: o(),
                    token: 7,
                },
            ),
            (
                LeaseTrace::Released { token },
                Event::LeaseReleased {
                    lease: l(),
                    owner: o(),
                    token: 7,
                },
            ),
            (
                LeaseTrace::Error {
                    operation: "renew",
                    error: "down".into(),
                },
                Event::LeaseError {
                    lease: l(),
                    owner: o(),
                    op: "renew".into(),
                    error: "down".into(),
                },
            ),
        ];
        let recorder = Recorder::new("a:1", "1f");
        for (trace, _) in &traces {
            recorder.record(|| emit(&l(), &o(), trace));
        }
        let expected: Vec<Event> = traces.into_iter().map(|(_, event)| event).collect();
        assert_eq!(recorder.known_events(), Ok(expected));
    }

    #[test]
    fn a_process_abort_is_its_documented_event() {
        let what = Unstoppable {
            lease: "s-counter-3".into(),
            token: FencingToken::new(4),
            what: "entity key-7 of counter shard 3".into(),
        };
        let recorder = Recorder::new("a:1", "1f");
        recorder.record(|| process_abort(&what));
        assert_eq!(
            recorder.known_events(),
            Ok(vec![Event::ProcessAbort {
                lease: "s-counter-3".into(),
                token: 4,
                what: "entity key-7 of counter shard 3".into(),
            }])
        );
    }
}
