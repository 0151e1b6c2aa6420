//! The grant a LeaseActor believes, published for checks that take no lock: `check_lease`
//! runs for every local message to a sharded entity, from any thread, while the actor
//! steps its machine. A check is one atomic load of the published deadline and one reading
//! of the holder clock ([`DeadlineFrame`]): the clock ends the belief at its deadline
//! whether or not anything was published since, and a loss published earlier ends it at
//! once.
//!
//! Memory ordering. Every store of the deadline is `Release` and every check loads it with
//! `Acquire`, so whatever the publisher did before publishing (it records the grant's trace
//! before a grant is first published) happens before whatever a check that saw the
//! deadline does next: nothing acts under a grant before the history records it. A loss is
//! published (deadline 0) in the same step that ends the belief, before the loss is
//! announced to anyone; so a thread that learns of the loss by any synchronising means (the
//! `LeaseLost` message, a lost-callback, the state watch, a lock) and checks afterwards
//! loads 0 or a later deadline, never the lost one. Without such a link, "before" has no
//! meaning across threads; a check racing the publication reads the grant as of just
//! before or just after it, and the clock comparison still holds either way.
//!
//! A check of one grant ([`Published::token`]) reads the token and the deadline as a pair:
//! a seqlock. The publisher bumps `version` to odd, stores the new token and deadline and
//! bumps it back to even; a reader reads the version, the pair, then the version again, and
//! takes the pair only if both versions are the same even number. When only the deadline
//! changes (a renewal, a loss), the token stays and the version is not bumped: any deadline
//! then read goes with the token read. A reader that meets a publication in progress sees
//! no grant (the previous one is over by then) rather than waiting for it.

use std::sync::atomic::{AtomicU64, Ordering, fence};

use tokio::time::Instant;

use crate::clock::{DeadlineFrame, HolderClock};
use crate::token::FencingToken;

/// The grant believed now, as checks read it.
#[derive(Debug)]
pub(crate) struct Published {
    frame: DeadlineFrame,
    /// Even when `token` and `until` form a pair; odd while a new token is being stored.
    version: AtomicU64,
    /// The token of the grant `until` belongs to.
    token: AtomicU64,
    /// The grant's belief ends then (a [`DeadlineFrame`] word); 0 when none is believed.
    until: AtomicU64,
}

impl Published {
    /// No grant believed yet, on `clock`.
    pub(crate) fn new(clock: HolderClock) -> Self {
        Published {
            frame: DeadlineFrame::new(clock),
            version: AtomicU64::new(0),
            token: AtomicU64::new(0),
            until: AtomicU64::new(0),
        }
    }

    /// Publishes the grant believed: its token and when its belief ends (an instant of the
    /// holder clock), or `None`. One publisher at a time: callers hold a lock across it.
    pub(crate) fn publish(&self, grant: Option<(FencingToken, Instant)>) {
        let Some((token, ends)) = grant else {
            self.until.store(0, Ordering::Release);
            return;
        };
        let until = self.frame.word(ends);
        if self.token.load(Ordering::Relaxed) == token.get() {
            self.until.store(until, Ordering::Release);
            return;
        }
        let v = self.version.load(Ordering::Relaxed);
        self.version.store(v + 1, Ordering::Relaxed);
        // Orders the odd version before the pair's stores: a reader that loads either of
        // them, then fences, then loads the version, sees it changed.
        fence(Ordering::Release);
        self.token.store(token.get(), Ordering::Relaxed);
        self.until.store(until, Ordering::Release);
        self.version.store(v + 2, Ordering::Release);
    }

    /// Whether a grant is believed now: one load and one clock reading.
    pub(crate) fn held(&self) -> bool {
        self.frame.before(self.until.load(Ordering::Acquire))
    }

    /// The token of the grant believed now. `None` also while a new grant is being
    /// published (the one before it ended before that).
    pub(crate) fn token(&self) -> Option<FencingToken> {
        let before = self.version.load(Ordering::Acquire);
        let token = self.token.load(Ordering::Relaxed);
        let until = self.until.load(Ordering::Relaxed);
        // Pairs with the publisher's Release fence and stores: if either load saw a store
        // of a publication in progress or later, the version below differs from `before`;
        // and the grant's trace happens before what the caller does next.
        fence(Ordering::Acquire);
        let after = self.version.load(Ordering::Relaxed);
        (before.is_multiple_of(2) && before == after && self.frame.before(until))
            .then(|| FencingToken::new(token))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[tokio::test(start_paused = true)]
    async fn a_published_grant_is_held_until_its_end_on_the_holder_clock() {
        let (clock, suspend) = HolderClock::manual();
        let published = Published::new(clock.clone());
        assert!(!published.held());
        assert_eq!(published.token(), None);
        let t = clock.now();
        published.publish(Some((FencingToken::new(3), at(t, 1000))));
        assert!(published.held());
        assert_eq!(published.token(), Some(FencingToken::new(3)));
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(published.held(), "held until its end");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            !published.held(),
            "not at its end, with nothing published since"
        );
        assert_eq!(published.token(), None);
        // A renewal moves the end; a suspend past it ends the belief at once.
        published.publish(Some((FencingToken::new(3), at(t, 5000))));
        assert_eq!(published.token(), Some(FencingToken::new(3)));
        suspend.suspend(Duration::from_secs(4));
        assert!(!published.held(), "the suspend counts");
    }

    #[tokio::test(start_paused = true)]
    async fn a_loss_or_a_new_grant_replaces_what_was_published() {
        let (clock, _suspend) = HolderClock::manual();
        let published = Published::new(clock.clone());
        let t = clock.now();
        published.publish(Some((FencingToken::new(1), at(t, 9000))));
        published.publish(None);
        assert!(!published.held(), "a loss ends it before its end");
        assert_eq!(published.token(), None);
        published.publish(Some((FencingToken::new(2), at(t, 3000))));
        assert_eq!(published.token(), Some(FencingToken::new(2)));
        // A grant whose end has passed is published as none.
        tokio::time::advance(Duration::from_secs(4)).await;
        published.publish(Some((FencingToken::new(3), at(t, 3500))));
        assert_eq!(published.token(), None);
    }

    #[test]
    fn on_the_host_clock_a_check_reads_clock_boottime() {
        // Outside any runtime tokio's clock is the host's: the words are CLOCK_BOOTTIME's.
        let frame = DeadlineFrame::new(HolderClock::host());
        let now = HolderClock::host().now();
        let word = frame.word(now + Duration::from_secs(60));
        assert_eq!(word & 1, 0, "a CLOCK_BOOTTIME word");
        let boot = u64::try_from(crate::clock::boottime_now_ns()).unwrap();
        assert!(word > boot && word <= boot + 60_000_000_000);
        assert!(frame.before(word));
        assert!(!frame.before(boot & !1), "a deadline already passed");
        assert_eq!(frame.word(now - Duration::from_millis(1)), 0);
        assert!(!frame.before(0));
    }

    #[tokio::test(start_paused = true)]
    async fn on_the_host_clock_under_paused_time_a_check_follows_tokio() {
        let clock = HolderClock::host();
        let published = Published::new(clock.clone());
        tokio::time::advance(Duration::from_secs(1)).await;
        let t = clock.now();
        published.publish(Some((FencingToken::new(1), at(t, 10_000))));
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert!(published.held());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!published.held(), "ended on tokio's paused clock");
    }
}

/// The published belief as a lease's handles read it: a step that ends or moves the grant
/// publishes before anyone hears of it, so no check reads the deadline it replaced.
#[cfg(test)]
mod lease_tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tokio::time::sleep;

    use crate::timing_tests::settings;
    use crate::{Acquired, Lease, LeaseMsg, LeaseSpec, LeaseState, LeaseStore, MemoryStore};

    async fn lease(store: &MemoryStore) -> Lease {
        let store: Arc<dyn LeaseStore> = Arc::new(store.clone());
        Lease::start(LeaseSpec::new("published", "a", store, settings()).unwrap())
            .await
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_loss_before_the_deadline_is_seen_by_the_check_its_announcement_reaches() {
        let store = MemoryStore::new();
        let lease = lease(&store).await;
        // What a check reads from inside the loss's announcement: (check, token, state).
        let seen: Arc<Mutex<Vec<(bool, bool, LeaseState)>>> = Arc::default();
        let (l, s) = (lease.clone(), seen.clone());
        let Acquired::Granted { token } = lease
            .acquire_with_lost(move |_| {
                let view = (l.check_lease(), l.token().is_some(), l.state());
                s.lock().unwrap().push(view);
            })
            .await
            .unwrap()
        else {
            panic!("not granted")
        };
        sleep(Duration::from_secs(3)).await;
        assert!(lease.check_lease(), "renewed and held");
        // The grant's deadline is seconds away: only the published loss can end the check.
        lease.actor().cast(LeaseMsg::NotCurrent(token)).unwrap();
        while seen.lock().unwrap().is_empty() {
            sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(
            seen.lock().unwrap().as_slice(),
            &[(false, false, LeaseState::Lost)],
            "a check inside the loss's announcement read the lost grant's deadline"
        );
        assert!(!lease.check_lease());
        assert_eq!(lease.token(), None);
        // A new grant is checked with its own token; the lost one stays refused.
        let Acquired::Granted { token: next } = lease.acquire().await.unwrap() else {
            panic!("not granted again")
        };
        assert!(next > token);
        assert_eq!(
            lease.token(),
            Some(next),
            "the lost grant's token is not believed"
        );
        assert!(lease.check_lease());
    }
}
