//! The checks over holds and writes, and their verdict.

use std::collections::BTreeMap;

use super::actions::{ActionRule, check_actions};
use super::event::Event;
use super::holds::{Hold, holds};

/// The kinds of safety violation the checker finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViolationKind {
    /// Two owners believed to hold one lease at overlapping times.
    Overlap,
    /// A grant's token is not greater than the token of an earlier grant.
    TokenOrder,
    /// The same owner was granted a new token while its previous hold was still believed.
    NotPreceded,
    /// A write was accepted with a token lower than one the resource accepted before.
    StaleWrite,
    /// A client was told a write succeeded that the resource never accepted (or twice).
    UnbackedAck,
    /// An acknowledged write is not in the resource's final state.
    LostAck,
    /// Two writes were accepted at the same position of a resource's order (`value`).
    DuplicateWrite,
    /// An entity or singleton instance ran, or a fenced write was accepted, outside its
    /// node's hold of the matching lease.
    ActionOutsideHold,
    /// An entity was alive outside its shard's life on its node (`shard_started` ..
    /// `shard_stopped`, same token).
    EntityOutsideShard,
}

impl std::fmt::Display for ViolationKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ViolationKind::Overlap => "overlapping holders",
            ViolationKind::TokenOrder => "token not increasing",
            ViolationKind::NotPreceded => "grant before the previous grant ended",
            ViolationKind::StaleWrite => "stale write accepted",
            ViolationKind::UnbackedAck => "acknowledged write not accepted",
            ViolationKind::LostAck => "acknowledged write lost",
            ViolationKind::DuplicateWrite => "write accepted twice at one position",
            ViolationKind::ActionOutsideHold => "action outside the hold",
            ViolationKind::EntityOutsideShard => "entity outside its shard",
        })
    }
}

/// One violation, with the two events that show it.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    pub kind: ViolationKind,
    /// The lease, or the resource for a stale write.
    pub subject: String,
    pub explanation: String,
    pub first: Event,
    pub second: Event,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{} on {}: {}", self.kind, self.subject, self.explanation)?;
        writeln!(f, "  first:  {}", self.first)?;
        write!(f, "  second: {}", self.second)
    }
}

/// Counts of what the history holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub events: usize,
    pub leases: usize,
    pub grants: usize,
    pub losses: usize,
    pub releases: usize,
    /// Store calls with an unknown outcome (`lease_error`).
    pub unknown: usize,
    pub writes_accepted: usize,
    pub writes_rejected: usize,
    /// Actions checked against holds: entity lives, singleton instances, accepted writes.
    pub actions: usize,
    /// Faults injected by a harness.
    pub faults: usize,
}

/// What the checker found: violations (empty = safe), and the holds it rebuilt.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub violations: Vec<Violation>,
    pub holds: BTreeMap<String, Vec<Hold>>,
    pub stats: Stats,
}

impl Verdict {
    /// No violation found.
    pub fn is_safe(&self) -> bool {
        self.violations.is_empty()
    }
}

fn ms(ns: i64) -> String {
    format!("{:.3} ms", ns as f64 / 1e6)
}

fn describe(h: &Hold) -> String {
    format!("{} ({}) token {}", h.node, h.inc, h.token)
}

/// Checks `events` (sorted by `t`, as [`read_history`](super::read_history) returns them)
/// with the default [`ActionRule`].
pub fn check(events: &[Event]) -> Verdict {
    check_with(events, ActionRule::default())
}

/// Checks `events` with the action rule `rule`.
pub fn check_with(events: &[Event], rule: ActionRule) -> Verdict {
    let holds = holds(events);
    let mut violations = Vec::new();
    for (lease, list) in &holds {
        check_lease(lease, list, &mut violations);
    }
    check_writes(events, &mut violations);
    let actions = check_actions(events, &holds, rule, &mut violations);
    violations.sort_by_key(|v| v.second.t);
    let mut stats = Stats {
        events: events.len(),
        leases: holds.len(),
        actions,
        ..Stats::default()
    };
    for e in events {
        match e.kind.as_str() {
            "lease_granted" => stats.grants += 1,
            "lease_lost" => stats.losses += 1,
            "lease_released" => stats.releases += 1,
            "lease_error" => stats.unknown += 1,
            "write" | "tick" if e.fields.get("accepted") == Some(&true.into()) => {
                stats.writes_accepted += 1
            }
            "write" | "tick" => stats.writes_rejected += 1,
            _ if e.is_fault() => stats.faults += 1,
            _ => {}
        }
    }
    Verdict {
        violations,
        holds,
        stats,
    }
}

fn check_lease(lease: &str, list: &[Hold], out: &mut Vec<Violation>) {
    for (i, later) in list.iter().enumerate() {
        for earlier in &list[..i] {
            if earlier.until_ns <= later.from_ns {
                continue;
            }
            let (kind, why) = if earlier.same_owner(later) {
                if earlier.token == later.token {
                    continue;
                }
                (
                    ViolationKind::NotPreceded,
                    "granted a new token while its previous grant was still believed",
                )
            } else {
                (
                    ViolationKind::Overlap,
                    "granted while another owner still believed it held the lease",
                )
            };
            out.push(Violation {
                kind,
                subject: lease.to_string(),
                explanation: format!(
                    "{} {why}: {} held it until {} later",
                    describe(later),
                    describe(earlier),
                    ms(earlier.until_ns - later.from_ns)
                ),
                first: earlier.granted.clone(),
                second: later.granted.clone(),
            });
        }
        if let Some(prev) = list[..i]
            .iter()
            .filter(|h| !(h.same_owner(later) && h.token == later.token))
            .max_by_key(|h| h.token)
            && prev.token >= later.token
        {
            out.push(Violation {
                kind: ViolationKind::TokenOrder,
                subject: lease.to_string(),
                explanation: format!(
                    "{} was granted after {}, with a token not greater",
                    describe(later),
                    describe(prev)
                ),
                first: prev.granted.clone(),
                second: later.granted.clone(),
            });
        }
    }
}

/// The resource a write or tick event is about, and its position in the resource's own
/// order (`value`, which grows with every accepted write; else the event's time).
fn resource(e: &Event) -> Option<(String, i64)> {
    let name = match e.kind.as_str() {
        "write" => format!(
            "{}/{}",
            e.str("type").unwrap_or(""),
            e.str("resource").or(e.str("entity"))?
        ),
        "tick" => format!("singleton/{}", e.str("singleton")?),
        _ => return None,
    };
    Some((name, e.i64("value").unwrap_or(e.t)))
}

fn check_writes(events: &[Event], out: &mut Vec<Violation>) {
    let mut accepted: BTreeMap<String, Vec<(i64, u64, &Event)>> = BTreeMap::new();
    for e in events {
        if e.fields.get("accepted") != Some(&true.into()) {
            continue;
        }
        if let (Some((name, order)), Some(token)) = (resource(e), e.u64("token")) {
            accepted.entry(name).or_default().push((order, token, e));
        }
    }
    for (name, mut writes) in accepted {
        writes.sort_by_key(|w| (w.0, w.2.t));
        // Two writes accepted at one position of the resource's order: one overwrote the
        // other (a lost update).
        if let Some(pair) = writes
            .windows(2)
            .find(|p| p[0].0 == p[1].0 && p[1].2.i64("value").is_some())
        {
            out.push(Violation {
                kind: ViolationKind::DuplicateWrite,
                subject: name.clone(),
                explanation: format!("accepted two writes with value {}", pair[1].0),
                first: pair[0].2.clone(),
                second: pair[1].2.clone(),
            });
        }
        let mut highest: Option<(u64, &Event)> = None;
        for (_, token, e) in writes {
            match highest {
                Some((top, first)) if token < top => {
                    out.push(Violation {
                        kind: ViolationKind::StaleWrite,
                        subject: name.clone(),
                        explanation: format!(
                            "accepted a write with token {token} after one with token {top}"
                        ),
                        first: first.clone(),
                        second: e.clone(),
                    });
                    break;
                }
                Some((top, _)) if token == top => {}
                _ => highest = Some((token, e)),
            }
        }
    }
}
