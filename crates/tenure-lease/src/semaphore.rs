//! A counting semaphore: at most N holders at a time, each with its own fencing token
//! (Curator's `InterProcessSemaphoreV2`), on every store.
//!
//! Each of the N permits is a lease, `<name>.permit-<k>-of-<N>`, held through the one
//! [`LeaseActor`](crate::LeaseActor): a permit is held, renewed, lost and released exactly
//! as a lease is, and its token is that lease's (it grows from holder to holder of the same
//! permit; a guarded resource fences per permit). The count is part of the names, so that
//! clients configured with different counts are told (the first to see the other's permit
//! gets an error naming both counts) and the history checker finds more than N holders.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{ConfigError, LeaseError};
use crate::handle::Lease;
use crate::names::store_name;
use crate::store::{LeaseRecord, LeaseStore, bounded};
use crate::token::FencingToken;
use crate::{Acquired, LeaseSettings, LeaseSpec};

/// One permit held by this handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permit {
    /// Which permit (0..N).
    pub slot: u32,
    /// The permit's lease name (`<name>.permit-<k>-of-<N>`).
    pub lease: String,
    /// The permit's fencing token.
    pub token: FencingToken,
}

/// The lease name of permit `slot` of semaphore `name` with `permits` permits.
pub fn permit_lease(name: &str, slot: u32, permits: u32) -> String {
    format!("{name}.permit-{slot}-of-{permits}")
}

/// Reads `(semaphore, slot, permits)` back from a permit's lease name, for the history
/// checker; `None` for any other lease name.
pub fn parse_permit_lease(lease: &str) -> Option<(&str, u32, u32)> {
    let (name, rest) = lease.rsplit_once(".permit-")?;
    let (slot, permits) = rest.split_once("-of-")?;
    let (slot, permits) = (slot.parse().ok()?, permits.parse().ok()?);
    (slot < permits).then_some((name, slot, permits))
}

/// A client of the semaphore `name` with `permits` permits, as one owner (its permits are
/// held by LeaseActors of its own; it may hold several).
///
/// Tasks may share one handle (an `Arc<Semaphore>`): its passes run one at a time, so two
/// calls never return the same permit, and each permit a call returns is that call's to
/// release. The permits of one handle share one owner: a guarded resource fences each
/// permit by its own token, not by task. To count holders per task across processes, give
/// each its own handle (and owner).
pub struct Semaphore {
    name: String,
    permits: u32,
    slots: Vec<Lease>,
    store: Arc<dyn LeaseStore>,
    /// The store names of the permits, by slot.
    store_names: Vec<String>,
    /// What every permit's store name starts with, for one `list` per pass.
    prefix: String,
    settings: LeaseSettings,
    /// Held through a pass: a permit's lease is reentrant for its owner, so two passes of
    /// one handle at once could both be granted the same free permit.
    pass: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.name)
            .field("permits", &self.permits)
            .finish()
    }
}

impl Semaphore {
    /// A client of the semaphore `spec.name` with `permits` permits (every client of one
    /// semaphore must give the same count), as `spec.owner`, with `spec`'s store, timing
    /// and observer. `Err(Config)` names `permits` when it is 0; other `Err`: a permit's
    /// LeaseActor could not start.
    pub async fn start(spec: LeaseSpec, permits: u32) -> Result<Semaphore, LeaseError> {
        if permits == 0 {
            return Err(ConfigError::invalid(
                format!("semaphore `{}` permits", spec.name),
                "must be at least 1",
            )
            .into());
        }
        let rules = spec.store.name_rules();
        let mut slots = Vec::with_capacity(permits as usize);
        let mut store_names = Vec::with_capacity(permits as usize);
        for slot in 0..permits {
            let slot_spec = spec.renamed(&permit_lease(&spec.name, slot, permits))?;
            store_names.push(slot_spec.store_name.clone());
            slots.push(Lease::start(slot_spec).await?);
        }
        let wanted = store_name(&format!("{}.permit-", spec.name), &rules);
        let prefix = if store_names.iter().all(|n| n.starts_with(&wanted)) {
            wanted
        } else {
            common_prefix(&store_names)
        };
        Ok(Semaphore {
            name: spec.name,
            permits,
            slots,
            store: spec.store,
            store_names,
            prefix,
            settings: spec.settings,
            pass: tokio::sync::Mutex::new(()),
        })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The number of permits.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// One pass: reads which permits are taken (one store read) and tries the free ones
    /// until one is granted. `Ok(Some)`: this handle holds that permit now (a permit it
    /// held already is not returned twice). `Ok(None)`: every permit is certainly held by
    /// others or by this handle. `Err`: unknown (a permit may have been granted: it lapses
    /// after its ttl unless acquired again), or `Config` when another client holds a
    /// permit of this semaphore with another count.
    pub async fn try_acquire(&self) -> Result<Option<Permit>, LeaseError> {
        let _pass = self.pass.lock().await;
        let taken = self.taken().await?;
        let mut unknown = None;
        for (slot, lease) in self.slots.iter().enumerate() {
            if lease.check_lease() || taken.contains(&self.store_names[slot]) {
                continue;
            }
            match lease.acquire().await {
                Ok(Acquired::Granted { token }) => {
                    return Ok(Some(Permit {
                        slot: slot as u32,
                        lease: lease.name().to_string(),
                        token,
                    }));
                }
                Ok(Acquired::NotGranted { .. }) => {}
                Err(e) => unknown = Some(e),
            }
        }
        match unknown {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }

    /// Passes of [`try_acquire`](Self::try_acquire), `lease-retry-interval` apart, until a
    /// permit is granted (`Ok(Some)`) or `wait` has passed (`Ok(None)`). A pass that fails
    /// (`Err`) is retried while time is left; the last error is returned if no pass
    /// succeeded at all. A `Config` error (counts differ) is returned at once.
    pub async fn acquire(&self, wait: Duration) -> Result<Option<Permit>, LeaseError> {
        let deadline = Instant::now() + wait;
        loop {
            let pass = self.try_acquire().await;
            match pass {
                Ok(Some(permit)) => return Ok(Some(permit)),
                Err(e @ LeaseError::Config(_)) => return Err(e),
                _ => {}
            }
            let now = Instant::now();
            if now >= deadline {
                return pass;
            }
            tokio::time::sleep((deadline - now).min(self.settings.lease_retry_interval)).await;
        }
    }

    /// Releases `permit`. `Ok(true)`: released (another client may take it at once);
    /// `Ok(false)`: this handle did not hold it; `Err`: unknown (it lapses after its ttl),
    /// or `Config` naming a permit of another semaphore or count.
    pub async fn release(&self, permit: &Permit) -> Result<bool, LeaseError> {
        match self.slots.get(permit.slot as usize) {
            Some(lease) if lease.name() == permit.lease => lease.release().await,
            _ => Err(ConfigError::invalid(
                format!("semaphore `{}` permit", self.name),
                format!("{} is not one of its permits", permit.lease),
            )
            .into()),
        }
    }

    /// The permits this handle holds now (each one's lease passes `check_lease`).
    pub fn held(&self) -> Vec<Permit> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(slot, lease)| {
                lease
                    .token()
                    .filter(|_| lease.check_lease())
                    .map(|token| Permit {
                        slot: slot as u32,
                        lease: lease.name().to_string(),
                        token,
                    })
            })
            .collect()
    }

    /// The lease of each permit, by slot: to watch a permit's state or be told of its loss.
    pub fn permit_leases(&self) -> &[Lease] {
        &self.slots
    }

    /// The current grants of this semaphore's permits, as the store holds them.
    pub async fn holders(&self) -> Result<Vec<LeaseRecord>, LeaseError> {
        let listed = self.list().await?;
        Ok(listed
            .into_iter()
            .filter(|r| self.store_names.contains(&r.name))
            .collect())
    }

    async fn list(&self) -> Result<Vec<LeaseRecord>, LeaseError> {
        bounded(
            &self.name,
            "list",
            self.settings.lease_operation_timeout,
            self.store.list(&self.prefix),
        )
        .await
    }

    /// The store names of the permits held now; `Err(Config)` when a permit of this
    /// semaphore with another count is held.
    async fn taken(&self) -> Result<Vec<String>, LeaseError> {
        let listed = self.list().await?;
        let mut taken = Vec::new();
        for record in listed {
            if self.store_names.contains(&record.name) {
                taken.push(record.name);
            } else if let Some((name, _, permits)) = parse_permit_lease(&record.name)
                && name == self.name
                && permits != self.permits
            {
                return Err(ConfigError::invalid(
                    format!("semaphore `{}` permits", self.name),
                    format!(
                        "this client has {} permits, but {} holds {} (a semaphore of {permits})",
                        self.permits, record.owner, record.name
                    ),
                )
                .into());
            }
        }
        Ok(taken)
    }
}

fn common_prefix(names: &[String]) -> String {
    let Some(first) = names.first() else {
        return String::new();
    };
    let mut len = first.len();
    for n in &names[1..] {
        len = len.min(
            first
                .char_indices()
                .zip(n.chars())
                .take_while(|((_, a), b)| a == b)
                .map(|((i, a), _)| i + a.len_utf8())
                .last()
                .unwrap_or(0),
        );
    }
    first[..len].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permit_names_round_trip() {
        let lease = permit_lease("jobs.db", 2, 5);
        assert_eq!(lease, "jobs.db.permit-2-of-5");
        assert_eq!(parse_permit_lease(&lease), Some(("jobs.db", 2, 5)));
        assert_eq!(parse_permit_lease("jobs"), None);
        assert_eq!(parse_permit_lease("jobs.permit-5-of-5"), None);
        assert_eq!(parse_permit_lease("jobs.permit-x-of-5"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn tasks_sharing_a_handle_never_get_the_same_permit() {
        let store = crate::MemoryStore::new();
        let settings = crate::timing_tests::settings();
        let spec = LeaseSpec::new("jobs", "a", Arc::new(store.clone()), settings).unwrap();
        let semaphore = Arc::new(Semaphore::start(spec, 2).await.unwrap());
        // Every answer takes a while, so the second call starts while the first waits.
        store.set_fault(crate::Fault::Delay(Duration::from_millis(20)));
        let (first, second) = tokio::join!(semaphore.try_acquire(), semaphore.try_acquire());
        let (first, second) = (first.unwrap(), second.unwrap());
        let slots = [first.map(|p| p.slot), second.map(|p| p.slot)];
        assert!(
            matches!(slots, [Some(x), Some(y)] if x != y),
            "two calls on one handle: {slots:?}"
        );
        assert_eq!(semaphore.try_acquire().await.unwrap(), None);
    }

    #[test]
    fn common_prefix_of_names() {
        let names = ["ab.permit-0".to_string(), "ab.permit-1".to_string()];
        assert_eq!(common_prefix(&names), "ab.permit-");
        assert_eq!(common_prefix(&["x".to_string()]), "x");
        assert_eq!(common_prefix(&["ab".to_string(), "cd".to_string()]), "");
    }
}
