//! Routing: a message to its shard here, to the region hosting it elsewhere, or kept until
//! the coordinator names its home.

use super::*;

impl RegionState {
    /// Routes a message that just arrived (from a local sender, or from another region).
    pub(super) async fn route(&mut self, p: Pending) {
        if p.env.hops > MAX_HOPS {
            tracing::warn!(entity_type = %self.args.type_name, shard = %p.env.shard, entity = %p.env.entity,
                "message dropped: it went through too many regions while the shard moved");
            AskReply::fail(p.reply, format!("shard {}: no stable home", p.env.shard));
            return;
        }
        if p.env.hops > 0 && !self.shards.contains_key(&p.env.shard) {
            // Sent here by a region that believes this node hosts the shard, but it does
            // not: this region's own belief may be just as stale, so it learns the home
            // from the coordinator before passing the message on (two stale beliefs would
            // bounce it back and forth).
            self.forget_home(&p.env.shard);
        }
        self.dispatch(p).await;
    }

    /// Sends `p` to its shard: the local one, or the region of its home as this region
    /// knows it; keeps it (asking the coordinator) while the home is unknown.
    pub(super) async fn dispatch(&mut self, p: Pending) {
        if let Some(shard) = self.shards.get(&p.env.shard) {
            let mut p = p;
            // No ticket: from another node, or given back by a shard of this one. Straight
            // into its entity's mailbox when this node's direct route to it is open (see
            // [`crate::Routes`]: never ahead of a message still on the routed path,
            // whichever node sent it). One whose sender maps the entity to another shard
            // goes to the shard, which refuses it.
            if p.ticket.is_none()
                && crate::entity::shard_of(&p.env.entity, self.args.settings.number_of_shards)
                    == p.env.shard
            {
                let msg = EntityMsg {
                    payload: std::mem::take(&mut p.env.payload).into(),
                    reply: p.reply.take(),
                };
                match self.args.routes.send(&p.env.entity, msg) {
                    Ok(()) => return,
                    Err((msg, ticket)) => {
                        p.env.payload = msg.payload.into_vec();
                        p.reply = msg.reply;
                        p.ticket = Some(ticket);
                    }
                }
            }
            let _ = shard.cast(ShardMsg::Routed(p));
            return;
        }
        let region = match self.homes.get(&p.env.shard) {
            // Ours but not running (stopped meanwhile): find out again.
            Some(home) if *home == self.args.me => None,
            Some(home) => region_of(&mut self.regions, &self.args, home),
            None => return self.wait(p).await,
        };
        let Some(region) = region else {
            self.forget_home(&p.env.shard);
            return self.wait(p).await;
        };
        let p = self.relay(p);
        let shard = p.env.shard.clone();
        match forward(region.clone(), p) {
            Ok(()) => {
                self.forwarded += 1;
                // The shard's next messages from this node's handles may go there directly
                // (see [`crate::Routes`]), except while this node leaves or is down: then
                // all of them pass here, counted by the leave.
                if !self.leaving
                    && !self.down
                    && let Some(home) = self.homes.get(&shard)
                {
                    self.args.routes.open_remote(&shard, home, &region);
                }
            }
            Err(p) => {
                if let Some(home) = self.forget_home(&p.env.shard) {
                    self.forget_region(&home);
                }
                self.wait(p).await;
            }
        }
    }

    /// Forgets the region of node `node` (gone, replaced, or refusing a forward): the next
    /// forward there looks it up again, and no handle sends to it directly meanwhile.
    pub(super) fn forget_region(&mut self, node: &str) {
        self.regions.remove(node);
        self.args.routes.close_remote_node(Some(node));
    }

    /// Forgets where `shard` lives (its messages wait here until the coordinator names a
    /// home), closing its remote route; the home it had, if any.
    pub(super) fn forget_home(&mut self, shard: &str) -> Option<String> {
        self.args.routes.close_remote(shard);
        self.homes.remove(shard)
    }

    /// An ask of another node (it passed through a region) about to go to a third one: its
    /// answer will pass through this node, so the region counts it until it has passed (a
    /// leaving node waits for it).
    pub(super) fn relay(&mut self, mut p: Pending) -> Pending {
        if p.env.hops == 0 {
            return p;
        }
        let Some(port) = p.reply.take() else {
            return p;
        };
        let timeout = port.get_timeout();
        let (tx, rx) = ractor::concurrency::oneshot();
        p.reply = Some(match timeout {
            Some(t) => (tx, t).into(),
            None => tx.into(),
        });
        self.relays += 1;
        let region = self.myself.clone();
        tokio::spawn(async move {
            let answer = match timeout {
                Some(t) => tokio::time::timeout(t, rx).await.ok().and_then(Result::ok),
                None => rx.await.ok(),
            };
            if let Some(answer) = answer {
                let _ = port.send(answer);
            }
            let _ = region.cast(RegionMsg::Local(RegionLocal::Relayed));
        });
        p
    }

    /// Routes tells that travel together (see [`RegionLocal::RouteAll`]): those for shards
    /// of another node go there in one message, the others as [`route`](Self::route) sends
    /// them.
    pub(super) async fn route_all(&mut self, ps: Vec<Pending>) {
        let mut out: BTreeMap<String, Vec<Pending>> = BTreeMap::new();
        for p in ps {
            let shard = &p.env.shard;
            if p.reply.is_some() || p.env.hops > MAX_HOPS || self.shards.contains_key(shard) {
                self.route(p).await;
                continue;
            }
            if p.env.hops > 0 {
                // As in `route`: its sender believed the shard lives here.
                self.forget_home(shard);
            }
            match self.homes.get(shard) {
                Some(home) if *home != self.args.me => out.entry(home.clone()).or_default().push(p),
                _ => self.dispatch(p).await,
            }
        }
        for (home, ps) in out {
            let Some(region) = region_of(&mut self.regions, &self.args, &home) else {
                for p in ps {
                    self.forget_home(&p.env.shard);
                    self.wait(p).await;
                }
                continue;
            };
            match forward_all(region, ps) {
                Ok(n) => self.forwarded += n,
                Err(ps) => {
                    self.forget_region(&home);
                    for p in ps {
                        self.forget_home(&p.env.shard);
                        self.wait(p).await;
                    }
                }
            }
        }
    }

    /// Keeps a message until its shard's home is known, asking the coordinator; refuses it
    /// when the shard's buffer is full.
    pub(super) async fn wait(&mut self, p: Pending) {
        let capacity = self.args.settings.buffer_size;
        if self.pending.get(&p.env.shard).map_or(0, VecDeque::len) >= capacity {
            let Pending { env, reply, .. } = p;
            if refuse_buffer_full(
                &self.args.type_name,
                &env.shard,
                &env.entity,
                capacity,
                reply,
            ) {
                self.dropped_tells += 1;
            }
            return;
        }
        let shard = p.env.shard.clone();
        self.pending
            .entry(shard.clone())
            .or_default()
            .push_back(Waiting {
                p,
                since: Instant::now(),
            });
        self.pending_count += 1;
        self.ask_home(&shard).await;
    }

    pub(super) async fn ask_home(&mut self, shard: &str) {
        if self
            .asked
            .get(shard)
            .is_some_and(|t| t.elapsed() < self.args.settings.retry_interval)
        {
            return;
        }
        if let Some(c) = self.args.coordinator.instance().await {
            let _ = c.cast(CoordinatorMsg::GetHome(GetShardHome {
                shard: shard.to_string(),
                region: self.args.me.clone(),
            }));
            self.asked.insert(shard.to_string(), Instant::now());
        }
    }

    /// The coordinator said where `shard` lives (`Host` means here).
    pub(super) async fn settle(&mut self, shard: &str, home: Option<String>) {
        self.asked.remove(shard);
        let Some(home) = home else {
            return;
        };
        // A home this node no longer counts as a member (the coordinator has not seen it
        // go yet): its messages keep waiting here, and the home is asked again next tick.
        let member = home == self.args.me
            || (!self.vacated.contains(&home)
                && self
                    .members
                    .get(&home)
                    .is_some_and(|m| matches!(m.status, MemberStatus::Up | MemberStatus::Leaving)));
        if !member {
            tracing::debug!(entity_type = %self.args.type_name, shard, home, "the coordinator named a home that is not a member here; asking again");
            return;
        }
        if home == self.args.me && !self.start_shard(shard).await {
            return;
        }
        self.orphans.remove(shard);
        // A route to a former home closes; one to this home opens at the next forward.
        self.args.routes.close_remote(shard);
        self.homes.insert(shard.to_string(), home);
        if let Some(waiting) = self.pending.remove(shard) {
            self.pending_count -= waiting.len();
            // Straight to the home just learned: these already passed the check of route.
            for w in waiting {
                self.dispatch(w.p).await;
            }
        }
    }

    /// Messages a local shard gave back on hand-off: they go to the shard's next home
    /// ahead of those that arrived since (kept even beyond `buffer-size`: they were
    /// accepted already).
    pub(super) async fn take_back(&mut self, shard: &str, undelivered: Vec<Pending>) {
        if undelivered.is_empty() {
            return;
        }
        self.pending_count += undelivered.len();
        let queue = self.pending.entry(shard.to_string()).or_default();
        let since = Instant::now();
        for p in undelivered.into_iter().rev() {
            queue.push_front(Waiting { p, since });
        }
        if self.homes.contains_key(shard) || self.shards.contains_key(shard) {
            // The home is known again already (the hand-off answer came late).
            if let Some(waiting) = self.pending.remove(shard) {
                self.pending_count -= waiting.len();
                for w in waiting {
                    self.dispatch(w.p).await;
                }
            }
        } else {
            self.ask_home(shard).await;
        }
    }

    /// Gives up every message kept for a home: asks fail with `why`, tells are counted and
    /// logged as dropped.
    pub(super) fn refuse_pending(&mut self, why: &str) {
        for (shard, queue) in self.pending.drain() {
            for w in queue {
                let Pending { env, reply, .. } = w.p;
                match reply {
                    Some(_) => AskReply::fail(reply, format!("shard {shard}: {why}")),
                    None => {
                        self.dropped_tells += 1;
                        crate::metrics::tell_dropped(&self.args.type_name);
                        tracing::warn!(entity_type = %self.args.type_name, shard, entity = %env.entity, why, "tell dropped");
                    }
                }
            }
        }
        self.pending_count = 0;
    }

    /// Forgets waiting asks whose caller stopped waiting (its timeout passed, or it went
    /// away), so that no ask is kept forever and none holds buffer space. Their callers
    /// have had their timeout error already.
    pub(super) fn drop_expired_asks(&mut self) {
        let mut dropped = 0;
        let type_name = &self.args.type_name;
        self.pending.retain(|shard, queue| {
            queue.retain(|w| {
                let expired = w.expired();
                if expired {
                    dropped += 1;
                    tracing::debug!(entity_type = %type_name, shard, entity = %w.p.env.entity,
                        "expired ask dropped: its shard's home is still unknown");
                }
                !expired
            });
            !queue.is_empty()
        });
        self.pending_count -= dropped;
    }
}

/// The region of node `home` (for `args`' type): the one in `found` while it runs, else the
/// one its `pg` group holds now (then kept in `found`).
pub(super) fn region_of(
    found: &mut HashMap<String, ActorRef<RegionMsg>>,
    args: &RegionArgs,
    home: &str,
) -> Option<ActorRef<RegionMsg>> {
    if let Some(region) = found.get(home)
        && region.get_status() == ractor::ActorStatus::Running
    {
        return Some(region.clone());
    }
    let region = region_ref(&args.scope, &args.type_name, home);
    match &region {
        Some(r) => found.insert(home.to_string(), r.clone()),
        None => found.remove(home),
    };
    region
}

/// Sends `p` on to another node's region. An ask travels with its reply port (the answer
/// comes back through this node's session), so asks and tells to one region leave in the
/// order they were routed.
/// `Err` gives `p` back when that region has stopped.
/// A message sent on this node gives up its ticket once it left (see [`crate::Routes`]).
// The message comes back whole on the (rare) error path: boxing it would cost every
// forward an allocation.
#[allow(clippy::result_large_err)]
pub(super) fn forward(region: ActorRef<RegionMsg>, mut p: Pending) -> Result<(), Pending> {
    p.env.hops += 1;
    let ticket = p.ticket.take();
    let msg = match p.reply {
        None => RegionMsg::Deliver(p.env),
        Some(port) => RegionMsg::Ask(p.env, port),
    };
    match region.cast(msg) {
        Ok(()) => Ok(()),
        Err(ractor::MessagingErr::SendErr(RegionMsg::Deliver(mut env))) => {
            env.hops -= 1;
            Err(Pending {
                env,
                reply: None,
                ticket,
            })
        }
        Err(ractor::MessagingErr::SendErr(RegionMsg::Ask(mut env, port))) => {
            env.hops -= 1;
            Err(Pending {
                env,
                reply: Some(port),
                ticket,
            })
        }
        Err(e) => {
            // Not a send error with the message back: it is gone (an ask's port with it,
            // so its asker gets an error at once).
            tracing::warn!(error = %e, "message lost forwarding it to another region");
            Ok(())
        }
    }
}

/// Sends tells on to another node's region in one message (see [`forward`]); how many.
/// `Err` gives them back when that region has stopped.
pub(super) fn forward_all(
    region: ActorRef<RegionMsg>,
    ps: Vec<Pending>,
) -> Result<u64, Vec<Pending>> {
    let n = ps.len() as u64;
    let (envelopes, tickets): (Vec<Envelope>, Vec<Option<crate::direct::Ticket>>) = ps
        .into_iter()
        .map(|mut p| {
            p.env.hops += 1;
            (p.env, p.ticket)
        })
        .unzip();
    match region.cast(RegionMsg::DeliverAll(Envelopes { envelopes })) {
        Ok(()) => Ok(n),
        Err(ractor::MessagingErr::SendErr(RegionMsg::DeliverAll(Envelopes { envelopes }))) => {
            Err(envelopes
                .into_iter()
                .zip(tickets)
                .map(|(mut env, ticket)| {
                    env.hops -= 1;
                    Pending {
                        env,
                        reply: None,
                        ticket,
                    }
                })
                .collect())
        }
        Err(e) => {
            tracing::warn!(error = %e, tells = n, "tells lost forwarding them to another region");
            Ok(n)
        }
    }
}
