//! The cluster layer's history events (docs/history.md, "Cluster, singleton and sharding
//! events"): the node's life, its view of the membership, the split brain resolver's and
//! operators' decisions, and link faults, each a `tracing` event on [`TARGET`] that the
//! process's history writer, when installed, records.

use tenure_lease::history::TARGET;

use crate::identity::NodeAddr;
use crate::member::Member;

/// `node_started`: the node process started.
pub(crate) fn node_started() {
    tracing::info!(target: TARGET, event = "node_started");
}

/// `node_left`: the node left the cluster.
pub(crate) fn node_left() {
    tracing::info!(target: TARGET, event = "node_left");
}

/// `node_refused`: refused at join, because `member` has `theirs` for the placement setting
/// `key` where this node has `mine`.
pub(crate) fn node_refused(member: &NodeAddr, key: &str, mine: &str, theirs: &str) {
    tracing::info!(target: TARGET, event = "node_refused", member = %member, key, mine, theirs);
}

/// A membership event of `kind` (`member_joined` … `reachable`) about `member`, or about the
/// node itself (`self_down`, `self_leaving`: no member).
pub(crate) fn membership(kind: &str, member: Option<&Member>) {
    tracing::info!(target: TARGET, event = kind,
        member = member.map(|m| tracing::field::display(&m.addr)),
        member_inc = member.map(|m| tracing::field::display(m.incarnation)),
        age = member.map(|m| m.age),
        status = member.map(|m| m.status.as_str()));
}

/// `sbr_downed`: the split brain resolver's `strategy` kept this node's side and downed
/// `member`.
pub(crate) fn sbr_downed(member: &NodeAddr, strategy: &str) {
    tracing::info!(target: TARGET, event = "sbr_downed", member = %member, strategy);
}

/// `sbr_down_self`: this node's side goes; it downs itself, and why.
pub(crate) fn sbr_down_self(why: &str) {
    tracing::info!(target: TARGET, event = "sbr_down_self", why);
}

/// `down_self`: without a resolver, the node downs itself (and rejoins at once), and why.
pub(crate) fn down_self(why: &str) {
    tracing::info!(target: TARGET, event = "down_self", why);
}

/// `sbr_rejoining`: a downed node hears every member again and rejoins.
pub(crate) fn sbr_rejoining() {
    tracing::info!(target: TARGET, event = "sbr_rejoining");
}

/// `operator_downed`: an operator's request dropped `member`'s membership of `age` from
/// this node's view, and why.
pub(crate) fn operator_downed(member: &NodeAddr, age: u64, why: &str) {
    tracing::info!(target: TARGET, event = "operator_downed", member = %member, age, why);
}

/// `leave_requested`: an operator (`by`) asked this node to leave.
pub(crate) fn leave_requested(by: &str) {
    tracing::info!(target: TARGET, event = "leave_requested", by);
}

/// `link_cut` (`cut`) or `link_healed`: fault injection set this node's link to `member`
/// to `fault`.
#[cfg(any(feature = "fault-injection", test))]
pub(crate) fn link(cut: bool, member: &NodeAddr, fault: &str) {
    let event = if cut { "link_cut" } else { "link_healed" };
    tracing::info!(target: TARGET, event, member = %member, fault);
}

#[cfg(test)]
mod tests {
    use tenure_history::{AboutMember, Event, Link, Recorder};

    use super::*;
    use crate::identity::Incarnation;
    use crate::member::MemberStatus;

    #[test]
    fn every_event_is_its_documented_kind() {
        let b = NodeAddr::parse("test", "10.0.0.2:2552").unwrap();
        let member = Member {
            addr: b.clone(),
            incarnation: Incarnation(0x2e),
            age: 3,
            status: MemberStatus::Up,
            reachable: true,
            roles: Vec::new(),
            app_version: Default::default(),
        };
        let recorder = Recorder::new("10.0.0.1:2552", "1f");
        recorder.record(|| {
            node_started();
            membership("member_up", Some(&member));
            membership("self_down", None);
            node_refused(&b, "sharding.number-of-shards", "10", "20");
            sbr_downed(&b, "keep-majority");
            sbr_down_self("minority");
            down_self("lost its member lease");
            sbr_rejoining();
            operator_downed(&b, 3, "operator");
            leave_requested("management 127.0.0.1:8558");
            link(true, &b, "stall");
            link(false, &b, "none");
            node_left();
        });
        let s = |v: &str| v.to_string();
        let expected = [
            Event::NodeStarted {},
            Event::MemberUp(AboutMember::of(
                s("10.0.0.2:2552"),
                s("000000000000002e"),
                3,
                s("up"),
            )),
            Event::SelfDown {},
            Event::NodeRefused {
                member: s("10.0.0.2:2552"),
                key: s("sharding.number-of-shards"),
                mine: s("10"),
                theirs: s("20"),
            },
            Event::SbrDowned {
                member: s("10.0.0.2:2552"),
                strategy: s("keep-majority"),
            },
            Event::SbrDownSelf { why: s("minority") },
            Event::DownSelf {
                why: s("lost its member lease"),
            },
            Event::SbrRejoining {},
            Event::OperatorDowned {
                member: s("10.0.0.2:2552"),
                age: 3,
                why: s("operator"),
            },
            Event::LeaveRequested {
                by: s("management 127.0.0.1:8558"),
            },
            Event::LinkCut(Link::on_node(s("10.0.0.2:2552"), s("stall"))),
            Event::LinkHealed(Link::on_node(s("10.0.0.2:2552"), s("none"))),
            Event::NodeLeft {},
        ];
        assert_eq!(recorder.known_events(), Ok(expected.to_vec()));
    }
}
