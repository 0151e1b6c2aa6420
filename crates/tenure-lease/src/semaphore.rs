//! A counting semaphore: at most N holders at a time, each with its own fencing token
//! (Curator's `InterProcessSemaphoreV2`), on every store.
//!
//! Each of the N permits is a lease, `<name>.permit-<k>-of-<N>`, held through the one
//! [`LeaseActor`](crate::LeaseActor): a permit is held, renewed, lost and released exactly
//! as a lease is, and its token is that lease's (it grows from holder to holder of the same
//! permit; a guarded resource fences per permit). The count is part of the names, so that
//! clients configured with different counts are told (the first to see the other's permit
//! gets an error naming both counts) and the history checker finds more than N holders.
//!
//! Waiting is first come, first served (as Curator's semaphore, which waits behind a lock):
//! the waiters of one handle line up in order of arrival, and the waiters of every client
//! behind the lease `<name>.line`, which a waiter holds while it waits for a permit. On a
//! store with a fair queue that line is fair, and the first in line waits in the line of
//! every permit at once, so that a release wakes it (no polling).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::{Instant, timeout_at};

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
    /// The waiters of this handle, in order of arrival (tokio's mutex is fair).
    local_line: tokio::sync::Mutex<()>,
    /// The line of every client: held by the waiter that waits for a permit.
    line: Lease,
    /// The slots the first in line waits for: passes leave them alone.
    waited: Mutex<HashSet<usize>>,
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
        let line = Lease::start(spec.renamed(&format!("{}.line", spec.name))?).await?;
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
            local_line: tokio::sync::Mutex::new(()),
            line,
            waited: Mutex::new(HashSet::new()),
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
        let waited = lock(&self.waited).clone();
        let mut unknown = None;
        for (slot, lease) in self.slots.iter().enumerate() {
            if lease.check_lease()
                || taken.contains(&self.store_names[slot])
                || waited.contains(&slot)
            {
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

    /// Waits for a permit, first come, first served, until one is granted (`Ok(Some)`) or
    /// `wait` has passed (`Ok(None)`). A call that finds no free permit lines up behind the
    /// calls of this handle and of every client that came before it (see the module docs);
    /// the first in line is woken by a release on a store with a fair queue, and looks
    /// again every `lease-retry-interval` on others. A pass that fails (`Err`) is retried
    /// while time is left; the last error is returned if no pass succeeded at all. A
    /// `Config` error (counts differ) is returned at once. Dropping the future gives up the
    /// place in line and any permit granted to it meanwhile.
    pub async fn acquire(&self, wait: Duration) -> Result<Option<Permit>, LeaseError> {
        let deadline = crate::duration::later(Instant::now(), wait);
        let first = self.try_acquire().await;
        match first {
            Ok(Some(permit)) => return Ok(Some(permit)),
            Err(e @ LeaseError::Config(_)) => return Err(e),
            _ => {}
        }
        let Ok(_local) = timeout_at(deadline, self.local_line.lock()).await else {
            return first;
        };
        let line = InLine(&self.line);
        match timeout_at(deadline, self.line.acquire_wait()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return first,
        }
        let got = self.first_in_line(deadline, first).await;
        drop(line);
        got
    }

    /// The first in line's wait: a pass, then a wait in the line of every permit this
    /// handle does not hold (on a store without a fair queue, attempts every
    /// `lease-retry-interval`), until a permit is granted or `deadline`.
    async fn first_in_line(
        &self,
        deadline: Instant,
        mut last: Result<Option<Permit>, LeaseError>,
    ) -> Result<Option<Permit>, LeaseError> {
        loop {
            match self.try_acquire().await {
                Ok(Some(permit)) => return Ok(Some(permit)),
                Err(e @ LeaseError::Config(_)) => return Err(e),
                Ok(None) => last = Ok(None),
                Err(e) => {
                    if last.is_err() {
                        last = Err(e);
                    }
                }
            }
            if Instant::now() >= deadline {
                return last;
            }
            let waits = {
                let _pass = self.pass.lock().await;
                let slots: Vec<usize> = (0..self.slots.len())
                    .filter(|&slot| !self.slots[slot].check_lease())
                    .collect();
                lock(&self.waited).extend(slots.iter().copied());
                Waits {
                    semaphore: self,
                    slots,
                }
            };
            let mut tasks = JoinSet::new();
            for &slot in &waits.slots {
                let lease = self.slots[slot].clone();
                tasks.spawn(async move { (slot, lease.acquire_wait().await) });
            }
            let won = match timeout_at(deadline, tasks.join_next()).await {
                Ok(Some(Ok((slot, Ok(token))))) => Some((slot, token)),
                _ => None,
            };
            tasks.abort_all();
            if let Some(permit) = waits.end(won).await {
                return Ok(Some(permit));
            }
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

/// The place of a waiter holding the line: given up when it is dropped (granted, timed
/// out, or its future dropped).
struct InLine<'a>(&'a Lease);

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        self.0.release_in_background();
    }
}

/// The slots the first in line waits for. Ended, it keeps the permit won and gives the
/// others back; dropped before (the future dropped), it gives them all back.
struct Waits<'a> {
    semaphore: &'a Semaphore,
    slots: Vec<usize>,
}

impl Waits<'_> {
    /// Gives back every waited slot but `won`, and returns `won`'s permit.
    async fn end(mut self, won: Option<(usize, FencingToken)>) -> Option<Permit> {
        let semaphore = self.semaphore;
        let slots = std::mem::take(&mut self.slots);
        let _pass = semaphore.pass.lock().await;
        for &slot in &slots {
            if won.is_some_and(|(w, _)| w == slot) {
                continue;
            }
            // Cancels the slot's wait, or gives back a grant that came meanwhile.
            let _ = semaphore.slots[slot].release().await;
        }
        lock(&semaphore.waited).retain(|s| !slots.contains(s));
        won.map(|(slot, token)| Permit {
            slot: slot as u32,
            lease: semaphore.slots[slot].name().to_string(),
            token,
        })
    }
}

impl Drop for Waits<'_> {
    fn drop(&mut self) {
        for &slot in &self.slots {
            self.semaphore.slots[slot].release_in_background();
        }
        lock(&self.semaphore.waited).retain(|s| !self.slots.contains(s));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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

    /// A semaphore of one permit as `owner`, whose clients look again every 5 s.
    async fn client(store: &crate::MemoryStore, owner: &str) -> Arc<Semaphore> {
        let mut settings = crate::timing_tests::settings();
        settings.lease_retry_interval = Duration::from_secs(5);
        let spec = LeaseSpec::new("jobs", owner, Arc::new(store.clone()), settings).unwrap();
        Arc::new(Semaphore::start(spec, 1).await.unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_is_woken_by_a_release_not_by_the_next_look() {
        let store = crate::MemoryStore::new();
        let holder = client(&store, "holder").await;
        let permit = holder.try_acquire().await.unwrap().unwrap();
        let waiter = client(&store, "waiter").await;
        let w = waiter.clone();
        let waiting = tokio::spawn(async move {
            let got = w.acquire(Duration::from_secs(60)).await;
            (got, Instant::now())
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let released = Instant::now();
        assert!(holder.release(&permit).await.unwrap());
        let (got, at) = waiting.await.unwrap();
        assert_eq!(got.unwrap().map(|p| p.slot), Some(0));
        // Paused time: only a timer can move the clock, and the next look is 5 s away.
        assert!(
            at - released < Duration::from_secs(1),
            "granted {:?} after the release",
            at - released
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_waiter_that_came_first_gets_the_permit_first() {
        let store = crate::MemoryStore::new();
        let holder = client(&store, "holder").await;
        let permit = holder.try_acquire().await.unwrap().unwrap();
        let (tx, mut got) = tokio::sync::mpsc::unbounded_channel();
        // `first` waits from 0 s, `second` from 1 s; looking again every 5 s, `second`
        // would look at 6 s, before `first` at 10 s, and take the permit released at 5.5 s.
        let mut clients = Vec::new();
        for (i, owner) in ["first", "second"].into_iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let client = client(&store, owner).await;
            let (c, tx) = (client.clone(), tx.clone());
            tokio::spawn(async move {
                if let Ok(Some(permit)) = c.acquire(Duration::from_secs(60)).await {
                    let _ = tx.send((owner, permit));
                }
            });
            clients.push(client);
        }
        tokio::time::sleep(Duration::from_millis(4500)).await;
        assert!(holder.release(&permit).await.unwrap());
        let (owner, permit) = got.recv().await.unwrap();
        assert_eq!(owner, "first");
        assert!(clients[0].release(&permit).await.unwrap());
        assert_eq!(got.recv().await.map(|(o, _)| o), Some("second"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_gives_up_leaves_no_permit_or_place_behind() {
        let store = crate::MemoryStore::new();
        let holder = client(&store, "holder").await;
        let permit = holder.try_acquire().await.unwrap().unwrap();
        let quitter = client(&store, "quitter").await;
        assert_eq!(quitter.acquire(Duration::from_secs(2)).await.unwrap(), None);
        let dropped = tokio::time::timeout(
            Duration::from_secs(2),
            quitter.acquire(Duration::from_secs(60)),
        )
        .await;
        assert!(dropped.is_err(), "{dropped:?}");
        let later = client(&store, "later").await;
        let l = later.clone();
        let waiting = tokio::spawn(async move { l.acquire(Duration::from_secs(60)).await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(holder.release(&permit).await.unwrap());
        assert_eq!(waiting.await.unwrap().unwrap().map(|p| p.slot), Some(0));
        assert!(quitter.held().is_empty());
    }

    #[test]
    fn common_prefix_of_names() {
        let names = ["ab.permit-0".to_string(), "ab.permit-1".to_string()];
        assert_eq!(common_prefix(&names), "ab.permit-");
        assert_eq!(common_prefix(&["x".to_string()]), "x");
        assert_eq!(common_prefix(&["ab".to_string(), "cd".to_string()]), "");
    }
}
