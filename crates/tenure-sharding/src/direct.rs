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
//!
//! The same tickets let a handle skip this node's region for an entity of *another* node:
//! after the region forwarded a message of a shard to the region of its home, it opens
//! the shard's remote route to that region, and a handle sends there itself (as the
//! region would have: the same session to that node, with one hop counted) while no
//! message of this node for the entity is on the routed path. The region closes the route
//! whenever it stops forwarding the shard there: its home is forgotten or replaced
//! (`BeginHandOff`, a bounced message, a failed forward), its node is unreachable, down,
//! vacated or back as a new incarnation, this node leaves or is down, or the region stops.
//! A direct send is therefore always one the region would have forwarded to the same
//! region at that moment, in the same order with the messages this node routed before it
//! (they left the node first) and after it (they leave the node after it, if they go
//! there at all).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use ractor::{ActorRef, MessagingErr};
use tenure_lease::{FencingToken, LeaseView};

use crate::entity::EntityMsg;
use crate::messages::{Envelope, RegionMsg};

/// A fast hash, seeded per process: the maps are looked up for every message sent here.
type FastMap<V> = HashMap<String, V, foldhash::fast::RandomState>;

/// The direct routes of one region (one entity type on one node).
#[derive(Default)]
pub struct Routes {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Entities of this node's shards, and every entity with a message on the routed path.
    slots: FastMap<Slot>,
    /// Shards of other nodes: the region the region last forwarded each one's messages to.
    remote: FastMap<Remote>,
}

/// An open remote route: the region of the shard's home node.
struct Remote {
    node: String,
    region: ActorRef<RegionMsg>,
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
        let mut inner = self.routes.lock();
        let slots = &mut inner.slots;
        if let Some(slot) = slots.get_mut(&self.entity) {
            slot.routed = slot.routed.saturating_sub(1);
            if slot.routed == 0 && slot.open.is_none() {
                slots.remove(&self.entity);
            }
        }
    }
}

impl Routes {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts `msg` into the mailbox of entity `entity` if its route is open, its grant still
    /// believed and none of its messages is on the routed path; otherwise gives it back
    /// with the [`Ticket`] it must travel the routed path with.
    pub(crate) fn send(
        self: &Arc<Self>,
        entity: &str,
        msg: EntityMsg,
    ) -> Result<(), (EntityMsg, Ticket)> {
        self.send_or_forward(entity, msg, None)
    }

    /// As [`send`](Self::send), from a handle of this node: an entity of another node's
    /// shard gets `msg` through the shard's open remote route, given `number_of_shards` to
    /// find its shard, when none of its messages is on the routed path.
    pub(crate) fn send_from_handle(
        self: &Arc<Self>,
        entity: &str,
        msg: EntityMsg,
        number_of_shards: usize,
    ) -> Result<(), (EntityMsg, Ticket)> {
        self.send_or_forward(entity, msg, Some(number_of_shards))
    }

    fn send_or_forward(
        self: &Arc<Self>,
        entity: &str,
        msg: EntityMsg,
        number_of_shards: Option<usize>,
    ) -> Result<(), (EntityMsg, Ticket)> {
        let mut inner = self.lock();
        let Inner { slots, remote } = &mut *inner;
        let mut msg = msg;
        match slots.get_mut(entity) {
            Some(slot) => {
                if slot.routed == 0
                    && let Some(open) = &slot.open
                {
                    if open.view.check_grant(open.token) {
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
                if let Some(shards) = number_of_shards
                    && !remote.is_empty()
                {
                    match forward_direct(remote, entity, msg, shards) {
                        Ok(()) => return Ok(()),
                        Err(back) => msg = back,
                    }
                }
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
        let mut inner = self.lock();
        let slot = inner.slots.entry(entity.to_string()).or_default();
        slot.open = Some(Open { actor, view, token });
        slot.used = false;
    }

    /// Closes the route of `entity` if it leads to `actor` (or to any actor, `None`):
    /// nothing enters that mailbox directly from now on.
    pub(crate) fn close(&self, entity: &str, actor: Option<ractor::ActorId>) {
        let mut inner = self.lock();
        let slots = &mut inner.slots;
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
            .slots
            .get_mut(entity)
            .is_some_and(|s| std::mem::take(&mut s.used))
    }

    /// Opens (or moves) the remote route of `shard` to `region`, of node `node`: the region
    /// just forwarded a message of the shard there, and would forward the next one there too.
    pub(crate) fn open_remote(&self, shard: &str, node: &str, region: &ActorRef<RegionMsg>) {
        let mut inner = self.lock();
        match inner.remote.get_mut(shard) {
            Some(r) if r.region.get_id() == region.get_id() => {}
            _ => {
                inner.remote.insert(
                    shard.to_string(),
                    Remote {
                        node: node.to_string(),
                        region: region.clone(),
                    },
                );
            }
        }
    }

    /// Closes the remote route of `shard`: nothing goes directly to another node's region
    /// for it from now on.
    pub(crate) fn close_remote(&self, shard: &str) {
        self.lock().remote.remove(shard);
    }

    /// Closes every remote route to node `node` (`None`: to any node).
    pub(crate) fn close_remote_node(&self, node: Option<&str>) {
        self.lock()
            .remote
            .retain(|_, r| node.is_some_and(|n| r.node != n));
    }

    /// Whether `shard` has an open remote route.
    #[cfg(test)]
    pub(crate) fn remote_open(&self, shard: &str) -> bool {
        self.lock().remote.contains_key(shard)
    }
}

/// Sends `msg` for `entity` to the region of its shard's home if its remote route is open,
/// as that region's forward would (one hop counted); gives it back otherwise, and when that
/// region has stopped (the route is closed then; the routed path finds the home again).
/// Called under the routes' lock, with no message of this node for `entity` on the routed
/// path.
fn forward_direct(
    remote: &mut FastMap<Remote>,
    entity: &str,
    msg: EntityMsg,
    number_of_shards: usize,
) -> Result<(), EntityMsg> {
    let shard = crate::entity::shard_of(entity, number_of_shards);
    let Some(route) = remote.get(&shard) else {
        return Err(msg);
    };
    let env = Envelope {
        shard,
        entity: entity.to_string(),
        payload: msg.payload.into_vec(),
        hops: 1,
    };
    let sent = route.region.cast(match msg.reply {
        None => RegionMsg::Deliver(env),
        Some(port) => RegionMsg::Ask(env, port),
    });
    match sent {
        Ok(()) => Ok(()),
        Err(e) => {
            let (env, reply) = match e {
                MessagingErr::SendErr(RegionMsg::Deliver(env)) => (env, None),
                MessagingErr::SendErr(RegionMsg::Ask(env, port)) => (env, Some(port)),
                e => {
                    // Not given back: it is gone (an ask's port with it, so its asker
                    // gets an error at once), as when the region forwards it.
                    tracing::warn!(entity, error = %e, "message lost forwarding it to another region");
                    return Ok(());
                }
            };
            remote.remove(&env.shard);
            Err(EntityMsg {
                payload: env.payload.into(),
                reply,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use ractor::Actor;

    use super::*;
    use crate::entity::shard_of;
    use crate::test_regions::RegionDouble;

    fn tell(n: u8) -> EntityMsg {
        EntityMsg {
            payload: vec![n].into(),
            reply: None,
        }
    }

    #[tokio::test]
    async fn a_handle_sends_to_another_nodes_region_only_while_its_route_is_open_and_nothing_of_the_entity_is_routed()
     {
        let routes = Arc::new(Routes::default());
        let (tx, mut received) = tokio::sync::mpsc::unbounded_channel();
        let (other, _) = Actor::spawn(None, RegionDouble::envelopes(tx), ())
            .await
            .unwrap();
        let shards = 10;
        let shard = shard_of("a", shards);
        let direct = |n: u8| routes.send_from_handle("a", tell(n), shards).is_ok();

        // Routed while no route is open; its ticket outlives the route's opening.
        let (_, first) = routes.send_from_handle("a", tell(0), shards).unwrap_err();
        routes.open_remote(&shard, "n2", &other);
        assert!(!direct(1), "overtook a message still on the routed path");
        drop(first);
        assert!(direct(2));
        let env = received.recv().await.unwrap();
        assert_eq!(
            (env.entity.as_str(), &env.shard, env.payload, env.hops),
            ("a", &shard, vec![2], 1)
        );
        // The region's own sends (messages from other nodes) never take a remote route.
        assert!(routes.send("a", tell(3)).is_err());

        routes.close_remote(&shard);
        assert!(!direct(4), "sent through a closed route");
        routes.open_remote(&shard, "n2", &other);
        routes.close_remote_node(Some("n3"));
        assert!(direct(5));
        assert_eq!(received.recv().await.unwrap().payload, vec![5]);
        routes.close_remote_node(Some("n2"));
        assert!(!direct(6), "sent to a node whose routes were closed");
        routes.open_remote(&shard, "n2", &other);
        routes.close_remote_node(None);
        assert!(!direct(7), "sent after every route was closed");

        // A region that stopped gives the message back and closes its route.
        routes.open_remote(&shard, "n2", &other);
        other.stop_and_wait(None, None).await.unwrap();
        assert!(!direct(8));
        assert!(!routes.remote_open(&shard));
        assert!(received.try_recv().is_err(), "more went directly");
        assert!(routes.lock().slots.is_empty());
    }

    #[test]
    fn a_route_never_opened_gives_tickets_and_forgets_the_entity_once_they_are_dropped() {
        let routes = Arc::new(Routes::default());
        let msg = EntityMsg {
            payload: vec![1].into(),
            reply: None,
        };
        let (msg, first) = routes.send("a", msg).map(|_| ()).unwrap_err();
        let (_, second) = routes.send("a", msg).map(|_| ()).unwrap_err();
        assert_eq!(routes.lock().slots["a"].routed, 2);
        drop(first);
        assert_eq!(routes.lock().slots["a"].routed, 1);
        drop(second);
        assert!(routes.lock().slots.is_empty());
        routes.close("a", None);
        assert!(!routes.take_used("a"));
    }
}
