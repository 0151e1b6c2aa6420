//! Heartbeats and reachability: every `heartbeat-interval` the agent sends each peer a
//! heartbeat (carrying its split brain resolver row), marks members silent for
//! `unreachable-after` unreachable, closes sessions silent far longer, and dials what is due.

use ractor::ActorRef;
use tokio::time::Instant;

use super::AgentState;
use crate::protocol::{AgentMsg, Heartbeat};

impl AgentState {
    /// Every `heartbeat-interval`: heartbeats out, reachability, dials.
    pub(super) fn tick(&mut self, myself: &ActorRef<AgentMsg>) {
        let now = Instant::now();
        let hb = Heartbeat {
            node: self.me.clone(),
            incarnation: self.incarnation,
            age: if self.view.me().status == crate::member::MemberStatus::Up {
                self.view.me().age
            } else {
                0
            },
            reach: self.downing.as_ref().map(|d| d.rows()).unwrap_or_default(),
            hears: self
                .downing
                .as_ref()
                .map(|d| d.hearing(now, self.s.unreachable_after))
                .unwrap_or_default(),
        };
        for p in self.mesh.peers.values() {
            let _ = p.agent.cast(AgentMsg::Heartbeat(hb.clone()));
        }
        for (addr, reachable) in self.reach.states(now, self.s.unreachable_after) {
            let events = self.view.set_reachable(&addr, reachable);
            self.emit(events);
            // ractor_cluster never times a session out: a session silent this long is
            // probably half-open (peer host gone, partition). Close it so that a redial (or
            // the peer's next life) gets a fresh one instead of losing an election to it.
            let stale = self
                .reach
                .silence(&addr, now)
                .is_some_and(|d| d > self.s.unreachable_after * 3);
            if stale {
                self.close_stale_sessions(&addr, "silent for 3 x unreachable-after");
            }
        }
        self.resolve(myself, now);
        if !self.leaving {
            self.dial_due(myself, now);
        }
    }

    pub(super) fn on_heartbeat(&mut self, hb: Heartbeat) {
        let known = self
            .mesh
            .peers
            .get(&hb.node)
            .is_some_and(|p| p.incarnation == hb.incarnation);
        if !known {
            self.request_hello(&hb.node);
            return;
        }
        self.tell_if_downed(&hb.node, hb.incarnation, hb.age);
        if let Some(d) = self.downing.as_mut() {
            d.heard(&hb.node, hb.hears.contains(&self.me), Instant::now());
        }
        self.merge_rows(hb.reach);
        self.reach.heard(&hb.node, Instant::now());
        if self.view.get(&hb.node).is_some_and(|m| !m.reachable) {
            let events = self.view.set_reachable(&hb.node, true);
            self.emit(events);
        }
    }
}
