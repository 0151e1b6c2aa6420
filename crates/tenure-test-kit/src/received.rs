//! Waiting for what a test's actors report over a channel.

use std::fmt::Debug;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;

/// The next report on `rx`. Panics naming `what` when none came within `limit` (slack for a
/// loaded machine, never the property under test) or when the channel closed.
pub async fn next_within<T>(rx: &mut UnboundedReceiver<T>, limit: Duration, what: &str) -> T {
    match tokio::time::timeout(limit, rx.recv()).await {
        Ok(Some(report)) => report,
        Ok(None) => panic!("the channel of {what} closed"),
        Err(_) => panic!("expected {what} within {limit:?}"),
    }
}

/// Checks that no report comes on `rx` for `quiet` (a negative check over a bounded
/// window); panics naming the report that came. A closed channel passes: nothing more can
/// come.
pub async fn nothing_for<T: Debug>(rx: &mut UnboundedReceiver<T>, quiet: Duration) {
    if let Ok(Some(report)) = tokio::time::timeout(quiet, rx.recv()).await {
        panic!("expected nothing for {quiet:?}, got {report:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_report_in_time_is_returned_and_a_quiet_channel_passes() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tx.send(7).unwrap();
        assert_eq!(
            next_within(&mut rx, Duration::from_secs(1), "a number").await,
            7
        );
        nothing_for(&mut rx, Duration::from_secs(1)).await;
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "expected a number within 1s")]
    async fn no_report_in_time_panics_naming_what_was_awaited() {
        let (_tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u8>();
        next_within(&mut rx, Duration::from_secs(1), "a number").await;
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "got 3")]
    async fn a_report_in_a_quiet_window_panics_naming_it() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tx.send(3).unwrap();
        nothing_for(&mut rx, Duration::from_secs(1)).await;
    }
}
