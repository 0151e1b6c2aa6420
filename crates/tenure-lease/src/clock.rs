//! Clocks: the one holder deadlines are measured on ([`HolderClock`]), and the host-wide one
//! that the SQLite store's expiry and recorded histories use ([`boottime_now_ns`]).
//!
//! Why `CLOCK_BOOTTIME`: `CLOCK_MONOTONIC` (tokio's `Instant`) stops while the host is
//! suspended, but a store on another host (PostgreSQL, etcd, ZooKeeper) keeps counting, so
//! a holder that resumes after a suspend would believe in a grant the store has expired.
//! `CLOCK_BOOTTIME` counts the suspend. What no clock of the guest can see is a hypervisor
//! that freezes a VM together with its clocks: that is a pause like SIGSTOP, which only
//! fencing tokens cover.
//!
//! All clocks are read through rustix (the vDSO), so an `LD_PRELOAD` wall-clock faker such
//! as libfaketime changes none of them.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rustix::time::{ClockId, Timespec, clock_gettime};
use tokio::sync::watch;
use tokio::time::Instant;

fn ns(ts: Timespec) -> i64 {
    ts.tv_sec
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec)
}

/// Nanoseconds of `CLOCK_MONOTONIC`: the clock tokio's `Instant` reads on Linux. It does not
/// advance while the host is suspended.
pub fn monotonic_now_ns() -> i64 {
    ns(clock_gettime(ClockId::Monotonic))
}

/// Nanoseconds of `CLOCK_BOOTTIME`: the same for every process of the host, never going
/// back, unaffected by wall-clock changes, and counting the time the host was suspended.
/// Histories (`t`, `valid_until`) and the SQLite store's expiry are on this clock.
pub fn boottime_now_ns() -> i64 {
    ns(clock_gettime(ClockId::Boottime))
}

/// Microseconds of the host's wall clock (`CLOCK_REALTIME`, as the kernel keeps it), for
/// token floors that must exceed anything issued before a loss of state.
pub fn realtime_now_us() -> i64 {
    let ts = clock_gettime(ClockId::Realtime);
    ts.tv_sec
        .saturating_mul(1_000_000)
        .saturating_add(ts.tv_nsec / 1000)
}

/// The highest suspend offset read so far: reads are kept monotonic.
static HOST_SUSPENDED_NS: AtomicU64 = AtomicU64::new(0);

/// How long the host has been suspended since boot (`CLOCK_BOOTTIME - CLOCK_MONOTONIC`).
/// Never decreases. The two reads are a few nanoseconds apart, monotonic first, so their
/// difference only overstates the suspend (which only moves holder deadlines earlier); a
/// pair disturbed by preemption between them is retried before it may raise the offset.
pub fn host_suspended() -> Duration {
    // Read first: the offset grows only after a suspend, and a read-modify-write on every
    // call (every belief check) would bounce the cache line between workers.
    let seen = HOST_SUSPENDED_NS.load(Ordering::Relaxed);
    let mut offset = 0;
    for _ in 0..4 {
        let before = monotonic_now_ns();
        let boot = boottime_now_ns();
        offset = u64::try_from(boot.saturating_sub(before)).unwrap_or(0);
        if offset <= seen {
            // Even overstated, nothing new: no third read to bound the pair's error. Every
            // belief check (every local message to an entity) comes through here.
            return Duration::from_nanos(seen);
        }
        if monotonic_now_ns() - before < 50_000 {
            break;
        }
    }
    Duration::from_nanos(
        HOST_SUSPENDED_NS
            .fetch_max(offset, Ordering::Relaxed)
            .max(offset),
    )
}

/// How often the host clock looks for a suspend that just ended. Holders learn of a suspend
/// at most this long after the host resumed (`check_lease` reads the clock and is right at
/// once).
const SUSPEND_POLL: Duration = Duration::from_millis(100);
/// Suspends shorter than this do not wake sleepers: the timers they sleep on absorb them.
const SUSPEND_NOTICE: Duration = Duration::from_millis(1);

/// A watch of the host's suspend offset, fed by one thread per process (independent of any
/// tokio runtime: it outlives the runtimes of tests).
fn host_suspends() -> watch::Receiver<Duration> {
    static WATCH: OnceLock<watch::Sender<Duration>> = OnceLock::new();
    WATCH
        .get_or_init(|| {
            let (tx, _) = watch::channel(host_suspended());
            let feed = tx.clone();
            let spawned = std::thread::Builder::new()
                .name("tenure-suspend-watch".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(SUSPEND_POLL);
                        let now = host_suspended();
                        feed.send_if_modified(|last| {
                            let moved = now >= *last + SUSPEND_NOTICE;
                            if moved {
                                *last = now;
                            }
                            moved
                        });
                    }
                });
            if let Err(e) = spawned {
                // Sleepers then wake at their monotonic deadline, late by any suspend;
                // check_lease still reads the clock and is right.
                tracing::warn!(error = %e, "cannot start the suspend watch thread");
            }
            tx
        })
        .subscribe()
}

/// The clock holder deadlines are measured on: tokio's `Instant` (`CLOCK_MONOTONIC`) plus
/// the time the host has spent suspended, i.e. `CLOCK_BOOTTIME` in tokio's frame. Under
/// tokio's paused time it advances with tokio's clock; [`HolderClock::manual`] lets tests
/// drive the suspend too. Cloning shares the clock.
#[derive(Clone, Debug)]
pub struct HolderClock(Source);

#[derive(Clone, Debug)]
enum Source {
    Host,
    Manual(watch::Sender<Duration>),
}

impl Default for HolderClock {
    fn default() -> Self {
        HolderClock::host()
    }
}

/// Drives the suspend of a [`HolderClock::manual`] clock.
#[derive(Clone, Debug)]
pub struct SuspendControl(watch::Sender<Duration>);

impl SuspendControl {
    /// The host "was suspended" for `d`: the holder clock jumps `d` ahead while tokio's
    /// clock (and so any store on it, such as the memory store) does not move. Sleepers on
    /// the clock wake at once.
    pub fn suspend(&self, d: Duration) {
        self.0.send_modify(|s| *s += d);
    }
}

impl HolderClock {
    /// The host's clock (`CLOCK_BOOTTIME`).
    pub fn host() -> Self {
        HolderClock(Source::Host)
    }

    /// A clock whose suspends a test makes with the returned control.
    pub fn manual() -> (Self, SuspendControl) {
        let (tx, _) = watch::channel(Duration::ZERO);
        (HolderClock(Source::Manual(tx.clone())), SuspendControl(tx))
    }

    /// Time spent suspended so far.
    pub fn suspended(&self) -> Duration {
        match &self.0 {
            Source::Host => host_suspended(),
            Source::Manual(tx) => *tx.borrow(),
        }
    }

    /// Now, on this clock.
    pub fn now(&self) -> Instant {
        Instant::now() + self.suspended()
    }

    fn suspends(&self) -> watch::Receiver<Duration> {
        match &self.0 {
            Source::Host => host_suspends(),
            Source::Manual(tx) => tx.subscribe(),
        }
    }

    /// Sleeps until `at` (an instant of this clock), waking early only to wake no later
    /// than shortly after a suspend that passed `at`.
    pub async fn sleep_until(&self, at: Instant) {
        let mut suspends = self.suspends();
        loop {
            // Subscribed before reading the clock: a suspend after this read wakes us.
            suspends.borrow_and_update();
            let now = self.now();
            if now >= at {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(at - now) => {}
                changed = suspends.changed() => {
                    if changed.is_err() {
                        // No more suspend news: sleep on the monotonic clock alone.
                        tokio::time::sleep(at - now).await;
                    }
                }
            }
        }
    }

    /// `at` (an instant of this clock) as an instant of tokio's clock, given the suspends
    /// seen so far: for callers that sleep or compare with `Instant::now()`.
    pub fn to_tokio(&self, at: Instant) -> Instant {
        let now = Instant::now();
        let holder_now = now + self.suspended();
        if at >= holder_now {
            now + (at - holder_now)
        } else {
            now.checked_sub(holder_now - at).unwrap_or(now)
        }
    }

    /// `at` (an instant of this clock) in nanoseconds of the host's `CLOCK_BOOTTIME`, the
    /// clock of histories.
    pub fn boottime_ns(&self, at: Instant) -> i64 {
        let now = self.now();
        let ns = boottime_now_ns();
        let ns_of = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        if at >= now {
            ns.saturating_add(ns_of(at - now))
        } else {
            ns.saturating_sub(ns_of(now - at))
        }
    }
}

/// A duration in whole nanoseconds, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Holder-clock deadlines as lock-free checks compare them: each deadline is one `u64` word
/// ([`DeadlineFrame::word`]) that a check compares with one reading of the clock
/// ([`DeadlineFrame::before`]).
///
/// A word is 0 for "no deadline": never before it. Otherwise its lowest bit names its frame
/// (the deadline itself is the word with that bit cleared: rounded down by at most a
/// nanosecond, never later):
/// - bit 0 clear: nanoseconds of `CLOCK_BOOTTIME`, for the host clock while tokio's clock
///   is the host's monotonic clock (always, outside tests that pause or advance time). The
///   check reads `CLOCK_BOOTTIME` once: the clock that counts host suspend, so a host that
///   resumes after a suspend past the deadline reads false at once, before anything has
///   noticed the suspend.
/// - bit 0 set: nanoseconds since the frame's epoch on the holder clock itself, read as
///   [`HolderClock::now`] (tokio's clock plus the suspends): for a manual clock, and for
///   tokio's clock paused or advanced by a test, which `CLOCK_BOOTTIME` does not follow.
///
/// Which frame a word is in is decided when it is made, by whether tokio's clock reads the
/// host's monotonic clock then: a paused clock that happened to read exactly the host's
/// time would get a `CLOCK_BOOTTIME` word, which only a test can meet (its checks would
/// then follow the host's time until the next word).
#[derive(Debug, Clone)]
pub(crate) struct DeadlineFrame {
    clock: HolderClock,
    /// Where nanoseconds of the holder-clock frame count from.
    epoch: Instant,
}

impl DeadlineFrame {
    /// The frame of deadlines on `clock`.
    pub(crate) fn new(clock: HolderClock) -> Self {
        let epoch = clock.now();
        DeadlineFrame { clock, epoch }
    }

    /// The word of deadline `at` (an instant of the holder clock): one that no reading is
    /// before (0, or a deadline already passed) when `at` has passed.
    pub(crate) fn word(&self, at: Instant) -> u64 {
        if matches!(self.clock.0, Source::Host) {
            // CLOCK_BOOTTIME is read before the holder clock: the deadline's distance from the
            // holder clock's reading, counted from the earlier boot reading, comes out early
            // (by the nanoseconds between the reads), never late.
            let host_before = std::time::Instant::now();
            let boot = u64::try_from(boottime_now_ns()).unwrap_or(0);
            let now = Instant::now();
            let host_after = std::time::Instant::now();
            if (host_before..=host_after).contains(&now.into_std()) {
                return match at.checked_duration_since(now + self.clock.suspended()) {
                    Some(left) => boot.saturating_add(nanos(left)) & !1,
                    None => 0,
                };
            }
        }
        match at.checked_duration_since(self.epoch).map(nanos) {
            Some(ns) if ns >= 2 => (ns & !1) | 1,
            _ => 0,
        }
    }

    /// Whether the clock reads before the deadline `word` now. Reads `CLOCK_BOOTTIME` once
    /// for a word in its frame; false for 0.
    pub(crate) fn before(&self, word: u64) -> bool {
        let deadline = word & !1;
        if word & 1 == 0 {
            // A negative reading cannot happen; were it to, it would read as the latest.
            return word != 0 && u64::try_from(boottime_now_ns()).unwrap_or(u64::MAX) < deadline;
        }
        self.clock
            .now()
            .checked_duration_since(self.epoch)
            .is_some_and(|since| nanos(since) < deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_suspend_offset_never_decreases() {
        let a = host_suspended();
        let b = host_suspended();
        assert!(b >= a);
        let (boot, mono) = (boottime_now_ns(), monotonic_now_ns());
        assert!(boot >= mono - 1_000_000, "boot {boot} < mono {mono}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_manual_suspend_moves_the_holder_clock_but_not_tokio() {
        let (clock, control) = HolderClock::manual();
        let t0 = Instant::now();
        let h0 = clock.now();
        control.suspend(Duration::from_secs(30));
        assert_eq!(Instant::now(), t0);
        assert_eq!(clock.now() - h0, Duration::from_secs(30));
        assert_eq!(
            clock.to_tokio(h0 + Duration::from_secs(31)),
            t0 + Duration::from_secs(1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_sleeper_wakes_when_a_suspend_passes_its_instant() {
        let (clock, control) = HolderClock::manual();
        let t0 = Instant::now();
        let at = clock.now() + Duration::from_secs(10);
        let sleeper = tokio::spawn({
            let clock = clock.clone();
            async move { clock.sleep_until(at).await }
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(!sleeper.is_finished());
        control.suspend(Duration::from_secs(60));
        sleeper.await.unwrap();
        assert_eq!(Instant::now(), t0 + Duration::from_secs(2));
    }
}
