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
//! Only this client's monotonic clock is read; no two clocks are compared.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How many (revision, instant) points are kept. Forgetting old points only makes a
/// revision look seen later (a later `t`): expiry is judged later, never earlier.
const POINTS: usize = 8192;

#[derive(Debug, Default)]
pub struct RevisionClock {
    points: Mutex<VecDeque<(i64, Instant)>>,
}

impl RevisionClock {
    /// Records that a response with header revision `revision` has arrived (call it after
    /// receipt, before acting on the response).
    pub fn saw(&self, revision: i64) {
        let mut points = self.points.lock().unwrap_or_else(|e| e.into_inner());
        if points.back().is_none_or(|(r, _)| revision > *r) {
            points.push_back((revision, Instant::now()));
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
            .map(|(_, at)| at.elapsed())
            .unwrap_or(Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn age_counts_from_the_first_response_at_or_past_a_revision() {
        let c = RevisionClock::default();
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
}
