//! Actions: what a node *did* under a lease (a shard serving, an entity alive, a singleton
//! instance alive, a fenced write accepted), and the rule that every action lies inside its node's hold of the
//! matching lease.
//!
//! A life ends at its stop event, at its process's death as a harness saw it (`killed`,
//! `terminated`), or at the `process_abort` its process recorded just before ending itself
//! (something outlived its kill while a lease was being lost): so a process that aborts
//! after its deadline, or never, shows lives running on past their holds.
//!
//! A hold bounds actions until the holder's local deadline (its last `valid_until`), its
//! release, or its process's death, whichever comes first. A `lease_lost` does not end it
//! earlier: a supervisor learns of the loss ahead of the deadline by its stop budget, and
//! its entities may finish stopping after the loss is announced, as long as they are gone
//! by the deadline. The one exception is a process frozen across its deadline (a harness
//! `paused` before it, `resumed` after it): it cannot look at a clock while frozen, so its
//! actions may outlive the deadline, but they must end within the resume grace after it
//! resumes (fencing tokens keep its late writes out meanwhile).

use std::collections::BTreeMap;
use std::time::Duration;

use super::holds::{Hold, HoldEnd};
use super::verdict::{Violation, ViolationKind};
use crate::{Entry, Event};

/// What kind of action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ActionKind {
    /// A shard serving (`shard_started` .. `shard_stopped`).
    ShardLife,
    /// An entity alive (`entity_started` .. `entity_stopped`).
    EntityLife,
    /// A singleton instance alive (`singleton_starting` .. `singleton_stopped`).
    SingletonLife,
    /// A fenced write the resource accepted (`write` or `tick` with `accepted: true`, or
    /// `journal_appended`).
    AcceptedWrite,
}

impl std::fmt::Display for ActionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ActionKind::ShardLife => "shard serving",
            ActionKind::EntityLife => "entity alive",
            ActionKind::SingletonLife => "singleton instance alive",
            ActionKind::AcceptedWrite => "write accepted",
        })
    }
}

/// One action of node `node` (incarnation `inc`) under the grant with `token` of the lease
/// whose name ends with `lease_suffix`, from `from_ns` to `until_ns` (equal for a write).
#[derive(Debug, Clone, PartialEq)]
pub struct Action {
    /// What kind of action.
    pub kind: ActionKind,
    /// The node that acted (`host:port`).
    pub node: String,
    /// The node's incarnation.
    pub inc: String,
    /// `-shard-<type>-<shard>` or `-singleton-<name>`: lease names are
    /// `<system>-shard-<type>-<shard>` and `<system>-singleton-<name>`, and a node runs one
    /// system, so the suffix, the node's incarnation and the token name one grant.
    pub lease_suffix: String,
    /// The token of the grant it acted under.
    pub token: u64,
    /// When it began (ns of `CLOCK_BOOTTIME`).
    pub from_ns: i64,
    /// When it ended (ns of `CLOCK_BOOTTIME`); the end of the history if it shows none.
    pub until_ns: i64,
    /// The event that began it (the write itself for a write).
    pub began: Entry,
    /// The event that ended it (stop, kill), if the history shows one.
    pub ended: Option<Entry>,
}

/// Options of the action rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActionRule {
    /// How long after resuming a process frozen across its deadline may still act.
    pub resume_grace: Duration,
}

impl Default for ActionRule {
    /// 13 s: the stop budget of the reference configuration (`stop-timeout` 12 s, plus
    /// 500 ms of kill wait and delivery slack), plus slack for a process catching up.
    fn default() -> Self {
        ActionRule {
            resume_grace: Duration::from_secs(13),
        }
    }
}

/// The actions of a history, each with its start and end.
pub fn actions(events: &[Entry]) -> Vec<Action> {
    // Open lives by (kind, node, inc, subject, token).
    let mut open: BTreeMap<(ActionKind, String, String, String, u64), Action> = BTreeMap::new();
    let mut done = Vec::new();
    let end_of_history = events.last().map_or(0, |e| e.t);
    for e in events {
        // A process's death ends every life in it: seen by a harness (any incarnation of the
        // node), or announced by the process itself just before it aborts.
        let died = match &e.event {
            Event::Killed {} | Event::Terminated {} if e.is_fault() => Some(None),
            Event::ProcessAbort { .. } if !e.is_fault() => Some(Some(e.inc.as_str())),
            _ => None,
        };
        if let Some(inc) = died {
            let keys: Vec<_> = open
                .keys()
                .filter(|k| k.1 == e.node && inc.is_none_or(|inc| k.2 == inc))
                .cloned()
                .collect();
            for k in keys {
                if let Some(mut action) = open.remove(&k) {
                    action.until_ns = e.t;
                    action.ended = Some(e.clone());
                    done.push(action);
                }
            }
        }
        if e.is_fault() {
            continue;
        }
        let shard_suffix = |entity_type: &str, shard: &str| format!("-shard-{entity_type}-{shard}");
        let singleton_suffix = |name: &str| format!("-singleton-{name}");
        let (kind, subject, lease_suffix, token, starts) = match &e.event {
            Event::ShardStarted(l) | Event::ShardStopped(l) => (
                ActionKind::ShardLife,
                String::new(),
                shard_suffix(&l.entity_type, &l.shard),
                l.token,
                matches!(e.event, Event::ShardStarted(_)),
            ),
            Event::EntityStarted(l) | Event::EntityStopped(l) => (
                ActionKind::EntityLife,
                l.entity.clone(),
                shard_suffix(&l.entity_type, &l.shard),
                l.token,
                matches!(e.event, Event::EntityStarted(_)),
            ),
            Event::SingletonStarting(l) | Event::SingletonStopped(l) => (
                ActionKind::SingletonLife,
                String::new(),
                singleton_suffix(&l.singleton),
                l.token,
                matches!(e.event, Event::SingletonStarting(_)),
            ),
            Event::Write {
                entity_type,
                shard,
                token,
                accepted: true,
                ..
            } => {
                done.push(accepted_write(e, shard_suffix(entity_type, shard), *token));
                continue;
            }
            Event::Tick {
                singleton,
                token,
                accepted: true,
                ..
            } => {
                done.push(accepted_write(e, singleton_suffix(singleton), *token));
                continue;
            }
            Event::JournalAppended {
                entity_type,
                shard,
                token,
                issued,
                ..
            } => {
                // The append committed somewhere between `issued` and `t`, fenced by the
                // store: what the node did under its hold is send it (the record may come
                // after a hand-off released the lease, the commit never does).
                let mut action = accepted_write(e, shard_suffix(entity_type, shard), *token);
                action.from_ns = *issued;
                action.until_ns = *issued;
                done.push(action);
                continue;
            }
            _ => continue,
        };
        let key = (
            kind,
            e.node.clone(),
            e.inc.clone(),
            lease_suffix.clone() + "/" + &subject,
            token,
        );
        if starts {
            open.entry(key).or_insert_with(|| Action {
                kind,
                node: e.node.clone(),
                inc: e.inc.clone(),
                lease_suffix,
                token,
                from_ns: e.t,
                until_ns: end_of_history,
                began: e.clone(),
                ended: None,
            });
        } else if let Some(mut action) = open.remove(&key) {
            action.until_ns = e.t;
            action.ended = Some(e.clone());
            done.push(action);
        }
    }
    done.extend(open.into_values());
    done.sort_by_key(|a| (a.from_ns, a.until_ns));
    done
}

/// A write the resource accepted: an action of an instant.
fn accepted_write(e: &Entry, lease_suffix: String, token: u64) -> Action {
    Action {
        kind: ActionKind::AcceptedWrite,
        node: e.node.clone(),
        inc: e.inc.clone(),
        lease_suffix,
        token,
        from_ns: e.t,
        until_ns: e.t,
        began: e.clone(),
        ended: Some(e.clone()),
    }
}

/// The instant until which a hold allows actions: its release or its process's death, or
/// else its last `valid_until` (a loss announced earlier does not end it).
fn action_deadline(hold: &Hold) -> i64 {
    match hold.end {
        HoldEnd::Released | HoldEnd::Killed => hold.until_ns,
        HoldEnd::Lost(_) | HoldEnd::Unknown => hold.valid_until(),
    }
}

/// A holder and grant: node, incarnation, token.
type Holder<'a> = (&'a str, &'a str, u64);

/// Checks that every action lies inside its node's hold of the matching lease, allowing a
/// process frozen across its deadline to act until `rule.resume_grace` after it resumed.
pub fn check_actions(
    events: &[Entry],
    holds: &BTreeMap<String, Vec<Hold>>,
    rule: ActionRule,
    out: &mut Vec<Violation>,
) -> usize {
    // Freezes per node: (paused at, resumed at or None while still frozen).
    let mut freezes: BTreeMap<&str, Vec<(i64, Option<i64>)>> = BTreeMap::new();
    for e in events.iter().filter(|e| e.is_fault()) {
        let list = freezes.entry(e.node.as_str()).or_default();
        match e.event {
            Event::Paused {} => list.push((e.t, None)),
            // SIGCONT resumes a process however many SIGSTOPs it had: one resume ends
            // every freeze still open.
            Event::Resumed {} => list
                .iter_mut()
                .filter(|f| f.1.is_none())
                .for_each(|f| f.1 = Some(e.t)),
            _ => {}
        }
    }
    let grace = i64::try_from(rule.resume_grace.as_nanos()).unwrap_or(i64::MAX);
    // Holds by (node, incarnation, token): histories hold far more actions than holds.
    let mut by_holder: BTreeMap<Holder, Vec<(&String, &Hold)>> = BTreeMap::new();
    for (lease, list) in holds {
        for h in list {
            by_holder
                .entry((h.node.as_str(), h.inc.as_str(), h.token))
                .or_default()
                .push((lease, h));
        }
    }
    let all = actions(events);
    for action in &all {
        let hold = by_holder
            .get(&(action.node.as_str(), action.inc.as_str(), action.token))
            .into_iter()
            .flatten()
            .find(|(lease, _)| lease.ends_with(&action.lease_suffix))
            .copied();
        let Some((lease, hold)) = hold else {
            out.push(outside(
                action,
                format!("*{}", action.lease_suffix),
                "no grant of the lease with this token on this node is in the history".into(),
            ));
            continue;
        };
        let deadline = action_deadline(hold);
        if action.from_ns < hold.from_ns {
            out.push(outside(
                action,
                lease.clone(),
                format!(
                    "began {} before the grant",
                    ms(hold.from_ns - action.from_ns)
                ),
            ));
            continue;
        }
        if action.until_ns <= deadline {
            continue;
        }
        let frozen_across = freezes
            .get(action.node.as_str())
            .into_iter()
            .flatten()
            .find(|(paused, resumed)| *paused <= deadline && resumed.is_none_or(|r| r > deadline));
        match frozen_across {
            Some((_, None)) => {}
            Some((_, Some(resumed))) if action.until_ns <= resumed.saturating_add(grace) => {}
            Some((_, Some(resumed))) => out.push(outside(
                action,
                lease.clone(),
                format!(
                    "frozen across its deadline, it went on {} after resuming (grace {:?})",
                    ms(action.until_ns - resumed),
                    rule.resume_grace
                ),
            )),
            None => out.push(outside(
                action,
                lease.clone(),
                format!(
                    "went on {} after the hold ended ({})",
                    ms(action.until_ns - deadline),
                    match &hold.end {
                        HoldEnd::Released => "released".to_string(),
                        HoldEnd::Killed => "process ended".to_string(),
                        HoldEnd::Lost(_) | HoldEnd::Unknown => "local deadline".to_string(),
                    }
                ),
            )),
        }
    }
    check_entities_in_shards(&all, out);
    all.len()
}

/// Every entity life lies inside a life of its shard on the same node, incarnation and
/// token: a shard starts its entities only while it serves, and has stopped them all
/// before it records its stop.
fn check_entities_in_shards(all: &[Action], out: &mut Vec<Violation>) {
    let mut shards: BTreeMap<(&str, &str, &str, u64), Vec<&Action>> = BTreeMap::new();
    for a in all.iter().filter(|a| a.kind == ActionKind::ShardLife) {
        shards
            .entry((&a.node, &a.inc, &a.lease_suffix, a.token))
            .or_default()
            .push(a);
    }
    for entity in all.iter().filter(|a| a.kind == ActionKind::EntityLife) {
        let key = (
            entity.node.as_str(),
            entity.inc.as_str(),
            entity.lease_suffix.as_str(),
            entity.token,
        );
        let inside = shards
            .get(&key)
            .into_iter()
            .flatten()
            .any(|shard| shard.from_ns <= entity.from_ns && entity.until_ns <= shard.until_ns);
        if !inside {
            out.push(Violation {
                kind: ViolationKind::EntityOutsideShard,
                subject: format!("*{}", entity.lease_suffix),
                explanation: format!(
                    "entity {} on {} ({}) with token {}: alive outside every life of its shard on that node with that token",
                    match &entity.began.event {
                        Event::EntityStarted(l) | Event::EntityStopped(l) => l.entity.as_str(),
                        _ => "?",
                    },
                    entity.node,
                    entity.inc,
                    entity.token
                ),
                first: entity.began.clone(),
                second: entity.ended.clone().unwrap_or_else(|| entity.began.clone()),
            });
        }
    }
}

fn ms(ns: i64) -> String {
    format!("{:.3} ms", ns as f64 / 1e6)
}

fn outside(action: &Action, lease: String, why: String) -> Violation {
    Violation {
        kind: ViolationKind::ActionOutsideHold,
        subject: lease,
        explanation: format!(
            "{} on {} ({}) with token {}: {why}",
            action.kind, action.node, action.inc, action.token
        ),
        first: action.began.clone(),
        second: action.ended.clone().unwrap_or_else(|| action.began.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::check;
    use crate::{EntityLife, ShardLife};

    const MS: i64 = 1_000_000;
    const LEASE: &str = "demo-shard-counter-7";

    fn at(ms: i64, inc: &str, event: Event) -> Entry {
        Entry::new(ms * MS, "a", inc, event)
    }

    fn entity(ms: i64, inc: &str, stopped: bool) -> Entry {
        let life = EntityLife::new("counter".into(), "7".into(), "key-1".into(), 1, "".into());
        match stopped {
            false => at(ms, inc, Event::EntityStarted(life)),
            true => at(ms, inc, Event::EntityStopped(life)),
        }
    }

    fn shard(ms: i64, inc: &str) -> Entry {
        let life = ShardLife::new("counter".into(), "7".into(), 1, "".into());
        at(ms, inc, Event::ShardStarted(life))
    }

    fn abort(ms: i64, inc: &str) -> Entry {
        at(
            ms,
            inc,
            Event::ProcessAbort {
                lease: LEASE.into(),
                token: 1,
                what: "entity key-1 of counter shard 7".into(),
            },
        )
    }

    /// Granted at 0 with deadline 900, lost at 700; shard and entity alive from 5 and 10;
    /// another node's event at 2000 ends the history.
    fn blocked_entity(end: Option<Entry>) -> Vec<Entry> {
        let mut events = vec![
            at(
                0,
                "i1",
                Event::LeaseGranted {
                    lease: LEASE.into(),
                    owner: "a".into(),
                    token: 1,
                    valid_until: 900 * MS,
                },
            ),
            shard(5, "i1"),
            entity(10, "i1", false),
            at(
                700,
                "i1",
                Event::LeaseLost {
                    lease: LEASE.into(),
                    owner: "a".into(),
                    token: 1,
                    reason: "expired".into(),
                },
            ),
        ];
        events.extend(end);
        events.push(Entry::new(2000 * MS, "b", "ib", Event::NodeStarted {}));
        events.sort_by_key(|e| e.t);
        events
    }

    fn outside(events: &[Entry]) -> Vec<(i64, ViolationKind)> {
        check(events)
            .violations
            .iter()
            .map(|v| (v.first.t / MS, v.kind))
            .collect()
    }

    #[test]
    fn a_process_abort_ends_every_life_of_its_incarnation_there() {
        let lives = actions(&blocked_entity(Some(abort(850, "i1"))));
        let ends: Vec<(ActionKind, i64)> =
            lives.iter().map(|a| (a.kind, a.until_ns / MS)).collect();
        assert_eq!(
            ends,
            [(ActionKind::ShardLife, 850), (ActionKind::EntityLife, 850)]
        );
        assert!(lives.iter().all(|a| matches!(
            a.ended.as_ref().map(|e| &e.event),
            Some(Event::ProcessAbort { .. })
        )));
    }

    #[test]
    fn an_entity_that_outlives_its_kill_is_safe_only_if_its_process_aborts_before_the_deadline() {
        // Never ends: alive until the history ends, past the deadline.
        let entity_late = (10, ViolationKind::ActionOutsideHold);
        let shard_late = (5, ViolationKind::ActionOutsideHold);
        assert_eq!(outside(&blocked_entity(None)), [shard_late, entity_late]);
        // The process aborts before the deadline: safe, and a stop recorded later by the
        // dying process changes nothing.
        assert_eq!(outside(&blocked_entity(Some(abort(850, "i1")))), []);
        let mut late_stop = blocked_entity(Some(abort(850, "i1")));
        late_stop.insert(5, entity(950, "i1", true));
        assert_eq!(outside(&late_stop), []);
        // After the deadline: too late.
        assert_eq!(
            outside(&blocked_entity(Some(abort(950, "i1")))),
            [shard_late, entity_late]
        );
        // Another incarnation's abort ends nothing of this one.
        assert_eq!(
            outside(&blocked_entity(Some(abort(850, "i2")))),
            [shard_late, entity_late]
        );
        // A harness cannot speak for the process: only a death it saw ends lives.
        let mut forged = abort(850, "i1");
        forged.inc = crate::HARNESS.into();
        assert_eq!(
            outside(&blocked_entity(Some(forged))),
            [shard_late, entity_late]
        );
    }

    fn fault(ms: i64, event: Event) -> Entry {
        Entry::new(ms * MS, "a", crate::HARNESS, event)
    }

    #[test]
    fn a_resume_ends_every_open_freeze_of_its_node() {
        // Frozen twice (at 600 and 650), resumed once at 800, before the deadline (900):
        // the entity living on to the history's end is outside its hold.
        let mut twice = blocked_entity(None);
        twice.extend([
            fault(600, Event::Paused {}),
            fault(650, Event::Paused {}),
            fault(800, Event::Resumed {}),
        ]);
        twice.sort_by_key(|e| e.t);
        assert_eq!(
            outside(&twice),
            [
                (5, ViolationKind::ActionOutsideHold),
                (10, ViolationKind::ActionOutsideHold)
            ]
        );
        // Frozen across the deadline and never resumed: nothing it did after counts.
        let mut frozen = blocked_entity(None);
        frozen.push(fault(850, Event::Paused {}));
        frozen.sort_by_key(|e| e.t);
        assert_eq!(outside(&frozen), []);
    }
}
