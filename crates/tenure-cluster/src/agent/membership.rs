//! The membership driver: this node's membership is its member lease. It takes a join
//! ticket (its age), holds the member lease through a LeaseActor, checks its placement
//! against the members before counting itself up, rejoins with a new ticket after a loss,
//! lists the other member leases into the view, and starts a graceful leave.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};
use tenure_lease::store::bounded;
use tenure_lease::{
    ChangeVersion, Changes, FencingToken, Lease, LeaseActor, LeaseEvent, LeaseEventSink, LeaseMsg,
    LeaseObserver, LeaseRecord, LeaseSpec, LeaseStore,
};
use tokio::time::Instant;

use super::AgentState;
use crate::app_version::AppVersion;
use crate::identity::{Incarnation, NodeAddr};
use crate::member::Listed;
use crate::placement::{Placement, PlacementMismatch};
use crate::protocol::{AgentLocal, AgentMsg, Leaving, LeavingAck, Polled};
use crate::settings::ClusterSettings;
use crate::subscribe::{HandOver, HandOverWait};
use crate::transport::Tls;

/// The member lease of this node's current membership.
#[derive(Default)]
pub(super) struct MemberLease {
    /// Its LeaseActor, once a join ticket was taken.
    pub actor: Option<ActorRef<LeaseMsg>>,
    /// The join ticket of the current membership (this node's age).
    pub ticket: Option<u64>,
    /// A join ticket is being taken.
    pub ticketing: bool,
    /// The token of the grant whose placement check is under way: the node counts itself
    /// up only once it passed.
    pub verifying: Option<FencingToken>,
}

/// The listing of the other members' leases.
#[derive(Default)]
pub(super) struct Listing {
    /// A listing is under way.
    pub polling: bool,
    /// The last listing failed (logged once per outage).
    pub failing: bool,
    /// Member leases of nodes with another cookie, already warned about.
    pub foreign: HashSet<(NodeAddr, Incarnation)>,
    /// Member leases of nodes that place entities differently, already warned about.
    pub misplaced: HashSet<(NodeAddr, Incarnation)>,
    /// The store's change version as of the last poll, on a store with
    /// [`GrantChanges`](tenure_lease::GrantChanges): polls list only when it moved.
    pub held: Option<ChangeVersion>,
    /// Polls since the last listing: the `membership-listing-every`th lists regardless.
    pub unlisted: u32,
}

/// The note kept with a member lease: who holds it, in which life, its join ticket, and
/// the settings that decide where its entities live.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct MemberNote {
    pub node: NodeAddr,
    pub incarnation: Incarnation,
    pub age: u64,
    #[serde(default)]
    pub roles: Vec<String>,
    /// Outside the proof, so that nodes of any version check each other's notes alike:
    /// it steers placement (which node is preferred), never who may hold a lease.
    #[serde(default)]
    pub app_version: AppVersion,
    pub placement: Placement,
    /// Keyed digest of the above with the cookie: only nodes with the cluster's cookie
    /// can write a member lease the others accept.
    pub proof: String,
}

impl MemberNote {
    pub(super) fn new(
        key: &str,
        system: &str,
        node: NodeAddr,
        incarnation: Incarnation,
        age: u64,
        roles: Vec<String>,
        placement: Placement,
    ) -> MemberNote {
        let mut note = MemberNote {
            node,
            incarnation,
            age,
            roles,
            app_version: AppVersion::default(),
            placement,
            proof: String::new(),
        };
        note.proof = note.expected_proof(key, system);
        note
    }

    /// The proof a node with cookie (and CA) `key` in `system` would have written.
    pub(super) fn expected_proof(&self, key: &str, system: &str) -> String {
        use sha2::{Digest, Sha256};
        let roles = self.roles.join(",");
        let placement = serde_json::to_string(&self.placement).unwrap_or_default();
        let digest = Sha256::digest(format!(
            "tenure-member\n{key}\n{system}\n{}\n{}\n{}\n{roles}\n{placement}",
            self.node, self.incarnation, self.age
        ));
        digest[..12].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A member whose placement differs from this node's, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub member: NodeAddr,
    pub mismatch: PlacementMismatch,
}

/// The key of member proofs: the cookie, and the CA fingerprint when TLS is on (so that
/// plain-text or other-CA nodes sharing the store are not members either).
fn proof_key(cookie: &str, tls: Option<&Tls>) -> String {
    format!(
        "{cookie}\n{}",
        tls.map(|t| t.ca_fingerprint.as_str())
            .unwrap_or("plaintext")
    )
}

/// Takes a join ticket: grants of one lease name get strictly increasing tokens, so
/// acquiring (and at once releasing) `<system>-join` numbers joins in order. The ticket is
/// the member's age (the join grant's token as a number). The lease's own retrying does the waiting; `None` if the agent stopped
/// first.
async fn take_ticket(spec: LeaseSpec, agent: ActorRef<AgentMsg>) -> Option<u64> {
    let lease = match Lease::start(spec).await {
        Ok(lease) => lease,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the join ticket lease");
            return None;
        }
    };
    let ticket = tokio::select! {
        got = lease.acquire_wait() => got.map(FencingToken::get).map_err(|e| tracing::warn!(error = %e, "no join ticket")).ok(),
        _ = agent.wait(None) => None,
    };
    if let Err(e) = lease.release().await {
        tracing::debug!(error = %e, "join ticket not released; it expires");
    }
    ticket
}

pub(super) fn spawn_ticket(
    myself: &ActorRef<AgentMsg>,
    s: &ClusterSettings,
    store: Arc<dyn LeaseStore>,
    observer: Option<LeaseObserver>,
) {
    let spec = LeaseSpec::new(
        &format!("{}-join", s.system),
        &s.addr.to_string(),
        store,
        s.member_lease,
    )
    .map(|spec| match observer {
        Some(o) => spec.with_observer(o),
        None => spec,
    })
    .map(|spec| spec.with_note("join ticket (released at once)"));
    let me = myself.clone();
    match spec {
        Ok(spec) => {
            let pause = s.member_lease.lease_retry_interval;
            tokio::spawn(async move {
                let ticket = take_ticket(spec, me.clone()).await;
                if ticket.is_none() {
                    // Asked again after this pause, so that a failing start does not spin.
                    tokio::time::sleep(pause).await;
                }
                let _ = me.cast(AgentMsg::Local(AgentLocal::Ticket(ticket)));
            });
        }
        Err(e) => tracing::error!(error = %e, "cannot take a join ticket"),
    }
}

impl AgentState {
    /// A join ticket was taken (or could not be): start holding the member lease.
    pub(super) async fn on_ticket(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        ticket: Option<u64>,
    ) -> Result<(), ActorProcessingErr> {
        self.member_lease.ticketing = false;
        // A ticket taken before this node downed itself: it rejoins with a new one.
        let downed = self.downing.as_ref().is_some_and(|d| d.is_downed());
        if self.leaving || downed {
            return Ok(());
        }
        match ticket {
            Some(ticket) => {
                // One member lease actor at a time: an earlier membership's goes.
                if let Some(old) = self.member_lease.actor.take() {
                    old.unlink(myself.get_cell());
                    old.stop(Some("replaced by a new membership".into()));
                }
                self.join(myself, ticket).await?;
            }
            None if self.member_lease.actor.is_none() => self.request_ticket(myself),
            None => {}
        }
        Ok(())
    }

    /// An event of the member lease actor of the membership with join ticket `ticket`.
    pub(super) fn on_member_lease(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        ticket: u64,
        event: LeaseEvent,
    ) {
        if self.member_lease.ticket != Some(ticket) {
            tracing::debug!(
                ticket,
                ?event,
                "event of an earlier membership's member lease ignored"
            );
            return;
        }
        match event {
            LeaseEvent::Granted(g) => {
                tracing::info!(node = %self.me, token = g.token.get(), "member lease granted: checking placement against the members");
                self.member_lease.verifying = Some(g.token);
                self.list_for_join(myself, g.token, Duration::ZERO);
            }
            LeaseEvent::Lost(l) => {
                self.member_lease.verifying = None;
                tracing::warn!(node = %self.me, token = l.token.get(), reason = %l.reason, "member lease lost: this node is down");
                let events = self.view.self_lost();
                self.emit(events);
                if let Some(d) = self.downing.as_mut() {
                    d.membership_ended();
                }
                self.detector.membership_ended(Instant::now());
                let downed = self.downing.as_ref().is_some_and(|d| d.is_downed());
                if !self.leaving && !downed {
                    // Rejoin as a new (youngest) membership: new ticket, new lease actor.
                    if let Some(old) = self.member_lease.actor.take() {
                        old.unlink(myself.get_cell());
                        old.stop(Some("member lease lost".into()));
                    }
                    self.member_lease.ticket = None;
                    self.request_ticket(myself);
                }
            }
            // Member leases are plain (priority 0): a forceful preemption arrives as a loss.
            LeaseEvent::PreemptionRequested(_)
            | LeaseEvent::PreemptionWithdrawn(_)
            // Renewals failing before the deadline: the grant is still ours, and the stop
            // budget acts on a loss, not on doubt.
            | LeaseEvent::Suspended(_)
            | LeaseEvent::Resumed(_) => {}
        }
    }

    /// The member leases listed for the placement check of grant `token`: up, or refused.
    pub(super) async fn on_join_check(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        token: FencingToken,
        listed: Result<Vec<LeaseRecord>, tenure_lease::LeaseError>,
    ) -> Result<(), ActorProcessingErr> {
        if self.member_lease.verifying != Some(token) {
            // Lost meanwhile: the next grant is checked anew.
            return Ok(());
        }
        match listed {
            Err(e) => {
                tracing::warn!(error = %e, "cannot list member leases to check placement; retrying");
                self.list_for_join(myself, token, self.s.membership_interval);
            }
            Ok(records) => match self.placement_refusal(&records) {
                Some(refusal) => return self.refuse(refusal).await,
                None => {
                    self.member_lease.verifying = None;
                    let age = self.member_lease.ticket.unwrap_or_default();
                    tracing::info!(node = %self.me, token = token.get(), age, "placement agrees with every member: up");
                    let events = self.view.self_granted(age);
                    self.detector.membership_up(Instant::now());
                    self.emit(events);
                }
            },
        }
        Ok(())
    }

    /// Every `membership-interval`, unless a poll is under way: on a store with
    /// [`GrantChanges`](tenure_lease::GrantChanges), asks whether the member leases changed
    /// since the version held and lists them only when they did, or when the last
    /// `membership-listing-every` polls listed nothing (a repair of whatever was missed);
    /// on other stores, lists them.
    ///
    /// The view needs from a listing only who holds a member lease and its note (address,
    /// life, age, roles, version), never expiries: renewals change none of it, so a store's
    /// answer that renewals are no change loses nothing.
    pub(super) fn poll(&mut self, myself: &ActorRef<AgentMsg>) {
        if self.listing.polling {
            return;
        }
        self.listing.polling = true;
        self.listing.unlisted = self.listing.unlisted.saturating_add(1);
        let repair = self.listing.unlisted >= self.s.membership_listing_every;
        // No version held: the store answers "changed", and the poll lists.
        let since = if repair { None } else { self.listing.held };
        let store = self.store.clone();
        let prefix = self.s.member_prefix();
        let timeout = self.s.member_lease.lease_operation_timeout;
        let me = myself.clone();
        tokio::spawn(async move {
            let polled = poll_store(store.as_ref(), &prefix, since, timeout).await;
            let _ = me.cast(AgentMsg::Local(AgentLocal::Listed(polled)));
        });
    }

    /// What [`poll`](Self::poll) found: the view follows a listing; an unchanged answer
    /// only moves the version held.
    pub(super) fn on_listed(&mut self, result: Result<Polled, tenure_lease::LeaseError>) {
        self.listing.polling = false;
        match result {
            Ok(polled) => {
                if std::mem::take(&mut self.listing.failing) {
                    tracing::info!("member leases can be listed again");
                }
                self.listing.held = polled.version;
                if let Some(records) = polled.records {
                    self.listing.unlisted = 0;
                    let listing = self.parse_listing(&records);
                    let events = self.view.listed(&listing);
                    self.emit(events);
                }
            }
            Err(e) if !self.listing.failing => {
                self.listing.failing = true;
                tracing::warn!(error = %e, "cannot list member leases; the view is not updated until the store answers");
            }
            Err(e) => tracing::debug!(error = %e, "cannot list member leases"),
        }
    }

    /// This node starts leaving (`Node::leave`): it answers what the rest of the sequence
    /// needs.
    pub(super) fn start_leaving(&mut self, reply: RpcReplyPort<LeaveAnswer>) {
        self.leaving = true;
        let (guard, wait) = HandOver::new();
        let events = self.view.self_leaving(guard);
        self.emit(events);
        let notice = Leaving {
            node: self.me.clone(),
            incarnation: self.incarnation,
        };
        let peers = self.mesh.peers.values().map(|p| p.agent.clone()).collect();
        let _ = reply.send(LeaveAnswer {
            hand_over: wait,
            member_lease: self.member_lease.actor.clone(),
            peers,
            notice,
        });
    }

    /// A peer says it is leaving.
    pub(super) fn on_peer_leaving(&mut self, l: Leaving, reply: RpcReplyPort<LeavingAck>) {
        self.detector.heard(&l.node, Instant::now());
        let events = self.view.leaving(&l.node, l.incarnation);
        self.emit(events);
        let _ = reply.send(LeavingAck {});
    }
    /// Takes a join ticket, unless one is being taken already (two tickets would start two
    /// member lease actors, the second waiting forever on the first's grant).
    pub(super) fn request_ticket(&mut self, myself: &ActorRef<AgentMsg>) {
        if self.member_lease.ticketing {
            return;
        }
        self.member_lease.ticketing = true;
        spawn_ticket(
            myself,
            &self.s,
            self.store.clone(),
            self.lease_observer.clone(),
        );
    }

    pub(super) fn is_member_lease(&self, cell: &ractor::ActorCell) -> bool {
        self.member_lease
            .actor
            .as_ref()
            .is_some_and(|l| l.get_id() == cell.get_id())
    }

    /// Starts holding the member lease for a membership numbered `ticket`.
    pub(super) async fn join(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        ticket: u64,
    ) -> Result<(), ActorProcessingErr> {
        let note = serde_json::to_string(&MemberNote {
            app_version: self.s.app_version.clone(),
            ..MemberNote::new(
                &proof_key(&self.s.cookie, self.mesh.tls.as_ref()),
                &self.s.system,
                self.me.clone(),
                self.incarnation,
                ticket,
                self.s.roles.clone(),
                self.s.placement.clone(),
            )
        })?;
        let spec = LeaseSpec::new(
            &self.s.member_lease_name(&self.me),
            &self.me.to_string(),
            self.store.clone(),
            self.s.member_lease,
        )?
        .with_note(note);
        let spec = match &self.lease_observer {
            Some(o) => spec.with_observer(o.clone()),
            None => spec,
        };
        let agent = myself.clone();
        let sink = LeaseEventSink::new(move |event| {
            let _ = agent.cast(AgentMsg::Local(AgentLocal::MemberLease { ticket, event }));
        });
        let (lease, _) = LeaseActor::start(spec, sink, Some(myself.get_cell())).await?;
        lease.cast(LeaseMsg::Acquire { reply: None })?;
        tracing::info!(node = %self.me, age = ticket, "joining: acquiring the member lease");
        self.member_lease.ticket = Some(ticket);
        self.member_lease.actor = Some(lease);
        Ok(())
    }

    /// The member leases written by nodes with our cookie.
    pub(super) fn parse_listing(&mut self, records: &[LeaseRecord]) -> Vec<Listed> {
        let mut listed = Vec::new();
        for r in records {
            let Some(note) = r
                .note
                .as_deref()
                .and_then(|n| serde_json::from_str::<MemberNote>(n).ok())
            else {
                continue;
            };
            let Ok(owner) = NodeAddr::parse("member lease owner", &r.owner) else {
                continue;
            };
            let key = proof_key(&self.s.cookie, self.mesh.tls.as_ref());
            if owner != note.node || note.expected_proof(&key, &self.s.system) != note.proof {
                if self
                    .listing
                    .foreign
                    .insert((owner.clone(), note.incarnation))
                {
                    tracing::warn!(member = %owner, incarnation = %note.incarnation, "ignoring a member lease written with another cookie or TLS CA: that node is not a member");
                }
                continue;
            }
            // A node that places entities differently is refused at its join (or refuses
            // itself); until then it must not count as a member here either.
            if owner != self.me
                && let Some(m) = self.s.placement.mismatch(&note.placement)
            {
                if self
                    .listing
                    .misplaced
                    .insert((owner.clone(), note.incarnation))
                {
                    tracing::warn!(member = %owner, key = %m.key, mine = %m.mine, theirs = %m.theirs, "ignoring a member lease of a node that places entities differently: that node is not a member");
                }
                continue;
            }
            listed.push(Listed {
                addr: owner,
                incarnation: note.incarnation,
                age: note.age,
                roles: note.roles,
                app_version: note.app_version,
            });
        }
        listed
    }

    /// Lists the member leases (after `wait`) for the placement check of grant `token`.
    ///
    /// Why two nodes joining at once with different placements cannot both get in: each
    /// writes its member lease (with its placement) and only then lists the member leases.
    /// The store orders the four operations; if A's listing does not show B's lease, it
    /// came before B's write, so B's listing, after B's write, shows A's lease, and B
    /// refuses itself. A node already up renews its lease, so every joiner sees it.
    pub(super) fn list_for_join(
        &self,
        myself: &ActorRef<AgentMsg>,
        token: FencingToken,
        wait: Duration,
    ) {
        let store = self.store.clone();
        let prefix = self.s.member_prefix();
        let timeout = self.s.member_lease.lease_operation_timeout;
        let me = myself.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let listed = bounded(&prefix, "list", timeout, store.list(&prefix)).await;
            let _ = me.cast(AgentMsg::Local(AgentLocal::JoinCheck { token, listed }));
        });
    }

    /// The first listed member (with our cookie, another address) whose placement differs
    /// from this node's.
    pub(super) fn placement_refusal(&self, records: &[LeaseRecord]) -> Option<Refusal> {
        let key = proof_key(&self.s.cookie, self.mesh.tls.as_ref());
        records.iter().find_map(|r| {
            let note: MemberNote = serde_json::from_str(r.note.as_deref()?).ok()?;
            let genuine = note.node.to_string() == r.owner
                && note.expected_proof(&key, &self.s.system) == note.proof;
            if !genuine || note.node == self.me {
                return None;
            }
            let mismatch = self.s.placement.mismatch(&note.placement)?;
            Some(Refusal {
                member: note.node,
                mismatch,
            })
        })
    }

    /// Refuses this node: records why, gives the member lease back and stops the agent
    /// (and with it the node). It never counted itself up.
    pub(super) async fn refuse(&mut self, refusal: Refusal) -> Result<(), ActorProcessingErr> {
        let m = &refusal.mismatch;
        tracing::error!(node = %self.me, member = %refusal.member, key = %m.key, mine = %m.mine, theirs = %m.theirs,
            "refused to join: this node places entities differently from a member");
        crate::history::node_refused(&refusal.member, &m.key, &m.mine, &m.theirs);
        let _ = self.refused.set(refusal);
        self.member_lease.verifying = None;
        self.leaving = true;
        if let Some(lease) = self.member_lease.actor.take() {
            let timeout = self.s.member_lease.lease_operation_timeout + RELEASE_SLACK;
            let _ = lease
                .stop_and_wait(Some("refused to join".into()), Some(timeout))
                .await;
        }
        Err("refused to join: its placement differs from a member's".into())
    }
}

/// One membership poll of `store` under `prefix`: the cheap check for changes since
/// `since` where the store has one, then, unless it answered "unchanged", the listing
/// (after the check, so that a change racing the listing is reported again next time).
async fn poll_store(
    store: &dyn LeaseStore,
    prefix: &str,
    since: Option<ChangeVersion>,
    timeout: Duration,
) -> Result<Polled, tenure_lease::LeaseError> {
    let mut version = None;
    if let Some(changes) = store.as_grant_changes() {
        let answer = bounded(
            prefix,
            "changes",
            timeout,
            changes.changes_since(prefix, since),
        )
        .await?;
        if let Changes::Unchanged(held) = answer {
            return Ok(Polled {
                records: None,
                version: Some(held),
            });
        }
        version = Some(answer.version());
    }
    let records = bounded(prefix, "list", timeout, store.list(prefix)).await?;
    Ok(Polled {
        records: Some(records),
        version,
    })
}

/// How long `Node::leave` waits for the member lease release beyond the operation timeout.
pub(crate) const RELEASE_SLACK: Duration = Duration::from_secs(1);

/// What a leave request answers: what `Node::leave` needs for the rest of the sequence.
pub(crate) struct LeaveAnswer {
    pub hand_over: HandOverWait,
    pub member_lease: Option<ActorRef<LeaseMsg>>,
    /// The peers' agents, to be told (and to acknowledge) before the lease is released.
    pub peers: Vec<ActorRef<AgentMsg>>,
    pub notice: Leaving,
}

#[cfg(test)]
mod tests {
    //! Membership through the store's change check: one node on loopback, its peers' member
    //! leases written straight into the shared in-memory store by the test (a member's
    //! lease is all the view takes from the store), every store call counted.

    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    use async_trait::async_trait;
    use tenure_lease::config::LeaseSection;
    use tenure_lease::{
        AcquireOutcome, AcquireRequest, ConfigError, GrantChanges, HeldLease, LeaseProvider,
        MemoryStore, StoreError, StoreFactory, StoreRegistry, TenureConfig,
    };
    use tenure_lease_kit::wrap::{StoreWrapper, Wrapped};
    use tenure_test_kit::eventually_async;

    use super::*;
    use crate::Node;
    use crate::member::MemberStatus;

    /// Store calls made by the node: listings of member leases, the rows they read, and
    /// change checks.
    #[derive(Default)]
    struct Counts {
        lists: AtomicU64,
        rows: AtomicU64,
        checks: AtomicU64,
    }

    impl Counts {
        fn get(&self) -> (u64, u64, u64) {
            (
                self.lists.load(Relaxed),
                self.rows.load(Relaxed),
                self.checks.load(Relaxed),
            )
        }
    }

    /// A memory store that counts calls; with `checks` false it hides its change check,
    /// as a store without the capability.
    struct Counting {
        inner: MemoryStore,
        counts: Arc<Counts>,
        checks: bool,
    }

    #[async_trait]
    impl StoreWrapper for Counting {
        fn wrapped(&self) -> &dyn LeaseStore {
            &self.inner
        }
        fn kind(&self) -> &'static str {
            "counting"
        }
        async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
            let listed = self.inner.list(prefix).await?;
            self.counts.lists.fetch_add(1, Relaxed);
            self.counts.rows.fetch_add(listed.len() as u64, Relaxed);
            Ok(listed)
        }
        fn has_grant_changes(&self) -> bool {
            self.checks
        }
        async fn changes_since(
            &self,
            prefix: &str,
            since: Option<ChangeVersion>,
        ) -> Result<Changes, StoreError> {
            self.counts.checks.fetch_add(1, Relaxed);
            self.inner.changes_since(prefix, since).await
        }
    }

    struct CountingFactory {
        namespace: String,
        counts: Arc<Counts>,
        checks: bool,
    }

    #[async_trait]
    impl StoreFactory for CountingFactory {
        fn kind(&self) -> &'static str {
            "counting"
        }
        fn check(&self, _section: &LeaseSection) -> Result<(), ConfigError> {
            Ok(())
        }
        async fn open(&self, _section: &LeaseSection) -> Result<Arc<dyn LeaseStore>, ConfigError> {
            Ok(Arc::new(Wrapped(Counting {
                inner: MemoryStore::shared(&self.namespace),
                counts: self.counts.clone(),
                checks: self.checks,
            })))
        }
    }

    const COOKIE: &str = "membership-changes-cookie-0123456789abcdef";
    const SYSTEM: &str = "changes";

    /// A node on a free loopback port (another port when one was taken meanwhile).
    async fn start_node(
        namespace: &str,
        counts: Arc<Counts>,
        checks: bool,
        listing_every: u32,
    ) -> Node {
        for _ in 0..20 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let config = TenureConfig::from_toml_str(
                &format!(
                    r#"[tenure]
system = "{SYSTEM}"
default-lease-section = "m"
[lease.m]
store = "counting"
[cluster]
host = "127.0.0.1"
port = {port}
cookie = "{COOKIE}"
membership-interval = "5ms"
membership-listing-every = {listing_every}
"#
                ),
                "test",
            )
            .unwrap();
            let registry = ["sqlite", "postgres", "etcd", "zookeeper"]
                .into_iter()
                .fold(StoreRegistry::new(), |r, kind| r.left_out(kind, kind))
                .with(CountingFactory {
                    namespace: namespace.into(),
                    counts: counts.clone(),
                    checks,
                });
            let provider = LeaseProvider::new(config.clone(), registry).unwrap();
            let settings = ClusterSettings::from_config(&config).unwrap();
            match Node::start(settings, &provider).await {
                Ok(node) => return node,
                Err(crate::ClusterError::Bind { .. }) => continue,
                Err(e) => panic!("node start: {e}"),
            }
        }
        panic!("no free loopback port in 20 tries");
    }

    /// The member lease a node at `port` would hold: name, and a request carrying its note.
    fn member_request(node: &Node, port: u16) -> AcquireRequest {
        let s = node.settings();
        // On another loopback address than the node's: never the node's own lease name.
        let addr = NodeAddr::parse("test member", &format!("127.0.0.2:{port}")).unwrap();
        let note = MemberNote::new(
            &proof_key(COOKIE, None),
            SYSTEM,
            addr.clone(),
            Incarnation::new(),
            1_000 + u64::from(port),
            Vec::new(),
            s.placement.clone(),
        );
        AcquireRequest {
            name: s.member_lease_name(&addr),
            owner: addr.to_string(),
            instance: "test".into(),
            ttl: Duration::from_secs(3600),
            note: Some(serde_json::to_string(&note).unwrap()),
            ..AcquireRequest::default()
        }
    }

    /// Polls the node's view until `done` holds of it (bounded: a failing test ends).
    async fn until_view(node: &Node, what: &str, done: impl Fn(&[crate::MemberInfo]) -> bool) {
        let what = format!("the view to show {what}");
        eventually_async(&what, Duration::from_secs(30), async || {
            let members = node.view().await.unwrap().members;
            if done(&members) { Ok(()) } else { Err(members) }
        })
        .await
    }

    /// Waits until the node made at least `more` change checks and listings in all beyond
    /// `from`.
    async fn until_polled(counts: &Counts, from: (u64, u64, u64), more: u64) {
        let what = format!("{more} more polls of the store (listings and change checks)");
        eventually_async(&what, Duration::from_secs(30), async || {
            let now = counts.get();
            let polled = (now.0 + now.2).saturating_sub(from.0 + from.2);
            (polled >= more).then_some(()).ok_or(now)
        })
        .await
    }

    /// Idle polls of one node with `peers` other member leases in the store: (polls,
    /// listings, rows read, change checks) over at least `polls` polls.
    async fn idle_cost(checks: bool, listing_every: u32, peers: u16, polls: u64) -> [u64; 4] {
        let namespace = format!("membership-idle-{checks}-{listing_every}-{peers}");
        let counts = Arc::new(Counts::default());
        let node = start_node(&namespace, counts.clone(), checks, listing_every).await;
        let store = MemoryStore::shared(&namespace);
        for p in 0..peers {
            store
                .try_acquire(&member_request(&node, 40_000 + p))
                .await
                .unwrap();
        }
        let all = usize::from(peers) + 1;
        until_view(&node, "every member up", |m| {
            m.len() == all && m.iter().all(|m| m.status == MemberStatus::Up)
        })
        .await;
        // The grant of this node's own lease (made before it was up) is a change a poll
        // under way then may not have seen yet: a few polls pass before counting.
        until_polled(&counts, counts.get(), 5).await;
        let from = counts.get();
        until_polled(&counts, from, polls).await;
        let to = counts.get();
        node.leave().await.unwrap();
        let (lists, rows, checks) = (to.0 - from.0, to.1 - from.1, to.2 - from.2);
        // A listing follows a check on a store with them: a poll is one or the other alone
        // only without checks.
        let polled = if checks == 0 { lists } else { checks };
        [polled, lists, rows, checks]
    }

    /// A member's join and leave reach the view through the change check (repair listings
    /// are a million intervals apart), and an idle node asks only the change check: no
    /// listing at all between changes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn joins_and_leaves_are_seen_through_the_change_check_and_idle_polls_do_not_list() {
        let namespace = "membership-changes";
        let counts = Arc::new(Counts::default());
        let node = start_node(namespace, counts.clone(), true, 1_000_000).await;
        until_view(&node, "this node up", |m| {
            m.iter().any(|m| m.status == MemberStatus::Up)
        })
        .await;
        // Its own grant, made before it was up, may be seen by a poll after that.
        until_polled(&counts, counts.get(), 5).await;

        // Idle: a hundred polls, every one a change check.
        let from = counts.get();
        until_polled(&counts, from, 100).await;
        let idle = counts.get();
        assert_eq!(idle.0, from.0, "an idle node listed the member leases");
        assert!(idle.2 >= from.2 + 100);

        // A member joins: its lease is granted.
        let store = MemoryStore::shared(namespace);
        let joiner = member_request(&node, 40_999);
        let AcquireOutcome::Granted(grant) = store.try_acquire(&joiner).await.unwrap() else {
            panic!("the joiner's member lease was not granted");
        };
        let port = |m: &crate::MemberInfo| m.addr.to_string().ends_with(":40999");
        until_view(&node, "the joiner", |m| m.iter().any(port)).await;
        let joined = counts.get();
        assert!(joined.0 > idle.0, "the join was seen without a listing");

        // Renewals are no change: polls after them list nothing.
        let held = HeldLease {
            name: grant.name.clone(),
            token: grant.token,
        };
        store
            .renew(&grant.owner, &[held], Duration::from_secs(3600))
            .await
            .unwrap();
        let renewed = counts.get();
        until_polled(&counts, renewed, 20).await;
        assert_eq!(counts.get().0, renewed.0, "a renewal made the node list");

        // It leaves: its lease is released.
        assert!(
            store
                .release(&grant.name, &grant.owner, grant.token)
                .await
                .unwrap()
        );
        until_view(&node, "the joiner gone", |m| !m.iter().any(port)).await;
        node.leave().await.unwrap();
    }

    /// A store without the check is listed every interval, as before; with it, an idle node
    /// reads one change count per interval and lists only every `membership-listing-every`
    /// intervals. Prints the per-poll cost of both at 6 and 48 members (the figure in
    /// docs/benchmarks.md).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_the_check_every_poll_lists_with_it_only_the_repairs_do() {
        for members in [6u16, 48] {
            let peers = members - 1;
            let [polls, lists, rows, checks] = idle_cost(false, 30, peers, 300).await;
            println!(
                "membership idle, {members} members, no change check: {polls} polls, {lists} listings, {rows} rows, {checks} checks"
            );
            assert_eq!((lists, checks), (polls, 0));
            assert_eq!(rows, polls * u64::from(members));
            let [polls, lists, rows, checks] = idle_cost(true, 30, peers, 300).await;
            println!(
                "membership idle, {members} members, change check, listing every 30: {polls} polls, {lists} listings, {rows} rows, {checks} checks"
            );
            // One repair per 30 polls, give or take the one under way at either end.
            assert!(lists <= polls / 30 + 1, "{lists} listings in {polls} polls");
            assert_eq!(rows, lists * u64::from(members));
            let [polls, lists, rows, _] = idle_cost(true, 1_000_000, peers, 300).await;
            assert_eq!(
                (lists, rows),
                (0, 0),
                "{polls} polls without repairs listed"
            );
        }
    }
}
