//! Leader election on one lease, with etcd's Election API (campaign, proclaim, resign,
//! leader, observe) and client-go's leaderelection guarantees.
//!
//! The election is a lease named after it, held through the one [`LeaseActor`]: the
//! leader is its holder, the leader's fencing token is the grant's token, and the value a
//! leader announces is kept with the grant as its note. So an election has every property
//! of a lease on every store: at most one leader believes it leads at any instant, and it
//! stops believing (its [`Lease::check_lease`] turns false, its lost-callback fires)
//! before any other candidate can be elected; tokens only grow; a crashed leader is
//! replaced one ttl (plus any `lock-delay`) after its last renewal.
//!
//! [`LeaseActor`]: crate::LeaseActor

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::error::LeaseError;
use crate::handle::Lease;
use crate::store::{LeaseRecord, LeaseStore, bounded};
use crate::token::FencingToken;
use crate::{Acquired, LeaseSettings, LeaseSpec};

/// The leader of an election as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The leader (the lease's holder).
    pub owner: String,
    /// The value the leader announced (campaign or proclaim), if any.
    pub value: Option<String>,
    /// The leader's fencing token: strictly greater than every earlier leader's.
    pub token: FencingToken,
    /// How long the store keeps the leadership if the leader stops renewing it.
    pub expires_in: Duration,
}

impl From<LeaseRecord> for Leader {
    fn from(r: LeaseRecord) -> Self {
        Leader {
            owner: r.owner,
            value: r.note,
            token: r.token,
            expires_in: r.expires_in,
        }
    }
}

/// One candidate in an election (etcd's `Election`, client-go's `LeaderElector`).
pub struct Election {
    lease: Lease,
    store: Arc<dyn LeaseStore>,
    store_name: String,
    settings: LeaseSettings,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.lease.name())
            .field("owner", &self.lease.owner())
            .finish()
    }
}

impl Election {
    /// A candidate in the election named `spec.name`, as `spec.owner`, through a LeaseActor
    /// of its own. It does nothing until it campaigns. `Err`: the actor could not start.
    pub async fn start(spec: LeaseSpec) -> Result<Election, LeaseError> {
        let store = spec.store.clone();
        let store_name = spec.store_name.clone();
        let settings = spec.settings;
        let lease = Lease::start(spec).await?;
        Ok(Election {
            lease,
            store,
            store_name,
            settings,
        })
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        self.lease.name()
    }

    /// The lease behind the candidacy: [`Lease::check_lease`] is `true` exactly while this
    /// candidate may act as the leader, [`Lease::watch_state`] follows it, and
    /// [`Lease::acquire_with_lost`]'s callback reports the loss of leadership.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Whether this candidate leads now (see [`Lease::check_lease`]).
    pub fn is_leader(&self) -> bool {
        self.lease.check_lease()
    }

    /// Waits until this candidate is the leader, announcing `value`, and returns its
    /// fencing token. Already the leader: the value is proclaimed instead, same token.
    /// `Err(Cancelled)`: resigned meanwhile; other `Err`: as [`Lease::acquire_wait`] (a
    /// failed proclaim of a leader leaves it leading with its old value).
    pub async fn campaign(&self, value: impl Into<String>) -> Result<FencingToken, LeaseError> {
        let value = value.into();
        if self.lease.check_lease() {
            return self.proclaim(value).await;
        }
        self.lease.set_note(Some(value))?;
        self.lease.acquire_wait().await
    }

    /// Announces `value` as the leader's, without a new election: the token stays.
    /// `Ok(token)`: the store holds the new value under `token`; that is the leader's
    /// token, unless the leadership was lost while the call was out (its loss announced
    /// first): then this candidate was elected anew, with a higher token, never the lost
    /// one again. `Err(NotHeld)`: certain, this candidate
    /// is not the leader (nothing changed). Other `Err`: unknown whether the value was
    /// written; the leadership itself is kept or lost as the lease decides.
    pub async fn proclaim(&self, value: impl Into<String>) -> Result<FencingToken, LeaseError> {
        let not_held = || LeaseError::NotHeld {
            name: self.lease.name().to_string(),
        };
        if !self.lease.check_lease() {
            return Err(not_held());
        }
        self.lease.set_note(Some(value.into()))?;
        match self.lease.acquire().await? {
            Acquired::Granted { token } => Ok(token),
            Acquired::NotGranted { .. } => Err(not_held()),
        }
    }

    /// Gives the leadership up (or stops campaigning). `Ok(true)`: this candidate led and
    /// the store released it, so the next candidate is elected at once; `Ok(false)`: it did
    /// not lead; `Err`: unknown (the leadership lapses after its ttl).
    pub async fn resign(&self) -> Result<bool, LeaseError> {
        self.lease.release().await
    }

    /// The current leader as the store holds it (`None`: nobody leads). A leader whose
    /// process died is shown until its grant expires. `Err`: the store did not answer.
    pub async fn leader(&self) -> Result<Option<Leader>, LeaseError> {
        read_leader(
            &*self.store,
            self.lease.name(),
            &self.store_name,
            &self.settings,
        )
        .await
    }

    /// A stream of the election's leaders (see [`LeaderWatch`]), read every
    /// min(`heartbeat-interval`, `lease-retry-interval`) and at once when the store pushes
    /// a change (capability `watch`).
    pub fn observe(&self) -> LeaderWatch {
        observe(
            self.store.clone(),
            self.lease.name().to_string(),
            self.store_name.clone(),
            self.settings,
        )
    }
}

async fn read_leader(
    store: &dyn LeaseStore,
    name: &str,
    store_name: &str,
    settings: &LeaseSettings,
) -> Result<Option<Leader>, LeaseError> {
    let record = bounded(
        name,
        "read",
        settings.lease_operation_timeout,
        store.read(store_name),
    )
    .await?;
    Ok(record.map(Leader::from))
}

/// Observes the election `name` held in `store` as `store_name` (sanitised by the store's
/// name rules) without being a candidate: what `tenure lease observe` uses.
pub fn observe(
    store: Arc<dyn LeaseStore>,
    name: String,
    store_name: String,
    settings: LeaseSettings,
) -> LeaderWatch {
    let (tx, rx) = mpsc::channel(16);
    let task = tokio::spawn(watch_leaders(store, name, store_name, settings, tx));
    LeaderWatch { rx, task }
}

/// The leaders of an election as they change: the first item is the leader when
/// observation started (`None`: nobody), then one item per change seen (another leader,
/// a new token, a new value, or nobody). Changes between two reads may be coalesced;
/// tokens never go back (a read older than one already reported is skipped). A store error
/// is reported as an `Err` item and observation goes on. Dropping the watch stops it.
pub struct LeaderWatch {
    rx: mpsc::Receiver<Result<Option<Leader>, LeaseError>>,
    task: JoinHandle<()>,
}

impl LeaderWatch {
    /// The next change; `None` only if the observing task ended (its runtime shut down).
    pub async fn next(&mut self) -> Option<Result<Option<Leader>, LeaseError>> {
        self.rx.recv().await
    }
}

impl Drop for LeaderWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn watch_leaders(
    store: Arc<dyn LeaseStore>,
    name: String,
    store_name: String,
    settings: LeaseSettings,
    tx: mpsc::Sender<Result<Option<Leader>, LeaseError>>,
) {
    let every = settings
        .heartbeat_interval
        .min(settings.lease_retry_interval);
    // Pushed grants only wake the reader: a proclaimed value is not pushed, so reads go on.
    let mut pushed = match store.as_holder_watch() {
        Some(holders) => holders.watch(&store_name).await.ok(),
        None => None,
    };
    let mut last: Option<Option<Leader>> = None;
    let mut highest = FencingToken::default();
    loop {
        let item = match read_leader(&*store, &name, &store_name, &settings).await {
            Ok(leader) => {
                let stale = leader.as_ref().is_some_and(|l| l.token < highest);
                let same = last.as_ref().is_some_and(|seen| same_leader(seen, &leader));
                if stale || same {
                    None
                } else {
                    if let Some(l) = &leader {
                        highest = l.token;
                    }
                    last = Some(leader.clone());
                    Some(Ok(leader))
                }
            }
            Err(e) => Some(Err(e)),
        };
        if let Some(item) = item
            && tx.send(item).await.is_err()
        {
            return;
        }
        match pushed.as_mut() {
            Some(rx) => tokio::select! {
                event = rx.recv() => if event.is_none() { pushed = None },
                _ = tokio::time::sleep(every) => {}
                _ = tx.closed() => return,
            },
            None => tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = tx.closed() => return,
            },
        }
    }
}

/// The same leadership: owner, token and value (the expiry changes with every renewal).
fn same_leader(a: &Option<Leader>, b: &Option<Leader>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => a.owner == b.owner && a.token == b.token && a.value == b.value,
        _ => false,
    }
}
