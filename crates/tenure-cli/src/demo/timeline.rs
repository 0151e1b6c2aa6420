//! Who held which lease when, and which faults were injected when, rebuilt from a history:
//! what the report draws and the summary measures.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::DemoError;

/// One node's hold of one lease, on the host's monotonic clock (ns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The holder, `host:port`.
    pub node: String,
    /// The holder's incarnation.
    pub inc: String,
    pub token: u64,
    pub from_ns: u64,
    pub until_ns: u64,
    /// When the holder was frozen past the ttl: its belief ended at `until_ns` (its local
    /// deadline), while its process only noticed at this later time. Drawn hatched.
    pub noticed_ns: Option<u64>,
}

/// A fault the harness injected, from its `inc = "harness"` history lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultMark {
    /// `killed`, `paused`, `terminated`, `link_cut`, `restarted`.
    pub kind: String,
    pub node: String,
    pub peer: Option<String>,
    pub t_ns: u64,
    /// The end of a pause (`resumed`) or of a cut (`link_healed`).
    pub until_ns: Option<u64>,
}

impl FaultMark {
    /// A short label: `SIGKILL 127.0.0.1:4000`.
    pub fn label(&self) -> String {
        let what = match self.kind.as_str() {
            "killed" => "SIGKILL",
            "paused" => "SIGSTOP",
            "terminated" => "leave",
            "link_cut" => "cut",
            "restarted" => "restart",
            other => other,
        };
        match &self.peer {
            Some(peer) => format!("{what} {} | {peer}", self.node),
            None => format!("{what} {}", self.node),
        }
    }
}

/// Everything the report draws.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub start_ns: u64,
    pub end_ns: u64,
    /// Holds per lease name, in time order.
    pub holds: BTreeMap<String, Vec<Hold>>,
    pub faults: Vec<FaultMark>,
    /// Every node that appears in the history, in order of first appearance.
    pub nodes: Vec<String>,
}

/// Reads a history file: one JSON object per line (a torn last line is skipped).
pub fn read_events(path: &Path) -> Result<Vec<Value>, DemoError> {
    let text = std::fs::read_to_string(path).map_err(|source| DemoError::History {
        path: path.display().to_string(),
        problem: source.to_string(),
    })?;
    let complete = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let mut events = Vec::with_capacity(lines.len());
    for (n, line) in lines.iter().enumerate() {
        match serde_json::from_str::<Value>(line) {
            Ok(v) => events.push(v),
            Err(_) if n + 1 == lines.len() && !complete => {}
            Err(e) => {
                return Err(DemoError::History {
                    path: path.display().to_string(),
                    problem: format!("line {}: {e}", n + 1),
                });
            }
        }
    }
    events.sort_by_key(t);
    Ok(events)
}

fn t(e: &Value) -> u64 {
    e["t"].as_u64().unwrap_or(0)
}

fn text(e: &Value, key: &str) -> String {
    match &e[key] {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The lease an event of the example workload is about (a shard's or a singleton's), if any.
pub fn lease_of(e: &Value, system: &str) -> Option<String> {
    if e.get("shard").is_some() && e.get("type").is_some() {
        return Some(tenure::names::shard_lease(
            system,
            &text(e, "type"),
            &text(e, "shard"),
        ));
    }
    e.get("singleton")
        .map(|_| tenure::names::singleton_lease(system, &text(e, "singleton")))
}

/// Rebuilds every hold from the entity-level events (`shard_started` / `shard_stopped`,
/// `singleton_started` / `singleton_stopped`), closing a node's holds when the harness
/// killed it and open ones at the end of the history.
///
/// A node frozen (SIGSTOP) for at least `ttl` lost every lease it held by its local
/// deadline, some time during the freeze (its last renewal was sent before it; when
/// exactly, entity events do not say). A frozen process acts on nothing, and its fenced
/// writes after the resume are refused, so such a hold ends at the freeze and the rest,
/// until the node noticed the loss, is kept as `noticed_ns`.
pub fn holds_from_events(
    events: &[Value],
    system: &str,
    ttl: Duration,
) -> BTreeMap<String, Vec<Hold>> {
    let mut holds: BTreeMap<String, Vec<Hold>> = BTreeMap::new();
    let mut frozen: BTreeMap<String, u64> = BTreeMap::new();
    let mut freezes: Vec<(String, u64, u64)> = Vec::new();
    let end = events.last().map(t).unwrap_or(0);
    const OPEN: u64 = u64::MAX;
    for e in events {
        let node = text(e, "node");
        let kind = e["event"].as_str().unwrap_or_default();
        let close = |list: &mut Vec<Hold>, token: Option<u64>, at: u64| {
            for h in list
                .iter_mut()
                .filter(|h| h.node == node && h.until_ns == OPEN)
                .filter(|h| token.is_none_or(|tk| h.token == tk))
            {
                h.until_ns = at;
            }
        };
        match kind {
            "shard_started" | "singleton_started" => {
                let Some(lease) = lease_of(e, system) else {
                    continue;
                };
                holds.entry(lease).or_default().push(Hold {
                    node,
                    inc: text(e, "inc"),
                    token: e["token"].as_u64().unwrap_or(0),
                    from_ns: t(e),
                    until_ns: OPEN,
                    noticed_ns: None,
                });
            }
            "shard_stopped" | "singleton_stopped" => {
                let Some(lease) = lease_of(e, system) else {
                    continue;
                };
                if let Some(list) = holds.get_mut(&lease) {
                    close(list, e["token"].as_u64(), t(e));
                }
            }
            "killed" => {
                for list in holds.values_mut() {
                    close(list, None, t(e));
                }
            }
            "paused" => {
                frozen.insert(node, t(e));
            }
            "resumed" => {
                if let Some(from) = frozen.remove(&node) {
                    freezes.push((node, from, t(e)));
                }
            }
            _ => {}
        }
    }
    freezes.extend(frozen.into_iter().map(|(node, from)| (node, from, end)));
    let ttl_ns = ttl.as_nanos() as u64;
    for list in holds.values_mut() {
        for h in list.iter_mut() {
            if h.until_ns == OPEN {
                h.until_ns = end.max(h.from_ns);
            }
            for (node, from, to) in &freezes {
                if *node == h.node && to - from >= ttl_ns && h.from_ns <= *from && h.until_ns > *to
                {
                    h.noticed_ns = Some(h.until_ns);
                    h.until_ns = *from;
                }
            }
        }
    }
    holds
}

/// The faults injected by the harness, a pause ending at its `resumed` and a cut at its
/// `link_healed`.
pub fn faults_from_events(events: &[Value]) -> Vec<FaultMark> {
    let mut faults: Vec<FaultMark> = Vec::new();
    for e in events.iter().filter(|e| e["inc"] == "harness") {
        let node = text(e, "node");
        let peer = e.get("peer").map(|_| text(e, "peer"));
        match e["event"].as_str().unwrap_or_default() {
            kind @ ("killed" | "paused" | "terminated" | "link_cut" | "restarted") => {
                faults.push(FaultMark {
                    kind: kind.to_string(),
                    node,
                    peer,
                    t_ns: t(e),
                    until_ns: None,
                });
            }
            end @ ("resumed" | "link_healed") => {
                let start = if end == "resumed" {
                    "paused"
                } else {
                    "link_cut"
                };
                if let Some(f) = faults.iter_mut().rev().find(|f| {
                    f.kind == start && f.node == node && f.peer == peer && f.until_ns.is_none()
                }) {
                    f.until_ns = Some(t(e));
                }
            }
            _ => {}
        }
    }
    faults
}

impl Timeline {
    /// The timeline of `events` (sorted by time) with the given holds.
    pub fn new(events: &[Value], holds: BTreeMap<String, Vec<Hold>>) -> Timeline {
        let mut nodes: Vec<String> = Vec::new();
        for e in events {
            let node = text(e, "node");
            if !node.is_empty() && !nodes.contains(&node) {
                nodes.push(node);
            }
        }
        Timeline {
            start_ns: events.first().map(t).unwrap_or(0),
            end_ns: events.last().map(t).unwrap_or(0),
            holds,
            faults: faults_from_events(events),
            nodes,
        }
    }

    /// Pairs of holds of one lease by two nodes at overlapping times, and holds granted
    /// with a token not above the previous grant's: each explained.
    pub fn overlaps(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (lease, list) in &self.holds {
            for (i, a) in list.iter().enumerate() {
                for b in &list[i + 1..] {
                    if a.node != b.node && a.from_ns < b.until_ns && b.from_ns < a.until_ns {
                        problems.push(format!(
                            "{lease}: held by {} (token {}) and {} (token {}) at once, for {:.3} s",
                            a.node,
                            a.token,
                            b.node,
                            b.token,
                            (a.until_ns.min(b.until_ns) - a.from_ns.max(b.from_ns)) as f64 / 1e9
                        ));
                    }
                    if b.node != a.node && b.token <= a.token {
                        problems.push(format!(
                            "{lease}: {} was granted token {} after {} held token {}",
                            b.node, b.token, a.node, a.token
                        ));
                    }
                }
            }
        }
        problems
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::json;

    use super::*;

    pub fn line(t: u64, node: &str, event: &str, extra: Value) -> Value {
        let mut v = json!({"t": t, "node": node, "inc": "i1", "event": event});
        if let (Some(o), Value::Object(x)) = (v.as_object_mut(), extra) {
            o.extend(x);
        }
        v
    }

    pub fn harness(t: u64, node: &str, event: &str) -> Value {
        json!({"t": t, "node": node, "inc": "harness", "event": event})
    }

    fn shard(shard: &str, token: u64) -> Value {
        json!({"type": "counter", "shard": shard, "token": token})
    }

    #[test]
    fn holds_end_at_stop_kill_or_the_end_of_the_history() {
        let events = vec![
            line(10, "a", "shard_started", shard("1", 1)),
            line(12, "b", "shard_started", shard("2", 1)),
            line(20, "a", "shard_stopped", shard("1", 1)),
            line(21, "b", "shard_started", shard("1", 2)),
            harness(30, "b", "killed"),
            line(40, "a", "shard_started", shard("2", 2)),
            line(50, "a", "tick", json!({})),
        ];
        let holds = holds_from_events(&events, "tenure", Duration::from_secs(3));
        let one = &holds["tenure-shard-counter-1"];
        assert_eq!(
            (one[0].from_ns, one[0].until_ns, one[0].node.as_str()),
            (10, 20, "a")
        );
        assert_eq!(
            (one[1].from_ns, one[1].until_ns, one[1].node.as_str()),
            (21, 30, "b")
        );
        let two = &holds["tenure-shard-counter-2"];
        assert_eq!((two[0].until_ns, two[1].until_ns), (30, 50));
        assert!(Timeline::new(&events, holds).overlaps().is_empty());
    }

    #[test]
    fn a_hold_frozen_past_the_ttl_ends_at_the_freeze() {
        let s = 1_000_000_000;
        let events = vec![
            line(s, "a", "shard_started", shard("1", 1)),
            harness(2 * s, "a", "paused"),
            line(6 * s, "b", "shard_started", shard("1", 2)),
            harness(8 * s, "a", "resumed"),
            line(8 * s + 5, "a", "shard_stopped", shard("1", 1)),
        ];
        let holds = holds_from_events(&events, "tenure", Duration::from_secs(3));
        let a = &holds["tenure-shard-counter-1"][0];
        assert_eq!(a.until_ns, 2 * s);
        assert_eq!(a.noticed_ns, Some(8 * s + 5));
        let timeline = Timeline::new(&events, holds);
        assert!(timeline.overlaps().is_empty());
        assert_eq!(timeline.faults[0].until_ns, Some(8 * s));
    }

    #[test]
    fn overlapping_holds_and_reused_tokens_are_reported() {
        let events = vec![
            line(10, "a", "shard_started", shard("1", 5)),
            line(15, "b", "shard_started", shard("1", 5)),
            line(20, "a", "shard_stopped", shard("1", 5)),
        ];
        let holds = holds_from_events(&events, "tenure", Duration::from_secs(3));
        let problems = Timeline::new(&events, holds).overlaps();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("at once"), "{problems:?}");
        assert!(problems[1].contains("token 5 after"), "{problems:?}");
    }
}
