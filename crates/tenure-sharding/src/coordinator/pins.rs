//! Pins: an operator's placement of a shard on a region. A pinned shard moves there
//! through the hand-off, is allocated there whenever it needs a home, and no rebalance
//! moves it away; while that region cannot take it the strategy places it. Pins (and a
//! daemon's count) are read from and stored with the coordinator's lease: a pin is refused
//! (`Err`, naming the shard and why) until they were read, and `Ok` is answered only once
//! the change is stored, so that the next coordinator keeps it.

use super::*;

impl CoordinatorState {
    /// The ids remembered with this coordinator's lease, read from the store: its pins,
    /// and a daemon's count.
    pub(super) fn pins_read(&mut self, ids: &[String]) {
        if self.pins_read {
            return;
        }
        self.pins_read = true;
        self.pinned = crate::placement::pins_of(ids);
        if let Some(daemon) = &mut self.daemon
            && let Some(stored) = crate::placement::count_of(ids)
        {
            tracing::info!(entity_type = %self.args.type_name, revision = stored.revision, count = stored.count, stopping = stored.stopping, "daemon count read from the store");
            *daemon = stored;
        }
        tracing::info!(entity_type = %self.args.type_name, pins = self.pinned.len(), "pins read from the store");
    }

    /// Whether pins may change now; `Err` says why not.
    pub(super) fn check_pins(&self, shard: &str) -> Result<(), String> {
        let type_name = &self.args.type_name;
        if !self.pins_read {
            return Err(format!(
                "the coordinator of `{type_name}` has not read the pins from the store yet: try again"
            ));
        }
        crate::remember::ids_of(&*self.args.lease.store)
            .map(|_| ())
            .map_err(|e| format!("shard {shard} of `{type_name}` cannot be pinned: {e}"))
    }

    /// Removes the pin of `shard`, in the store too (see [`pin`](Self::pin)): `Ok(false)`.
    pub(super) fn unpin(&mut self, shard: &str) -> Result<bool, String> {
        self.check_pins(shard)?;
        if let Some(from) = self.pinned.remove(shard) {
            self.placement
                .send(crate::placement::repin(shard, Some(&from), None));
        }
        tracing::info!(entity_type = %self.args.type_name, shard, "shard unpinned");
        Ok(false)
    }

    /// Pins `shard` to the region of `to` and moves it there (see the module's docs).
    /// `Ok(true)` when a move or a first allocation began, `Ok(false)` when it lives there
    /// already; `Err` names what is wrong (nothing is pinned then).
    pub(super) fn pin(&mut self, shard: &str, to: &str) -> Result<bool, String> {
        let type_name = &self.args.type_name;
        let shards = self.args.settings.number_of_shards;
        if !shard.parse::<usize>().is_ok_and(|n| n < shards) {
            return Err(format!(
                "`{shard}` is not a shard of `{type_name}` (its shards are 0 to {})",
                shards.saturating_sub(1)
            ));
        }
        if !self.listed {
            return Err(format!(
                "the coordinator of `{type_name}` is still rebuilding its allocation: try again"
            ));
        }
        self.check_pins(shard)?;
        if !self.homes.is_allocatable(to) {
            let why = if !self.regions.contains_key(to) {
                "has no region of this type registered with the coordinator"
            } else if !self.alive(to) || self.unreachable_since.contains_key(to) {
                "is not up and reachable, or its region takes no shards"
            } else {
                "runs an older application version than the newest present"
            };
            let can: Vec<&str> = self.homes.iter().map(|(r, _)| r).collect();
            return Err(format!(
                "cannot pin shard {shard} of `{type_name}` to {to}: it {why} (nodes that can take shards: {})",
                can.join(", ")
            ));
        }
        if let Some(m) = self.moving.get(shard) {
            return Err(format!(
                "shard {shard} of `{type_name}` is moving from {} to {}: try again once it arrived",
                m.from, m.to
            ));
        }
        let before = self.pinned.insert(shard.to_string(), to.to_string());
        if before.as_deref() != Some(to) {
            self.placement
                .send(crate::placement::repin(shard, before.as_deref(), Some(to)));
        }
        tracing::info!(entity_type = %type_name, shard, to, "shard pinned");
        match self.homes.home(shard).map(str::to_string) {
            Some(home) if home == to => Ok(false),
            Some(from) => {
                self.begin_moves(vec![(shard.to_string(), from, to.to_string())]);
                Ok(true)
            }
            None => {
                self.host(shard, to);
                Ok(true)
            }
        }
    }

    /// Answers `result` through `reply` once every change of the pins or the daemon's
    /// count made so far is stored (an `Err` at once); `what` names the change in the
    /// error when it could not be stored. An operator told `Ok` can rely on the next
    /// coordinator keeping it.
    pub(super) fn answer_once_stored(
        &self,
        result: Result<bool, String>,
        what: String,
        reply: impl FnOnce(Result<bool, String>) + Send + 'static,
    ) {
        let Ok(changed) = result else {
            reply(result);
            return;
        };
        let stored = self.placement.flush();
        let (type_name, lease) = (self.args.type_name.clone(), self.args.lease.name.clone());
        tokio::spawn(async move {
            reply(if stored.await {
                Ok(changed)
            } else {
                Err(format!(
                    "{what} of `{type_name}` was not stored with the coordinator's lease `{lease}` (its grant is not current any more, or the store keeps no remembered ids): ask again"
                ))
            });
        });
    }
}
