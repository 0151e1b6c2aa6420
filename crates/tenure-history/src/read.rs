//! Reading a history file, torn lines of killed writers included.

use std::path::Path;

use serde_json::Value;

use crate::entry::Entry;

/// Why a history could not be read or written: the file, or a line of it (1-based) and what
/// is wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HistoryError {
    /// The file could not be opened or read.
    #[error("cannot read history {path}: {source}")]
    Io {
        /// The file's path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file could not be opened or appended to.
    #[error("cannot append to history {path}: {source}")]
    Append {
        /// The file's path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A line is not a valid history line.
    #[error("history {path} line {line}: {detail}")]
    Line {
        /// The file's path.
        path: String,
        /// The line number (1-based).
        line: usize,
        /// What is wrong with it: not JSON, or a known kind with a field missing or of the
        /// wrong type.
        detail: String,
    },
}

/// Reads a history: one JSON object per line (blank lines skipped), sorted by `t` (stable,
/// so the lines of one writer keep their order). Errors name the file and line. Kinds this
/// build does not know are kept as [`Event::Other`](crate::Event::Other).
///
/// A writer killed in the middle of a line leaves a torn line: Linux may stop a write to a
/// regular file at a page boundary when SIGKILL arrives. Its event is lost, exactly as if
/// the writer had been killed just before writing it, which the rules already allow for. So
/// a line that is not JSON is accepted as torn when it is the file's last line without a
/// newline, or when the next writer's line, appended right after the torn bytes, parses from
/// its own start; the torn prefix is skipped. Anything else that is not JSON is an error.
pub fn read_history(path: &Path) -> Result<Vec<Entry>, HistoryError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| HistoryError::Io {
        path: name.clone(),
        source,
    })?;
    let fail = |line: usize, detail: String| HistoryError::Line {
        path: name.clone(),
        line,
        detail,
    };
    let mut entries = Vec::new();
    for (line, value) in history_lines(&text).map_err(|(line, e)| fail(line, e))? {
        entries.push(Entry::from_json(value, line).map_err(|e| fail(line, e.to_string()))?);
    }
    entries.sort_by_key(|e| e.t);
    Ok(entries)
}

/// The JSON objects of a history's text with their 1-based line numbers, in file order,
/// under the torn-line rules of [`read_history`] (which also covers the last line of a
/// file still being written). `Err` names the first line that is neither JSON nor torn, and
/// what the parser said about it.
pub fn history_lines(text: &str) -> Result<Vec<(usize, Value)>, (usize, String)> {
    let ends_with_newline = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let mut values = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value = match serde_json::from_str::<Value>(line) {
            Ok(value) => value,
            Err(_) if i + 1 == lines.len() && !ends_with_newline => continue,
            Err(e) => match after_torn_prefix(line) {
                Some(value) => value,
                None => return Err((i + 1, format!("not JSON: {e}"))),
            },
        };
        values.push((i + 1, value));
    }
    Ok(values)
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
