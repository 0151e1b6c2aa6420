//! Fair acquire: a line of waiter rows per lease name in the lease file.
//!
//! A waiter joins the line with a row in `tenure_waiter` (`seq`, `AUTOINCREMENT`, gives
//! the order) that carries its owner, instance and its own expiry on the host's
//! `CLOCK_BOOTTIME`, like every grant's. While it waits it refreshes that expiry (every
//! third of its ttl), so a waiter whose process died stops holding the line back one ttl
//! after its last refresh; expired rows are skipped, and removed by the next waiter that
//! joins the name's line. The first unexpired waiter in line acquires by the rules of
//! [`try_acquire`](tenure_lease::LeaseStore::try_acquire), in the same write transaction
//! that checks it is first and removes its row when granted.
//!
//! **Wake-ups.** SQLite tells no process about another's writes. Within one process, a
//! release and a waiter leaving the line (its `wait` passed, or it was cancelled) wake the
//! waiters of that lease at once (a [`tokio::sync::Notify`] per file and lease name, shared
//! by every [`SqliteStore`] of the process opened on the same file). Waiters in other
//! processes notice only by looking again: every waiter looks at least every
//! [`cross_process_poll`] (a twentieth of its ttl, between 10 ms and 250 ms), and also when
//! the holder's grant or the row of the waiter ahead of it expires (an expiry is no event
//! anywhere). So a release by another process reaches a waiter within one poll interval;
//! each look is one short transaction, a write only when the row is refreshed or the
//! waiter is first in line.
//!
//! **Barging.** [`try_acquire`](tenure_lease::LeaseStore::try_acquire) does not queue: it
//! may take a free lease ahead of waiters (as with the etcd and ZooKeeper stores), and a
//! waiter first in line then waits for that grant to end.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rusqlite::{OptionalExtension, params};
use tenure_lease::store::{LeaveOnDrop, leave_line_when_wait_passed};
use tenure_lease::{AcquireOutcome, AcquireRequest, AcquireStep, LeaseStore, StoreError};
use tokio::sync::Notify;
use tokio::time::timeout;

use crate::clock::now_ns;
use crate::sql;
use crate::store::{Quiet, SqliteStore, acquire_in, row_record};

/// The shortest cross-process poll interval (very short ttls).
const MIN_POLL: Duration = Duration::from_millis(10);

/// The longest cross-process poll interval (long ttls).
const MAX_POLL: Duration = Duration::from_millis(250);

/// The shortest pause between two looks at the line: a grant whose expiry is (nearly)
/// reached is looked at again a moment later, not in a busy loop.
const MIN_NAP: Duration = Duration::from_millis(5);

/// How often a fair waiter with `ttl` looks at its line for changes made by other
/// processes (which cannot wake it): a twentieth of the ttl, at least 10 ms and at most
/// 250 ms. A release in another process reaches a waiter about this late at most; each
/// look is one short transaction holding the write lock.
pub fn cross_process_poll(ttl: Duration) -> Duration {
    (ttl / 20).clamp(MIN_POLL, MAX_POLL)
}

/// The bells of this process's fair waiters, per lease file and lease name. Entries go
/// when their last waiter does (a weak reference), and are swept when a bell is made.
type Bells = HashMap<PathBuf, HashMap<String, Weak<Notify>>>;

static BELLS: Mutex<Option<Bells>> = Mutex::new(None);

/// The bell of the waiters of `name` in file `file` (shared by every store of this process
/// on that file).
fn bell(file: &Path, name: &str) -> Arc<Notify> {
    let mut bells = BELLS.lock().unwrap_or_else(|e| e.into_inner());
    let bells = bells.get_or_insert_with(HashMap::new);
    if let Some(bell) = ringing(bells, file, name) {
        return bell;
    }
    bells.retain(|_, names| {
        names.retain(|_, b| b.strong_count() > 0);
        !names.is_empty()
    });
    let bell = Arc::new(Notify::new());
    bells
        .entry(file.to_path_buf())
        .or_default()
        .insert(name.to_string(), Arc::downgrade(&bell));
    bell
}

/// Wakes the waiters of `name` in file `file` in this process, if any. Every release
/// comes through here: the lookup borrows its keys (no allocation).
pub(crate) fn wake(file: &Path, name: &str) {
    let bells = BELLS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(bell) = bells.as_ref().and_then(|b| ringing(b, file, name)) {
        bell.notify_waiters();
    }
}

/// The live bell of `name` in `file`, found with borrowed keys.
fn ringing(bells: &Bells, file: &Path, name: &str) -> Option<Arc<Notify>> {
    bells.get(file)?.get(name)?.upgrade()
}

/// How joining the line went.
#[expect(
    clippy::large_enum_variant,
    reason = "one value per look at the line, moved once: boxing would buy nothing"
)]
enum Joined {
    /// In line as this `seq`.
    Queued(i64),
    /// The caller's instance held the lease: re-entered (or refused), no queueing.
    Reentered(Result<AcquireOutcome, Quiet>),
}

/// What one look at the line found.
#[expect(
    clippy::large_enum_variant,
    reason = "one value per look at the line, moved once: boxing would buy nothing"
)]
enum Look {
    /// The waiter's row expired or was removed.
    Gone,
    /// First in line: the outcome of the acquire (granted: the row is removed).
    First(Result<AcquireOutcome, Quiet>),
    /// Behind another waiter, whose row has this long left.
    Behind(Duration),
}

fn ns(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

fn queue_error(name: &str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::unavailable("sqlite", format!("fair acquire of {name}: {detail}"))
}

impl SqliteStore {
    /// Joins the line of `req.name`, unless `req`'s instance holds the lease already.
    async fn join(&self, req: &AcquireRequest) -> Result<Joined, StoreError> {
        let req = req.clone();
        self.with_conn(move |db| {
            let tx = db.write()?;
            let now = now_ns();
            let current = tx
                .prepare_cached(sql::SELECT_CURRENT)?
                .query_row(params![req.name, now], |r| row_record(r, now))
                .optional()?;
            let joined = if req.step(current.as_ref()) == AcquireStep::Extend {
                Joined::Reentered(acquire_in(&tx, &req, now)?)
            } else {
                tx.prepare_cached(sql::PURGE_WAITERS)?
                    .execute(params![req.name, now])?;
                let seq = tx.prepare_cached(sql::JOIN)?.query_row(
                    params![
                        req.name,
                        req.owner,
                        req.instance,
                        now.saturating_add(ns(req.ttl))
                    ],
                    |r| r.get(0),
                )?;
                Joined::Queued(seq)
            };
            tx.commit()?;
            Ok(joined)
        })
        .await
    }

    /// Looks at the line as waiter `seq` (refreshing its row when `refresh`), and
    /// acquires when it is first.
    async fn look(
        &self,
        req: &AcquireRequest,
        seq: i64,
        refresh: bool,
    ) -> Result<Look, StoreError> {
        let req = req.clone();
        self.with_conn(move |db| {
            let tx = db.write()?;
            let now = now_ns();
            let live = if refresh {
                tx.prepare_cached(sql::REFRESH_WAITER)?.execute(params![
                    seq,
                    now.saturating_add(ns(req.ttl)),
                    now
                ])? == 1
            } else {
                tx.prepare_cached(sql::WAITER_LIVE)?
                    .exists(params![seq, now])?
            };
            let look = if !live {
                Look::Gone
            } else {
                let (head, expires_at): (i64, i64) = tx
                    .prepare_cached(sql::HEAD)?
                    .query_row(params![req.name, now], |r| Ok((r.get(0)?, r.get(1)?)))?;
                if head != seq {
                    let left = expires_at.saturating_sub(now).max(0) as u64;
                    Look::Behind(Duration::from_nanos(left))
                } else {
                    let outcome = acquire_in(&tx, &req, now)?;
                    if let Ok(AcquireOutcome::Granted(_)) = outcome {
                        tx.prepare_cached(sql::LEAVE)?.execute([seq])?;
                    }
                    Look::First(outcome)
                }
            };
            tx.commit()?;
            Ok(look)
        })
        .await
    }

    /// Removes waiter `seq` from the line of `name` and wakes the waiters behind it in
    /// this process.
    async fn leave(&self, name: &str, seq: i64) -> Result<(), StoreError> {
        self.with_conn(move |db| {
            let tx = db.write()?;
            tx.prepare_cached(sql::LEAVE)?.execute([seq])?;
            tx.commit()
        })
        .await?;
        wake(&self.line_key, name);
        Ok(())
    }

    /// The fair acquire (see [`LeaseStore::acquire_fair`] on [`SqliteStore`]).
    pub(crate) async fn fair(
        &self,
        req: &AcquireRequest,
        wait: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        let deadline = self.clock.now() + wait;
        let refused = |quiet: Quiet| quiet.error(self.path(), &req.name, req.ttl);
        // Made before joining: every wake-up from then on finds it.
        let bell = bell(&self.line_key, &req.name);
        let seq = match self.join(req).await? {
            Joined::Queued(seq) => seq,
            Joined::Reentered(outcome) => return outcome.map_err(refused),
        };
        // The waiter's row, removed unless it is gone already (granted, removed on timeout,
        // or expired).
        let mut entry = LeaveOnDrop::new({
            let (store, name) = (self.clone(), req.name.clone());
            move || async move {
                if let Err(e) = store.leave(&name, seq).await {
                    tracing::warn!(lease = %name, seq, error = %e, "could not remove a fair waiter's row; it expires after its ttl");
                }
            }
        });
        let refresh_every = req.ttl / 3;
        let poll = cross_process_poll(req.ttl);
        let mut refreshed = self.clock.now();
        loop {
            // Listening before looking: a wake-up while looking is not lost.
            let rung = bell.notified();
            tokio::pin!(rung);
            rung.as_mut().enable();
            let refresh = self.clock.now().saturating_duration_since(refreshed) >= refresh_every;
            let looked_at = self.clock.now();
            let look = self.look(req, seq, refresh).await?;
            if refresh {
                refreshed = looked_at;
            }
            let (until, holder) = match look {
                Look::Gone => {
                    entry.disarm();
                    return Err(queue_error(
                        &req.name,
                        "the waiter's row expired or was removed while queued",
                    ));
                }
                Look::First(Ok(AcquireOutcome::Granted(record))) => {
                    entry.disarm();
                    return Ok(AcquireOutcome::Granted(record));
                }
                Look::First(Ok(AcquireOutcome::Held(holder))) => (holder.expires_in, Some(holder)),
                Look::First(Err(quiet)) => return Err(refused(quiet)),
                // Behind another waiter: it acquires, leaves or, if its process died, expires.
                Look::Behind(left) => (left, None),
            };
            let now = self.clock.now();
            if now >= deadline {
                return leave_line_when_wait_passed(
                    "sqlite",
                    req,
                    wait,
                    holder,
                    self.leave(&req.name, seq),
                    || entry.disarm(),
                    async || self.read(&req.name).await,
                )
                .await;
            }
            let nap = until.max(MIN_NAP).min(poll).min(deadline - now).min(
                refresh_every
                    .saturating_sub(now.saturating_duration_since(refreshed))
                    .max(MIN_NAP),
            );
            let _ = timeout(nap, rung).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_poll_interval_is_a_twentieth_of_the_ttl_within_bounds() {
        assert_eq!(
            cross_process_poll(Duration::from_secs(2)),
            Duration::from_millis(100)
        );
        assert_eq!(cross_process_poll(Duration::from_millis(100)), MIN_POLL);
        assert_eq!(cross_process_poll(Duration::from_secs(60)), MAX_POLL);
    }

    /// A wake-up reaches the waiters of that file and name, enabled before it was rung,
    /// and no others.
    #[tokio::test]
    async fn wake_rings_only_that_line() {
        let (a, b) = (Path::new("/x/a.sqlite"), Path::new("/x/b.sqlite"));
        let bell_a = bell(a, "n");
        let other_name = bell(a, "m");
        let other_file = bell(b, "n");
        let same = bell(a, "n");
        assert!(Arc::ptr_eq(&bell_a, &same), "one bell per file and name");
        let rung = bell_a.notified();
        tokio::pin!(rung);
        rung.as_mut().enable();
        let not_rung = other_name.notified();
        tokio::pin!(not_rung);
        not_rung.as_mut().enable();
        let not_rung_either = other_file.notified();
        tokio::pin!(not_rung_either);
        not_rung_either.as_mut().enable();
        wake(a, "n");
        use std::future::Future;
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(rung.as_mut().poll(&mut cx).is_ready());
        assert!(not_rung.as_mut().poll(&mut cx).is_pending());
        assert!(not_rung_either.as_mut().poll(&mut cx).is_pending());
    }
}
