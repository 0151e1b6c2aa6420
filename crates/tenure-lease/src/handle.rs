//! `Lease`: the handle for plain async code, a thin typed front of one LeaseActor.

use std::sync::Arc;

use ractor::{ActorRef, RpcReplyPort};
use tokio::time::Instant;
use tracing::Instrument;

use crate::actor::{
    Acquired, LeaseActor, LeaseMsg, LeaseSpec, LeaseView, ReleaseCaller, lease_span,
};
use crate::driver::MachineInput;
use crate::error::LeaseError;
use crate::events::{LeaseEventSink, LeaseLost};
use crate::machine::{Input, ReleaseScope};
use crate::settings::LeaseSettings;
use crate::token::FencingToken;

struct Inner {
    name: String,
    owner: String,
    settings: LeaseSettings,
    actor: ActorRef<LeaseMsg>,
    view: LeaseView,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // post_stop releases a held grant.
        self.actor.stop(Some("lease handle dropped".into()));
    }
}

/// A lease for plain async code. Cloning shares it; dropping the last clone stops its
/// LeaseActor, which releases a held grant. A [`LeaseProvider`](crate::LeaseProvider) keeps
/// a clone of every lease it loaded (until its `shutdown`): to release on drop, hold the
/// grant as a [`Grant`](crate::Grant) ([`hold`](Lease::hold), [`try_hold`](Lease::try_hold)).
///
/// The contract (Akka Coordination's, tightened):
/// - [`acquire`](Lease::acquire): `Ok(Granted { token })` held now, `Ok(NotGranted)` held by
///   another owner, `Err` unknown (maybe granted: the grant then expires after its ttl).
/// - Re-acquiring a held lease succeeds with the same token.
/// - While held, the LeaseActor renews it every `heartbeat-interval`; if renewals do not
///   succeed, the lease is lost no later than its local deadline minus the spec's stop
///   budget ([`LeaseSpec::with_stop_budget`], zero by default).
/// - [`check_lease`](Lease::check_lease) never blocks; it is `true` only while held.
#[derive(Clone)]
pub struct Lease {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.inner.name)
            .field("owner", &self.inner.owner)
            .field("held", &self.check_lease())
            .finish()
    }
}

impl Lease {
    /// Starts the LeaseActor for `spec`. Nothing is acquired yet.
    pub async fn start(spec: LeaseSpec) -> Result<Lease, LeaseError> {
        Lease::start_with_events(spec, LeaseEventSink::ignore()).await
    }

    /// Like [`start`](Lease::start), also delivering every event of the lease (grants,
    /// losses, preemption requests and withdrawals) to `events`, in order.
    pub async fn start_with_events(
        spec: LeaseSpec,
        events: LeaseEventSink,
    ) -> Result<Lease, LeaseError> {
        let name = spec.name.clone();
        let owner = spec.owner.clone();
        let settings = spec.settings;
        let (actor, view) = LeaseActor::start(spec, events, None)
            .await
            .map_err(|_| LeaseError::ActorStopped { name: name.clone() })?;
        Ok(Lease {
            inner: Arc::new(Inner {
                name,
                owner,
                settings,
                actor,
                view,
            }),
        })
    }

    /// The lease name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The owner this handle acquires for.
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// The timing settings of this lease.
    pub fn settings(&self) -> &LeaseSettings {
        &self.inner.settings
    }

    /// The LeaseActor behind this handle.
    pub fn actor(&self) -> &ActorRef<LeaseMsg> {
        &self.inner.actor
    }

    /// Feeds the command `build` makes to the lease's driver on the calling task (no hop
    /// to the actor, see `crate::driver`) and awaits its answer. The actor gone: the
    /// command is refused and the answer is `ActorStopped`.
    async fn command<T>(
        &self,
        build: impl FnOnce(RpcReplyPort<Result<T, LeaseError>>) -> MachineInput,
    ) -> Result<T, LeaseError> {
        let (tx, rx) = ractor::concurrency::oneshot();
        let driver = &self.inner.view.driver;
        driver
            .feed(build(tx.into()))
            .instrument(lease_span(driver.spec()))
            .await;
        rx.await.unwrap_or_else(|_| {
            Err(LeaseError::ActorStopped {
                name: self.inner.name.clone(),
            })
        })
    }

    /// One acquire attempt. `Ok(Granted { token })`: held now; `Ok(NotGranted)`: another
    /// owner holds it with at least our priority; `Err`: unknown (treat as maybe held by us
    /// until its ttl passes). With a priority above the holder's (see
    /// [`AcquireOptions`](crate::AcquireOptions)) it asks the holder to give the lease up and
    /// waits: `Ok(Granted)` once released (or, forceful, expired), `Err(CleanupTimedOut)` or
    /// `Err(Overtaken)` (certain: not granted).
    pub async fn acquire(&self) -> Result<Acquired, LeaseError> {
        self.command(|reply| Input::TryAcquire { reply })
            .await
            .map(|(a, _)| a)
    }

    /// Like [`acquire`](Lease::acquire); when granted, `on_lost` is called at most once, when
    /// this grant is lost (not after a release), never before this call returned, and no
    /// later than the local deadline minus the stop budget. It runs inline and must not
    /// block.
    pub async fn acquire_with_lost(
        &self,
        on_lost: impl FnOnce(LeaseLost) + Send + 'static,
    ) -> Result<Acquired, LeaseError> {
        let acquired = self.acquire().await?;
        if let Acquired::Granted { token } = acquired {
            self.inner.view.on_lost(token, Box::new(on_lost));
        }
        Ok(acquired)
    }

    /// Waits until granted, retrying every `lease-retry-interval`. Returns the token.
    /// `Err(Cancelled)` if released meanwhile.
    pub async fn acquire_wait(&self) -> Result<FencingToken, LeaseError> {
        match self
            .command(|reply| Input::Acquire { reply: Some(reply) })
            .await?
        {
            (Acquired::Granted { token }, _) => Ok(token),
            (Acquired::NotGranted { .. }, _) => unreachable!("Acquire answers only grants"),
        }
    }

    /// [`acquire_wait`](Lease::acquire_wait) with a lost-notification as in
    /// [`acquire_with_lost`](Lease::acquire_with_lost).
    #[deprecated(
        since = "0.1.0",
        note = "use `hold()`: its `Grant` tells of a loss with `lost()` and releases when dropped"
    )]
    pub async fn acquire_wait_with_lost(
        &self,
        on_lost: impl FnOnce(LeaseLost) + Send + 'static,
    ) -> Result<FencingToken, LeaseError> {
        let token = self.acquire_wait().await?;
        self.inner.view.on_lost(token, Box::new(on_lost));
        Ok(token)
    }

    /// Calls `cb` once the grant with `token` is lost (at once if it was already); never
    /// after its release.
    pub(crate) fn notify_lost(
        &self,
        token: FencingToken,
        cb: impl FnOnce(LeaseLost) + Send + 'static,
    ) {
        self.inner.view.on_lost(token, Box::new(cb));
    }

    /// Releases whatever grant the actor holds without waiting for the answer (for drops,
    /// which cannot await). Lost-callbacks of that grant are dropped, as by `release`.
    pub(crate) fn release_in_background(&self) {
        self.forget_lost_callbacks();
        let (tx, _answer) = ractor::concurrency::oneshot();
        self.inner.view.driver.enqueue(Input::Release {
            reply: ReleaseCaller::Port(tx.into()),
            scope: ReleaseScope::Any,
        });
    }

    fn forget_lost_callbacks(&self) {
        self.inner.view.forget_lost();
    }

    /// Releases the lease. `Ok(true)`: released; `Ok(false)`: this handle held nothing;
    /// `Err`: unknown after three tries (the grant expires after its ttl at the latest). The lost-callback is
    /// not called for a released grant.
    pub async fn release(&self) -> Result<bool, LeaseError> {
        self.forget_lost_callbacks();
        self.command(|reply| Input::Release {
            reply: ReleaseCaller::Port(reply),
            scope: ReleaseScope::Any,
        })
        .await
    }

    /// Keeps `note` with this lease's later acquires: the next [`acquire`](Lease::acquire)
    /// writes it into the grant (same token while held). `Err` only if the actor stopped.
    pub fn set_note(&self, note: Option<String>) -> Result<(), LeaseError> {
        if self.inner.view.driver.set_note(note) {
            Ok(())
        } else {
            Err(LeaseError::ActorStopped {
                name: self.inner.name.clone(),
            })
        }
    }

    /// `true` only while this owner certainly holds the lease: granted, no loss announced,
    /// and the local deadline minus the stop budget not passed. Never blocks, never talks
    /// to the store or the actor.
    pub fn check_lease(&self) -> bool {
        self.inner.view.check_lease()
    }

    /// Where the lease stands: not held, held, suspended (renewals failing, deadline not
    /// passed) or lost. Never blocks. See [`LeaseState`](crate::LeaseState).
    pub fn state(&self) -> crate::LeaseState {
        self.inner.view.state()
    }

    /// A watch channel of [`state`](Lease::state): its current value and each change, to
    /// `select!` on or to report health from.
    pub fn watch_state(&self) -> tokio::sync::watch::Receiver<crate::LeaseState> {
        self.inner.view.watch_state()
    }

    /// The fencing token of the current grant, while held.
    pub fn token(&self) -> Option<FencingToken> {
        self.inner.view.token()
    }

    /// The local deadline of the current grant, while held: whatever runs under the grant
    /// must have ended by then.
    pub fn deadline(&self) -> Option<Instant> {
        self.inner.view.deadline()
    }
}
