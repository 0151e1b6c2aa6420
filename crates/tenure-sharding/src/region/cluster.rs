//! The region in its cluster: registering with the coordinator, and what membership
//! changes mean for the homes it knows.

use super::*;

impl RegionState {
    /// Registers with the coordinator: the changes to its shards since the last
    /// registration, or all of them to a coordinator instance it has not registered with
    /// (or that asked for all).
    pub(super) async fn register(&mut self) {
        let Some(c) = self.args.coordinator.instance().await else {
            return;
        };
        let shards: BTreeSet<String> = self.shards.keys().cloned().collect();
        self.registrations += 1;
        let (base, added, removed) = match &self.registered {
            Some(r) if r.to == c.get_id() => (
                Some(r.seq),
                shards.difference(&r.shards).cloned().collect(),
                r.shards.difference(&shards).cloned().collect(),
            ),
            _ => (None, shards.iter().cloned().collect(), Vec::new()),
        };
        let sent = c.cast(CoordinatorMsg::RegisterChanges(RegisterChanges {
            region: self.args.me.clone(),
            seq: self.registrations,
            base,
            added,
            removed,
            available: self.can_host(),
        }));
        self.registered = sent.is_ok().then(|| Registered {
            to: c.get_id(),
            seq: self.registrations,
            shards,
        });
    }

    pub(super) async fn tick(&mut self) {
        self.register().await;
        self.drop_expired_asks();
        let mut asking: BTreeSet<String> = self.pending.keys().cloned().collect();
        if !self.down && !self.leaving {
            asking.extend(self.orphans.iter().cloned());
        }
        for shard in asking {
            self.ask_home(&shard).await;
        }
    }

    /// Forgets the homes on `addr` (unreachable or gone), keeping their shards as orphans
    /// whose home is asked again.
    pub(super) fn lose_homes_on(&mut self, addr: &str) {
        self.args.routes.close_remote_node(Some(addr));
        let orphans = &mut self.orphans;
        self.homes.retain(|shard, h| {
            let lost = h == addr;
            if lost {
                orphans.insert(shard.clone());
            }
            !lost
        });
    }

    pub(super) async fn on_cluster(&mut self, event: ClusterEvent) {
        match event {
            ClusterEvent::CurrentMembers(members) => {
                self.members = members
                    .into_iter()
                    .map(|m| (m.addr.to_string(), m))
                    .collect();
            }
            ClusterEvent::MemberJoined(m) | ClusterEvent::MemberUp(m) => {
                // A node back at a vacated address is a new incarnation (with a new region).
                let addr = m.addr.to_string();
                self.vacated.remove(&addr);
                self.forget_region(&addr);
                self.members.insert(addr, m);
            }
            ClusterEvent::MemberLeaving(m) | ClusterEvent::Reachable(m) => {
                self.members.insert(m.addr.to_string(), m);
            }
            ClusterEvent::Unreachable(m) => {
                let addr = m.addr.to_string();
                self.lose_homes_on(&addr);
                self.members.insert(addr, m);
            }
            ClusterEvent::MemberDown(m) | ClusterEvent::MemberRemoved(m) => {
                let addr = m.addr.to_string();
                self.lose_homes_on(&addr);
                self.forget_region(&addr);
                self.vacated.remove(&addr);
                if addr == self.args.me {
                    self.members.insert(addr, m);
                } else {
                    self.members.remove(&addr);
                }
            }
            ClusterEvent::SelfDown => {
                tracing::warn!(entity_type = %self.args.type_name, "this node is down: stopping its shards");
                self.down = true;
                self.acknowledged = false;
                self.args.routes.close_remote_node(None);
                self.hand_off_all();
            }
            ClusterEvent::SelfLeaving(guard) => {
                self.leaving = true;
                self.args.routes.close_remote_node(None);
                self.leave = Some(Leave {
                    _guard: guard,
                    round: false,
                    clean_from: None,
                });
                self.hand_off_all();
                self.tick().await;
            }
        }
        if self
            .members
            .get(&self.args.me)
            .is_some_and(|m| m.status == MemberStatus::Up)
        {
            self.down = false;
        }
    }
}
