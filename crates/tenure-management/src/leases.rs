//! The leases of a node as its LeaseActors trace them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tenure_lease::{FencingToken, LeaseObserver, LeaseTrace};

/// Where a lease of this node stands, as last traced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RowState {
    /// Held: granted and renewed.
    Held,
    /// Renewals failing, the local deadline not passed yet: still held, act with care.
    Suspended,
    /// Lost (expired, taken over, preempted, or the holder stopped believing in it).
    Lost,
    /// Released by the holder.
    Released,
    /// Asked for and held by another owner.
    NotGranted,
}

impl RowState {
    /// The name in the JSON and the CLI: `held`, `suspended`, `lost`, `released`,
    /// `not_granted`.
    pub fn as_str(self) -> &'static str {
        match self {
            RowState::Held => "held",
            RowState::Suspended => "suspended",
            RowState::Lost => "lost",
            RowState::Released => "released",
            RowState::NotGranted => "not_granted",
        }
    }
}

/// One lease of this node, as last traced (the rows of `GET /leases`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRow {
    /// The lease name.
    pub lease: String,
    /// The owner holding or asking for it (the node's `host:port`).
    pub owner: String,
    /// Where it stands.
    pub state: RowState,
    /// The fencing token of the grant it is about, when there is one.
    pub token: Option<FencingToken>,
    /// Milliseconds since it entered `state`.
    pub for_ms: u64,
    /// The error that suspended it, while suspended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone)]
struct Entry {
    state: RowState,
    token: Option<FencingToken>,
    since: Instant,
    error: Option<String>,
}

/// The leases of this node and their states, kept from the lease traces (see
/// [`LeaseTable::observer`]).
#[derive(Debug, Clone, Default)]
pub struct LeaseTable {
    rows: Arc<Mutex<BTreeMap<(String, String), Entry>>>,
}

impl LeaseTable {
    /// An observer that keeps this table up to date: give it to the node's
    /// [`LeaseProvider::observe`](tenure_lease::LeaseProvider::observe) before the node
    /// starts its leases.
    pub fn observer(&self) -> LeaseObserver {
        let table = self.clone();
        LeaseObserver::new(move |lease, owner, trace| table.record(lease, owner, trace))
    }

    fn record(&self, lease: &str, owner: &str, trace: &LeaseTrace) {
        let (state, token, error) = match trace {
            LeaseTrace::Granted { token, .. } | LeaseTrace::Resumed { token } => {
                (RowState::Held, Some(*token), None)
            }
            LeaseTrace::Suspended { token, error } => {
                (RowState::Suspended, Some(*token), Some(error.clone()))
            }
            LeaseTrace::Lost { token, .. } => (RowState::Lost, Some(*token), None),
            LeaseTrace::Released { token } => (RowState::Released, Some(*token), None),
            LeaseTrace::NotGranted { .. } => (RowState::NotGranted, None, None),
            LeaseTrace::AcquireInvoked | LeaseTrace::Renewed { .. } | LeaseTrace::Error { .. } => {
                return;
            }
        };
        let mut rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        let key = (lease.to_string(), owner.to_string());
        if rows
            .get(&key)
            .is_some_and(|e| e.state == state && e.token == token)
        {
            return;
        }
        rows.insert(
            key,
            Entry {
                state,
                token,
                since: Instant::now(),
                error,
            },
        );
    }

    /// Every lease traced so far, by name and owner.
    pub fn rows(&self) -> Vec<LeaseRow> {
        let now = Instant::now();
        self.rows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|((lease, owner), e)| LeaseRow {
                lease: lease.clone(),
                owner: owner.clone(),
                state: e.state,
                token: e.token,
                for_ms: now.duration_since(e.since).as_millis() as u64,
                error: e.error.clone(),
            })
            .collect()
    }

    /// The leases suspended for at least `after`.
    pub fn suspended_for(&self, after: Duration) -> Vec<LeaseRow> {
        self.rows()
            .into_iter()
            .filter(|r| r.state == RowState::Suspended && Duration::from_millis(r.for_ms) >= after)
            .collect()
    }
}
