//! Redial backoff: exponential between two bounds, each wait jittered by ±25%.

use std::time::Duration;

/// The backoff state of one peer address.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    /// No failures yet: waits start at `min` and double per failure up to `max` (before jitter).
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max,
            failures: 0,
        }
    }

    /// Consecutive failures so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Records a failure and returns how long to wait before the next attempt.
    pub fn failed(&mut self) -> Duration {
        let base = self
            .min
            .saturating_mul(1u32 << self.failures.min(20))
            .min(self.max);
        self.failures = self.failures.saturating_add(1);
        base.mul_f64(0.75 + fastrand::f64() * 0.5)
    }

    /// A success: the next failure waits the minimum again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_bound_with_jitter_and_resets() {
        let (min, max) = (Duration::from_millis(100), Duration::from_secs(2));
        let mut b = Backoff::new(min, max);
        let first = b.failed();
        assert!(
            first >= min.mul_f64(0.75) && first <= min.mul_f64(1.25),
            "{first:?}"
        );
        for _ in 0..30 {
            let d = b.failed();
            assert!(d <= max.mul_f64(1.25), "{d:?}");
        }
        let late = b.failed();
        assert!(late >= max.mul_f64(0.75), "{late:?}");
        b.reset();
        assert!(b.failed() <= min.mul_f64(1.25));
    }
}
