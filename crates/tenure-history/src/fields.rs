//! From a `tracing` event's fields to a typed [`Event`]: the fields as JSON values (numbers
//! stay numbers), then serde, then a check that the typed event kept every field.

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};

use crate::event::Event;

/// The fields of a `tracing` event or span, as JSON values: integers and booleans as
/// themselves, strings and `%`-formatted values as strings.
#[derive(Debug, Default)]
pub(crate) struct Fields(pub(crate) Map<String, Value>);

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        self.0.insert(field.name().to_string(), value);
    }

    /// The string field `name`, if there is one.
    pub(crate) fn text(&self, name: &str) -> Option<&str> {
        self.0.get(name).and_then(Value::as_str)
    }
}

impl Visit for Fields {
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, value.into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, format!("{value:?}").into());
    }
}

/// Why an emitted event's fields are no known event ([`typed`]). Each is a bug in the
/// emitter, never in a history file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UnknownEvent {
    /// No `event` field, or not a string.
    #[error("no `event` field naming the kind")]
    NoKind,
    /// A kind this build does not know.
    #[error("unknown kind `{kind}`")]
    UnknownKind { kind: String },
    /// A field missing or of the wrong type.
    #[error("`{kind}`: {source}")]
    Fields {
        kind: String,
        #[source]
        source: serde_json::Error,
    },
    /// The kind's event does not serialize as a JSON object.
    #[error("`{kind}` does not serialize as an object")]
    NotAnObject { kind: String },
    /// Fields the kind does not have, or values it does not keep (serde would drop them
    /// silently: a misnamed optional field would read as absent).
    #[error("`{kind}` has no field {fields:?} of these values")]
    ExtraFields { kind: String, fields: Vec<String> },
}

/// The typed event of an emitted event's fields; `Err` says why not (see
/// [`UnknownEvent`]).
pub(crate) fn typed(fields: Map<String, Value>) -> Result<Event, UnknownEvent> {
    let kind = match fields.get("event") {
        Some(Value::String(kind)) => kind.clone(),
        _ => return Err(UnknownEvent::NoKind),
    };
    if !Event::kinds().contains(&kind.as_str()) {
        return Err(UnknownEvent::UnknownKind { kind });
    }
    let event: Event = match serde_json::from_value(Value::Object(fields.clone())) {
        Ok(event) => event,
        Err(source) => return Err(UnknownEvent::Fields { kind, source }),
    };
    let kept = match serde_json::to_value(&event) {
        Ok(Value::Object(kept)) => kept,
        _ => return Err(UnknownEvent::NotAnObject { kind }),
    };
    let lost: Vec<String> = fields
        .iter()
        .filter(|(name, value)| kept.get(name.as_str()) != Some(value))
        .map(|(name, _)| name.clone())
        .collect();
    if lost.is_empty() {
        Ok(event)
    } else {
        Err(UnknownEvent::ExtraFields { kind, fields: lost })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn fields_of_a_known_kind_become_its_event() {
        let event = typed(map(json!({
            "event": "shard_moved", "type": "counter", "shard": "4", "from": "a:1",
            "released": true
        })))
        .unwrap();
        assert_eq!(
            event,
            Event::ShardMoved {
                entity_type: "counter".into(),
                shard: "4".into(),
                from: "a:1".into(),
                to: None,
                released: true,
            }
        );
    }

    #[test]
    fn an_unknown_kind_a_missing_field_a_wrong_type_or_an_extra_field_is_refused() {
        let kind = |e: &UnknownEvent| match e {
            UnknownEvent::NoKind => "no kind",
            UnknownEvent::UnknownKind { .. } => "unknown kind",
            UnknownEvent::Fields { .. } => "fields",
            UnknownEvent::NotAnObject { .. } => "not an object",
            UnknownEvent::ExtraFields { .. } => "extra fields",
        };
        for (fields, variant, says) in [
            (json!({"lease": "l"}), "no kind", "no `event`"),
            (
                json!({"event": "lease_grunted"}),
                "unknown kind",
                "unknown kind `lease_grunted`",
            ),
            (
                json!({"event": "lease_released", "lease": "l", "owner": "o"}),
                "fields",
                "token",
            ),
            (
                json!({"event": "lease_released", "lease": "l", "owner": "o", "token": "3"}),
                "fields",
                "invalid type: string \"3\"",
            ),
            (
                json!({"event": "member_up", "member": "b:2", "member_incarnation": "2e"}),
                "extra fields",
                "member_incarnation",
            ),
        ] {
            let err = typed(map(fields.clone())).unwrap_err();
            assert_eq!(kind(&err), variant, "{fields}: {err}");
            assert!(err.to_string().contains(says), "{fields}: {err}");
            if let UnknownEvent::Fields { kind, .. } = &err {
                assert_eq!(kind, "lease_released");
                assert!(std::error::Error::source(&err).is_some());
            }
        }
    }
}
