//! Rebalance: rounds of moves decided by the strategy (and pinned shards going back to
//! their region), each moved through the hand-off: every region is told first, then each
//! old home hands its shard off, then the new home is told to host it. The next round is
//! decided once every shard of this one has moved.

use super::*;

impl CoordinatorState {
    /// Decides a rebalance round, when every member is up, reachable and (if it may host
    /// the type) registered and available, and starts its moves.
    pub(super) fn rebalance(&mut self) {
        let settled = self.members.values().all(|m| {
            m.status == MemberStatus::Up
                && m.reachable
                && (!m.has_role(self.args.settings.role.as_deref())
                    || self
                        .regions
                        .get(&m.addr.to_string())
                        .is_some_and(|r| r.available))
        });
        if !settled || !self.listed || self.resizing() {
            return;
        }
        let in_progress: BTreeSet<String> = self.moving.keys().cloned().collect();
        // Pinned shards away from their region go back once it can take them; the
        // strategy's moves leave every pinned shard where it is.
        let mut decided: Vec<(String, String, String)> = self
            .pinned
            .iter()
            .filter(|(shard, pin)| !in_progress.contains(*shard) && self.homes.is_allocatable(pin))
            .filter_map(|(shard, pin)| {
                let home = self.homes.home(shard)?;
                (home != pin).then(|| (shard.clone(), home.to_string(), pin.clone()))
            })
            .collect();
        decided.extend(
            self.args
                .strategy
                .rebalance(&self.homes, &in_progress)
                .into_iter()
                .filter(|(shard, _, _)| !self.pinned.contains_key(shard)),
        );
        self.begin_moves(decided);
    }

    /// Starts a round of moves `(shard, from, to)` through the hand-off (those that are not
    /// on `from`, or whose `to` cannot take shards, are logged and left).
    pub(super) fn begin_moves(&mut self, decided: Vec<(String, String, String)>) {
        let mut round = Vec::new();
        for (shard, from, to) in decided {
            let valid = self.homes.home(&shard) == Some(from.as_str())
                && self.homes.is_allocatable(&to)
                && from != to;
            if !valid {
                tracing::warn!(entity_type = %self.args.type_name, shard, from, to, "rebalance: the strategy moved a shard that is not on `from`, or to a region that cannot take it; ignored");
                continue;
            }
            tracing::debug!(entity_type = %self.args.type_name, shard, from, to, "moving a shard");
            crate::metrics::rebalance_move(&self.args.type_name);
            history::shard_moving(&self.args.type_name, &shard, &from, &to);
            self.homes.remove_home(&shard);
            self.unconfirmed.remove(&shard);
            self.moving.insert(
                shard.clone(),
                Move {
                    from: from.clone(),
                    to,
                    waiting: BTreeSet::new(),
                },
            );
            round.push((shard, from));
        }
        if !round.is_empty() {
            tracing::info!(entity_type = %self.args.type_name, shards = round.len(), "a round of moves begins");
            self.move_shards(round);
        }
    }

    /// A moving shard's hand-off ended: it goes to its new home (or is allocated anew when
    /// that went meanwhile), and the regions that asked meanwhile learn where. (Once the
    /// round's last shard has moved, the next round is decided at once.)
    pub(super) fn hand_off_ended(&mut self, shard: String, released: bool) {
        let Some(Move { from, to, waiting }) = self.moving.remove(&shard) else {
            return;
        };
        tracing::info!(entity_type = %self.args.type_name, shard, from, to, released, "shard handed off for a rebalance");
        if released && let Some(e) = self.regions.get_mut(&from) {
            // Its old host said so: no copy of it runs there to stop.
            e.reported.remove(&shard);
        }
        if self.homes.is_allocatable(&to) && !self.resizing() {
            self.host(&shard, &to);
        }
        let home = self.home_of(&shard);
        if home.is_none() && self.remembered.contains(&shard) {
            self.unplaced.insert(shard.clone());
        }
        history::shard_moved(
            &self.args.type_name,
            &shard,
            &from,
            home.as_deref(),
            released,
        );
        for region in waiting {
            self.tell(&region, &shard, Told::Home(home.clone()));
        }
    }

    /// The steps of a rebalance round after the decision: every region (registered, or one
    /// that asked for a home) is told, in one message, that the round's hand-offs begin,
    /// and answers (each waited for at most `hand-off-timeout`), so that none sends those
    /// shards to their old homes any more; then each old home hands its shard off, and the
    /// ends come back to this coordinator (`HandOffsEnded`), those that ended together in
    /// one message, so that their new homes reach each region together. What this wave
    /// told the regions leaves first.
    pub(super) fn move_shards(&mut self, round: Vec<(String, String)>) {
        self.flush();
        let scope = &self.args.scope;
        let type_name = &self.args.type_name;
        let regions: Vec<ActorRef<RegionMsg>> = self
            .regions
            .keys()
            .chain(self.askers.iter())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter_map(|r| region_ref(scope, type_name, r))
            .collect();
        let timeout = self.args.settings.hand_off_timeout;
        let token = self.args.token;
        let (scope, type_name, me) = (scope.clone(), type_name.clone(), self.myself.clone());
        tokio::spawn(async move {
            let shards: Vec<String> = round.iter().map(|(s, _)| s.clone()).collect();
            let begun = regions.into_iter().map(|region| {
                let shards = shards.clone();
                async move {
                    region
                        .call(
                            |port| {
                                RegionMsg::BeginHandOffShards(
                                    BeginHandOffs {
                                        shards,
                                        coordinator: token,
                                    },
                                    port,
                                )
                            },
                            Some(timeout),
                        )
                        .await
                }
            });
            futures::future::join_all(begun).await;
            let mut hand_offs: FuturesUnordered<_> = round
                .into_iter()
                .map(|(shard, from)| {
                    let (scope, type_name) = (&scope, &type_name);
                    async move {
                        let released =
                            hand_off_call(scope, type_name, &shard, &from, token, timeout).await;
                        (shard, released)
                    }
                })
                .collect();
            while let Some(first) = hand_offs.next().await {
                let mut ended = vec![first];
                while let Some(Some(more)) = hand_offs.next().now_or_never() {
                    ended.push(more);
                }
                let _ = me.cast(CoordinatorMsg::Local(CoordinatorLocal::HandOffsEnded(
                    ended,
                )));
            }
        });
    }
}

/// Asks `region` to hand `shard` off and waits up to `timeout`; `true` when it answered
/// that the shard's lease was released.
pub(super) async fn hand_off_call(
    scope: &str,
    type_name: &str,
    shard: &str,
    region: &str,
    coordinator: FencingToken,
    timeout: std::time::Duration,
) -> bool {
    let Some(r) = region_ref(scope, type_name, region) else {
        return false;
    };
    matches!(
        r.call(
            |port| RegionMsg::HandOffShard(
                HandOff {
                    shard: shard.to_string(),
                    coordinator,
                },
                port
            ),
            Some(timeout),
        )
        .await,
        Ok(ractor::rpc::CallResult::Success(done)) if done.released
    )
}
