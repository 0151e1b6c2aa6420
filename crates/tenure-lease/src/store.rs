//! The store SPI: small compare-and-set operations on lease records.
//!
//! A store holds, per lease name, at most one record `{owner, token, expiry}`, and per
//! lease name a fencing counter that only grows. Stores hold no timing policy: they apply
//! the time-to-live they are given and report what they did. Heartbeats, retries, the
//! holder's deadline and loss detection live once, above this trait, in the
//! [`LeaseActor`](crate::LeaseActor).
//!
//! Every method's `Err` means the outcome is unknown: the operation may or may not have
//! taken effect. A store never answers "not granted" or "not held" unless it is sure. A
//! grant left by an unknown outcome (an acquire whose answer was lost, a release that
//! failed) lapses after its ttl like any grant its holder stopped renewing, on every
//! store, whatever else its owner keeps renewing on the same connection or session.
//!
//! The SPI's records and outcomes are exhaustive on purpose (no `#[non_exhaustive]`):
//! store crates build them and match on them, and a new case is a breaking change that
//! every store must handle, not one a wildcard arm would quietly absorb.

use std::collections::BTreeSet;
use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::{LeaseError, StoreError};
use crate::names::NameRules;
use crate::token::FencingToken;

/// A lease record as the store holds it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The (store-safe) lease name.
    pub name: String,
    /// The holder.
    pub owner: String,
    /// The holder instance (one LeaseActor, one live holder) the grant belongs to.
    pub instance: String,
    /// The fencing token of the holder's grant: strictly greater than every earlier grant's
    /// token for this name, across holders, expiries, releases and store restarts.
    pub token: FencingToken,
    /// Time left before the store expires the record, measured by the store when it answered.
    pub expires_in: Duration,
    /// Number of writes (grant and renewals) to this grant, starting at 1.
    pub version: u64,
    /// Free text the holder attached when acquiring (who and why), if any.
    pub note: Option<String>,
    /// The holder's priority (0 unless it asked for more; see [`AcquireRequest::priority`]).
    pub priority: u64,
    /// How long the holder said it needs to clean up when preempted.
    pub cleanup_timeout: Duration,
    /// The pending preemption request on this grant, if any (stores with [`PreemptionRequests`]).
    pub request: Option<PreemptionRequest>,
}

/// The priority reserved for operators' emergency use: only a request with this priority
/// may set [`AcquireRequest::emergency`].
pub const EMERGENCY_PRIORITY: u64 = u64::MAX;

/// What an acquire asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AcquireRequest {
    /// The lease name.
    pub name: String,
    /// The owner asking (a node's `host:port`, or any stable identity).
    pub owner: String,
    /// Which holder instance of `owner` asks (one LeaseActor: one process, one handle).
    /// Reentrancy is per instance: the same owner and instance get the same token back.
    /// Another instance of the same owner (a second process with the same `--owner`, a
    /// node restarted on the same `host:port` while its predecessor is frozen or cut off,
    /// a second handle in one process) is another holder while the grant is unexpired: it
    /// waits for a release or the expiry, exactly like another owner.
    pub instance: String,
    /// The time-to-live to give the grant, counted from when the store processes the request.
    pub ttl: Duration,
    /// Free text to keep with the grant (who and why), shown by `tenure lease show`.
    pub note: Option<String>,
    /// The priority of the grant (0 by default; higher wins; [`EMERGENCY_PRIORITY`] is the
    /// operators' emergency level). Kept with the grant: a later request preempts it only
    /// with a strictly higher priority.
    pub priority: u64,
    /// How long this requester needs to clean up if it is preempted later; kept with the
    /// grant and shown to preempting requesters (they wait at most this long).
    pub cleanup_timeout: Duration,
    /// Only with `priority == EMERGENCY_PRIORITY`: take a lower-priority grant over at once
    /// with a new token. The old holder's renewals then fail (token mismatch) and it gives
    /// the lease up at its local deadline; until then only fencing tokens protect guarded
    /// resources. Ignored at any other priority.
    pub emergency: bool,
}

/// What [`LeaseStore::try_acquire`] does, given the current unexpired grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireStep {
    /// A new grant with a new token (free or expired, or an emergency take-over).
    NewGrant,
    /// Reentrant: same token, fresh expiry.
    Extend,
    /// Answer `Held` with the current record.
    Held,
}

impl AcquireRequest {
    /// A request of `owner`'s holder `instance` for `name`, granted for `ttl`: at the
    /// default priority, with no note, no cleanup timeout and no emergency (set those
    /// fields after, or with struct update syntax).
    pub fn new(
        name: impl Into<String>,
        owner: impl Into<String>,
        instance: impl Into<String>,
        ttl: Duration,
    ) -> Self {
        AcquireRequest {
            name: name.into(),
            owner: owner.into(),
            instance: instance.into(),
            ttl,
            ..AcquireRequest::default()
        }
    }

    /// Whether this request takes over, at once, an unexpired grant of another owner that
    /// has priority `holder_priority` (the emergency rule). Every store decides it here.
    pub fn takes_over(&self, holder_priority: u64) -> bool {
        self.emergency && self.priority == EMERGENCY_PRIORITY && holder_priority < self.priority
    }

    /// The rules of [`LeaseStore::try_acquire`] in one place: what to do with `current`,
    /// the unexpired grant of the name (`None`: free or expired). Stores that read before
    /// they write (in a transaction or a compare-and-set loop) decide with this.
    pub fn step(&self, current: Option<&LeaseRecord>) -> AcquireStep {
        let Some(c) = current else {
            return AcquireStep::NewGrant;
        };
        if c.owner != self.owner || c.instance != self.instance {
            // Another holder: another owner, or another instance of this owner, which may
            // still act on its grant (frozen, cut off, or simply running).
            return if c.owner != self.owner && self.takes_over(c.priority) {
                AcquireStep::NewGrant
            } else {
                AcquireStep::Held
            };
        }
        if c.request.as_ref().is_some_and(|r| r.forceful) {
            // Ending: not even its holder may extend it.
            AcquireStep::Held
        } else {
            AcquireStep::Extend
        }
    }
}

/// A higher-priority requester's request that the holder of a grant give it up.
/// (Serialised as is by the etcd and ZooKeeper stores: renaming a field changes their
/// stored format.)
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PreemptionRequest {
    /// The requesting owner.
    pub by: String,
    /// The requesting holder instance.
    pub instance: String,
    /// The requester's priority: strictly above the grant's.
    pub priority: u64,
    /// `true`: from the moment it is recorded, every renewal of the grant is refused, so the
    /// grant ends at its current expiry (at most one ttl later) whether or not the holder
    /// cleaned up.
    pub forceful: bool,
    /// The requester's message (why it wants the lease).
    pub note: Option<String>,
}

impl PreemptionRequest {
    /// Whether this request may be recorded on a grant of priority `grant_priority` that has
    /// `pending` as its request: it must outrank the grant, and either nothing is pending,
    /// or the pending request is the same owner's (an update, e.g. becoming forceful), or it
    /// has a lower priority (overtaken). Every store decides it here (or in an equivalent
    /// compare-and-set condition).
    pub fn may_replace(&self, grant_priority: u64, pending: Option<&PreemptionRequest>) -> bool {
        self.priority > grant_priority
            && match pending {
                None => true,
                Some(p) => p.by == self.by || p.priority < self.priority,
            }
    }
}

/// The outcome of [`PreemptionRequests::request_preemption`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PreemptAnswer {
    /// The request is now on the grant; the record shows it.
    Recorded(LeaseRecord),
    /// Not recorded: the grant's priority is not lower, or another owner's request of at
    /// least the same priority is pending. The record tells which.
    Refused(LeaseRecord),
    /// The grant is not the current unexpired grant any more (released, expired, replaced):
    /// try to acquire.
    Gone,
}

/// The outcome of renewing one lease (see [`LeaseStore::renew`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renewal {
    /// Renewed: the expiry is extended by the ttl. `request`: the pending (non-forceful)
    /// preemption request on the grant, if any.
    Renewed {
        /// The pending (non-forceful) preemption request on the grant, if any.
        request: Option<PreemptionRequest>,
    },
    /// Certainly not held any more (released, expired, taken over, another token).
    NotHeld,
    /// Still recorded for the holder, but a forceful preemption request is pending: the
    /// renewal was refused and the expiry NOT extended. The holder must consider the lease
    /// lost (preempted) now.
    Refused(PreemptionRequest),
}

impl Renewal {
    /// The answer of a store that keeps no preemption requests: renewed (nothing pending)
    /// or not held.
    pub fn plain(renewed: bool) -> Self {
        if renewed {
            Renewal::Renewed { request: None }
        } else {
            Renewal::NotHeld
        }
    }

    /// A renewal that extended the expiry.
    pub fn is_renewed(&self) -> bool {
        matches!(self, Renewal::Renewed { .. })
    }
}

/// The certain outcome of an acquire attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// The requester holds the lease now, until `record.expires_in` from the store's view.
    /// If it already held it, the token is unchanged and the expiry extended (reentrancy).
    Granted(LeaseRecord),
    /// Another owner holds an unexpired grant.
    Held(LeaseRecord),
}

/// One lease in a batched renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLease {
    /// The lease name.
    pub name: String,
    /// The fencing token of the grant to renew.
    pub token: FencingToken,
}

/// A change of holder, pushed by a store with [`HolderWatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[expect(
    clippy::large_enum_variant,
    reason = "one event per change of holder: boxing would buy nothing"
)]
pub enum WatchEvent {
    /// `record` was granted (a new grant; renewals are not reported).
    Granted(LeaseRecord),
    /// The grant of `name` ended: released, expired, or taken over (a `Granted` follows then).
    Ended {
        /// The lease name.
        name: String,
    },
}

/// The subscriber's end of a watch. `None` from `recv` means the watch broke (connection
/// lost, store restarted): events may have been missed, so re-read and watch again.
pub type WatchReceiver = tokio::sync::mpsc::Receiver<WatchEvent>;

/// What a store guarantees beyond the contract of [`LeaseStore`]: properties of its tokens,
/// expiry and durability. (Operations a store may lack are capability traits: see
/// [`LeaseStore`].)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Tokens come from the store's own total order (etcd revision, ZooKeeper czxid…)
    /// rather than a counter kept beside the record.
    pub native_fencing: bool,
    /// The store itself expires records on a clock it owns; contenders need not observe a
    /// record unchanged for a full time-to-live before taking it.
    pub server_side_expiry: bool,
    /// Records and fencing counters survive a restart of the store.
    pub durable: bool,
}

/// A change to the ids remembered with one lease (see [`RememberedIds::remember`]): ids to add
/// and ids to remove, each listed once, none in both (an id given to both is removed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RememberChange {
    add: BTreeSet<String>,
    remove: BTreeSet<String>,
}

impl RememberChange {
    /// Adds `add` and removes `remove`; an id in both is removed.
    pub fn new(
        add: impl IntoIterator<Item = String>,
        remove: impl IntoIterator<Item = String>,
    ) -> Self {
        let remove: BTreeSet<String> = remove.into_iter().collect();
        let add = add.into_iter().filter(|id| !remove.contains(id)).collect();
        RememberChange { add, remove }
    }

    /// Adds `ids`.
    pub fn add(ids: impl IntoIterator<Item = String>) -> Self {
        RememberChange::new(ids, [])
    }

    /// Removes `ids`.
    pub fn remove(ids: impl IntoIterator<Item = String>) -> Self {
        RememberChange::new([], ids)
    }

    /// This change followed by `later`: an id `later` adds is added (not removed), one it
    /// removes is removed (not added).
    pub fn then(mut self, later: RememberChange) -> Self {
        for id in later.add {
            self.remove.remove(&id);
            self.add.insert(id);
        }
        for id in later.remove {
            self.add.remove(&id);
            self.remove.insert(id);
        }
        self
    }

    /// The ids to add, sorted.
    pub fn added(&self) -> &BTreeSet<String> {
        &self.add
    }

    /// The ids to remove, sorted.
    pub fn removed(&self) -> &BTreeSet<String> {
        &self.remove
    }

    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.remove.is_empty()
    }

    /// How many ids it adds or removes.
    pub fn len(&self) -> usize {
        self.add.len() + self.remove.len()
    }

    /// The change in parts of at most `max` ids each (at least one id per part), removals
    /// first: for stores that cannot apply any number of ids in one atomic write.
    pub fn parts(&self, max: usize) -> Vec<RememberChange> {
        let max = max.max(1);
        let mut parts = Vec::new();
        let mut part = RememberChange::default();
        let ids = self
            .remove
            .iter()
            .map(|id| (id, false))
            .chain(self.add.iter().map(|id| (id, true)));
        for (id, add) in ids {
            if part.len() == max {
                parts.push(std::mem::take(&mut part));
            }
            if add {
                part.add.insert(id.clone());
            } else {
                part.remove.insert(id.clone());
            }
        }
        if !part.is_empty() {
            parts.push(part);
        }
        parts
    }
}

/// Runs one store call on lease `lease`, bounded by `timeout` (the section's
/// `lease-operation-timeout`, counted from the first poll): past it, or on a store error,
/// the outcome is unknown.
pub async fn bounded<T>(
    lease: &str,
    operation: &'static str,
    timeout: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, LeaseError> {
    crate::metrics::store_request(operation);
    let deadline = tokio::time::Instant::now().checked_add(timeout);
    let mut call = std::pin::pin!(call);
    // The timer is made only once the call has not answered at its first poll: a call
    // answered at once (a store working inline on this thread) needs none, and making and
    // dropping one per call costs as much as a fast call itself. It is always polled
    // outside the task's budget (`tokio::time::timeout` does so once the call used the
    // budget up), so that it fires however busy the call keeps the task.
    let mut timer = std::pin::pin!(None::<tokio::task::coop::Unconstrained<tokio::time::Sleep>>);
    let answer = std::future::poll_fn(|cx| {
        if let Poll::Ready(answer) = call.as_mut().poll(cx) {
            return Poll::Ready(Ok(answer));
        }
        let Some(deadline) = deadline else {
            // Past the clock's range: no timer, as with `tokio::time::timeout`.
            return Poll::Pending;
        };
        if timer.is_none() {
            timer.set(Some(tokio::task::coop::unconstrained(
                tokio::time::sleep_until(deadline),
            )));
        }
        timer
            .as_mut()
            .as_pin_mut()
            .map_or(Poll::Pending, |timer| timer.poll(cx).map(Err))
    })
    .await;
    match answer {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(LeaseError::Store {
            name: lease.to_string(),
            operation,
            source,
        }),
        Err(_) => Err(LeaseError::Timeout {
            name: lease.to_string(),
            operation,
            timeout,
        }),
    }
}

/// A lease store: the operations every store has. Implementations must be safe to share
/// between tasks.
///
/// What a store can do beyond these is a capability trait of its own, a subtrait of this
/// one: [`FairQueue`], [`PreemptionRequests`], [`HolderWatch`], [`RememberedIds`],
/// [`GrantChanges`]. Code that
/// knows its store's type asks for the capability in its bounds (`S: FairQueue`), so that a
/// store without it does not compile. Code that holds a store chosen at run time (an
/// `Arc<dyn LeaseStore>` from the [`LeaseProvider`](crate::LeaseProvider)) asks the store
/// for the capability (`store.as_fair_queue()`), as a Go caller asserts an interface
/// (`store.(FairQueue)`), and gets `None` when the store lacks it. A store that implements a
/// capability trait answers its accessor with `Some(self)`.
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// The store kind (`"sqlite"`, `"memory"`, …).
    fn kind(&self) -> &'static str;

    /// What this store guarantees about its tokens, expiry and durability.
    fn capabilities(&self) -> Capabilities;

    /// Which lease names the store can hold verbatim; others are sanitised by
    /// [`names::store_name`](crate::names::store_name).
    fn name_rules(&self) -> NameRules {
        NameRules::default()
    }

    /// Grants the lease if it is free or expired (new token), or already held by `req.owner`
    /// and `req.instance` (same token, fresh expiry; priority and cleanup timeout stay as
    /// granted). `Ok(Held)` when another holder certainly has an unexpired grant: another
    /// owner, or another instance of `req.owner` (see [`AcquireRequest::instance`]); also,
    /// on a store with [`PreemptionRequests`], when a forceful preemption request is pending
    /// on the grant (it is ending: not even its holder may extend it). Exception: a request
    /// for which [`AcquireRequest::takes_over`] holds (emergency) is granted at once with a
    /// new token over another owner's grant. A new grant has no request pending.
    ///
    /// `Err`: unknown. The request may have been granted (its answer lost, e.g. past the
    /// caller's operation timeout); such a grant lapses after `req.ttl` unless its instance
    /// acquires again or renews it, however long the owner's other leases live on.
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome, StoreError>;

    /// Renews, in one round trip, every listed lease that `owner` still holds with that
    /// token, that has not expired and that has no forceful preemption request pending,
    /// giving each a fresh `ttl`. Returns one answer per input, in order (see [`Renewal`]).
    async fn renew(
        &self,
        owner: &str,
        leases: &[HeldLease],
        ttl: Duration,
    ) -> Result<Vec<Renewal>, StoreError>;

    /// Deletes the grant if `owner` holds it with `token`. `Ok(true)` released,
    /// `Ok(false)` it was not ours (any more): a stale holder never frees a later grant.
    /// `Err`: unknown; a grant left behind lapses after its ttl (it is not renewed any more).
    async fn release(
        &self,
        name: &str,
        owner: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError>;

    /// The current unexpired grant of `name`, if any.
    async fn read(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError>;

    /// The unexpired grants whose names start with `prefix`, sorted by name.
    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError>;

    /// This store's fair queue, if it keeps one.
    fn as_fair_queue(&self) -> Option<&dyn FairQueue> {
        None
    }

    /// This store's preemption requests, if it keeps them.
    fn as_preemption_requests(&self) -> Option<&dyn PreemptionRequests> {
        None
    }

    /// This store's watch of holder changes, if it pushes them.
    fn as_holder_watch(&self) -> Option<&dyn HolderWatch> {
        None
    }

    /// This store's remembered ids, if it keeps them.
    fn as_remembered_ids(&self) -> Option<&dyn RememberedIds> {
        None
    }

    /// This store's cheap check for changed grants under a prefix, if it has one.
    fn as_grant_changes(&self) -> Option<&dyn GrantChanges> {
        None
    }
}

/// Answers, inside an `impl LeaseStore for …` block, the accessor of each capability named
/// with `Some(self)`: `fair_queue` ([`LeaseStore::as_fair_queue`]), `preemption_requests`,
/// `holder_watch`, `remembered_ids`, `grant_changes`. Capabilities left out keep the trait's
/// `None`. A capability named whose trait the store does not implement is a compile error,
/// so the accessors cannot claim more than the store does.
///
/// ```
/// # use tenure_lease::{store::*, *};
/// # struct Queueing;
/// #[async_trait::async_trait]
/// impl LeaseStore for Queueing {
/// #   fn kind(&self) -> &'static str { "queueing" }
/// #   fn capabilities(&self) -> Capabilities { Capabilities::default() }
/// #   async fn try_acquire(&self, _: &AcquireRequest) -> Result<AcquireOutcome, StoreError> { unimplemented!() }
/// #   async fn renew(&self, _: &str, _: &[HeldLease], _: std::time::Duration) -> Result<Vec<Renewal>, StoreError> { unimplemented!() }
/// #   async fn release(&self, _: &str, _: &str, _: FencingToken) -> Result<bool, StoreError> { unimplemented!() }
/// #   async fn read(&self, _: &str) -> Result<Option<LeaseRecord>, StoreError> { unimplemented!() }
/// #   async fn list(&self, _: &str) -> Result<Vec<LeaseRecord>, StoreError> { unimplemented!() }
///     // … the core operations …
///     tenure_lease::capability_accessors!(fair_queue);
/// }
///
/// #[async_trait::async_trait]
/// impl FairQueue for Queueing {
/// #   async fn acquire_fair(&self, _: &AcquireRequest, _: std::time::Duration) -> Result<AcquireOutcome, StoreError> { unimplemented!() }
///     // …
/// }
/// ```
///
/// A store that claims a capability it lacks does not compile:
///
/// ```compile_fail
/// # use tenure_lease::{store::*, *};
/// # struct Plain;
/// #[async_trait::async_trait]
/// impl LeaseStore for Plain {
/// #   fn kind(&self) -> &'static str { "plain" }
/// #   fn capabilities(&self) -> Capabilities { Capabilities::default() }
/// #   async fn try_acquire(&self, _: &AcquireRequest) -> Result<AcquireOutcome, StoreError> { unimplemented!() }
/// #   async fn renew(&self, _: &str, _: &[HeldLease], _: std::time::Duration) -> Result<Vec<Renewal>, StoreError> { unimplemented!() }
/// #   async fn release(&self, _: &str, _: &str, _: FencingToken) -> Result<bool, StoreError> { unimplemented!() }
/// #   async fn read(&self, _: &str) -> Result<Option<LeaseRecord>, StoreError> { unimplemented!() }
/// #   async fn list(&self, _: &str) -> Result<Vec<LeaseRecord>, StoreError> { unimplemented!() }
///     tenure_lease::capability_accessors!(fair_queue); // `Plain` is no `FairQueue`
/// }
/// ```
#[macro_export]
macro_rules! capability_accessors {
    (@one fair_queue) => {
        fn as_fair_queue(&self) -> ::core::option::Option<&dyn $crate::FairQueue> {
            ::core::option::Option::Some(self)
        }
    };
    (@one preemption_requests) => {
        fn as_preemption_requests(
            &self,
        ) -> ::core::option::Option<&dyn $crate::PreemptionRequests> {
            ::core::option::Option::Some(self)
        }
    };
    (@one holder_watch) => {
        fn as_holder_watch(&self) -> ::core::option::Option<&dyn $crate::HolderWatch> {
            ::core::option::Option::Some(self)
        }
    };
    (@one remembered_ids) => {
        fn as_remembered_ids(&self) -> ::core::option::Option<&dyn $crate::RememberedIds> {
            ::core::option::Option::Some(self)
        }
    };
    (@one grant_changes) => {
        fn as_grant_changes(&self) -> ::core::option::Option<&dyn $crate::GrantChanges> {
            ::core::option::Option::Some(self)
        }
    };
    ($($capability:ident),+ $(,)?) => {
        $($crate::capability_accessors!(@one $capability);)+
    };
}

/// A store that queues acquires first come, first served.
///
/// A store not known to keep a fair queue has no `acquire_fair` to call: code generic over
/// any [`LeaseStore`] must ask for it in its bounds, so this does not compile.
///
/// ```compile_fail
/// use tenure_lease::*; // every trait in scope
///
/// async fn first_come<S: LeaseStore>(store: &S, req: &AcquireRequest) {
///     let _ = store.acquire_fair(req, std::time::Duration::from_secs(1)).await;
/// }
/// ```
#[async_trait]
pub trait FairQueue: LeaseStore {
    /// Fair acquire: queues `req` behind the requests that came before it and waits, at most
    /// `wait`, until granted. `Ok(Granted)`: held now, as from
    /// [`try_acquire`](LeaseStore::try_acquire). `Ok(Held(holder))`: `wait` passed while
    /// another owner held it; the queue entry is removed. `Err`: unknown, including a waiter
    /// whose session ended while queued (never a grant then). Dropping the future (cancel)
    /// removes the queue entry as well.
    async fn acquire_fair(
        &self,
        req: &AcquireRequest,
        wait: Duration,
    ) -> Result<AcquireOutcome, StoreError>;
}

/// What a fair acquire answers when its `wait` passed while it was still in line, once it
/// left the line: `Held` with `seen` (the holder it saw last while first in line), else with
/// the holder `read` finds now; an error when nobody holds the lease (the waiters ahead had
/// not reached it yet), so that the answer is never a "not granted" no holder backs. For
/// [`FairQueue`] implementations.
pub async fn fair_wait_passed(
    store: &'static str,
    req: &AcquireRequest,
    wait: Duration,
    seen: Option<LeaseRecord>,
    read: impl AsyncFnOnce() -> Result<Option<LeaseRecord>, StoreError>,
) -> Result<AcquireOutcome, StoreError> {
    let holder = match seen {
        Some(holder) => Some(holder),
        None => read().await?,
    };
    match holder {
        Some(holder) => Ok(AcquireOutcome::Held(holder)),
        None => Err(StoreError::unavailable(
            store,
            format!(
                "fair acquire of {}: {wait:?} passed while queued behind earlier waiters",
                req.name
            ),
        )),
    }
}

/// A fair acquire whose `wait` passed while it was in line: leaves the line with `leave`,
/// calls `left` once that succeeded (a failure is logged, and left to the caller's queue
/// entry, whose drop tries again), then answers as [`fair_wait_passed`]. For
/// [`FairQueue`] implementations that keep waiters in a table of their own.
pub async fn leave_line_when_wait_passed(
    store: &'static str,
    req: &AcquireRequest,
    wait: Duration,
    seen: Option<LeaseRecord>,
    leave: impl Future<Output = Result<(), StoreError>>,
    left: impl FnOnce(),
    read: impl AsyncFnOnce() -> Result<Option<LeaseRecord>, StoreError>,
) -> Result<AcquireOutcome, StoreError> {
    match leave.await {
        Ok(()) => left(),
        Err(e) => tracing::debug!(lease = %req.name, error = %e, "leaving the line failed"),
    }
    fair_wait_passed(store, req, wait, seen, read).await
}

/// A fair waiter's place in line, given up however its acquire ends: when dropped before
/// [`disarm`](Self::disarm), it calls `leave` and runs the future it returns in a task
/// spawned on the current tokio runtime, so that a cancelled acquire (its future dropped)
/// leaves the line too. Outside a runtime the future is dropped unrun, and the place is left
/// to the store's own expiry (the waiter's ttl or session). For [`FairQueue`]
/// implementations; the future reports its own failure, as nothing awaits it.
pub struct LeaveOnDrop<L, F>
where
    L: FnOnce() -> F,
    F: Future<Output = ()> + Send + 'static,
{
    leave: Option<L>,
}

impl<L, F> LeaveOnDrop<L, F>
where
    L: FnOnce() -> F,
    F: Future<Output = ()> + Send + 'static,
{
    /// A place in line that `leave` gives up when dropped.
    pub fn new(leave: L) -> Self {
        Self { leave: Some(leave) }
    }

    /// The place is gone already (granted, removed, expired): dropping does nothing.
    pub fn disarm(&mut self) {
        self.leave = None;
    }
}

impl<L, F> Drop for LeaveOnDrop<L, F>
where
    L: FnOnce() -> F,
    F: Future<Output = ()> + Send + 'static,
{
    fn drop(&mut self) {
        if let Some(leave) = self.leave.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(leave());
        }
    }
}

/// A store that keeps priorities and preemption requests on grants and enforces them:
/// [`LeaseStore::try_acquire`] refuses to extend a grant with a forceful request pending
/// and lets an emergency request ([`AcquireRequest::takes_over`]) take a lower grant over;
/// [`LeaseStore::renew`] answers [`Renewal::Refused`] for a grant with a forceful request.
#[async_trait]
pub trait PreemptionRequests: LeaseStore {
    /// Records `request` on grant `token` of `name`, atomically, when
    /// [`PreemptionRequest::may_replace`] allows it: `Ok(Recorded)`; otherwise
    /// `Ok(Refused)` with the record saying why; `Ok(Gone)` when `token` is not the current
    /// unexpired grant. A recorded forceful request makes every later renewal of the grant
    /// answer [`Renewal::Refused`] without extending it. Releasing or expiry of the grant
    /// drops its request; a request never changes the grant's token or expiry.
    async fn request_preemption(
        &self,
        name: &str,
        token: FencingToken,
        request: &PreemptionRequest,
    ) -> Result<PreemptAnswer, StoreError>;

    /// Removes the pending preemption request of owner `by` from grant `token` of `name`:
    /// `Ok(true)` removed, `Ok(false)` no request of `by` was there (another's, none, or the
    /// grant is gone).
    async fn withdraw_preemption(
        &self,
        name: &str,
        token: FencingToken,
        by: &str,
    ) -> Result<bool, StoreError>;
}

/// A store that pushes changes of holder to subscribers.
#[async_trait]
pub trait HolderWatch: LeaseStore {
    /// Pushes holder changes of the leases whose names start with `prefix`, from now on.
    async fn watch(&self, prefix: &str) -> Result<WatchReceiver, StoreError>;
}

/// Where the grants under one prefix stood at an answer of
/// [`GrantChanges::changes_since`], in two numbers whose meaning is the store's: the SQL
/// and memory stores keep a count of the grants made and ended there and the instant of
/// the answer on the clock they expire grants by; etcd the revision of the last write and
/// the number of grants. Only the store that gave it can compare it; callers keep it and
/// hand it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangeVersion {
    /// The store's first number (a change count, or the last write's revision).
    pub changes: u64,
    /// The store's second number (an instant on its expiry clock, or a count).
    pub at: i64,
}

/// What [`GrantChanges::changes_since`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Changes {
    /// Nothing changed since the version given: a listing now answers the grants a
    /// listing made right after that version's answer did (renewals aside).
    Unchanged(ChangeVersion),
    /// Something may have changed (or no version was given): list, and hold this version,
    /// which was taken before the listing so that a change racing it is reported again.
    Changed(ChangeVersion),
}

impl Changes {
    /// The version to hold after this answer (and, when changed, a listing).
    pub fn version(&self) -> ChangeVersion {
        match self {
            Changes::Unchanged(v) | Changes::Changed(v) => *v,
        }
    }
}

/// A store that answers cheaply, without listing them, whether the grants under a prefix
/// changed: for callers that follow a set of grants (cluster membership) by polling, so
/// that an idle poll reads O(1) rows instead of every grant.
///
/// A change is a grant made (new, or taking over an expired or lower grant), a grant ended
/// (released, expired, taken over, or lost with the store's state) and a grant's note
/// replaced; a renewal, which only extends a grant, is none, so that grants renewed every
/// second do not make every poll a listing (a reentrant acquire may count as a change: an
/// answer "changed" that was not costs only a listing). A caller that needs the expiries a
/// listing shows must therefore list anyway. A store whose listings judge expiry on the
/// client's clock reports an expiry once the server removes the grant (etcd: at most about
/// two seconds later).
#[async_trait]
pub trait GrantChanges: LeaseStore {
    /// Whether the unexpired grants whose names start with `prefix` changed since `since`
    /// (an earlier answer of this store for the same prefix): `Ok(Unchanged(v))` nothing
    /// changed, hold `v` now; `Ok(Changed(v))` something may have (always when `since` is
    /// `None` or from another store): list after this answer and hold `v`. `Err`: unknown;
    /// keep the version held and ask again.
    async fn changes_since(
        &self,
        prefix: &str,
        since: Option<ChangeVersion>,
    ) -> Result<Changes, StoreError>;
}

/// A store that keeps ids with a lease (Akka's remember-entities store), written only by the
/// lease's current holder.
#[async_trait]
pub trait RememberedIds: LeaseStore {
    /// Applies `change` to the ids remembered with lease `name`, if `token` is `owner`'s
    /// current unexpired grant of `name`: `Ok(true)` applied; `Ok(false)` that grant is not
    /// current (released, expired, replaced by a later grant), and nothing of the change was
    /// applied once it ended. Only the holder writes, so a holder that lost its lease,
    /// however late its write arrives, never changes what its successor remembers. Stores
    /// whose tokens identify a grant on their own may check the token alone.
    ///
    /// Remembered ids are not grants: they never expire, and they outlive the grant that
    /// wrote them (its release, expiry, session or process) and the store's restarts, as
    /// durably as the store keeps anything ([`Capabilities::durable`]); only a `remember`
    /// removes them. Adding a remembered id and removing an absent one change nothing, so
    /// applying a change again is harmless. A store may apply a large change in parts, each
    /// checked against the grant: after `Ok(true)` all of it is applied.
    ///
    /// Ids are text without NUL characters (PostgreSQL's `text` cannot hold one: such an
    /// id fails the change with an error).
    ///
    /// `Err`: unknown; any part of the change may have been applied.
    async fn remember(
        &self,
        name: &str,
        owner: &str,
        token: FencingToken,
        change: &RememberChange,
    ) -> Result<bool, StoreError>;

    /// The ids remembered with lease `name` (see [`remember`](RememberedIds::remember)),
    /// sorted, whoever holds the lease now (empty when none): every change answered before
    /// this call is seen.
    async fn remembered(&self, name: &str) -> Result<Vec<String>, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call that never answers is an unknown outcome once the timeout passed since the
    /// first poll (the paused clock moves on when the runtime idles).
    #[tokio::test(start_paused = true)]
    async fn a_call_that_never_answers_times_out_at_the_deadline() {
        let started = tokio::time::Instant::now();
        let err = bounded::<()>(
            "l",
            "acquire",
            Duration::from_secs(5),
            std::future::pending(),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(
                err,
                LeaseError::Timeout {
                    operation: "acquire",
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    /// What the call answers is the answer: at once even with no time to spare (no timer is
    /// made), later within the timeout, a store error as the store's, and with a timeout
    /// past the clock's range (no timer at all).
    #[tokio::test(start_paused = true)]
    async fn a_call_that_answers_in_time_is_its_answer() {
        let at_once = bounded("l", "acquire", Duration::ZERO, async { Ok(7) }).await;
        assert_eq!(at_once.unwrap(), 7);
        let later = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok(8)
        };
        assert_eq!(
            bounded("l", "acquire", Duration::from_secs(5), later)
                .await
                .unwrap(),
            8
        );
        let failed = async { Err(StoreError::backend("memory", "boom")) };
        let err = bounded::<()>("l", "release", Duration::from_secs(5), failed)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                LeaseError::Store {
                    operation: "release",
                    ..
                }
            ),
            "{err}"
        );
        let unbounded = async {
            tokio::task::yield_now().await;
            Ok(9)
        };
        assert_eq!(
            bounded("l", "acquire", Duration::MAX, unbounded)
                .await
                .unwrap(),
            9
        );
    }

    /// A call that keeps its task busy (it uses the task's whole budget at every poll)
    /// still times out: the timer is polled outside the budget.
    #[tokio::test]
    async fn a_call_that_keeps_its_task_busy_still_times_out() {
        let busy = async {
            loop {
                tokio::task::consume_budget().await;
            }
        };
        let bounded = bounded::<()>("l", "acquire", Duration::from_millis(20), busy);
        // Were the timer starved, tokio's own timeout (which does poll its timer once the
        // call used the budget up) makes this fail instead of hang.
        let err = tokio::time::timeout(Duration::from_secs(60), bounded)
            .await
            .expect("the operation timeout never fired")
            .unwrap_err();
        assert!(matches!(err, LeaseError::Timeout { .. }), "{err}");
    }

    fn ids(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_remember_change_removes_what_it_both_adds_and_removes() {
        let c = RememberChange::new(["a".into(), "b".into()], ["b".into(), "c".into()]);
        assert_eq!((c.added(), c.removed()), (&ids(&["a"]), &ids(&["b", "c"])));
        assert_eq!(c.len(), 3);
        assert!(!c.is_empty() && RememberChange::default().is_empty());
    }

    #[test]
    fn later_changes_win() {
        let c = RememberChange::new(["a".into()], ["b".into()])
            .then(RememberChange::new(["b".into()], ["a".into(), "c".into()]));
        assert_eq!((c.added(), c.removed()), (&ids(&["b"]), &ids(&["a", "c"])));
    }

    #[test]
    fn parts_cover_the_change_in_bounded_pieces() {
        let add: Vec<String> = (0..5).map(|i| format!("a{i}")).collect();
        let remove: Vec<String> = (0..3).map(|i| format!("r{i}")).collect();
        let c = RememberChange::new(add, remove);
        let parts = c.parts(3);
        assert_eq!(
            parts.iter().map(RememberChange::len).collect::<Vec<_>>(),
            [3, 3, 2]
        );
        let joined = parts
            .into_iter()
            .fold(RememberChange::default(), RememberChange::then);
        assert_eq!(joined, c);
        assert_eq!(c.parts(0).len(), 8, "at least one id per part");
        assert!(RememberChange::default().parts(3).is_empty());
    }
}
