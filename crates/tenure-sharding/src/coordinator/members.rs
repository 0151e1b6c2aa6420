//! Members: the cluster's members as the coordinator hears of them, and which regions are
//! alive (may keep their shards) and allocatable (may be given new ones). A member down or
//! removed takes its region, and its shards' homes, with it.

use super::*;

impl CoordinatorState {
    pub(super) fn on_cluster(&mut self, event: ClusterEvent) {
        match event {
            ClusterEvent::CurrentMembers(members) => {
                self.members = members
                    .into_iter()
                    .map(|m| (m.addr.to_string(), m))
                    .collect();
                let now = Instant::now();
                for m in self.members.values().filter(|m| !m.reachable) {
                    self.unreachable_since.insert(m.addr.to_string(), now);
                }
                let registered: Vec<String> = self.regions.keys().cloned().collect();
                for region in registered {
                    self.refresh(&region);
                }
            }
            ClusterEvent::Unreachable(m) => {
                let addr = m.addr.to_string();
                self.unreachable_since
                    .entry(addr.clone())
                    .or_insert_with(Instant::now);
                self.members.insert(addr.clone(), m);
                self.refresh(&addr);
            }
            ClusterEvent::Reachable(m) => {
                let addr = m.addr.to_string();
                self.unreachable_since.remove(&addr);
                self.members.insert(addr.clone(), m);
                self.refresh(&addr);
            }
            ClusterEvent::MemberJoined(m)
            | ClusterEvent::MemberUp(m)
            | ClusterEvent::MemberLeaving(m) => {
                let addr = m.addr.to_string();
                self.members.insert(addr.clone(), m);
                self.refresh(&addr);
            }
            ClusterEvent::MemberDown(m) | ClusterEvent::MemberRemoved(m) => {
                let addr = m.addr.to_string();
                self.members.remove(&addr);
                self.regions.remove(&addr);
                self.askers.remove(&addr);
                self.unreachable_since.remove(&addr);
                self.misplaced.retain(|(region, _), _| *region != addr);
                // A daemon's workers there stopped with it (their leases lapse).
                self.stopping.retain(|_, region| *region != addr);
                self.finish_resize();
                self.set_allocatable(&addr, false, false);
            }
            ClusterEvent::SelfDown | ClusterEvent::SelfLeaving(_) => {}
        }
        self.reallocate_lost();
    }

    /// A region that may keep its shards: its member is up, it reported itself
    /// available, and it has not been unreachable for too long.
    pub(super) fn alive(&self, region: &str) -> bool {
        let up = self.members.get(region).is_some_and(|m| {
            m.status == MemberStatus::Up && m.has_role(self.args.settings.role.as_deref())
        });
        let available = self
            .regions
            .get(region)
            .map_or(self.holders.contains(region), |r| r.available);
        let silent_too_long = self
            .unreachable_since
            .get(region)
            .is_some_and(|t| t.elapsed() >= self.args.settings.unreachable_reallocate_after);
        up && available && !silent_too_long
    }

    /// Whether `region` may be given new shards from now on (alive, registered and
    /// reachable), as the allocation strategy sees it.
    pub(super) fn refresh(&mut self, region: &str) {
        let allocatable = self.regions.contains_key(region)
            && self.alive(region)
            && !self.unreachable_since.contains_key(region);
        let new_version = self
            .members
            .get(region)
            .is_some_and(|m| self.homes.set_version(region, m.app_version.clone()));
        self.set_allocatable(region, allocatable, new_version);
    }

    /// Records whether `region` may be given shards (before the newest-version filter),
    /// and in the history each change, and each new version (`new_version`) of one that may.
    pub(super) fn set_allocatable(&mut self, region: &str, allocatable: bool, new_version: bool) {
        if self.homes.set_allocatable(region, allocatable) || (allocatable && new_version) {
            let version = self.homes.version(region).to_string();
            history::region_allocatable(&self.args.type_name, region, &version, allocatable);
        }
    }
}
