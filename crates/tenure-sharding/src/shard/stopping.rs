//! How a shard stops its entities, and what it does with one that outlives its kill.
//!
//! A stop gets the shard's [stop budget](tenure_lease::StopBudget) from when it began: a
//! graceful stop after the message in hand until `stop-timeout`, then a kill of what still
//! runs and the kill wait. A hand-off drains instead: every message already in an entity's
//! mailbox was accepted and is handled, not dropped. Its graceful stop lasts while the
//! shard's grant is believed (renewed meanwhile) and the hand-off's answer can still come
//! in time: until `hand-off-timeout` less twice the stop budget (at least `stop-timeout`),
//! as Akka's hand-off stopper waits for `handOffTimeout`; the second budget leaves an
//! entity that outlives the kill at the drain's end time to end before the answer is due. How fast an entity goes through
//! its mailbox says nothing about whether it is stuck: on a loaded machine one message can
//! take longer than `stop-timeout`, and an entity killed for that drops every message behind
//! it; a stuck one holds only its own shard's hand-off, up to that bound. Should the grant
//! stop being believed during the drain, the entities are told to stop after the message in
//! hand and the budget runs from that instant, exactly as for a loss handled then. An
//! entity that
//! outlives even the kill (its thread blocked outside an await, where a ractor kill cannot
//! reach it) stays in the shard's entities, marked `outlived`: messages for it wait, it is
//! never started a second time, and a watcher tells the shard when it ends. Meanwhile:
//!
//! - a graceful move (hand-off, rebalance, leave) keeps the shard's lease, renewed: the
//!   hand-off is answered unreleased after `hand-off-timeout`, and the lease is released,
//!   and the shard stops, only once every such entity has ended;
//! - a lost lease ends the process (`when-kill-fails = "abort"`): the stop began when the
//!   loss was handled, within the delivery slack of its announcement, so the kill wait ends
//!   at least the budget's exit wait before the lease's local deadline, and the process is
//!   gone before anyone else can be granted the lease. The shard's [`LossWatch`] decides the
//!   same from a task of its own, for a shard held up behind the blocked thread itself. The
//!   shard acquires again only once such entities have ended (they cannot, with the
//!   default: the process is gone);
//! - the shard itself stopping (its region or node going away) would stop its lease actor,
//!   which releases the lease: with such an entity still running, that also ends the
//!   process.

use std::collections::VecDeque;

use ractor::ActorRef;
use tenure_lease::{FencingToken, LeaseState, Terminator, Unstoppable};
use tokio::time::Instant;

use super::{HandedOff, Pending, ShardArgs, ShardMsg, ShardState};
use crate::history;
use crate::messages::{Envelope, Pending as RegionPending};

/// The shard's [`Terminator`], by `sharding.when-kill-fails`.
pub(super) fn terminator(args: &ShardArgs) -> Terminator {
    Terminator::new(
        args.settings.when_kill_fails,
        "sharding.when-kill-fails",
        args.process_end.clone(),
    )
}

/// How the process's end names entity `entity` of the shard.
pub(super) fn entity_name(args: &ShardArgs, entity: &str) -> String {
    format!(
        "entity {entity} of {} shard {}",
        args.type_name, args.shard_id
    )
}

/// How entities stop.
#[derive(Debug, Clone, Copy)]
pub(super) enum Stop {
    /// After the message in hand: the lease is gone or going.
    Now,
    /// After every message already in their mailboxes (a hand-off, under a lease still
    /// held and renewed): messages delivered to an entity are handled, not dropped.
    Drain,
}

impl ShardState {
    /// Stops every entity (started, still starting, or already outlived) and waits for them
    /// within the stop budget from now; `true` when all have terminated. Each end is
    /// recorded once seen; one that outlives its kill stays, marked outlived and watched
    /// (see the module doc).
    pub(super) async fn stop_entities(&mut self, why: &str, how: Stop) -> bool {
        if self.entities.is_empty() {
            return true;
        }
        let budget = self.args.settings.stop_budget();
        let began = Instant::now();
        let mut at = budget.deadlines(began);
        // Until when entities stop gracefully: a drain's bound (see the module doc).
        let mut graceful: Instant = match how {
            Stop::Now => at.kill,
            Stop::Drain => at.kill.max(
                began
                    + self
                        .args
                        .settings
                        .hand_off_timeout
                        .saturating_sub(budget.total() * 2),
            ),
        };
        // The kill, and its wait, follow the drain's bound.
        at.give_up = graceful + budget.kill_wait;
        at.kill = graceful;
        let believed = self.view.token();
        let mut states = self.view.watch_state();
        // Whether a loss during a drain is still to be watched for.
        let mut watching = matches!(how, Stop::Drain);
        let ids: Vec<String> = self.entities.keys().cloned().collect();
        for (id, r) in &self.entities {
            self.inactive(id);
            if let Some(routes) = &self.routes {
                routes.close(id, None);
            }
            match how {
                Stop::Now => r.actor.stop(Some(why.to_string())),
                Stop::Drain => {
                    if r.actor.drain().is_err() {
                        r.actor.stop(Some(why.to_string()));
                    }
                }
            }
        }
        let mut running = Vec::new();
        for id in &ids {
            let actor = self.entities[id].actor.clone();
            let ended = loop {
                let left = graceful.saturating_duration_since(Instant::now());
                tokio::select! {
                    ended = actor.wait(Some(left)) => break ended.is_ok(),
                    changed = states.changed(), if watching => {
                        let held = matches!(*states.borrow_and_update(), LeaseState::Held | LeaseState::Suspended);
                        if changed.is_err() || !held || self.view.token() != believed {
                            // The grant is no longer believed: stop after the message in
                            // hand, within the budget from now.
                            watching = false;
                            at = budget.deadlines(Instant::now());
                            graceful = at.kill;
                            tracing::warn!(shard = %self.args.shard_id, "the shard's grant ended during a hand-off's drain: stopping its entities now");
                            for r in self.entities.values() {
                                r.actor.stop(Some(why.to_string()));
                            }
                        }
                    }
                }
            };
            if ended {
                self.stopped(id, why);
            } else {
                running.push(id.clone());
            }
        }
        for id in &running {
            tracing::warn!(shard = %self.args.shard_id, entity = %id, "entity did not stop within stop-timeout; killing it");
            self.entities[id].actor.kill();
        }
        let mut outlived = Vec::new();
        for id in running {
            let actor = self.entities[&id].actor.clone();
            let left = at.give_up.saturating_duration_since(Instant::now());
            if actor.wait(Some(left)).await.is_ok() {
                self.stopped(&id, &format!("{why} (killed after stop-timeout)"));
            } else {
                outlived.push(id);
            }
        }
        for id in &outlived {
            self.outlived(id, why);
        }
        outlived.is_empty()
    }

    /// Entity `id` terminated during a stop: forgotten and its end recorded.
    fn stopped(&mut self, id: &str, why: &str) {
        if let Some(r) = self.entities.remove(id) {
            self.watch.forget(r.actor.get_id());
            self.record_entity(history::entity_stopped, id, r.token, why);
        }
    }

    /// Entity `id` outlived its kill during a stop for `why`: kept, marked and watched
    /// (reported once: log, `entity_zombie`, metric).
    fn outlived(&mut self, id: &str, why: &str) {
        let Some(r) = self.entities.get_mut(id) else {
            return;
        };
        r.passivating = true;
        if r.outlived {
            return;
        }
        r.outlived = true;
        let (actor, token) = (r.actor.clone(), r.token);
        tracing::error!(shard = %self.args.shard_id, entity = %id, token = token.get(), why,
            "entity outlived its kill (its thread blocked outside an await?): the shard keeps its lease until it ends");
        self.record_entity(history::entity_zombie, id, token, why);
        crate::metrics::entity_outlived_kill(&self.args.type_name);
        let shard = self.myself.clone();
        tokio::spawn(async move {
            let _ = actor.wait(None).await;
            let _ = shard.cast(ShardMsg::EntityEnded(actor.get_id()));
        });
    }

    /// Entities that outlived their kill and still run.
    pub(super) fn has_outlived(&self) -> bool {
        self.entities.values().any(|r| r.outlived)
    }

    /// Entities outlived their kill while the lease is being lost (`why`), or while the
    /// shard itself stops (its lease actor then releases): ends the process with the
    /// default `when-kill-fails` (see [`Terminator`]); with `run-on-unsafe` only logs it.
    pub(super) fn kill_failed(&mut self, why: &str) {
        let mut outlived: Vec<(&String, FencingToken)> = self
            .entities
            .iter()
            .filter(|(_, r)| r.outlived)
            .map(|(id, r)| (id, r.token))
            .collect();
        outlived.sort();
        let Some(&(_, token)) = outlived.first() else {
            return;
        };
        let names: Vec<String> = outlived
            .iter()
            .map(|(id, _)| entity_name(&self.args, id))
            .collect();
        let what = Unstoppable {
            lease: self.args.lease.name.clone(),
            token,
            what: names.join(", "),
        };
        self.terminator.terminate(&what, why);
    }

    /// The entity (actor `actor`) ended. If it had outlived its kill and was the last one,
    /// what waited for it goes on: the hand-off finishes, or the shard acquires again.
    pub(super) async fn entity_ended(
        &mut self,
        myself: &ActorRef<ShardMsg>,
        actor: ractor::ActorId,
        why: String,
    ) {
        let Some(id) = self.entity_run_by(actor) else {
            return;
        };
        let Some(ended) = self.entities.remove(&id) else {
            return;
        };
        self.inactive(&id);
        self.watch.forget(actor);
        if let Some(routes) = &self.routes {
            routes.close(&id, Some(actor));
        }
        let why = if ended.outlived {
            format!("outlived its kill, ended later: {why}")
        } else {
            why
        };
        self.record_entity(history::entity_stopped, &id, ended.token, &why);
        // Messages that arrived while it passivated go to its next incarnation.
        let (mine, others): (VecDeque<Pending>, VecDeque<Pending>) =
            std::mem::take(&mut self.waiting)
                .into_iter()
                .partition(|p| p.entity == id);
        self.waiting = others;
        if self.serving.is_some()
            && let Some(r) = &mut self.remember
        {
            if ended.passivating && ended.asked {
                // It asked to stop: forgotten (a message waiting for it adds it again).
                r.forget(&id);
            } else if mine.is_empty() {
                // Stopped without asking (it failed): started again after the backoff.
                self.restart_later(&id);
            }
        }
        for p in mine {
            self.deliver(p);
        }
        if ended.outlived {
            tracing::warn!(shard = %self.args.shard_id, entity = %id, "the entity that outlived its kill has ended");
            self.resume(myself).await;
        }
    }

    /// Once no entity that outlived its kill runs: finishes a hand-off, or acquires the
    /// lease again after a loss.
    pub(super) async fn resume(&mut self, myself: &ActorRef<ShardMsg>) {
        if self.has_outlived() {
            return;
        }
        self.terminator.rearm();
        if self.handing_off {
            self.finish_hand_off(myself).await;
        } else if self.serving.is_none() {
            let _ = self
                .lease
                .cast(tenure_lease::LeaseMsg::Acquire { reply: None });
        }
    }

    /// A hand-off whose entities have all terminated: flushes the remembered ids, releases
    /// the lease, answers (if not answered yet) and stops the shard.
    pub(super) async fn finish_hand_off(&mut self, myself: &ActorRef<ShardMsg>) {
        // Entities that passivated themselves are forgotten before the next host reads the
        // ids.
        self.flush_remembered().await;
        if let Some(token) = self.serving.take() {
            self.record(history::shard_stopped, token, "hand-off");
        }
        let released = self.release().await;
        self.answer_hand_off(released);
        myself.stop(Some("handed off".into()));
    }

    /// Answers the pending hand-off, if any, with `released` and the messages the shard
    /// kept (they belong to the shard's next home).
    pub(super) fn answer_hand_off(&mut self, released: bool) {
        let Some(reply) = self.hand_off.take() else {
            return;
        };
        let shard = self.args.shard_id.clone();
        let undelivered = std::mem::take(&mut self.waiting)
            .into_iter()
            .map(|p| RegionPending {
                env: Envelope {
                    shard: shard.clone(),
                    entity: p.entity,
                    payload: p.payload,
                    hops: p.hops,
                },
                reply: p.reply,
                ticket: p.ticket,
            })
            .collect();
        let _ = reply.send(HandedOff {
            released,
            undelivered,
        });
    }

    /// `hand-off-timeout` passed since the hand-off began: if entities that outlived their
    /// kill still hold it up, answers that the lease was not released (the next host waits
    /// for it), and keeps the lease until they end.
    pub(super) fn hand_off_due(&mut self) {
        if self.hand_off.is_some() && self.has_outlived() {
            tracing::warn!(shard = %self.args.shard_id,
                "hand-off-timeout passed with entities that outlived their kill still running: answered unreleased; the lease is released once they end");
            self.answer_hand_off(false);
        }
    }
}
