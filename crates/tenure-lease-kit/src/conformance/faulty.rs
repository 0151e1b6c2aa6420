//! A client wrapper that cuts a client off from its store, delays its answers, or fails
//! its renewals and holds its acquires back.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::sleep;

use super::AnswerDelay;
use crate::wrap::{StoreWrapper, Wrapped};
use tenure_lease::FencingToken;
use tenure_lease::{
    AcquireOutcome, AcquireRequest, HeldLease, LeaseRecord, LeaseStore, Renewal, StoreError,
};

/// Wraps a client, at the store SPI, to cut it off from the store (a partition between one
/// holder and the store: while cut, every call hangs, as over a dead connection) or to
/// delay its answers (every call takes effect at once and answers late: a caller whose
/// operation timeout is shorter never sees the answer). For network stores the
/// [`Proxy`](super::proxy::Proxy) does the same on the wire, which is what their
/// harnesses use for [`Harness::delayed_client`](crate::conformance::Harness::delayed_client).
///
/// It can also fail the renewals alone (the holder's heartbeats are lost while its other
/// calls get through) and hold acquires back before they reach the store, and it records
/// every grant the store answered through it.
///
/// Faults apply to the operations of [`LeaseStore`]; the store's capabilities (its fair
/// queue, preemption requests, watch and remembered ids) are the wrapped client's, reached
/// without faults.
pub type FaultyClient = Wrapped<Faults>;

/// The switches and records of a [`FaultyClient`] and the client it wraps.
pub struct Faults {
    inner: Arc<dyn LeaseStore>,
    cut: AtomicBool,
    delay: Mutex<Option<Duration>>,
    renewals_cut: AtomicBool,
    refused_renewals: AtomicUsize,
    acquires_held: AtomicBool,
    held_acquires: AtomicUsize,
    granted: Mutex<Vec<(String, FencingToken)>>,
}

impl FaultyClient {
    /// Wraps `inner`, neither cut nor delayed.
    pub fn new(inner: Arc<dyn LeaseStore>) -> Arc<Self> {
        Arc::new(Wrapped(Faults {
            inner,
            cut: AtomicBool::new(false),
            delay: Mutex::new(None),
            renewals_cut: AtomicBool::new(false),
            refused_renewals: AtomicUsize::new(0),
            acquires_held: AtomicBool::new(false),
            held_acquires: AtomicUsize::new(0),
            granted: Mutex::new(Vec::new()),
        }))
    }
}

impl Faults {
    /// `true`: from now on every renewal fails at once with an error (unknown outcome),
    /// without reaching the store; `false`: renewals pass again.
    pub fn set_renewals_cut(&self, cut: bool) {
        self.renewals_cut.store(cut, Ordering::SeqCst);
    }

    /// How many renewals failed because renewals were cut.
    pub fn refused_renewals(&self) -> usize {
        self.refused_renewals.load(Ordering::SeqCst)
    }

    /// `true`: from now on acquires wait, before they reach the store, until this is set
    /// back to `false` (their callers' operation timeouts still apply).
    pub fn set_acquires_held(&self, held: bool) {
        self.acquires_held.store(held, Ordering::SeqCst);
    }

    /// How many acquires are waiting now because acquires are held.
    pub fn held_acquires(&self) -> usize {
        self.held_acquires.load(Ordering::SeqCst)
    }

    /// Every grant the store answered through this client, in order: the instance that
    /// asked and the token.
    pub fn granted(&self) -> Vec<(String, FencingToken)> {
        self.granted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `true`: from now on every call hangs until the cut ends; `false`: ends the cut.
    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
    }

    /// From now on, answers come `delay` after the store gave them (`None`: at once).
    pub fn set_delay(&self, delay: Option<Duration>) {
        *self.delay.lock().unwrap_or_else(|e| e.into_inner()) = delay;
    }

    /// Runs `call` once the cut is over, then holds its answer for the delay.
    async fn pass<T>(&self, call: impl Future<Output = T>) -> T {
        while self.cut.load(Ordering::SeqCst) {
            sleep(Duration::from_millis(5)).await;
        }
        let answer = call.await;
        let delay = *self.delay.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = delay {
            sleep(d).await;
        }
        answer
    }
}

/// Counts a waiting call for as long as it lives (also when its caller drops it).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn count(counter: &'a AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Waiting(counter)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl AnswerDelay for Arc<FaultyClient> {
    fn set(&self, delay: Option<Duration>) {
        self.set_delay(delay);
    }
}

#[async_trait]
impl StoreWrapper for Faults {
    fn wrapped(&self) -> &dyn LeaseStore {
        &*self.inner
    }
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome, StoreError> {
        if self.acquires_held.load(Ordering::SeqCst) {
            let _waiting = Waiting::count(&self.held_acquires);
            while self.acquires_held.load(Ordering::SeqCst) {
                sleep(Duration::from_millis(5)).await;
            }
        }
        let answer = self.pass(self.inner.try_acquire(req)).await;
        if let Ok(AcquireOutcome::Granted(r)) = &answer {
            self.granted
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((req.instance.clone(), r.token));
        }
        answer
    }
    async fn renew(
        &self,
        owner: &str,
        leases: &[HeldLease],
        ttl: Duration,
    ) -> Result<Vec<Renewal>, StoreError> {
        if self.renewals_cut.load(Ordering::SeqCst) {
            self.refused_renewals.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::unavailable(
                self.kind(),
                "renewals cut by the test",
            ));
        }
        self.pass(self.inner.renew(owner, leases, ttl)).await
    }
    async fn release(
        &self,
        name: &str,
        owner: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        self.pass(self.inner.release(name, owner, token)).await
    }
    async fn read(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError> {
        self.pass(self.inner.read(name)).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        self.pass(self.inner.list(prefix)).await
    }
}
