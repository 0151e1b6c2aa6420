//! The local fast path: a message from this node for an entity running here goes straight
//! into the entity's mailbox, skipping the region and shard actors, when (and only when)
//! that keeps every guarantee of the routed path.
//!
//! A region's [`Routes`] are shared by its [`ShardRegion`](crate::ShardRegion) handles and
//! its local shards. The shard *opens* an entity's route once the entity has started and
//! every message the shard kept for it was delivered, while the shard serves under a
//! grant; it *closes* it before the entity passivates or stops (hand-off, lease lost,
//! shard stopped) and when it ends. A handle sends directly only while the route is open,
//! the grant is still believed ([`LeaseView`]), and no message of this node for the entity
//! is still on the routed path: each routed message carries a [`Ticket`] from the moment
//! it is sent until it reaches the entity's mailbox or leaves the node (delivered,
//! forwarded to another node's region, refused, expired or lost; the ticket is dropped with
//! it). Direct sends and ticket counts change under one lock, so:
//! - a direct send never overtakes an earlier message of this node for the same entity
//!   (every one is in the entity's mailbox already, or has left the node: forwarded ones
//!   travel as they did before);
//! - once a route is closed, nothing more enters the entity's mailbox directly, so a
//!   passivating or handing-off entity drains exactly what reached it, and later messages
//!   take the routed path (kept by the shard for the entity's next incarnation or home).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use ractor::{ActorRef, MessagingErr};
use tenure_lease::{FencingToken, LeaseView};

use crate::entity::EntityMsg;

/// The direct routes of one region (one entity type on one node).
#[derive(Default)]
pub struct Routes {
    /// Looked up for every message sent on this node: a fast hash, seeded per process.
    slots: Mutex<HashMap<String, Slot, foldhash::fast::RandomState>>,
}

/// One entity's route: open or not, and its messages still on the routed path.
#[derive(Default)]
struct Slot {
    open: Option<Open>,
    /// Routed messages of this node for the entity not yet in its mailbox or gone.
    routed: u64,
    /// A message went directly since the shard last looked (it sees no direct traffic:
    /// idle passivation asks here).
    used: bool,
}

struct Open {
    actor: ActorRef<EntityMsg>,
    view: LeaseView,
    token: FencingToken,
}

/// Marks a message of this node on the routed path for its entity: while one lives, the
/// entity's messages take the routed path too (dropping it, with its message, ends that).
pub struct Ticket {
    routes: Arc<Routes>,
    entity: String,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut slots = self.routes.lock();
        if let Some(slot) = slots.get_mut(&self.entity) {
            slot.routed = slot.routed.saturating_sub(1);
            if slot.routed == 0 && slot.open.is_none() {
                slots.remove(&self.entity);
            }
        }
    }
}

impl Routes {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Slot, foldhash::fast::RandomState>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts `msg` into the mailbox of entity `entity` if its route is open, its grant still
    /// believed and none of its messages is on the routed path; otherwise gives it back
    /// with the [`Ticket`] it must travel the routed path with.
    pub(crate) fn send(
        self: &Arc<Self>,
        entity: &str,
        msg: EntityMsg,
    ) -> Result<(), (EntityMsg, Ticket)> {
        let mut slots = self.lock();
        let mut msg = msg;
        match slots.get_mut(entity) {
            Some(slot) => {
                if slot.routed == 0
                    && let Some(open) = &slot.open
                {
                    if open.view.token() == Some(open.token) {
                        match open.actor.cast(msg) {
                            Ok(()) => {
                                slot.used = true;
                                return Ok(());
                            }
                            // Stopping or stopped: its shard closes the route soon.
                            Err(MessagingErr::SendErr(back)) => msg = back,
                            Err(e) => {
                                // Not given back (an actor of another type: a bug). The
                                // message is lost; an ask's port with it (its caller gets an
                                // error at once).
                                tracing::warn!(entity, error = %e, "message lost sending it to its entity");
                                return Ok(());
                            }
                        }
                    }
                    slot.open = None;
                }
                slot.routed += 1;
            }
            None => {
                slots.insert(
                    entity.to_string(),
                    Slot {
                        routed: 1,
                        ..Slot::default()
                    },
                );
            }
        }
        Err((
            msg,
            Ticket {
                routes: self.clone(),
                entity: entity.to_string(),
            },
        ))
    }

    /// Opens the route of `entity` to `actor`, valid while the grant `token` is believed.
    /// Call it only when everything the shard kept for the entity is in its mailbox.
    pub(crate) fn open(
        &self,
        entity: &str,
        actor: ActorRef<EntityMsg>,
        view: LeaseView,
        token: FencingToken,
    ) {
        let mut slots = self.lock();
        let slot = slots.entry(entity.to_string()).or_default();
        slot.open = Some(Open { actor, view, token });
        slot.used = false;
    }

    /// Closes the route of `entity` if it leads to `actor` (or to any actor, `None`):
    /// nothing enters that mailbox directly from now on.
    pub(crate) fn close(&self, entity: &str, actor: Option<ractor::ActorId>) {
        let mut slots = self.lock();
        if let Some(slot) = slots.get_mut(entity) {
            if slot
                .open
                .as_ref()
                .is_some_and(|o| actor.is_none_or(|a| o.actor.get_id() == a))
            {
                slot.open = None;
            }
            if slot.open.is_none() && slot.routed == 0 {
                slots.remove(entity);
            }
        }
    }

    /// Whether a message went directly to `entity` since the last call (then it is not
    /// idle).
    pub(crate) fn take_used(&self, entity: &str) -> bool {
        self.lock()
            .get_mut(entity)
            .is_some_and(|s| std::mem::take(&mut s.used))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_never_opened_gives_tickets_and_forgets_the_entity_once_they_are_dropped() {
        let routes = Arc::new(Routes::default());
        let msg = EntityMsg {
            payload: vec![1],
            reply: None,
        };
        let (msg, first) = routes.send("a", msg).map(|_| ()).unwrap_err();
        let (_, second) = routes.send("a", msg).map(|_| ()).unwrap_err();
        assert_eq!(routes.lock()["a"].routed, 2);
        drop(first);
        assert_eq!(routes.lock()["a"].routed, 1);
        drop(second);
        assert!(routes.lock().is_empty());
        routes.close("a", None);
        assert!(!routes.take_used("a"));
    }
}
