//! Resize: a sharded daemon's number of workers. A resize stores the next revision as
//! stopping, hands off every shard known to be hosted and allocates nothing until all are
//! stopped (or their nodes gone), then stores the revision as running. A coordinator that
//! read a resize in progress finishes it the same way.

use super::*;

impl CoordinatorState {
    /// Whether a daemon's old workers are being stopped for a resize: nothing is allocated
    /// meanwhile.
    pub(super) fn resizing(&self) -> bool {
        self.daemon.is_some_and(|d| d.stopping)
    }

    /// A sharded daemon's resize to `count` workers (Akka's `ShardedDaemonProcess`
    /// resize): the next revision is stored as stopping, every shard of the type is handed
    /// off (its worker stops under its lease) and none is allocated, and once all are
    /// stopped the revision is stored as running and its workers start. `Ok(true)`: begun;
    /// `Ok(false)`: it runs `count` workers already; `Err` names the daemon and why.
    pub(super) fn resize(&mut self, count: usize) -> Result<bool, String> {
        let type_name = &self.args.type_name;
        let Some(current) = self.daemon else {
            return Err(format!(
                "`{type_name}` is not a sharded daemon's entity type"
            ));
        };
        let most = self.args.settings.number_of_shards;
        if count == 0 || count > most {
            return Err(format!(
                "daemon `{type_name}` cannot run {count} workers: it runs 1 to {most} (its number-of-shards)"
            ));
        }
        if !self.listed || !self.pins_read {
            return Err(format!(
                "the coordinator of `{type_name}` is still reading its state from the store: try again"
            ));
        }
        crate::remember::ids_of(&*self.args.lease.store).map_err(|e| {
            format!("daemon `{type_name}` cannot be resized to {count} workers: {e}")
        })?;
        if current.stopping {
            return Err(format!(
                "daemon `{type_name}` is being resized to {} workers: try again once its old workers stopped",
                current.count
            ));
        }
        if count == current.count {
            return Ok(false);
        }
        let next = DaemonCount {
            revision: current.revision + 1,
            count,
            stopping: true,
        };
        tracing::info!(entity_type = %type_name, from = current.count, to = count, revision = next.revision, "daemon resize: stopping every worker");
        self.placement
            .send(crate::placement::recount(Some(&current), &next));
        self.daemon = Some(next);
        self.stop_workers();
        Ok(true)
    }

    /// Hands off every shard of the daemon's type this coordinator knows to be hosted (by
    /// its home, or by a region's report); none is allocated until all are stopped.
    pub(super) fn stop_workers(&mut self) {
        let mut round: BTreeMap<String, String> = BTreeMap::new();
        let homes: Vec<(String, String)> = self
            .homes
            .homes()
            .map(|(s, r)| (s.to_string(), r.to_string()))
            .collect();
        for (shard, home) in homes {
            self.homes.remove_home(&shard);
            self.unconfirmed.remove(&shard);
            round.insert(shard, home);
        }
        for (region, entry) in &self.regions {
            for shard in &entry.reported {
                round.entry(shard.clone()).or_insert_with(|| region.clone());
            }
        }
        self.stop_shards(round.into_iter().collect());
        self.finish_resize();
    }

    /// Whether a daemon's worker on `region` counts as stopped without its hand-off: its
    /// member is down, or unreachable past `unreachable-reallocate-after` (its shard lease
    /// lapses with it), or this coordinator has not heard of it within
    /// `rebalance-interval` of its start (a holder in the listing that left before). A
    /// leaving member's region still hands its shards off.
    pub(super) fn worker_gone(&self, region: &str) -> bool {
        match self.members.get(region) {
            Some(m) => {
                matches!(m.status, MemberStatus::Down | MemberStatus::Removed)
                    || self.unreachable_since.get(region).is_some_and(|t| {
                        t.elapsed() >= self.args.settings.unreachable_reallocate_after
                    })
            }
            None => self.started.elapsed() >= self.args.settings.rebalance_interval,
        }
    }

    /// Hands off `shards` (shard, region) for a resize.
    pub(super) fn stop_shards(&mut self, shards: Vec<(String, String)>) {
        let round: Vec<(String, String)> = shards
            .into_iter()
            .filter(|(_, region)| !self.worker_gone(region))
            .collect();
        for (shard, region) in &round {
            self.stopping.insert(shard.clone(), region.clone());
        }
        if !round.is_empty() {
            self.move_shards(round);
        }
    }

    /// A coordinator that read a resize in progress (it failed over during one) stops
    /// the workers again, once it knows where they run.
    pub(super) fn resume_stopping(&mut self) {
        if self.listed && self.pins_read && self.resizing() && self.stopping.is_empty() {
            self.stop_workers();
        }
    }

    /// Hands off again the shards whose hand-off for a resize was not confirmed; those of
    /// regions that are gone count as stopped (their leases lapse with them).
    pub(super) fn retry_stopping(&mut self) {
        if self.stopping.is_empty() {
            return;
        }
        let again: Vec<(String, String)> = std::mem::take(&mut self.stopping).into_iter().collect();
        self.stop_shards(again);
        self.finish_resize();
    }

    /// Ends a resize once every old worker stopped (and no rebalance's move is in flight):
    /// the revision is stored as running, and its workers may start.
    pub(super) fn finish_resize(&mut self) {
        if !self.resizing() || !self.stopping.is_empty() || !self.moving.is_empty() {
            return;
        }
        let Some(before) = self.daemon else {
            return;
        };
        let running = DaemonCount {
            stopping: false,
            ..before
        };
        tracing::info!(entity_type = %self.args.type_name, count = running.count, revision = running.revision, "daemon resize: the old workers stopped; the new ones start");
        self.placement
            .send(crate::placement::recount(Some(&before), &running));
        self.daemon = Some(running);
        self.reallocate_lost();
    }
}
