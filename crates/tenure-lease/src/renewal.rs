//! Batched renewal: every LeaseActor of one owner on one store renews through one
//! `RenewalBatcher`, which turns the requests of one heartbeat into one store round trip.
//!
//! The LeaseActors' machines decide *when* to renew (they own all timing); the batcher only
//! coalesces. For the requests of many leases to meet, actors renew on a shared grid:
//! instants `epoch + k * heartbeat-interval`.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio::time::{Duration, Instant};

use crate::clock::HolderClock;
use crate::error::LeaseError;
use crate::settings::LeaseSettings;
use crate::store::{HeldLease, LeaseStore, Renewal};

/// The answer to one renewal request: when the batch was sent (on the batcher's
/// [`HolderClock`]), and the store's answer for the lease (`Err`: unknown).
pub(crate) type RenewAnswer = (Instant, Result<Renewal, LeaseError>);

struct RenewRequest {
    lease: HeldLease,
    reply: oneshot::Sender<RenewAnswer>,
}

/// Coalesces renewals of one owner's leases on one store. Cloning shares the batcher.
#[derive(Clone)]
pub struct RenewalBatcher {
    tx: mpsc::UnboundedSender<RenewRequest>,
    epoch: Instant,
    interval: Duration,
    clock: HolderClock,
}

impl std::fmt::Debug for RenewalBatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RenewalBatcher")
            .field("interval", &self.interval)
            .finish()
    }
}

impl RenewalBatcher {
    /// Starts the batcher task for `owner` on `store`, timing on the host's clock. It ends
    /// when every clone is dropped.
    pub fn new(store: Arc<dyn LeaseStore>, owner: String, settings: LeaseSettings) -> Self {
        RenewalBatcher::with_clock(store, owner, settings, HolderClock::host())
    }

    /// Like [`RenewalBatcher::new`], with send instants read from `clock`: the clock of
    /// every LeaseActor renewing through this batcher.
    pub fn with_clock(
        store: Arc<dyn LeaseStore>,
        owner: String,
        settings: LeaseSettings,
        clock: HolderClock,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        // Requests of one grid instant arrive within a short burst; wait that long before
        // sending so they share a round trip. Renewing a little late is harmless: the
        // deadline counts from the send instant, and an interval is < ttl/2.
        let window = (settings.heartbeat_interval / 10).min(Duration::from_millis(200));
        tokio::spawn(run(store, owner, settings, window, clock.clone(), rx));
        RenewalBatcher {
            tx,
            epoch: Instant::now(),
            interval: settings.heartbeat_interval,
            clock,
        }
    }

    /// The clock holder deadlines of this owner are measured on.
    pub fn clock(&self) -> &HolderClock {
        &self.clock
    }

    /// The next renewal instant strictly after `now` on this owner's grid (tokio's clock:
    /// it only schedules).
    pub(crate) fn next_tick(&self, now: Instant) -> Instant {
        let elapsed = now.saturating_duration_since(self.epoch);
        let interval = self.interval.as_nanos().max(1);
        let k = elapsed.as_nanos() / interval + 1;
        let offset = u64::try_from(k * interval).unwrap_or(u64::MAX);
        self.epoch + Duration::from_nanos(offset)
    }

    /// Queues a renewal; the answer arrives on the returned channel (dropped if the batcher
    /// is gone).
    pub(crate) fn renew(&self, lease: HeldLease) -> oneshot::Receiver<RenewAnswer> {
        let (reply, rx) = oneshot::channel();
        // A closed batcher drops `reply`; the caller sees a closed channel.
        let _ = self.tx.send(RenewRequest { lease, reply });
        rx
    }
}

async fn run(
    store: Arc<dyn LeaseStore>,
    owner: String,
    settings: LeaseSettings,
    window: Duration,
    clock: HolderClock,
    mut rx: mpsc::UnboundedReceiver<RenewRequest>,
) {
    while let Some(first) = rx.recv().await {
        tokio::time::sleep(window).await;
        let mut batch = vec![first];
        while let Ok(more) = rx.try_recv() {
            batch.push(more);
        }
        let leases: Vec<HeldLease> = batch.iter().map(|r| r.lease.clone()).collect();
        let sent_at = clock.now();
        let timeout = settings.lease_operation_timeout;
        crate::metrics::store_request("renew");
        let result =
            tokio::time::timeout(timeout, store.renew(&owner, &leases, settings.store_ttl())).await;
        crate::metrics::renewal(store.kind(), clock.now().saturating_duration_since(sent_at));
        tracing::trace!(owner, count = leases.len(), "batched renewal");
        for (i, req) in batch.into_iter().enumerate() {
            let name = req.lease.name;
            let answer = match &result {
                Ok(Ok(answers)) => match answers.get(i) {
                    Some(answer) => Ok(answer.clone()),
                    None => Err(LeaseError::Store {
                        name,
                        operation: "renew",
                        source: crate::error::StoreError::backend(
                            store.kind(),
                            format!(
                                "renew answered {} times for {} leases",
                                answers.len(),
                                leases.len()
                            ),
                        ),
                    }),
                },
                Ok(Err(e)) => Err(LeaseError::Store {
                    name,
                    operation: "renew",
                    source: e.clone(),
                }),
                Err(_) => Err(LeaseError::Timeout {
                    name,
                    operation: "renew",
                    timeout,
                }),
            };
            let _ = req.reply.send((sent_at, answer));
        }
    }
}
