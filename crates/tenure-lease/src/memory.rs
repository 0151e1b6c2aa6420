//! The in-memory store: one process, no persistence. Expiry runs on tokio's clock, so tests
//! of timing logic can use paused time. Faults can be injected to test the layers above.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::LeaseSection;
use crate::error::{ConfigError, StoreError};
use crate::provider::StoreFactory;
use crate::store::{
    AcquireOutcome, AcquireRequest, AcquireStep, Capabilities, ChangeVersion, Changes, FairQueue,
    GrantChanges, HeldLease, LeaseRecord, LeaseStore, PreemptAnswer, PreemptionRequest,
    PreemptionRequests, RememberChange, RememberedIds, Renewal, fair_wait_passed,
};
use crate::token::FencingToken;

/// How the store misbehaves, for tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Fault {
    /// Serve normally.
    #[default]
    None,
    /// Fail every operation at once with [`StoreError::Unavailable`].
    Unavailable,
    /// Never answer (every operation waits forever; callers' timeouts apply).
    Hang,
    /// Fail renewals only; acquire, release and reads work.
    FailRenewals,
    /// Hang renewals only.
    HangRenewals,
    /// Answer every operation after this delay.
    Delay(Duration),
}

#[derive(Debug)]
struct Grant {
    owner: String,
    instance: String,
    token: FencingToken,
    expires_at: Instant,
    version: u64,
    note: Option<String>,
    priority: u64,
    cleanup_timeout: Duration,
    request: Option<PreemptionRequest>,
}

#[derive(Debug, Default)]
struct Backend {
    grants: BTreeMap<String, Grant>,
    /// Highest token ever issued per name; never forgotten.
    counters: HashMap<String, u64>,
    /// Ids remembered per lease name (see [`LeaseStore::remember`]); they never expire.
    remembered: HashMap<String, BTreeSet<String>>,
    fault: Fault,
    renew_calls: u64,
    /// The fair waiters per lease name, first in line first, with the instant each stops
    /// holding its place unless it looks again (see [`FairQueue`]).
    lines: HashMap<String, VecDeque<(u64, Instant)>>,
    /// The id of the next fair waiter.
    next_waiter: u64,
    /// Rung when a grant is released or a waiter leaves its line: the waiters look again.
    bell: Arc<Notify>,
    /// Grants made and ended under each prefix asked about by
    /// [`GrantChanges::changes_since`] (prefixes nobody asked about are not counted).
    changes: BTreeMap<String, u64>,
}

impl Backend {
    /// A grant of `name` was made or ended: every watched prefix of it changed.
    fn changed(&mut self, name: &str) {
        for (prefix, count) in self.changes.iter_mut() {
            if name.starts_with(prefix.as_str()) {
                *count += 1;
            }
        }
    }

    /// Grants `req` by the rules of [`LeaseStore::try_acquire`].
    fn acquire(&mut self, req: &AcquireRequest, now: Instant) -> AcquireOutcome {
        if let Some(g) = self
            .grants
            .get_mut(&req.name)
            .filter(|g| g.expires_at > now)
        {
            let current = record(&req.name, g, now);
            match req.step(Some(&current)) {
                AcquireStep::Held => return AcquireOutcome::Held(current),
                AcquireStep::Extend => {
                    g.expires_at = expiry(now, req.ttl);
                    g.version += 1;
                    let renoted = req.note.is_some() && g.note != req.note;
                    if renoted {
                        g.note = req.note.clone();
                    }
                    let granted = AcquireOutcome::Granted(record(&req.name, g, now));
                    if renoted {
                        self.changed(&req.name);
                    }
                    return granted;
                }
                AcquireStep::NewGrant => {}
            }
        }
        let counter = self.counters.entry(req.name.clone()).or_insert(0);
        *counter += 1;
        let grant = Grant {
            owner: req.owner.clone(),
            instance: req.instance.clone(),
            token: FencingToken::new(*counter),
            expires_at: expiry(now, req.ttl),
            version: 1,
            note: req.note.clone(),
            priority: req.priority,
            cleanup_timeout: req.cleanup_timeout,
            request: None,
        };
        let rec = record(&req.name, &grant, now);
        self.grants.insert(req.name.clone(), grant);
        self.changed(&req.name);
        AcquireOutcome::Granted(rec)
    }

    /// Takes waiter `id` out of the line of `name`.
    fn leave_line(&mut self, name: &str, id: u64) {
        if let Some(line) = self.lines.get_mut(name) {
            line.retain(|(w, _)| *w != id);
            if line.is_empty() {
                self.lines.remove(name);
            }
        }
    }
}

/// An in-process lease store. Handles of one namespace share their leases.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    backend: Arc<Mutex<Backend>>,
}

fn namespaces() -> &'static Mutex<HashMap<String, Arc<Mutex<Backend>>>> {
    static NAMESPACES: OnceLock<Mutex<HashMap<String, Arc<Mutex<Backend>>>>> = OnceLock::new();
    NAMESPACES.get_or_init(Default::default)
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// A store of its own, shared with nobody but clones of this handle.
    pub fn new() -> Self {
        MemoryStore {
            backend: Arc::default(),
        }
    }

    /// A handle on the process-wide namespace `namespace`: every handle opened with the same
    /// namespace sees the same leases and counters (a "restart" is a new handle).
    pub fn shared(namespace: &str) -> Self {
        let mut all = namespaces().lock().unwrap_or_else(|e| e.into_inner());
        MemoryStore {
            backend: all.entry(namespace.to_string()).or_default().clone(),
        }
    }

    /// Makes the store misbehave (for tests of the layers above).
    pub fn set_fault(&self, fault: Fault) {
        self.lock().fault = fault;
    }

    /// How many batched renew calls the store has served.
    pub fn renew_calls(&self) -> u64 {
        self.lock().renew_calls
    }

    /// How many fair waiters are in the line of lease `name` now.
    pub fn fair_waiters(&self, name: &str) -> usize {
        let now = Instant::now();
        self.lock().lines.get(name).map_or(0, |line| {
            line.iter().filter(|(_, until)| *until > now).count()
        })
    }

    /// A write fenced by this store, as the SQLite and PostgreSQL stores fence writes in
    /// their own transactions: `write` runs when `owner` holds `name` with `token`,
    /// unexpired, and no grant, renewal or release of any lease can happen until it
    /// returns. [`FenceError::NotHeld`] when the grant is not current (`write` did not run);
    /// [`FenceError::Store`] when a fault is injected. `write` must not block.
    pub async fn fenced<T>(
        &self,
        name: &str,
        owner: &str,
        token: FencingToken,
        write: impl FnOnce() -> T,
    ) -> Result<T, crate::FenceError> {
        self.fault(false)
            .await
            .map_err(|e| crate::FenceError::Store {
                name: name.to_string(),
                source: e,
            })?;
        let now = Instant::now();
        let b = self.lock();
        let held = b
            .grants
            .get(name)
            .is_some_and(|g| g.owner == owner && g.token == token && g.expires_at > now);
        if !held {
            return Err(crate::FenceError::not_held(name, owner, token));
        }
        // The backend stays locked while `write` runs: no other grant can be made meanwhile.
        let written = write();
        drop(b);
        Ok(written)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Backend> {
        self.backend.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies the configured fault for an operation; `renewal` marks renew calls.
    async fn fault(&self, renewal: bool) -> Result<(), StoreError> {
        let fault = self.lock().fault;
        match fault {
            Fault::Unavailable => Err(unavailable()),
            Fault::FailRenewals if renewal => Err(unavailable()),
            Fault::Hang => std::future::pending().await,
            Fault::HangRenewals if renewal => std::future::pending().await,
            Fault::Delay(d) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

fn unavailable() -> StoreError {
    StoreError::unavailable("memory", "fault injected")
}

/// `now + ttl`, saturating far in the future instead of overflowing.
fn expiry(now: Instant, ttl: Duration) -> Instant {
    now.checked_add(ttl)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}

fn record(name: &str, g: &Grant, now: Instant) -> LeaseRecord {
    LeaseRecord {
        name: name.to_string(),
        owner: g.owner.clone(),
        instance: g.instance.clone(),
        token: g.token,
        expires_in: g.expires_at.saturating_duration_since(now),
        version: g.version,
        note: g.note.clone(),
        priority: g.priority,
        cleanup_timeout: g.cleanup_timeout,
        request: g.request.clone(),
    }
}

#[async_trait]
impl LeaseStore for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_fencing: false,
            server_side_expiry: true,
            durable: false,
        }
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome, StoreError> {
        self.fault(false).await?;
        Ok(self.lock().acquire(req, Instant::now()))
    }

    async fn renew(
        &self,
        owner: &str,
        leases: &[HeldLease],
        ttl: Duration,
    ) -> Result<Vec<Renewal>, StoreError> {
        self.fault(true).await?;
        let now = Instant::now();
        let mut b = self.lock();
        b.renew_calls += 1;
        Ok(leases
            .iter()
            .map(|l| match b.grants.get_mut(&l.name) {
                Some(g) if g.owner == owner && g.token == l.token && g.expires_at > now => {
                    // A forceful request pending: the grant ends at its current expiry.
                    match &g.request {
                        Some(r) if r.forceful => Renewal::Refused(r.clone()),
                        request => {
                            let request = request.clone();
                            g.expires_at = expiry(now, ttl);
                            g.version += 1;
                            Renewal::Renewed { request }
                        }
                    }
                }
                _ => Renewal::NotHeld,
            })
            .collect())
    }

    async fn release(
        &self,
        name: &str,
        owner: &str,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        self.fault(false).await?;
        let now = Instant::now();
        let mut b = self.lock();
        match b.grants.get(name) {
            Some(g) if g.owner == owner && g.token == token && g.expires_at > now => {
                b.grants.remove(name);
                b.changed(name);
                b.bell.notify_waiters();
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn read(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError> {
        self.fault(false).await?;
        let now = Instant::now();
        let b = self.lock();
        Ok(b.grants
            .get(name)
            .filter(|g| g.expires_at > now)
            .map(|g| record(name, g, now)))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        self.fault(false).await?;
        let now = Instant::now();
        let b = self.lock();
        Ok(b.grants
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter(|(_, g)| g.expires_at > now)
            .map(|(k, g)| record(k, g, now))
            .collect())
    }

    crate::capability_accessors!(
        fair_queue,
        preemption_requests,
        remembered_ids,
        grant_changes
    );
}

/// A fair waiter's place in line, given up when its acquire ends (granted, timed out,
/// failed or cancelled).
struct Place<'a> {
    store: &'a MemoryStore,
    name: &'a str,
    id: u64,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut b = self.store.lock();
        b.leave_line(self.name, self.id);
        // The waiter behind may be first now.
        b.bell.notify_waiters();
    }
}

/// The line is one queue per lease name in the backend; a waiter first in line acquires by
/// the rules of `try_acquire`. Waiters are woken by releases and by waiters leaving the
/// line, and the first in line also when the holder's grant expires. A waiter looks again
/// at least every third of its ttl, keeping its place for a ttl from each look: one whose
/// task is gone without its future being dropped stops holding the line a ttl later.
#[async_trait]
impl FairQueue for MemoryStore {
    async fn acquire_fair(
        &self,
        req: &AcquireRequest,
        wait: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        self.fault(false).await?;
        let deadline = expiry(Instant::now(), wait);
        let id = {
            let mut b = self.lock();
            b.next_waiter += 1;
            let id = b.next_waiter;
            b.lines
                .entry(req.name.clone())
                .or_default()
                .push_back((id, expiry(Instant::now(), req.ttl)));
            id
        };
        let place = Place {
            store: self,
            name: &req.name,
            id,
        };
        let mut seen = None;
        loop {
            let bell = self.lock().bell.clone();
            let rung = bell.notified();
            let mut rung = std::pin::pin!(rung);
            // Registered before looking, so that a release right after the look wakes it.
            rung.as_mut().enable();
            let now = Instant::now();
            let wake_at = {
                let mut b = self.lock();
                // A waiter whose task is gone without leaving (a process that died, in a
                // real store) stops holding the line one ttl after it last looked.
                let line = b.lines.entry(req.name.clone()).or_default();
                line.retain(|(w, until)| *w == id || *until > now);
                for (w, until) in line.iter_mut() {
                    if *w == id {
                        *until = expiry(now, req.ttl);
                    }
                }
                let ahead = line
                    .front()
                    .filter(|(w, _)| *w != id)
                    .map(|(_, until)| *until);
                let look_again = expiry(now, req.ttl / 3).min(deadline);
                if ahead.is_none() {
                    match b.acquire(req, now) {
                        AcquireOutcome::Granted(record) => {
                            drop(b);
                            drop(place);
                            return Ok(AcquireOutcome::Granted(record));
                        }
                        AcquireOutcome::Held(holder) => {
                            let expires = expiry(now, holder.expires_in);
                            seen = Some(holder);
                            expires.min(look_again)
                        }
                    }
                } else {
                    ahead.map_or(look_again, |until| until.min(look_again))
                }
            };
            if now >= deadline {
                drop(place);
                return fair_wait_passed("memory", req, wait, seen, async || {
                    self.read(&req.name).await
                })
                .await;
            }
            tokio::select! {
                () = rung => {}
                () = tokio::time::sleep_until(wake_at) => {}
            }
        }
    }
}

#[async_trait]
impl PreemptionRequests for MemoryStore {
    async fn request_preemption(
        &self,
        name: &str,
        token: FencingToken,
        request: &PreemptionRequest,
    ) -> Result<PreemptAnswer, StoreError> {
        self.fault(false).await?;
        let now = Instant::now();
        let mut b = self.lock();
        Ok(match b.grants.get_mut(name) {
            Some(g) if g.token == token && g.expires_at > now => {
                if request.may_replace(g.priority, g.request.as_ref()) {
                    g.request = Some(request.clone());
                    PreemptAnswer::Recorded(record(name, g, now))
                } else {
                    PreemptAnswer::Refused(record(name, g, now))
                }
            }
            _ => PreemptAnswer::Gone,
        })
    }

    async fn withdraw_preemption(
        &self,
        name: &str,
        token: FencingToken,
        by: &str,
    ) -> Result<bool, StoreError> {
        self.fault(false).await?;
        let now = Instant::now();
        let mut b = self.lock();
        Ok(match b.grants.get_mut(name) {
            Some(g)
                if g.token == token
                    && g.expires_at > now
                    && g.request.as_ref().is_some_and(|r| r.by == by) =>
            {
                g.request = None;
                true
            }
            _ => false,
        })
    }
}

#[async_trait]
impl RememberedIds for MemoryStore {
    /// Checks and applies under one lock: atomic, whatever the change's size.
    async fn remember(
        &self,
        name: &str,
        owner: &str,
        token: FencingToken,
        change: &RememberChange,
    ) -> Result<bool, StoreError> {
        self.fault(false).await?;
        let now = Instant::now();
        let mut b = self.lock();
        let held = b
            .grants
            .get(name)
            .is_some_and(|g| g.owner == owner && g.token == token && g.expires_at > now);
        if held {
            let ids = b.remembered.entry(name.to_string()).or_default();
            ids.extend(change.added().iter().cloned());
            ids.retain(|id| !change.removed().contains(id));
            if ids.is_empty() {
                b.remembered.remove(name);
            }
        }
        Ok(held)
    }

    async fn remembered(&self, name: &str) -> Result<Vec<String>, StoreError> {
        self.fault(false).await?;
        let b = self.lock();
        Ok(b.remembered
            .get(name)
            .map(|ids| ids.iter().cloned().collect())
            .unwrap_or_default())
    }
}

/// Opens `store = "memory"` sections. Option: `namespace` (handles with the same namespace
/// in one process share leases; default: the section name).
#[derive(Debug, Default, Clone, Copy)]
pub struct MemoryStoreFactory;

#[async_trait]
impl StoreFactory for MemoryStoreFactory {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn check(&self, section: &LeaseSection) -> Result<(), ConfigError> {
        namespace(section).map(drop)
    }

    async fn open(&self, section: &LeaseSection) -> Result<Arc<dyn LeaseStore>, ConfigError> {
        Ok(Arc::new(MemoryStore::shared(&namespace(section)?)))
    }
}

/// The options of a `store = "memory"` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct MemoryOptions {
    /// `namespace`; when not set, the section name.
    #[serde(default)]
    namespace: Option<String>,
}

/// The section's `namespace` option; without one, the section name.
fn namespace(section: &LeaseSection) -> Result<String, ConfigError> {
    let options: MemoryOptions = section.options()?;
    Ok(options.namespace.unwrap_or_else(|| section.name.clone()))
}

/// Nanoseconds of tokio's clock since the first change check of the process: the `at` of
/// this store's [`ChangeVersion`]s.
fn clock_ns(at: Instant) -> i64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    i64::try_from(at.saturating_duration_since(epoch).as_nanos()).unwrap_or(i64::MAX)
}

#[async_trait]
impl GrantChanges for MemoryStore {
    /// The prefix's count of grants made and ended (counted from its first check), and
    /// whether a grant under it expired since `since.at` (expiry writes nothing).
    async fn changes_since(
        &self,
        prefix: &str,
        since: Option<ChangeVersion>,
    ) -> Result<Changes, StoreError> {
        self.fault(false).await?;
        let now = Instant::now();
        let at = clock_ns(now);
        let mut b = self.lock();
        let changes = *b.changes.entry(prefix.to_string()).or_insert(0);
        let version = ChangeVersion { changes, at };
        let Some(since) = since else {
            return Ok(Changes::Changed(version));
        };
        let expired = b
            .grants
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .any(|(_, g)| {
                let expires = clock_ns(g.expires_at);
                expires > since.at && g.expires_at <= now
            });
        Ok(if since.changes == changes && !expired && since.at <= at {
            Changes::Unchanged(version)
        } else {
            Changes::Changed(version)
        })
    }
}
