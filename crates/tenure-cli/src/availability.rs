//! Availability of the example load, read from a history (docs/history.md): every request
//! of `tenure demo node --load-keys` ends as an `ack` or a `no_ack`, both stamped with the
//! instant it was `issued`. From them: which requests of which key and node got no
//! answer, latencies over a span of time, and acknowledgements per second.

use crate::check::{Entry, Event};

/// One request of the load.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The node whose region it went through (`host:port`).
    pub node: String,
    /// The key (entity id).
    pub entity: String,
    /// The key's shard.
    pub shard: String,
    /// When it was issued (ns, the history's clock; for the open loop, when it was due).
    pub issued: i64,
    /// When it ended: acknowledged or not (ns).
    pub ended: i64,
    /// `None`: acknowledged; otherwise why not (timeout, error, refused).
    pub failure: Option<String>,
}

impl Request {
    /// Whether it was acknowledged.
    pub fn acked(&self) -> bool {
        self.failure.is_none()
    }

    /// From issue to answer, in ms.
    pub fn latency_ms(&self) -> f64 {
        (self.ended - self.issued) as f64 / 1e6
    }
}

/// The requests of `events` (`ack` and `no_ack` lines that carry `issued`), in the order of
/// their end.
pub fn requests(events: &[Entry]) -> Vec<Request> {
    let mut out: Vec<Request> = events
        .iter()
        .filter_map(|e| {
            let (entity, shard, issued, failure) = match &e.event {
                Event::Ack {
                    entity,
                    shard,
                    issued: Some(issued),
                    ..
                } => (entity, shard, *issued, None),
                Event::NoAck {
                    entity,
                    shard,
                    issued,
                    why,
                } => (entity, shard, *issued, Some(why.clone())),
                _ => return None,
            };
            Some(Request {
                node: e.node.clone(),
                entity: entity.clone(),
                shard: shard.clone(),
                issued,
                ended: e.t,
                failure,
            })
        })
        .collect();
    out.sort_by_key(|r| r.ended);
    out
}

/// The requests issued in `[from, to)`.
pub fn issued_in(requests: &[Request], from: i64, to: i64) -> Vec<&Request> {
    requests
        .iter()
        .filter(|r| r.issued >= from && r.issued < to)
        .collect()
}

/// Acknowledgements per whole second from `from` up to `to`, by the instant of the answer.
pub fn acks_per_second(requests: &[Request], from: i64, to: i64) -> Vec<usize> {
    let seconds = ((to - from).max(0) as u64).div_ceil(1_000_000_000) as usize;
    let mut counts = vec![0; seconds];
    for r in requests.iter().filter(|r| r.acked()) {
        if r.ended >= from && r.ended < to {
            counts[((r.ended - from) / 1_000_000_000) as usize] += 1;
        }
    }
    counts
}

/// The `q` quantile (0..=1) of the latencies of `requests` that were acknowledged, in ms
/// (`None` without any).
pub fn latency_quantile(requests: &[&Request], q: f64) -> Option<f64> {
    let mut ms: Vec<f64> = requests
        .iter()
        .filter(|r| r.acked())
        .map(|r| r.latency_ms())
        .collect();
    if ms.is_empty() {
        return None;
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    Some(ms[((ms.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(t: i64, kind: &str, key: &str, issued: i64) -> Entry {
        Entry::from_json(
            json!({"t": t, "node": "a:1", "inc": "1", "event": kind, "entity": key,
                   "shard": "3", "issued": issued, "why": "timeout", "value": 1, "token": 1,
                   "from": "a:1"}),
            0,
        )
        .unwrap()
    }

    #[test]
    fn requests_latencies_and_acks_per_second() {
        let s = 1_000_000_000;
        let events = vec![
            event(s + 2_000_000, "ack", "k", s),
            event(s + 4_000_000, "ack", "k", s),
            event(3 * s, "no_ack", "j", s + s / 2),
            // Lines without `issued` (an older history) are not requests of this kind.
            Entry::from_json(
                json!({"t": 5, "node": "a:1", "inc": "1", "event": "ack", "entity": "k",
                       "shard": "3", "value": 1, "token": 1, "from": "a:1"}),
                0,
            )
            .unwrap(),
        ];
        let all = requests(&events);
        assert_eq!(all.len(), 3);
        assert_eq!(all[2].failure.as_deref(), Some("timeout"));
        assert_eq!(acks_per_second(&all, 0, 3 * s + 1), vec![0, 2, 0, 0]);
        let early = issued_in(&all, 0, s + 1);
        assert_eq!(latency_quantile(&early, 0.0), Some(2.0));
        assert_eq!(latency_quantile(&early, 1.0), Some(4.0));
        assert_eq!(latency_quantile(&issued_in(&all, s + 1, 4 * s), 0.5), None);
    }
}
