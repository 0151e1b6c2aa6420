//! The cheap check for changed grants ([`GrantChanges`](tenure_lease::GrantChanges)): a
//! persistent recursive watch on the root, on the reader session.
//!
//! A grant is its holder node `<root>/<name>/holder`: a grant made creates it, a grant ended
//! deletes it, whoever ends it (a release, this store's expiry, a take-over, or the server
//! when the holder's session ends, which no client writes), and a reentrant acquire that
//! replaces the note sets its data. A renewal writes no node. So every change of grants is
//! an event on a holder node, and the watch counts them per prefix asked about; a check
//! sends one `sync` and then reads the events that arrived before its answer (the server
//! sends a session its watch events before the answers to its later requests), so it is
//! exact as of the check, in one small round trip, however many grants there are.
//!
//! Events can be lost while the session is disconnected (ZOOKEEPER-4698): every session
//! event (disconnected, reconnected) starts a new *epoch*, and an answer from another
//! epoch is always "changed". A new reader session starts a new watch and a new epoch.
//!
//! The cost of the watch: each write under the root (grants, fair waiters, remembered ids,
//! preemption requests, of every prefix) is one notification to each store instance that
//! checks for changes. The events are counted (a few integer increments each) and dropped.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::FutureExt;
use tenure_lease::{ChangeVersion, Changes, StoreError};
use zookeeper_client as zk;

use crate::error::{backend, from_zk};
use crate::node::Layout;

/// How often an idle watch's events are read and counted when nobody checks (they queue up
/// in memory until then).
const DRAIN_EVERY: Duration = Duration::from_secs(5);

/// The watch of one reader session and the counts of holder events per prefix.
pub(crate) struct ChangeWatch {
    /// The session the watch is on (held, so the session outlives the watch).
    client: zk::Client,
    watcher: zk::PersistentWatcher,
    /// The layout of the watched root: which paths are holder nodes.
    layout: Layout,
    /// Where the epochs of this watch start (random per watch, so that versions of
    /// another store instance or an earlier watch never match).
    base: i64,
    /// Session events seen since the watch started.
    epoch: i64,
    /// Holder events per prefix asked about, since it was first asked about.
    counts: HashMap<String, u64>,
    /// A terminal session event was read: the watch is over.
    over: bool,
}

/// The changes state of a store: the current watch, if any.
pub(crate) type Watches = Arc<tokio::sync::Mutex<Option<ChangeWatch>>>;

/// A random 64-bit number (the standard library's per-instance hasher keys).
fn random() -> i64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    h.finish() as i64
}

impl ChangeWatch {
    /// Starts a persistent recursive watch on the root of `layout` on `client`'s session.
    async fn start(client: &zk::Client, layout: &Layout) -> Result<ChangeWatch, StoreError> {
        let root = layout.root();
        let watcher = client
            .watch(root, zk::AddWatchMode::PersistentRecursive)
            .await
            .map_err(|e| from_zk(&format!("watching {root}"), &e))?;
        Ok(ChangeWatch {
            client: client.clone(),
            watcher,
            layout: layout.clone(),
            base: random(),
            epoch: 0,
            counts: HashMap::new(),
            over: false,
        })
    }

    /// Whether this watch still serves `client`'s session.
    fn serves(&self, client: &zk::Client) -> bool {
        !self.over
            && !self.client.state().is_terminated()
            && self.client.session_id() == client.session_id()
    }

    /// Counts every event that has arrived. Stops at a terminal session event (the
    /// channel closes after it, and reading a closed one panics in the client library).
    fn drain(&mut self) {
        while !self.over {
            let Some(event) = self.watcher.changed().now_or_never() else {
                return;
            };
            match event.event_type {
                zk::EventType::Session => {
                    self.epoch += 1;
                    self.over = event.session_state.is_terminated();
                }
                zk::EventType::NodeCreated
                | zk::EventType::NodeDeleted
                | zk::EventType::NodeDataChanged => {
                    if let Some(name) = self.layout.holder_name(&event.path) {
                        for (prefix, count) in self.counts.iter_mut() {
                            if name.starts_with(prefix.as_str()) {
                                *count += 1;
                            }
                        }
                    }
                }
                zk::EventType::NodeChildrenChanged => {}
            }
        }
    }

    /// The version of `prefix` now: `None` when it is asked about for the first time (its
    /// count starts now).
    fn version(&mut self, prefix: &str) -> Option<ChangeVersion> {
        let at = self.base.wrapping_add(self.epoch);
        match self.counts.get(prefix) {
            Some(&changes) => Some(ChangeVersion { changes, at }),
            None => {
                self.counts.insert(prefix.to_string(), 0);
                None
            }
        }
    }
}

/// Whether the grants under `prefix` changed since `since`, through the watch in `watches`
/// on `client`'s session (started, or restarted for a new session, here).
pub(crate) async fn changes_since(
    watches: &Watches,
    client: &zk::Client,
    layout: &Layout,
    prefix: &str,
    since: Option<ChangeVersion>,
) -> Result<Changes, StoreError> {
    let root = layout.root();
    let mut current = watches.lock().await;
    if !current.as_ref().is_some_and(|w| w.serves(client)) {
        *current = None;
        let watch = ChangeWatch::start(client, layout).await?;
        tokio::spawn(drain_while_idle(Arc::downgrade(watches), watch.base));
        *current = Some(watch);
    }
    // Every event of a write committed before the sync is read below.
    match client.sync(root).await {
        Ok(()) | Err(zk::Error::NoNode) => {}
        Err(e) => return Err(from_zk(&format!("syncing {root}"), &e)),
    }
    let Some(watch) = current.as_mut() else {
        return Err(backend(format!("watching {root}: the watch was not kept")));
    };
    watch.drain();
    if watch.over {
        // The session ended: the next check starts a new watch on a new session.
        let at = watch.base.wrapping_add(watch.epoch);
        *current = None;
        return Ok(Changes::Changed(ChangeVersion { changes: 0, at }));
    }
    Ok(match (watch.version(prefix), since) {
        (Some(version), Some(since)) if since == version => Changes::Unchanged(version),
        (Some(version), _) => Changes::Changed(version),
        (None, _) => Changes::Changed(ChangeVersion {
            changes: 0,
            at: watch.base.wrapping_add(watch.epoch),
        }),
    })
}

/// Reads the events of a watch nobody checks, so that they do not pile up; ends with the
/// store or the watch (`base` names it).
async fn drain_while_idle(watches: Weak<tokio::sync::Mutex<Option<ChangeWatch>>>, base: i64) {
    loop {
        tokio::time::sleep(DRAIN_EVERY).await;
        let Some(watches) = watches.upgrade() else {
            return;
        };
        let mut current = watches.lock().await;
        match current.as_mut() {
            Some(watch) if !watch.over && watch.base == base => watch.drain(),
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::node::Layout;

    #[test]
    fn only_holder_nodes_name_a_grant() {
        let flat = Layout::flat("/tenure/leases".into());
        let families = Layout::families("/tenure/leases".into());
        for layout in [&flat, &families] {
            let holder_name = |path| layout.holder_name(path);
            assert_eq!(holder_name("/tenure/leases/c-1/holder"), Some("c-1"));
            assert_eq!(holder_name("/tenure/leases/c-1"), None);
            assert_eq!(holder_name("/tenure/leases/c-1/wait-0000000001"), None);
            assert_eq!(holder_name("/tenure/leases/c-1/remembered/holder"), None);
            assert_eq!(holder_name("/tenure/leases/holder"), None);
            assert_eq!(holder_name("/tenure/other/c-1/holder"), None);
            assert_eq!(holder_name("/tenure/leases-x/c-1/holder"), None);
        }
        let member = "/tenure/leases/s-member-/s-member-h:1/holder";
        assert_eq!(families.holder_name(member), Some("s-member-h:1"));
        assert_eq!(flat.holder_name(member), None);
        let flat_member = "/tenure/leases/s-member-h:1/holder";
        assert_eq!(flat.holder_name(flat_member), Some("s-member-h:1"));
        assert_eq!(
            families.holder_name(flat_member),
            None,
            "not where it lives"
        );
        assert_eq!(
            families.holder_name("/tenure/leases/s-member-/s-shard-x/holder"),
            None,
            "under another family's parent"
        );
    }
}
