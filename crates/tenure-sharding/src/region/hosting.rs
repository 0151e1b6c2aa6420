//! Hosting: starting the shards the coordinator gives this region, handing them off, and
//! vacating the region when its node leaves.

use super::*;

impl RegionState {
    /// Hands the local shard `shard` off: it stops (a new instance may start here only
    /// once it terminated), and what it had not delivered comes back to this region.
    pub(super) fn hand_off(
        &mut self,
        shard: String,
        actor: ActorRef<ShardMsg>,
        reply: Option<RpcReplyPort<HandOffDone>>,
    ) {
        self.stopping.insert(shard.clone(), actor.clone());
        self.handoffs += 1;
        let timeout = self.hand_off_wait();
        let region = self.myself.clone();
        tokio::spawn(async move {
            let (released, undelivered) = match actor.call(ShardMsg::HandOff, Some(timeout)).await {
                Ok(ractor::rpc::CallResult::Success(HandedOff {
                    released,
                    undelivered,
                })) => (released, undelivered),
                _ => {
                    tracing::warn!(
                        shard,
                        "the shard did not confirm its hand-off in time; messages it kept are lost (asks fail)"
                    );
                    (false, Vec::new())
                }
            };
            let _ = region.cast(RegionMsg::Local(RegionLocal::HandedOff {
                shard,
                released,
                undelivered,
                reply,
            }));
        });
    }

    /// Starts the local shard `shard` if it is not running; `false` if this region cannot
    /// host it.
    pub(super) async fn start_shard(&mut self, shard: &str) -> bool {
        if self.shards.contains_key(shard) {
            return true;
        }
        if !self.can_host() || self.stopping.contains_key(shard) {
            return false;
        }
        let Some((factory, template)) = &self.args.hosting else {
            return false;
        };
        let name = tenure_lease::names::shard_lease(&self.args.system, &self.args.type_name, shard);
        let lease = match template.renamed(&name) {
            Ok(spec) => spec,
            Err(e) => {
                tracing::error!(entity_type = %self.args.type_name, shard, error = %e, "bad shard lease");
                return false;
            }
        };
        let args = ShardArgs {
            type_name: self.args.type_name.clone(),
            shard_id: shard.to_string(),
            node: self.args.me.clone(),
            lease,
            factory: factory.clone(),
            active: self.active.clone(),
            settings: self.args.settings.clone(),
            process_end: tenure_lease::ProcessEnd::abort(),
        };
        match Shard::start_routed(args, Some(self.myself.get_cell()), self.args.routes.clone())
            .await
        {
            Ok(actor) => {
                self.shards.insert(shard.to_string(), actor);
                true
            }
            Err(e) => {
                tracing::error!(entity_type = %self.args.type_name, shard, error = %e, "cannot start a shard");
                false
            }
        }
    }

    /// Whether a coordinator message with `token` comes from the newest coordinator heard
    /// from (which it then is); an older one's is ignored and logged.
    pub(super) fn current(&mut self, token: FencingToken, shard: &str) -> bool {
        if token < self.coordinator {
            tracing::info!(entity_type = %self.args.type_name, shard, token = token.get(), newest = self.coordinator.get(),
                "ignoring a message from an older coordinator");
            return false;
        }
        self.coordinator = token;
        true
    }

    /// Hands every local shard off (entities stopped, leases released).
    pub(super) fn hand_off_all(&mut self) {
        let shards: Vec<(String, ActorRef<ShardMsg>)> = self.shards.drain().collect();
        let me = self.args.me.clone();
        self.homes.retain(|_, h| *h != me);
        for (id, s) in shards {
            self.hand_off(id, s, None);
        }
    }

    /// A leaving region's next step: once it hosts, keeps and relays nothing, a round of
    /// `Vacate` to every other region of its type; the leave may go on (the guard is
    /// dropped) after a round that began that way and saw nothing forwarded meanwhile.
    pub(super) fn vacate(&mut self) {
        if self.leave.is_none() {
            return;
        }
        let me = self.args.me.clone();
        let successor = self
            .members
            .iter()
            .any(|(addr, m)| *addr != me && m.status == MemberStatus::Up);
        if !successor {
            // Every member is leaving or gone (the cluster is shutting down): no shard can
            // have a next home, so nothing kept here can be delivered.
            self.refuse_pending("no member is left up to host it: the cluster is leaving");
            if self.shards.is_empty() && self.handoffs == 0 {
                tracing::info!(entity_type = %self.args.type_name, "region left with the rest of the cluster");
                self.leave = None;
            }
            return;
        }
        let idle = self.shards.is_empty()
            && self.handoffs == 0
            && self.pending.is_empty()
            && self.relays == 0;
        let Some(leave) = &mut self.leave else {
            return;
        };
        if leave.round || !idle {
            return;
        }
        if leave.clean_from == Some(self.forwarded) {
            tracing::info!(entity_type = %self.args.type_name, "region vacated: no message here depends on this node any more");
            self.leave = None;
            return;
        }
        leave.round = true;
        let forwarded = self.forwarded;
        let others: Vec<ActorRef<RegionMsg>> = self
            .members
            .keys()
            .filter(|addr| **addr != me)
            .filter_map(|addr| region_ref(&self.args.scope, &self.args.type_name, addr))
            .collect();
        // Bounded: a region that does not answer (its node unreachable) holds the leave no
        // longer than this, and the node's leave-timeout bounds the whole leave.
        let bound = self.args.settings.retry_interval * 4;
        let region = self.myself.clone();
        tokio::spawn(async move {
            let calls = others.into_iter().map(|other| {
                let node = me.clone();
                async move {
                    other
                        .call(|r| RegionMsg::Vacate(Vacating { node }, r), Some(bound))
                        .await
                }
            });
            futures::future::join_all(calls).await;
            let _ = region.cast(RegionMsg::Local(RegionLocal::Vacated { forwarded }));
        });
    }
}
