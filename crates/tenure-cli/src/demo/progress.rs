//! The live view of a running demo: the history read incrementally (only the lines added
//! since the last look) into acks so far, the holder of each lease and the progress line.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::timeline::lease_of;
use crate::check::{Entry, Event};

/// What the history says now.
#[derive(Debug, Default)]
pub struct Live {
    path: PathBuf,
    offset: u64,
    partial: String,
    system: String,
    /// Increments acknowledged so far.
    pub acks: usize,
    /// The node running each shard or singleton now.
    pub holders: BTreeMap<String, String>,
}

impl Live {
    /// Follows the history at `path` (lease names of the `[tenure] system` `system`), from
    /// its start; nothing is read until [`Live::poll`].
    pub fn new(path: &Path, system: &str) -> Live {
        Live {
            path: path.to_path_buf(),
            system: system.to_string(),
            ..Live::default()
        }
    }

    /// Reads the lines appended since the last call (a missing file is an empty history).
    pub fn poll(&mut self) {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return;
        };
        if file.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut buf = Vec::new();
        let Ok(n) = file.read_to_end(&mut buf) else {
            return;
        };
        self.offset += n as u64;
        self.partial.push_str(&String::from_utf8_lossy(&buf));
        let Some(end) = self.partial.rfind('\n') else {
            return;
        };
        let complete: String = self.partial.drain(..=end).collect();
        for line in complete.lines() {
            // A line that does not parse is left to `tenure check` to report at the end.
            if let Some(e) = serde_json::from_str::<Value>(line)
                .ok()
                .and_then(|v| Entry::from_json(v, 0).ok())
            {
                self.apply(e);
            }
        }
    }

    fn apply(&mut self, e: Entry) {
        let node = e.node;
        match &e.event {
            Event::Ack { .. } => self.acks += 1,
            Event::ShardStarted(_) | Event::SingletonStarted(_) => {
                if let Some(lease) = lease_of(&e.event, &self.system) {
                    self.holders.insert(lease, node);
                }
            }
            Event::ShardStopped(_) | Event::SingletonStopped(_) => {
                if let Some(lease) = lease_of(&e.event, &self.system)
                    && self.holders.get(&lease) == Some(&node)
                {
                    self.holders.remove(&lease);
                }
            }
            Event::Killed {} => self.holders.retain(|_, holder| *holder != node),
            _ => {}
        }
    }

    /// How many shards of `type_name` each node runs.
    pub fn shards_per_node(&self, type_name: &str) -> BTreeMap<&str, usize> {
        let prefix = tenure::names::shard_lease(&self.system, type_name, "");
        let mut per = BTreeMap::new();
        for (lease, node) in &self.holders {
            if lease.starts_with(&prefix) {
                *per.entry(node.as_str()).or_insert(0) += 1;
            }
        }
        per
    }

    /// The node running singleton `name`, if any.
    pub fn singleton_holder(&self, name: &str) -> Option<&str> {
        self.holders
            .get(&tenure::names::singleton_lease(&self.system, name))
            .map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn lines_are_read_once_and_a_torn_line_waits_for_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.jsonl");
        let mut f = std::fs::File::create(&path).unwrap();
        let mut live = Live::new(&path, "tenure");
        writeln!(
            f,
            r#"{{"t":1,"node":"a","inc":"1","event":"shard_started","type":"counter","shard":"1","token":1}}"#
        )
        .unwrap();
        writeln!(
            f,
            r#"{{"t":2,"node":"b","inc":"2","event":"singleton_started","singleton":"demo","token":1}}"#
        )
        .unwrap();
        write!(f, r#"{{"t":3,"node":"a","inc":"1","event":"a"#).unwrap();
        live.poll();
        writeln!(
            f,
            r#"ck","entity":"k","shard":"1","value":1,"token":1,"from":"a"}}"#
        )
        .unwrap();
        live.poll();
        live.poll();
        assert_eq!(live.acks, 1);
        assert_eq!(live.shards_per_node("counter").get("a"), Some(&1));
        assert_eq!(live.singleton_holder("demo"), Some("b"));
        writeln!(
            f,
            r#"{{"t":4,"node":"a","inc":"harness","event":"killed"}}"#
        )
        .unwrap();
        live.poll();
        assert!(live.shards_per_node("counter").is_empty());
    }
}
