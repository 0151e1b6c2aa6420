//! `Grant`: one held grant of a [`Lease`] as a value. Dropping it releases the grant, and
//! [`Grant::lost`] is a future to `select!` on alongside the work done under it (etcd's
//! `Session.Done()`), instead of a callback.

use std::future::Future;

use tokio::sync::watch;

use crate::error::LeaseError;
use crate::events::LeaseLost;
use crate::handle::Lease;
use crate::token::FencingToken;

/// A held grant, with its fencing token. Obtained from [`Lease::hold`] or
/// [`Lease::try_hold`].
///
/// - [`lost`](Grant::lost) resolves once this grant is lost (never after a release), no
///   later than the local deadline minus the stop budget: stop acting when it does.
/// - [`release`](Grant::release) releases it and reports the outcome.
/// - Dropping it releases it too, without waiting for the answer (a failed release lets
///   the grant expire after its ttl). A grant that was already lost or released is left
///   alone: a drop never releases a later grant of the same lease.
#[must_use = "dropping a Grant releases it at once"]
pub struct Grant {
    lease: Lease,
    token: FencingToken,
    lost: watch::Receiver<Option<LeaseLost>>,
    released: bool,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("lease", &self.lease.name())
            .field("token", &self.token)
            .finish()
    }
}

impl Grant {
    pub(crate) fn new(lease: Lease, token: FencingToken) -> Grant {
        let (tx, lost) = watch::channel(None);
        lease.notify_lost(token, move |ev| {
            let _ = tx.send(Some(ev));
        });
        Grant {
            lease,
            token,
            lost,
            released: false,
        }
    }

    /// The fencing token of this grant: present it with every write to a fenced resource.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The lease this grant belongs to.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// `true` while this grant is certainly held (as [`Lease::check_lease`], for this
    /// grant's token only). Never blocks.
    pub fn is_held(&self) -> bool {
        self.lease.check_lease() && self.lease.token() == Some(self.token)
    }

    /// Resolves with the loss once this grant is lost; pending forever after a release.
    /// Cancel-safe: call it again (or on several tasks) as often as needed.
    pub fn lost(&self) -> impl Future<Output = LeaseLost> + Send + 'static {
        let mut rx = self.lost.clone();
        async move {
            let lost = rx
                .wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|ev| ev.clone());
            match lost {
                Some(ev) => ev,
                // The sender lives as long as the grant's lost-callback: gone means released.
                None => std::future::pending().await,
            }
        }
    }

    /// Releases this grant. `Ok(true)`: released; `Ok(false)`: it was no longer held (lost,
    /// or released through the [`Lease`]); `Err`: unknown (it expires after its ttl).
    pub async fn release(mut self) -> Result<bool, LeaseError> {
        self.released = true;
        if self.lease.token() != Some(self.token) {
            return Ok(false);
        }
        self.lease.release().await
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        if !self.released && self.lease.token() == Some(self.token) {
            self.lease.release_in_background();
        }
    }
}

impl Lease {
    /// Waits until granted (as [`acquire_wait`](Lease::acquire_wait)) and returns the
    /// grant as a value that releases on drop. `Err(Cancelled)` if released meanwhile.
    pub async fn hold(&self) -> Result<Grant, LeaseError> {
        let token = self.acquire_wait().await?;
        Ok(Grant::new(self.clone(), token))
    }

    /// One attempt (as [`acquire`](Lease::acquire)): `Ok(Some(grant))` held now,
    /// `Ok(None)` held by another owner, `Err` unknown (maybe granted: it then expires
    /// after its ttl).
    pub async fn try_hold(&self) -> Result<Option<Grant>, LeaseError> {
        match self.acquire().await? {
            crate::Acquired::Granted { token } => Ok(Some(Grant::new(self.clone(), token))),
            crate::Acquired::NotGranted { .. } => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::{Fault, LeaseSpec, LeaseStore, LostReason, MemoryStore};

    use super::*;

    async fn lease(store: &MemoryStore, owner: &str) -> Lease {
        let s = crate::timing_tests::settings();
        let spec = LeaseSpec::new("job", owner, Arc::new(store.clone()), s).unwrap();
        Lease::start(spec).await.unwrap()
    }

    async fn holder(store: &MemoryStore) -> Option<String> {
        store.read("job").await.unwrap().map(|r| r.owner)
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_a_grant_releases_it_though_the_lease_lives_on() {
        let store = MemoryStore::new();
        let lease = lease(&store, "a").await;
        let grant = lease.hold().await.unwrap();
        assert!(grant.is_held());
        assert_eq!(holder(&store).await.as_deref(), Some("a"));
        drop(grant);
        while holder(&store).await.is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!lease.check_lease());
        // The lease (a provider would keep it) can be held again.
        let again = lease.try_hold().await.unwrap().expect("granted again");
        assert!(again.release().await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_grant_held_elsewhere_is_none_and_a_stale_grant_never_releases_a_later_one() {
        let store = MemoryStore::new();
        let a = lease(&store, "a").await;
        let b = lease(&store, "b").await;
        let first = a.hold().await.unwrap();
        assert!(b.try_hold().await.unwrap().is_none());
        // Released through the lease, then held again: dropping the first grant leaves
        // the second alone.
        assert!(a.release().await.unwrap());
        let second = a.hold().await.unwrap();
        assert!(!first.is_held());
        drop(first);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(second.is_held());
        assert_eq!(holder(&store).await.as_deref(), Some("a"));
        assert!(second.release().await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn lost_resolves_when_renewals_fail_and_never_after_a_release() {
        let store = MemoryStore::new();
        let lease = lease(&store, "a").await;
        let grant = lease.hold().await.unwrap();
        let deadline = lease.deadline().unwrap();
        store.set_fault(Fault::FailRenewals);
        let work = tokio::time::sleep(Duration::from_secs(60));
        let lost = tokio::select! {
            lost = grant.lost() => lost,
            _ = work => panic!("the work outlived the grant"),
        };
        assert!(tokio::time::Instant::now() <= deadline);
        assert_eq!(lost.token, grant.token());
        assert_eq!(lost.reason, LostReason::Expired);
        assert!(!grant.is_held());
        store.set_fault(Fault::None);

        let next = lease.hold().await.unwrap();
        assert!(next.token() > grant.token());
        let signal = next.lost();
        assert!(next.release().await.unwrap());
        let after = tokio::time::timeout(Duration::from_secs(60), signal).await;
        assert!(after.is_err(), "a released grant is never reported lost");
    }
}
