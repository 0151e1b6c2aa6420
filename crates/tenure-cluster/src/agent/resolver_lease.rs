//! The resolver lease of lease-majority (`<system>-sbr`) as one side of a partition sees
//! it: the side's leader tries to acquire it, the side's other members watch it, and both
//! judge from the store's record of it whether their side holds it ([`Judge`]).
//!
//! A grant held by a node outside the side decides against the side only once its holder
//! shows that it runs: the grant is still held past the latest instant it could have lapsed
//! unrenewed, or another node outside the side took a new grant. A frozen or crashed
//! node's grant lapses unrenewed; a side that can run must not down itself for it, so the
//! side looks again until that grant has lapsed (at most one ttl and the store's slack).

use std::sync::Arc;
use std::time::Duration;

use tenure_lease::store::bounded;
use tenure_lease::{
    Acquired, ConfigError, FencingToken, Lease, LeaseError, LeaseRecord, LeaseSpec,
};
use tokio::time::Instant;

/// The resolver lease handle, shared with the task that releases it (one handle for the
/// node's life, so that acquiring again re-enters).
pub(super) type SharedLease = Arc<tokio::sync::Mutex<Option<Lease>>>;

/// How many store errors in a row end an attempt with `Err`.
const TRIES: u32 = 3;

/// Why a side could not learn whether it holds the resolver lease.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ResolverLeaseError {
    /// The resolver lease's name or settings were refused.
    #[error("the resolver lease cannot be set up: {0}")]
    Spec(#[source] ConfigError),
    /// The store failed [`TRIES`] times in a row (the error names the lease).
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

/// One read of the resolver lease's record (`None`: nobody holds it), with the instants
/// the read was sent and answered.
#[derive(Debug, Clone)]
pub(crate) struct Look {
    pub(crate) record: Option<LeaseRecord>,
    pub(crate) sent: Instant,
    pub(crate) answered: Instant,
}

/// What the looks so far tell a side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A member of the side holds it: the side survives.
    Ours,
    /// A running node outside the side holds it: the side goes.
    Theirs,
    /// Nobody holds it, or a grant outside the side may yet lapse unrenewed: look again.
    Undecided,
}

/// The first grant seen held outside the side: whose, and the latest instant it lapses
/// unless renewed.
#[derive(Debug, Clone)]
struct Outsider {
    owner: String,
    token: FencingToken,
    lapses_by: Instant,
}

/// Judges one attempt's looks at the resolver lease. Pure: the instants come with the
/// looks.
#[derive(Debug)]
pub(crate) struct Judge {
    /// The members of this side (their addresses, the lease's owners).
    side: Vec<String>,
    /// How long past its expiry a store may still show a grant that lapsed (its clock's
    /// granularity; the lease's retry interval).
    slack: Duration,
    outsider: Option<Outsider>,
}

impl Judge {
    pub(crate) fn new(side: Vec<String>, slack: Duration) -> Judge {
        Judge {
            side,
            slack,
            outsider: None,
        }
    }

    pub(crate) fn judge(&mut self, look: &Look) -> Verdict {
        let Some(record) = &look.record else {
            return Verdict::Undecided;
        };
        if self.side.contains(&record.owner) {
            return Verdict::Ours;
        }
        match &self.outsider {
            None => {
                // The store measured `expires_in` between sending and answering: the grant
                // lapses unrenewed by `answered + expires_in` at the latest.
                self.outsider = Some(Outsider {
                    owner: record.owner.clone(),
                    token: record.token,
                    lapses_by: look.answered + record.expires_in,
                });
                Verdict::Undecided
            }
            Some(first) if first.owner == record.owner && first.token == record.token => {
                if look.sent > first.lapses_by + self.slack {
                    // Still held past its expiry: renewed, so its holder runs.
                    Verdict::Theirs
                } else {
                    Verdict::Undecided
                }
            }
            // A new grant outside the side: a running node took it.
            Some(_) => Verdict::Theirs,
        }
    }
}

/// Reads the resolver lease's record, bounded by the lease's operation timeout.
async fn look(spec: &LeaseSpec) -> Result<Look, LeaseError> {
    let sent = Instant::now();
    let record = bounded(
        &spec.name,
        "read",
        spec.settings.lease_operation_timeout,
        spec.store.read(&spec.store_name),
    )
    .await?;
    Ok(Look {
        record,
        sent,
        answered: Instant::now(),
    })
}

/// The side's leader acquires the resolver lease `spec` for `side` (whose members' addresses
/// are the lease's owners). `Ok(true)`: this node or another member of the side holds it;
/// `Ok(false)`: a running node outside the side holds it; `Err` when the store failed
/// [`TRIES`] times in a row. A grant outside the side that lapses unrenewed is waited out,
/// then acquired.
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
    let mut judge = Judge::new(side.to_vec(), every);
    let mut failures = 0;
    loop {
        let seen = match lease.acquire().await {
            Ok(Acquired::Granted { .. }) => return Ok(true),
            Ok(Acquired::NotGranted { .. }) => look(&spec).await,
            Err(e) => Err(e),
        };
        match seen {
            Ok(seen) => {
                failures = 0;
                match judge.judge(&seen) {
                    Verdict::Ours => return Ok(true),
                    Verdict::Theirs => return Ok(false),
                    Verdict::Undecided => {}
                }
            }
            Err(e) => {
                failures += 1;
                if failures == TRIES {
                    return Err(e.into());
                }
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// A member of the side other than its leader waits for the leader to win the resolver
/// lease `spec`, reading it every retry interval: `Ok(true)` a member of `side` holds it,
/// `Ok(false)` a running node outside the side holds it, `Err` when nobody held it for two
/// ttls in a row (the side's leader cannot reach the store) or the store failed [`TRIES`]
/// times in a row.
pub(super) async fn watch(spec: LeaseSpec, side: &[String]) -> Result<bool, ResolverLeaseError> {
    let every = spec.settings.lease_retry_interval;
    let give_up_after = spec.settings.heartbeat_timeout * 2;
    let mut judge = Judge::new(side.to_vec(), every);
    let mut failures = 0;
    let mut free_since = Instant::now();
    loop {
        match look(&spec).await {
            Ok(seen) => {
                failures = 0;
                match judge.judge(&seen) {
                    Verdict::Ours => return Ok(true),
                    Verdict::Theirs => return Ok(false),
                    Verdict::Undecided if seen.record.is_some() => free_since = seen.answered,
                    Verdict::Undecided => {
                        let waited = seen.answered.saturating_duration_since(free_since);
                        if waited >= give_up_after {
                            return Err(ResolverLeaseError::Unheld {
                                lease: spec.name.clone(),
                                waited,
                            });
                        }
                    }
                }
            }
            Err(e) => {
                failures += 1;
                if failures == TRIES {
                    return Err(e.into());
                }
            }
        }
        tokio::time::sleep(every).await;
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

    fn look(record: Option<&LeaseRecord>, sent: Instant, answered: Instant) -> Look {
        Look {
            record: record.cloned(),
            sent,
            answered,
        }
    }

    fn record(owner: &str, token: u64, expires_in: Duration) -> LeaseRecord {
        LeaseRecord {
            name: SBR.into(),
            owner: owner.into(),
            token: FencingToken::new(token),
            expires_in,
            version: 1,
            ..LeaseRecord::default()
        }
    }

    /// The judge alone: a grant outside the side is the other side's only once it is still
    /// held past the latest instant it could lapse (plus the slack), or replaced by another.
    #[test]
    fn an_outsiders_grant_decides_only_once_it_outlives_its_expiry() {
        let side = side();
        let slack = Duration::from_millis(500);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let frozen = record("127.0.0.1:1", 7, Duration::from_secs(2));
        let mut judge = Judge::new(side.clone(), slack);
        // First seen answered at 100 ms: it lapses by 2.1 s unless renewed.
        assert_eq!(
            judge.judge(&look(Some(&frozen), at(0), at(100))),
            Verdict::Undecided
        );
        assert_eq!(
            judge.judge(&look(Some(&frozen), at(2_600), at(2_650))),
            Verdict::Undecided
        );
        assert_eq!(
            judge.judge(&look(None, at(2_700), at(2_750))),
            Verdict::Undecided
        );
        assert_eq!(
            judge.judge(&look(Some(&frozen), at(2_601), at(2_650))),
            Verdict::Theirs
        );
        let mut judge = Judge::new(side.clone(), slack);
        judge.judge(&look(Some(&frozen), at(0), at(100)));
        let retaken = record("127.0.0.1:1", 8, Duration::from_secs(3));
        assert_eq!(
            judge.judge(&look(Some(&retaken), at(500), at(600))),
            Verdict::Theirs
        );
        let ours = record("127.0.0.1:3", 9, Duration::from_secs(3));
        assert_eq!(
            Judge::new(side.clone(), slack).judge(&look(Some(&ours), at(0), at(1))),
            Verdict::Ours
        );
    }
}
