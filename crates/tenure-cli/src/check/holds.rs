//! Holds: the intervals in which a node believed it held a lease, rebuilt from the
//! `lease_*` events of a history and the faults a harness recorded.

use std::collections::BTreeMap;

use super::event::Event;

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
    pub node: String,
    pub inc: String,
    pub token: u64,
    pub from_ns: i64,
    pub until_ns: i64,
    pub end: HoldEnd,
    /// The `lease_granted` event that started it.
    pub granted: Event,
    /// The event that ended it (release, loss, kill), if any.
    pub ended: Option<Event>,
    /// The last `valid_until` the holder recorded (grant or renewal).
    valid_until: i64,
}

impl Hold {
    /// The last `valid_until` the holder recorded: the latest instant it could believe, and
    /// act on, this grant.
    pub fn valid_until(&self) -> i64 {
        self.valid_until
    }

    /// Whether two holds belong to the same owner (node and incarnation).
    pub fn same_owner(&self, other: &Hold) -> bool {
        self.node == other.node && self.inc == other.inc
    }
}

/// The holds of every lease named in the history, each lease's sorted by start.
pub fn holds(events: &[Event]) -> BTreeMap<String, Vec<Hold>> {
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
            if matches!(e.kind.as_str(), "killed" | "terminated") {
                let keys: Vec<_> = open.keys().filter(|k| k.1 == e.node).cloned().collect();
                for k in keys {
                    let hold = open.remove(&k).expect("key listed above");
                    close(k, hold, e.t, HoldEnd::Killed, Some(e.clone()));
                }
            }
            continue;
        }
        let (Some(lease), Some(token)) = (e.str("lease"), e.u64("token")) else {
            continue;
        };
        let key = (lease.to_string(), e.node.clone(), e.inc.clone(), token);
        match e.kind.as_str() {
            "lease_granted" => {
                let valid_until = e.i64("valid_until").unwrap_or(i64::MAX);
                match open.get_mut(&key) {
                    Some(h) => h.valid_until = h.valid_until.max(valid_until),
                    None => {
                        open.insert(
                            key,
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
                }
            }
            "lease_renewed" => {
                if let Some(h) = open.get_mut(&key) {
                    let v = e.i64("valid_until").unwrap_or(h.valid_until);
                    h.valid_until = h.valid_until.max(v);
                }
            }
            "lease_lost" | "lease_released" => {
                if let Some(hold) = open.remove(&key) {
                    let end = if e.kind == "lease_lost" {
                        HoldEnd::Lost(e.str("reason").unwrap_or("unknown").to_string())
                    } else {
                        HoldEnd::Released
                    };
                    close(key, hold, e.t, end, Some(e.clone()));
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
