//! Membership events out: each change of the view goes to the subscribers, the metrics,
//! the log and the history, and moves reachability watching along with the members.

use tokio::time::Instant;

use super::AgentState;
use crate::member::{ClusterEvent, Member};
use crate::subscribe::ClusterSubscriber;

impl AgentState {
    /// Adds a subscriber; it gets the current members first.
    pub(super) fn subscribe(&mut self, sub: ClusterSubscriber) {
        if sub.deliver(ClusterEvent::CurrentMembers(self.view.members())) {
            self.subscribers.push(sub);
        }
    }

    /// Publishes the view's changes.
    pub(super) fn emit(&mut self, events: Vec<ClusterEvent>) {
        let now = Instant::now();
        let changed = !events.is_empty();
        for event in events {
            self.observe(&event, now);
            self.subscribers.retain(|s| s.deliver(event.clone()));
        }
        if changed {
            crate::metrics::membership(self.view.me(), &self.view.members());
        }
    }

    /// Bookkeeping, logging and history of one event.
    pub(super) fn observe(&mut self, event: &ClusterEvent, now: Instant) {
        let (kind, member): (&str, Option<&Member>) = match event {
            ClusterEvent::MemberJoined(m) => ("member_joined", Some(m)),
            ClusterEvent::MemberUp(m) => ("member_up", Some(m)),
            ClusterEvent::MemberLeaving(m) => ("member_leaving", Some(m)),
            ClusterEvent::MemberDown(m) => ("member_down", Some(m)),
            ClusterEvent::MemberRemoved(m) => ("member_removed", Some(m)),
            ClusterEvent::Unreachable(m) => ("unreachable", Some(m)),
            ClusterEvent::Reachable(m) => ("reachable", Some(m)),
            ClusterEvent::SelfDown => ("self_down", None),
            ClusterEvent::SelfLeaving(_) => ("self_leaving", None),
            ClusterEvent::CurrentMembers(_) => return,
        };
        crate::metrics::event(kind);
        if let Some(m) = member {
            if m.addr != self.me {
                self.detector.on_event(event, now);
                if matches!(event, ClusterEvent::MemberRemoved(_))
                    && m.status == crate::member::MemberStatus::Down
                {
                    self.close_stale_sessions(&m.addr, "its member lease lapsed");
                }
            }
            // Members come, go and crash in the normal life of a cluster: info, not warn.
            tracing::info!(node = %self.me, member = %m.addr, incarnation = %m.incarnation, age = m.age, "{kind}")
        } else if matches!(event, ClusterEvent::SelfDown) {
            // This node is out of the cluster without having asked to leave.
            tracing::warn!(node = %self.me, "{kind}");
        } else {
            tracing::info!(node = %self.me, "{kind}");
        }
        crate::history::membership(kind, member);
    }
}
