//! The store conformance kit: one suite every store crate runs against itself, with a real
//! store (server started by the crate's harness). Add `tenure-lease-kit` to the
//! dev-dependencies and invoke [`conformance_tests!`](crate::conformance_tests) with the
//! store's capabilities:
//!
//! ```text
//! tenure_lease_kit::conformance_tests!(MyHarness::start(); fair_queue, remembered_ids);
//! ```
//!
//! Timing here is real (short ttls); assertions are about order and safety, never about
//! how fast something happened.

mod changes;
pub mod fair;
mod faulty;
mod instances;
mod lapse;
mod lock_delay;
mod loss_in_flight;
pub mod preemption;
pub mod preemption_faults;
pub mod proxy;
mod recipes;
mod remember;
pub mod state_loss;
mod watch;

pub use changes::grant_changes_move_on_grants_and_ends_not_on_renewals;
pub use fair::{
    fair_cancelled_waiter_leaves_the_line, fair_dead_waiter_does_not_block_the_line,
    fair_wait_timeout_answers_held, fair_waiters_served_in_arrival_order,
};
pub use faulty::FaultyClient;
pub use instances::same_owner_other_instance_waits;
pub use lapse::{
    lost_answers_lapse, lost_reentrant_answer_keeps_the_grant, reentry_after_an_operator_release,
    session_expiry_recovers,
};
pub use lock_delay::{lock_delay_holds_a_lapsed_grant, release_skips_the_lock_delay};
pub use loss_in_flight::acquire_out_at_a_loss_gets_a_higher_token;
pub use recipes::{election_one_leader_at_a_time, semaphore_at_most_n_holders};
pub use remember::remembered_ids;
pub use watch::holder_watch_pushes_grants_and_ends;

pub use preemption::{
    emergency_takeover, forceful_preemption_refuses_renewals, helix_cleanup_in_time,
    helix_cleanup_timeout, helix_emergency, helix_forceful, helix_lower_priority_rejected,
    helix_overtaken, preemption_requests,
};

use std::any::Any;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::{Instant, sleep};

use tenure_lease::FencingToken;
use tenure_lease::{
    AcquireOutcome, AcquireRequest, Acquired, FairQueue, GrantChanges, HeldLease, HolderWatch,
    Lease, LeaseError, LeaseSettings, LeaseSpec, LeaseStore, LostReason, PreemptionRequests,
    RememberedIds, Renewal,
};

/// A store under test.
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// A new client of the store, as another process would open it (its own connection).
    async fn client(&self) -> Arc<dyn LeaseStore>;
    /// Restarts the store (server or file), keeping its data.
    async fn restart(&self);
    /// Makes the store unavailable to every client, or slow past any operation timeout,
    /// until the returned guard is dropped.
    async fn outage(&self) -> Box<dyn Any + Send>;
    /// A new client (as [`client`](Harness::client) gives) whose answers can be made late
    /// with the returned control: its requests still reach the store and take effect, and
    /// their answers come after the delay, so that a caller whose operation timeout is
    /// shorter gives them up. Network stores put a [`proxy::Proxy`] between the client and
    /// the server. An embedded store may hold its requests back instead and let them
    /// complete when the delay is lifted (a write lock held by another connection), as long
    /// as its own timeouts let them complete. The control lives as long as the client.
    async fn delayed_client(&self) -> (Arc<dyn LeaseStore>, Box<dyn AnswerDelay>);
    /// Ends every session `owner` has with the store, as the server does when a session
    /// expires or an operator revokes it: every grant on it ends at once, without the
    /// owner asking. The default, for stores without sessions, has another client release
    /// every grant of `owner` (what an operator would do).
    async fn expire_sessions(&self, owner: &str) {
        let operator = self.client().await;
        for record in operator.list("").await.expect("list the leases") {
            if record.owner == owner {
                operator
                    .release(&record.name, owner, record.token)
                    .await
                    .expect("release as an operator");
            }
        }
    }
    /// How many fair waiters' entries (rows, keys, nodes) of lease `name` the store keeps
    /// now (stores with a [`FairQueue`]; see [`fair`]), including any that expired but were
    /// not removed yet, so that a waiter that leaves without removing its entry shows.
    /// `None` (the default): the harness cannot tell, and the fair cases fail for a store
    /// with a fair queue.
    async fn fair_waiters(&self, name: &str) -> Option<usize> {
        let _ = name;
        None
    }
}

/// Makes a client's answers late (see [`Harness::delayed_client`]).
pub trait AnswerDelay: Send + Sync {
    /// From now on, answers reach the client `delay` after the store gave them (`None`: at
    /// once again; answers held back already keep their delay).
    fn set(&self, delay: Option<Duration>);
}

/// Settings for conformance tests: ttl 1.5 s, renewals every 300 ms, margin 300 ms.
pub fn test_settings() -> LeaseSettings {
    LeaseSettings {
        heartbeat_timeout: Duration::from_millis(1500),
        heartbeat_interval: Duration::from_millis(300),
        lease_operation_timeout: Duration::from_millis(1000),
        lease_retry_interval: Duration::from_millis(100),
        safety_margin: Duration::from_millis(300),
        lock_delay: Duration::ZERO,
    }
}

/// Settings for tests of what runs under a lease (shards, singletons): ttl 1.5 s, renewals
/// every 200 ms, margin 200 ms, store calls bounded at 500 ms, retries every 100 ms. The
/// stop budget of a 300 ms stop-timeout (800 ms) fits its ttl.
pub fn holder_test_settings() -> LeaseSettings {
    LeaseSettings {
        heartbeat_timeout: Duration::from_millis(1500),
        heartbeat_interval: Duration::from_millis(200),
        lease_operation_timeout: Duration::from_millis(500),
        lease_retry_interval: Duration::from_millis(100),
        safety_margin: Duration::from_millis(200),
        lock_delay: Duration::ZERO,
    }
}

/// A plain request for a store test: `owner`'s one instance (`<owner>-1`) asks for `name`
/// for `ttl`, at the default priority, with no note.
pub fn owner_request(name: &str, owner: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(name, owner, format!("{owner}-1"), ttl)
}

fn request(name: &str, owner: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(name, owner, format!("{owner}-instance"), ttl)
}

async fn lease_on(store: Arc<dyn LeaseStore>, name: &str, owner: &str) -> Lease {
    lease_with(store, name, owner, test_settings()).await
}

async fn lease_with(
    store: Arc<dyn LeaseStore>,
    name: &str,
    owner: &str,
    settings: LeaseSettings,
) -> Lease {
    Lease::start(LeaseSpec::new(name, owner, store, settings).expect("valid spec"))
        .await
        .expect("lease actor starts")
}

/// Tries to acquire every 10 ms until granted (at most ten ttls); returns when the grant
/// answer arrived and its token.
async fn poll_until_granted(
    store: &dyn LeaseStore,
    name: &str,
    owner: &str,
    ttl: Duration,
) -> (Instant, FencingToken) {
    poll_until_granted_as(store, &request(name, owner, ttl)).await
}

/// [`poll_until_granted`] for `req` (any instance).
async fn poll_until_granted_as(
    store: &dyn LeaseStore,
    req: &AcquireRequest,
) -> (Instant, FencingToken) {
    let started = Instant::now();
    loop {
        match store.try_acquire(req).await.expect("acquire") {
            AcquireOutcome::Granted(r) => return (Instant::now(), r.token),
            AcquireOutcome::Held(_) => sleep(Duration::from_millis(10)).await,
        }
        assert!(
            started.elapsed() < req.ttl * 10,
            "{}: the holder's grant never expired",
            req.name
        );
    }
}

/// Losses of a lease's grants, with the instant each was announced.
pub type Losses = Arc<Mutex<Vec<(Instant, LostReason)>>>;

/// Acquires `lease` (it must be granted), recording its losses.
pub async fn acquire_recording_losses(lease: &Lease) -> (FencingToken, Losses) {
    let lost: Losses = Arc::default();
    let l = lost.clone();
    let got = lease
        .acquire_with_lost(move |ev| l.lock().unwrap().push((Instant::now(), ev.reason)))
        .await
        .expect("acquire");
    let Acquired::Granted { token } = got else {
        panic!("not granted: {got:?}")
    };
    (token, lost)
}

/// `owner`'s attempt on `name` is answered: held by `holder` with `token`.
async fn assert_held(
    store: &dyn LeaseStore,
    name: &str,
    owner: &str,
    ttl: Duration,
    holder: &str,
    token: FencingToken,
) {
    match store
        .try_acquire(&request(name, owner, ttl))
        .await
        .expect("acquire")
    {
        AcquireOutcome::Held(r) => assert_eq!((r.owner.as_str(), r.token), (holder, token)),
        AcquireOutcome::Granted(r) => panic!("granted to {owner} while {holder} holds it: {r:?}"),
    }
}

/// The token of the grant `outcome`; panics, naming the holder, when it is `Held` (a test
/// tool).
pub fn granted_token(outcome: &AcquireOutcome) -> FencingToken {
    match outcome {
        AcquireOutcome::Granted(r) => r.token,
        AcquireOutcome::Held(r) => panic!("expected a grant, held by {}", r.owner),
    }
}

/// N owners, each with its own client, acquire at once: exactly one wins, every round;
/// the others are told who holds it; tokens increase from round to round.
pub async fn contention(h: &dyn Harness) {
    const OWNERS: usize = 6;
    let mut leases = Vec::new();
    for i in 0..OWNERS {
        leases.push(lease_on(h.client().await, "contended", &format!("owner-{i}")).await);
    }
    let mut last_token = FencingToken::new(0);
    for round in 0..5 {
        let results = futures::future::join_all(leases.iter().map(|l| l.acquire())).await;
        let winners: Vec<usize> = results
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, Ok(Acquired::Granted { .. })))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(
            winners.len(),
            1,
            "round {round}: winners {winners:?}, results {results:?}"
        );
        let winner = winners[0];
        let Ok(Acquired::Granted { token }) = results[winner] else {
            unreachable!()
        };
        assert!(
            token > last_token,
            "round {round}: token {token} after {last_token}"
        );
        last_token = token;
        for (i, r) in results.iter().enumerate() {
            if i != winner {
                assert_eq!(
                    r.as_ref().expect("no errors against a healthy store"),
                    &Acquired::NotGranted {
                        holder: Some(format!("owner-{winner}")),
                        priority: 0
                    }
                );
            }
        }
        assert!(leases[winner].check_lease());
        assert!(leases[winner].release().await.expect("release"));
    }
}

/// Re-acquiring a held lease returns the same token (store and Lease API).
pub async fn reentrancy(h: &dyn Harness) {
    let store = h.client().await;
    let ttl = Duration::from_secs(5);
    let a = granted_token(
        &store
            .try_acquire(&request("reentrant", "a", ttl))
            .await
            .expect("acquire"),
    );
    let again = granted_token(
        &store
            .try_acquire(&request("reentrant", "a", ttl))
            .await
            .expect("acquire"),
    );
    assert_eq!(a, again);
    let rec = store.read("reentrant").await.expect("read").expect("held");
    assert_eq!((rec.token, rec.instance.as_str()), (a, "a-instance"));
    assert!(store.release("reentrant", "a", a).await.expect("release"));
    let lease = lease_on(h.client().await, "reentrant-api", "a").await;
    let first = lease.acquire().await.expect("acquire");
    assert!(matches!(first, Acquired::Granted { .. }));
    assert_eq!(lease.acquire().await.expect("acquire"), first);
    assert!(lease.release().await.expect("release"));
}

/// Only the holder can release, and a stale holder's release never frees a later grant.
pub async fn owner_only_release(h: &dyn Harness) {
    let a = h.client().await;
    let b = h.client().await;
    let short = Duration::from_millis(400);
    let t1 = granted_token(
        &a.try_acquire(&request("owned", "a", short))
            .await
            .expect("acquire"),
    );
    assert!(
        !b.release("owned", "b", t1).await.expect("release"),
        "b released a's grant"
    );
    assert_eq!(
        b.read("owned").await.expect("read").map(|r| r.owner),
        Some("a".into())
    );
    sleep(short + Duration::from_millis(100)).await;
    let t2 = granted_token(
        &b.try_acquire(&request("owned", "b", Duration::from_secs(5)))
            .await
            .expect("acquire"),
    );
    assert!(t2 > t1);
    assert!(
        !a.release("owned", "a", t1).await.expect("release"),
        "stale release succeeded"
    );
    let rec = b.read("owned").await.expect("read").expect("still held");
    assert_eq!((rec.owner.as_str(), rec.token), ("b", t2));
    assert!(
        !b.release("owned", "b", t1).await.expect("release"),
        "release with an old token"
    );
    assert!(b.release("owned", "b", t2).await.expect("release"));
    assert_eq!(b.read("owned").await.expect("read"), None);
}

/// Tokens strictly increase across holders, releases, expiries and store restarts.
pub async fn token_monotonicity(h: &dyn Harness) {
    let short = Duration::from_millis(300);
    let mut last = FencingToken::new(0);
    let mut check = |t: FencingToken, what: &str| {
        assert!(t > last, "{what}: token {t} not above {last}");
        last = t;
    };
    for round in 0..3 {
        let store = h.client().await;
        for owner in ["a", "b", "a"] {
            let t = granted_token(
                &store
                    .try_acquire(&request("mono", owner, short))
                    .await
                    .expect("acquire"),
            );
            check(t, "after release");
            assert!(store.release("mono", owner, t).await.expect("release"));
        }
        let t = granted_token(
            &store
                .try_acquire(&request("mono", "c", short))
                .await
                .expect("acquire"),
        );
        check(t, "new holder");
        sleep(short + Duration::from_millis(100)).await;
        let t = granted_token(
            &store
                .try_acquire(&request("mono", "c", short))
                .await
                .expect("acquire"),
        );
        check(t, "same owner after expiry");
        assert!(store.release("mono", "c", t).await.expect("release"));
        drop(store);
        if round < 2 {
            h.restart().await;
        }
    }
}

/// A holder that stops renewing loses the lease after its ttl, and not before: a
/// contender is refused until then and granted afterwards with a higher token.
pub async fn expiry_and_takeover(h: &dyn Harness) {
    let a = h.client().await;
    let b = h.client().await;
    let ttl = Duration::from_millis(800);
    let sent = Instant::now();
    let t1 = granted_token(
        &a.try_acquire(&request("expiring", "a", ttl))
            .await
            .expect("acquire"),
    );
    assert_held(&*b, "expiring", "b", ttl, "a", t1).await;
    let (granted_at, t2) = poll_until_granted(&*b, "expiring", "b", ttl).await;
    assert!(t2 > t1);
    // The grant was processed before the call returned, and a's grant was processed after
    // `sent`: b's grant cannot have come before a's ttl ran out.
    assert!(
        granted_at >= sent + ttl,
        "b granted {:?} after a's request, ttl {ttl:?}",
        granted_at - sent
    );
}

/// One renewal call renews many leases of one owner and reports, per lease, the ones not
/// held (another owner's, unknown, wrong token). a's leases are acquired with a ttl of 4 s
/// (within a ZooKeeper test server's session bound), so that the test does not depend on
/// 200 acquires running within a short ttl on a loaded machine.
pub async fn batch_renew(h: &dyn Harness) {
    let a = h.client().await;
    let b = h.client().await;
    let ttl = Duration::from_millis(800);
    let mut held = Vec::new();
    for i in 0..200 {
        let name = format!("batch-{i:03}");
        let token = granted_token(
            &a.try_acquire(&request(&name, "a", Duration::from_secs(4)))
                .await
                .expect("acquire"),
        );
        held.push(HeldLease { name, token });
    }
    let theirs = granted_token(
        &b.try_acquire(&request("batch-theirs", "b", ttl))
            .await
            .expect("acquire"),
    );
    let mut batch = held.clone();
    batch.push(HeldLease {
        name: "batch-theirs".into(),
        token: theirs,
    });
    batch.push(HeldLease {
        name: "batch-nobody".into(),
        token: FencingToken::new(1),
    });
    batch.push(HeldLease {
        name: held[0].name.clone(),
        token: FencingToken::new(held[0].token.get() + 1000),
    });
    let answers = a
        .renew("a", &batch, Duration::from_secs(5))
        .await
        .expect("renew");
    assert_eq!(answers.len(), batch.len());
    assert!(
        answers[..200]
            .iter()
            .all(|r| *r == Renewal::Renewed { request: None }),
        "all of a's leases renewed"
    );
    assert_eq!(
        &answers[200..],
        &[Renewal::NotHeld, Renewal::NotHeld, Renewal::NotHeld]
    );
    sleep(ttl + ttl / 4).await;
    let listed = a.list("batch-").await.expect("list");
    assert_eq!(
        listed.len(),
        200,
        "a's renewed leases are held, b's (not renewed by a) expired"
    );
    assert!(listed.iter().all(|r| r.owner == "a"));
    assert!(
        listed.windows(2).all(|w| w[0].name < w[1].name),
        "sorted by name"
    );
}

/// An unavailable or too slow store gives errors (unknown), never "not granted" or `false`.
pub async fn errors_when_unavailable(h: &dyn Harness) {
    let lease = lease_on(h.client().await, "outage", "a").await;
    assert!(matches!(
        lease.acquire().await.expect("acquire"),
        Acquired::Granted { .. }
    ));
    let other = lease_on(h.client().await, "outage", "b").await;
    let guard = h.outage().await;
    let acquire = other.acquire().await;
    assert!(
        matches!(
            acquire,
            Err(LeaseError::Timeout { .. } | LeaseError::Store { .. })
        ),
        "acquire during outage: {acquire:?}"
    );
    let release = lease.release().await;
    assert!(release.is_err(), "release during outage: {release:?}");
    drop(guard);
}

/// A holder cut off from the store signals the loss exactly once, and before any other
/// owner is granted the lease.
pub async fn loss_before_takeover(h: &dyn Harness) {
    let cut = FaultyClient::new(h.client().await);
    let holder = lease_on(cut.clone(), "partitioned", "a").await;
    let (token, lost) = acquire_recording_losses(&holder).await;
    sleep(Duration::from_millis(700)).await;
    assert!(holder.check_lease(), "renewals keep it");
    cut.set_cut(true);
    let contender = h.client().await;
    let ttl = test_settings().heartbeat_timeout;
    let (granted_at, later) = poll_until_granted(&*contender, "partitioned", "b", ttl).await;
    assert!(later > token);
    let events = lost.lock().unwrap().clone();
    assert_eq!(events.len(), 1, "one loss signal: {events:?}");
    let (lost_at, reason) = events[0];
    assert_eq!(reason, LostReason::Expired);
    assert!(
        lost_at <= granted_at,
        "loss signalled {:?} after the contender's grant",
        lost_at - granted_at
    );
    assert!(!holder.check_lease());
    cut.set_cut(false);
    sleep(Duration::from_millis(700)).await;
    assert_eq!(lost.lock().unwrap().len(), 1, "no second signal");
}

/// The store's fair queue; a store without one fails the case that needs it.
pub fn fair_queue_of(store: &dyn LeaseStore) -> &dyn FairQueue {
    store
        .as_fair_queue()
        .unwrap_or_else(|| panic!("the {} store keeps no fair queue", store.kind()))
}

/// The store's preemption requests; a store without them fails the case that needs them.
pub fn preemption_requests_of(store: &dyn LeaseStore) -> &dyn PreemptionRequests {
    store
        .as_preemption_requests()
        .unwrap_or_else(|| panic!("the {} store keeps no preemption requests", store.kind()))
}

/// The store's watch of holder changes; a store without one fails the case that needs it.
pub fn holder_watch_of(store: &dyn LeaseStore) -> &dyn HolderWatch {
    store
        .as_holder_watch()
        .unwrap_or_else(|| panic!("the {} store has no holder watch", store.kind()))
}

/// The store's remembered ids; a store without them fails the case that needs them.
pub fn remembered_ids_of(store: &dyn LeaseStore) -> &dyn RememberedIds {
    store
        .as_remembered_ids()
        .unwrap_or_else(|| panic!("the {} store keeps no remembered ids", store.kind()))
}

/// The store's check for changed grants; a store without one fails the case that needs it.
pub fn grant_changes_of(store: &dyn LeaseStore) -> &dyn GrantChanges {
    store
        .as_grant_changes()
        .unwrap_or_else(|| panic!("the {} store has no check for changed grants", store.kind()))
}

/// The capabilities a client of the store offers through its accessors
/// ([`LeaseStore::as_fair_queue`] and the others), by the names
/// [`conformance_tests!`](crate::conformance_tests) lists them with.
pub fn offered_capabilities(store: &dyn LeaseStore) -> Vec<&'static str> {
    [
        ("fair_queue", store.as_fair_queue().is_some()),
        ("grant_changes", store.as_grant_changes().is_some()),
        ("holder_watch", store.as_holder_watch().is_some()),
        (
            "preemption_requests",
            store.as_preemption_requests().is_some(),
        ),
        ("remembered_ids", store.as_remembered_ids().is_some()),
    ]
    .into_iter()
    .filter_map(|(name, offered)| offered.then_some(name))
    .collect()
}

/// The store's clients offer exactly the capabilities its `conformance_tests!` lists: a
/// store that implements a capability trait but does not answer its accessor (so that
/// callers holding a `dyn LeaseStore` never find it), or gains one whose cases it does not
/// run, fails here.
pub async fn capabilities_as_declared(h: &dyn Harness, declared: &[&str]) {
    let store = h.client().await;
    let mut declared = declared.to_vec();
    declared.sort_unstable();
    assert_eq!(
        offered_capabilities(&*store),
        declared,
        "the {} store's accessors offer other capabilities than its conformance_tests! lists",
        store.kind()
    );
}

/// Defines one `#[tokio::test]` per conformance case. `$harness` is an async expression
/// giving a fresh [`Harness`] for each test; after it, the store's capabilities, each of
/// which adds its cases: `fair_queue` ([`fair`]), `holder_watch`, `preemption_requests`
/// ([`preemption`]), `remembered_ids`, `grant_changes`. A case checks that the store's accessors offer
/// exactly the capabilities listed ([`capabilities_as_declared`]).
#[macro_export]
macro_rules! conformance_tests {
    (@case $harness:expr; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness = $harness.await;
                $crate::conformance::$case(&harness).await;
            }
        )*
    };
    (@base $harness:expr) => {
        $crate::conformance_tests!(@case $harness; contention, reentrancy, owner_only_release,
            token_monotonicity, expiry_and_takeover, batch_renew, errors_when_unavailable,
            loss_before_takeover, same_owner_other_instance_waits, lost_answers_lapse,
            lost_reentrant_answer_keeps_the_grant, reentry_after_an_operator_release,
            acquire_out_at_a_loss_gets_a_higher_token, session_expiry_recovers, lock_delay_holds_a_lapsed_grant,
            release_skips_the_lock_delay, election_one_leader_at_a_time,
            semaphore_at_most_n_holders);
    };
    (@capability $harness:expr; fair_queue) => {
        $crate::conformance_tests!(@case $harness; fair_waiters_served_in_arrival_order,
            fair_wait_timeout_answers_held, fair_cancelled_waiter_leaves_the_line,
            fair_dead_waiter_does_not_block_the_line);
    };
    (@capability $harness:expr; holder_watch) => {
        $crate::conformance_tests!(@case $harness; holder_watch_pushes_grants_and_ends);
    };
    (@capability $harness:expr; preemption_requests) => {
        $crate::conformance_tests!(@case $harness; preemption_requests,
            forceful_preemption_refuses_renewals, emergency_takeover,
            helix_lower_priority_rejected, helix_cleanup_in_time, helix_cleanup_timeout,
            helix_forceful, helix_overtaken, helix_emergency);
    };
    (@capability $harness:expr; remembered_ids) => {
        $crate::conformance_tests!(@case $harness; remembered_ids);
    };
    (@capability $harness:expr; grant_changes) => {
        $crate::conformance_tests!(@case $harness;
            grant_changes_move_on_grants_and_ends_not_on_renewals);
    };
    ($harness:expr $(; $($capability:ident),* $(,)?)?) => {
        $crate::conformance_tests!(@base $harness);
        $($($crate::conformance_tests!(@capability $harness; $capability);)*)?
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn capabilities_as_declared() {
            let harness = $harness.await;
            $crate::conformance::capabilities_as_declared(
                &harness,
                &[$($(stringify!($capability)),*)?],
            )
            .await;
        }
    };
}
