//! One history line: the fields of every line and its [`Event`], to and from JSON.

use serde::Deserialize;
use serde::de::value::MapDeserializer;
use serde_json::{Map, Value};

use crate::event::Event;

/// Nanoseconds of the host's `CLOCK_BOOTTIME`, the clock of every line's `t` and of holders'
/// deadlines (`valid_until`): the same for every process of the host, never going back,
/// unaffected by wall-clock changes, counting host suspend. Read through rustix (the vDSO),
/// so that an `LD_PRELOAD` wall-clock faker changes nothing.
pub fn boottime_now_ns() -> i64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    ts.tv_sec
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec)
}

/// The `inc` of faults a harness injects from outside.
pub const HARNESS: &str = "harness";

/// One line of a history.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Entry {
    /// ns of the host's `CLOCK_BOOTTIME`.
    pub t: i64,
    /// The node (`host:port`) the event is about; for a guarded command, its owner.
    pub node: String,
    /// The node's incarnation, or [`HARNESS`] for a fault injected from outside.
    pub inc: String,
    /// What happened.
    pub event: Event,
    /// 1-based line number in the history file (0 for entries built in memory).
    pub line: usize,
}

impl Entry {
    /// An entry built in memory (line 0).
    pub fn new(t: i64, node: impl Into<String>, inc: impl Into<String>, event: Event) -> Entry {
        Entry {
            t,
            node: node.into(),
            inc: inc.into(),
            event,
            line: 0,
        }
    }

    /// `event` about `node`, stamped now (`CLOCK_BOOTTIME`).
    pub fn now(node: impl Into<String>, inc: impl Into<String>, event: Event) -> Entry {
        Entry::new(boottime_now_ns(), node, inc, event)
    }

    /// A fault a harness injected into `node` (or `store`), stamped now.
    pub fn fault(node: impl Into<String>, event: Event) -> Entry {
        Entry::now(node, HARNESS, event)
    }

    /// Whether this is a fault injected by a harness (`inc` = `harness`).
    pub fn is_fault(&self) -> bool {
        self.inc == HARNESS
    }

    /// The event kind (the line's `event` field).
    pub fn kind(&self) -> String {
        self.event.kind()
    }

    /// The whole line as a JSON object. Keys come out sorted, as Tenure has always written
    /// them, so that lines stay byte for byte what earlier versions wrote.
    pub fn to_json(&self) -> Value {
        let mut line = Map::new();
        line.insert("t".into(), self.t.into());
        line.insert("node".into(), self.node.clone().into());
        line.insert("inc".into(), self.inc.clone().into());
        match &self.event {
            Event::Other { kind, fields } => {
                line.extend(fields.clone());
                line.insert("event".into(), kind.clone().into());
            }
            known => {
                if let Ok(Value::Object(fields)) = serde_json::to_value(known) {
                    line.extend(fields);
                }
            }
        }
        Value::Object(line)
    }

    /// The line of one JSON object: the common fields, and the event of its kind. A kind
    /// this build does not know becomes [`Event::Other`] (readers ignore kinds they do not
    /// know); a known kind with a missing or mistyped field is an error naming both.
    pub fn from_json(value: Value, line: usize) -> Result<Entry, EntryError> {
        let Value::Object(mut fields) = value else {
            return Err(EntryError::NotAnObject);
        };
        let mut text = |k: &'static str| match fields.remove(k) {
            Some(Value::String(s)) => Ok(s),
            _ => Err(EntryError::Field {
                field: k,
                want: "a string",
            }),
        };
        let (node, inc) = (text("node")?, text("inc")?);
        let kind = match fields.get("event") {
            Some(Value::String(s)) => s.clone(),
            _ => {
                return Err(EntryError::Field {
                    field: "event",
                    want: "a string",
                });
            }
        };
        let t = fields
            .remove("t")
            .and_then(|t| t.as_i64())
            .ok_or(EntryError::Field {
                field: "t",
                want: "an integer",
            })?;
        let event = if Event::kinds().contains(&kind.as_str()) {
            serde_json::from_value(Value::Object(fields))
                .map_err(|source| EntryError::Event { kind, source })?
        } else {
            fields.remove("event");
            Event::Other { kind, fields }
        };
        Ok(Entry {
            t,
            node,
            inc,
            event,
            line,
        })
    }
}

/// Why a JSON value is no history line ([`Entry::from_json`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EntryError {
    /// The value is not a JSON object.
    #[error("not a JSON object")]
    NotAnObject,
    /// A common field is missing or of the wrong type.
    #[error("field `{field}` missing or not {want}")]
    Field {
        /// The field's name.
        field: &'static str,
        /// What it must be.
        want: &'static str,
    },
    /// The fields of a known event kind do not fit it (one missing or of the wrong type).
    #[error("`{kind}`: {source}")]
    Event {
        /// The event kind.
        kind: String,
        /// What serde found wrong.
        source: serde_json::Error,
    },
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line > 0 {
            write!(f, "line {}: {}", self.line, self.to_json())
        } else {
            write!(f, "{}", self.to_json())
        }
    }
}

impl Event {
    /// Every event kind this build knows (the `event` values of its variants).
    pub fn kinds() -> &'static [&'static str] {
        // Serde's derive knows the list (it names it when a tag matches no variant); asking
        // it keeps the list from ever disagreeing with the enum.
        let probe = MapDeserializer::<_, KindsProbe>::new(std::iter::once(("event", "")));
        match Event::deserialize(probe) {
            Err(KindsProbe(Some(kinds))) => kinds,
            _ => &[],
        }
    }

    /// This event's kind (its `event` value).
    pub fn kind(&self) -> String {
        match self {
            Event::Other { kind, .. } => kind.clone(),
            known => match serde_json::to_value(known) {
                Ok(Value::Object(mut fields)) => match fields.remove("event") {
                    Some(Value::String(kind)) => kind,
                    _ => String::new(),
                },
                _ => String::new(),
            },
        }
    }
}

/// The error of [`Event::kinds`]'s probe: what serde expected instead of an empty tag.
#[derive(Debug)]
struct KindsProbe(Option<&'static [&'static str]>);

impl std::fmt::Display for KindsProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("probe")
    }
}

impl std::error::Error for KindsProbe {}

impl serde::de::Error for KindsProbe {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        KindsProbe(None)
    }

    fn unknown_variant(_: &str, expected: &'static [&'static str]) -> Self {
        KindsProbe(Some(expected))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kinds_are_the_variants() {
        let kinds = Event::kinds();
        assert!(kinds.contains(&"lease_granted") && kinds.contains(&"store_lost"));
        assert!(!kinds.contains(&"other"), "Other is never read by its kind");
        let unique: std::collections::BTreeSet<_> = kinds.iter().collect();
        assert_eq!(unique.len(), kinds.len());
    }

    #[test]
    fn lines_round_trip_byte_for_byte() {
        for line in [
            r#"{"event":"lease_granted","inc":"1f","lease":"s-shard-c-1","node":"a:1","owner":"a:1","t":5,"token":3,"valid_until":9}"#,
            r#"{"accepted":false,"event":"tick","inc":"1f","node":"a:1","singleton":"s","t":5,"token":3,"value":null}"#,
            r#"{"event":"link_healed","inc":"harness","mode":null,"node":"a:1","peer":"b:2","t":5}"#,
            r#"{"event":"member_up","inc":"1f","node":"a:1","t":5}"#,
            r#"{"age":2,"event":"member_up","inc":"1f","member":"b:2","member_inc":"2e","node":"a:1","status":"up","t":5}"#,
            r#"{"event":"shard_moved","from":"a:1","inc":"1f","node":"a:1","released":true,"shard":"4","t":5,"to":null,"type":"counter"}"#,
            r#"{"event":"something_new","inc":"1f","node":"a:1","t":5,"x":[1]}"#,
        ] {
            let entry = Entry::from_json(serde_json::from_str(line).unwrap(), 1).unwrap();
            assert_eq!(entry.to_json().to_string(), line);
        }
    }

    #[test]
    fn a_known_kind_with_a_bad_field_is_an_error_naming_both() {
        let line = json!({"t": 1, "node": "a", "inc": "i", "event": "lease_granted", "lease": "l"});
        let err = Entry::from_json(line, 1).unwrap_err().to_string();
        assert!(
            err.contains("`lease_granted`") && err.contains("owner"),
            "{err}"
        );
    }
}
