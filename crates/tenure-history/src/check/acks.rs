//! Acknowledged writes are durable: every `ack` a client got is backed by a write the
//! fenced resource accepted, and the resource still holds at least that value.

use std::collections::{BTreeMap, HashMap};

use super::verdict::{Violation, ViolationKind};
use crate::{Entry, Event};

/// What the acknowledgement check found.
#[derive(Debug, Clone, Default)]
pub struct AckCheck {
    /// Acknowledged writes checked.
    pub acked: usize,
    /// What it found: unbacked, duplicate or lost acknowledgements.
    pub violations: Vec<Violation>,
}

/// Checks the `ack` events of `events` against the accepted `write`s and the resource's
/// final state: per key (`entity`), every acknowledged value was accepted with the same
/// token, no value was acknowledged twice, and `final_value(key)` (the counter now; `None`
/// when it has none) is at least every acknowledged value.
pub fn check_acks(events: &[Entry], final_value: &dyn Fn(&str) -> Option<u64>) -> AckCheck {
    let mut accepted: HashMap<(&str, u64, u64), &Entry> = HashMap::new();
    for e in events {
        if let Event::Write {
            entity,
            value: Some(value),
            token,
            accepted: true,
            ..
        } = &e.event
        {
            accepted.insert((entity, *value, *token), e);
        }
    }
    let mut out = AckCheck::default();
    let mut acked: BTreeMap<&str, BTreeMap<u64, &Entry>> = BTreeMap::new();
    for e in events {
        let Event::Ack {
            entity: key,
            value,
            token,
            ..
        } = &e.event
        else {
            continue;
        };
        let (key, value, token) = (key.as_str(), *value, *token);
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
                    matches!(&w.event, Event::Write { entity, value: Some(v), .. } if entity == key && *v == top)
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
