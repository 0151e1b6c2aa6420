//! The host-wide monotonic clock: store expiry (SQLite) and recorded histories use it.

use rustix::time::{ClockId, clock_gettime};

/// Nanoseconds of `CLOCK_MONOTONIC`: the same for every process of the host, never going
/// back, and the clock tokio's `Instant` reads on Linux.
pub fn monotonic_now_ns() -> i64 {
    let ts = clock_gettime(ClockId::Monotonic);
    ts.tv_sec
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec)
}
