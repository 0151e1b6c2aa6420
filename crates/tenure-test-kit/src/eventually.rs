//! Waiting for a condition that holds eventually: one bounded polling loop for every test.

use std::fmt::Debug;
use std::time::{Duration, Instant};

/// How often [`eventually`] asks again.
pub const POLL_EVERY: Duration = Duration::from_millis(100);

/// Asks `check` every [`POLL_EVERY`] until it answers `Ok`, and returns that value. Past
/// `limit` it panics naming `what` and the last `Err` (why it did not hold yet). A test
/// tool: the limit is slack for a loaded machine, never the property under test.
pub fn eventually<T, E: Debug>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> Result<T, E>,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        match check() {
            Ok(value) => return value,
            Err(why) if Instant::now() >= deadline => {
                panic!("timed out after {limit:?} waiting for {what}; last: {why:?}")
            }
            Err(_) => std::thread::sleep(POLL_EVERY),
        }
    }
}

/// [`eventually`] for a check that awaits: asks `check` every [`POLL_EVERY`] (on tokio's
/// clock) until it answers `Ok`, and returns that value; past `limit` it panics naming
/// `what` and the last `Err`.
pub async fn eventually_async<T, E: Debug>(
    what: &str,
    limit: Duration,
    mut check: impl AsyncFnMut() -> Result<T, E>,
) -> T {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(why) if tokio::time::Instant::now() >= deadline => {
                panic!("timed out after {limit:?} waiting for {what}; last: {why:?}")
            }
            Err(_) => tokio::time::sleep(POLL_EVERY).await,
        }
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
