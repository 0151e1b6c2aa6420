//! A node's monitoring state: the peers it watched at the last tick, which reachability
//! rows each heartbeat carries ([`Spread`]), when a heartbeat goes on the session too, when
//! a peer is asked for its whole table, and the indirect probes of late peers. Pure: the
//! caller passes the time.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use crate::identity::NodeAddr;
use crate::sbr::Spread;

/// The agent's monitoring state.
#[derive(Debug)]
pub(crate) struct Monitor {
    /// The peers watched at the last tick.
    pub watched: BTreeSet<NodeAddr>,
    pub spread: Spread,
    /// At most how often this node asks any peer for its whole table
    /// (`reachability-sync-interval`).
    sync_interval: Duration,
    /// How long a peer's digest must have differed from this node's before its table is
    /// asked for: the time a delta travels ([`crate::sbr::REPEAT`] heartbeats), so that
    /// rows still on their way are not fetched twice.
    settle: Duration,
    /// Peers whose table differed from this node's: asked for it in the next heartbeat.
    want_table: BTreeSet<NodeAddr>,
    /// When this node last asked a peer for its table.
    asked_at: Option<Instant>,
    /// Since when each peer's digest has differed from this node's, on every heartbeat.
    differs_since: HashMap<NodeAddr, Instant>,
    /// When a heartbeat datagram last came from each peer.
    datagram_at: HashMap<NodeAddr, Instant>,
    /// Whether each peer's last heartbeat said this node's datagrams reach it.
    they_get_ours: HashMap<NodeAddr, bool>,
    /// When a heartbeat last went to each peer on the session.
    session_copy_at: HashMap<NodeAddr, Instant>,
    /// Per late peer: its probe rounds (current and previous number) and when the current
    /// went out.
    probing: HashMap<NodeAddr, ProbeRound>,
    /// When a probe of each peer last came back answered.
    vouched: HashMap<NodeAddr, Instant>,
    next_probe: u64,
}

#[derive(Debug)]
struct ProbeRound {
    id: u64,
    previous: Option<u64>,
    sent: Instant,
}

impl Monitor {
    /// This node asks one peer for its whole table at most once per `sync_interval`, and
    /// only a peer whose digest differed for `settle`.
    pub(crate) fn new(sync_interval: Duration, settle: Duration) -> Monitor {
        Monitor {
            watched: BTreeSet::new(),
            spread: Spread::default(),
            sync_interval,
            settle,
            want_table: BTreeSet::new(),
            asked_at: None,
            differs_since: HashMap::new(),
            datagram_at: HashMap::new(),
            they_get_ours: HashMap::new(),
            session_copy_at: HashMap::new(),
            probing: HashMap::new(),
            vouched: HashMap::new(),
            next_probe: 0,
        }
    }

    /// A heartbeat from `peer` was applied at `now`; `via_datagram` says how it came, and
    /// `they_get_ours` what it said of this node's datagrams.
    pub(crate) fn heard(
        &mut self,
        peer: &NodeAddr,
        via_datagram: bool,
        they_get_ours: bool,
        now: Instant,
    ) {
        if via_datagram {
            self.datagram_at.insert(peer.clone(), now);
        }
        self.they_get_ours.insert(peer.clone(), they_get_ours);
        self.probing.remove(peer);
        self.vouched.remove(peer);
    }

    /// `peer`'s heartbeat said its table's digest is `theirs`, and this node's (with its
    /// rows merged) is `ours`. When they have differed on every heartbeat from it for
    /// `settle` (the deltas on their way did not make up the difference), ask it for the
    /// whole table, unless this node asked any peer within the sync interval: while a
    /// thousand members join, every digest differs from every other for seconds, and one
    /// table per interval bounds what a node fetches to repair whatever is still missing.
    pub(crate) fn compare(&mut self, peer: &NodeAddr, theirs: u64, ours: u64, now: Instant) {
        if theirs == ours {
            self.differs_since.remove(peer);
            return;
        }
        let since = *self.differs_since.entry(peer.clone()).or_insert(now);
        let settled = now.saturating_duration_since(since) >= self.settle;
        let recently = self
            .asked_at
            .is_some_and(|t| now.saturating_duration_since(t) < self.sync_interval);
        if settled && !recently {
            self.asked_at = Some(now);
            self.differs_since.remove(peer);
            self.want_table.insert(peer.clone());
        }
    }

    /// Whether this tick's heartbeat to `peer` asks for its whole table (once per ask).
    pub(crate) fn take_want_table(&mut self, peer: &NodeAddr) -> bool {
        self.want_table.remove(peer)
    }

    /// Whether `peer`'s heartbeat datagrams arrived within `window` before `now`.
    pub(crate) fn datagrams_arrive(&self, peer: &NodeAddr, now: Instant, window: Duration) -> bool {
        self.datagram_at
            .get(peer)
            .is_some_and(|t| now.saturating_duration_since(*t) < window)
    }

    /// Whether this tick's heartbeat to `peer` goes on the session too: unless datagrams
    /// get through both ways (seen within `window`), and at least once every
    /// `keepalive` (a session that carries nothing while datagrams flow is told from a
    /// stuck one by these).
    pub(crate) fn session_copy_due(
        &mut self,
        peer: &NodeAddr,
        now: Instant,
        window: Duration,
        keepalive: Duration,
    ) -> bool {
        let both_ways = self.datagrams_arrive(peer, now, window)
            && self.they_get_ours.get(peer).copied().unwrap_or(false);
        let quiet = self
            .session_copy_at
            .get(peer)
            .is_none_or(|t| now.saturating_duration_since(*t) >= keepalive);
        let due = !both_ways || quiet;
        if due {
            self.session_copy_at.insert(peer.clone(), now);
        }
        due
    }

    /// How long ago a probe of `peer` last came back answered.
    pub(crate) fn vouched(&self, peer: &NodeAddr, now: Instant) -> Option<Duration> {
        self.vouched
            .get(peer)
            .map(|t| now.saturating_duration_since(*t))
    }

    /// How long ago the current probe round of `peer` went out.
    pub(crate) fn last_probe(&self, peer: &NodeAddr, now: Instant) -> Option<Duration> {
        self.probing
            .get(peer)
            .map(|r| now.saturating_duration_since(r.sent))
    }

    /// Starts a probe round of `peer`: its number.
    pub(super) fn start_probe(&mut self, peer: &NodeAddr, now: Instant) -> u64 {
        self.next_probe += 1;
        let previous = self.probing.get(peer).map(|r| r.id);
        self.probing.insert(
            peer.clone(),
            ProbeRound {
                id: self.next_probe,
                previous,
                sent: now,
            },
        );
        self.next_probe
    }

    /// An answer to probe round `id` of `target` came back at `now`: true (and `target` is
    /// vouched for) when the round is its current or previous one.
    pub(super) fn answered(&mut self, target: &NodeAddr, id: u64, now: Instant) -> bool {
        let ours = self
            .probing
            .get(target)
            .is_some_and(|r| r.id == id || r.previous == Some(id));
        if ours {
            self.vouched.insert(target.clone(), now);
        }
        ours
    }

    /// Forgets a peer that is not a member any more.
    pub(crate) fn forget(&mut self, peer: &NodeAddr) {
        self.datagram_at.remove(peer);
        self.they_get_ours.remove(peer);
        self.session_copy_at.remove(peer);
        self.probing.remove(peer);
        self.vouched.remove(peer);
        self.want_table.remove(peer);
        self.differs_since.remove(peer);
        self.spread.forget(peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> NodeAddr {
        NodeAddr::parse("t", "127.0.0.1:9").unwrap()
    }

    const WINDOW: Duration = Duration::from_millis(1500);
    const KEEPALIVE: Duration = Duration::from_secs(3);

    #[test]
    fn the_session_copy_goes_only_while_datagrams_do_not_get_through_both_ways() {
        let mut m = Monitor::new(Duration::from_secs(5), Duration::from_millis(1500));
        let p = peer();
        let t0 = Instant::now();
        assert!(
            m.session_copy_due(&p, t0, WINDOW, KEEPALIVE),
            "nothing heard yet"
        );
        m.heard(&p, true, false, t0);
        let t1 = t0 + Duration::from_millis(500);
        assert!(
            m.session_copy_due(&p, t1, WINDOW, KEEPALIVE),
            "its datagrams arrive, ours do not reach it"
        );
        m.heard(&p, true, true, t1);
        let t2 = t1 + Duration::from_millis(500);
        assert!(!m.session_copy_due(&p, t2, WINDOW, KEEPALIVE), "both ways");
        let t3 = t1 + KEEPALIVE;
        m.heard(&p, true, true, t3);
        assert!(
            m.session_copy_due(&p, t3, WINDOW, KEEPALIVE),
            "one keep-alive copy per keepalive, which tells a stuck session"
        );
        m.heard(&p, false, true, t3 + Duration::from_millis(500));
        let t4 = t3 + WINDOW + Duration::from_millis(10);
        assert!(
            m.session_copy_due(&p, t4, WINDOW, KEEPALIVE),
            "its datagrams stopped arriving"
        );
    }

    #[test]
    fn a_differing_table_is_asked_for_once_it_differed_for_settle() {
        let (sync, settle) = (Duration::from_secs(5), Duration::from_millis(1500));
        let mut m = Monitor::new(sync, settle);
        let p = peer();
        let t0 = Instant::now();
        m.compare(&p, 1, 1, t0);
        assert!(!m.take_want_table(&p), "same digest");
        m.compare(&p, 1, 2, t0);
        assert!(
            !m.take_want_table(&p),
            "the deltas on their way may make it up"
        );
        m.compare(&p, 1, 1, t0 + settle / 2);
        m.compare(&p, 1, 2, t0 + settle);
        assert!(
            !m.take_want_table(&p),
            "they did once: the difference starts again"
        );
        m.compare(&p, 1, 2, t0 + settle * 2);
        assert!(
            m.take_want_table(&p),
            "differed on every heartbeat for settle"
        );
        assert!(!m.take_want_table(&p), "asked once");
    }

    #[test]
    fn a_node_asks_one_peer_for_its_table_per_sync_interval_whatever_the_number_that_differ() {
        let (sync, settle) = (Duration::from_secs(5), Duration::from_millis(1500));
        let mut m = Monitor::new(sync, settle);
        let peers: Vec<NodeAddr> = (0..20)
            .map(|i| NodeAddr::parse("t", &format!("127.0.0.1:{}", 100 + i)).unwrap())
            .collect();
        let t0 = Instant::now();
        let mut asked = 0;
        let mut t = t0;
        while t <= t0 + sync + settle {
            for p in &peers {
                m.compare(p, 1, 2, t);
                asked += usize::from(m.take_want_table(p));
            }
            t += Duration::from_millis(500);
        }
        assert_eq!(asked, 2, "one at settle, the next a sync interval later");
    }
}
