//! The revision clock: when this client first saw each etcd revision, on its own
//! monotonic clock.
//!
//! etcd expires sessions in whole seconds, but a Tenure time-to-live may be shorter, and a
//! holder gives its lease up at `instant its last acquire/renew was SENT + ttl - margin`.
//! Every write of the holder (grant, heartbeat) gets a revision `m`, processed after the
//! holder sent it. Any response whose header revision is `>= m` was produced after `m`
//! was processed. So if this client first received such a response at instant `t`, the
//! holder's deadline is before `t + ttl`: once `now >= t + ttl` with the grant and its
//! heartbeat still at revisions `<= m`, the holder has given up and the grant is expired
//! (client-go's rule, with etcd's revision order standing in for "unchanged").
//! Only this client's holder clock is read ([`HolderClock`], which counts host suspend:
//! the holder's deadline and etcd's expiry go on while this host sleeps); no two clocks
//! are compared.
//!
//! **Revisions that go back.** All of this assumes etcd's revisions only grow. A cluster
//! restored from a snapshot without `--bump-revision` starts again from the snapshot's
//! revision: create revisions (fencing tokens) repeat, and revisions this client saw long
//! ago would make fresh grants look expired. Transactions are linearizable, so the header
//! revision of one never goes below that of a transaction whose answer this client had
//! received before sending it; [`RevisionClock::order`] refuses any response that does
//! (keep-alive answers are not linearizable and may lag a little: they are not judged), and
//! forgets the points of the lost history. A client that received nothing while the cluster was restored and its
//! revision grew past this client's highest one cannot tell: restore with
//! `--bump-revision`.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tenure_lease::HolderClock;
use tokio::time::Instant;

/// How many (revision, instant) points are kept. Forgetting old points only makes a
/// revision look seen later (a later `t`): expiry is judged later, never earlier.
const POINTS: usize = 8192;

/// When this client first saw each etcd revision (on its holder clock), and whether
/// transaction revisions went back. Every timing decision of the store reads this clock
/// ([`RevisionClock::now`]).
#[derive(Debug, Default)]
pub struct RevisionClock {
    holder: HolderClock,
    points: Mutex<VecDeque<(i64, Instant)>>,
    /// The highest header revision of a transaction response, and when a response last
    /// went below it.
    linear: Mutex<(i64, Option<(WentBack, Instant)>)>,
}

/// A transaction answered with a header revision below one received before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WentBack {
    /// The highest revision received before.
    pub seen: i64,
    /// The revision of this response.
    pub now: i64,
}

impl std::fmt::Display for WentBack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "etcd's revision went back from {} to {}: the cluster was restored from a snapshot without `--bump-revision` (or another cluster answers at this endpoint), so fencing tokens (create revisions) would repeat and grants it forgot may still be believed; this client refuses until the revision passes {} and one ttl has gone by since it noticed. Restore with `etcdutl snapshot restore --bump-revision <more than the revisions lost> --mark-compacted` instead",
            self.seen, self.now, self.seen
        )
    }
}

impl RevisionClock {
    /// A clock measuring on `holder`.
    pub fn new(holder: HolderClock) -> Self {
        RevisionClock {
            holder,
            ..RevisionClock::default()
        }
    }

    /// Now, on the holder clock (`CLOCK_BOOTTIME` in tokio's frame).
    pub fn now(&self) -> Instant {
        self.holder.now()
    }

    /// The holder clock.
    pub fn holder(&self) -> &HolderClock {
        &self.holder
    }

    fn since(&self, at: Instant) -> Duration {
        self.now().saturating_duration_since(at)
    }

    /// The highest transaction revision received so far: take it before sending a
    /// transaction, and judge the answer against it with [`RevisionClock::order`].
    pub fn highest(&self) -> i64 {
        self.linear.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    /// Judges the header revision `revision` of a transaction response (linearizable) sent
    /// when [`RevisionClock::highest`] was `floor`: `Err` if it is below. Then the points of
    /// the lost history (above `revision`) are forgotten, so that revisions issued anew are
    /// never judged by when their former namesakes were seen. (Concurrent transactions may
    /// answer out of order: only answers received before sending count.)
    pub fn order(&self, floor: i64, revision: i64) -> Result<(), WentBack> {
        let mut linear = self.linear.lock().unwrap_or_else(|e| e.into_inner());
        let (highest, went_back) = &mut *linear;
        if revision < floor {
            let mut points = self.points.lock().unwrap_or_else(|e| e.into_inner());
            while points.back().is_some_and(|(r, _)| *r > revision) {
                points.pop_back();
            }
            let wb = WentBack {
                seen: *highest,
                now: revision,
            };
            *went_back = Some((wb, self.now()));
            return Err(wb);
        }
        *highest = (*highest).max(revision);
        Ok(())
    }

    /// `Err` while a revision went back less than `ttl` ago: grants of the forgotten
    /// history may still be believed by their holders (each stopped renewing when its own
    /// client noticed, or when its answers went back, which was no earlier).
    pub fn quiet(&self, ttl: Duration) -> Result<(), WentBack> {
        let linear = self.linear.lock().unwrap_or_else(|e| e.into_inner());
        match linear.1 {
            Some((wb, at)) if self.since(at) < ttl => Err(wb),
            _ => Ok(()),
        }
    }

    /// `Err` if `token` (a create revision) may have been issued in a forgotten history:
    /// at or below the highest revision seen before revisions went back.
    pub fn fresh(&self, token: i64) -> Result<(), WentBack> {
        let linear = self.linear.lock().unwrap_or_else(|e| e.into_inner());
        match linear.1 {
            Some((wb, _)) if token <= wb.seen => Err(wb),
            _ => Ok(()),
        }
    }

    /// Records that a response with header revision `revision` has arrived (call it after
    /// receipt, before acting on the response).
    pub fn saw(&self, revision: i64) {
        let mut points = self.points.lock().unwrap_or_else(|e| e.into_inner());
        if points.back().is_none_or(|(r, _)| revision > *r) {
            points.push_back((revision, self.now()));
            if points.len() > POINTS {
                points.pop_front();
            }
        }
    }

    /// How long ago this client first saw revision `revision` or a later one (zero when it
    /// has not seen one yet).
    pub fn age(&self, revision: i64) -> Duration {
        let points = self.points.lock().unwrap_or_else(|e| e.into_inner());
        let i = points.partition_point(|(r, _)| *r < revision);
        points
            .get(i)
            .map(|(_, at)| self.since(*at))
            .unwrap_or(Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A suspend of this host counts: the holder's deadline and etcd's expiry went on
    /// meanwhile, so a grant unchanged since before it ages by it (as do the quiet
    /// period after revisions went back).
    #[tokio::test(start_paused = true)]
    async fn a_suspend_counts_in_ages_and_quiet_periods() {
        let (holder, suspend) = HolderClock::manual();
        let c = RevisionClock::new(holder);
        c.order(c.highest(), 10).unwrap();
        c.saw(10);
        tokio::time::advance(Duration::from_secs(1)).await;
        suspend.suspend(Duration::from_secs(5));
        assert_eq!(c.age(10), Duration::from_secs(6));
        assert!(c.order(c.highest(), 5).is_err());
        assert!(c.quiet(Duration::from_secs(3)).is_err());
        suspend.suspend(Duration::from_secs(3));
        c.quiet(Duration::from_secs(3)).unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn age_counts_from_the_first_response_at_or_past_a_revision() {
        // A manual clock: the host's suspend offset, read under load, may creep up.
        let c = RevisionClock::new(HolderClock::manual().0);
        assert_eq!(c.age(5), Duration::ZERO);
        c.saw(10);
        tokio::time::advance(Duration::from_secs(3)).await;
        c.saw(8); // older header (another member): ignored
        c.saw(20);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(c.age(5), Duration::from_secs(4));
        assert_eq!(c.age(10), Duration::from_secs(4));
        assert_eq!(c.age(11), Duration::from_secs(1));
        assert_eq!(c.age(21), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_transaction_revision_below_one_seen_is_refused_and_its_history_forgotten() {
        // A manual clock: the host's suspend offset, read under load, may creep up.
        let c = RevisionClock::new(HolderClock::manual().0);
        c.order(c.highest(), 10).unwrap();
        c.saw(10);
        tokio::time::advance(Duration::from_secs(5)).await;
        let floor = c.highest();
        c.order(floor, 30).unwrap();
        // A transaction sent before the answer at 30 arrived may answer lower.
        c.order(floor, 20).unwrap();
        c.saw(30);
        tokio::time::advance(Duration::from_secs(5)).await;
        let err = c.order(c.highest(), 12).unwrap_err();
        assert_eq!(err, WentBack { seen: 30, now: 12 });
        assert!(err.to_string().contains("--bump-revision"), "{err}");
        // Revision 25 of the restored history was never seen: it is not 5 s old.
        c.saw(25);
        assert_eq!(c.age(25), Duration::ZERO);
        assert_eq!(c.age(10), Duration::from_secs(10));
        // Refused until the revision passes the highest one seen, and for one ttl after
        // it was noticed; tokens of the forgotten history stay refused.
        assert!(c.order(c.highest(), 29).is_err());
        c.order(c.highest(), 31).unwrap();
        assert!(c.quiet(Duration::from_secs(3)).is_err());
        assert!(c.fresh(30).is_err() && c.fresh(31).is_ok());
        tokio::time::advance(Duration::from_secs(3)).await;
        c.quiet(Duration::from_secs(3)).unwrap();
    }
}
