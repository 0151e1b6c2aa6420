//! A node's history file: one [`Event`] per line (docs/history.md), appended as things
//! happen, stamped with the host's shared `CLOCK_BOOTTIME` so that the histories of all
//! processes of a host can be merged and checked. The event types and the reader live in
//! [`tenure_lease::history`].

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use tenure_lease::history::{Entry, Event};
use tenure_lease::{LeaseObserver, ProcessEnd, Terminator, WhenKillFails};

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

    /// A lease observer appending every lease trace as a `lease_*` event.
    pub fn lease_observer(&self) -> LeaseObserver {
        let history = self.clone();
        LeaseObserver::new(move |lease, owner, trace| {
            history.record(Event::from_trace(lease, owner, trace))
        })
    }

    /// A supervisor's [`Terminator`] following `policy` (the setting `key`, e.g.
    /// `sharding.when-kill-fails`) that, when `history` is given, records `process_abort`
    /// in it before `end` ends the process (one synchronous write: no await between the
    /// line and the end).
    pub fn terminator(
        history: Option<History>,
        policy: WhenKillFails,
        key: &str,
        end: ProcessEnd,
    ) -> Terminator {
        Terminator::new(policy, key, end, move |what| {
            if let Some(h) = &history {
                h.record(Event::ProcessAbort {
                    lease: what.lease.clone(),
                    token: what.token.get(),
                    what: what.what.clone(),
                });
            }
        })
    }

    /// Appends `event` about this node, stamped now.
    pub fn record(&self, event: Event) {
        self.append(&Entry::now(self.node.clone(), self.inc.clone(), event));
    }

    /// Appends `entry` as it is (e.g. a harness's fault about another process).
    pub fn append(&self, entry: &Entry) {
        let mut text = entry.to_json().to_string();
        text.push('\n');
        // One write per line with O_APPEND: lines of concurrent writers do not interleave.
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = file.write_all(text.as_bytes()) {
            tracing::warn!(error = %e, "cannot append to the history");
        }
    }
}
