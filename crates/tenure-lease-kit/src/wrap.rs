//! One store wrapping another, for test doubles and benches that count, refuse or delay
//! some calls: a [`StoreWrapper`] names the wrapped store and overrides only the calls it
//! changes; [`Wrapped`] makes it a [`LeaseStore`] that forwards every other call to the
//! wrapped store. A wrapper may change the calls of the core and of two capabilities,
//! grant changes and remembered ids; the fair queue, preemption requests and holder watch
//! are the wrapped store's, reached unchanged.

use std::ops::Deref;
use std::time::Duration;

use async_trait::async_trait;
use tenure_lease::names::NameRules;
use tenure_lease::{
    AcquireOutcome, AcquireRequest, Capabilities, ChangeVersion, Changes, FairQueue, FencingToken,
    GrantChanges, HeldLease, HolderWatch, LeaseRecord, LeaseStore, PreemptionRequests,
    RememberChange, RememberedIds, Renewal, StoreError,
};

/// A store in front of another: every method answers as the [`LeaseStore`] method of the
/// same name (same contract), and by default is the wrapped store's answer. Wrap it in
/// [`Wrapped`] to use it as a store.
#[async_trait]
pub trait StoreWrapper: Send + Sync + 'static {
    /// The store the calls go to.
    fn wrapped(&self) -> &dyn LeaseStore;

    /// [`LeaseStore::kind`].
    fn kind(&self) -> &'static str {
        self.wrapped().kind()
    }
    /// [`LeaseStore::capabilities`].
    fn capabilities(&self) -> Capabilities {
        self.wrapped().capabilities()
    }
    /// [`LeaseStore::name_rules`].
    fn name_rules(&self) -> NameRules {
        self.wrapped().name_rules()
    }
    /// [`LeaseStore::try_acquire`].
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome, StoreError> {
        self.wrapped().try_acquire(req).await
    }
    /// [`LeaseStore::renew`].
    async fn renew(
        &self,
        owner: &str,
        leases: &[HeldLease],
        ttl: Duration,
    ) -> Result<Vec<Renewal>, StoreError> {
        self.wrapped().renew(owner, leases, ttl).await
    }
    /// [`LeaseStore::release`].
    async fn release(
        &self,
        name: &str,
        owner: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        self.wrapped().release(name, owner, token).await
    }
    /// [`LeaseStore::read`].
    async fn read(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError> {
        self.wrapped().read(name).await
    }
    /// [`LeaseStore::list`].
    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        self.wrapped().list(prefix).await
    }
    /// [`LeaseStore::as_fair_queue`].
    fn as_fair_queue(&self) -> Option<&dyn FairQueue> {
        self.wrapped().as_fair_queue()
    }
    /// [`LeaseStore::as_preemption_requests`].
    fn as_preemption_requests(&self) -> Option<&dyn PreemptionRequests> {
        self.wrapped().as_preemption_requests()
    }
    /// [`LeaseStore::as_holder_watch`].
    fn as_holder_watch(&self) -> Option<&dyn HolderWatch> {
        self.wrapped().as_holder_watch()
    }
    /// Whether the store keeps remembered ids ([`LeaseStore::as_remembered_ids`] answers
    /// `Some`): by default, whether the wrapped store does.
    fn has_remembered_ids(&self) -> bool {
        self.wrapped().as_remembered_ids().is_some()
    }
    /// [`RememberedIds::remember`], asked only when
    /// [`has_remembered_ids`](Self::has_remembered_ids) is true.
    async fn remember(
        &self,
        name: &str,
        owner: &str,
        token: FencingToken,
        change: &RememberChange,
    ) -> Result<bool, StoreError> {
        self.wrapped_remembered_ids()?
            .remember(name, owner, token, change)
            .await
    }
    /// [`RememberedIds::remembered`], asked only when
    /// [`has_remembered_ids`](Self::has_remembered_ids) is true.
    async fn remembered(&self, name: &str) -> Result<Vec<String>, StoreError> {
        self.wrapped_remembered_ids()?.remembered(name).await
    }
    /// Whether the store answers change checks ([`LeaseStore::as_grant_changes`] answers
    /// `Some`): by default, whether the wrapped store does.
    fn has_grant_changes(&self) -> bool {
        self.wrapped().as_grant_changes().is_some()
    }
    /// [`GrantChanges::changes_since`], asked only when
    /// [`has_grant_changes`](Self::has_grant_changes) is true.
    async fn changes_since(
        &self,
        prefix: &str,
        since: Option<ChangeVersion>,
    ) -> Result<Changes, StoreError> {
        match self.wrapped().as_grant_changes() {
            Some(changes) => changes.changes_since(prefix, since).await,
            None => Err(StoreError::backend(
                self.kind(),
                "the wrapped store answers no change checks",
            )),
        }
    }
    /// The wrapped store's remembered ids; an error naming the store when it keeps none.
    fn wrapped_remembered_ids(&self) -> Result<&dyn RememberedIds, StoreError> {
        self.wrapped().as_remembered_ids().ok_or_else(|| {
            StoreError::backend(self.kind(), "the wrapped store keeps no remembered ids")
        })
    }
}

/// A [`StoreWrapper`] as a [`LeaseStore`]; derefs to the wrapper (its own methods: counts,
/// switches).
pub struct Wrapped<W>(pub W);

impl<W> Deref for Wrapped<W> {
    type Target = W;

    fn deref(&self) -> &W {
        &self.0
    }
}

#[async_trait]
impl<W: StoreWrapper> LeaseStore for Wrapped<W> {
    fn kind(&self) -> &'static str {
        self.0.kind()
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    fn name_rules(&self) -> NameRules {
        self.0.name_rules()
    }
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome, StoreError> {
        self.0.try_acquire(req).await
    }
    async fn renew(
        &self,
        owner: &str,
        leases: &[HeldLease],
        ttl: Duration,
    ) -> Result<Vec<Renewal>, StoreError> {
        self.0.renew(owner, leases, ttl).await
    }
    async fn release(
        &self,
        name: &str,
        owner: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        self.0.release(name, owner, token).await
    }
    async fn read(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError> {
        self.0.read(name).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        self.0.list(prefix).await
    }
    fn as_fair_queue(&self) -> Option<&dyn FairQueue> {
        self.0.as_fair_queue()
    }
    fn as_preemption_requests(&self) -> Option<&dyn PreemptionRequests> {
        self.0.as_preemption_requests()
    }
    fn as_holder_watch(&self) -> Option<&dyn HolderWatch> {
        self.0.as_holder_watch()
    }
    fn as_remembered_ids(&self) -> Option<&dyn RememberedIds> {
        self.0.has_remembered_ids().then_some(self)
    }
    fn as_grant_changes(&self) -> Option<&dyn GrantChanges> {
        self.0.has_grant_changes().then_some(self)
    }
}

#[async_trait]
impl<W: StoreWrapper> RememberedIds for Wrapped<W> {
    async fn remember(
        &self,
        name: &str,
        owner: &str,
        token: FencingToken,
        change: &RememberChange,
    ) -> Result<bool, StoreError> {
        self.0.remember(name, owner, token, change).await
    }
    async fn remembered(&self, name: &str) -> Result<Vec<String>, StoreError> {
        self.0.remembered(name).await
    }
}

#[async_trait]
impl<W: StoreWrapper> GrantChanges for Wrapped<W> {
    async fn changes_since(
        &self,
        prefix: &str,
        since: Option<ChangeVersion>,
    ) -> Result<Changes, StoreError> {
        self.0.changes_since(prefix, since).await
    }
}
