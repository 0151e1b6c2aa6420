//! Tokens and exclusion across a loss of the store's state: a SQLite file deleted or
//! replaced by an older copy, an etcd cluster restored from a snapshot without bumping its
//! revisions, a PostgreSQL fail-over to a replica that lost the last commits. Grants the
//! store forgot may still be believed by their holders, and the store's own order (the
//! token source) may have gone back.
//!
//! The rule every store must keep: a client that saw the state before the loss is never
//! granted a token at or below one granted before, and never while a holder of a forgotten
//! grant may still believe in it. A store either resumes granting (then with higher
//! tokens, after the forgotten holders' beliefs ended) or refuses with
//! [`StoreError::StateLost`] naming the cause.
//!
//! A store crate whose store can lose state invokes
//! [`state_loss_tests!`](crate::state_loss_tests) with a harness implementing [`StateLoss`].

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::{Instant, sleep};

use super::{Harness, acquire_recording_losses, assert_held, lease_on, request, test_settings};
use tenure_lease::{AcquireOutcome, Acquired, StoreError};

/// A store that can be made to lose state.
#[async_trait]
pub trait StateLoss: Harness {
    /// Remembers the store's state now (a copy of the file, a snapshot, a base backup).
    async fn checkpoint(&self);
    /// Makes the store lose everything since [`StateLoss::checkpoint`] while its clients
    /// keep running (clients are not told).
    async fn lose_state(&self);
    /// Whether grants must resume within a few ttls after the loss (with higher tokens);
    /// `false`: the store may refuse ([`StoreError::StateLost`]) for longer (until an
    /// operator repairs it, or its order has caught up), and must have refused at least
    /// once.
    fn resumes(&self) -> bool;
}

/// A holder keeps renewing across the loss while a contender that saw its grant tries to
/// take the lease over: the contender is granted only after the holder stopped believing,
/// with a token above every earlier one, or refused with `StateLost`.
pub async fn tokens_survive_state_loss(h: &dyn StateLoss) {
    let ttl = test_settings().heartbeat_timeout;
    let contender = h.client().await;
    let holder = lease_on(h.client().await, "lossy", "a").await;
    let acquire = async || match holder.acquire().await {
        Ok(Acquired::Granted { token }) => token,
        other => panic!("not granted before the loss: {other:?}"),
    };
    // Both clients are known to the store before the checkpoint (their sessions, if any,
    // survive the loss).
    let t1 = acquire().await;
    let tried = contender
        .try_acquire(&request("lossy", "b", ttl))
        .await
        .expect("acquire");
    assert!(matches!(tried, AcquireOutcome::Held(_)), "{tried:?}");
    assert!(holder.release().await.expect("release"));
    h.checkpoint().await;
    let acquire_release = async || {
        let token = acquire().await;
        assert!(holder.release().await.expect("release"));
        token
    };
    let (t2, t3) = (acquire_release().await, acquire_release().await);
    let (t4, lost) = acquire_recording_losses(&holder).await;
    assert!(t1 < t2 && t2 < t3 && t3 < t4, "{t1} {t2} {t3} {t4}");
    // The contender has seen the grant, as a contender that tried does.
    assert_held(&*contender, "lossy", "b", ttl, "a", t4).await;
    sleep(Duration::from_millis(700)).await;
    assert!(holder.check_lease(), "renewals keep it");

    h.lose_state().await;
    let started = Instant::now();
    let mut granted = None;
    let mut refusals = Vec::new();
    while started.elapsed() < ttl * 4 {
        match contender.try_acquire(&request("lossy", "b", ttl)).await {
            Ok(AcquireOutcome::Granted(r)) => {
                granted = Some((Instant::now(), r.token));
                break;
            }
            Ok(AcquireOutcome::Held(_)) => {}
            Err(e) => refusals.push(e),
        }
        sleep(Duration::from_millis(20)).await;
    }
    if let Some((at, token)) = granted {
        assert!(
            token > t4,
            "granted token {token} after the loss, not above {t4}; {}",
            summary(&refusals)
        );
        let ended = lost.lock().unwrap().first().copied();
        assert!(
            ended.is_some_and(|(when, _)| when <= at),
            "b was granted while a still believed in its forgotten grant (a's loss: {ended:?})"
        );
        assert!(!holder.check_lease());
    }
    let state_lost = refusals
        .iter()
        .any(|e| matches!(e, StoreError::StateLost { .. }));
    if h.resumes() {
        let Some((_, token)) = granted else {
            panic!(
                "no grant within {:?} after the loss; {}",
                ttl * 4,
                summary(&refusals)
            )
        };
        assert!(refusals.is_empty() || state_lost, "{}", summary(&refusals));
        // The holder's own client grants above too.
        assert!(
            contender
                .release("lossy", "b", token)
                .await
                .expect("release")
        );
        let again = holder.acquire().await.expect("acquire");
        assert!(
            matches!(again, Acquired::Granted { token: t } if t > token),
            "{again:?} after b's {token}"
        );
    } else {
        assert!(
            state_lost,
            "refused, naming the cause: {}",
            summary(&refusals)
        );
        sleep(ttl).await;
        assert!(
            !holder.check_lease(),
            "the holder's renewals are refused too"
        );
    }
}

/// How many refusals, and the distinct ones.
fn summary(refusals: &[StoreError]) -> String {
    let mut distinct: Vec<String> = refusals.iter().map(|e| e.to_string()).collect();
    distinct.dedup();
    format!("{} refusals: {distinct:?}", refusals.len())
}

/// Defines the `#[tokio::test]` of this module for `$harness`, an async expression giving
/// a fresh [`StateLoss`] harness.
#[macro_export]
macro_rules! state_loss_tests {
    ($harness:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn tokens_survive_state_loss() {
            let harness = $harness.await;
            $crate::conformance::state_loss::tokens_survive_state_loss(&harness).await;
        }
    };
}
