//! One history line, and reading a history file.

use std::path::Path;

use serde_json::Value;

/// Why a history could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("cannot read history {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot read counter {path}: {detail}")]
    Counter { path: String, detail: String },
    #[error("history {path} line {line}: {detail}")]
    Line {
        path: String,
        line: usize,
        detail: String,
    },
}

/// One event of a history (docs/history.md): the common fields, plus the whole line.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// ns of the host's `CLOCK_BOOTTIME`.
    pub t: i64,
    /// The node (`host:port`) the event is about.
    pub node: String,
    /// The node's incarnation (`harness` for faults recorded by a test harness or the demo).
    pub inc: String,
    /// The event kind.
    pub kind: String,
    /// 1-based line number in the history file (0 for events built in memory).
    pub line: usize,
    /// The whole JSON object.
    pub fields: Value,
}

impl Event {
    /// An event from one parsed JSON object; `None` names the missing or mistyped field.
    pub fn from_json(fields: Value, line: usize) -> Result<Event, String> {
        let text = |k: &str| {
            fields
                .get(k)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| format!("field `{k}` missing or not a string"))
        };
        let t = fields
            .get("t")
            .and_then(Value::as_i64)
            .ok_or_else(|| "field `t` missing or not an integer".to_string())?;
        Ok(Event {
            t,
            node: text("node")?,
            inc: text("inc")?,
            kind: text("event")?,
            line,
            fields,
        })
    }

    /// A string field.
    pub fn str(&self, key: &str) -> Option<&str> {
        self.fields.get(key).and_then(Value::as_str)
    }

    /// An unsigned integer field.
    pub fn u64(&self, key: &str) -> Option<u64> {
        self.fields.get(key).and_then(Value::as_u64)
    }

    /// A signed integer field.
    pub fn i64(&self, key: &str) -> Option<i64> {
        self.fields.get(key).and_then(Value::as_i64)
    }

    /// Whether this is a fault injected by a harness (`inc` = `harness`).
    pub fn is_fault(&self) -> bool {
        self.inc == "harness"
    }
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line > 0 {
            write!(f, "line {}: {}", self.line, self.fields)
        } else {
            write!(f, "{}", self.fields)
        }
    }
}

/// Reads a history: one JSON object per line (blank lines skipped), sorted by `t` (stable,
/// so the lines of one writer keep their order). Errors name the file and line.
///
/// A writer killed in the middle of a line leaves a torn line: Linux may stop a write to a
/// regular file at a page boundary when SIGKILL arrives. Its event is lost, exactly as if
/// the writer had been killed just before writing it, which the rules already allow for. So
/// a line that is not JSON is accepted as torn when it is the file's last line without a
/// newline, or when the next writer's line, appended right after the torn bytes, parses from
/// its own start; the torn prefix is skipped. Anything else
/// that is not JSON is an error.
pub fn read_history(path: &Path) -> Result<Vec<Event>, CheckError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| CheckError::Io {
        path: name.clone(),
        source,
    })?;
    let ends_with_newline = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let mut events = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fail = |detail: String| CheckError::Line {
            path: name.clone(),
            line: i + 1,
            detail,
        };
        let value = match serde_json::from_str::<Value>(line) {
            Ok(value) => value,
            Err(_) if i + 1 == lines.len() && !ends_with_newline => continue,
            Err(e) => match after_torn_prefix(line) {
                Some(value) => value,
                None => return Err(fail(format!("not JSON: {e}"))),
            },
        };
        events.push(Event::from_json(value, i + 1).map_err(fail)?);
    }
    events.sort_by_key(|e| e.t);
    Ok(events)
}

/// The event of a line that begins with a torn write: the first `{"` after the start from
/// which the rest of the line parses as one object (an object nested in a field cannot: the
/// closing braces of its parents follow it).
fn after_torn_prefix(line: &str) -> Option<Value> {
    line.match_indices("{\"")
        .map(|(at, _)| at)
        .filter(|&at| at > 0)
        .find_map(|at| serde_json::from_str::<Value>(&line[at..]).ok())
        .filter(Value::is_object)
}
