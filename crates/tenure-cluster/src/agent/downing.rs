//! The agent's side of the split brain resolver: keeps this node's row of the shared
//! reachability table, feeds the resolver every tick, and carries out its decisions (down
//! the other side in the view, or down this node: stop what it hosts, release the member
//! lease, then rejoin or exit).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ractor::ActorRef;
use tenure_lease::{LeaseMsg, LeaseSpec};
use tokio::time::Instant;

use super::resolver_lease::{self, ResolverLeaseError, SharedLease};
use super::{AgentState, RELEASE_SLACK};
use crate::identity::{Incarnation, NodeAddr};
use crate::member::MemberStatus;
use crate::protocol::{AgentLocal, AgentMsg, YouAreDown};
use crate::sbr::{Decision, Strategy, WhenDown};

/// How many member-lease ttls a node that downed itself waits for a silent former member
/// before it rejoins without hearing it.
const FORGET_AFTER_TTLS: u32 = 10;

/// The resolver's state in the agent, beside the machine's ([`crate::detector`]): the
/// resolver lease, and this node's own downing.
pub(super) struct Downing {
    lease: SharedLease,
    /// The lease-majority attempt under way: its number and whom to down if it is won.
    attempt: Option<(u64, Vec<NodeAddr>)>,
    attempts: u64,
    /// When the resolver lease this node won is released.
    release_at: Option<Instant>,
    /// This node downed itself (why); it rejoins once it and every node it must hear hear
    /// each other again.
    downed: Option<String>,
    downed_at: Instant,
    /// The other members when it downed itself: they must hear it again before it rejoins,
    /// while they are members or were heard within [`FORGET_AFTER_TTLS`] member-lease ttls
    /// (a node cut off from this one and downed too is silent and holds no member lease,
    /// like a crashed one: only a long silence tells them apart).
    down_peers: BTreeSet<NodeAddr>,
}

impl Downing {
    pub(super) fn new() -> Downing {
        Downing {
            lease: Arc::new(tokio::sync::Mutex::new(None)),
            attempt: None,
            attempts: 0,
            release_at: None,
            downed: None,
            downed_at: Instant::now(),
            down_peers: BTreeSet::new(),
        }
    }

    /// This node's membership ended without the resolver (its member lease was lost): an
    /// attempt of that life is void.
    pub(super) fn membership_ended(&mut self) {
        self.attempt = None;
    }

    /// Whether this node downed itself and has not rejoined yet.
    pub(super) fn is_downed(&self) -> bool {
        self.downed.is_some()
    }
}

impl AgentState {
    /// A peer heartbeats under a membership this node downed: tell it.
    pub(super) fn tell_if_downed(&self, node: &NodeAddr, incarnation: Incarnation, age: u64) {
        if age == 0 || !self.view.was_downed(node, incarnation, age) {
            return;
        }
        if let Some(p) = self.mesh.peers.get(node) {
            let notice = match self.operator_downs.get(&(node.clone(), incarnation, age)) {
                Some(notice) => AgentMsg::Downed(notice.clone()),
                None => AgentMsg::YouAreDown(YouAreDown {
                    by: self.me.clone(),
                    age,
                }),
            };
            let _ = p.agent.cast(notice);
        }
    }

    /// A peer says it downed this node's membership `age`.
    pub(super) fn on_you_are_down(&mut self, myself: &ActorRef<AgentMsg>, notice: YouAreDown) {
        if self.view.me().status == MemberStatus::Up && self.view.me().age == notice.age {
            let why = format!(
                "member {} downed this node: its side of a partition survived without it",
                notice.by
            );
            self.down_self(myself, &why);
        }
    }

    /// Every tick: this node's row, then the resolver; rejoin and lease release when due.
    pub(super) fn resolve(&mut self, myself: &ActorRef<AgentMsg>, now: Instant) {
        if self.downing.is_none() || self.leaving {
            return;
        }
        let stamp = self.clock.stamp(now);
        self.detector.update_own_row(now, stamp, &self.view);
        let Some(settings) = self.detector.resolver_settings().cloned() else {
            return;
        };
        let Some(d) = self.downing.as_mut() else {
            return;
        };
        if d.release_at.is_some_and(|t| t <= now) {
            d.release_at = None;
            let lease = d.lease.clone();
            tokio::spawn(async move {
                if let Some(l) = lease.lock().await.as_ref()
                    && let Err(e) = l.release().await
                {
                    tracing::debug!(error = %e, "resolver lease not released; it expires");
                }
            });
        }
        if d.downed.is_some() {
            // Rejoin only once every member, and every node that was one when this node
            // downed itself and still runs, hears this node and is heard by it (else the
            // same fault would down it again at once), and not before stable-after.
            let window = self.s.unreachable_after;
            let forget = self.s.member_lease.heartbeat_timeout * FORGET_AFTER_TTLS;
            let downed_at = d.downed_at;
            let detector = &self.detector;
            let silent_too_long = |p: &NodeAddr| {
                let last = detector.last_heard(p).unwrap_or(downed_at).max(downed_at);
                now.saturating_duration_since(last) >= forget
            };
            let must: BTreeSet<&NodeAddr> = self
                .view
                .peers()
                .chain(
                    d.down_peers
                        .iter()
                        .filter(|p| self.view.get(p).is_some() || !silent_too_long(p)),
                )
                .collect();
            let ready = now.saturating_duration_since(d.downed_at) >= settings.stable_after
                && must.iter().all(|p| detector.mutual(p, now, window));
            if ready && settings.when_down == WhenDown::Rejoin {
                let why = d.downed.take().unwrap_or_default();
                tracing::info!(node = %self.me, downed_for = %why, "every member hears this node and is heard again: rejoining as a new member");
                crate::history::sbr_rejoining();
                self.request_ticket(myself);
            }
            return;
        }
        if let Some(decision) = self.detector.decide(now, &self.view) {
            self.act(myself, decision);
        }
    }

    fn act(&mut self, myself: &ActorRef<AgentMsg>, decision: Decision) {
        let Some(strategy) = self.detector.resolver_settings().map(|s| s.strategy.name()) else {
            return;
        };
        let Some(d) = self.downing.as_mut() else {
            return;
        };
        match decision {
            Decision::Survive { down } => self.down_others(strategy, &down),
            Decision::DownSelf { why } => self.down_self(myself, &why),
            Decision::Lease {
                side,
                leader,
                delay,
                down_if_won,
            } => {
                d.attempts += 1;
                let attempt = d.attempts;
                d.attempt = Some((attempt, down_if_won));
                tracing::info!(node = %self.me, %leader, ?delay, side = side.len(), "split brain resolver: the side holding the resolver lease survives");
                let name = format!("{}-sbr", self.s.system);
                let settings = self.s.member_lease;
                let store = self.store.clone();
                let me = myself.clone();
                let side: Vec<String> = side.iter().map(ToString::to_string).collect();
                if leader == self.me {
                    let spec = LeaseSpec::new(&name, &self.me.to_string(), store, settings)
                        .map(|s| s.with_note("split brain resolver: this member's side survives"));
                    let lease = d.lease.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        let won = match spec {
                            Ok(spec) => resolver_lease::acquire(lease, spec, &side).await,
                            Err(e) => Err(ResolverLeaseError::Spec(e)),
                        };
                        let _ = me.cast(AgentMsg::Local(AgentLocal::SbrLease { attempt, won }));
                    });
                } else {
                    let spec = LeaseSpec::new(&name, &self.me.to_string(), store, settings);
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        let won = match spec {
                            Ok(spec) => resolver_lease::watch(spec, &side).await,
                            Err(e) => Err(ResolverLeaseError::Spec(e)),
                        };
                        let _ = me.cast(AgentMsg::Local(AgentLocal::SbrLease { attempt, won }));
                    });
                }
            }
        }
    }

    /// The answer of a lease-majority attempt.
    pub(super) fn on_sbr_lease(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        attempt: u64,
        won: Result<bool, ResolverLeaseError>,
    ) {
        let Some(d) = self.downing.as_mut() else {
            return;
        };
        let Some((current, down)) = d.attempt.take_if(|(n, _)| *n == attempt) else {
            return;
        };
        debug_assert_eq!(current, attempt);
        let release_after = match self.detector.resolver_settings().map(|s| &s.strategy) {
            Some(Strategy::LeaseMajority { release_after, .. }) => *release_after,
            _ => Duration::ZERO,
        };
        match won {
            Ok(true) => {
                d.release_at = Some(Instant::now() + release_after);
                self.down_others("lease-majority", &down);
            }
            Ok(false) => self.down_self(
                myself,
                "lease-majority: the other side holds the resolver lease",
            ),
            Err(e) => self.down_self(
                myself,
                &format!("lease-majority: this side could not acquire the resolver lease: {e}"),
            ),
        }
    }

    fn down_others(&mut self, strategy: &'static str, down: &[NodeAddr]) {
        for addr in down {
            let events = self.view.down(addr);
            if events.is_empty() {
                continue;
            }
            tracing::warn!(node = %self.me, member = %addr, strategy, "split brain resolver: downing a member on the other side");
            crate::metrics::downing("down_member", strategy);
            crate::history::sbr_downed(addr, strategy);
            self.emit(events);
        }
    }

    /// This node's side goes: subscribers stop what they host (releasing those leases),
    /// the member lease is released, and the node waits to rejoin or stops.
    /// Without a resolver (`active-strategy = "off"`) the node rejoins at once as a new
    /// membership, as after losing its member lease.
    pub(super) fn down_self(&mut self, myself: &ActorRef<AgentMsg>, why: &str) {
        let Some(d) = self.downing.as_mut() else {
            self.down_self_and_rejoin(myself, why);
            return;
        };
        if d.downed.is_some() {
            return;
        }
        d.downed = Some(why.to_string());
        d.downed_at = Instant::now();
        d.down_peers = self.view.peers().cloned().collect();
        d.attempt = None;
        let Some(settings) = self.detector.resolver_settings() else {
            return;
        };
        let when_down = settings.when_down;
        crate::metrics::downing("down_self", settings.strategy.name());
        tracing::warn!(node = %self.me, why, "split brain resolver: downing this node");
        crate::history::sbr_down_self(why);
        self.end_membership(myself);
        if when_down == WhenDown::Exit {
            let _ = self.downed.set(why.to_string());
            myself.stop(Some(format!("downed: {why}")));
        }
    }
}

impl AgentState {
    fn down_self_and_rejoin(&mut self, myself: &ActorRef<AgentMsg>, why: &str) {
        if self.view.me().status != MemberStatus::Up {
            return;
        }
        tracing::warn!(node = %self.me, why, "downing this node; it rejoins as a new member");
        crate::history::down_self(why);
        self.end_membership(myself);
        self.request_ticket(myself);
    }

    /// Ends this node's membership on purpose: subscribers hear it is down (they stop what
    /// it hosts) and the member lease is released in the background (if the release fails,
    /// the lease expires after its ttl).
    fn end_membership(&mut self, myself: &ActorRef<AgentMsg>) {
        self.member_lease.verifying = None;
        self.member_lease.ticket = None;
        let events = self.view.self_lost();
        self.emit(events);
        if let Some(lease) = self.member_lease.actor.take() {
            lease.unlink(myself.get_cell());
            let timeout = self.s.member_lease.lease_operation_timeout + RELEASE_SLACK;
            tokio::spawn(async move {
                match ractor::call_t!(lease, LeaseMsg::Release, timeout.as_millis() as u64) {
                    Ok(Ok(_)) => tracing::info!("member lease released after downing"),
                    _ => tracing::warn!(
                        "member lease release failed after downing; it expires after its ttl"
                    ),
                }
                lease.stop(Some("downed".into()));
            });
        }
    }
}
