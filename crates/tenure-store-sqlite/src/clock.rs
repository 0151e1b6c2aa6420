//! The clocks of the store: expiry on the host's `CLOCK_BOOTTIME`, token floors from its
//! wall clock.
//!
//! **Why `CLOCK_BOOTTIME`, not `CLOCK_MONOTONIC`.** A holder believes in a grant until
//! `s + ttl - margin` on its holder clock, which counts host suspend (`CLOCK_BOOTTIME`, see
//! [`tenure_lease::clock`]); the store must keep the grant until at least `p + ttl` (`p >= s`
//! the processing instant) on a clock that never runs faster than the holder's.
//! `CLOCK_MONOTONIC` would meet that bound too (it stops during a suspend, so its expiry
//! only comes later), but then every grant would outlive its ttl by the length of each
//! suspend, in holder time: after a suspend of an hour, the holders (and a restarted
//! instance of the same owner) would have given their grants up while the store kept them
//! blocked for another hour, and histories (on `CLOCK_BOOTTIME`) would show grants ending
//! in the store long after every holder's deadline. With `CLOCK_BOOTTIME` the store, the
//! holders of every process of the host and the histories share one clock, and the timing
//! argument is the one of `tenure_lease::validity`, without a second clock.
//!
//! Files written by versions that measured `expires_at` on `CLOCK_MONOTONIC` are converted
//! once, when opened (see `schema`).

/// Nanoseconds of the host's `CLOCK_BOOTTIME`, shared by every process of the host.
pub(crate) fn now_ns() -> i64 {
    tenure_lease::clock::boottime_now_ns()
}

/// The least token a grant made now may carry: the host's wall clock in microseconds. Tokens
/// of one file also increase by at least one per grant, so a token exceeds every token any
/// earlier file at this path issued (a deleted file, or a replacement restored from an old
/// copy), as long as the wall clock was not set back in between and no earlier file issued
/// more than a million grants of one lease per second.
pub(crate) fn token_floor() -> i64 {
    tenure_lease::clock::realtime_now_us()
}

const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The id of the current boot: `CLOCK_BOOTTIME` restarts when it changes.
pub(crate) fn boot_id() -> std::io::Result<String> {
    std::fs::read_to_string(BOOT_ID).map(|s| s.trim().to_string())
}
