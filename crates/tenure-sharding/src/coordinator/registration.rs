//! Registration: a region's full registration or its changes since the last one this
//! coordinator has, and what to make of each shard it reports (its home learnt, its `Host`
//! confirmed, or a copy running where it does not belong, which it is asked to hand off
//! until it no longer reports it).

use super::rebalance::hand_off_call;
use super::*;

impl CoordinatorState {
    /// A registration: full (the first to this coordinator, or asked for), or the changes
    /// since the registration this coordinator has of the region (else it asks for a full
    /// one). Its work is proportional to the shards it names.
    pub(super) fn on_register(&mut self, r: Registration) {
        let region = r.region;
        let (added, removed) = match r.base {
            None => {
                let hosted: BTreeSet<String> = r.added.into_iter().collect();
                let before = self
                    .regions
                    .get(&region)
                    .map(|e| e.reported.clone())
                    .unwrap_or_default();
                (
                    hosted.difference(&before).cloned().collect(),
                    before.difference(&hosted).cloned().collect(),
                )
            }
            Some(base) if self.regions.get(&region).is_some_and(|e| e.seq == base) => {
                (r.added, r.removed)
            }
            Some(base) => {
                tracing::debug!(entity_type = %self.args.type_name, region, base, "registration changes without their base: asking the region for all its shards");
                if let Some(rr) = region_ref(&self.args.scope, &self.args.type_name, &region) {
                    let _ = rr.cast(RegionMsg::RegisterAll(RegisterAgain {
                        coordinator: self.args.token,
                    }));
                }
                return;
            }
        };
        let first = !self.regions.contains_key(&region);
        let entry = self
            .regions
            .entry(region.clone())
            .or_insert_with(|| RegionEntry {
                available: r.available,
                reported: BTreeSet::new(),
                seq: r.seq,
            });
        entry.available = r.available;
        entry.seq = r.seq;
        if first {
            // A region new to this coordinator learns every home known so far, as if it
            // had been registered when each was allocated (see `host`); not those of
            // moving shards, which have none.
            let known: Vec<(String, String)> = self
                .homes
                .homes()
                .filter(|(_, home)| *home != region)
                .map(|(s, h)| (s.to_string(), h.to_string()))
                .collect();
            for (shard, home) in known {
                self.tell(&region, &shard, Told::Home(Some(home)));
            }
            // Answered even when no home is known yet: the answer is what tells the region
            // it registered (its readiness).
            self.answer(&region);
        }
        self.askers.remove(&region);
        self.holders.remove(&region);
        self.refresh(&region);
        for shard in removed {
            self.forget_report(&region, &shard);
        }
        for shard in added {
            self.take_report(&region, shard);
        }
        if r.base.is_none() {
            // Shards this region should host but does not (a lost Host, a restarted node).
            let missing: Vec<String> = self
                .homes
                .hosted_by(&region)
                .iter()
                .filter(|s| !self.regions[&region].reported.contains(*s))
                .cloned()
                .collect();
            for shard in missing {
                self.unconfirmed.entry(shard).or_insert(None);
            }
        }
        self.reallocate_lost();
    }

    /// `region` reports that it hosts (or acquires) `shard`.
    pub(super) fn take_report(&mut self, region: &str, shard: String) {
        if let Some(e) = self.regions.get_mut(region) {
            e.reported.insert(shard.clone());
        }
        self.judge_report(region, &shard);
    }

    /// What to make of `region` hosting `shard`: its home learnt (a new coordinator learns
    /// the allocation from the regions), its `Host` confirmed, or a copy to stop.
    pub(super) fn judge_report(&mut self, region: &str, shard: &str) {
        if self.moving.contains_key(shard) {
            return;
        }
        if self.resizing() {
            // No worker runs while a daemon's old workers stop.
            if !self.stopping.contains_key(shard) {
                self.stop_shards(vec![(shard.to_string(), region.to_string())]);
            }
            return;
        }
        match self.homes.home(shard) {
            None if self.alive(region) => {
                self.unplaced.remove(shard);
                self.homes.set_home(shard, region);
                self.misplaced
                    .remove(&(region.to_string(), shard.to_string()));
            }
            Some(home) if home == region => {
                self.unconfirmed.remove(shard);
                self.misplaced
                    .remove(&(region.to_string(), shard.to_string()));
            }
            // Hosted (or being acquired) where it no longer belongs: stop it there; its
            // lease then goes to the shard's home.
            _ => self.misplace(shard, region),
        }
    }

    /// `region` reports that it no longer hosts `shard`.
    pub(super) fn forget_report(&mut self, region: &str, shard: &str) {
        if let Some(e) = self.regions.get_mut(region) {
            e.reported.remove(shard);
        }
        self.misplaced
            .remove(&(region.to_string(), shard.to_string()));
        if self.homes.home(shard) == Some(region) {
            // Its home stopped it (its lease was lost, it failed): told to host it again.
            self.unconfirmed.entry(shard.to_string()).or_insert(None);
        }
    }

    /// Asks `region` to hand off `shard`, which it runs where the shard does not belong
    /// (once it is reachable), and again every three `retry-interval`s while it reports it.
    pub(super) fn misplace(&mut self, shard: &str, region: &str) {
        let key = (region.to_string(), shard.to_string());
        if self.unreachable_since.contains_key(region) {
            // Asked once it is reachable again (see `retry_misplaced`).
            self.misplaced.entry(key).or_insert_with(Instant::now);
            return;
        }
        tracing::info!(entity_type = %self.args.type_name, shard, region, "telling a region to stop a shard allocated elsewhere");
        self.misplaced.insert(key, Instant::now());
        self.stop_misplaced(shard, region);
    }

    pub(super) fn retry_misplaced(&mut self) {
        let again = self.args.settings.retry_interval * 3;
        let due: Vec<(String, String)> = self
            .misplaced
            .iter()
            .filter(|((region, _), at)| {
                at.elapsed() >= again && !self.unreachable_since.contains_key(region)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for (region, shard) in due {
            let reported = self
                .regions
                .get(&region)
                .is_some_and(|r| r.reported.contains(&shard));
            if reported {
                self.judge_report(&region, &shard);
            } else {
                self.misplaced.remove(&(region, shard));
            }
        }
    }

    /// Asks `region` to hand off `shard`, a copy it runs where the shard does not belong.
    pub(super) fn stop_misplaced(&self, shard: &str, region: &str) {
        let (scope, type_name) = (self.args.scope.clone(), self.args.type_name.clone());
        let (shard, region) = (shard.to_string(), region.to_string());
        let timeout = self.args.settings.hand_off_timeout;
        let token = self.args.token;
        tokio::spawn(async move {
            hand_off_call(&scope, &type_name, &shard, &region, token, timeout).await;
        });
    }
}
