//! The ring of monitors in the agent: the peer lives it has sessions with, which the
//! failure detection machine ([`crate::detector`]) heartbeats and probes through, and the
//! indirect probes' messages in and out.

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::AgentState;
use crate::identity::{Incarnation, NodeAddr};
use crate::protocol::{AgentMsg, Probe};

impl AgentState {
    /// The peer lives this node has sessions with.
    pub(super) fn peer_lives(&self) -> BTreeMap<NodeAddr, Incarnation> {
        self.mesh
            .peers
            .iter()
            .map(|(addr, p)| (addr.clone(), p.incarnation))
            .collect()
    }

    /// One step of an indirect probe ([`crate::detector::Detector::on_probe`]), passed on
    /// where the machine says.
    pub(super) fn on_probe(&mut self, probe: Probe) {
        let peers = self.peer_lives();
        if let Some((to, probe)) = self
            .detector
            .on_probe(probe, Instant::now(), &self.view, &peers)
        {
            self.pass_probe(&to, probe);
        }
    }

    /// Casts `probe` to `to`'s agent, if it is a peer.
    pub(super) fn pass_probe(&self, to: &NodeAddr, probe: Probe) {
        if let Some(peer) = self.mesh.peers.get(to) {
            let _ = peer.agent.cast(AgentMsg::Probe(probe));
        }
    }
}
