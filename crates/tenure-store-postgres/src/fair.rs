//! Fair acquire: a line of waiter rows per lease name, woken by LISTEN/NOTIFY.
//!
//! A waiter joins the line with a row in `<table>_waiter` (`seq` from the table's own
//! sequence gives the order) that carries its owner, instance and its own expiry, on the
//! server's clock like every grant's. While it waits it refreshes that expiry, so a waiter
//! whose process died stops holding the line back one ttl after its last refresh; expired
//! rows are skipped and removed by the next waiter that joins the name's line. The first
//! unexpired waiter in line acquires with the very statement of
//! [`try_acquire`](tenure_lease::LeaseStore::try_acquire), extended to check that it is
//! still first and to remove its row when granted, so a grant and its leaving the line
//! are one transaction.
//!
//! **Wake-ups.** Each client keeps one extra connection (not from the pool) that LISTENs on
//! the table's channel ([`Statements::channel`](crate::sql::Statements::channel)); a release
//! and a waiter leaving the line (its `wait` passed, or it was cancelled) `pg_notify` the
//! lease's name in their own transaction, so waiters hear of it when it commits. Nothing
//! is sent when a grant or a waiter's row merely expires, so a waiter also wakes when the
//! holder's grant (as last answered) or the row of the waiter ahead of it expires, and at
//! least every third of its ttl, to refresh its row. If the LISTEN connection is lost,
//! waiters re-read the line and LISTEN again on a new connection.
//!
//! **Barging.** [`try_acquire`](tenure_lease::LeaseStore::try_acquire) does not queue: it
//! may take a free lease ahead of waiters (as with the etcd and ZooKeeper stores), and a
//! waiter first in line then waits for that grant to end.

use std::sync::Arc;
use std::time::Duration;

use futures::future::poll_fn;
use tenure_lease::store::{LeaveOnDrop, leave_line_when_wait_passed};
use tenure_lease::{AcquireOutcome, AcquireRequest, LeaseStore, StoreError};
use tokio::sync::broadcast;
use tokio::time::timeout;
use tokio_postgres::{AsyncMessage, NoTls};

use crate::error::{self, STORE};
use crate::sql::Sql;
use crate::store::{ACQUIRE_RACES, PostgresStore, ttl_us};

/// Notifications a waiter may fall behind by before it just re-reads the line.
const HEARD_BUFFER: usize = 256;

/// The shortest pause between two looks at the line: a grant whose expiry the server
/// answered as (nearly) passed is looked at again a moment later, not in a busy loop.
const MIN_NAP: Duration = Duration::from_millis(5);

/// The shortest refresh period of a waiter's row, for very short ttls.
const MIN_PACE: Duration = Duration::from_millis(50);

/// The connection one store client LISTENs on. A task drives it and forwards each
/// notification's payload (a lease name; empty: every name) to the waiters.
pub(crate) struct Listener {
    /// Keeps the connection open; dropping it closes the connection.
    client: tokio_postgres::Client,
    /// Kept to subscribe waiters ([`broadcast::Receiver::resubscribe`]). Only the driving
    /// task holds the sender, so receivers see `Closed` once the connection ends.
    heard: broadcast::Receiver<Arc<str>>,
}

impl Listener {
    /// A receiver of the notifications from now on.
    fn subscribe(&self) -> broadcast::Receiver<Arc<str>> {
        self.heard.resubscribe()
    }
}

/// What ended a waiter's nap.
enum Woke {
    /// A notification for its lease (or one it may have missed), or the nap ran out.
    Look,
    /// The LISTEN connection ended: notifications may have been missed.
    Deaf,
}

/// Waits until a notification for `name` arrives or `nap` passes.
async fn nap(heard: &mut broadcast::Receiver<Arc<str>>, name: &str, nap: Duration) -> Woke {
    let notified = async {
        loop {
            match heard.recv().await {
                Ok(payload) if payload.is_empty() || &*payload == name => return Woke::Look,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => return Woke::Look,
                Err(broadcast::error::RecvError::Closed) => return Woke::Deaf,
            }
        }
    };
    timeout(nap, notified).await.unwrap_or(Woke::Look)
}

fn queue_error(name: &str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::unavailable(STORE, format!("fair acquire of {name}: {detail}"))
}

/// What one look at the line found.
struct Line {
    /// The waiter's row is still there, unexpired (and now refreshed).
    queued: bool,
    /// The first waiter in line, and how long its row has left.
    head: Option<(i64, Duration)>,
}

impl PostgresStore {
    /// The LISTEN connection of this client: the one open, or a new one.
    async fn listener(&self) -> Result<Arc<Listener>, StoreError> {
        let mut slot = self.inner.listener.lock().await;
        if let Some(listener) = slot.as_ref()
            && !listener.client.is_closed()
        {
            return Ok(listener.clone());
        }
        let server = &self.inner.server;
        let patience = self.patience();
        let connect = self.inner.options.connection.connect(NoTls);
        let (client, mut connection) = match timeout(patience, connect).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => return Err(error::from_pg(server, e).error),
            Err(_) => return Err(error::timed_out(server, patience)),
        };
        let (tell, heard) = broadcast::channel(HEARD_BUFFER);
        let server_name = server.clone();
        tokio::spawn(async move {
            loop {
                match poll_fn(|cx| connection.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notification(n))) => {
                        // No receiver but the kept one is no error worth telling.
                        let _ = tell.send(Arc::from(n.payload()));
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        tracing::debug!(server = %server_name, error = %e, "fair waiters' LISTEN connection lost");
                        return;
                    }
                    None => return,
                }
            }
        });
        let listen = format!("LISTEN \"{}\"", self.inner.statements.channel);
        match timeout(patience, client.batch_execute(&listen)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(error::from_pg(server, e).error),
            Err(_) => return Err(error::timed_out(server, patience)),
        }
        let listener = Arc::new(Listener { client, heard });
        *slot = Some(listener.clone());
        Ok(listener)
    }

    /// Joins the line of `req.name`: the new waiter's `seq`, or `None` when `req`'s
    /// instance holds the lease already. Not retried once sent: a second row would hold
    /// the line until it expired.
    async fn join(&self, req: &AcquireRequest) -> Result<Option<i64>, StoreError> {
        let ttl = waiter_ttl_us(req.ttl);
        let rows = self
            .query(
                Sql::Join,
                &[&req.name, &req.owner, &req.instance, &ttl],
                false,
            )
            .await?;
        rows.first()
            .map(|row| row.try_get(0).map_err(|e| self.bad(e)))
            .transpose()
    }

    /// Refreshes waiter `seq`'s row and reads the head of the line.
    async fn look(&self, req: &AcquireRequest, seq: i64) -> Result<Line, StoreError> {
        let ttl = waiter_ttl_us(req.ttl);
        let name = &req.name;
        let row = self.query_one(Sql::Line, &[&seq, name, &ttl], true).await?;
        let bad = |e| self.bad(e);
        let queued: bool = row.try_get(0).map_err(bad)?;
        let head: Option<i64> = row.try_get(1).map_err(bad)?;
        let left: Option<i64> = row.try_get(2).map_err(bad)?;
        Ok(Line {
            queued,
            head: head.map(|h| (h, Duration::from_micros(left.unwrap_or(0).max(0) as u64))),
        })
    }

    /// Removes waiter `seq` from its line and notifies the waiters behind it.
    pub(crate) async fn leave(&self, seq: i64) -> Result<(), StoreError> {
        self.execute(Sql::Leave, &[&seq], true).await.map(drop)
    }

    /// The fair acquire (see [`LeaseStore::acquire_fair`] on [`PostgresStore`]).
    pub(crate) async fn fair(
        &self,
        req: &AcquireRequest,
        wait: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        let deadline = self.inner.clock.now() + wait;
        // Listening before joining: nothing committed after the first look goes unheard.
        let mut heard = self.listener().await?.subscribe();
        let mut races = 0;
        let seq = loop {
            match self.join(req).await? {
                Some(seq) => break seq,
                // Already the holder: the reentrant acquire, no queueing. Held: the grant
                // ended meanwhile and another took it; join the line after all.
                None => match self.try_acquire(req).await? {
                    AcquireOutcome::Held(_) if races + 1 < ACQUIRE_RACES => races += 1,
                    outcome => return Ok(outcome),
                },
            }
        };
        // The waiter's row, removed unless it is gone already (granted, removed on timeout,
        // or expired).
        let mut entry = LeaveOnDrop::new({
            let store = self.clone();
            move || async move {
                if let Err(e) = store.leave(seq).await {
                    tracing::warn!(seq, error = %e, "could not remove a fair waiter's row; it expires after its ttl");
                }
            }
        });
        let pace = (req.ttl / 3).max(MIN_PACE);
        let mut races = 0;
        loop {
            let line = self.look(req, seq).await?;
            if !line.queued {
                entry.disarm();
                return Err(queue_error(
                    &req.name,
                    "the waiter's row expired or was removed while queued",
                ));
            }
            let (until, holder) = match line.head {
                Some((head, _)) if head == seq => match self.acquire_once(req, Some(seq)).await? {
                    Some(AcquireOutcome::Granted(record)) => {
                        entry.disarm();
                        return Ok(AcquireOutcome::Granted(record));
                    }
                    Some(AcquireOutcome::Held(holder)) => (holder.expires_in, Some(holder)),
                    None => {
                        races += 1;
                        if races < ACQUIRE_RACES {
                            continue;
                        }
                        return Err(queue_error(
                            &req.name,
                            "the lease kept changing hands while first in line",
                        ));
                    }
                },
                // Behind another waiter: it acquires, leaves (notified) or, if its process
                // died, expires (not notified).
                Some((_, left)) => (left, None),
                None => (pace, None),
            };
            races = 0;
            let now = self.inner.clock.now();
            if now >= deadline {
                return leave_line_when_wait_passed(
                    STORE,
                    req,
                    wait,
                    holder,
                    self.leave(seq),
                    || entry.disarm(),
                    async || self.read(&req.name).await,
                )
                .await;
            }
            let step = until.max(MIN_NAP).min(pace).min(deadline - now);
            if let Woke::Deaf = nap(&mut heard, &req.name, step).await {
                heard = self.listener().await?.subscribe();
            }
        }
    }
}

/// A waiter row's ttl in whole microseconds: the acquire's ttl.
fn waiter_ttl_us(ttl: Duration) -> i64 {
    ttl_us(ttl)
}
