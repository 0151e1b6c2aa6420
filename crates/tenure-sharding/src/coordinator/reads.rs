//! Reads at start: the shard leases listed (each held shard's home is its holder's
//! region), the ids remembered with the coordinator's lease (its pins, a daemon's count),
//! and with remember-entities the shards that have remembered entities. Each read reports
//! to the coordinator as a message; until the listing arrives (or failed three times),
//! nothing is allocated and home requests wait.

use super::*;

impl CoordinatorState {
    /// The shard leases listed and the pins read: each held shard's home is its holder's
    /// region.
    pub(super) fn on_listed(&mut self, result: Result<Listing, tenure_lease::LeaseError>) {
        if self.listed {
            return;
        }
        match result {
            Ok(Listing { held, remembered }) => {
                self.pins_read(&remembered);
                tracing::info!(entity_type = %self.args.type_name, held = held.len(), "allocation rebuilt from the shard leases");
                for (shard, holder) in held {
                    if !self.regions.contains_key(&holder) {
                        self.holders.insert(holder.clone());
                    }
                    // Confirmed once its holder reports it (a holder that restarted may
                    // not run it any more).
                    let reported = self
                        .regions
                        .get(&holder)
                        .is_some_and(|r| r.reported.contains(&shard));
                    if !reported {
                        self.unconfirmed.insert(shard.clone(), None);
                    }
                    self.unplaced.remove(&shard);
                    self.homes.set_home(&shard, &holder);
                }
            }
            Err(e) if self.list_attempts < 3 => {
                tracing::warn!(entity_type = %self.args.type_name, error = %e, "cannot list the shard leases; retrying");
                self.list_attempts += 1;
                list_shard_leases(&self.args, &self.myself, self.args.settings.retry_interval);
                return;
            }
            Err(e) => {
                tracing::warn!(entity_type = %self.args.type_name, error = %e, "cannot list the shard leases; allocating from the regions' reports alone");
                read_pins(&self.args, &self.myself);
            }
        }
        self.listed = true;
        self.resume_stopping();
        for (shard, region) in std::mem::take(&mut self.deferred) {
            self.get_home(shard, region);
        }
        self.reallocate_lost();
    }
}

/// Where the ids remembered with the coordinator's lease (its pins) are read and written.
pub(super) fn pins_at(args: &CoordinatorArgs) -> RememberStore {
    RememberStore {
        store: args.lease.store.clone(),
        name: args.lease.name.clone(),
        owner: args.lease.owner.clone(),
        timeout: args.list_timeout,
        retry: args.settings.retry_interval,
    }
}

/// Lists the type's shard leases after `delay`, and reads the ids remembered with the
/// coordinator's lease, and reports shard → holder and those ids
/// (`CoordinatorLocal::Listed`). A name the store changed (its naming rules) is skipped: its
/// shard is learnt from its region's report instead. A store that keeps no remembered ids
/// has no pins.
pub(super) fn list_shard_leases(
    args: &CoordinatorArgs,
    me: &ActorRef<CoordinatorMsg>,
    delay: std::time::Duration,
) {
    let prefix = tenure_lease::names::shard_lease(&args.system, &args.type_name, "");
    let (store, timeout, me) = (args.store.clone(), args.list_timeout, me.clone());
    let (system, type_name) = (args.system.clone(), args.type_name.clone());
    let pins = pins_at(args);
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let rules = store.name_rules();
        let listed = async {
            let records =
                tenure_lease::store::bounded(&prefix, "list", timeout, store.list(&prefix)).await?;
            let held = records
                .into_iter()
                .filter_map(|r| {
                    let shard = r.name.strip_prefix(&prefix)?;
                    let name = tenure_lease::names::shard_lease(&system, &type_name, shard);
                    (tenure_lease::names::store_name(&name, &rules) == r.name)
                        .then(|| (shard.to_string(), r.owner))
                })
                .collect();
            let remembered = read_pin_ids(&pins).await?;
            Ok::<_, tenure_lease::LeaseError>(Listing { held, remembered })
        };
        let _ = me.cast(CoordinatorMsg::Local(CoordinatorLocal::Listed(
            listed.await,
        )));
    });
}

/// The ids remembered with the coordinator's lease (none on a store that keeps none).
pub(super) async fn read_pin_ids(
    at: &RememberStore,
) -> Result<Vec<String>, tenure_lease::LeaseError> {
    match at.remembered().await {
        Err(tenure_lease::LeaseError::Config(e)) => {
            tracing::warn!(lease = %at.name, error = %e, "no pins: the store keeps no remembered ids");
            Ok(Vec::new())
        }
        read => read,
    }
}

/// Reads the ids remembered with the coordinator's lease, every `retry-interval` until the
/// store answers or the coordinator stopped, and reports them (`CoordinatorLocal::PinsRead`):
/// for a coordinator that allocates without the listing, which read them too.
pub(super) fn read_pins(args: &CoordinatorArgs, me: &ActorRef<CoordinatorMsg>) {
    let (pins, me, type_name) = (pins_at(args), me.clone(), args.type_name.clone());
    tokio::spawn(async move {
        loop {
            match read_pin_ids(&pins).await {
                Ok(ids) => {
                    let _ = me.cast(CoordinatorMsg::Local(CoordinatorLocal::PinsRead(ids)));
                    return;
                }
                Err(e) => {
                    if matches!(
                        me.get_status(),
                        ractor::ActorStatus::Stopping | ractor::ActorStatus::Stopped
                    ) {
                        return;
                    }
                    tracing::warn!(entity_type = %type_name, error = %e, "cannot read the pins; retrying");
                    tokio::time::sleep(pins.retry).await;
                }
            }
        }
    });
}

/// remember-entities: reads the ids remembered with every shard lease of the type and
/// reports the shards that have some (`CoordinatorLocal::RememberedShards`), trying a shard
/// again every `retry-interval` while the store fails.
pub(super) fn read_remembered_shards(args: &CoordinatorArgs, me: &ActorRef<CoordinatorMsg>) {
    use futures::stream;

    let (store, timeout, me) = (args.store.clone(), args.list_timeout, me.clone());
    let retry = args.settings.retry_interval;
    let rules = store.name_rules();
    let names: Vec<(String, String)> = (0..args.settings.number_of_shards)
        .map(|i| {
            let shard = i.to_string();
            let lease = tenure_lease::names::shard_lease(&args.system, &args.type_name, &shard);
            (shard, tenure_lease::names::store_name(&lease, &rules))
        })
        .collect();
    let type_name = args.type_name.clone();
    tokio::spawn(async move {
        let read = |(shard, name): (String, String)| {
            let (store, type_name, me) = (store.clone(), type_name.clone(), me.clone());
            async move {
                loop {
                    let read = match crate::remember::ids_of(&*store) {
                        Ok(ids) => {
                            let call = ids.remembered(&name);
                            tenure_lease::store::bounded(
                                &name,
                                "read remembered ids",
                                timeout,
                                call,
                            )
                            .await
                        }
                        Err(e) => Err(e),
                    };
                    match read {
                        Ok(ids) => return (!ids.is_empty()).then_some(shard),
                        Err(e @ tenure_lease::LeaseError::Config(_)) => {
                            tracing::error!(entity_type = %type_name, error = %e, "remember-entities needs a store that keeps remembered ids");
                            return None;
                        }
                        Err(e) => {
                            if matches!(
                                me.get_status(),
                                ractor::ActorStatus::Stopping | ractor::ActorStatus::Stopped
                            ) {
                                return None;
                            }
                            tracing::warn!(entity_type = %type_name, shard, error = %e, "cannot read the remembered entities of a shard; retrying");
                            tokio::time::sleep(retry).await;
                        }
                    }
                }
            }
        };
        let shards: Vec<String> = stream::iter(names)
            .map(read)
            .buffer_unordered(16)
            .filter_map(|s| async move { s })
            .collect()
            .await;
        let _ = me.cast(CoordinatorMsg::Local(CoordinatorLocal::RememberedShards(
            shards,
        )));
    });
}
