//! The shard's entities: delivering messages, starting entities on demand under the
//! grant, remembered ids, restarts, and passivation.

use super::*;

impl ShardState {
    /// The grant entities may run under now: serving, and still believed (the local
    /// deadline has not passed, even if its Lost event is still on its way).
    pub(super) fn live_token(&self) -> Option<FencingToken> {
        self.serving
            .filter(|t| self.view.token() == Some(*t) && self.refused != Some(*t))
    }

    /// The id of the entity actor `actor` runs, if it is one of the shard's.
    pub(super) fn entity_run_by(&self, actor: ractor::ActorId) -> Option<String> {
        self.entities
            .iter()
            .find(|(_, r)| r.actor.get_id() == actor)
            .map(|(id, _)| id.clone())
    }

    /// A journal refused a write of the entity run by `actor` under grant `token` as not
    /// current: the store's word that the grant is gone (released, expired, or granted to
    /// another holder while this node paused or was cut off). The LeaseActor ends its belief at
    /// once, and its `LeaseLost` stops every entity and starts acquiring again; until it
    /// arrives, messages wait as for the lease, so that no entity starts again only to be
    /// refused, message after message, until the next renewal would have told.
    pub(super) fn not_current(&mut self, actor: ractor::ActorId, token: FencingToken) {
        if self.serving != Some(token) || self.refused == Some(token) {
            return;
        }
        let Some(entity) = self.entity_run_by(actor) else {
            return;
        };
        tracing::warn!(shard = %self.args.shard_id, entity, token = token.get(),
            "the journal refused the shard's grant as not current: giving the grant up now");
        self.refused = Some(token);
        let _ = self.lease.cast(LeaseMsg::NotCurrent(token));
    }

    pub(super) fn deliver(&mut self, p: Pending) {
        if self.handing_off {
            // Kept for the shard's next home: the hand-off gives it back to the region.
            self.waiting.push_back(p);
            return;
        }
        let Some(token) = self.live_token() else {
            self.wait(p);
            return;
        };
        if self.remember.as_ref().is_some_and(|r| !r.recalled) {
            // The remembered entities start first.
            self.wait(p);
            return;
        }
        // Every node must map an id to the same shard (`number-of-shards`), or one entity
        // would run under two shard leases at once: never start one in another's shard.
        let home = shard_of(&p.entity, self.args.settings.number_of_shards);
        if home != self.args.shard_id {
            AskReply::fail(
                p.reply,
                format!(
                    "entity {} of `{}` belongs to shard {home} here (number-of-shards {}), not shard {}: \
                     the sender's sharding.number-of-shards differs",
                    p.entity,
                    self.args.type_name,
                    self.args.settings.number_of_shards,
                    self.args.shard_id
                ),
            );
            return;
        }
        if let Some(r) = self.entities.get_mut(&p.entity) {
            if r.passivating || r.starting {
                self.wait(p);
                return;
            }
            r.last = Instant::now();
            if let Some(active) = &self.args.active {
                active.used(&self.myself, &self.args.shard_id, &p.entity);
            }
            let _ = r.actor.cast(EntityMsg {
                payload: p.payload.into(),
                reply: p.reply,
            });
            return;
        }
        if let Some(r) = &mut self.remember {
            if r.adding.contains(&p.entity) {
                self.wait(p);
                return;
            }
            if r.must_add(&p.entity) {
                if p.entity.contains('\0') {
                    AskReply::fail(
                        p.reply,
                        format!(
                            "entity {:?} cannot be remembered (remember-entities): its id contains a NUL character",
                            p.entity
                        ),
                    );
                    return;
                }
                // Remembered before it starts: the message waits for the write.
                r.add(&p.entity);
                self.wait(p);
                return;
            }
        }
        match self.start_entity(&p.entity, token) {
            Ok(()) => self.wait(p),
            Err(e) => AskReply::fail(
                p.reply,
                format!("entity {} could not be started: {e}", p.entity),
            ),
        }
    }

    /// Spawns entity `entity` under grant `token` (its messages wait until its `start`
    /// finished: [`ShardMsg::EntityStarted`]).
    pub(super) fn start_entity(
        &mut self,
        entity: &str,
        token: FencingToken,
    ) -> Result<(), ractor::SpawnErr> {
        let ctx = EntityContext {
            type_name: self.args.type_name.clone(),
            entity_id: entity.to_string(),
            shard_id: self.args.shard_id.clone(),
            token,
            node: self.args.node.clone(),
            lease: self.args.lease.store_name.clone(),
            owner: self.args.lease.owner.clone(),
            shard: self.myself.clone(),
        };
        match (self.args.factory)(ctx, self.myself.get_cell()) {
            Ok(starting) => {
                // Its life begins now: its `start` may already act under the token.
                self.record_entity(history::entity_started, entity, token, "");
                self.watch.watch(
                    starting.actor.get_cell(),
                    token,
                    stopping::entity_name(&self.args, entity),
                );
                if let Some(active) = &self.args.active {
                    active.used(&self.myself, &self.args.shard_id, entity);
                }
                let (shard, id) = (self.myself.clone(), starting.actor.get_id());
                let name = entity.to_string();
                tokio::spawn(async move {
                    let result = tenure_singleton::start_outcome(starting.started).await;
                    let _ = shard.cast(ShardMsg::EntityStarted {
                        entity: name,
                        actor: id,
                        result,
                    });
                });
                self.entities.insert(
                    entity.to_string(),
                    Running {
                        actor: starting.actor,
                        token,
                        last: Instant::now(),
                        passivating: false,
                        asked: false,
                        starting: true,
                        outlived: false,
                    },
                );
                Ok(())
            }
            Err(e) => {
                tracing::warn!(shard = %self.args.shard_id, entity, error = %e, "entity could not be started");
                self.restart_later(entity);
                Err(e)
            }
        }
    }

    /// The ids remembered with the lease were read under grant `token`: starts their
    /// entities, then delivers what waited.
    pub(super) fn recalled(&mut self, token: FencingToken, ids: Vec<String>) {
        if self.live_token() != Some(token) || self.handing_off {
            return;
        }
        let Some(r) = &mut self.remember else {
            return;
        };
        if r.recalled {
            return;
        }
        r.recalled = true;
        r.known.extend(ids.iter().cloned());
        let (shard, shards) = (
            self.args.shard_id.clone(),
            self.args.settings.number_of_shards,
        );
        tracing::debug!(
            shard,
            entities = ids.len(),
            "starting the remembered entities"
        );
        for id in ids {
            if shard_of(&id, shards) != shard {
                tracing::warn!(shard, entity = %id, shards,
                    "a remembered entity belongs to another shard (was number-of-shards changed?): not started");
                continue;
            }
            if !self.entities.contains_key(&id) {
                let _ = self.start_entity(&id, token);
            }
        }
        self.flush();
    }

    /// A write of remembered ids under grant `token` ended.
    pub(super) fn remembered(
        &mut self,
        token: FencingToken,
        change: &RememberChange,
        written: bool,
    ) {
        if self.serving != Some(token) {
            return;
        }
        let ready = match &mut self.remember {
            Some(r) => r.written(change, written),
            None => return,
        };
        for id in ready {
            // Its messages wait in `waiting` until it has started.
            if let Some(token) = self.live_token().filter(|_| !self.handing_off)
                && !self.entities.contains_key(&id)
            {
                let _ = self.start_entity(&id, token);
            }
        }
    }

    /// Starts remembered entity `entity` again after `entity-restart-backoff`.
    pub(super) fn restart_later(&self, entity: &str) {
        if self.remember.is_none() || self.serving.is_none() {
            return;
        }
        let entity = entity.to_string();
        let backoff = self.args.settings.entity_restart_backoff;
        self.myself
            .send_after(backoff, move || ShardMsg::Restart(entity));
    }

    /// `entity` waited its restart backoff: starts it if it is still remembered and not
    /// running.
    pub(super) fn restart(&mut self, entity: &str) {
        let Some(token) = self.live_token().filter(|_| !self.handing_off) else {
            return;
        };
        let remembered = self
            .remember
            .as_ref()
            .is_some_and(|r| r.recalled && r.known.contains(entity) && !r.must_add(entity));
        if remembered && !self.entities.contains_key(entity) {
            tracing::debug!(shard = %self.args.shard_id, entity, "starting a remembered entity again after its backoff");
            let _ = self.start_entity(entity, token);
        }
    }

    /// Waits until the remembered ids' writes sent so far ended (bounded).
    pub(super) async fn flush_remembered(&mut self) {
        if let Some(r) = &self.remember {
            let limit = self.args.lease.settings.lease_operation_timeout * 2;
            r.flush(limit).await;
        }
    }

    /// The `start` of entity `entity` (actor `actor`) ended.
    pub(super) fn entity_started(
        &mut self,
        entity: &str,
        actor: ractor::ActorId,
        result: Result<(), tenure_singleton::StartError>,
    ) {
        let Some(r) = self
            .entities
            .get_mut(entity)
            .filter(|r| r.starting && r.actor.get_id() == actor)
        else {
            // Stopped meanwhile (its end is already recorded).
            return;
        };
        r.starting = false;
        let actor = r.actor.clone();
        let (mine, others): (VecDeque<Pending>, VecDeque<Pending>) =
            std::mem::take(&mut self.waiting)
                .into_iter()
                .partition(|p| p.entity == entity);
        self.waiting = others;
        match result {
            Ok(()) => {
                for p in mine {
                    self.deliver(p);
                }
                // Everything kept for it is in its mailbox: newer messages of this node
                // may go there directly, once none is left on the routed path.
                if let (Some(routes), Some(token)) = (&self.routes, self.live_token())
                    && !self.handing_off
                    && self.entities.get(entity).is_some_and(|r| {
                        !r.passivating && !r.starting && r.actor.get_id() == actor.get_id()
                    })
                {
                    routes.open(entity, actor, self.view.clone(), token);
                }
            }
            Err(e) => {
                tracing::warn!(shard = %self.args.shard_id, entity, error = %e, "entity could not be started");
                if let Some(r) = self.entities.remove(entity) {
                    self.watch.forget(r.actor.get_id());
                    self.inactive(entity);
                    self.record_entity(
                        history::entity_stopped,
                        entity,
                        r.token,
                        &format!("start failed: {e}"),
                    );
                }
                self.restart_later(entity);
                for p in mine {
                    AskReply::fail(
                        p.reply,
                        format!("entity {entity} could not be started: {e}"),
                    );
                }
            }
        }
    }

    pub(super) fn wait(&mut self, p: Pending) {
        // Asks whose callers stopped waiting give their places back first.
        self.waiting
            .retain(|w| !ask_expired(w.reply.as_ref(), w.since));
        let capacity = self.args.settings.buffer_size;
        if self.waiting.len() >= capacity {
            let args = &self.args;
            refuse_buffer_full(
                &args.type_name,
                &args.shard_id,
                &p.entity,
                capacity,
                p.reply,
            );
        } else {
            self.waiting.push_back(p);
        }
    }

    /// Delivers what waited for the lease.
    pub(super) fn flush(&mut self) {
        let waiting = std::mem::take(&mut self.waiting);
        for p in waiting {
            if ask_expired(p.reply.as_ref(), p.since) {
                tracing::debug!(shard = %self.args.shard_id, entity = %p.entity, "expired ask dropped: its caller stopped waiting");
                continue;
            }
            self.deliver(p);
        }
    }

    /// `entity` is the least recently used of its region, past the active-entity limit: it
    /// is passivated, unless a message went to it directly since (then it is used now, and
    /// the next least recently used goes instead).
    pub(super) fn evict(&mut self, entity: &str) {
        // As the idle check: a direct message counts as use (and the flag is taken here).
        let used = self.routes.as_ref().is_some_and(|r| r.take_used(entity));
        match (self.entities.get_mut(entity), &self.args.active) {
            (Some(r), Some(active)) if used && !r.passivating => {
                r.last = Instant::now();
                active.used(&self.myself, &self.args.shard_id, entity);
            }
            _ => self.passivate(entity, false),
        }
    }

    /// `entity` no longer runs: it leaves the region's active entities.
    pub(super) fn inactive(&self, entity: &str) {
        if let Some(active) = &self.args.active {
            active.stopped(&self.args.shard_id, entity);
        }
    }

    /// Stops `entity` after the messages in its mailbox; `asked`: the entity asked (with
    /// remember-entities it is then forgotten once stopped).
    pub(super) fn passivate(&mut self, entity: &str, asked: bool) {
        if let Some(r) = self.entities.get_mut(entity)
            && !r.passivating
        {
            r.passivating = true;
            r.asked = asked;
            if let Some(routes) = &self.routes {
                routes.close(entity, None);
            }
            // After the messages already in its mailbox (Akka sends its stop message the
            // same way): they reached the entity before it asked, so they are handled.
            // Messages arriving from now on wait for the entity started again.
            if r.actor.drain().is_err() {
                r.actor.stop(Some("passivated".into()));
            }
        }
    }
}
