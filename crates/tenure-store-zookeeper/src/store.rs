//! The ZooKeeper lease store and its factory.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tenure_lease::names::NameRules;
use tenure_lease::{
    AcquireOutcome, AcquireRequest, AcquireStep, Capabilities, ChangeVersion, Changes, ConfigError,
    FairQueue, FencingToken, GrantChanges, HeldLease, HolderClock, LeaseRecord, LeaseSection,
    LeaseStore, PreemptAnswer, PreemptionRequest, PreemptionRequests, RememberChange,
    RememberedIds, Renewal, StoreError, StoreFactory,
};
use zookeeper_client as zk;

use crate::error::{KIND, backend, from_zk, session_over};
use crate::node::{GrantData, Layout, millis, remembered_id, remembered_node, token};
use crate::options::{REFERENCE, ZooKeeperOptions, check_root};
use crate::session::{Grant, OwnerSession};

/// How often an acquire re-reads a holder node that changed under it before giving up.
const MAX_ATTEMPTS: usize = 8;
/// Reads per multi-read request (each answer must fit ZooKeeper's 1 MiB packet limit).
const READS_PER_MULTI: usize = 1000;
/// Remembered ids written per multi (each request must fit ZooKeeper's 1 MiB packet limit).
const REMEMBER_OPS: usize = 200;

type Slot = Arc<tokio::sync::Mutex<Option<Arc<OwnerSession>>>>;

pub(crate) struct Inner {
    pub(crate) options: ZooKeeperOptions,
    /// The root's layout, read (or the root created) by the first operation; fixed for the
    /// root's life.
    layout: tokio::sync::OnceCell<Layout>,
    /// One session per owner, created on the owner's first acquire.
    owners: Mutex<HashMap<String, Slot>>,
    /// A session for reads, lists and releases by someone other than the grant's maker.
    reader: tokio::sync::Mutex<Option<zk::Client>>,
    /// Lease nodes known to exist (they are never deleted).
    known: Mutex<HashSet<String>>,
    /// The clock of local expiries: the holder clock, which counts host suspend.
    pub(crate) clock: HolderClock,
    /// The watch behind [`GrantChanges`], started by the first check.
    changes: crate::changes::Watches,
}

/// A lease store on ZooKeeper: one ephemeral holder node per held lease, on one session
/// per owner. Cloning shares the sessions. Dropping the last clone leaves the owners'
/// sessions to the server, which ends them (deleting their grants) after the session
/// timeout: release what you hold first.
#[derive(Clone)]
pub struct ZooKeeperStore {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for ZooKeeperStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZooKeeperStore")
            .field("connect", &self.inner.options.connect)
            .field("root", &self.inner.options.root)
            .finish()
    }
}

pub(crate) fn acls(options: &ZooKeeperOptions) -> zk::Acls<'static> {
    if options.auth.is_some() {
        zk::Acls::creator_all()
    } else {
        zk::Acls::anyone_all()
    }
}

impl ZooKeeperStore {
    /// A store with `options`. Connects lazily: the first operation of each owner opens its
    /// session. Fails only on invalid options (root path).
    pub fn new(options: ZooKeeperOptions) -> Result<Self, ConfigError> {
        ZooKeeperStore::with_clock(options, HolderClock::host())
    }

    /// [`ZooKeeperStore::new`] measuring local expiries on `clock` (the holder clock of the
    /// Lease API, which counts host suspend; tests inject [`HolderClock::manual`]).
    pub fn with_clock(options: ZooKeeperOptions, clock: HolderClock) -> Result<Self, ConfigError> {
        check_root(&options.root).map_err(|e| ConfigError::invalid("root", e.to_string()))?;
        Ok(ZooKeeperStore {
            inner: Arc::new(Inner {
                layout: tokio::sync::OnceCell::new(),
                options,
                owners: Mutex::new(HashMap::new()),
                reader: tokio::sync::Mutex::default(),
                known: Mutex::new(HashSet::new()),
                clock,
                changes: crate::changes::Watches::default(),
            }),
        })
    }

    /// The session `owner`'s grants live on, while it is not over: its id and password
    /// (diagnostics; another client can close it with them).
    pub async fn session_of(&self, owner: &str) -> Option<zk::SessionInfo> {
        self.existing_session(owner)
            .await
            .filter(|s| s.usable())
            .map(|s| s.client.session().clone())
    }

    /// The options this store was made with.
    pub fn options(&self) -> &ZooKeeperOptions {
        &self.inner.options
    }

    /// The fence of a write guarded by lease `name` with fencing token `token`, for the
    /// caller's own `multi` (see [`ZooKeeperFence`]): `Ok(None)` when that grant is not the
    /// lease's current one now (released, expired, replaced), `Err` when the store could
    /// not be read. The multi it is added to commits only while the grant stays current.
    pub async fn fence(
        &self,
        name: &str,
        token: FencingToken,
    ) -> Result<Option<crate::ZooKeeperFence>, StoreError> {
        let client = self.reader().await?;
        let lease = self.layout().await?.lease(name)?;
        let holder = self.layout().await?.holder(name)?;
        // The lease node first: a grant made between the two reads has another holder
        // node (another czxid), so the version read belongs to the fenced grant or the
        // fence is refused here.
        let version = match client.check_stat(&lease).await {
            Ok(Some(stat)) => stat.version,
            Ok(None) => return Ok(None),
            Err(e) => return Err(from_zk(&format!("reading {lease}"), &e)),
        };
        match client.check_stat(&holder).await {
            Ok(Some(stat)) if crate::node::token(stat.czxid) == token => {
                Ok(Some(crate::ZooKeeperFence {
                    lease,
                    version,
                    holder,
                }))
            }
            Ok(_) => Ok(None),
            Err(e) => Err(from_zk(&format!("reading {holder}"), &e)),
        }
    }

    /// Opens a new session with the configured timeouts and auth. A `detached` session is
    /// not closed when the store is dropped: the server ends it after its timeout, so the
    /// grants on it last as long as their ttl promised (a holder that exits without
    /// releasing leaves them to expire, as with every other store). A `gated` session (an
    /// owner's, on a families root without `auth`) adds the layout's gate identity, which
    /// lets it create family parents and lease nodes.
    async fn connect(&self, detached: bool, gated: bool) -> Result<zk::Client, StoreError> {
        let o = &self.inner.options;
        let mut connector = zk::Client::connector()
            .with_session_timeout(o.session_timeout)
            .with_connection_timeout(o.connection_timeout);
        if detached {
            connector = connector.with_detached();
        }
        match &o.auth {
            Some((scheme, cred)) => connector = connector.with_auth(scheme, cred),
            // The gate identity of the families layout (module `node`), only where it is
            // needed: with `auth`, the creator-only ACL would hand it every right on the
            // nodes this session creates; on a flat root it has no use.
            None if gated => {
                connector = connector.with_auth("digest", crate::node::GATE_CREDENTIALS)
            }
            None => {}
        }
        let what = format!("connecting to {}", o.connect);
        let client = tokio::time::timeout(o.connection_timeout, connector.connect(&o.connect))
            .await
            .map_err(|_| {
                StoreError::unavailable(
                    KIND,
                    format!("{what}: no session within {:?}", o.connection_timeout),
                )
            })?
            .map_err(|e| from_zk(&what, &e))?;
        if client.session_timeout() < o.session_timeout {
            tracing::warn!(
                requested = ?o.session_timeout,
                negotiated = ?client.session_timeout(),
                "ZooKeeper granted a shorter session timeout than asked for (server maxSessionTimeout); \
                 leases with a longer ttl will be refused"
            );
        }
        Ok(client)
    }

    /// The session of `owner`, opened (or replaced, when over) on demand. Refuses a ttl
    /// longer than the negotiated session timeout: the server could then end the session
    /// before the holder's deadline.
    pub(crate) async fn owner_session(
        &self,
        owner: &str,
        ttl: Duration,
    ) -> Result<Arc<OwnerSession>, StoreError> {
        let slot = self
            .inner
            .owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(owner.to_string())
            .or_default()
            .clone();
        let mut current = slot.lock().await;
        let session = match &*current {
            Some(s) if s.usable() => s.clone(),
            _ => {
                let layout = self.layout().await?.clone();
                let s = OwnerSession::start(
                    self.connect(true, layout.has_families()).await?,
                    layout,
                    self.inner.clock.clone(),
                );
                *current = Some(s.clone());
                s
            }
        };
        check_ttl(&session, ttl)?;
        Ok(session)
    }

    /// The current session of `owner`, if it has one.
    async fn existing_session(&self, owner: &str) -> Option<Arc<OwnerSession>> {
        let slot = self
            .inner
            .owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(owner)
            .cloned()?;
        slot.lock().await.clone()
    }

    /// Forgets `session` of `owner` (it is over); the next acquire opens a new one.
    async fn drop_session(&self, owner: &str, session: &Arc<OwnerSession>) {
        let slot = self
            .inner
            .owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(owner)
            .cloned();
        if let Some(slot) = slot {
            let mut current = slot.lock().await;
            if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, session)) {
                *current = None;
            }
        }
    }

    /// The reader session.
    async fn reader(&self) -> Result<zk::Client, StoreError> {
        let mut current = self.inner.reader.lock().await;
        match &*current {
            Some(c)
                if !matches!(
                    c.state(),
                    zk::SessionState::Expired
                        | zk::SessionState::Closed
                        | zk::SessionState::AuthFailed
                ) =>
            {
                Ok(c.clone())
            }
            _ => {
                let c = self.connect(false, false).await?;
                *current = Some(c.clone());
                Ok(c)
            }
        }
    }

    /// The root's layout (module [`node`](crate::node)): read from the root's ACL by the
    /// first call, which creates the root when missing, with the families layout (or,
    /// with `auth`, the flat one). A root that exists keeps its layout.
    pub(crate) async fn layout(&self) -> Result<&Layout, StoreError> {
        self.inner
            .layout
            .get_or_try_init(|| async {
                let client = self.reader().await?;
                let root = self.inner.options.root.clone();
                let layout = read_layout(&client, &root, &self.inner.options).await?;
                if layout.has_families() {
                    tracing::debug!(%root, "ZooKeeper root has the families layout");
                } else {
                    tracing::info!(
                        %root,
                        "ZooKeeper root has the flat layout (created by an earlier version, or \
                         with auth): it stays flat, and listing a family of leases reads every \
                         lease under the root; docs/operations.md tells how to move to a root \
                         with the families layout"
                    );
                }
                Ok(layout)
            })
            .await
    }

    /// Creates the lease node of `name` (and its family's parent, or the root) when missing.
    pub(crate) async fn ensure_lease_node(
        &self,
        client: &zk::Client,
        name: &str,
    ) -> Result<(), StoreError> {
        let layout = self.layout().await?;
        let lease = layout.lease(name)?;
        let opts = zk::CreateMode::Persistent.with_acls(acls(&self.inner.options));
        let what = || format!("creating {lease}");
        match client.create(&lease, &[], &opts).await {
            Ok(_) | Err(zk::Error::NodeExists) => return Ok(()),
            Err(zk::Error::NoNode) => {}
            Err(e) => return Err(from_zk(&what(), &e)),
        }
        match layout.family_of(name) {
            // A family's parent carries the gate ACL, as the root does: an earlier client
            // must not create a lease node in it.
            Some(family) => {
                let parent = layout.family_parent(family);
                let gated = zk::CreateMode::Persistent.with_acls(crate::node::gated_acls());
                match client.create(&parent, &[], &gated).await {
                    Ok(_) | Err(zk::Error::NodeExists) => {}
                    Err(e) => return Err(from_zk(&format!("creating {parent}"), &e)),
                }
                match client.create(&lease, &[], &opts).await {
                    Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
                    Err(e) => Err(from_zk(&what(), &e)),
                }
            }
            None if layout.has_families() => Err(backend(format!(
                "{}: the root {} is gone (a root is never deleted while clients use it)",
                what(),
                layout.root()
            ))),
            None => client
                .mkdir(&lease, &opts)
                .await
                .map_err(|e| from_zk(&what(), &e)),
        }
    }

    /// The local expiry of the grant `(name, token)` if one of this store's sessions made it:
    /// `Some(None)` when it has ended here (being deleted), `Some(Some(left))` while live.
    async fn local_expiry(&self, name: &str, token: FencingToken) -> Option<Option<Duration>> {
        let slots: Vec<Slot> = self
            .inner
            .owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        let now = self.inner.clock.now();
        for slot in slots {
            let session = slot.lock().await.clone();
            if let Some(g) = session
                .and_then(|s| s.grant(name))
                .filter(|g| g.token == token)
            {
                return Some(g.live(now).then(|| g.expires_at - now));
            }
        }
        None
    }

    /// The record of a holder node's data and stat, or `None` when this store already
    /// considers that grant ended.
    async fn holder_record(
        &self,
        name: &str,
        path: &str,
        data: &[u8],
        stat: &zk::Stat,
    ) -> Result<Option<LeaseRecord>, StoreError> {
        let grant = GrantData::decode(path, data)?;
        let t = token(stat.czxid);
        let expires_in = match self.local_expiry(name, t).await {
            Some(None) => return Ok(None),
            Some(Some(left)) => Some(left),
            None => None,
        };
        Ok(Some(grant.record(name, t, stat.version, expires_in)))
    }

    pub(crate) fn lease_node_known(&self, name: &str) -> bool {
        self.inner
            .known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(name)
    }

    pub(crate) fn set_lease_node_known(&self, name: &str) {
        self.inner
            .known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string());
    }

    /// One attempt at a new grant, in one multi: sets the lease node's data (a new lease
    /// version; or creates the lease node when this store has not seen it yet), deletes the
    /// current holder node when `replace` names its version, and creates ours.
    /// `Ok(None)`: something changed meanwhile (retry).
    async fn grant(
        &self,
        s: &OwnerSession,
        req: &AcquireRequest,
        data: &[u8],
        replace: Option<i32>,
    ) -> Result<Option<LeaseRecord>, GrantError> {
        let lease = self.layout().await?.lease(&req.name)?;
        let holder = format!("{lease}/{}", crate::node::HOLDER);
        let acls = acls(&self.inner.options);
        let fresh = replace.is_none() && !self.lease_node_known(&req.name);
        let mut multi = s.client.new_multi_writer();
        let built = if fresh {
            multi.add_create(&lease, &[], &zk::CreateMode::Persistent.with_acls(acls))
        } else {
            Ok(())
        }
        .and_then(|_| multi.add_set_data(&lease, &[], None))
        .and_then(|_| match replace {
            Some(v) => multi.add_delete(&holder, Some(v)),
            None => Ok(()),
        })
        .and_then(|_| multi.add_create(&holder, data, &zk::CreateMode::Ephemeral.with_acls(acls)));
        built.map_err(|e| from_zk(&format!("acquiring {holder}"), &e))?;
        let sent = self.inner.clock.now();
        match multi.commit().await {
            Ok(results) => {
                // One multi is one transaction with one zxid: the holder node's czxid is the
                // lease node's new mzxid.
                // (ZooKeeper 3.8 returns no stat for a create inside a multi.)
                let set = results.iter().find_map(|r| match r {
                    zk::MultiWriteResult::SetData { stat } => Some(stat),
                    _ => None,
                });
                let Some(stat) = set else {
                    return Err(backend(format!(
                        "acquiring {holder}: unexpected answer {results:?}"
                    ))
                    .into());
                };
                let (t, lease_version) = (token(stat.mzxid), stat.version);
                self.set_lease_node_known(&req.name);
                s.record(
                    &req.name,
                    Grant {
                        token: t,
                        instance: req.instance.clone(),
                        lease_version,
                        holder_version: 0,
                        expires_at: self.inner.clock.now().max(sent) + req.ttl,
                        ending: false,
                    },
                );
                Ok(Some(GrantData::new(req).record(
                    &req.name,
                    t,
                    0,
                    Some(req.ttl),
                )))
            }
            Err(zk::MultiWriteError::OperationFailed {
                index: 0,
                source: zk::Error::NodeExists,
            }) if fresh => {
                self.set_lease_node_known(&req.name);
                Ok(None)
            }
            Err(zk::MultiWriteError::OperationFailed {
                index: 0,
                source: zk::Error::NoNode,
            }) => {
                self.ensure_lease_node(&s.client, &req.name).await?;
                self.set_lease_node_known(&req.name);
                Ok(None)
            }
            Err(zk::MultiWriteError::OperationFailed {
                source: zk::Error::NodeExists,
                ..
            }) if replace.is_none() => Err(GrantError::Exists),
            Err(zk::MultiWriteError::OperationFailed {
                source: zk::Error::NodeExists | zk::Error::NoNode | zk::Error::BadVersion,
                ..
            }) => Ok(None),
            Err(e) => Err(GrantError::Zk(format!("acquiring {holder}"), e.into())),
        }
    }

    async fn acquire_on(
        &self,
        s: &Arc<OwnerSession>,
        req: &AcquireRequest,
    ) -> Result<AcquireOutcome, GrantError> {
        let holder = self.layout().await?.holder(&req.name)?;
        let data = GrantData::new(req).encode();
        for _ in 0..MAX_ATTEMPTS {
            match self.grant(s, req, &data, None).await {
                Ok(Some(record)) => return Ok(AcquireOutcome::Granted(record)),
                Ok(None) => continue,
                Err(GrantError::Exists) => {}
                Err(e) => return Err(e),
            }
            let (bytes, stat) = match s.client.get_data(&holder).await {
                Ok(found) => found,
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(GrantError::Zk(format!("reading {holder}"), e)),
            };
            let current = GrantData::decode(&holder, &bytes)?;
            let t = token(stat.czxid);
            let step = req.step(Some(&current.clone().record(
                &req.name,
                t,
                stat.version,
                None,
            )));
            if step == AcquireStep::Held {
                let expires_in = self.local_expiry(&req.name, t).await.flatten();
                return Ok(AcquireOutcome::Held(current.record(
                    &req.name,
                    t,
                    stat.version,
                    expires_in,
                )));
            }
            let now = self.inner.clock.now();
            let mine = s.grant(&req.name).filter(|g| {
                g.token == t
                    && g.instance == req.instance
                    && g.live(now)
                    && stat.ephemeral_owner == s.session_id()
            });
            if let (Some(mut g), AcquireStep::Extend) = (mine, step) {
                // Reentrant: same token, fresh expiry, the note rewritten; the grant's
                // priority and pending request stay.
                let refreshed = GrantData {
                    note: req.note.clone().or(current.note.clone()),
                    ttl_ms: millis(req.ttl),
                    ..current
                };
                let sent = self.inner.clock.now();
                match s
                    .client
                    .set_data(&holder, &refreshed.encode(), Some(stat.version))
                    .await
                {
                    Ok(new) => {
                        g.holder_version = new.version;
                        g.expires_at = g.expires_at.max(self.inner.clock.now().max(sent) + req.ttl);
                        s.record(&req.name, g);
                        return Ok(AcquireOutcome::Granted(refreshed.record(
                            &req.name,
                            t,
                            new.version,
                            Some(req.ttl),
                        )));
                    }
                    Err(zk::Error::BadVersion | zk::Error::NoNode) => continue,
                    Err(e) => return Err(GrantError::Zk(format!("refreshing {holder}"), e)),
                }
            }
            // This instance's ended grant, or a node of this instance that no recorded grant
            // accounts for (an acquire of unknown outcome), or an emergency take-over:
            // replaced with a new token.
            if let Some(record) = self.grant(s, req, &data, Some(stat.version)).await? {
                return Ok(AcquireOutcome::Granted(record));
            }
        }
        Err(backend(format!(
            "acquiring {holder}: the holder node changed {MAX_ATTEMPTS} times while we looked"
        ))
        .into())
    }

    /// Reads the holder node of `name` (reader session): its data and stat, `None` when
    /// absent or when this store already considers that grant ended.
    async fn read_holder(
        &self,
        client: &zk::Client,
        name: &str,
    ) -> Result<Option<(GrantData, zk::Stat)>, StoreError> {
        let holder = self.layout().await?.holder(name)?;
        let (bytes, stat) = match client.get_data(&holder).await {
            Ok(found) => found,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(from_zk(&format!("reading {holder}"), &e)),
        };
        if matches!(self.local_expiry(name, token(stat.czxid)).await, Some(None)) {
            return Ok(None);
        }
        Ok(Some((GrantData::decode(&holder, &bytes)?, stat)))
    }

    /// Rewrites the holder node's pending request if its data version is still `stat`'s, and
    /// counts the write on the root's data version in the same multi (see
    /// [`crate::pending`]): `Ok(Some(new stat))` written, `Ok(None)` changed or gone
    /// meanwhile (read again).
    async fn set_request(
        &self,
        client: &zk::Client,
        name: &str,
        data: &GrantData,
        stat: &zk::Stat,
    ) -> Result<Option<zk::Stat>, StoreError> {
        let layout = self.layout().await?;
        let holder = layout.holder(name)?;
        let what = format!("writing the request on {holder}");
        let mut multi = client.new_multi_writer();
        multi
            .add_set_data(&holder, &data.encode(), Some(stat.version))
            .and_then(|_| multi.add_set_data(layout.root(), &[], None))
            .map_err(|e| from_zk(&what, &e))?;
        match multi.commit().await {
            Ok(results) => match results.first() {
                Some(zk::MultiWriteResult::SetData { stat }) => Ok(Some(*stat)),
                _ => Err(backend(format!("{what}: unexpected answer {results:?}"))),
            },
            Err(zk::MultiWriteError::OperationFailed {
                index: 0,
                source: zk::Error::BadVersion | zk::Error::NoNode,
            }) => Ok(None),
            Err(zk::MultiWriteError::OperationFailed { index: 1, source }) => Err(from_zk(
                &format!(
                    "{what}: counting it on {} (the store's clients need write permission \
                     on the root node)",
                    layout.root()
                ),
                &source,
            )),
            Err(e) => Err(from_zk(&what, &e.into())),
        }
    }

    /// Reads the holder nodes of `names` with pipelined multi-reads; `None` where absent.
    async fn read_holders(
        &self,
        client: &zk::Client,
        names: &[String],
    ) -> Result<Vec<Option<(Vec<u8>, zk::Stat)>>, StoreError> {
        let layout = self.layout().await?;
        let mut pending = Vec::new();
        for chunk in names.chunks(READS_PER_MULTI) {
            let mut multi = client.new_multi_reader();
            for name in chunk {
                multi
                    .add_get_data(&layout.holder(name)?)
                    .map_err(|e| from_zk(&format!("reading lease {name}"), &e))?;
            }
            pending.push(multi.commit());
        }
        let mut out = Vec::with_capacity(names.len());
        for answer in futures::future::join_all(pending).await {
            let answer = answer.map_err(|e| from_zk("reading holder nodes", &e))?;
            for r in answer {
                out.push(match r {
                    zk::MultiReadResult::Data { data, stat } => Some((data, stat)),
                    zk::MultiReadResult::Error {
                        err: zk::Error::NoNode,
                    } => None,
                    zk::MultiReadResult::Error { err } => {
                        return Err(from_zk("reading holder nodes", &err));
                    }
                    other => return Err(backend(format!("unexpected read answer {other:?}"))),
                });
            }
        }
        Ok(out)
    }
}

/// The children of `parent`; none when it does not exist.
async fn children(client: &zk::Client, parent: &str) -> Result<Vec<String>, StoreError> {
    match client.list_children(parent).await {
        Ok(children) => Ok(children),
        Err(zk::Error::NoNode) => Ok(Vec::new()),
        Err(e) => Err(from_zk(&format!("listing {parent}"), &e)),
    }
}

/// The layout of `root` (its ACL tells: [`Layout::detect`]); a missing root is created
/// first, with the families layout, or with `auth` (whose creator-only ACL leaves no room for
/// the gate) the flat one. Creating it and reading it back in one loop makes every client
/// agree on the layout of the root that won.
async fn read_layout(
    client: &zk::Client,
    root: &str,
    options: &ZooKeeperOptions,
) -> Result<Layout, StoreError> {
    for _ in 0..MAX_ATTEMPTS {
        match client.get_acl(root).await {
            Ok((found, _)) => return Ok(Layout::detect(root.to_string(), &found)),
            Err(zk::Error::NoNode) => {}
            Err(e) => return Err(from_zk(&format!("reading the ACL of {root}"), &e)),
        }
        let families = options.auth.is_none();
        let created = if families {
            crate::node::gated_acls()
        } else {
            acls(options)
        };
        match client
            .create(root, &[], &zk::CreateMode::Persistent.with_acls(created))
            .await
        {
            Ok(_) if families => return Ok(Layout::families(root.to_string())),
            Ok(_) => return Ok(Layout::flat(root.to_string())),
            // Created meanwhile by another client: its ACL tells the layout.
            Err(zk::Error::NodeExists) => {}
            Err(zk::Error::NoNode) => {
                let parent = root.rsplit_once('/').map_or("", |(p, _)| p);
                if !parent.is_empty() {
                    let opts = zk::CreateMode::Persistent.with_acls(acls(options));
                    client
                        .mkdir(parent, &opts)
                        .await
                        .map_err(|e| from_zk(&format!("creating {parent}"), &e))?;
                }
            }
            Err(e) => return Err(from_zk(&format!("creating {root}"), &e)),
        }
    }
    Err(backend(format!(
        "reading the layout of {root}: it was created and deleted {MAX_ATTEMPTS} times while we \
         looked"
    )))
}

fn check_ttl(session: &OwnerSession, ttl: Duration) -> Result<(), StoreError> {
    if ttl > session.timeout {
        return Err(backend(format!(
            "ttl {ttl:?} exceeds the negotiated ZooKeeper session timeout {:?} (the server \
             bounds it by maxSessionTimeout, default 20 x tickTime): the server could end the \
             session, and every lease on it, before the holder's deadline; lower \
             heartbeat-timeout or raise session-timeout / the server's maxSessionTimeout",
            session.timeout
        )));
    }
    Ok(())
}

enum GrantError {
    /// The holder node exists (only from a plain grant attempt).
    Exists,
    Zk(String, zk::Error),
    Store(StoreError),
}

impl From<StoreError> for GrantError {
    fn from(e: StoreError) -> Self {
        GrantError::Store(e)
    }
}

#[async_trait]
impl LeaseStore for ZooKeeperStore {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_fencing: true,
            server_side_expiry: true,
            durable: true,
        }
    }

    /// Printable ASCII without `/`, up to 255 bytes (one path segment).
    fn name_rules(&self) -> NameRules {
        NameRules {
            max_len: 255,
            allowed: |c| c.is_ascii_graphic() && c != '/',
        }
    }

    /// Creates the ephemeral holder node on the owner's session (token: its czxid), or
    /// refreshes it (reentrant: same owner and instance), or replaces it (expired here, or a
    /// node of this instance that no recorded grant accounts for; emergency).
    /// `Ok(Held)` when another owner's or another instance's holder node exists. `Err`:
    /// unknown; a node it may have created is deleted one ttl later (module
    /// [`session`](crate::session)).
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome, StoreError> {
        let s = self.owner_session(&req.owner, req.ttl).await?;
        // Dropped unsettled (an error, or the caller's timeout cancelling this call), the
        // guard leaves a doubt: a holder node this call may have created is reaped after ttl.
        let mut guard = s.acquiring(&req.name, req.ttl);
        match self.acquire_on(&s, req).await {
            Ok(outcome) => {
                guard.settle();
                Ok(outcome)
            }
            Err(GrantError::Store(e)) => Err(e),
            Err(GrantError::Exists) => Err(backend("holder node exists")),
            Err(GrantError::Zk(what, e)) => {
                if session_over(&e) {
                    self.drop_session(&req.owner, &s).await;
                }
                Err(from_zk(&what, &e))
            }
        }
    }

    /// One round trip for any number of leases: `sync`, `getEphemerals` of the owner's
    /// session, `exists` of the root and a multi-read of the holder nodes whose pending
    /// request this session has not read yet, pipelined; a second round trip re-reads the
    /// other holder nodes only when a request was written under the root since they were
    /// read (the root's data version moved; the `pending` module says why). The request keeps
    /// the session alive on the server for at least its timeout (≥ `ttl`); a lease is
    /// renewed (its local expiry moved to answer + `ttl`) when this store made the grant
    /// with that token, has not expired it, the server lists its holder node as an
    /// ephemeral of the session, and the node carries no forceful preemption request; with
    /// one, the renewal is `Refused` and the local expiry stays, so this store deletes the
    /// grant at most one ttl after its last renewal. An owner without a session, or whose
    /// session is over, holds nothing: all `NotHeld`.
    async fn renew(
        &self,
        owner: &str,
        leases: &[HeldLease],
        ttl: Duration,
    ) -> Result<Vec<Renewal>, StoreError> {
        let Some(s) = self.existing_session(owner).await else {
            return Ok(vec![Renewal::NotHeld; leases.len()]);
        };
        if !s.usable() {
            self.drop_session(owner, &s).await;
            return Ok(vec![Renewal::NotHeld; leases.len()]);
        }
        check_ttl(&s, ttl)?;
        let layout = self.layout().await?;
        let root = layout.root();
        let (seen, mut known) = s.pending().lookup(leases);
        let unknown: Vec<usize> = (0..leases.len()).filter(|&i| known[i].is_none()).collect();
        let names = |which: &[usize]| -> Vec<String> {
            which.iter().map(|&i| leases[i].name.clone()).collect()
        };
        // Requests are sent in call order on the session's connection and answered in that
        // order, so the reads see every write the server committed before the `sync`, and
        // the holder nodes are read after the root's version.
        let (synced, listed, counted, fresh) = futures::future::join4(
            s.client.sync(root),
            s.client.list_ephemerals(root),
            s.client.check_stat(root),
            self.read_holders(&s.client, &names(&unknown)),
        )
        .await;
        let paths = match synced.and(listed) {
            Ok(paths) => paths,
            Err(e) if session_over(&e) => {
                self.drop_session(owner, &s).await;
                return Ok(vec![Renewal::NotHeld; leases.len()]);
            }
            Err(e) => return Err(from_zk(&format!("renewing leases of {owner}"), &e)),
        };
        // The names of the leases whose holder node is an ephemeral of the session.
        let alive: HashSet<&str> = paths.iter().filter_map(|p| layout.holder_name(p)).collect();
        let version = counted
            .map_err(|e| from_zk(&format!("renewing leases of {owner}"), &e))?
            .map(|stat| stat.version);
        let mut read = unknown.into_iter().zip(fresh?).collect::<Vec<_>>();
        // The root moved since the entries were read: they may be stale, read them again.
        let complete = version != seen;
        if complete {
            let stale: Vec<usize> = (0..leases.len()).filter(|&i| known[i].is_some()).collect();
            let again = self.read_holders(&s.client, &names(&stale)).await?;
            read.extend(stale.into_iter().zip(again));
        }
        let mut learnt = Vec::with_capacity(read.len());
        for (i, found) in read {
            let lease = &leases[i];
            let request = match found {
                Some((data, stat)) if token(stat.czxid) == lease.token => {
                    let path = layout.holder(&lease.name)?;
                    GrantData::decode(&path, &data)?.request
                }
                _ => None,
            };
            learnt.push((lease.name.clone(), lease.token, request.clone()));
            known[i] = Some(request);
        }
        if let Some(version) = version {
            s.pending().update(version, learnt, complete);
        }
        let requests: Vec<Option<PreemptionRequest>> =
            known.into_iter().map(Option::flatten).collect();
        let forced: Vec<bool> = requests
            .iter()
            .map(|r| r.as_ref().is_some_and(|r| r.forceful))
            .collect();
        let held = s.extend(leases, &alive, &forced, ttl);
        Ok(held
            .into_iter()
            .zip(requests)
            .map(|(held, request)| match (held, request) {
                (false, _) => Renewal::NotHeld,
                (true, Some(r)) if r.forceful => Renewal::Refused(r),
                (true, request) => Renewal::Renewed { request },
            })
            .collect())
    }

    /// Deletes the holder node if no grant happened since `owner`'s grant with `token`
    /// (a version check on the lease node, in the same multi).
    async fn release(
        &self,
        name: &str,
        owner: &str,
        token_: FencingToken,
    ) -> Result<bool, StoreError> {
        if let Some(s) = self.existing_session(owner).await
            && let Some(g) = s.grant(name).filter(|g| g.token == token_)
        {
            return match s.delete_grant(name, g.lease_version).await {
                Ok(done) => {
                    s.forget(name, token_);
                    Ok(done)
                }
                Err(e) => Err(from_zk(&format!("releasing lease {name}"), &e)),
            };
        }
        // Not granted through this store: check owner and token on the server.
        let client = self.reader().await?;
        let lease = self.layout().await?.lease(name)?;
        let holder = format!("{lease}/{}", crate::node::HOLDER);
        let mut multi = client.new_multi_reader();
        multi
            .add_get_data(&lease)
            .and_then(|_| multi.add_get_data(&holder))
            .map_err(|e| from_zk(&format!("releasing lease {name}"), &e))?;
        let answer = multi
            .commit()
            .await
            .map_err(|e| from_zk(&format!("releasing lease {name}"), &e))?;
        let (
            Some(zk::MultiReadResult::Data {
                stat: lease_stat, ..
            }),
            Some(zk::MultiReadResult::Data { data, stat }),
        ) = (answer.first(), answer.get(1))
        else {
            return Ok(false);
        };
        let current = GrantData::decode(&holder, data)?;
        if current.owner != owner || token(stat.czxid) != token_ {
            return Ok(false);
        }
        let mut multi = client.new_multi_writer();
        multi
            .add_check_version(&lease, lease_stat.version)
            .and_then(|_| multi.add_delete(&holder, Some(stat.version)))
            .map_err(|e| from_zk(&format!("releasing lease {name}"), &e))?;
        match multi.commit().await {
            Ok(_) => Ok(true),
            Err(zk::MultiWriteError::OperationFailed {
                source: zk::Error::BadVersion | zk::Error::NoNode,
                ..
            }) => Ok(false),
            Err(e) => Err(from_zk(&format!("releasing lease {name}"), &e.into())),
        }
    }

    async fn read(&self, name: &str) -> Result<Option<LeaseRecord>, StoreError> {
        let client = self.reader().await?;
        let holder = self.layout().await?.holder(name)?;
        match client.get_data(&holder).await {
            Ok((data, stat)) => self.holder_record(name, &holder, &data, &stat).await,
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(from_zk(&format!("reading {holder}"), &e)),
        }
    }

    /// Flat layout: the root's children, those starting with `prefix`. Families layout
    /// (module [`node`](crate::node)): when `prefix` has a family, only that family's
    /// parent's children; otherwise the root's children, and those of the family parents
    /// that start with `prefix`. Then the holder nodes of the names found, in multi-reads.
    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        let client = self.reader().await?;
        let layout = self.layout().await?;
        let mut names = match layout.family_of(prefix) {
            Some(family) => children(&client, &layout.family_parent(family)).await?,
            None => {
                let mut names = Vec::new();
                let mut families = Vec::new();
                for child in children(&client, layout.root()).await? {
                    match layout.family_of(&child) {
                        None => names.push(child),
                        Some(family) if family == child => {
                            if child.starts_with(prefix) {
                                families.push(layout.family_parent(&child));
                            }
                        }
                        // Not where this layout puts a lease node: no lease's.
                        Some(_) => {}
                    }
                }
                let listed = futures::future::join_all(
                    families.iter().map(|parent| children(&client, parent)),
                )
                .await;
                for found in listed {
                    names.extend(found?);
                }
                names
            }
        };
        names.retain(|n| n.starts_with(prefix));
        names.sort();
        let holders = self.read_holders(&client, &names).await?;
        let mut out = Vec::new();
        for (name, found) in names.iter().zip(holders) {
            if let Some((data, stat)) = found {
                let path = layout.holder(name)?;
                if let Some(r) = self.holder_record(name, &path, &data, &stat).await? {
                    out.push(r);
                }
            }
        }
        Ok(out)
    }

    tenure_lease::capability_accessors!(
        fair_queue,
        preemption_requests,
        remembered_ids,
        grant_changes
    );
}

#[async_trait]
impl GrantChanges for ZooKeeperStore {
    /// A `sync` on the reader session, then the events of a persistent recursive watch on
    /// the root that arrived before its answer, counted per prefix (module
    /// [`changes`](crate::changes)): every grant made or ended is the creation or deletion
    /// of its holder node, including a crashed holder's, which the server deletes with its
    /// session; a note replaced sets the node's data; renewals write nothing. The first
    /// check starts the watch (one request), and the first check of a prefix answers
    /// changed. A disconnection (events may be lost meanwhile) makes the next check answer
    /// changed. A grant this store expired shows as ended once its deletion is committed,
    /// which follows the expiry at once unless the server is unreachable.
    async fn changes_since(
        &self,
        prefix: &str,
        since: Option<ChangeVersion>,
    ) -> Result<Changes, StoreError> {
        let client = self.reader().await?;
        crate::changes::changes_since(
            &self.inner.changes,
            &client,
            self.layout().await?,
            prefix,
            since,
        )
        .await
    }
}

#[async_trait]
impl FairQueue for ZooKeeperStore {
    /// Queues an ephemeral sequential waiter node under the lease node and waits, watching
    /// only its predecessor (the holder node once first), Curator's recipe. See
    /// [`fair`](crate::fair) for cancellation and timeouts.
    async fn acquire_fair(
        &self,
        req: &AcquireRequest,
        wait: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        self.fair(req, wait).await
    }
}

#[async_trait]
impl PreemptionRequests for ZooKeeperStore {
    /// Writes the request into the holder node's data with a version-checked `setData`
    /// (read, decide with [`PreemptionRequest::may_replace`], write; again on a race), in
    /// one multi with a write of the root's data that renewals watch for. The node's czxid,
    /// and so the token, stays.
    async fn request_preemption(
        &self,
        name: &str,
        token_: FencingToken,
        request: &PreemptionRequest,
    ) -> Result<PreemptAnswer, StoreError> {
        let client = self.reader().await?;
        for _ in 0..MAX_ATTEMPTS {
            let Some((data, stat)) = self
                .read_holder(&client, name)
                .await?
                .filter(|(_, stat)| token(stat.czxid) == token_)
            else {
                return Ok(PreemptAnswer::Gone);
            };
            if !request.may_replace(data.priority, data.request.as_ref()) {
                return Ok(PreemptAnswer::Refused(data.record(
                    name,
                    token_,
                    stat.version,
                    None,
                )));
            }
            let data = GrantData {
                request: Some(request.clone()),
                ..data
            };
            if let Some(new) = self.set_request(&client, name, &data, &stat).await? {
                return Ok(PreemptAnswer::Recorded(data.record(
                    name,
                    token_,
                    new.version,
                    None,
                )));
            }
        }
        Err(backend(format!(
            "requesting preemption of lease {name}: its holder node changed {MAX_ATTEMPTS} \
             times while we looked"
        )))
    }

    /// Clears the holder node's request if it is `by`'s (version-checked `setData`, with
    /// the root's data write, as a request).
    async fn withdraw_preemption(
        &self,
        name: &str,
        token_: FencingToken,
        by: &str,
    ) -> Result<bool, StoreError> {
        let client = self.reader().await?;
        for _ in 0..MAX_ATTEMPTS {
            let Some((data, stat)) = self.read_holder(&client, name).await? else {
                return Ok(false);
            };
            if token(stat.czxid) != token_ || data.request.as_ref().is_none_or(|r| r.by != by) {
                return Ok(false);
            }
            let data = GrantData {
                request: None,
                ..data
            };
            if self
                .set_request(&client, name, &data, &stat)
                .await?
                .is_some()
            {
                return Ok(true);
            }
        }
        Err(backend(format!(
            "withdrawing a preemption request from lease {name}: its holder node changed \
             {MAX_ATTEMPTS} times while we looked"
        )))
    }
}

#[async_trait]
impl RememberedIds for ZooKeeperStore {
    /// After a `sync`, the grant's fence ([`ZooKeeperStore::fence`]) and the ids present
    /// are read; then one multi per 200 ids creates and deletes their nodes, each with the
    /// fence's two checks, so a multi commits only while the grant is current. A change of
    /// more than 200 ids may be applied in part: `Ok(false)` once a part finds the grant
    /// gone. `owner` is not checked: the token (the holder node's czxid) names the grant.
    async fn remember(
        &self,
        name: &str,
        _owner: &str,
        token_: FencingToken,
        change: &RememberChange,
    ) -> Result<bool, StoreError> {
        let client = self.reader().await?;
        let lease = self.layout().await?.lease(name)?;
        let dir = self.layout().await?.remembered(name)?;
        // A read after the sync sees every write committed before it (this session's
        // server may lag the leader otherwise).
        client
            .sync(&lease)
            .await
            .map_err(|e| from_zk(&format!("syncing {lease}"), &e))?;
        let Some(fence) = self.fence(name, token_).await? else {
            return Ok(false);
        };
        if change.is_empty() {
            return Ok(true);
        }
        let opts = zk::CreateMode::Persistent.with_acls(acls(&self.inner.options));
        match client.create(&dir, &[], &opts).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            // The lease node is gone: so is the grant.
            Err(zk::Error::NoNode) => return Ok(false),
            Err(e) => return Err(from_zk(&format!("creating {dir}"), &e)),
        }
        for _ in 0..MAX_ATTEMPTS {
            let present: HashSet<String> = match client.list_children(&dir).await {
                Ok(children) => children.into_iter().collect(),
                Err(zk::Error::NoNode) => return Ok(false),
                Err(e) => return Err(from_zk(&format!("listing {dir}"), &e)),
            };
            // Only what changes: ZooKeeper fails a whole multi on one existing create or
            // one missing delete.
            let deletes = change
                .removed()
                .iter()
                .map(|id| remembered_node(id))
                .filter(|n| present.contains(n));
            let creates = change
                .added()
                .iter()
                .map(|id| remembered_node(id))
                .filter(|n| !present.contains(n));
            let ops: Vec<(String, bool)> = deletes
                .map(|n| (n, false))
                .chain(creates.map(|n| (n, true)))
                .collect();
            let mut raced = false;
            for part in ops.chunks(REMEMBER_OPS) {
                let what = format!("remembering ids under {dir}");
                let mut multi = client.new_multi_writer();
                fence.add_to(&mut multi).map_err(|e| from_zk(&what, &e))?;
                for (node, create) in part {
                    let path = format!("{dir}/{node}");
                    if *create {
                        multi.add_create(&path, &[], &opts)
                    } else {
                        multi.add_delete(&path, None)
                    }
                    .map_err(|e| from_zk(&what, &e))?;
                }
                match multi.commit().await {
                    Ok(_) => {}
                    // The fence's checks: a later grant, or the grant ended.
                    Err(zk::MultiWriteError::OperationFailed {
                        index: 0 | 1,
                        source: zk::Error::BadVersion | zk::Error::NoNode,
                    }) => return Ok(false),
                    // An id node changed since it was listed: list again.
                    Err(zk::MultiWriteError::OperationFailed {
                        source: zk::Error::NodeExists | zk::Error::NoNode,
                        ..
                    }) => {
                        raced = true;
                        break;
                    }
                    Err(e) => return Err(from_zk(&what, &e.into())),
                }
            }
            if !raced {
                return Ok(true);
            }
        }
        Err(backend(format!(
            "remembering ids under {dir}: they changed {MAX_ATTEMPTS} times while we wrote"
        )))
    }

    /// A `sync`, then the children of the lease's `remembered` node, decoded.
    async fn remembered(&self, name: &str) -> Result<Vec<String>, StoreError> {
        let client = self.reader().await?;
        let layout = self.layout().await?;
        let dir = layout.remembered(name)?;
        let root = layout.root();
        client
            .sync(root)
            .await
            .map_err(|e| from_zk(&format!("syncing {root}"), &e))?;
        let mut ids: Vec<String> = match client.list_children(&dir).await {
            Ok(children) => children.iter().filter_map(|c| remembered_id(c)).collect(),
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(from_zk(&format!("listing {dir}"), &e)),
        };
        ids.sort();
        Ok(ids)
    }
}

/// Opens `store = "zookeeper"` sections (see [`ZooKeeperOptions::from_section`]).
/// Opening does not connect: sessions open on first use.
#[derive(Debug, Default, Clone, Copy)]
pub struct ZooKeeperStoreFactory;

#[async_trait]
impl StoreFactory for ZooKeeperStoreFactory {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn defaults(&self) -> toml::Table {
        // The fragment is checked to parse (and to match the options' defaults) by a test.
        REFERENCE.parse().unwrap_or_default()
    }

    fn check(&self, section: &LeaseSection) -> Result<(), ConfigError> {
        ZooKeeperOptions::from_section(section).map(|_| ())
    }

    async fn open(&self, section: &LeaseSection) -> Result<Arc<dyn LeaseStore>, ConfigError> {
        Ok(Arc::new(ZooKeeperStore::new(
            ZooKeeperOptions::from_section(section)?,
        )?))
    }
}
