//! The LeaseActor's side of cooperative preemption: as a requester (record a request on a
//! lower-priority grant, poll until granted, overtaken, or the wait is over), and as a holder
//! (announce requests seen in renewal answers). Timing stays here, in the actor; the store
//! only records requests and refuses renewals after a forceful one.
//!
//! Why it is safe without fencing (except the emergency option): a forceful request stops
//! the holder's renewals in the store, so its grant ends at the expiry of its last renewal;
//! the holder stopped believing before that (its local deadline), and the requester is
//! granted only by the store, after that expiry.

use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{AcquireReply, Acquired, LeaseActorState, LeaseMsg};
use crate::error::LeaseError;
use crate::events::{LeaseEvent, PreemptionRequested, PreemptionWithdrawn};
use crate::store::{LeaseRecord, PreemptAnswer, PreemptionRequest, bounded};

/// A requester waiting for a lower-priority holder to give the lease up.
pub(super) struct Preempting {
    /// The token of the grant asked to give up.
    target: u64,
    /// When waiting on this grant began.
    started: Instant,
    /// When the wait for a voluntary release ends: min(own waiting timeout, the holder's
    /// cleanup timeout).
    deadline: Instant,
    /// The end of this requester's own waiting timeout, if it has one.
    give_up_at: Option<Instant>,
    /// Callers of `TryAcquire` waiting for the outcome.
    replies: Vec<RpcReplyPort<AcquireReply>>,
    timer: Option<JoinHandle<()>>,
}

impl Drop for Preempting {
    fn drop(&mut self) {
        if let Some(t) = self.timer.take() {
            t.abort();
        }
    }
}

/// What the holder has announced about requests on its current grant.
#[derive(Debug, Default)]
pub(super) struct Notices {
    generation: u64,
    shown: Option<PreemptionRequest>,
    /// When the latest renewal (or the grant) that showed no request was sent: any request
    /// seen later was recorded after this instant.
    clean_sent_at: Option<Instant>,
}

impl Notices {
    pub(super) fn new(generation: u64, sent_at: Instant) -> Self {
        Notices {
            generation,
            shown: None,
            clean_sent_at: Some(sent_at),
        }
    }
}

impl LeaseActorState {
    fn pace(&self) -> Duration {
        self.retry_pace
            .unwrap_or(self.spec.settings.lease_retry_interval)
    }

    /// The holder record of the last "held by another owner" answer, if this requester
    /// outranks it (then it asks instead of taking "not granted").
    pub(super) fn preemptable(&mut self) -> Option<LeaseRecord> {
        self.last_held
            .take()
            .filter(|r| self.spec.options.outranks(r.priority))
    }

    /// Starts waiting for the holder of `record` to give the lease up; `reply` (a
    /// `TryAcquire`) gets the outcome.
    pub(super) async fn start_preempting(
        &mut self,
        myself: &ActorRef<LeaseMsg>,
        record: LeaseRecord,
        reply: Option<RpcReplyPort<AcquireReply>>,
    ) {
        let now = Instant::now();
        let give_up_at = self.spec.options.waiting_timeout.map(|w| now + w);
        self.preempting = Some(Preempting {
            target: record.token,
            started: now,
            deadline: wait_end(now, record.cleanup_timeout, give_up_at),
            give_up_at,
            replies: reply.into_iter().collect(),
            timer: None,
        });
        tracing::info!(lease = %self.spec.name, holder = %record.owner, holder_priority = record.priority,
            priority = self.spec.options.priority, "asking the lower-priority holder to give the lease up");
        self.preempt_step(myself, record).await;
    }

    /// Adds a `TryAcquire` caller to a preemption under way; gives it back if there is none.
    pub(super) fn join_preempting(
        &mut self,
        reply: RpcReplyPort<AcquireReply>,
    ) -> Option<RpcReplyPort<AcquireReply>> {
        match &mut self.preempting {
            Some(p) => {
                p.replies.push(reply);
                None
            }
            None => Some(reply),
        }
    }

    /// One poll while preempting: try to acquire, then decide on the holder's record.
    pub(super) async fn preempt_poll(&mut self, myself: &ActorRef<LeaseMsg>) {
        if self.preempting.is_none() {
            return;
        }
        let answer = self.attempt(myself).await;
        match &answer {
            Ok((Acquired::Granted { .. }, _)) => self.finish_preempting(myself, answer),
            Ok((Acquired::NotGranted { .. }, _)) => match self.last_held.take() {
                Some(record) => self.preempt_step(myself, record).await,
                None => self.schedule_poll(myself, Instant::now() + self.pace()),
            },
            Err(e) => {
                tracing::debug!(lease = %self.spec.name, error = %e, "acquire while preempting failed; polling on");
                self.schedule_poll(myself, Instant::now() + self.pace());
            }
        }
    }

    /// Decides, given the current holder's record, whether to (re)record the request, make
    /// it forceful, give up, or poll again.
    async fn preempt_step(&mut self, myself: &ActorRef<LeaseMsg>, record: LeaseRecord) {
        let owner = self.spec.owner.clone();
        let name = self.spec.name.clone();
        let options = self.spec.options.clone();
        let now = Instant::now();
        let Some(p) = self.preempting.as_mut() else {
            return;
        };
        if !options.outranks(record.priority) {
            let reply = not_granted(&record);
            return self.finish_preempting(myself, reply);
        }
        if record.token != p.target {
            // Another lower-priority grant replaced the one we asked: ask its holder.
            p.target = record.token;
            p.started = now;
            p.deadline = wait_end(now, record.cleanup_timeout, p.give_up_at);
        }
        if let Some(q) = record.request.as_ref().filter(|q| q.by != owner)
            && q.priority >= options.priority
        {
            let reply = Err(LeaseError::Overtaken {
                name,
                by: q.by.clone(),
                priority: q.priority,
            });
            return self.finish_preempting(myself, reply);
        }
        let ours = record.request.as_ref().filter(|q| q.by == owner);
        let due = now >= p.deadline;
        if due && !options.forceful {
            let waited = now.saturating_duration_since(p.started);
            if ours.is_some() {
                self.withdraw(record.token).await;
            }
            let reply = Err(LeaseError::CleanupTimedOut {
                name,
                holder: record.owner,
                cleanup_timeout: record.cleanup_timeout,
                waited,
            });
            return self.finish_preempting(myself, reply);
        }
        let deadline = p.deadline;
        let forceful = due && options.forceful;
        if ours.is_none_or(|q| forceful && !q.forceful) {
            match self.request(record.token, forceful).await {
                Ok(PreemptAnswer::Recorded(_)) => {
                    tracing::info!(lease = %self.spec.name, holder = %record.owner, forceful, "preemption requested");
                }
                Ok(PreemptAnswer::Refused(current)) => {
                    let other = current.request.as_ref().filter(|q| q.by != owner);
                    let reply = match other {
                        Some(q) if options.outranks(current.priority) => {
                            Err(LeaseError::Overtaken {
                                name,
                                by: q.by.clone(),
                                priority: q.priority,
                            })
                        }
                        _ => not_granted(&current),
                    };
                    return self.finish_preempting(myself, reply);
                }
                // The grant ended meanwhile: try to acquire at once.
                Ok(PreemptAnswer::Gone) => return self.schedule_poll(myself, now),
                Err(e) => {
                    tracing::debug!(lease = %self.spec.name, error = %e, "preemption request failed; polling on")
                }
            }
        }
        let next = now + self.pace();
        let at = if due { next } else { next.min(deadline) };
        self.schedule_poll(myself, at);
    }

    fn schedule_poll(&mut self, myself: &ActorRef<LeaseMsg>, at: Instant) {
        let timer = self.schedule(myself, at, || LeaseMsg::PreemptPoll);
        if let Some(p) = &mut self.preempting {
            if let Some(old) = p.timer.replace(timer) {
                old.abort();
            }
        } else {
            timer.abort();
        }
    }

    async fn request(&self, token: u64, forceful: bool) -> Result<PreemptAnswer, LeaseError> {
        let spec = &self.spec;
        let request = PreemptionRequest {
            by: spec.owner.clone(),
            instance: self.instance_base.clone(),
            priority: spec.options.priority,
            forceful,
            note: spec.note.clone(),
        };
        bounded(
            &spec.name,
            "request preemption",
            spec.settings.lease_operation_timeout,
            spec.store
                .request_preemption(&spec.store_name, token, &request),
        )
        .await
    }

    /// Takes this requester's request off grant `token` (best effort: a request left
    /// behind ends with the grant).
    async fn withdraw(&self, token: u64) {
        withdraw_request(&self.spec, token).await;
    }

    /// The grant a preemption under way asks to give up, taking the preemption out (for
    /// `Drop` of a killed actor, which withdraws in the background).
    pub(super) fn abandon_preempting(&mut self) -> Option<u64> {
        self.preempting.take().map(|p| p.target)
    }

    /// Ends the preemption with `reply` to its callers; a grant also answers `Acquire`
    /// waiters, anything else lets a wanted acquire retry later.
    fn finish_preempting(&mut self, myself: &ActorRef<LeaseMsg>, reply: AcquireReply) {
        let Some(mut p) = self.preempting.take() else {
            return;
        };
        for r in p.replies.drain(..) {
            let _ = r.send(reply.clone());
        }
        if matches!(reply, Ok((Acquired::Granted { .. }, _))) {
            self.wanted = false;
            Self::stop_timer(&mut self.retry_timer);
            self.answer_waiters(&reply);
        } else if self.wanted {
            tracing::debug!(lease = %self.spec.name, outcome = ?reply, "preemption ended without a grant; will retry");
            let at = Instant::now() + self.pace();
            self.retry_timer = Some(self.schedule(myself, at, || LeaseMsg::RetryAcquire));
        }
    }

    /// Abandons a preemption under way (release, stop): withdraws the request and answers
    /// its callers `Cancelled`.
    pub(super) async fn stop_preempting(&mut self) {
        let Some(mut p) = self.preempting.take() else {
            return;
        };
        self.withdraw(p.target).await;
        for r in p.replies.drain(..) {
            let _ = r.send(Err(LeaseError::Cancelled {
                name: self.spec.name.clone(),
            }));
        }
    }

    /// A renewal of `generation` sent at `sent_at` succeeded and showed `request` pending:
    /// announce a new request, or the withdrawal of the announced one.
    pub(super) fn observe_request(
        &mut self,
        generation: u64,
        request: Option<PreemptionRequest>,
        sent_at: Instant,
    ) {
        let n = &mut self.notices;
        if n.generation != generation {
            return;
        }
        let name = &self.spec.name;
        let Some(token) = self.belief.held().map(|h| h.token) else {
            return;
        };
        let mut events = Vec::new();
        let same =
            |a: &PreemptionRequest, b: &PreemptionRequest| a.by == b.by && a.priority == b.priority;
        match request {
            None => {
                n.clean_sent_at = n.clean_sent_at.max(Some(sent_at));
                if let Some(old) = n.shown.take() {
                    events.push(withdrawn(name, token, old));
                }
            }
            Some(r) if n.shown.as_ref().is_some_and(|s| same(s, &r)) => n.shown = Some(r),
            Some(r) => {
                if let Some(old) = n.shown.replace(r.clone()) {
                    events.push(withdrawn(name, token, old));
                }
                let since = n.clean_sent_at.unwrap_or(sent_at);
                events.push(LeaseEvent::PreemptionRequested(PreemptionRequested {
                    name: name.clone(),
                    token,
                    by: r.by,
                    priority: r.priority,
                    forceful: r.forceful,
                    note: r.note,
                    cleanup_deadline: since + self.spec.options.cleanup_timeout,
                }));
            }
        }
        for event in events {
            self.belief.notify(generation, event);
        }
    }
}

/// Takes `spec.owner`'s request off grant `token` (best effort: a request left behind ends
/// with the grant).
pub(super) async fn withdraw_request(spec: &crate::LeaseSpec, token: u64) {
    let withdrawn = bounded(
        &spec.name,
        "withdraw preemption",
        spec.settings.lease_operation_timeout,
        spec.store
            .withdraw_preemption(&spec.store_name, token, &spec.owner),
    )
    .await;
    tracing::info!(lease = %spec.name, token, ?withdrawn, "preemption request withdrawn");
}

fn withdrawn(name: &str, token: u64, old: PreemptionRequest) -> LeaseEvent {
    LeaseEvent::PreemptionWithdrawn(PreemptionWithdrawn {
        name: name.to_string(),
        token,
        by: old.by,
    })
}

fn not_granted(record: &LeaseRecord) -> AcquireReply {
    Ok((
        Acquired::NotGranted {
            holder: Some(record.owner.clone()),
            priority: record.priority,
        },
        None,
    ))
}

/// When waiting for a voluntary release ends: the holder's cleanup timeout from `now`,
/// bounded by the requester's own give-up instant.
fn wait_end(now: Instant, cleanup: Duration, give_up_at: Option<Instant>) -> Instant {
    let end = now + cleanup;
    give_up_at.map_or(end, |g| end.min(g))
}
