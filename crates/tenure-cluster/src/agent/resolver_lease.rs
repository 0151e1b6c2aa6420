//! The resolver lease of lease-majority (`<system>-sbr`) as one side of a partition sees
//! it: the side's leader tries to acquire it, the side's other members watch it. Both are
//! thin drivers of one pure machine ([`Attempt`]) that decides when to call the store
//! again and what the answers mean: they sleep until the instant it names, make the call
//! it asks for and feed the answer back.
//!
//! A grant held by a node outside the side decides against the side only once its holder
//! shows that it runs: the grant is still held past the latest instant it could have lapsed
//! unrenewed, or another node outside the side took a new grant. A frozen or crashed
//! node's grant lapses unrenewed; a side that can run must not down itself for it, so the
//! side looks again until that grant has lapsed (at most one ttl and the store's slack).

use std::sync::Arc;
use std::time::Duration;

use tenure_lease::store::bounded;
use tenure_lease::{Acquired, ConfigError, Lease, LeaseError, LeaseSpec};
use tokio::time::Instant;

use super::resolver_attempt::{Answer, Attempt, Holder, Look, Next};

/// The resolver lease handle, shared with the task that releases it (one handle for the
/// node's life, so that acquiring again re-enters).
pub(super) type SharedLease = Arc<tokio::sync::Mutex<Option<Lease>>>;

/// Why a side could not learn whether it holds the resolver lease.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ResolverLeaseError {
    /// The resolver lease's name or settings were refused.
    #[error("the resolver lease cannot be set up: {0}")]
    Spec(#[source] ConfigError),
    /// The store failed [`TRIES`](super::resolver_attempt::TRIES) times in a row (the error
    /// names the lease).
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// Nobody held the resolver lease for `waited`: the side's leader cannot reach the store.
    #[error("resolver lease `{lease}`: nobody held it for {waited:?}")]
    Unheld {
        /// The resolver lease's name.
        lease: String,
        /// How long it was seen free.
        waited: Duration,
    },
}

/// Reads the resolver lease's record now, bounded by the lease's operation timeout: the
/// answer to [`Next::Look`], stamped with the instants the read was sent and answered.
async fn read(spec: &LeaseSpec) -> Answer {
    let sent = Instant::now();
    let read = bounded(
        &spec.name,
        "read",
        spec.settings.lease_operation_timeout,
        spec.store.read(&spec.store_name),
    )
    .await;
    match read {
        Ok(record) => Answer::Looked(Look {
            record,
            sent,
            answered: Instant::now(),
        }),
        Err(error) => Answer::Failed {
            error,
            at: Instant::now(),
        },
    }
}

/// The side's leader acquires the resolver lease `spec` for `side` (whose members' addresses
/// are the lease's owners). `Ok(true)`: this node or another member of the side holds it;
/// `Ok(false)`: a running node outside the side holds it; `Err` when the lease could not
/// be started or the store failed [`TRIES`] times in a row. A grant outside the side that
/// lapses unrenewed is waited out, then acquired. When to try again is the [`Attempt`]'s
/// decision.
///
/// [`TRIES`]: super::resolver_attempt::TRIES
pub(super) async fn acquire(
    lease: SharedLease,
    spec: LeaseSpec,
    side: &[String],
) -> Result<bool, ResolverLeaseError> {
    let mut slot = lease.lock().await;
    let lease = match slot.take() {
        Some(lease) => lease,
        None => Lease::start(spec.clone()).await?,
    };
    let lease = slot.insert(lease);
    let every = spec.settings.lease_retry_interval;
    let mut attempt = Attempt::leader(spec.name.clone(), side.to_vec(), every, Instant::now());
    let mut next = attempt.first();
    loop {
        let answer = match next {
            Next::Acquire(at) => {
                tokio::time::sleep_until(at).await;
                match lease.acquire().await {
                    Ok(Acquired::Granted { .. }) => Answer::Granted,
                    Ok(Acquired::NotGranted { .. }) => Answer::NotGranted { at: Instant::now() },
                    Err(error) => Answer::Failed {
                        error,
                        at: Instant::now(),
                    },
                }
            }
            Next::Look(at) => {
                tokio::time::sleep_until(at).await;
                read(&spec).await
            }
            Next::Done(decided) => return decided.map(|holder| holder == Holder::Ours),
        };
        next = attempt.step(answer);
    }
}

/// A member of the side other than its leader waits for the leader to win the resolver
/// lease `spec`, reading it every retry interval: `Ok(true)` a member of `side` holds it,
/// `Ok(false)` a running node outside the side holds it, `Err` when nobody held it for two
/// ttls in a row (the side's leader cannot reach the store) or the store failed [`TRIES`]
/// times in a row. When to read again is the [`Attempt`]'s decision.
///
/// [`TRIES`]: super::resolver_attempt::TRIES
pub(super) async fn watch(spec: LeaseSpec, side: &[String]) -> Result<bool, ResolverLeaseError> {
    let mut attempt = Attempt::watcher(
        spec.name.clone(),
        side.to_vec(),
        spec.settings.lease_retry_interval,
        spec.settings.heartbeat_timeout * 2,
        Instant::now(),
    );
    let mut next = attempt.first();
    loop {
        let answer = match next {
            // A watcher never acquires; were it asked to, reading is what it can do.
            Next::Acquire(at) | Next::Look(at) => {
                tokio::time::sleep_until(at).await;
                read(&spec).await
            }
            Next::Done(decided) => return decided.map(|holder| holder == Holder::Ours),
        };
        next = attempt.step(answer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure_lease::{
        AcquireOutcome, AcquireRequest, HeldLease, LeaseSettings, LeaseStore, MemoryStore,
    };

    const SBR: &str = "sys-sbr";

    /// A member lease's settings as the harness clusters have them.
    fn settings() -> LeaseSettings {
        LeaseSettings {
            heartbeat_timeout: Duration::from_secs(3),
            heartbeat_interval: Duration::from_millis(500),
            lease_retry_interval: Duration::from_millis(500),
            safety_margin: Duration::from_millis(300),
            lease_operation_timeout: Duration::from_millis(1500),
            lock_delay: Duration::ZERO,
        }
    }

    fn spec(store: &Arc<dyn LeaseStore>, owner: &str) -> LeaseSpec {
        LeaseSpec::new(SBR, owner, store.clone(), settings()).unwrap()
    }

    /// `owner` takes the resolver lease straight from the store (a grant of a full ttl) and,
    /// with `renew`, keeps renewing it (a running node); without, it never renews (a frozen
    /// or crashed node).
    async fn held_by(store: &Arc<dyn LeaseStore>, owner: &str, renew: bool) {
        let ttl = settings().heartbeat_timeout;
        let req = AcquireRequest {
            name: SBR.into(),
            owner: owner.into(),
            instance: "i".into(),
            ttl,
            ..AcquireRequest::default()
        };
        let record = match store.try_acquire(&req).await.unwrap() {
            AcquireOutcome::Granted(r) => r,
            held => panic!("not granted: {held:?}"),
        };
        if renew {
            let (store, owner) = (store.clone(), owner.to_string());
            let held = HeldLease {
                name: SBR.into(),
                token: record.token,
            };
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(settings().heartbeat_interval).await;
                    let _ = store.renew(&owner, std::slice::from_ref(&held), ttl).await;
                }
            });
        }
    }

    fn store() -> Arc<dyn LeaseStore> {
        Arc::new(MemoryStore::new())
    }

    fn shared() -> SharedLease {
        Arc::new(tokio::sync::Mutex::new(None))
    }

    /// The side of the tests: nodes 2 (its leader) and 3; node 1 is on the other side.
    fn side() -> Vec<String> {
        vec!["127.0.0.1:2".into(), "127.0.0.1:3".into()]
    }

    /// The side's leader (node 2) and its other member (node 3) decide at once, as their
    /// resolvers do: what each concluded.
    async fn decide(store: &Arc<dyn LeaseStore>) -> (Result<bool, String>, Result<bool, String>) {
        let side = side();
        let (leader, member) = tokio::join!(
            acquire(shared(), spec(store, "127.0.0.1:2"), &side),
            watch(spec(store, "127.0.0.1:3"), &side),
        );
        (
            leader.map_err(|e| e.to_string()),
            member.map_err(|e| e.to_string()),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_side_waits_for_a_frozen_holders_grant_to_lapse_and_survives() {
        let store = store();
        held_by(&store, "127.0.0.1:1", false).await;
        let started = Instant::now();
        assert_eq!(decide(&store).await, (Ok(true), Ok(true)));
        assert!(
            started.elapsed() >= settings().heartbeat_timeout,
            "not before the lapse"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_running_holder_on_the_other_side_keeps_it_and_this_side_goes() {
        let store = store();
        held_by(&store, "127.0.0.1:1", true).await;
        assert_eq!(decide(&store).await, (Ok(false), Ok(false)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_grant_held_by_a_member_of_this_side_is_this_sides() {
        let store = store();
        held_by(&store, "127.0.0.1:3", true).await;
        assert_eq!(decide(&store).await, (Ok(true), Ok(true)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_free_lease_goes_to_the_leader_and_its_side() {
        let store = store();
        assert_eq!(decide(&store).await, (Ok(true), Ok(true)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_watcher_whose_leader_never_takes_it_gives_up_after_two_ttls() {
        let store = store();
        let started = Instant::now();
        let seen = watch(spec(&store, "127.0.0.1:3"), &side()).await;
        assert!(seen.is_err(), "{seen:?}");
        assert!(started.elapsed() >= settings().heartbeat_timeout * 2);
    }
}
