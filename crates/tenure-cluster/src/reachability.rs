//! Which peers have been heard from recently: a pure tracker of last-heard instants, and
//! the verdict on a watched peer from its silence and the indirect probes answered for it.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::identity::NodeAddr;

/// Tracks, per peer, when anything was last received from it.
#[derive(Debug, Default)]
pub struct Reachability {
    last_heard: BTreeMap<NodeAddr, Instant>,
}

impl Reachability {
    /// Starts watching `peer` as if heard at `now` (a new member gets a full timeout).
    pub fn watch(&mut self, peer: &NodeAddr, now: Instant) {
        self.last_heard.entry(peer.clone()).or_insert(now);
    }

    /// `peer` starts being watched at `now` (it joined this node's ring of monitors): it
    /// gets a full timeout from `now`, since nothing obliged it to heartbeat here before.
    pub fn rewatch(&mut self, peer: &NodeAddr, now: Instant) {
        if let Some(t) = self.last_heard.get_mut(peer) {
            *t = (*t).max(now);
        }
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

    /// Every peer tracked, in address order.
    pub fn peers(&self) -> impl Iterator<Item = &NodeAddr> {
        self.last_heard.keys()
    }

    /// Every watched peer with whether it is reachable at `now`.
    pub fn states(&self, now: Instant, timeout: Duration) -> Vec<(NodeAddr, bool)> {
        self.last_heard
            .keys()
            .map(|p| (p.clone(), self.is_reachable(p, now, timeout)))
            .collect()
    }
}

/// Whether a watched peer silent for `silence` is reachable, with `timeout` the
/// `unreachable-after` and `vouched` how long ago an indirect probe of it last came back
/// answered (`None`: none did). True while it was heard within `timeout`; past that, true
/// only while a probe answered within `timeout / 2` shows it alive, and for at most another
/// `timeout / 2` (a direct link that stays dead is reported, later). A dead peer answers
/// no probe, so it is reported after `timeout` as without probes.
pub fn judge(silence: Duration, vouched: Option<Duration>, timeout: Duration) -> bool {
    silence < timeout || (vouched.is_some_and(|v| v < timeout / 2) && silence < timeout * 3 / 2)
}

/// Whether a watched peer silent for `silence` is due for indirect probes, the last round
/// of which went out `last` ago (`None`: none in this silence): once it is late by
/// `timeout / 2`, and again every `timeout / 2` while it stays silent.
pub fn probe_due(silence: Duration, last: Option<Duration>, timeout: Duration) -> bool {
    silence >= timeout / 2 && last.is_none_or(|l| l >= timeout / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answered_probe_buys_half_a_timeout_and_no_more() {
        let t = Duration::from_secs(3);
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        assert!(judge(ms(2999), None, t));
        assert!(!judge(s(3), None, t), "dead: reported after the timeout");
        assert!(
            judge(s(4), Some(ms(100)), t),
            "alive, through another member"
        );
        assert!(!judge(s(4), Some(ms(1500)), t), "the answer is too old");
        assert!(
            !judge(ms(4500), Some(ms(1)), t),
            "a dead link is reported after 1.5 x"
        );
        assert!(!probe_due(ms(1499), None, t));
        assert!(probe_due(ms(1500), None, t));
        assert!(!probe_due(s(2), Some(ms(400)), t));
        assert!(probe_due(s(3), Some(ms(1500)), t));
    }

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
