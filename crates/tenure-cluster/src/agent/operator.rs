//! Operators' requests (a management endpoint's `POST /cluster/members/{addr}/leave` and
//! `/down`): a member leaves gracefully, or is downed (Akka's `Cluster.leave` and
//! `Cluster.down`).
//!
//! A leave is carried out by the leaving node alone, since only it can hand over what it
//! hosts: a node asked about another member passes the request on to that member's agent.
//! A down ends the member's current membership: the node asked drops it from its view and
//! tells every peer, which drop it too; the member itself downs itself when it hears of it
//! (it stops what it hosts, releases its leases, then rejoins as a new member or exits, per
//! `when-down`, as when the split brain resolver downs it). A downed member that hears
//! nothing (frozen, cut off) keeps its leases until they expire: downing moves work away
//! sooner, the leases keep it safe.

use ractor::{ActorRef, RpcReplyPort};

use super::AgentState;
use crate::error::OperatorRefusal;
use crate::member::MemberStatus;
use crate::protocol::{AgentMsg, DownRequest, LeaveRequest, MemberDowned, OperatorReply};

/// Operators' down notices kept for members that heartbeat under a downed membership
/// (bounded: such a member hears one within a heartbeat or two).
const MAX_KEPT_NOTICES: usize = 256;

/// How long a node waits for the member it passed a leave request on to.
const FORWARD_TIMEOUT_MS: u64 = 5000;

fn refused(refusal: OperatorRefusal) -> OperatorReply {
    OperatorReply {
        refused: Some(refusal),
    }
}

const ACCEPTED: OperatorReply = OperatorReply { refused: None };

impl AgentState {
    /// An operator asks `req.member` to leave: this node leaves (through whoever awaits
    /// `Node::leave_requested`), or the request goes on to that member.
    pub(super) fn on_leave_request(
        &mut self,
        req: LeaveRequest,
        reply: RpcReplyPort<OperatorReply>,
    ) {
        if req.member == self.me {
            let answer = if self.leaving {
                refused(OperatorRefusal::Conflict("it is leaving already".into()))
            } else if self.leave_requests.receiver_count() == 0 {
                refused(OperatorRefusal::Conflict(
                    "its program does not take leave requests (nothing awaits \
                     Node::leave_requested); stop it with SIGTERM"
                        .into(),
                ))
            } else {
                tracing::info!(node = %self.me, by = %req.by, "an operator asked this node to leave");
                crate::history::leave_requested(&req.by);
                self.leave_requests.send_replace(Some(req.by));
                ACCEPTED
            };
            let _ = reply.send(answer);
            return;
        }
        let agent = match self.view.get(&req.member) {
            None => None,
            Some(m) if m.status == MemberStatus::Leaving => {
                let _ = reply.send(refused(OperatorRefusal::Conflict(
                    "it is leaving already".into(),
                )));
                return;
            }
            Some(_) => self.mesh.peers.get(&req.member).map(|p| p.agent.clone()),
        };
        let Some(agent) = agent else {
            let refusal = if self.view.get(&req.member).is_none() {
                OperatorRefusal::NotAMember {
                    node: self.me.to_string(),
                }
            } else {
                OperatorRefusal::Conflict(format!(
                    "{} has no session with it, and only a node can leave (it hands over what \
                     it hosts): ask its own endpoint, or down it",
                    self.me
                ))
            };
            let _ = reply.send(refused(refusal));
            return;
        };
        tokio::spawn(async move {
            let member = req.member.clone();
            let answer = ractor::call_t!(agent, AgentMsg::Leave, FORWARD_TIMEOUT_MS, req)
                .unwrap_or_else(|e| {
                    refused(OperatorRefusal::Conflict(format!(
                        "{member} did not answer the leave request: {e}"
                    )))
                });
            let _ = reply.send(answer);
        });
    }

    /// An operator downs `req.member`.
    pub(super) fn on_down_request(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        req: DownRequest,
    ) -> OperatorReply {
        let why = format!("downed by an operator ({}, through {})", req.by, self.me);
        if req.member == self.me {
            if self.leaving {
                return refused(OperatorRefusal::Conflict("it is leaving".into()));
            }
            if self.view.me().status != MemberStatus::Up {
                return refused(OperatorRefusal::Conflict(format!(
                    "it is not an up member ({})",
                    self.view.me().status.as_str()
                )));
            }
            self.down_self(myself, &why);
            return ACCEPTED;
        }
        let Some(member) = self.view.get(&req.member).cloned() else {
            return refused(OperatorRefusal::NotAMember {
                node: self.me.to_string(),
            });
        };
        let notice = MemberDowned {
            member: member.addr.clone(),
            incarnation: member.incarnation,
            age: member.age,
            by: self.me.clone(),
            why,
        };
        self.operator_down(&notice);
        // The member itself included: it downs itself on hearing it.
        for p in self.mesh.peers.values() {
            let _ = p.agent.cast(AgentMsg::Downed(notice.clone()));
        }
        ACCEPTED
    }

    /// A peer downed a membership on an operator's request.
    pub(super) fn on_member_downed(&mut self, myself: &ActorRef<AgentMsg>, notice: MemberDowned) {
        if notice.member == self.me {
            let me = self.view.me();
            if me.status == MemberStatus::Up && me.age == notice.age {
                self.down_self(myself, &notice.why);
            }
            return;
        }
        let same = self
            .view
            .get(&notice.member)
            .is_some_and(|m| m.incarnation == notice.incarnation && m.age == notice.age);
        if same {
            self.operator_down(&notice);
        }
    }

    /// Drops the membership `notice` names from this node's view, and keeps the notice for
    /// the member should it heartbeat under that membership.
    fn operator_down(&mut self, notice: &MemberDowned) {
        let events = self.view.down(&notice.member);
        if events.is_empty() {
            return;
        }
        if self.operator_downs.len() >= MAX_KEPT_NOTICES {
            self.operator_downs.pop_first();
        }
        self.operator_downs.insert(
            (notice.member.clone(), notice.incarnation, notice.age),
            notice.clone(),
        );
        let (member, age, why) = (&notice.member, notice.age, &notice.why);
        tracing::warn!(node = %self.me, %member, age, why, "downing a member");
        crate::metrics::downing("down_member", "operator");
        crate::history::operator_downed(member, age, why);
        self.emit(events);
    }
}
