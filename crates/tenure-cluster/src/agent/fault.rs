//! Fault injection: link faults set on a test's or drill's request, when the node is built
//! with the `fault-injection` feature and allows them (`cluster.fault-injection`). A node
//! built without it refuses every request (the message stays in the protocol, so that the
//! CLI gets an answer rather than an unknown message).

use super::AgentState;
use crate::protocol::{FaultReply, SetLink};

impl AgentState {
    #[cfg(not(feature = "fault-injection"))]
    pub(super) fn set_link(&mut self, _change: SetLink) -> FaultReply {
        FaultReply {
            error: Some(
                "fault injection is not built into this node (tenure-cluster feature `fault-injection`)"
                    .into(),
            ),
        }
    }

    /// Sets the link fault with `change.peer`, if `cluster.fault-injection` allows it.
    #[cfg(feature = "fault-injection")]
    pub(super) fn set_link(&mut self, change: SetLink) -> FaultReply {
        if !self.s.fault_injection {
            return FaultReply {
                error: Some(
                    "fault injection is disabled on this node (cluster.fault-injection = false)"
                        .into(),
                ),
            };
        }
        use crate::transport::LinkFault;

        let SetLink { peer, fault } = change;
        let cut = fault != LinkFault::None;
        tracing::warn!(node = %self.me, %peer, fault = fault.as_str(), "fault injection: link {}", if cut { "cut" } else { "healed" });
        self.mesh.links.gate(&peer).set(fault);
        crate::history::link(cut, &peer, fault.as_str());
        FaultReply { error: None }
    }
}
