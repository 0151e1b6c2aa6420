//! A loss while an acquire is out: the holder's reentrant acquire, sent while its grant was
//! believed, reaches the store only after the holder announced the loss. Whatever the store
//! answers (the lost grant extended, or a new grant once the lost one lapsed in the store),
//! the holder never gets the lost token back: the next grant it is told of carries a higher
//! one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::{FaultyClient, Harness, acquire_recording_losses, lease_with, test_settings};
use tenure_lease::{Acquired, FencingToken, LeaseSettings};

/// Renewals a second apart: a reentrant acquire sent once a renewal failed is sent well
/// after the last renewal that succeeded, so that its answer, held back until the loss, is
/// still within its own validity (a holder that believed it would act on the lost token).
/// The operation timeout outlasts the hold, also until the store lets the grant lapse.
fn settings() -> LeaseSettings {
    LeaseSettings {
        heartbeat_timeout: Duration::from_secs(3),
        heartbeat_interval: Duration::from_secs(1),
        safety_margin: Duration::from_millis(300),
        lease_operation_timeout: Duration::from_secs(10),
        ..test_settings()
    }
}

/// A bound against hangs, never a timing assertion.
const LIMIT: Duration = Duration::from_secs(30);

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < LIMIT, "waited {LIMIT:?} for {what}");
        sleep(Duration::from_millis(5)).await;
    }
}

/// The holder's renewals fail; a reentrant acquire sent while the grant is still believed
/// is held back until the holder announced the loss (and, in the second round, until the
/// store let the grant lapse), then reaches the store. The acquire is answered with a
/// grant whose token is above the lost one, and its lost-callback does not fire at once
/// (it would for the lost grant). When the grant lapsed in the store, the store itself
/// answered the same instance's acquire with a new grant, with a higher token.
pub async fn acquire_out_at_a_loss_gets_a_higher_token(h: &dyn Harness) {
    for lapsed_in_store in [false, true] {
        let name = if lapsed_in_store {
            "out-at-a-lapse"
        } else {
            "out-at-a-loss"
        };
        let client = FaultyClient::new(h.client().await);
        let lease = lease_with(client.clone(), name, "a", settings()).await;
        let (lost_token, losses) = acquire_recording_losses(&lease).await;
        client.set_renewals_cut(true);
        wait_for("a renewal to fail", || client.refused_renewals() > 0).await;
        client.set_acquires_held(true);
        let fired: Arc<Mutex<Vec<FencingToken>>> = Arc::default();
        let reentry = tokio::spawn({
            let (lease, fired) = (lease.clone(), fired.clone());
            async move {
                lease
                    .acquire_with_lost(move |lost| fired.lock().unwrap().push(lost.token))
                    .await
            }
        });
        wait_for("the reentrant acquire to reach the client", || {
            client.held_acquires() == 1
        })
        .await;
        assert!(
            lease.check_lease(),
            "the grant lapsed before the reentrant acquire was sent (a machine too loaded for this case)"
        );
        wait_for("the holder to announce the loss", || {
            !losses.lock().unwrap().is_empty()
        })
        .await;
        if lapsed_in_store {
            let observer = h.client().await;
            let started = Instant::now();
            while observer.read(name).await.expect("read").is_some() {
                assert!(
                    started.elapsed() < LIMIT,
                    "the store never let the unrenewed grant lapse"
                );
                sleep(Duration::from_millis(20)).await;
            }
        }
        client.set_acquires_held(false);
        let answer = reentry.await.expect("the acquiring task");
        let Ok(Acquired::Granted { token }) = answer else {
            panic!("the holder's acquire after its loss was not granted: {answer:?}")
        };
        assert!(
            token > lost_token,
            "granted {token} after the loss of {lost_token}"
        );
        assert_eq!(
            *fired.lock().unwrap(),
            [],
            "the new grant's lost-callback fired at once: the lost grant came back"
        );
        assert_eq!(losses.lock().unwrap().len(), 1, "one loss, of {lost_token}");
        if lapsed_in_store {
            let granted = client.granted();
            let first = &granted[0];
            let again = granted
                .get(1)
                .expect("the held acquire was granted by the store");
            assert!(
                again.0 == first.0 && again.1 > first.1,
                "the store answered the lapsed instance's acquire with {again:?} after {first:?}"
            );
        }
        client.set_renewals_cut(false);
        assert!(lease.check_lease(), "the new grant is held");
        assert!(lease.release().await.expect("release"));
    }
}
