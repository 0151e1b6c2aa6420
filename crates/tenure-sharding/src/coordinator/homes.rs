//! Homes: where a shard lives, allocating it when it has none (its pin first, else the
//! strategy), and telling the regions. What a wave decides reaches each region in one
//! message at its end (`tell`, `answer`, `flush`); a shard told to its home stays
//! unconfirmed, and is told again, until that region reports it. Nothing is allocated
//! before the shard leases were listed, nor while a daemon's resize stops its workers.

use super::*;

impl CoordinatorState {
    pub(super) fn get_home(&mut self, shard: String, region: String) {
        if !self.listed {
            self.deferred.push((shard, region));
            return;
        }
        match self.moving.get_mut(&shard) {
            // Answered when the move ends (Akka defers GetShardHome the same way).
            Some(m) => {
                m.waiting.insert(region);
            }
            None => {
                let home = self.home_of(&shard);
                self.tell(&region, &shard, Told::Home(home));
            }
        }
    }

    /// Where `shard` lives, allocating it if it has no home; `None` while it moves or
    /// when no region can take it.
    pub(super) fn home_of(&mut self, shard: &str) -> Option<String> {
        if self.moving.contains_key(shard) || self.resizing() {
            return None;
        }
        if let Some(home) = self.homes.home(shard)
            && self.alive(home)
        {
            return Some(home.to_string());
        }
        let to = self.allocate(shard)?;
        self.host(shard, &to);
        Some(to)
    }

    /// Where a shard without a home goes: the region it is pinned to when that can take
    /// it, else where the strategy says.
    pub(super) fn allocate(&self, shard: &str) -> Option<String> {
        if self.resizing() {
            return None;
        }
        match self.pinned.get(shard) {
            Some(pin) if self.homes.is_allocatable(pin) => Some(pin.clone()),
            _ => self.args.strategy.allocate(shard, &self.homes),
        }
    }

    /// Tells `region`, at the end of this wave, what to make of `shard` (what it was told
    /// of the shard earlier in the wave is replaced).
    pub(super) fn tell(&mut self, region: &str, shard: &str, told: Told) {
        self.answer(region);
        if let Some(told_here) = self.outbox.get_mut(region) {
            told_here.insert(shard.to_string(), told);
        }
    }

    /// Sends `region` a message at the end of this wave, even if it learns nothing in it.
    pub(super) fn answer(&mut self, region: &str) {
        if self.outbox.is_empty() {
            // Handled once the messages that reached the coordinator before it are: the
            // wave is everything they decide.
            let _ = self
                .myself
                .cast(CoordinatorMsg::Local(CoordinatorLocal::Flush));
        }
        self.outbox.entry(region.to_string()).or_default();
    }

    /// Sends each region what it learnt in this wave, in one message.
    pub(super) fn flush(&mut self) {
        for (region, told) in std::mem::take(&mut self.outbox) {
            let Some(r) = region_ref(&self.args.scope, &self.args.type_name, &region) else {
                continue;
            };
            let (mut host, mut homes) = (Vec::new(), Vec::new());
            for (shard, t) in told {
                match t {
                    Told::Host => host.push(shard),
                    Told::Home(home) => homes.push((shard, home)),
                }
            }
            let _ = r.cast(RegionMsg::Homes(ShardHomes {
                host,
                homes,
                coordinator: self.args.token,
            }));
        }
    }

    /// Records `region` as the home of `shard`, tells it to host the shard, and tells every
    /// other registered region where the shard lives (a region that registers later learns
    /// it then). Every region then knows every home, not only those it asked: when a node
    /// goes, the regions ask the next home of each of its shards at once (the region's
    /// orphans), so that even a coordinator that failed over with that node, and found the
    /// shard's lease lapsed, restarts the shard without waiting for a message to it. A copy
    /// of the shard that another region reports running is asked to hand off.
    pub(super) fn host(&mut self, shard: &str, region: &str) {
        history::shard_allocated(&self.args.type_name, shard, region);
        if self.args.settings.remember_entities {
            self.remembered.insert(shard.to_string());
        }
        self.unplaced.remove(shard);
        self.homes.set_home(shard, region);
        self.unconfirmed
            .insert(shard.to_string(), Some(Instant::now()));
        self.tell(region, shard, Told::Host);
        let others: Vec<String> = self
            .regions
            .keys()
            .filter(|r| *r != region)
            .cloned()
            .collect();
        for other in others {
            self.tell(&other, shard, Told::Home(Some(region.to_string())));
            if self.regions[&other].reported.contains(shard) {
                self.misplace(shard, &other);
            }
        }
    }

    /// Sends `Host` again for the shards their home has not reported within three
    /// `retry-interval`s of the last one (a lost `Host`, a shard that stopped there).
    pub(super) fn resend_hosts(&mut self) {
        let again = self.args.settings.retry_interval * 3;
        let mut due = Vec::new();
        self.unconfirmed.retain(|shard, sent| {
            let Some(home) = self.homes.home(shard) else {
                return false;
            };
            if sent.is_none_or(|t| t.elapsed() >= again) {
                due.push((shard.clone(), home.to_string()));
            }
            true
        });
        for (shard, home) in due {
            if self.alive(&home) {
                self.unconfirmed.insert(shard.clone(), Some(Instant::now()));
                self.tell(&home, &shard, Told::Host);
            }
        }
    }

    /// Moves the shards of regions that are no longer alive to the least loaded ones; with
    /// remember-entities, allocates the remembered shards without a home. Scans regions,
    /// not shards.
    pub(super) fn reallocate_lost(&mut self) {
        if !self.listed {
            return;
        }
        let lost: Vec<String> = self
            .homes
            .home_regions()
            .filter(|r| !self.alive(r))
            .map(str::to_string)
            .collect();
        for from in lost {
            let shards: Vec<String> = self.homes.hosted_by(&from).iter().cloned().collect();
            for shard in shards {
                self.homes.remove_home(&shard);
                self.unconfirmed.remove(&shard);
                match self.allocate(&shard) {
                    Some(to) => {
                        tracing::info!(entity_type = %self.args.type_name, shard, from, to, "moving the shard of a lost region");
                        self.host(&shard, &to);
                    }
                    None if self.remembered.contains(&shard) => {
                        self.unplaced.insert(shard);
                    }
                    None => {}
                }
            }
        }
        self.allocate_remembered();
    }

    /// remember-entities: gives every remembered shard without a home one, so that its
    /// entities start with no message; once the regions of the members up registered (or
    /// `rebalance-interval` after this coordinator started), so that they spread.
    pub(super) fn allocate_remembered(&mut self) {
        if self.unplaced.is_empty() || !self.regions_registered() {
            return;
        }
        let unplaced: Vec<String> = self.unplaced.iter().cloned().collect();
        for shard in unplaced {
            if self.homes.home(&shard).is_some() || self.moving.contains_key(&shard) {
                self.unplaced.remove(&shard);
                continue;
            }
            match self.allocate(&shard) {
                Some(to) => {
                    tracing::debug!(entity_type = %self.args.type_name, shard, to, "allocating a shard with remembered entities");
                    self.host(&shard, &to);
                }
                None => return,
            }
        }
    }

    /// Whether every member up and reachable that may host the type has a region that
    /// registered, or this coordinator has waited `rebalance-interval` for them.
    pub(super) fn regions_registered(&self) -> bool {
        self.started.elapsed() >= self.args.settings.rebalance_interval
            || self
                .members
                .values()
                .filter(|m| {
                    m.status == MemberStatus::Up
                        && m.reachable
                        && m.has_role(self.args.settings.role.as_deref())
                })
                .all(|m| self.regions.contains_key(&m.addr.to_string()))
    }
}
