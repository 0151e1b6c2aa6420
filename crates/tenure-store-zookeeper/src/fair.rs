//! Fair acquire: Curator's `InterProcessMutex` queue on top of the holder node.
//!
//! A waiter creates an ephemeral sequential node `<root>/<name>/wait-<seq>` on its owner's
//! session and watches only the waiter just before it (no herd). The first waiter tries
//! the ordinary acquire, which grants by creating the holder node; while another owner's
//! holder node exists it watches that node. So the holder node alone says who holds the
//! lease, for fair waiters and [`try_acquire`](tenure_lease::LeaseStore::try_acquire)
//! alike; `try_acquire` does not queue (it may take a free lease ahead of waiters, like a
//! barging `tryLock`).
//!
//! The waiter node is deleted when the grant arrives, when `wait` passes, and when the
//! future is dropped (a task is spawned to delete it), also while its create is still
//! being answered (the create runs in a task that deletes the node if nobody hears the
//! answer); if all of that fails it goes with the session. A waiter whose session ends while queued gets `Err`, never a grant.

use std::time::Duration;

use tenure_lease::{AcquireOutcome, AcquireRequest, LeaseStore, StoreError};
use zookeeper_client as zk;

use crate::error::{KIND, from_zk};
use crate::node::{GrantData, WAITER};
use crate::store::{ZooKeeperStore, acls};

/// A queued waiter node, deleted when dropped unless deleted already.
struct WaiterNode {
    client: zk::Client,
    path: Option<String>,
}

impl WaiterNode {
    async fn delete(&mut self) {
        if let Some(path) = self.path.take() {
            match self.client.delete(&path, None).await {
                Ok(()) | Err(zk::Error::NoNode) => {}
                // Leave it to the drop-time task (or the session's end).
                Err(_) => self.path = Some(path),
            }
        }
    }
}

impl Drop for WaiterNode {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            // The request is sent when `delete` is called; the task only reads the answer.
            let answer = self.client.delete(&path, None);
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    if let Err(e) = answer.await {
                        tracing::debug!(waiter = %path, error = %e, "cancelled waiter: delete failed; it goes with the session");
                    }
                });
            }
        }
    }
}

/// Creates this waiter's node under `prefix` and answers its guard and sequence number.
///
/// The create runs in a task of its own and answers a [`WaiterNode`]: a waiter dropped
/// while the answer is on its way (its node created on the server, its name not yet known
/// here) would otherwise leave the node queued for as long as its session lives, and every
/// later waiter behind it. A spawned task runs on when its `JoinHandle` is dropped, and
/// drops an answer nobody awaits: the guard then deletes the node.
async fn queue(
    client: &zk::Client,
    prefix: &str,
    data: Vec<u8>,
    acls: zk::Acls<'static>,
) -> Result<(WaiterNode, zk::CreateSequence), zk::Error> {
    let (client, prefix) = (client.clone(), prefix.to_string());
    tokio::spawn(async move {
        let opts = zk::CreateMode::EphemeralSequential.with_acls(acls);
        let created = client.create(&prefix, &data, &opts).await;
        created.map(|(_, seq)| {
            let path = Some(format!("{prefix}{seq}"));
            (WaiterNode { client, path }, seq)
        })
    })
    .await
    .unwrap_or(Err(zk::Error::ConnectionLoss))
}

fn sequence(child: &str) -> Option<i64> {
    child.strip_prefix(WAITER)?.parse().ok()
}

impl ZooKeeperStore {
    pub(crate) async fn fair(
        &self,
        req: &AcquireRequest,
        wait: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        let deadline = self.inner.clock.now() + wait;
        let s = self.owner_session(&req.owner, req.ttl).await?;
        let now = self.inner.clock.now();
        if s.grant(&req.name)
            .is_some_and(|g| g.instance == req.instance && g.live(now))
        {
            // Already ours: the reentrant acquire, no queueing.
            return self.try_acquire(req).await;
        }
        let lease = self.layout().await?.lease(&req.name)?;
        if !self.lease_node_known(&req.name) {
            self.ensure_lease_node(&s.client, &req.name).await?;
            self.set_lease_node_known(&req.name);
        }
        let prefix = format!("{lease}/{WAITER}");
        let data = GrantData::new(req).encode();
        let (mut node, seq) = queue(&s.client, &prefix, data, acls(&self.inner.options))
            .await
            .map_err(|e| from_zk(&format!("queueing at {prefix}"), &e))?;
        let mine = seq.into_i64();
        loop {
            let children = s
                .client
                .list_children(&lease)
                .await
                .map_err(|e| from_zk(&format!("listing waiters of {lease}"), &e))?;
            let mut ahead: Vec<(i64, &String)> = children
                .iter()
                .filter_map(|c| sequence(c).map(|n| (n, c)))
                .filter(|(n, _)| *n <= mine)
                .collect();
            ahead.sort();
            if ahead.last().map(|(n, _)| *n) != Some(mine) {
                node.path = None;
                return Err(StoreError::unavailable(
                    KIND,
                    format!("waiter {prefix}{seq} vanished while queued (its session ended)"),
                ));
            }
            let watched = if ahead.len() == 1 {
                match self.try_acquire(req).await? {
                    AcquireOutcome::Granted(record) => {
                        node.delete().await;
                        return Ok(AcquireOutcome::Granted(record));
                    }
                    AcquireOutcome::Held(_) => self.layout().await?.holder(&req.name)?,
                }
            } else {
                format!("{lease}/{}", ahead[ahead.len() - 2].1)
            };
            let (stat, watcher) = s
                .client
                .check_and_watch_stat(&watched)
                .await
                .map_err(|e| from_zk(&format!("watching {watched}"), &e))?;
            if stat.is_none() {
                continue;
            }
            if tokio::time::timeout_at(self.inner.clock.to_tokio(deadline), watcher.changed())
                .await
                .is_err()
            {
                break;
            }
        }
        node.delete().await;
        // `wait` passed: report the holder; if the lease came free just now, one plain try.
        match self.read(&req.name).await? {
            Some(holder) if holder.owner != req.owner => Ok(AcquireOutcome::Held(holder)),
            _ => self.try_acquire(req).await,
        }
    }
}
