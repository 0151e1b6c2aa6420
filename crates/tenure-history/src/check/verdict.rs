//! The checks over holds and writes, and their verdict.

use std::collections::BTreeMap;

use super::actions::{ActionRule, check_actions};
use super::holds::{Hold, holds};
use crate::{Entry, Event};

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
    /// More holders of a semaphore's permits at one time than it has permits.
    TooManyHolders,
    /// A durable entity's journal skips or repeats a sequence number.
    EventGap,
    /// An event was appended to a journal under a token older than its shard lease's
    /// current grant (or lower than an earlier event's).
    StaleAppend,
    /// A journal event was appended twice (two recorded appends of one sequence number).
    DuplicateEvent,
    /// An appended event is not in the journal (or is there with another token).
    LostEvent,
    /// A recovery missed events appended before it, or its state is not what the journal's
    /// events make.
    RecoveryMismatch,
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
            ViolationKind::TooManyHolders => "more holders than permits",
            ViolationKind::EventGap => "journal sequence not contiguous",
            ViolationKind::StaleAppend => "stale append accepted",
            ViolationKind::DuplicateEvent => "event appended twice",
            ViolationKind::LostEvent => "appended event lost",
            ViolationKind::RecoveryMismatch => "recovered state does not match the journal",
        })
    }
}

/// One violation, with the two events that show it.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    /// What kind of violation.
    pub kind: ViolationKind,
    /// The lease, or the resource for a stale write.
    pub subject: String,
    /// What happened, in words.
    pub explanation: String,
    /// The earlier of the two events that show it.
    pub first: Entry,
    /// The later of the two events that show it (violations are sorted by its `t`).
    pub second: Entry,
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
    /// Lines read.
    pub events: usize,
    /// Leases with at least one hold.
    pub leases: usize,
    /// Grants (`lease_granted`).
    pub grants: usize,
    /// Losses announced (`lease_lost`).
    pub losses: usize,
    /// Releases (`lease_released`).
    pub releases: usize,
    /// Store calls with an unknown outcome (`lease_error`).
    pub unknown: usize,
    /// Fenced writes accepted (`write` and `tick`).
    pub writes_accepted: usize,
    /// Fenced writes refused for a stale token.
    pub writes_rejected: usize,
    /// Actions checked against holds: entity lives, singleton instances, accepted writes.
    pub actions: usize,
    /// Faults injected by a harness.
    pub faults: usize,
    /// Processes that ended themselves because something outlived its kill
    /// (`process_abort`).
    pub aborts: usize,
}

/// What the checker found: violations (empty = safe), and the holds it rebuilt.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// Every violation found, in the order of the later event's `t`; empty: safe.
    pub violations: Vec<Violation>,
    /// The holds rebuilt, per lease name, each lease's sorted by start.
    pub holds: BTreeMap<String, Vec<Hold>>,
    /// Counts of what the history holds.
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

/// Checks `events` (sorted by `t`, as [`read_history`](crate::read_history) returns them)
/// with the default [`ActionRule`].
pub fn check(events: &[Entry]) -> Verdict {
    check_with(events, ActionRule::default())
}

/// Checks `events` with the action rule `rule`.
pub fn check_with(events: &[Entry], rule: ActionRule) -> Verdict {
    let holds = holds(events);
    let mut violations = Vec::new();
    for (lease, list) in &holds {
        check_lease(lease, list, &mut violations);
    }
    check_semaphores(&holds, &mut violations);
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
        match &e.event {
            Event::LeaseGranted { .. } => stats.grants += 1,
            Event::LeaseLost { .. } => stats.losses += 1,
            Event::LeaseReleased { .. } => stats.releases += 1,
            Event::LeaseError { .. } => stats.unknown += 1,
            Event::Write { accepted, .. } | Event::Tick { accepted, .. } => match accepted {
                true => stats.writes_accepted += 1,
                false => stats.writes_rejected += 1,
            },
            _ if e.is_fault() => stats.faults += 1,
            Event::ProcessAbort { .. } => stats.aborts += 1,
            _ => {}
        }
    }
    Verdict {
        violations,
        holds,
        stats,
    }
}

/// Overlaps and token order among the holds of one lease. A grant its holder never
/// believed ([`Hold::believed`]) takes part in neither: it held nothing, and its event's
/// time is not when the store made it.
fn check_lease(lease: &str, list: &[Hold], out: &mut Vec<Violation>) {
    for (i, later) in list.iter().enumerate() {
        if !later.believed() {
            continue;
        }
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
            .filter(|h| h.believed() && !(h.same_owner(later) && h.token == later.token))
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

/// At most N holders of semaphore permits at a time (Tenure's counting semaphore): the holds
/// of every permit lease `<name>.permit-<k>-of-<N>` of one semaphore, counted over time,
/// never exceed the smallest N its permits name. (An election is one lease: at most one
/// leader at a time is [`ViolationKind::Overlap`]'s rule.)
/// `(semaphore, slot, permits)` of a permit's lease name `<name>.permit-<k>-of-<n>` (the
/// semaphore's naming, docs/history.md); `None` for any other lease name.
fn permit_of(lease: &str) -> Option<(&str, u32, u32)> {
    let (name, rest) = lease.rsplit_once(".permit-")?;
    let (slot, permits) = rest.split_once("-of-")?;
    let (slot, permits) = (slot.parse().ok()?, permits.parse().ok()?);
    (slot < permits).then_some((name, slot, permits))
}

fn check_semaphores(holds: &BTreeMap<String, Vec<Hold>>, out: &mut Vec<Violation>) {
    let mut by_semaphore: BTreeMap<&str, (u32, Vec<&Hold>)> = BTreeMap::new();
    for (lease, list) in holds {
        if let Some((name, _, permits)) = permit_of(lease) {
            let entry = by_semaphore.entry(name).or_insert((permits, Vec::new()));
            entry.0 = entry.0.min(permits);
            entry.1.extend(list);
        }
    }
    for (name, (permits, mut list)) in by_semaphore {
        list.sort_by_key(|h| h.from_ns);
        for (i, later) in list.iter().enumerate() {
            // Holds that started earlier and are still held when `later` starts.
            let open: Vec<&&Hold> = list[..i]
                .iter()
                .filter(|h| h.until_ns > later.from_ns)
                .collect();
            if open.len() < permits as usize {
                continue;
            }
            let earliest = open
                .iter()
                .min_by_key(|h| h.from_ns)
                .map(|h| h.granted.clone())
                .unwrap_or_else(|| later.granted.clone());
            out.push(Violation {
                kind: ViolationKind::TooManyHolders,
                subject: name.to_string(),
                explanation: format!(
                    "{} took a permit while {} others were held ({}), and the semaphore has {permits}",
                    describe(later),
                    open.len(),
                    open.iter()
                        .map(|h| describe(h))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                first: earliest,
                second: later.granted.clone(),
            });
        }
    }
}

/// The resource a write or tick event is about, its position in the resource's own order
/// (`value`, which grows with every accepted write; else the event's time), whether the
/// event had a value, and the token.
fn accepted_write(e: &Entry) -> Option<(String, i64, bool, u64)> {
    let (name, value, token) = match &e.event {
        Event::Write {
            entity_type,
            entity,
            value,
            token,
            accepted: true,
            ..
        } => (format!("{entity_type}/{entity}"), value, token),
        Event::Tick {
            singleton,
            value,
            token,
            accepted: true,
        } => (format!("singleton/{singleton}"), value, token),
        _ => return None,
    };
    let order = value.and_then(|v| i64::try_from(v).ok());
    Some((name, order.unwrap_or(e.t), order.is_some(), *token))
}

fn check_writes(events: &[Entry], out: &mut Vec<Violation>) {
    let mut accepted: BTreeMap<String, Vec<(i64, bool, u64, &Entry)>> = BTreeMap::new();
    for e in events {
        if let Some((name, order, has_value, token)) = accepted_write(e) {
            accepted
                .entry(name)
                .or_default()
                .push((order, has_value, token, e));
        }
    }
    for (name, mut writes) in accepted {
        writes.sort_by_key(|w| (w.0, w.3.t));
        // Two writes accepted at one position of the resource's order: one overwrote the
        // other (a lost update).
        if let Some(pair) = writes.windows(2).find(|p| p[0].0 == p[1].0 && p[1].1) {
            out.push(Violation {
                kind: ViolationKind::DuplicateWrite,
                subject: name.clone(),
                explanation: format!("accepted two writes with value {}", pair[1].0),
                first: pair[0].3.clone(),
                second: pair[1].3.clone(),
            });
        }
        let mut highest: Option<(u64, &Entry)> = None;
        for (_, _, token, e) in writes {
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
