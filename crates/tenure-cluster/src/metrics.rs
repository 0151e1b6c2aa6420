//! Cluster metrics through the [`metrics`] facade, from the node's view after each batch of
//! membership events.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `tenure_cluster_members` | gauge | `status` | members in the view by status (this node included) |
//! | `tenure_cluster_unreachable` | gauge | | peers seen unreachable now |
//! | `tenure_cluster_events_total` | counter | `kind` | membership events (`member_up`, `member_down`, `unreachable`, `self_down`, …) |
//! | `tenure_cluster_downing_decisions_total` | counter | `decision`, `strategy` | downing decisions: `down_member` (this side survived and downed a member), `down_self`; `strategy` is the resolver's, or `operator` for an operator's down |

use crate::member::{Member, MemberStatus};

/// Sets the membership gauges from `members` (this node's view, itself included).
pub(crate) fn membership(me: &Member, members: &[Member]) {
    for status in [
        MemberStatus::Joining,
        MemberStatus::Up,
        MemberStatus::Leaving,
        MemberStatus::Down,
    ] {
        let n = members.iter().filter(|m| m.status == status).count();
        metrics::gauge!("tenure_cluster_members", "status" => status.as_str()).set(n as f64);
    }
    let unreachable = members
        .iter()
        .filter(|m| m.addr != me.addr && !m.reachable && m.status != MemberStatus::Removed)
        .count();
    metrics::gauge!("tenure_cluster_unreachable").set(unreachable as f64);
}

/// Counts one membership event of kind `kind`.
pub(crate) fn event(kind: &'static str) {
    metrics::counter!("tenure_cluster_events_total", "kind" => kind).increment(1);
}

/// Counts one split brain resolver decision: `down_member` or `down_self`.
pub(crate) fn downing(decision: &'static str, strategy: &'static str) {
    metrics::counter!("tenure_cluster_downing_decisions_total", "decision" => decision, "strategy" => strategy)
        .increment(1);
}
