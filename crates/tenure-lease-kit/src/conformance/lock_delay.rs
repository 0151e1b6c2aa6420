//! Lock-delay (`lock-delay` in a lease section): a grant that lapses, rather than being
//! released, stays unavailable to others for the delay past its holder's time-to-live; a
//! release frees it at once.

use std::time::Duration;

use super::{
    FaultyClient, Harness, acquire_recording_losses, granted_token, lease_with, poll_until_granted,
    request, test_settings,
};
use tenure_lease::{Acquired, LeaseSettings, LostReason};

/// The conformance settings with a 2 s lock-delay (the store ttl, 3.5 s, stays within the
/// session timeout of the session stores' harnesses).
fn delayed() -> LeaseSettings {
    LeaseSettings {
        lock_delay: Duration::from_secs(2),
        ..test_settings()
    }
}

/// A holder cut off from the store signals the loss at its deadline; the store grants the
/// lease to another owner no earlier than the lock-delay after that signal, with a higher
/// token.
pub async fn lock_delay_holds_a_lapsed_grant(h: &dyn Harness) {
    let settings = delayed();
    let cut = FaultyClient::new(h.client().await);
    let holder = lease_with(cut.clone(), "delayed", "a", settings).await;
    let (token, lost) = acquire_recording_losses(&holder).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    cut.set_cut(true);
    let contender = h.client().await;
    let (granted_at, later) =
        poll_until_granted(&*contender, "delayed", "b", settings.heartbeat_timeout).await;
    assert!(later > token, "{later} after {token}");
    let events = lost.lock().unwrap().clone();
    assert_eq!(events.len(), 1, "one loss signal: {events:?}");
    let (lost_at, reason) = events[0];
    assert_eq!(reason, LostReason::Expired);
    assert!(
        lost_at + settings.lock_delay <= granted_at,
        "granted {:?} after the holder's loss signal, within the lock-delay of {:?}",
        granted_at.saturating_duration_since(lost_at),
        settings.lock_delay
    );
    cut.set_cut(false);
}

/// A released grant is free at once, lock-delay or not: the very next attempt of another
/// owner is granted.
pub async fn release_skips_the_lock_delay(h: &dyn Harness) {
    let holder = lease_with(h.client().await, "released", "a", delayed()).await;
    let got = holder.acquire().await.expect("acquire");
    let Acquired::Granted { token } = got else {
        panic!("not granted: {got:?}")
    };
    assert!(holder.release().await.expect("release"), "it was held");
    let contender = h.client().await;
    let ttl = test_settings().heartbeat_timeout;
    let next = granted_token(
        &contender
            .try_acquire(&request("released", "b", ttl))
            .await
            .expect("acquire"),
    );
    assert!(next > token, "{next} after {token}");
}
