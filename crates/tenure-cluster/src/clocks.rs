//! The numbers a node puts on what it says, and how far a peer's numbers may be believed.
//!
//! Every heartbeat sequence number, reachability row version and hello a node sends carries
//! a *stamp* of its [`NodeClock`]: milliseconds since the node started, made strictly
//! increasing. A receiver keeps, per peer life, an estimate of that peer's clock
//! ([`PeerClocks`]): the highest stamp heard, aged by the receiver's own clock since.
//! A number more than `slack` ahead of the estimate (its *ceiling*) cannot have been
//! stamped yet. A heartbeat numbered beyond the ceiling is still applied (it is
//! authenticated, and a late estimate, after a delayed hello or this host's suspend, must
//! not make a live peer look silent) but counts as numbered at the ceiling; a row beyond it
//! is refused. So a heartbeat or row with a forged number (replayed ones are older, and
//! refused as not fresh) can move a receiver's floor at most `slack` past the peer's real
//! clock, and the peer's real heartbeats are fresh again once its clock passes it: no
//! single bad number wedges a node for longer than `slack`.
//!
//! Pure: the caller passes the time.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::identity::{Incarnation, NodeAddr};

/// The estimate of a peer's clock widens by this fraction of the time since it was last
/// raised (1%): clocks run at slightly different rates, and a peer that is only heard
/// through relays keeps advancing.
const DRIFT_DIVISOR: u32 = 100;

/// Issues this node's stamps.
#[derive(Debug, Clone)]
pub struct NodeClock {
    epoch: Instant,
    last: u64,
}

impl NodeClock {
    /// A clock that reads 0 at `epoch` (the node's start).
    pub fn new(epoch: Instant) -> NodeClock {
        NodeClock { epoch, last: 0 }
    }

    /// The next stamp at `now`: the milliseconds since the epoch, or one more than the
    /// previous stamp if that is higher (never the same stamp twice, never lower).
    pub fn stamp(&mut self, now: Instant) -> u64 {
        let ms = u64::try_from(now.saturating_duration_since(self.epoch).as_millis())
            .unwrap_or(u64::MAX);
        self.last = ms.max(self.last.saturating_add(1));
        self.last
    }
}

/// What [`PeerClocks::heartbeat`] made of a heartbeat's sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// Newer than every heartbeat applied from that life: apply it, as numbered `believed`
    /// (its number, or the ceiling when it was further ahead: `ahead`).
    Fresh {
        /// The number it counts as.
        believed: u64,
        /// Whether it was numbered beyond the ceiling (forged, or this node's estimate of
        /// the peer's clock is late).
        ahead: bool,
    },
    /// Not newer than one applied (a duplicate, a replay, or reordered): drop it.
    Stale,
    /// No hello from that life yet: drop it and ask for one.
    Unknown,
}

/// Per peer life: the latest heartbeat applied and the estimate of its clock.
#[derive(Debug)]
pub struct PeerClocks {
    slack: Duration,
    peers: HashMap<NodeAddr, PeerClock>,
}

#[derive(Debug)]
struct PeerClock {
    incarnation: Incarnation,
    /// The sequence number of the latest heartbeat applied.
    last: u64,
    /// At `anchored_at` the peer's clock read at least `anchor`.
    anchor: u64,
    anchored_at: Instant,
}

impl PeerClock {
    /// The peer's clock at `now` as far as this node knows (a lower bound, short of the
    /// real one by the delay of the message that raised it).
    fn estimate(&self, now: Instant) -> u64 {
        self.anchor
            .saturating_add(millis(now.saturating_duration_since(self.anchored_at)))
    }

    fn ceiling(&self, now: Instant, slack: Duration) -> u64 {
        let since = now.saturating_duration_since(self.anchored_at);
        self.estimate(now)
            .saturating_add(millis(slack))
            .saturating_add(millis(since / DRIFT_DIVISOR))
    }

    /// The peer's clock read `stamp` at `now` or before: raises the estimate if higher.
    fn observe(&mut self, stamp: u64, now: Instant) {
        if stamp > self.estimate(now) {
            self.anchor = stamp;
            self.anchored_at = now;
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl PeerClocks {
    /// Believes numbers at most `slack` ahead of a peer's estimated clock.
    pub fn new(slack: Duration) -> PeerClocks {
        PeerClocks {
            slack,
            peers: HashMap::new(),
        }
    }

    /// A hello from `node`'s life `incarnation`, stamped `clock`, arrived at `now` (on an
    /// authenticated session): the estimate of its clock is set to `clock`, lower or not
    /// (it is the peer's own word; an estimate raised by a forged number comes down). A new
    /// life starts afresh. Within a life, the floor of fresh heartbeats comes down to
    /// `clock` if it was above: nothing that life sent before the hello is above `clock`.
    pub fn hello(&mut self, node: &NodeAddr, incarnation: Incarnation, clock: u64, now: Instant) {
        match self.peers.get_mut(node) {
            Some(p) if p.incarnation == incarnation => {
                p.last = p.last.min(clock);
                p.anchor = clock;
                p.anchored_at = now;
            }
            _ => {
                self.peers.insert(
                    node.clone(),
                    PeerClock {
                        incarnation,
                        last: 0,
                        anchor: clock,
                        anchored_at: now,
                    },
                );
            }
        }
    }

    /// Whether heartbeat `seq` of `node`'s life `incarnation`, arriving at `now`, is to be
    /// applied; if it is ([`Freshness::Fresh`]), the number it counts as (never beyond the
    /// ceiling) is recorded as the latest and raises the estimate of the peer's clock.
    pub fn heartbeat(
        &mut self,
        node: &NodeAddr,
        incarnation: Incarnation,
        seq: u64,
        now: Instant,
    ) -> Freshness {
        let slack = self.slack;
        let Some(p) = self
            .peers
            .get_mut(node)
            .filter(|p| p.incarnation == incarnation)
        else {
            return Freshness::Unknown;
        };
        if seq <= p.last {
            return Freshness::Stale;
        }
        let ceiling = p.ceiling(now, slack);
        let believed = seq.min(ceiling);
        p.last = p.last.max(believed);
        p.observe(believed, now);
        Freshness::Fresh {
            believed,
            ahead: seq > ceiling,
        }
    }

    /// The highest stamp `node`'s life `incarnation` can have issued by `now`, as far as this
    /// node can tell; `None` when it has had no hello from that life.
    pub fn ceiling(&self, node: &NodeAddr, incarnation: Incarnation, now: Instant) -> Option<u64> {
        self.peers
            .get(node)
            .filter(|p| p.incarnation == incarnation)
            .map(|p| p.ceiling(now, self.slack))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(p: u16) -> NodeAddr {
        NodeAddr::parse("t", &format!("127.0.0.1:{p}")).unwrap()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn fresh(seq: u64) -> Freshness {
        Freshness::Fresh {
            believed: seq,
            ahead: false,
        }
    }

    #[test]
    fn stamps_are_milliseconds_since_the_start_and_strictly_increasing() {
        let t0 = Instant::now();
        let mut c = NodeClock::new(t0);
        assert_eq!(c.stamp(t0 + ms(1500)), 1500);
        assert_eq!(c.stamp(t0 + ms(1500)), 1501, "never the same twice");
        assert_eq!(c.stamp(t0 + ms(10)), 1502, "never lower");
        assert_eq!(c.stamp(t0 + ms(2000)), 2000);
    }

    #[test]
    fn replays_and_older_heartbeats_are_stale_and_a_new_life_starts_over() {
        let t0 = Instant::now();
        let (a, b) = (addr(1), addr(2));
        let mut p = PeerClocks::new(ms(1000));
        assert_eq!(
            p.heartbeat(&a, Incarnation(7), 1, t0),
            Freshness::Unknown,
            "no hello yet"
        );
        p.hello(&a, Incarnation(7), 100, t0);
        p.hello(&b, Incarnation(7), 100, t0);
        assert_eq!(p.heartbeat(&a, Incarnation(7), 150, t0), fresh(150));
        assert_eq!(p.heartbeat(&a, Incarnation(7), 150, t0), Freshness::Stale);
        assert_eq!(p.heartbeat(&a, Incarnation(7), 140, t0), Freshness::Stale);
        assert_eq!(
            p.heartbeat(&b, Incarnation(7), 140, t0),
            fresh(140),
            "per sender"
        );
        assert_eq!(
            p.heartbeat(&a, Incarnation(8), 151, t0),
            Freshness::Unknown,
            "another life needs its hello"
        );
        p.hello(&a, Incarnation(8), 5, t0);
        assert_eq!(
            p.heartbeat(&a, Incarnation(8), 6, t0),
            fresh(6),
            "a new life starts over"
        );
    }

    /// A forged heartbeat with the largest sequence number counts as numbered at the
    /// ceiling: it holds the peer's real heartbeats back for about `slack`, no longer.
    #[test]
    fn a_forged_sequence_does_not_wedge_and_holds_back_for_at_most_slack() {
        let t0 = Instant::now();
        let a = addr(1);
        let inc = Incarnation(3);
        let mut p = PeerClocks::new(ms(1000));
        p.hello(&a, inc, 10_000, t0);
        // The peer's real clock reads 10_000 + elapsed; it heartbeats every 100 ms.
        let real = |t: u64| 10_000 + t;
        for t in (100..=500).step_by(100) {
            assert_eq!(p.heartbeat(&a, inc, real(t), t0 + ms(t)), fresh(real(t)));
        }
        let ceiling = p.ceiling(&a, inc, t0 + ms(550)).unwrap();
        assert!(ceiling <= real(550) + 1000 + 10, "{ceiling}");
        assert_eq!(
            p.heartbeat(&a, inc, u64::MAX - 1, t0 + ms(550)),
            Freshness::Fresh {
                believed: ceiling,
                ahead: true
            }
        );
        // The peer's heartbeats are stale until its clock passes the ceiling, then fresh
        // again: held back for about slack, no longer.
        let mut t = 600;
        while p.heartbeat(&a, inc, real(t), t0 + ms(t)) == Freshness::Stale {
            t += 100;
            assert!(t < 600 + 1200, "still held back at {t} ms");
        }
        assert!(
            t >= 1500,
            "held back until the real clock passed {ceiling}: {t}"
        );
        // A second forgery is bounded by the estimate the first one raised.
        let ceiling = p.ceiling(&a, inc, t0 + ms(t)).unwrap();
        assert!(ceiling <= real(t) + 2 * 1000 + 30, "{ceiling}");
    }

    #[test]
    fn a_late_estimate_catches_up_and_a_hello_sets_it_again() {
        let t0 = Instant::now();
        let a = addr(1);
        let inc = Incarnation(3);
        let mut p = PeerClocks::new(ms(1000));
        p.hello(&a, inc, 0, t0);
        // This node's clock stood still for a minute (a suspend) while the peer's ran: its
        // heartbeats are ahead of the estimate, still applied, and each raises it by up to
        // slack, until they are believed as numbered.
        let mut t = 100;
        loop {
            match p.heartbeat(&a, inc, 60_000 + t, t0 + ms(t)) {
                Freshness::Fresh { ahead: false, .. } => break,
                Freshness::Fresh { ahead: true, .. } => {}
                other => panic!("{other:?} at {t}"),
            }
            t += 100;
            assert!(t < 10_000, "the estimate never caught up");
        }
        // A floor raised by a forgery comes down with the next hello.
        assert!(matches!(
            p.heartbeat(&a, inc, u64::MAX, t0 + ms(t + 50)),
            Freshness::Fresh { ahead: true, .. }
        ));
        p.hello(&a, inc, 60_000 + t + 100, t0 + ms(t + 100));
        assert_eq!(
            p.heartbeat(&a, inc, 60_000 + t + 200, t0 + ms(t + 200)),
            fresh(60_000 + t + 200)
        );
        assert_eq!(
            p.heartbeat(&a, inc, 60_000 + t + 200, t0 + ms(t + 200)),
            Freshness::Stale,
            "still no replay"
        );
    }

    #[test]
    fn the_ceiling_widens_with_silence_and_is_unknown_without_a_hello() {
        let t0 = Instant::now();
        let a = addr(1);
        let mut p = PeerClocks::new(ms(1000));
        assert_eq!(p.ceiling(&a, Incarnation(1), t0), None);
        p.hello(&a, Incarnation(1), 500, t0);
        assert_eq!(p.ceiling(&a, Incarnation(1), t0), Some(1500));
        assert_eq!(p.ceiling(&a, Incarnation(2), t0), None, "another life");
        assert_eq!(
            p.ceiling(&a, Incarnation(1), t0 + ms(100_000)),
            Some(500 + 100_000 + 1000 + 1000)
        );
    }
}
