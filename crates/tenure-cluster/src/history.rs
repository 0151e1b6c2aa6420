//! A node's history: one JSON object per line, appended as things happen, stamped with the
//! host's shared `CLOCK_BOOTTIME` so that the histories of all processes of a host can be
//! merged and checked.
//!
//! Fields of every line: `t` (ns of `CLOCK_BOOTTIME`), `node` (`host:port`), `inc` (the
//! node's incarnation, hex) and `event`; cluster events add `member`, `member_inc`, `age`.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};

use tenure_lease::{LeaseObserver, LeaseTrace};

use crate::identity::{Incarnation, NodeAddr};

/// An append-only history file shared by the parts of one node.
#[derive(Clone)]
pub struct History {
    file: Arc<Mutex<File>>,
    node: String,
    inc: String,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History").field("node", &self.node).finish()
    }
}

impl History {
    /// Opens (creating or appending to) the history at `path`.
    pub fn open(
        path: &Path,
        node: &NodeAddr,
        incarnation: Incarnation,
    ) -> std::io::Result<History> {
        History::open_for_owner(path, &node.to_string(), incarnation)
    }

    /// Opens the history at `path` for a process that holds leases as `owner` without
    /// being a cluster node (e.g. `tenure lease run`): its lines name `owner` as their
    /// `node`, and `incarnation` tells this process from others of the same owner.
    pub fn open_for_owner(
        path: &Path,
        owner: &str,
        incarnation: Incarnation,
    ) -> std::io::Result<History> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(History {
            file: Arc::new(Mutex::new(file)),
            node: owner.to_string(),
            inc: incarnation.to_string(),
        })
    }

    /// A lease observer appending every lease trace as a `lease_*` event (see
    /// docs/history.md): `lease`, `owner` and the trace's fields.
    pub fn lease_observer(&self) -> LeaseObserver {
        let history = self.clone();
        LeaseObserver::new(move |lease, owner, trace| {
            let (event, mut fields) = match trace {
                LeaseTrace::AcquireInvoked => ("lease_acquire", json!({})),
                LeaseTrace::Granted { token, valid_until } => (
                    "lease_granted",
                    json!({"token": token, "valid_until": valid_until}),
                ),
                LeaseTrace::NotGranted { holder } => {
                    ("lease_not_granted", json!({"holder": holder}))
                }
                LeaseTrace::Renewed { token, valid_until } => (
                    "lease_renewed",
                    json!({"token": token, "valid_until": valid_until}),
                ),
                LeaseTrace::Lost { token, reason } => {
                    ("lease_lost", json!({"token": token, "reason": reason}))
                }
                LeaseTrace::Released { token } => ("lease_released", json!({"token": token})),
                LeaseTrace::Suspended { token, error } => {
                    ("lease_suspended", json!({"token": token, "error": error}))
                }
                LeaseTrace::Resumed { token } => ("lease_resumed", json!({"token": token})),
                LeaseTrace::Error { operation, error } => {
                    ("lease_error", json!({"op": operation, "error": error}))
                }
            };
            fields["lease"] = json!(lease);
            fields["owner"] = json!(owner);
            history.record(event, fields);
        })
    }

    /// Appends one event with extra `fields` (an object).
    pub fn record(&self, event: &str, fields: Value) {
        let mut line = Map::new();
        line.insert("t".into(), json!(tenure_lease::clock::boottime_now_ns()));
        line.insert("node".into(), json!(self.node));
        line.insert("inc".into(), json!(self.inc));
        line.insert("event".into(), json!(event));
        if let Value::Object(extra) = fields {
            line.extend(extra);
        }
        let mut text = Value::Object(line).to_string();
        text.push('\n');
        // One write per line with O_APPEND: lines of concurrent writers do not interleave.
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = file.write_all(text.as_bytes()) {
            tracing::warn!(error = %e, "cannot append to the history");
        }
    }
}
