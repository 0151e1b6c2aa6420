//! The holder's belief in its lease: the deadline arithmetic of the LeaseActor's machine
//! (`crate::machine`), pure and tested directly without actors, sockets or sleeps.
//!
//! The timing argument: a grant or renewal request *sent* at `s` is processed by the store
//! at some `p >= s`, and the store keeps the grant until at least `p + ttl`. The holder
//! believes in it only until `s + ttl - margin < p + ttl`, on its holder clock, which never
//! goes back and counts host suspend ([`crate::clock::HolderClock`]: a store on another
//! host keeps counting through the holder's suspend, so must the holder). So the holder
//! stops believing strictly before anyone else can be granted the lease, whatever the
//! delays, as long as clock rates differ by less than the margin over one ttl. The instants
//! here are the holder clock's.
//!
//! A holder that must *stop* something before the deadline (entities, a singleton instance,
//! a guarded command) has a **stop budget**: the belief ends, and the loss is announced,
//! that long before the local deadline, so that what it guards has terminated by the
//! deadline. The local deadline itself (recorded as `valid_until`) does not move.

use crate::token::FencingToken;
use tokio::time::{Duration, Instant};

/// Why a holder stopped believing in its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The local deadline passed without a confirmed renewal (store slow, down or unreachable).
    Expired,
    /// The store answered that the lease is no longer held by this owner with this token.
    NotHeld,
    /// A higher-priority owner's forceful preemption request is pending: the store refused
    /// the renewal, and the grant ends at its current expiry.
    Preempted,
}

impl LostReason {
    /// A short machine-readable name (`expired`, `not_held`), used in histories.
    pub fn kind(&self) -> &'static str {
        match self {
            LostReason::Expired => "expired",
            LostReason::NotHeld => "not_held",
            LostReason::Preempted => "preempted",
        }
    }
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "local deadline passed without a confirmed renewal",
            LostReason::NotHeld => "the store no longer holds the lease for this owner",
            LostReason::Preempted => {
                "preempted: a higher-priority owner's forceful request refused the renewal"
            }
        })
    }
}

/// One believed grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Counts grants of this belief: a lost or released grant is never revived, a new
    /// acquire starts a new generation.
    pub generation: u64,
    /// The grant's fencing token.
    pub token: FencingToken,
    /// The local deadline: `send instant + ttl - safety margin`. Whatever the holder runs
    /// under the grant must have ended by then.
    pub deadline: Instant,
    /// When the belief ends and the loss is announced: the deadline minus the stop budget.
    pub believed_until: Instant,
}

/// What [`Belief::grant`] made of an acquire answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantEffect {
    /// A new grant: announce it.
    New(Held),
    /// The grant already believed (reentrant acquire); the deadline may have moved later.
    Same(Held),
    /// The answer came back after its own deadline: it cannot be relied upon.
    TooLate,
}

/// The state of a holder's belief.
#[derive(Debug, Clone)]
pub struct Belief {
    validity: Duration,
    stop_budget: Duration,
    generations: u64,
    held: Option<Held>,
}

impl Belief {
    /// `validity` is `ttl - safety margin`; the belief in a grant ends `stop_budget` before
    /// its local deadline (at the latest when it begins, if the budget exceeds the validity).
    pub fn new(validity: Duration, stop_budget: Duration) -> Self {
        Belief {
            validity,
            stop_budget: stop_budget.min(validity),
            generations: 0,
            held: None,
        }
    }

    fn held_until(&self, deadline: Instant) -> Instant {
        deadline - self.stop_budget
    }

    /// The store granted `token` to a request sent at `sent_at`; `now` is when the answer
    /// arrived. Call [`Belief::expire_due`] first, so that a lapsed grant is announced as lost.
    pub fn grant(&mut self, token: FencingToken, sent_at: Instant, now: Instant) -> GrantEffect {
        let deadline = sent_at + self.validity;
        let believed_until = self.held_until(deadline);
        if let Some(h) = &mut self.held
            && h.token == token
            && now < h.believed_until
        {
            h.deadline = h.deadline.max(deadline);
            h.believed_until = h.believed_until.max(believed_until);
            return GrantEffect::Same(*h);
        }
        if believed_until <= now {
            return GrantEffect::TooLate;
        }
        self.generations += 1;
        let h = Held {
            generation: self.generations,
            token,
            deadline,
            believed_until,
        };
        self.held = Some(h);
        GrantEffect::New(h)
    }

    /// The store renewed generation `generation` in answer to a request sent at `sent_at`.
    /// Returns whether the belief was extended: not if it already lapsed (at `now`; the
    /// lapse is left for [`Belief::expire_due`] to report) or is another generation.
    pub fn renewed(&mut self, generation: u64, sent_at: Instant, now: Instant) -> bool {
        let deadline = sent_at + self.validity;
        let believed_until = self.held_until(deadline);
        match &mut self.held {
            Some(h) if h.generation == generation && now < h.believed_until => {
                h.deadline = h.deadline.max(deadline);
                h.believed_until = h.believed_until.max(believed_until);
                true
            }
            _ => false,
        }
    }

    /// Ends the belief if it is due to end (deadline minus stop budget); returns the grant
    /// that lapsed.
    pub fn expire_due(&mut self, now: Instant) -> Option<Held> {
        match self.held {
            Some(h) if now >= h.believed_until => self.held.take(),
            _ => None,
        }
    }

    /// The store said generation `generation` is not held: ends it, returning it.
    pub fn not_held(&mut self, generation: u64) -> Option<Held> {
        match self.held {
            Some(h) if h.generation == generation => self.held.take(),
            _ => None,
        }
    }

    /// Gives the belief up voluntarily (release, stop); returns what was held.
    pub fn give_up(&mut self) -> Option<Held> {
        self.held.take()
    }

    /// The grant believed at `now`, if any: not once the stop budget before its deadline
    /// has begun.
    pub fn current(&self, now: Instant) -> Option<Held> {
        self.held.filter(|h| now < h.believed_until)
    }

    /// The grant believed, ignoring whether its belief has ended yet.
    pub fn held(&self) -> Option<Held> {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn deadline_counts_from_send_instant() {
        let t = Instant::now();
        let mut b = Belief::new(Duration::from_millis(900), Duration::ZERO);
        let GrantEffect::New(h) = b.grant(FencingToken::new(7), at(t, 0), at(t, 300)) else {
            panic!("expected a new grant")
        };
        assert_eq!(h.deadline, at(t, 900));
        assert!(b.current(at(t, 899)).is_some());
        assert!(b.current(at(t, 900)).is_none());
    }

    #[test]
    fn renewals_extend_only_the_current_generation() {
        let t = Instant::now();
        let mut b = Belief::new(Duration::from_millis(900), Duration::ZERO);
        let GrantEffect::New(h) = b.grant(FencingToken::new(1), t, t) else {
            panic!()
        };
        assert!(b.renewed(h.generation, at(t, 400), at(t, 450)));
        assert_eq!(b.current(t).unwrap().deadline, at(t, 1300));
        // A late answer to an older request never moves the deadline back.
        assert!(b.renewed(h.generation, at(t, 100), at(t, 500)));
        assert_eq!(b.current(t).unwrap().deadline, at(t, 1300));
        assert!(!b.renewed(h.generation + 1, at(t, 600), at(t, 600)));
    }

    #[test]
    fn a_lapsed_grant_is_never_revived() {
        let t = Instant::now();
        let mut b = Belief::new(Duration::from_millis(900), Duration::ZERO);
        let GrantEffect::New(h) = b.grant(FencingToken::new(1), t, t) else {
            panic!()
        };
        // The renewal was sent in time but its answer arrives after the deadline.
        assert!(!b.renewed(h.generation, at(t, 800), at(t, 950)));
        assert!(b.current(at(t, 950)).is_none());
        assert_eq!(b.expire_due(at(t, 950)), Some(h));
        assert_eq!(b.expire_due(at(t, 950)), None);
    }

    #[test]
    fn reentrant_grant_keeps_generation() {
        let t = Instant::now();
        let mut b = Belief::new(Duration::from_millis(900), Duration::ZERO);
        let GrantEffect::New(h) = b.grant(FencingToken::new(5), t, t) else {
            panic!()
        };
        let GrantEffect::Same(h2) = b.grant(FencingToken::new(5), at(t, 100), at(t, 100)) else {
            panic!()
        };
        assert_eq!(h.generation, h2.generation);
        assert_eq!(h2.deadline, at(t, 1000));
        assert_eq!(
            b.grant(FencingToken::new(5), at(t, 0), at(t, 2000)),
            GrantEffect::TooLate
        );
    }

    #[test]
    fn not_held_ends_only_its_generation() {
        let t = Instant::now();
        let mut b = Belief::new(Duration::from_millis(900), Duration::ZERO);
        let GrantEffect::New(h) = b.grant(FencingToken::new(1), t, t) else {
            panic!()
        };
        assert_eq!(b.not_held(h.generation + 1), None);
        assert_eq!(b.not_held(h.generation), Some(h));
        assert_eq!(b.not_held(h.generation), None);
    }

    #[test]
    fn the_stop_budget_ends_the_belief_early_but_keeps_the_deadline() {
        let t = Instant::now();
        let mut b = Belief::new(Duration::from_millis(900), Duration::from_millis(300));
        let GrantEffect::New(h) = b.grant(FencingToken::new(1), t, at(t, 10)) else {
            panic!()
        };
        assert_eq!((h.deadline, h.believed_until), (at(t, 900), at(t, 600)));
        assert!(b.current(at(t, 599)).is_some());
        assert!(
            b.current(at(t, 600)).is_none(),
            "the budget is for stopping"
        );
        assert_eq!(b.expire_due(at(t, 599)), None);
        // A renewal extends both; one answered within the budget is too late.
        assert!(b.renewed(h.generation, at(t, 500), at(t, 550)));
        assert_eq!(b.held().unwrap().deadline, at(t, 1400));
        assert_eq!(b.held().unwrap().believed_until, at(t, 1100));
        assert!(!b.renewed(h.generation, at(t, 1000), at(t, 1150)));
        assert_eq!(
            b.expire_due(at(t, 1150)).map(|h| h.deadline),
            Some(at(t, 1400))
        );
        // A grant answered within its own budget cannot be used.
        assert_eq!(
            b.grant(FencingToken::new(2), at(t, 2000), at(t, 2600)),
            GrantEffect::TooLate
        );
        // A budget beyond the validity: never believed at all.
        let mut b = Belief::new(Duration::from_millis(900), Duration::from_secs(5));
        assert_eq!(b.grant(FencingToken::new(3), t, t), GrantEffect::TooLate);
    }
}
