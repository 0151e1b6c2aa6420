//! Waiting for a condition that holds eventually: one bounded polling loop for every test.

use std::fmt::Debug;
use std::time::{Duration, Instant};

/// The longest pause of [`eventually`] between two checks.
pub const POLL_EVERY: Duration = Duration::from_millis(100);

/// The pause after the first check; each next one doubles, up to [`POLL_EVERY`]: a
/// condition that holds within milliseconds is seen within milliseconds, and one that takes
/// seconds costs a check every [`POLL_EVERY`].
const FIRST_PAUSE: Duration = Duration::from_millis(1);

/// The pause after a check that answered `pause` before.
fn next_pause(pause: Duration) -> Duration {
    (pause * 2).min(POLL_EVERY)
}

/// Asks `check` until it answers `Ok`, and returns that value: at once, then after a pause
/// that doubles from 1 ms up to [`POLL_EVERY`]. Past `limit` it panics naming `what` and
/// the last `Err` (the last observation: why it did not hold yet). A test tool: the limit
/// is slack for a loaded machine, never the property under test.
pub fn eventually<T, E: Debug>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> Result<T, E>,
) -> T {
    let deadline = Instant::now() + limit;
    let mut pause = FIRST_PAUSE;
    loop {
        match check() {
            Ok(value) => return value,
            Err(why) if Instant::now() >= deadline => {
                panic!("timed out after {limit:?} waiting for {what}; last: {why:?}")
            }
            Err(_) => std::thread::sleep(pause),
        }
        pause = next_pause(pause);
    }
}

/// [`eventually`] for a check that awaits: asks `check` until it answers `Ok` (at once,
/// then after a pause on tokio's clock that doubles from 1 ms up to [`POLL_EVERY`]), and
/// returns that value; past `limit` it panics naming `what` and the last `Err`.
pub async fn eventually_async<T, E: Debug>(
    what: &str,
    limit: Duration,
    mut check: impl AsyncFnMut() -> Result<T, E>,
) -> T {
    let deadline = tokio::time::Instant::now() + limit;
    let mut pause = FIRST_PAUSE;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(why) if tokio::time::Instant::now() >= deadline => {
                panic!("timed out after {limit:?} waiting for {what}; last: {why:?}")
            }
            Err(_) => tokio::time::sleep(pause).await,
        }
        pause = next_pause(pause);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_first_ok() {
        let mut asked = 0;
        let value = eventually("the third answer", Duration::from_secs(10), || {
            asked += 1;
            if asked == 3 { Ok(asked) } else { Err(asked) }
        });
        assert_eq!(value, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn awaits_the_first_ok() {
        let mut asked = 0;
        let value = eventually_async("the third answer", Duration::from_secs(10), async || {
            asked += 1;
            if asked == 3 { Ok(asked) } else { Err(asked) }
        })
        .await;
        assert_eq!(value, 3);
    }

    /// The pauses double from 1 ms and stay at `POLL_EVERY`: 16 checks in the first
    /// second (at 0, 1, 3, 7, 15, 31, 63, 127, 227, ... 927 ms), then ten a second.
    #[tokio::test(start_paused = true)]
    async fn asks_soon_then_every_poll_period() {
        let started = tokio::time::Instant::now();
        let mut at = Vec::new();
        eventually_async("the 16th answer", Duration::from_secs(10), async || {
            at.push(started.elapsed().as_millis());
            if at.len() == 16 { Ok(()) } else { Err(()) }
        })
        .await;
        assert_eq!(
            at,
            [
                0, 1, 3, 7, 15, 31, 63, 127, 227, 327, 427, 527, 627, 727, 827, 927
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "waiting for nothing; last: \"never\"")]
    async fn fails_loudly_past_the_limit_too() {
        eventually_async::<(), _>("nothing", Duration::from_secs(1), async || Err("never")).await;
    }

    #[test]
    #[should_panic(expected = "waiting for nothing; last: \"never\"")]
    fn fails_loudly_past_the_limit() {
        eventually::<(), _>("nothing", Duration::ZERO, || Err("never"));
    }
}
