//! The host-wide monotonic clock expiry is measured on.

/// Nanoseconds of the host's `CLOCK_MONOTONIC` (see [`tenure_lease::clock`]).
pub(crate) fn now_ns() -> i64 {
    tenure_lease::clock::monotonic_now_ns()
}

const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The id of the current boot: the monotonic clock restarts when it changes.
pub(crate) fn boot_id() -> std::io::Result<String> {
    std::fs::read_to_string(BOOT_ID).map(|s| s.trim().to_string())
}
