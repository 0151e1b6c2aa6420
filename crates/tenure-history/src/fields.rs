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

/// The typed event of an emitted event's fields. `Err` says why not: no `event` field, a
/// kind this build does not know, a field missing or of the wrong type, or a field the kind
/// does not have (serde would drop it silently: a misnamed optional field would read as
/// absent). Each is a bug in the emitter, never in a history file.
pub(crate) fn typed(fields: Map<String, Value>) -> Result<Event, String> {
    let kind = match fields.get("event") {
        Some(Value::String(kind)) => kind.clone(),
        _ => return Err("no `event` field naming the kind".into()),
    };
    if !Event::kinds().contains(&kind.as_str()) {
        return Err(format!("unknown kind `{kind}`"));
    }
    let event: Event = serde_json::from_value(Value::Object(fields.clone()))
        .map_err(|e| format!("`{kind}`: {e}"))?;
    let kept = match serde_json::to_value(&event) {
        Ok(Value::Object(kept)) => kept,
        _ => return Err(format!("`{kind}` does not serialize as an object")),
    };
    let lost: Vec<&str> = fields
        .iter()
        .filter(|(name, value)| kept.get(name.as_str()) != Some(value))
        .map(|(name, _)| name.as_str())
        .collect();
    if lost.is_empty() {
        Ok(event)
    } else {
        Err(format!("`{kind}` has no field {lost:?} of these values"))
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
        for (fields, says) in [
            (json!({"lease": "l"}), "no `event`"),
            (
                json!({"event": "lease_grunted"}),
                "unknown kind `lease_grunted`",
            ),
            (
                json!({"event": "lease_released", "lease": "l", "owner": "o"}),
                "token",
            ),
            (
                json!({"event": "lease_released", "lease": "l", "owner": "o", "token": "3"}),
                "invalid type: string \"3\"",
            ),
            (
                json!({"event": "member_up", "member": "b:2", "member_incarnation": "2e"}),
                "member_incarnation",
            ),
        ] {
            let err = typed(map(fields.clone())).unwrap_err();
            assert!(err.contains(says), "{fields}: {err}");
        }
    }
}
