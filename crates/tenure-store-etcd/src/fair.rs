//! Fair acquire, etcd's concurrency `Mutex` recipe on top of the holder key: a waiter key
//! attached to the waiter's session joins a line ordered by create revision; each waiter
//! watches only the one before it (no herd), and the first in line acquires the holder
//! key as [`try_acquire`](tenure_lease::LeaseStore::try_acquire) does, so both agree on
//! who holds the lease.
//!
//! The waiter key is removed when the grant arrives, when `wait` passes, and when the
//! future is dropped, also while its join is still being answered; if that fails it goes
//! with the session.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, SortOrder, SortTarget, Txn, TxnOp, WatchOptions,
};
use tenure_lease::store::{LeaveOnDrop, fair_wait_passed};
use tenure_lease::{AcquireOutcome, AcquireRequest, StoreError};

use crate::error::etcd_error;
use crate::store::{Inner, put_leased};

fn queue_error(name: &str, detail: String) -> StoreError {
    StoreError::unavailable("etcd", format!("fair acquire of {name}: {detail}"))
}

impl Inner {
    pub(crate) async fn acquire_fair(
        self: &Arc<Self>,
        req: &AcquireRequest,
        wait: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        let name = req.name.as_str();
        let deadline = self.clock.now() + wait;
        let session = self.sessions.ready(&req.owner, req.ttl).await?;
        let key = self.layout.waiter(name, session.id, &req.instance);
        // The join runs in a task of its own, which makes the guard that removes the waiter
        // key and answers it with the join: a waiter dropped while the answer is on its way
        // (the key put on the server) would otherwise leave the key in line for as long as
        // its session lives, and every later waiter behind it. A spawned task runs on when
        // its `JoinHandle` is dropped and drops an answer nobody awaits; that, or an `Err`
        // (the put may have happened), drops the guard, which removes the key. Its delete
        // is sent only once the join was answered, so it cannot overtake the put.
        let join = tokio::spawn({
            let (inner, key) = (self.clone(), key.clone());
            let put = put_leased(key.clone(), req.owner.clone(), session.id);
            async move {
                let entry = LeaveOnDrop::new({
                    let (client, key) = (inner.client.clone(), key.clone());
                    move || async move {
                        if let Err(e) = client.kv_client().delete(key.clone(), None).await {
                            tracing::warn!(key, error = %e, "could not remove a fair-acquire waiter key; it goes with its session");
                        }
                    }
                });
                let joined = inner
                    .txn(
                        Txn::new()
                            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                            .and_then([put])
                            .or_else([TxnOp::get(key.clone(), None)]),
                        "fair acquire (join the line)",
                        &key,
                    )
                    .await;
                (entry, joined)
            }
        });
        let (mut entry, joined) = join.await.map_err(|e| {
            queue_error(name, format!("the join of the line was not answered: {e}"))
        })?;
        let joined = joined?;
        let my_rev = if joined.succeeded() {
            joined.header().map(|h| h.revision()).unwrap_or(0)
        } else {
            Self::got(&joined, 0)
                .first()
                .map(|kv| kv.create_revision())
                .ok_or_else(|| queue_error(name, "the waiter key vanished".into()))?
        };
        // Wake up at least this often: to keep the session alive while waiting, and to
        // re-judge a holder that expires by the revision clock rather than by deletion.
        let pace = (req.ttl / 3).max(Duration::from_millis(50));
        loop {
            let now = self.clock.now();
            let current = self.sessions.ready(&req.owner, req.ttl).await?;
            if current.id != session.id {
                return Err(queue_error(
                    name,
                    "the waiter's session expired while queued".into(),
                ));
            }
            let line = self
                .txn(
                    Txn::new().and_then([
                        TxnOp::get(key.clone(), None),
                        TxnOp::get(
                            self.layout.waiters(name),
                            Some(
                                GetOptions::new()
                                    .with_prefix()
                                    .with_max_create_revision(my_rev - 1)
                                    .with_sort(SortTarget::Create, SortOrder::Descend)
                                    .with_limit(1),
                            ),
                        ),
                    ]),
                    "fair acquire (read the line)",
                    &key,
                )
                .await?;
            let revision = line.header().map(|h| h.revision()).unwrap_or(0);
            if Self::got(&line, 0).is_empty() {
                return Err(queue_error(
                    name,
                    "the waiter key is gone (session expired or revoked) while queued".into(),
                ));
            }
            let step = deadline.saturating_duration_since(now).min(pace);
            if let Some(before) = Self::got(&line, 1).into_iter().next() {
                if step.is_zero() {
                    return fair_wait_passed("etcd", req, wait, None, async || {
                        self.read(&req.name).await
                    })
                    .await;
                }
                let before = String::from_utf8_lossy(before.key()).into_owned();
                self.wait_for_change(&before, revision + 1, step).await?;
                continue;
            }
            // First in line.
            match self.try_acquire_in(req, Some(session.id)).await? {
                AcquireOutcome::Granted(record) => {
                    // Leave the line; if this fails the key goes with the session.
                    entry.disarm();
                    let _ = self
                        .client
                        .kv_client()
                        .delete(key.clone(), None)
                        .await
                        .map(|r| r.header().map(|h| self.clock.saw(h.revision())));
                    return Ok(AcquireOutcome::Granted(record));
                }
                AcquireOutcome::Held(holder) => {
                    if step.is_zero() {
                        drop(entry);
                        return Ok(AcquireOutcome::Held(holder));
                    }
                    self.wait_for_change(&self.layout.lease(name), revision + 1, step)
                        .await?;
                }
            }
        }
    }

    /// Returns at the first change of `key` since `from_revision`, or after `step`.
    async fn wait_for_change(
        &self,
        key: &str,
        from_revision: i64,
        step: Duration,
    ) -> Result<(), StoreError> {
        let mut stream = self
            .client
            .watch_client()
            .watch(
                key,
                Some(WatchOptions::new().with_start_revision(from_revision)),
            )
            .await
            .map_err(|e| etcd_error("watch", key, e))?;
        let changed = async {
            loop {
                match stream.message().await {
                    Ok(Some(resp)) if resp.events().is_empty() && !resp.canceled() => continue,
                    Ok(_) => return Ok(()),
                    Err(e) => return Err(etcd_error("watch", key, e)),
                }
            }
        };
        match tokio::time::timeout(step, changed).await {
            Ok(r) => r,
            Err(_) => Ok(()),
        }
    }
}
