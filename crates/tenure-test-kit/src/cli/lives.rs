//! Where the history shows shards and singleton instances running, for steering tests
//! (which node hosts what now, where a shard moved). Safety is judged by `tenure check`
//! alone ([`super::assert_checked`]); this reads the lives through the checker's own
//! [`actions`], so both see the same thing.

use serde_json::Value;
use tenure::history::check::actions::{Action, ActionKind, actions};
use tenure::history::{Entry, Event};

/// One life of a shard, or of a singleton instance, on one node.
#[derive(Debug, Clone)]
pub struct Life {
    /// The shard id, or the singleton's name.
    pub subject: String,
    /// The node it ran on (`host:port`).
    pub node: String,
    /// The fencing token of the grant it ran under.
    pub token: u64,
    /// When it started (ns of `CLOCK_BOOTTIME`).
    pub start: i64,
    /// When it ended (stopped, or its process killed or exited); `None` while it runs.
    pub end: Option<i64>,
    /// Why it ended: the stop's `why`, or the fault that ended its process.
    pub why: String,
}

fn events(history: &[Value]) -> Vec<Entry> {
    let mut events: Vec<Entry> = history
        .iter()
        .map(|v| Entry::from_json(v.clone(), 0).expect("a history line"))
        .collect();
    events.sort_by_key(|e| e.t);
    events
}

fn lives(history: &[Value], kind: ActionKind) -> Vec<Life> {
    actions(&events(history))
        .into_iter()
        .filter(|a| a.kind == kind)
        .map(|a| {
            let subject = match &a.began.event {
                Event::ShardStarted(l) => l.shard.clone(),
                Event::SingletonStarting(l) => l.singleton.clone(),
                _ => String::new(),
            };
            life(&a, subject)
        })
        .collect()
}

/// The life that action `a` shows, of `subject`.
fn life(a: &Action, subject: String) -> Life {
    Life {
        subject,
        node: a.node.clone(),
        token: a.token,
        start: a.from_ns,
        end: a.ended.as_ref().map(|e| e.t),
        why: a
            .ended
            .as_ref()
            .map(|e| e.event.why().map_or_else(|| e.kind(), str::to_string))
            .unwrap_or_default(),
    }
}

/// Every shard life, in start order.
pub fn shard_lives(history: &[Value]) -> Vec<Life> {
    lives(history, ActionKind::ShardLife)
}

/// Every life of an entity of type `entity_type`, in start order (`subject`: the entity
/// id).
pub fn entity_lives(history: &[Value], entity_type: &str) -> Vec<Life> {
    actions(&events(history))
        .into_iter()
        .filter(|a| a.kind == ActionKind::EntityLife)
        .filter_map(|a| {
            let Event::EntityStarted(l) = &a.began.event else {
                return None;
            };
            (l.entity_type == entity_type).then(|| life(&a, l.entity.clone()))
        })
        .collect()
}

/// The entities of type `entity_type` alive at the end of the history: per entity id, its
/// latest life if it has not ended.
pub fn live_entities(
    history: &[Value],
    entity_type: &str,
) -> std::collections::BTreeMap<String, Life> {
    let mut latest = std::collections::BTreeMap::new();
    for l in entity_lives(history, entity_type) {
        latest.insert(l.subject.clone(), l);
    }
    latest.retain(|_, l| l.end.is_none());
    latest
}

/// Every instance of singleton `name`, in start order.
pub fn singleton_lives(history: &[Value], name: &str) -> Vec<Life> {
    lives(history, ActionKind::SingletonLife)
        .into_iter()
        .filter(|l| l.subject == name)
        .collect()
}

/// Whether `node` is frozen (SIGSTOP) at the end of the history.
pub fn frozen(history: &[Value], node: &str) -> bool {
    events(history)
        .iter()
        .rfind(|e| {
            e.is_fault()
                && e.node == node
                && matches!(e.event, Event::Paused {} | Event::Resumed {})
        })
        .is_some_and(|e| matches!(e.event, Event::Paused {}))
}
