//! Durable entities' journals against the history: what the journal holds now, judged with
//! what the nodes recorded while they appended (`journal_appended`), recovered
//! (`entity_recovered`) and acknowledged (`ack`), and with the shard leases' grants.
//!
//! The rules, per persistence id (`<type>|<entity>`):
//! - **contiguous**: the journal's sequence numbers are 1, 2, 3… without a gap or a repeat;
//! - **exactly once**: every acknowledged command's last event (an `ack`'s `value`, the
//!   sequence number a durable entity's reply names) was appended by one recorded
//!   `journal_appended` with the ack's token, and the journal holds it with that token;
//!   no sequence number was appended twice, and every appended event is still there;
//! - **fenced**: no event was appended under a token older than the shard lease's current
//!   grant when the append was sent (a `lease_granted` of a higher token recorded before
//!   the append's `issued`), and the journal's tokens never go down along its sequence;
//! - **recovered**: a recovery saw every event appended before it began, nothing past the
//!   journal's end, and, when the caller can replay events into a state, the state it
//!   recovered (its digest) is the one the journal's events make.

use std::collections::{BTreeMap, HashMap};

use serde_json::Map;

use super::verdict::{Violation, ViolationKind};
use crate::{Entry, Event};

/// One event as a journal holds it, read for the checker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEvent {
    /// Its persistence id (`<type>|<entity>` for a sharded durable entity).
    pub persistence_id: String,
    /// Its sequence number.
    pub seq: u64,
    /// The fencing token of the grant it was appended under.
    pub token: u64,
    /// The owner that appended it.
    pub writer: String,
    /// The event, as it was encoded.
    pub payload: Vec<u8>,
}

/// Rebuilds the encoded state (as the entity encodes it, e.g. `serde_json::to_vec`) of the
/// persistence id from its first events, in order; `None` when it cannot (an event it
/// cannot decode, a persistence id it does not know): that recovery's state is then not
/// compared.
pub type Replay<'a> = &'a dyn Fn(&str, &[JournalEvent]) -> Option<Vec<u8>>;

/// What the journal check found.
#[derive(Debug, Clone, Default)]
pub struct JournalCheck {
    /// Events read from the journal.
    pub events: usize,
    /// Persistence ids in the journal.
    pub persistence_ids: usize,
    /// Appends the history records (`journal_appended`).
    pub appends: usize,
    /// Appends the journal refused (`journal_refused`).
    pub refused: usize,
    /// Recoveries checked (`entity_recovered`).
    pub recoveries: usize,
    /// Recovered states compared with a replay of the journal.
    pub states_compared: usize,
    /// Acknowledgements checked against the journal.
    pub acked: usize,
    /// What it found.
    pub violations: Vec<Violation>,
}

/// The FNV-1a 64 digest of `bytes`, in 16 hex digits: what `entity_recovered` records of
/// the recovered state's encoding.
pub fn state_digest(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// The persistence id of entity `entity` of type `entity_type`, as durable sharded
/// entities name theirs.
fn persistence_id(entity_type: &str, entity: &str) -> String {
    format!("{entity_type}|{entity}")
}

/// A history entry standing for what the journal holds (the checker's evidence when the
/// history has none): `journal_event` at the end of the history.
fn journal_entry(end: i64, e: &JournalEvent) -> Entry {
    let mut fields = Map::new();
    fields.insert("persistence_id".into(), e.persistence_id.clone().into());
    fields.insert("seq".into(), e.seq.into());
    fields.insert("token".into(), e.token.into());
    fields.insert("writer".into(), e.writer.clone().into());
    Entry::new(
        end,
        e.writer.clone(),
        "journal",
        Event::Other {
            kind: "journal_event".into(),
            fields,
        },
    )
}

/// An appended range as the history records it.
struct Appended<'a> {
    entry: &'a Entry,
    entity_type: &'a str,
    shard: &'a str,
    token: u64,
    from_seq: u64,
    to_seq: u64,
    issued: i64,
}

/// Checks `journal` (every event of every persistence id, in any order) against `history`
/// (sorted by `t`), replaying states with `replay` when given. See the module docs.
pub fn check_journal(
    history: &[Entry],
    journal: &[JournalEvent],
    replay: Option<Replay<'_>>,
) -> JournalCheck {
    let end = history.last().map_or(0, |e| e.t);
    let mut out = JournalCheck {
        events: journal.len(),
        ..JournalCheck::default()
    };
    let mut by_pid: BTreeMap<&str, Vec<&JournalEvent>> = BTreeMap::new();
    for e in journal {
        by_pid.entry(&e.persistence_id).or_default().push(e);
    }
    out.persistence_ids = by_pid.len();
    for list in by_pid.values_mut() {
        list.sort_by_key(|e| e.seq);
    }
    check_contiguous(&by_pid, end, &mut out.violations);

    let mut appended: BTreeMap<String, Vec<Appended<'_>>> = BTreeMap::new();
    for e in history {
        match &e.event {
            Event::JournalAppended {
                entity_type,
                shard,
                entity,
                token,
                from_seq,
                to_seq,
                issued,
            } => appended
                .entry(persistence_id(entity_type, entity))
                .or_default()
                .push(Appended {
                    entry: e,
                    entity_type,
                    shard,
                    token: *token,
                    from_seq: *from_seq,
                    to_seq: *to_seq,
                    issued: *issued,
                }),
            Event::JournalRefused { .. } => out.refused += 1,
            _ => {}
        }
    }
    out.appends = appended.values().map(Vec::len).sum();

    let grants = shard_grants(history);
    for (pid, list) in &appended {
        let held = by_pid.get(pid.as_str());
        check_appended(pid, list, held, end, &mut out.violations);
        check_fenced(pid, list, &grants, &mut out.violations);
    }
    check_acks(history, &appended, &by_pid, end, &mut out);
    check_recoveries(history, &appended, &by_pid, replay, &mut out);
    out.violations.sort_by_key(|v| v.second.t);
    out
}

/// Sequence numbers 1, 2, 3… per persistence id, and tokens that never go down.
fn check_contiguous(
    by_pid: &BTreeMap<&str, Vec<&JournalEvent>>,
    end: i64,
    out: &mut Vec<Violation>,
) {
    for (pid, list) in by_pid {
        let mut expected = 1;
        let mut previous: Option<&JournalEvent> = None;
        for e in list {
            if e.seq != expected {
                let first =
                    previous.map_or_else(|| journal_entry(end, e), |p| journal_entry(end, p));
                out.push(Violation {
                    kind: ViolationKind::EventGap,
                    subject: format!("journal/{pid}"),
                    explanation: format!(
                        "the journal holds event {} where {expected} was expected next",
                        e.seq
                    ),
                    first,
                    second: journal_entry(end, e),
                });
                break;
            }
            if let Some(p) = previous
                && e.token < p.token
            {
                out.push(Violation {
                    kind: ViolationKind::StaleAppend,
                    subject: format!("journal/{pid}"),
                    explanation: format!(
                        "event {} was appended with token {} after event {} with token {}",
                        e.seq, e.token, p.seq, p.token
                    ),
                    first: journal_entry(end, p),
                    second: journal_entry(end, e),
                });
            }
            previous = Some(e);
            expected = e.seq + 1;
        }
    }
}

/// Every recorded append is in the journal with its token, and no sequence number was
/// appended twice.
fn check_appended(
    pid: &str,
    list: &[Appended<'_>],
    held: Option<&Vec<&JournalEvent>>,
    end: i64,
    out: &mut Vec<Violation>,
) {
    let mut by_seq: HashMap<u64, &Entry> = HashMap::new();
    for a in list {
        for seq in a.from_seq..=a.to_seq {
            if let Some(earlier) = by_seq.insert(seq, a.entry) {
                out.push(Violation {
                    kind: ViolationKind::DuplicateEvent,
                    subject: format!("journal/{pid}"),
                    explanation: format!("event {seq} was appended twice"),
                    first: earlier.clone(),
                    second: a.entry.clone(),
                });
                break;
            }
            let found =
                held.and_then(|l| l.binary_search_by_key(&seq, |e| e.seq).ok().map(|i| l[i]));
            match found {
                Some(e) if e.token == a.token => {}
                Some(e) => {
                    out.push(Violation {
                        kind: ViolationKind::LostEvent,
                        subject: format!("journal/{pid}"),
                        explanation: format!(
                            "event {seq} was appended with token {} but the journal holds one with token {}",
                            a.token, e.token
                        ),
                        first: a.entry.clone(),
                        second: journal_entry(end, e),
                    });
                    break;
                }
                None => {
                    out.push(Violation {
                        kind: ViolationKind::LostEvent,
                        subject: format!("journal/{pid}"),
                        explanation: format!(
                            "event {seq} was appended with token {} but the journal does not hold it",
                            a.token
                        ),
                        first: a.entry.clone(),
                        second: a.entry.clone(),
                    });
                    break;
                }
            }
        }
    }
}

/// The grants of every shard lease, by `-shard-<type>-<shard>` (a node runs one system),
/// each `(t, token, entry)` in the history's order.
fn shard_grants(history: &[Entry]) -> HashMap<String, Vec<(i64, u64, &Entry)>> {
    let mut grants: HashMap<String, Vec<(i64, u64, &Entry)>> = HashMap::new();
    for e in history {
        if let Event::LeaseGranted { lease, token, .. } = &e.event
            && let Some(at) = lease.find("-shard-")
        {
            grants
                .entry(lease[at..].to_string())
                .or_default()
                .push((e.t, *token, e));
        }
    }
    grants
}

/// No append sent after a grant of a higher token of its shard's lease was recorded.
fn check_fenced(
    pid: &str,
    list: &[Appended<'_>],
    grants: &HashMap<String, Vec<(i64, u64, &Entry)>>,
    out: &mut Vec<Violation>,
) {
    for a in list {
        let suffix = format!("-shard-{}-{}", a.entity_type, a.shard);
        let Some(newer) = grants.get(&suffix).and_then(|g| {
            g.iter()
                .filter(|(t, token, _)| *t < a.issued && *token > a.token)
                .max_by_key(|(_, token, _)| *token)
        }) else {
            continue;
        };
        out.push(Violation {
            kind: ViolationKind::StaleAppend,
            subject: format!("journal/{pid}"),
            explanation: format!(
                "events {}..={} were appended with token {}, sent {:.3} ms after the shard lease was granted with token {}",
                a.from_seq,
                a.to_seq,
                a.token,
                (a.issued - newer.0) as f64 / 1e6,
                newer.1
            ),
            first: newer.2.clone(),
            second: a.entry.clone(),
        });
    }
}

/// Every `ack` of a durable entity names the sequence number of its command's last event:
/// one recorded append with the ack's token made it, and the journal holds it with that
/// token; no sequence number is acknowledged twice. Acks of entities without a recorded
/// append of that token (another kind of entity) are left to their own check.
fn check_acks(
    history: &[Entry],
    appended: &BTreeMap<String, Vec<Appended<'_>>>,
    by_pid: &BTreeMap<&str, Vec<&JournalEvent>>,
    end: i64,
    out: &mut JournalCheck,
) {
    // Acks name the entity, not its type: an entity id names one persistence id per type
    // that has appends of it.
    let mut pids_of: HashMap<&str, Vec<&str>> = HashMap::new();
    for (pid, list) in appended {
        if let Some(a) = list.first()
            && let Some(entity) = pid.strip_prefix(&format!("{}|", a.entity_type))
        {
            pids_of.entry(entity).or_default().push(pid);
        }
    }
    let mut acked: HashMap<(&str, u64), &Entry> = HashMap::new();
    for e in history {
        let Event::Ack {
            entity,
            value,
            token,
            ..
        } = &e.event
        else {
            continue;
        };
        let Some(pids) = pids_of.get(entity.as_str()) else {
            continue;
        };
        out.acked += 1;
        let backing = pids.iter().find_map(|pid| {
            appended[*pid]
                .iter()
                .find(|a| a.token == *token && a.from_seq <= *value && *value <= a.to_seq)
                .map(|a| (*pid, a))
        });
        let Some((pid, append)) = backing else {
            out.violations.push(Violation {
                kind: ViolationKind::UnbackedAck,
                subject: format!("journal/{entity}"),
                explanation: format!(
                    "event {value} with token {token} was acknowledged but no recorded append made it"
                ),
                first: e.clone(),
                second: e.clone(),
            });
            continue;
        };
        if let Some(earlier) = acked.insert((pid, *value), e) {
            out.violations.push(Violation {
                kind: ViolationKind::UnbackedAck,
                subject: format!("journal/{pid}"),
                explanation: format!("event {value} was acknowledged twice"),
                first: earlier.clone(),
                second: e.clone(),
            });
            continue;
        }
        let held = by_pid
            .get(pid)
            .and_then(|l| l.binary_search_by_key(value, |j| j.seq).ok().map(|i| l[i]));
        if held.is_none_or(|j| j.token != *token) {
            out.violations.push(Violation {
                kind: ViolationKind::LostAck,
                subject: format!("journal/{pid}"),
                explanation: match held {
                    Some(j) => format!(
                        "event {value} was acknowledged with token {token} but the journal holds one with token {}",
                        j.token
                    ),
                    None => format!(
                        "event {value} was acknowledged but the journal does not hold it"
                    ),
                },
                first: append.entry.clone(),
                second: held.map_or_else(|| e.clone(), |j| journal_entry(end, j)),
            });
        }
    }
}

/// Each recovery saw every event appended before it began and none past the journal's end,
/// and recovered the state the journal's events make (when `replay` is given).
fn check_recoveries(
    history: &[Entry],
    appended: &BTreeMap<String, Vec<Appended<'_>>>,
    by_pid: &BTreeMap<&str, Vec<&JournalEvent>>,
    replay: Option<Replay<'_>>,
    out: &mut JournalCheck,
) {
    for e in history {
        let Event::EntityRecovered {
            entity_type,
            entity,
            seq,
            issued,
            digest,
            ..
        } = &e.event
        else {
            continue;
        };
        out.recoveries += 1;
        let pid = persistence_id(entity_type, entity);
        let subject = format!("journal/{pid}");
        let missed = appended.get(&pid).and_then(|list| {
            list.iter()
                .filter(|a| a.entry.t < *issued && a.to_seq > *seq)
                .max_by_key(|a| a.to_seq)
        });
        if let Some(a) = missed {
            out.violations.push(Violation {
                kind: ViolationKind::RecoveryMismatch,
                subject: subject.clone(),
                explanation: format!(
                    "recovered up to event {seq} but event {} was appended before the recovery began",
                    a.to_seq
                ),
                first: a.entry.clone(),
                second: e.clone(),
            });
            continue;
        }
        let events: Vec<JournalEvent> = by_pid
            .get(pid.as_str())
            .map(|l| {
                l.iter()
                    .take_while(|j| j.seq <= *seq)
                    .map(|j| (*j).clone())
                    .collect()
            })
            .unwrap_or_default();
        if (events.len() as u64) < *seq {
            out.violations.push(Violation {
                kind: ViolationKind::RecoveryMismatch,
                subject: subject.clone(),
                explanation: format!(
                    "recovered up to event {seq} but the journal holds {} events",
                    events.len()
                ),
                first: e.clone(),
                second: e.clone(),
            });
            continue;
        }
        let Some(state) = replay.and_then(|r| r(&pid, &events)) else {
            continue;
        };
        out.states_compared += 1;
        let expected = state_digest(&state);
        if expected != *digest {
            out.violations.push(Violation {
                kind: ViolationKind::RecoveryMismatch,
                subject,
                explanation: format!(
                    "recovered a state with digest {digest} at event {seq}; the journal's events make {} (digest {expected})",
                    String::from_utf8_lossy(&state)
                ),
                first: e.clone(),
                second: e.clone(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: &str = "127.0.0.1:1";

    fn at(t: i64, event: Event) -> Entry {
        Entry::new(t, NODE, "1f", event)
    }

    fn granted(t: i64, token: u64) -> Entry {
        at(
            t,
            Event::LeaseGranted {
                lease: "tenure-shard-counter-3".into(),
                owner: NODE.into(),
                token,
                valid_until: t + 3_000,
            },
        )
    }

    fn appended(t: i64, token: u64, from_seq: u64, to_seq: u64) -> Entry {
        at(
            t,
            Event::JournalAppended {
                entity_type: "counter".into(),
                shard: "3".into(),
                entity: "key-1".into(),
                token,
                from_seq,
                to_seq,
                issued: t - 1,
            },
        )
    }

    fn ack(t: i64, value: u64, token: u64) -> Entry {
        at(
            t,
            Event::Ack {
                entity: "key-1".into(),
                shard: "3".into(),
                value,
                token,
                from: NODE.into(),
                issued: Some(t - 5),
            },
        )
    }

    fn recovered(t: i64, token: u64, seq: u64, state: &[u8]) -> Entry {
        at(
            t,
            Event::EntityRecovered {
                entity_type: "counter".into(),
                shard: "3".into(),
                entity: "key-1".into(),
                token,
                seq,
                snapshot: None,
                issued: t - 1,
                digest: state_digest(state),
            },
        )
    }

    fn stored(seq: u64, token: u64) -> JournalEvent {
        JournalEvent {
            persistence_id: "counter|key-1".into(),
            seq,
            token,
            writer: NODE.into(),
            payload: b"{}".to_vec(),
        }
    }

    /// The counter's state: the number of its events.
    fn count(_pid: &str, events: &[JournalEvent]) -> Option<Vec<u8>> {
        Some(events.len().to_string().into_bytes())
    }

    fn kinds(history: &[Entry], journal: &[JournalEvent]) -> Vec<ViolationKind> {
        check_journal(history, journal, Some(&count))
            .violations
            .iter()
            .map(|v| v.kind)
            .collect()
    }

    /// Token 5 appends 1..=2 (acked), token 7 is granted, recovers 2 events and appends 3.
    fn good() -> (Vec<Entry>, Vec<JournalEvent>) {
        let history = vec![
            granted(10, 5),
            recovered(20, 5, 0, b"0"),
            appended(30, 5, 1, 1),
            ack(31, 1, 5),
            appended(40, 5, 2, 2),
            ack(41, 2, 5),
            granted(100, 7),
            recovered(110, 7, 2, b"2"),
            appended(120, 7, 3, 3),
            ack(121, 3, 7),
        ];
        (history, vec![stored(1, 5), stored(2, 5), stored(3, 7)])
    }

    #[test]
    fn a_fenced_contiguous_journal_that_holds_every_ack_is_safe() {
        let (history, journal) = good();
        let check = check_journal(&history, &journal, Some(&count));
        assert!(check.violations.is_empty(), "{:?}", check.violations);
        assert_eq!(
            (
                check.appends,
                check.acked,
                check.recoveries,
                check.states_compared
            ),
            (3, 3, 2, 2)
        );
    }

    #[test]
    fn a_gap_in_the_sequence_is_found() {
        let (history, _) = good();
        let journal = vec![stored(1, 5), stored(3, 7)];
        assert!(kinds(&history, &journal).contains(&ViolationKind::EventGap));
    }

    #[test]
    fn a_repeated_sequence_number_is_found() {
        let (history, _) = good();
        let journal = vec![stored(1, 5), stored(2, 5), stored(2, 5), stored(3, 7)];
        assert!(kinds(&history, &journal).contains(&ViolationKind::EventGap));
    }

    #[test]
    fn a_token_going_down_in_the_journal_is_a_stale_append() {
        let history = vec![granted(10, 7), appended(30, 7, 1, 1)];
        let journal = vec![stored(1, 7), stored(2, 5)];
        assert_eq!(kinds(&history, &journal), vec![ViolationKind::StaleAppend]);
    }

    #[test]
    fn an_append_sent_after_a_newer_grant_is_a_stale_append() {
        let mut history = vec![granted(10, 5), granted(100, 7), appended(150, 5, 1, 1)];
        let journal = vec![stored(1, 5)];
        assert_eq!(kinds(&history, &journal), vec![ViolationKind::StaleAppend]);
        // Sent before the newer grant was recorded: it may have committed before it.
        history[2] = appended(101, 5, 1, 1);
        assert_eq!(kinds(&history, &journal), vec![]);
    }

    #[test]
    fn an_acknowledged_event_missing_from_the_journal_is_lost() {
        let (history, journal) = good();
        assert_eq!(
            kinds(&history, &journal[..2]),
            vec![ViolationKind::LostEvent, ViolationKind::LostAck]
        );
    }

    #[test]
    fn an_ack_no_append_made_is_unbacked() {
        let (mut history, journal) = good();
        history.push(ack(130, 4, 7));
        assert_eq!(kinds(&history, &journal), vec![ViolationKind::UnbackedAck]);
    }

    #[test]
    fn an_event_acknowledged_twice_is_found() {
        let (mut history, journal) = good();
        history.push(ack(130, 3, 7));
        assert_eq!(kinds(&history, &journal), vec![ViolationKind::UnbackedAck]);
    }

    #[test]
    fn an_event_appended_twice_is_found() {
        let (mut history, journal) = good();
        history.push(appended(130, 7, 3, 3));
        assert_eq!(
            kinds(&history, &journal),
            vec![ViolationKind::DuplicateEvent]
        );
    }

    #[test]
    fn an_event_the_journal_holds_with_another_token_is_lost() {
        let (history, mut journal) = good();
        journal[2].token = 8;
        assert!(kinds(&history, &journal).contains(&ViolationKind::LostEvent));
    }

    #[test]
    fn a_recovery_that_missed_appended_events_is_found() {
        let (mut history, journal) = good();
        history[7] = recovered(110, 7, 1, b"1");
        assert_eq!(
            kinds(&history, &journal),
            vec![ViolationKind::RecoveryMismatch]
        );
    }

    #[test]
    fn a_recovery_past_the_journal_is_found() {
        let (mut history, journal) = good();
        history.push(recovered(200, 7, 9, b"9"));
        assert_eq!(
            kinds(&history, &journal),
            vec![ViolationKind::RecoveryMismatch]
        );
    }

    #[test]
    fn a_recovered_state_the_events_do_not_make_is_found() {
        let (mut history, journal) = good();
        history[7] = recovered(110, 7, 2, b"3");
        assert_eq!(
            kinds(&history, &journal),
            vec![ViolationKind::RecoveryMismatch]
        );
        // Without a replay, the state is not compared.
        assert!(
            check_journal(&history, &journal, None)
                .violations
                .is_empty()
        );
    }

    #[test]
    fn an_append_is_judged_against_the_hold_when_it_was_sent() {
        let released = at(
            50,
            Event::LeaseReleased {
                lease: "tenure-shard-counter-3".into(),
                owner: NODE.into(),
                token: 5,
            },
        );
        let mut late_record = appended(55, 5, 1, 1);
        if let Event::JournalAppended { issued, .. } = &mut late_record.event {
            *issued = 40;
        }
        let history = vec![granted(10, 5), released.clone(), late_record];
        let kinds = |h: &[Entry]| -> Vec<ViolationKind> {
            crate::check::check(h)
                .violations
                .iter()
                .map(|v| v.kind)
                .collect()
        };
        assert_eq!(kinds(&history), vec![]);
        let sent_late = vec![granted(10, 5), released, appended(55, 5, 1, 1)];
        assert_eq!(kinds(&sent_late), vec![ViolationKind::ActionOutsideHold]);
    }

    #[test]
    fn the_digest_is_fnv1a_64() {
        assert_eq!(state_digest(b""), "cbf29ce484222325");
        assert_eq!(state_digest(b"a"), "af63dc4c8601ec8c");
    }
}
