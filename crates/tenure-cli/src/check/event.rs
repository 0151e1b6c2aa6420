//! One history line, and reading a history file.

use std::io::BufRead;
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
pub fn read_history(path: &Path) -> Result<Vec<Event>, CheckError> {
    let name = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| CheckError::Io {
        path: name.clone(),
        source,
    })?;
    let mut events = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|source| CheckError::Io {
            path: name.clone(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let fail = |detail: String| CheckError::Line {
            path: name.clone(),
            line: i + 1,
            detail,
        };
        let value: Value =
            serde_json::from_str(&line).map_err(|e| fail(format!("not JSON: {e}")))?;
        events.push(Event::from_json(value, i + 1).map_err(fail)?);
    }
    events.sort_by_key(|e| e.t);
    Ok(events)
}
