//! Readiness that means serving: whether a load balancer should send this node work.
//!
//! A node is ready when every *gate* registered with its [`Readiness`] is open and none of
//! its leases has been suspended for `suspended-after`, and it is not leaving. The node
//! opens its own gate once it is an up member; each sharding region opens one once the
//! coordinator answered its registration with the shard homes it knows. A leave closes
//! readiness first, before anything is handed off, and for good: a load balancer stops
//! sending before the node stops serving.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure_lease::{LeaseObserver, LeaseTrace};
use tokio::time::Instant;

/// Why a node (or one of its parts) is not ready: a sentence naming what is missing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not ready: {reason}")]
pub struct NotReady {
    /// What is missing, e.g. `region of "counter": not registered with a coordinator yet`.
    pub reason: String,
}

/// How long a lease may be suspended (renewals failing, its deadline not passed) before
/// the node is not ready, unless set otherwise ([`Readiness::set_suspended_after`]).
pub const DEFAULT_SUSPENDED_AFTER: Duration = Duration::from_secs(3);

#[derive(Debug)]
struct State {
    /// Set once the node starts leaving (or shutting down): not ready whatever else holds.
    leaving: Option<String>,
    /// Open gates map to `None`, closed ones to why.
    gates: BTreeMap<u64, (String, Option<String>)>,
    next_gate: u64,
    /// The node's leases whose renewals are failing: since when, and the error.
    suspended: BTreeMap<String, (Instant, String)>,
    suspended_after: Duration,
}

/// A node's readiness; cloneable, shared by everything that serves on the node.
#[derive(Debug, Clone)]
pub struct Readiness(Arc<Mutex<State>>);

impl Default for Readiness {
    fn default() -> Self {
        Readiness(Arc::new(Mutex::new(State {
            leaving: None,
            gates: BTreeMap::new(),
            next_gate: 0,
            suspended: BTreeMap::new(),
            suspended_after: DEFAULT_SUSPENDED_AFTER,
        })))
    }
}

impl Readiness {
    /// Nothing registered: ready until a gate closes it.
    pub fn new() -> Self {
        Readiness::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `Ok` when the node should be sent work: not leaving, every gate open, no lease
    /// suspended for `suspended-after`. `Err` names the first thing missing (leaving
    /// first, then gates in the order they were made, then leases by name).
    pub fn check(&self) -> Result<(), NotReady> {
        let s = self.state();
        if let Some(why) = &s.leaving {
            return Err(NotReady {
                reason: why.clone(),
            });
        }
        if let Some((name, Some(why))) = s.gates.values().find(|(_, why)| why.is_some()) {
            return Err(NotReady {
                reason: format!("{name}: {why}"),
            });
        }
        let now = Instant::now();
        if let Some((lease, (since, error))) = s
            .suspended
            .iter()
            .find(|(_, (since, _))| now.duration_since(*since) >= s.suspended_after)
        {
            return Err(NotReady {
                reason: format!(
                    "lease {lease} suspended for {} ms (renewals failing: {error})",
                    now.duration_since(*since).as_millis()
                ),
            });
        }
        Ok(())
    }

    /// Whether [`check`](Readiness::check) passes.
    pub fn is_ready(&self) -> bool {
        self.check().is_ok()
    }

    /// A new gate named `name` (for the reasons it gives), closed with `why` until opened.
    /// It counts while any clone of it lives.
    pub fn gate(&self, name: impl Into<String>, why: impl Into<String>) -> ReadinessGate {
        let mut s = self.state();
        let id = s.next_gate;
        s.next_gate += 1;
        s.gates.insert(id, (name.into(), Some(why.into())));
        ReadinessGate(Arc::new(GateInner {
            readiness: self.clone(),
            id,
        }))
    }

    /// The node is leaving (or shutting down) for `why`: not ready from now on, whatever
    /// the gates say. Called first in a leave, before anything is handed off.
    pub fn leaving(&self, why: impl Into<String>) {
        let mut s = self.state();
        if s.leaving.is_none() {
            s.leaving = Some(why.into());
        }
    }

    /// Whether [`leaving`](Readiness::leaving) was called.
    pub fn is_leaving(&self) -> bool {
        self.state().leaving.is_some()
    }

    /// A lease suspended for at least `after` makes the node not ready (the management
    /// endpoint sets its `ready-suspended-after`).
    pub fn set_suspended_after(&self, after: Duration) {
        self.state().suspended_after = after;
    }

    /// An observer of the leases held by `owner` (the node's `host:port`): a suspended
    /// one counts against readiness until it is resumed, lost or released.
    pub fn lease_observer(&self, owner: &str) -> LeaseObserver {
        let readiness = self.clone();
        let owner = owner.to_string();
        LeaseObserver::new(move |lease, by, trace| readiness.trace(&owner, lease, by, trace))
    }

    fn trace(&self, owner: &str, lease: &str, by: &str, trace: &LeaseTrace) {
        if by != owner {
            return;
        }
        let mut s = self.state();
        match trace {
            LeaseTrace::Suspended { error, .. } => {
                s.suspended
                    .entry(lease.to_string())
                    .or_insert_with(|| (Instant::now(), error.clone()));
            }
            LeaseTrace::Granted { .. }
            | LeaseTrace::Resumed { .. }
            | LeaseTrace::Lost { .. }
            | LeaseTrace::Released { .. }
            | LeaseTrace::NotGranted { .. } => {
                s.suspended.remove(lease);
            }
            LeaseTrace::AcquireInvoked | LeaseTrace::Renewed { .. } | LeaseTrace::Error { .. } => {}
        }
    }
}

#[derive(Debug)]
struct GateInner {
    readiness: Readiness,
    id: u64,
}

impl Drop for GateInner {
    fn drop(&mut self) {
        self.readiness.state().gates.remove(&self.id);
    }
}

/// One condition of a node's readiness (see [`Readiness::gate`]); cloneable, removed
/// once every clone is dropped.
#[derive(Debug, Clone)]
pub struct ReadinessGate(Arc<GateInner>);

impl ReadinessGate {
    /// This condition holds.
    pub fn open(&self) {
        self.set(None);
    }

    /// This condition does not hold, for `why`.
    pub fn close(&self, why: impl Into<String>) {
        self.set(Some(why.into()));
    }

    /// `Ok` when open, else why not (named as the node's check names it).
    pub fn check(&self) -> Result<(), NotReady> {
        let s = self.0.readiness.state();
        match s.gates.get(&self.0.id) {
            Some((name, Some(why))) => Err(NotReady {
                reason: format!("{name}: {why}"),
            }),
            _ => Ok(()),
        }
    }

    fn set(&self, why: Option<String>) {
        if let Some(gate) = self.0.readiness.state().gates.get_mut(&self.0.id) {
            gate.1 = why;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure_lease::FencingToken;

    #[test]
    fn ready_only_when_every_gate_is_open_and_not_leaving() {
        let r = Readiness::new();
        assert!(r.is_ready(), "nothing registered");
        let member = r.gate("member", "joining");
        let region = r.gate("region of \"a\"", "not registered");
        assert_eq!(r.check().unwrap_err().reason, "member: joining");
        member.open();
        assert_eq!(
            r.check().unwrap_err().reason,
            "region of \"a\": not registered"
        );
        assert_eq!(
            region.check().unwrap_err().reason,
            "region of \"a\": not registered"
        );
        region.open();
        assert!(r.is_ready());
        r.leaving("leaving: SIGTERM");
        assert_eq!(r.check().unwrap_err().reason, "leaving: SIGTERM");
        member.open();
        assert!(!r.is_ready(), "a leave is for good");
    }

    #[test]
    fn a_dropped_gate_no_longer_counts() {
        let r = Readiness::new();
        let gate = r.gate("region", "stopped");
        let clone = gate.clone();
        drop(gate);
        assert!(!r.is_ready(), "a clone still lives");
        drop(clone);
        assert!(r.is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_of_the_node_suspended_for_the_threshold_makes_it_not_ready() {
        let r = Readiness::new();
        r.set_suspended_after(Duration::from_secs(3));
        let observe = |by: &str, trace: &LeaseTrace| r.trace("n:1", "sys-shard-a-1", by, trace);
        let token = FencingToken::new(7);
        let suspended = LeaseTrace::Suspended {
            token,
            error: "store timeout".into(),
        };
        observe("other:1", &suspended);
        observe("n:1", &suspended);
        tokio::time::advance(Duration::from_millis(2999)).await;
        assert!(r.is_ready(), "within the threshold");
        tokio::time::advance(Duration::from_millis(1)).await;
        let why = r.check().unwrap_err().reason;
        assert!(
            why.starts_with("lease sys-shard-a-1 suspended for 3000 ms")
                && why.contains("store timeout"),
            "{why}"
        );
        observe("n:1", &LeaseTrace::Resumed { token });
        assert!(r.is_ready(), "resumed");
    }
}
