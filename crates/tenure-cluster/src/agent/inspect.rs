//! Inspection: the node's view as answered to clients and the CLI (`tenure cluster
//! status`), with the session, silence and link state of each member.

use tokio::time::Instant;

use super::AgentState;
use crate::protocol::{MemberInfo, NodeView};

impl AgentState {
    pub(super) fn node_view(&self) -> NodeView {
        let now = Instant::now();
        #[cfg(feature = "fault-injection")]
        let cut = self.mesh.links.cut_peers();
        #[cfg(not(feature = "fault-injection"))]
        let cut: Vec<crate::identity::NodeAddr> = Vec::new();
        let members = self
            .view
            .members()
            .into_iter()
            .map(|m| {
                let me = m.addr == self.me;
                MemberInfo {
                    sessions: self
                        .mesh
                        .sessions
                        .values()
                        .filter(|s| s.authenticated && s.peer.as_ref() == Some(&m.addr))
                        .count() as u32,
                    silence_ms: (!me)
                        .then(|| self.detector.reach.silence(&m.addr, now))
                        .flatten()
                        .map(|d| d.as_millis() as u64),
                    link_cut: cut.contains(&m.addr),
                    roles: m.roles.clone(),
                    addr: m.addr,
                    incarnation: m.incarnation,
                    age: m.age,
                    status: m.status,
                    reachable: m.reachable,
                }
            })
            .collect();
        NodeView {
            system: self.s.system.clone(),
            node: self.me.clone(),
            incarnation: self.incarnation,
            members,
        }
    }
}
