//! Which peers have been heard from recently: a pure tracker of last-heard instants.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::identity::NodeAddr;

/// Tracks, per peer, when anything was last received from it.
#[derive(Debug, Default)]
pub struct Reachability {
    last_heard: HashMap<NodeAddr, Instant>,
}

impl Reachability {
    /// Starts watching `peer` as if heard at `now` (a new member gets a full timeout).
    pub fn watch(&mut self, peer: &NodeAddr, now: Instant) {
        self.last_heard.entry(peer.clone()).or_insert(now);
    }

    /// Stops watching `peer`.
    pub fn forget(&mut self, peer: &NodeAddr) {
        self.last_heard.remove(peer);
    }

    /// Something arrived from `peer` at `now`.
    pub fn heard(&mut self, peer: &NodeAddr, now: Instant) {
        if let Some(t) = self.last_heard.get_mut(peer) {
            *t = (*t).max(now);
        }
    }

    /// Whether `peer` was heard within `timeout` before `now` (unknown peers: false).
    pub fn is_reachable(&self, peer: &NodeAddr, now: Instant, timeout: Duration) -> bool {
        self.last_heard
            .get(peer)
            .is_some_and(|t| now.saturating_duration_since(*t) < timeout)
    }

    /// Time since `peer` was last heard.
    pub fn silence(&self, peer: &NodeAddr, now: Instant) -> Option<Duration> {
        self.last_heard
            .get(peer)
            .map(|t| now.saturating_duration_since(*t))
    }

    /// Every watched peer with whether it is reachable at `now`.
    pub fn states(&self, now: Instant, timeout: Duration) -> Vec<(NodeAddr, bool)> {
        self.last_heard
            .keys()
            .map(|p| (p.clone(), self.is_reachable(p, now, timeout)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn silence_past_the_timeout_is_unreachable() {
        let p = NodeAddr::parse("t", "127.0.0.1:2").unwrap();
        let t = Duration::from_secs(3);
        let mut r = Reachability::default();
        let t0 = Instant::now();
        assert!(
            !r.is_reachable(&p, t0, t),
            "unknown peers are not reachable"
        );
        r.watch(&p, t0);
        assert!(r.is_reachable(&p, t0 + Duration::from_millis(2999), t));
        assert!(!r.is_reachable(&p, t0 + t, t));
        r.heard(&p, t0 + Duration::from_secs(4));
        assert!(r.is_reachable(&p, t0 + Duration::from_secs(5), t));
        r.heard(&p, t0 + Duration::from_secs(1));
        assert_eq!(
            r.silence(&p, t0 + Duration::from_secs(5)),
            Some(Duration::from_secs(1)),
            "older news does not rewind"
        );
        r.forget(&p);
        assert!(r.states(t0, t).is_empty());
    }
}
