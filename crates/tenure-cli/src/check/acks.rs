//! Acknowledged writes are durable: every `ack` a client got is backed by a write the
//! fenced resource accepted, and the resource still holds at least that value.

use std::collections::{BTreeMap, HashMap};

use super::event::{CheckError, Event};
use super::verdict::{Violation, ViolationKind};

/// What the acknowledgement check found.
#[derive(Debug, Clone, Default)]
pub struct AckCheck {
    /// Acknowledged writes checked.
    pub acked: usize,
    pub violations: Vec<Violation>,
}

/// Checks the `ack` events of `events` against the accepted `write`s and the resource's
/// final state: per key (`entity`), every acknowledged value was accepted with the same
/// token, no value was acknowledged twice, and `final_value(key)` (the counter now; `None`
/// when it has none) is at least every acknowledged value.
pub fn check_acks(events: &[Event], final_value: &dyn Fn(&str) -> Option<u64>) -> AckCheck {
    let mut accepted: HashMap<(&str, u64, u64), &Event> = HashMap::new();
    for e in events.iter().filter(|e| e.kind == "write") {
        if e.fields.get("accepted") == Some(&true.into())
            && let (Some(key), Some(value), Some(token)) =
                (e.str("entity"), e.u64("value"), e.u64("token"))
        {
            accepted.insert((key, value, token), e);
        }
    }
    let mut out = AckCheck::default();
    let mut acked: BTreeMap<&str, BTreeMap<u64, &Event>> = BTreeMap::new();
    for e in events.iter().filter(|e| e.kind == "ack") {
        let (Some(key), Some(value), Some(token)) =
            (e.str("entity"), e.u64("value"), e.u64("token"))
        else {
            continue;
        };
        out.acked += 1;
        let subject = format!("counter/{key}");
        match accepted.get(&(key, value, token)) {
            None => out.violations.push(Violation {
                kind: ViolationKind::UnbackedAck,
                subject: subject.clone(),
                explanation: format!(
                    "value {value} with token {token} was acknowledged but no accepted write made it"
                ),
                first: e.clone(),
                second: e.clone(),
            }),
            Some(_) => {
                if let Some(earlier) = acked.entry(key).or_default().insert(value, e) {
                    out.violations.push(Violation {
                        kind: ViolationKind::UnbackedAck,
                        subject,
                        explanation: format!("value {value} was acknowledged twice"),
                        first: earlier.clone(),
                        second: e.clone(),
                    });
                }
            }
        }
    }
    for (key, values) in acked {
        let Some((&top, ack)) = values.last_key_value() else {
            continue;
        };
        let now = final_value(key).unwrap_or(0);
        if now < top {
            let write = events
                .iter()
                .find(|w| {
                    w.kind == "write" && w.str("entity") == Some(key) && w.u64("value") == Some(top)
                })
                .unwrap_or(ack);
            out.violations.push(Violation {
                kind: ViolationKind::LostAck,
                subject: format!("counter/{key}"),
                explanation: format!(
                    "value {top} was acknowledged but the counter now holds {now}"
                ),
                first: write.clone(),
                second: (*ack).clone(),
            });
        }
    }
    out
}

/// [`check_acks`] against the demo's sharded counter's SQLite file (`tenure demo node
/// --counter`): the final value of key `k` is its counter `sharded/<k>`.
pub fn check_counter_acks(
    events: &[Event],
    counter: &std::path::Path,
) -> Result<AckCheck, CheckError> {
    let fail = |detail: String| CheckError::Counter {
        path: counter.display().to_string(),
        detail,
    };
    let file = tenure::sqlite::FencedCounter::open(counter).map_err(|e| fail(e.to_string()))?;
    let failed = std::cell::Cell::new(None);
    let acks = check_acks(
        events,
        &|key| match file.get(&crate::demo::counter::counter_name(key)) {
            Ok(v) => v.map(|(value, _)| value),
            Err(e) => {
                failed.set(Some(e.to_string()));
                None
            }
        },
    );
    match failed.take() {
        Some(e) => Err(fail(e)),
        None => Ok(acks),
    }
}
