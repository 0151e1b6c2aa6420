//! Holds: the intervals in which a node believed it held a lease, rebuilt from the
//! `lease_*` events of a history and the faults a harness recorded.

use std::collections::BTreeMap;

use crate::{Entry, Event};

/// How a hold ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldEnd {
    /// The holder gave it up to release it (`lease_released`).
    Released,
    /// The holder announced the loss (`lease_lost`, with its reason).
    Lost(String),
    /// The process was killed (harness `killed`) or exited (`terminated`).
    Killed,
    /// The history shows no end: the hold counts as possibly held until its last
    /// `valid_until` (the latest instant its holder could still believe it).
    Unknown,
}

/// One believed grant: node `node` (incarnation `inc`) believed it held the lease with
/// `token` from `from_ns` until `until_ns` (ns of `CLOCK_BOOTTIME`).
#[derive(Debug, Clone, PartialEq)]
pub struct Hold {
    /// The node that believed it (`host:port`).
    pub node: String,
    /// The node's incarnation.
    pub inc: String,
    /// The grant's fencing token.
    pub token: u64,
    /// When the belief began: the `lease_granted`'s `t`.
    pub from_ns: i64,
    /// When it ended: the end event's `t`, but never later than the last `valid_until`
    /// (which is the end when the history shows none).
    pub until_ns: i64,
    /// How it ended.
    pub end: HoldEnd,
    /// The `lease_granted` event that started it.
    pub granted: Entry,
    /// The event that ended it (release, loss, kill), if any.
    pub ended: Option<Entry>,
    /// The last `valid_until` the holder recorded (grant or renewal).
    valid_until: i64,
}

impl Hold {
    /// The last `valid_until` the holder recorded: the latest instant it could believe, and
    /// act on, this grant.
    pub fn valid_until(&self) -> i64 {
        self.valid_until
    }

    /// Whether its holder learned of the grant before its validity ended. `false`: the
    /// answer came only past `valid_until` (the node was frozen or starved between its
    /// request and the answer), so the holder never believed it and lost it at once; the
    /// store made the grant somewhere between the request and the `lease_granted` event,
    /// which therefore says nothing of its place among other grants.
    pub fn believed(&self) -> bool {
        self.valid_until > self.from_ns
    }

    /// Whether two holds belong to the same owner (node and incarnation).
    pub fn same_owner(&self, other: &Hold) -> bool {
        self.node == other.node && self.inc == other.inc
    }
}

/// The holds of every lease named in the history, each lease's sorted by start.
pub fn holds(events: &[Entry]) -> BTreeMap<String, Vec<Hold>> {
    // Open holds by (lease, node, inc, token).
    let mut open: BTreeMap<(String, String, String, u64), Hold> = BTreeMap::new();
    let mut done: BTreeMap<String, Vec<Hold>> = BTreeMap::new();
    let mut close = |key: (String, String, String, u64), mut hold: Hold, at: i64, end, ev| {
        hold.until_ns = at.min(hold.valid_until).max(hold.from_ns);
        hold.end = end;
        hold.ended = ev;
        done.entry(key.0).or_default().push(hold);
    };
    for e in events {
        if e.is_fault() {
            if matches!(e.event, Event::Killed {} | Event::Terminated {}) {
                let keys: Vec<_> = open.keys().filter(|k| k.1 == e.node).cloned().collect();
                for k in keys {
                    if let Some(hold) = open.remove(&k) {
                        close(k, hold, e.t, HoldEnd::Killed, Some(e.clone()));
                    }
                }
            }
            continue;
        }
        let key = |lease: &str, token| (lease.to_string(), e.node.clone(), e.inc.clone(), token);
        match &e.event {
            &Event::LeaseGranted {
                ref lease,
                token,
                valid_until,
                ..
            } => match open.get_mut(&key(lease, token)) {
                Some(h) => h.valid_until = h.valid_until.max(valid_until),
                None => {
                    open.insert(
                        key(lease, token),
                        Hold {
                            node: e.node.clone(),
                            inc: e.inc.clone(),
                            token,
                            from_ns: e.t,
                            until_ns: valid_until,
                            end: HoldEnd::Unknown,
                            granted: e.clone(),
                            ended: None,
                            valid_until,
                        },
                    );
                }
            },
            &Event::LeaseRenewed {
                ref lease,
                token,
                valid_until,
                ..
            } => {
                if let Some(h) = open.get_mut(&key(lease, token)) {
                    h.valid_until = h.valid_until.max(valid_until);
                }
            }
            Event::LeaseLost {
                lease,
                token,
                reason,
                ..
            } => {
                if let Some(hold) = open.remove(&key(lease, *token)) {
                    let end = HoldEnd::Lost(reason.clone());
                    close(key(lease, *token), hold, e.t, end, Some(e.clone()));
                }
            }
            Event::LeaseReleased { lease, token, .. } => {
                if let Some(hold) = open.remove(&key(lease, *token)) {
                    close(
                        key(lease, *token),
                        hold,
                        e.t,
                        HoldEnd::Released,
                        Some(e.clone()),
                    );
                }
            }
            _ => {}
        }
    }
    for (key, hold) in std::mem::take(&mut open) {
        let at = hold.valid_until;
        close(key, hold, at, HoldEnd::Unknown, None);
    }
    for list in done.values_mut() {
        list.sort_by_key(|h| (h.from_ns, h.token));
    }
    done
}
