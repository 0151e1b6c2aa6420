//! The host-wide monotonic clock expiry is measured on.

use rustix::time::{ClockId, clock_gettime};

/// Nanoseconds of `CLOCK_MONOTONIC`: the same for every process of the host, never going
/// back, and the clock tokio's `Instant` reads on Linux.
pub(crate) fn now_ns() -> i64 {
    let ts = clock_gettime(ClockId::Monotonic);
    ts.tv_sec
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec)
}

const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The id of the current boot: the monotonic clock restarts when it changes.
pub(crate) fn boot_id() -> std::io::Result<String> {
    std::fs::read_to_string(BOOT_ID).map(|s| s.trim().to_string())
}
