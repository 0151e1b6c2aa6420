//! Who held which lease when (the checker's holds of the shards' and singletons' leases)
//! and which faults were injected when: what the report draws and the summary measures.

use std::collections::BTreeMap;

use crate::check::{self, Entry, Event, HoldEnd};

/// One node's hold of one lease, on the host's CLOCK_BOOTTIME (ns): from its grant to
/// the first of its release, its loss, its process's end and its last local deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The holder, `host:port`.
    pub node: String,
    /// The holder's incarnation.
    pub inc: String,
    /// The grant's fencing token.
    pub token: u64,
    /// When the hold began (ns of `CLOCK_BOOTTIME`).
    pub from_ns: u64,
    /// When it ended (ns of `CLOCK_BOOTTIME`).
    pub until_ns: u64,
    /// When the holder recorded the loss later than its deadline (a node frozen past the
    /// ttl notices on resume): its belief ended at `until_ns`, the rest is drawn pale.
    pub noticed_ns: Option<u64>,
}

/// A fault the harness injected, from its `inc = "harness"` history lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultMark {
    /// `killed`, `paused`, `leaving`, `link_cut`, `isolated`, `restarted`.
    pub kind: String,
    /// The target node (`host:port`), or `store`.
    pub node: String,
    /// The other end of a cut link, if the fault is a link's.
    pub peer: Option<String>,
    /// When it was injected (ns of `CLOCK_BOOTTIME`).
    pub t_ns: u64,
    /// The end of a pause (`resumed`), a cut (`link_healed`) or an isolation
    /// (`isolation_healed`).
    pub until_ns: Option<u64>,
}

impl FaultMark {
    /// A short label: `SIGKILL 127.0.0.1:4000`.
    pub fn label(&self) -> String {
        let what = match self.kind.as_str() {
            "killed" => "SIGKILL",
            "paused" => "SIGSTOP",
            "leaving" => "leave",
            "link_cut" => "cut",
            "isolated" => "isolate",
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
    /// The history's first event (ns of `CLOCK_BOOTTIME`).
    pub start_ns: u64,
    /// The history's last event (ns of `CLOCK_BOOTTIME`).
    pub end_ns: u64,
    /// Holds per lease name, in time order.
    pub holds: BTreeMap<String, Vec<Hold>>,
    /// The faults the harness injected, in time order.
    pub faults: Vec<FaultMark>,
    /// Every node that appears in the history, in order of first appearance.
    pub nodes: Vec<String>,
}

/// The lease a shard's or a singleton's life event is about, if it is one.
pub fn lease_of(e: &Event, system: &str) -> Option<String> {
    match e {
        Event::ShardStarted(l) | Event::ShardStopped(l) | Event::ShardLeaseLost(l) => {
            Some(tenure::names::shard_lease(system, &l.entity_type, &l.shard))
        }
        Event::SingletonStarting(l)
        | Event::SingletonStarted(l)
        | Event::SingletonStopped(l)
        | Event::SingletonZombie(l)
        | Event::SingletonLeaseLost(l) => {
            Some(tenure::names::singleton_lease(system, &l.singleton))
        }
        _ => None,
    }
}

/// The holds of the shards' and singletons' leases (`<system>-shard-…`,
/// `<system>-singleton-…`) among the checker's holds.
pub fn workload_holds(
    holds: &BTreeMap<String, Vec<check::Hold>>,
    system: &str,
) -> BTreeMap<String, Vec<Hold>> {
    // `<system>-shard-` and `<system>-singleton-`, from the one definition of the names.
    let shard = format!(
        "{}-",
        tenure::names::shard_lease(system, "", "").trim_end_matches('-')
    );
    let singleton = tenure::names::singleton_lease(system, "");
    let ns = |t: i64| t.max(0) as u64;
    holds
        .iter()
        .filter(|(lease, _)| lease.starts_with(&shard) || lease.starts_with(&singleton))
        .map(|(lease, list)| {
            let list = list
                .iter()
                .map(|h| Hold {
                    node: h.node.clone(),
                    inc: h.inc.clone(),
                    token: h.token,
                    from_ns: ns(h.from_ns),
                    until_ns: ns(h.until_ns),
                    noticed_ns: match (&h.end, &h.ended) {
                        (HoldEnd::Lost(_), Some(e)) if e.t > h.until_ns => Some(ns(e.t)),
                        _ => None,
                    },
                })
                .collect();
            (lease.clone(), list)
        })
        .collect()
}

/// The faults injected by the harness, a pause ending at its `resumed` and a cut at its
/// `link_healed`.
pub fn faults_from_events(events: &[Entry]) -> Vec<FaultMark> {
    let mut faults: Vec<FaultMark> = Vec::new();
    for e in events.iter().filter(|e| e.is_fault()) {
        let node = e.node.clone();
        let peer = match &e.event {
            Event::LinkCut(l) | Event::LinkHealed(l) => l.peer.clone(),
            _ => None,
        };
        let t_ns = e.t.max(0) as u64;
        match &e.event {
            Event::Killed {}
            | Event::Paused {}
            | Event::Leaving {}
            | Event::LinkCut(_)
            | Event::Isolated {}
            | Event::Restarted {} => {
                faults.push(FaultMark {
                    kind: e.kind(),
                    node,
                    peer,
                    t_ns,
                    until_ns: None,
                });
            }
            end @ (Event::Resumed {} | Event::LinkHealed(_) | Event::IsolationHealed {}) => {
                let start = match end {
                    Event::Resumed {} => "paused",
                    Event::LinkHealed(_) => "link_cut",
                    _ => "isolated",
                };
                if let Some(f) = faults.iter_mut().rev().find(|f| {
                    f.kind == start && f.node == node && f.peer == peer && f.until_ns.is_none()
                }) {
                    f.until_ns = Some(t_ns);
                }
            }
            _ => {}
        }
    }
    faults
}

impl Timeline {
    /// The timeline of `events` (sorted by time) with the given holds.
    pub fn new(events: &[Entry], holds: BTreeMap<String, Vec<Hold>>) -> Timeline {
        let mut nodes: Vec<String> = Vec::new();
        for e in events.iter().filter(|e| !e.is_fault()) {
            if !e.node.is_empty() && !nodes.contains(&e.node) {
                nodes.push(e.node.clone());
            }
        }
        let t = |e: &Entry| e.t.max(0) as u64;
        Timeline {
            start_ns: events.first().map(t).unwrap_or(0),
            end_ns: events.last().map(t).unwrap_or(0),
            holds,
            faults: faults_from_events(events),
            nodes,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// A history line at `t` by `node` (`inc` `harness` makes it a fault).
    pub fn line(t: i64, node: &str, inc: &str, event: &str, extra: Value) -> Entry {
        let mut v = json!({"t": t, "node": node, "inc": inc, "event": event});
        if let (Some(o), Value::Object(x)) = (v.as_object_mut(), extra) {
            o.extend(x);
        }
        Entry::from_json(v, 0).expect("a valid line")
    }

    fn lease(name: &str, token: u64, valid_until: i64) -> Value {
        json!({"lease": name, "owner": "o", "token": token, "valid_until": valid_until})
    }

    #[test]
    fn the_timeline_keeps_the_workload_leases_and_pale_tails_of_late_losses() {
        let s = 1_000_000_000i64;
        let shard = "tenure-shard-counter-1";
        let events = vec![
            line(
                s,
                "a",
                "i1",
                "lease_granted",
                lease("tenure-member-a", 1, 4 * s),
            ),
            line(s, "a", "i1", "lease_granted", lease(shard, 1, 4 * s)),
            line(2 * s, "a", "harness", "paused", json!({})),
            line(5 * s, "b", "i2", "lease_granted", lease(shard, 2, 8 * s)),
            line(9 * s, "a", "harness", "resumed", json!({})),
            line(
                9 * s,
                "a",
                "i1",
                "lease_lost",
                json!({"lease": shard, "owner": "a", "token": 1, "reason": "expired"}),
            ),
            line(
                9 * s,
                "b",
                "i2",
                "lease_released",
                json!({"lease": shard, "owner": "b", "token": 2}),
            ),
        ];
        let verdict = check::check(&events);
        assert!(verdict.is_safe(), "{:?}", verdict.violations);
        let holds = workload_holds(&verdict.holds, "tenure");
        assert_eq!(holds.keys().collect::<Vec<_>>(), vec![shard]);
        let a = &holds[shard][0];
        assert_eq!(
            (a.node.as_str(), a.until_ns, a.noticed_ns),
            ("a", 4 * s as u64, Some(9 * s as u64))
        );
        assert_eq!(holds[shard][1].noticed_ns, None);
        let timeline = Timeline::new(&events, holds);
        assert_eq!(timeline.nodes, vec!["a", "b"]);
        assert_eq!(timeline.faults.len(), 1);
        assert_eq!(timeline.faults[0].until_ns, Some(9 * s as u64));
        assert_eq!(timeline.faults[0].label(), "SIGSTOP a");
    }

    #[test]
    fn a_cut_ends_at_its_heal_and_names_both_sides() {
        let events = vec![
            line(1, "a", "harness", "link_cut", json!({"peer": "b"})),
            line(2, "a", "harness", "link_healed", json!({"peer": "b"})),
            line(3, "b", "harness", "killed", json!({})),
        ];
        let faults = faults_from_events(&events);
        assert_eq!(faults.len(), 2);
        assert_eq!(
            (faults[0].label(), faults[0].until_ns),
            ("cut a | b".to_string(), Some(2))
        );
        assert_eq!(
            (faults[1].label(), faults[1].until_ns),
            ("SIGKILL b".to_string(), None)
        );
    }
}
