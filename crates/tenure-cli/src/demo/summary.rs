//! The demo's figures: operations acknowledged, lease grants and losses, for each fault the
//! fail-over time and the service during it, and for each rolling restart the time per node
//! restarted, the requests left unanswered and the shards moved, all from the history.

use std::collections::BTreeSet;

use super::timeline::{FaultMark, Timeline};
use crate::availability::{self, Request};
use crate::check::{Entry, Event};

/// How long after a fault without an end (a kill, a leave) its service is measured.
const SERVICE_WINDOW_NS: u64 = 10_000_000_000;

/// The load's service during a fault: the requests issued from the fault to its end (a
/// heal or resume; 10 s for a kill or a leave), by every node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Service {
    /// Requests issued in the window.
    pub requests: usize,
    /// Of them, those answered.
    pub acked: usize,
    /// Keys of the whole run, and those with at least one request answered in the window.
    pub keys: usize,
    /// Keys with at least one request answered in the window.
    pub keys_answered: usize,
    /// 99th percentile latency of the answered requests (ms).
    pub p99_ms: Option<f64>,
}

impl Service {
    /// `97.1% of 1532 asks answered, 120/120 keys, p99 84 ms`.
    pub fn describe(&self) -> String {
        if self.requests == 0 {
            return "no request issued".into();
        }
        format!(
            "{:.1}% of {} asks answered, {}/{} keys, p99 {}",
            100.0 * self.acked as f64 / self.requests as f64,
            self.requests,
            self.keys_answered,
            self.keys,
            self.p99_ms
                .map_or("-".to_string(), |ms| format!("{ms:.0} ms"))
        )
    }
}

fn service(requests: &[Request], keys: usize, from_ns: u64, to_ns: u64) -> Service {
    let window = availability::issued_in(requests, from_ns as i64, to_ns as i64);
    let answered: BTreeSet<&str> = window
        .iter()
        .filter(|r| r.acked())
        .map(|r| r.entity.as_str())
        .collect();
    Service {
        requests: window.len(),
        acked: window.iter().filter(|r| r.acked()).count(),
        keys,
        keys_answered: answered.len(),
        p99_ms: availability::latency_quantile(&window, 0.99),
    }
}

/// How fast the leases of a fault's victim were held again: by another node, or by the
/// victim itself with a new grant (after it resumed or restarted).
#[derive(Debug, Clone, PartialEq)]
pub struct Failover {
    /// The fault.
    pub fault: FaultMark,
    /// Leases (shards, singletons) the victim held when the fault hit.
    pub held: usize,
    /// How many of them were granted again afterwards.
    pub moved: usize,
    /// Fault → the last of those leases granted again (ns); None when none was.
    pub time_ns: Option<u64>,
    /// The load's service during the fault.
    pub service: Service,
}

impl Failover {
    /// `2.41 s (21/21 leases granted again)` or `no lease granted again (0/12)`.
    pub fn describe(&self) -> String {
        match self.time_ns {
            Some(ns) => format!(
                "{:.2} s ({}/{} leases granted again)",
                ns as f64 / 1e9,
                self.moved,
                self.held
            ),
            None => format!("no lease granted again (0/{})", self.held),
        }
    }
}

/// A rolling restart the demo ran (its harness knows when, the history does not say).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RollWindow {
    /// When the first node was sent SIGTERM (ns of `CLOCK_BOOTTIME`).
    pub from_ns: u64,
    /// When the last node restarted was serving again (ns of `CLOCK_BOOTTIME`).
    pub until_ns: u64,
    /// Per node, in the order restarted: its address and the time from its SIGTERM until
    /// the cluster converged with it back and hosting shards (ns).
    pub restarts: Vec<(String, u64)>,
}

/// The figures of a rolling restart.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Roll {
    /// When and what was restarted.
    pub window: RollWindow,
    /// Requests issued during the rolling restart, by every node.
    pub requests: usize,
    /// Of them, those never answered (timed out, or dropped by a node on its way out).
    pub unanswered: usize,
    /// Shards started during the rolling restart (each start is a shard that moved, or came
    /// back).
    pub shards_moved: usize,
}

impl Roll {
    /// `3 nodes, 4.21 s per node restarted (mean; at most 5.02 s), 0 of 1532 requests
    /// unanswered, 18 shards moved`.
    pub fn describe(&self) -> String {
        let times: Vec<u64> = self.window.restarts.iter().map(|(_, ns)| *ns).collect();
        let timing = match times.iter().max() {
            Some(most) => format!(
                "{:.2} s per node restarted (mean; at most {:.2} s)",
                times.iter().sum::<u64>() as f64 / times.len() as f64 / 1e9,
                *most as f64 / 1e9
            ),
            None => "no node restarted".into(),
        };
        format!(
            "{} nodes, {timing}, {} of {} requests unanswered, {} shards moved",
            times.len(),
            self.unanswered,
            self.requests,
            self.shards_moved
        )
    }
}

/// The summary of a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Increments acknowledged to the load drivers (`ack`).
    pub acks: usize,
    /// Writes the fenced counters accepted / refused (stale token).
    pub writes_accepted: usize,
    /// Writes the fenced counters refused (stale token).
    pub writes_refused: usize,
    /// Singleton ticks written.
    pub ticks: usize,
    /// Grants that started a shard or a singleton.
    pub grants: usize,
    /// Leases lost by their holder (`shard_lease_lost`, `singleton_lease_lost`).
    pub losses: usize,
    /// One per fault of the run, but for the leaves and restarts of a rolling restart.
    pub failovers: Vec<Failover>,
    /// One per rolling restart of the run.
    pub rolls: Vec<Roll>,
    /// From the first to the last event (ns).
    pub span_ns: u64,
}

/// The figures of `events` with the holds of `timeline`; fail-over times for the faults
/// that hit a node (kill, pause, leave, cut) before `scenario_end_ns` outside the `rolls`,
/// and the figures of each of the `rolls`.
pub fn summarize(
    events: &[Entry],
    timeline: &Timeline,
    scenario_end_ns: u64,
    rolls: &[RollWindow],
) -> Summary {
    let count = |pred: &dyn Fn(&Event) -> bool| events.iter().filter(|e| pred(&e.event)).count();
    let requests = availability::requests(events);
    let keys = requests
        .iter()
        .map(|r| r.entity.as_str())
        .collect::<BTreeSet<_>>()
        .len();
    Summary {
        acks: count(&|e| matches!(e, Event::Ack { .. })),
        writes_accepted: count(&|e| matches!(e, Event::Write { accepted: true, .. })),
        writes_refused: count(&|e| {
            matches!(
                e,
                Event::Write {
                    accepted: false,
                    ..
                }
            )
        }),
        ticks: count(&|e| matches!(e, Event::Tick { accepted: true, .. })),
        grants: timeline.holds.values().map(Vec::len).sum(),
        losses: count(&|e| matches!(e, Event::ShardLeaseLost(_) | Event::SingletonLeaseLost(_))),
        failovers: timeline
            .faults
            .iter()
            .filter(|f| f.t_ns < scenario_end_ns && f.kind != "restarted")
            .filter(|f| {
                !rolls
                    .iter()
                    .any(|r| r.from_ns <= f.t_ns && f.t_ns <= r.until_ns)
            })
            .map(|f| {
                let end = f
                    .until_ns
                    .unwrap_or(f.t_ns + SERVICE_WINDOW_NS)
                    .min(scenario_end_ns);
                Failover {
                    service: service(&requests, keys, f.t_ns, end),
                    ..failover(timeline, f)
                }
            })
            .collect(),
        rolls: rolls
            .iter()
            .map(|window| {
                let issued = availability::issued_in(
                    &requests,
                    window.from_ns as i64,
                    window.until_ns as i64,
                );
                let during = |t: i64| (window.from_ns as i64..=window.until_ns as i64).contains(&t);
                Roll {
                    window: window.clone(),
                    requests: issued.len(),
                    unanswered: issued.iter().filter(|r| !r.acked()).count(),
                    shards_moved: events
                        .iter()
                        .filter(|e| matches!(e.event, Event::ShardStarted(_)) && during(e.t))
                        .count(),
                }
            })
            .collect(),
        span_ns: timeline.end_ns.saturating_sub(timeline.start_ns),
    }
}

/// For each lease the victim held at the fault, the first later grant: to another node,
/// or a new grant to the victim (its hold at the fault started before it).
fn failover(timeline: &Timeline, fault: &FaultMark) -> Failover {
    let t0 = fault.t_ns;
    let mut held = 0;
    let mut moved = 0;
    let mut last: Option<u64> = None;
    for list in timeline.holds.values() {
        let victim_held = list
            .iter()
            .any(|h| h.node == fault.node && h.from_ns <= t0 && t0 <= h.until_ns);
        if !victim_held {
            continue;
        }
        held += 1;
        if let Some(next) = list
            .iter()
            .filter(|h| h.from_ns > t0)
            .map(|h| h.from_ns)
            .min()
        {
            moved += 1;
            last = Some(last.unwrap_or(0).max(next - t0));
        }
    }
    Failover {
        fault: fault.clone(),
        held,
        moved,
        time_ns: last,
        service: Service::default(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::super::timeline::Hold;
    use super::super::timeline::tests::line;
    use super::*;

    fn hold(node: &str, from: u64, until: u64) -> Hold {
        Hold {
            node: node.into(),
            inc: node.into(),
            token: from,
            from_ns: from,
            until_ns: until,
            noticed_ns: None,
        }
    }

    fn write(accepted: bool) -> serde_json::Value {
        json!({"type": "counter", "shard": "1", "entity": "k", "token": 1, "value": 1,
               "accepted": accepted})
    }

    #[test]
    fn failover_is_the_time_to_the_last_moved_lease() {
        let s = 1_000_000_000u64;
        let events = vec![
            line(
                s as i64,
                "b",
                "i",
                "ack",
                json!({"entity": "k", "shard": "1", "value": 1, "token": 1, "from": "b"}),
            ),
            line(2 * s as i64, "b", "i", "write", write(true)),
            line(2 * s as i64, "a", "i", "write", write(false)),
            line(3 * s as i64, "a", "harness", "killed", json!({})),
            line(20 * s as i64, "b", "harness", "leaving", json!({})),
        ];
        let mut holds = BTreeMap::new();
        holds.insert(
            "l1".to_string(),
            vec![hold("a", s, 3 * s), hold("b", 5 * s, 9 * s)],
        );
        holds.insert(
            "l2".to_string(),
            vec![hold("a", s, 3 * s), hold("b", 7 * s, 9 * s)],
        );
        holds.insert("l3".to_string(), vec![hold("b", s, 9 * s)]);
        let timeline = Timeline::new(&events, holds);
        let summary = summarize(&events, &timeline, 10 * s, &[]);
        assert_eq!(
            (
                summary.acks,
                summary.writes_accepted,
                summary.writes_refused
            ),
            (1, 1, 1)
        );
        assert_eq!(summary.grants, 5);
        // The final shutdown (after the scenario's end) is no fault to measure.
        assert_eq!(summary.failovers.len(), 1);
        let f = &summary.failovers[0];
        assert_eq!((f.held, f.moved, f.time_ns), (2, 2, Some(4 * s)));
        assert_eq!(f.describe(), "4.00 s (2/2 leases granted again)");
    }

    #[test]
    fn a_new_grant_to_a_resumed_victim_counts() {
        let s = 1_000_000_000u64;
        let events = vec![line(3 * s as i64, "a", "harness", "paused", json!({}))];
        let mut holds = BTreeMap::new();
        holds.insert(
            "l1".to_string(),
            vec![hold("a", s, 4 * s), hold("a", 8 * s, 9 * s)],
        );
        let timeline = Timeline::new(&events, holds);
        let summary = summarize(&events, &timeline, 10 * s, &[]);
        let f = &summary.failovers[0];
        assert_eq!((f.held, f.moved, f.time_ns), (1, 1, Some(5 * s)));
    }

    #[test]
    fn service_counts_the_requests_issued_during_the_fault() {
        let s = 1_000_000_000i64;
        let ask = |t: i64, kind: &str, key: &str, issued: i64| {
            line(
                t,
                "b",
                "i",
                kind,
                json!({"entity": key, "shard": "1", "issued": issued, "why": "timeout",
                       "value": 1, "token": 1, "from": "b"}),
            )
        };
        let events = vec![
            ask(s, "ack", "k1", s - 1000),
            line(2 * s, "a", "harness", "paused", json!({})),
            ask(3 * s, "no_ack", "k1", 2 * s + 10),
            ask(3 * s, "ack", "k2", 2 * s + 20),
            ask(4 * s, "ack", "k2", 3 * s),
            line(5 * s, "a", "harness", "resumed", json!({})),
            ask(6 * s, "ack", "k1", 5 * s + 1),
        ];
        let timeline = Timeline::new(&events, Default::default());
        let summary = summarize(&events, &timeline, 10 * s as u64, &[]);
        let service = &summary.failovers[0].service;
        assert_eq!(
            (
                service.requests,
                service.acked,
                service.keys,
                service.keys_answered
            ),
            (3, 2, 2, 1)
        );
        assert_eq!(service.p99_ms, Some(1000.0));
        assert_eq!(
            service.describe(),
            "66.7% of 3 asks answered, 1/2 keys, p99 1000 ms"
        );
    }

    #[test]
    fn a_rolling_restart_is_measured_as_one_deploy_not_as_faults() {
        let s = 1_000_000_000i64;
        let ask = |t: i64, kind: &str, issued: i64| {
            line(
                t,
                "b",
                "i",
                kind,
                json!({"entity": "k1", "shard": "1", "issued": issued, "why": "timeout",
                       "value": 1, "token": 1, "from": "b"}),
            )
        };
        let started = |t: i64, node: &str| {
            line(
                t,
                node,
                "i",
                "shard_started",
                json!({"type": "counter", "shard": "1", "token": 1}),
            )
        };
        let events = vec![
            line(s, "a", "harness", "killed", json!({})),
            started(2 * s, "b"),
            ask(11 * s, "ack", 10 * s + 1),
            line(11 * s, "a", "harness", "leaving", json!({})),
            started(12 * s, "c"),
            ask(13 * s, "no_ack", 12 * s),
            line(14 * s, "a", "harness", "restarted", json!({})),
            started(15 * s, "a"),
            line(16 * s, "b", "harness", "leaving", json!({})),
            ask(21 * s, "no_ack", 19 * s),
        ];
        let timeline = Timeline::new(&events, Default::default());
        let window = RollWindow {
            from_ns: 10 * s as u64,
            until_ns: 18 * s as u64,
            restarts: vec![("a".into(), 3 * s as u64), ("b".into(), 2 * s as u64)],
        };
        let summary = summarize(
            &events,
            &timeline,
            30 * s as u64,
            std::slice::from_ref(&window),
        );
        // The kill before the deploy is a fault; the deploy's leaves are not.
        assert_eq!(summary.failovers.len(), 1);
        assert_eq!(summary.failovers[0].fault.kind, "killed");
        let roll = &summary.rolls[0];
        assert_eq!(roll.window, window);
        assert_eq!(
            (roll.requests, roll.unanswered, roll.shards_moved),
            (2, 1, 2)
        );
        assert_eq!(
            roll.describe(),
            "2 nodes, 2.50 s per node restarted (mean; at most 3.00 s), 1 of 2 requests \
             unanswered, 2 shards moved"
        );
    }
}
