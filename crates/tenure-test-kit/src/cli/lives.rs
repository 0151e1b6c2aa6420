//! Where the history shows shards and singleton instances running, for steering tests
//! (which node hosts what now, where a shard moved). Safety is judged by `tenure check`
//! alone ([`super::assert_checked`]); this reads the lives through the checker's own
//! [`actions`], so both see the same thing.

use serde_json::Value;
use tenure_cli::check::Event;
use tenure_cli::check::actions::{ActionKind, actions};

/// One life of a shard, or of a singleton instance, on one node.
#[derive(Debug, Clone)]
pub struct Life {
    /// The shard id, or the singleton's name.
    pub subject: String,
    pub node: String,
    pub token: u64,
    pub start: i64,
    /// When it ended (stopped, or its process killed or exited); `None` while it runs.
    pub end: Option<i64>,
    /// Why it ended: the stop's `why`, or the fault that ended its process.
    pub why: String,
}

fn events(history: &[Value]) -> Vec<Event> {
    let mut events: Vec<Event> = history
        .iter()
        .map(|v| Event::from_json(v.clone(), 0).expect("a history line"))
        .collect();
    events.sort_by_key(|e| e.t);
    events
}

fn lives(history: &[Value], kind: ActionKind, subject: &str) -> Vec<Life> {
    actions(&events(history))
        .into_iter()
        .filter(|a| a.kind == kind)
        .map(|a| Life {
            subject: a.began.str(subject).unwrap_or_default().to_string(),
            node: a.node,
            token: a.token,
            start: a.from_ns,
            end: a.ended.as_ref().map(|e| e.t),
            why: a
                .ended
                .as_ref()
                .map(|e| e.str("why").unwrap_or(&e.kind).to_string())
                .unwrap_or_default(),
        })
        .collect()
}

/// Every shard life, in start order.
pub fn shard_lives(history: &[Value]) -> Vec<Life> {
    lives(history, ActionKind::ShardLife, "shard")
}

/// Every instance of singleton `name`, in start order.
pub fn singleton_lives(history: &[Value], name: &str) -> Vec<Life> {
    lives(history, ActionKind::SingletonLife, "singleton")
        .into_iter()
        .filter(|l| l.subject == name)
        .collect()
}

/// Whether `node` is frozen (SIGSTOP) at the end of the history.
pub fn frozen(history: &[Value], node: &str) -> bool {
    events(history)
        .iter()
        .rfind(|e| {
            e.is_fault() && e.node == node && matches!(e.kind.as_str(), "paused" | "resumed")
        })
        .is_some_and(|e| e.kind == "paused")
}
