//! Remember-entities (Akka's `remember-entities`): a shard keeps the ids of its entities in
//! the lease store, with its own lease ([`RememberedIds::remember`]), and starts them all again
//! whenever it starts serving.
//!
//! **Where the ids live.** With the shard's lease, in the lease store the shard already
//! depends on: no other storage system. They are not grants: they never expire and outlive
//! the node that wrote them (its crash included), and only the shard lease's current holder
//! can change them (every write is fenced by its grant), so a node that lost the shard,
//! however late its writes arrive, never changes what the next host remembers.
//!
//! **When they change.** An id is added before its entity first starts (the message that
//! starts it waits for the write, so an entity that ever ran is remembered), and removed
//! once the entity stopped after asking to be passivated. Entities stopped by their shard
//! (hand-off, lease lost, the node leaving) stay remembered; so do entities that failed,
//! which the shard starts again after `entity-restart-backoff`. Idle passivation is off.
//!
//! **When they are read.** Each time the shard is granted its lease, before it delivers
//! anything: it starts every remembered entity, then the messages that waited.
//!
//! Writes of one grant go through one writer task, in order, batched while one is in
//! flight; the shard never awaits the store in a handler (a lease loss is handled at once),
//! except to flush the writer when it hands off or stops, so that the removals of entities
//! that passivated themselves land before the lease is released.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use ractor::ActorRef;
use tenure_lease::{
    ConfigError, FencingToken, LeaseError, LeaseStore, LeaseView, RememberChange, RememberedIds,
    store::bounded,
};
use tokio::sync::{mpsc, oneshot};

use crate::shard::ShardMsg;

/// Where ids are kept: the store, the name of the lease they are remembered with as the
/// store holds it (a shard's lease; the coordinator's singleton lease for its pins), the
/// lease's owner (this node), and the bounds of one store call.
#[derive(Clone)]
pub(crate) struct RememberStore {
    pub(crate) store: Arc<dyn LeaseStore>,
    pub(crate) name: String,
    pub(crate) owner: String,
    /// Bound of one store call (`lease-operation-timeout`).
    pub(crate) timeout: Duration,
    /// Pause before a failed call is tried again.
    pub(crate) retry: Duration,
}

impl RememberStore {
    /// The store's remembered ids. remember-entities is refused at start on a store without
    /// them; a store that lost them since answers a configuration error naming the setting.
    fn ids(&self) -> Result<&dyn RememberedIds, LeaseError> {
        ids_of(&*self.store)
    }

    /// The ids remembered with the lease, bounded by the operation timeout.
    pub(crate) async fn remembered(&self) -> Result<Vec<String>, LeaseError> {
        let ids = self.ids()?;
        bounded(
            &self.name,
            "read remembered ids",
            self.timeout,
            ids.remembered(&self.name),
        )
        .await
    }

    /// Applies `change` under grant `token`, bounded by the operation timeout.
    pub(crate) async fn remember(
        &self,
        token: FencingToken,
        change: &RememberChange,
    ) -> Result<bool, LeaseError> {
        let ids = self.ids()?;
        bounded(
            &self.name,
            "remember ids",
            self.timeout,
            ids.remember(&self.name, &self.owner, token, change),
        )
        .await
    }
}

/// `store`'s remembered ids, or the configuration error remember-entities meets on a store
/// without them.
pub(crate) fn ids_of(store: &dyn LeaseStore) -> Result<&dyn RememberedIds, LeaseError> {
    store.as_remembered_ids().ok_or_else(|| {
        LeaseError::Config(ConfigError::invalid(
            "remember-entities",
            format!("the {} store keeps no remembered ids", store.kind()),
        ))
    })
}

/// What the writer of one grant is asked.
enum WriterMsg {
    Change(RememberChange),
    /// Answered once every change sent before it was written (or given up): `true` when
    /// every change the writer was sent so far was written.
    Flush(oneshot::Sender<bool>),
}

/// The writer of one grant's changes to the ids remembered with a lease: changes are
/// written in the order they are sent, batched while one is in flight, retried while the
/// store fails, and given up once the grant is not current (every later change then too).
/// It ends once dropped and everything sent to it was handled.
pub(crate) struct IdWriter {
    tx: mpsc::UnboundedSender<WriterMsg>,
}

impl IdWriter {
    /// Starts the writer of grant `token` on `at`; `written` is told of each batch, and
    /// whether it was written.
    pub(crate) fn start(
        at: RememberStore,
        token: FencingToken,
        written: impl Fn(RememberChange, bool) + Send + 'static,
    ) -> IdWriter {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(write(at, token, written, rx));
        IdWriter { tx }
    }

    /// Sends `change` to be written after every change sent before it.
    pub(crate) fn send(&self, change: RememberChange) {
        let _ = self.tx.send(WriterMsg::Change(change));
    }

    /// Resolves once every change sent so far was written or given up: `true` when all
    /// of them (and all sent earlier) were written; `false` when one was given up, or the
    /// writer ended on an error it cannot retry.
    pub(crate) fn flush(&self) -> impl std::future::Future<Output = bool> + Send + 'static {
        let (tx, rx) = oneshot::channel();
        let sent = self.tx.send(WriterMsg::Flush(tx)).is_ok();
        async move { sent && rx.await.unwrap_or(false) }
    }
}

/// A shard's remembered ids under its current grant.
pub(crate) struct Remembering {
    pub(crate) at: RememberStore,
    /// The ids were read since the current grant: entities may start.
    pub(crate) recalled: bool,
    /// Ids the store holds, as far as this shard wrote or read them under the current grant.
    pub(crate) known: HashSet<String>,
    /// Ids whose entity waits for their addition to be written before it starts.
    pub(crate) adding: HashSet<String>,
    /// Ids whose removal was sent and not confirmed yet.
    pub(crate) forgetting: HashSet<String>,
    writer: Option<IdWriter>,
}

impl Remembering {
    pub(crate) fn new(at: RememberStore) -> Self {
        Remembering {
            at,
            recalled: false,
            known: HashSet::new(),
            adding: HashSet::new(),
            forgetting: HashSet::new(),
            writer: None,
        }
    }

    /// The shard now serves grant `token`: reads the ids (reported as
    /// [`ShardMsg::Recalled`], retried while `view` still believes in the grant) and starts
    /// the grant's writer.
    pub(crate) fn serve(
        &mut self,
        token: FencingToken,
        shard: ActorRef<ShardMsg>,
        view: LeaseView,
    ) {
        self.reset();
        let reported = shard.clone();
        self.writer = Some(IdWriter::start(
            self.at.clone(),
            token,
            move |change, written| {
                let _ = reported.cast(ShardMsg::Remembered {
                    token,
                    change,
                    written,
                });
            },
        ));
        tokio::spawn(recall(self.at.clone(), token, shard, view));
    }

    /// The grant ended: everything known under it is forgotten here (not in the store), and
    /// its writer ends once the changes sent to it are done.
    pub(crate) fn reset(&mut self) {
        self.recalled = false;
        self.known.clear();
        self.adding.clear();
        self.forgetting.clear();
        self.writer = None;
    }

    /// Whether `id` must be (re)added before its entity starts.
    pub(crate) fn must_add(&self, id: &str) -> bool {
        !self.known.contains(id) || self.forgetting.contains(id)
    }

    /// Sends `change` to the writer.
    fn send(&self, change: RememberChange) {
        if let Some(w) = &self.writer {
            w.send(change);
        }
    }

    /// Adds `id` (its entity starts once written: [`ShardMsg::Remembered`]).
    pub(crate) fn add(&mut self, id: &str) {
        self.adding.insert(id.to_string());
        self.send(RememberChange::add([id.to_string()]));
    }

    /// Removes `id` (its entity passivated itself).
    pub(crate) fn forget(&mut self, id: &str) {
        self.forgetting.insert(id.to_string());
        self.send(RememberChange::remove([id.to_string()]));
    }

    /// A write of the current grant ended: `written`, or given up (the grant is not current
    /// any more). Returns the ids whose entities may start now.
    pub(crate) fn written(&mut self, change: &RememberChange, written: bool) -> Vec<String> {
        if !written {
            return Vec::new();
        }
        for id in change.removed() {
            self.known.remove(id);
            self.forgetting.remove(id);
        }
        let mut ready = Vec::new();
        for id in change.added() {
            self.known.insert(id.clone());
            // A removal it overtook (merged into this batch) is void.
            self.forgetting.remove(id);
            if self.adding.remove(id) {
                ready.push(id.clone());
            }
        }
        ready
    }

    /// Waits (at most `limit`) until every change sent so far was written or given up.
    pub(crate) async fn flush(&self, limit: Duration) {
        let Some(w) = &self.writer else {
            return;
        };
        if tokio::time::timeout(limit, w.flush()).await.is_err() {
            tracing::warn!(lease = %self.at.name, ?limit, "remembered ids not written in time before the hand-off");
        }
    }
}

/// Reads the ids remembered with the shard's lease and reports them, retrying while the
/// shard still believes in grant `token`.
async fn recall(
    at: RememberStore,
    token: FencingToken,
    shard: ActorRef<ShardMsg>,
    view: LeaseView,
) {
    loop {
        match at.remembered().await {
            Ok(ids) => {
                let _ = shard.cast(ShardMsg::Recalled { token, ids });
                return;
            }
            Err(e @ LeaseError::Config(_)) => {
                tracing::error!(lease = %at.name, error = %e, "cannot read the remembered entities");
                return;
            }
            Err(e) => {
                if view.token() != Some(token) {
                    return;
                }
                tracing::warn!(lease = %at.name, error = %e, "cannot read the remembered entities; retrying");
                tokio::time::sleep(at.retry).await;
            }
        }
    }
}

/// The writer of grant `token`: applies the changes it is sent in order, each batch being
/// everything that arrived while the previous one was written, retrying a failed batch
/// (a change applied twice changes nothing), and reports every batch to `report`. It ends
/// when its [`IdWriter`] is dropped and everything sent was handled.
async fn write(
    at: RememberStore,
    token: FencingToken,
    report: impl Fn(RememberChange, bool),
    mut rx: mpsc::UnboundedReceiver<WriterMsg>,
) {
    let mut batch = RememberChange::default();
    let mut flushes: Vec<oneshot::Sender<bool>> = Vec::new();
    let mut open = true;
    // Whether every batch so far was written: once the grant is not current, no later
    // write of it can be.
    let mut all_written = true;
    loop {
        if batch.is_empty() {
            for f in flushes.drain(..) {
                let _ = f.send(all_written);
            }
            if !open {
                return;
            }
            match rx.recv().await {
                Some(msg) => take(msg, &mut batch, &mut flushes),
                None => return,
            }
        }
        // Everything that arrived meanwhile joins the batch.
        loop {
            match rx.try_recv() {
                Ok(msg) => take(msg, &mut batch, &mut flushes),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        if batch.is_empty() {
            continue;
        }
        match at.remember(token, &batch).await {
            Ok(written) => {
                if !written {
                    tracing::info!(lease = %at.name, token = token.get(), "remembered ids not written: the shard's grant is not current any more");
                }
                all_written &= written;
                report(std::mem::take(&mut batch), written);
            }
            Err(e @ LeaseError::Config(_)) => {
                tracing::error!(lease = %at.name, error = %e, ids = batch.len(), "cannot write remembered ids");
                return;
            }
            Err(e) => {
                if !open {
                    // The grant ended (or the shard stopped): its writes would be refused.
                    tracing::info!(lease = %at.name, error = %e, ids = batch.len(), "remembered ids not written before the shard's grant ended");
                    return;
                }
                tracing::warn!(lease = %at.name, error = %e, ids = batch.len(), "cannot write remembered ids; retrying");
                tokio::time::sleep(at.retry).await;
            }
        }
    }
}

fn take(msg: WriterMsg, batch: &mut RememberChange, flushes: &mut Vec<oneshot::Sender<bool>>) {
    match msg {
        WriterMsg::Change(c) => *batch = std::mem::take(batch).then(c),
        WriterMsg::Flush(f) => flushes.push(f),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remembering() -> Remembering {
        Remembering::new(RememberStore {
            store: Arc::new(tenure_lease::MemoryStore::new()),
            name: "test-shard-t-0".into(),
            owner: "127.0.0.1:1".into(),
            timeout: Duration::from_secs(1),
            retry: Duration::from_millis(10),
        })
    }

    #[test]
    fn an_entity_starts_once_its_addition_is_written() {
        let mut r = remembering();
        r.add("a");
        assert!(r.must_add("a") && r.adding.contains("a"));
        assert_eq!(
            r.written(&RememberChange::add(["a".into()]), false),
            Vec::<String>::new()
        );
        assert!(r.adding.contains("a"), "not written: still waiting");
        assert_eq!(
            r.written(&RememberChange::add(["a".into()]), true),
            vec!["a".to_string()]
        );
        assert!(!r.must_add("a") && r.adding.is_empty());
    }

    #[test]
    fn a_removal_overtaken_by_an_addition_in_one_batch_is_void() {
        let mut r = remembering();
        r.known.insert("a".into());
        r.forget("a");
        assert!(
            r.must_add("a"),
            "being forgotten: a new start adds it again"
        );
        r.add("a");
        // The writer merged both: only the addition is written.
        let batch =
            RememberChange::remove(["a".to_string()]).then(RememberChange::add(["a".into()]));
        assert!(batch.removed().is_empty());
        assert_eq!(r.written(&batch, true), vec!["a".to_string()]);
        assert!(!r.must_add("a"), "remembered, and no removal pending");
        // A removal written on its own forgets it.
        r.forget("a");
        assert!(
            r.written(&RememberChange::remove(["a".to_string()]), true)
                .is_empty()
        );
        assert!(!r.known.contains("a") && r.must_add("a"));
    }
}
