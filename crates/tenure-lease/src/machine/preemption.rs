//! The machine's side of cooperative preemption: as a requester (record a request on a
//! lower-priority grant, poll until granted, overtaken, or the wait is over), and as a holder
//! (announce requests seen in renewal answers). Timing stays here, in the machine; the store
//! only records requests and refuses renewals after a forceful one.
//!
//! Why it is safe without fencing (except the emergency option): a forceful request stops
//! the holder's renewals in the store, so its grant ends at the expiry of its last renewal;
//! the holder stopped believing before that (its local deadline), and the requester is
//! granted only by the store, after that expiry.

use std::time::Duration;

use tokio::time::Instant;

use super::{AfterWithdraw, Awaiting, Call, Effect, Event, Machine, Out, Timer};
use crate::actor::{AcquireReply, Acquired};
use crate::duration::later;
use crate::error::LeaseError;
use crate::store::{LeaseRecord, PreemptAnswer, PreemptionRequest};
use crate::token::FencingToken;

/// A requester waiting for a lower-priority holder to give the lease up.
#[derive(Debug)]
pub(crate) struct Preempting<A> {
    /// The token of the grant asked to give up.
    pub(super) target: FencingToken,
    /// When waiting on this grant began.
    started: Instant,
    /// When the wait for a voluntary release ends: min(own waiting timeout, the holder's
    /// cleanup timeout).
    deadline: Instant,
    /// The end of this requester's own waiting timeout, if it has one.
    give_up_at: Option<Instant>,
    /// Callers of `TryAcquire` waiting for the outcome.
    pub(super) replies: Vec<A>,
}

/// A preemption request on `holder`'s grant, awaiting the store's answer: then poll at
/// `poll_at`, or at `asked_at` if the grant is gone.
#[derive(Debug)]
pub(super) struct Asked {
    holder: String,
    forceful: bool,
    asked_at: Instant,
    poll_at: Instant,
}

/// What the holder has announced about requests on its current grant.
#[derive(Debug, Default)]
pub(crate) struct Notices {
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

impl<A, L> Machine<A, L> {
    /// The holder record of the last "held by another owner" answer, if this requester
    /// outranks it (then it asks instead of taking "not granted").
    pub(super) fn preemptable(&mut self) -> Option<LeaseRecord> {
        self.last_held
            .take()
            .filter(|r| self.cfg.options.outranks(r.priority))
    }

    /// Starts waiting for the holder of `record` to give the lease up; `reply` (a
    /// `TryAcquire`) gets the outcome.
    pub(super) fn start_preempting(
        &mut self,
        now: Instant,
        record: LeaseRecord,
        reply: Option<A>,
        out: &mut Out<A, L>,
    ) {
        let give_up_at = self.cfg.options.waiting_timeout.map(|w| later(now, w));
        self.preempting = Some(Preempting {
            target: record.token,
            started: now,
            deadline: wait_end(now, record.cleanup_timeout, give_up_at),
            give_up_at,
            replies: reply.into_iter().collect(),
        });
        out.push(Effect::Emit(Event::PreemptionStarted {
            holder: record.owner.clone(),
            holder_priority: record.priority,
            priority: self.cfg.options.priority,
        }));
        self.preempt_step(now, record, out);
    }

    /// Adds a `TryAcquire` caller to a preemption under way; gives it back if there is none.
    pub(super) fn join_preempting(&mut self, reply: A) -> Option<A> {
        match &mut self.preempting {
            Some(p) => {
                p.replies.push(reply);
                None
            }
            None => Some(reply),
        }
    }

    /// The outcome of an acquire attempt made while preempting.
    pub(super) fn polled(&mut self, now: Instant, reply: AcquireReply, out: &mut Out<A, L>) {
        match &reply {
            Ok((Acquired::Granted { .. }, _)) => self.finish_preempting(now, reply, out),
            Ok((Acquired::NotGranted { .. }, _)) => match self.last_held.take() {
                Some(record) => self.preempt_step(now, record, out),
                None => self.schedule_poll(later(now, self.pace()), out),
            },
            Err(e) => {
                out.push(Effect::Emit(Event::PreemptionPolling {
                    error: e.to_string(),
                }));
                self.schedule_poll(later(now, self.pace()), out);
            }
        }
    }

    /// Decides, given the current holder's record, whether to (re)record the request, make
    /// it forceful, give up, or poll again.
    fn preempt_step(&mut self, now: Instant, record: LeaseRecord, out: &mut Out<A, L>) {
        let options = &self.cfg.options;
        let owner = &self.cfg.owner;
        let pace = self.pace();
        let Some(p) = self.preempting.as_mut() else {
            return;
        };
        if !options.outranks(record.priority) {
            return self.finish_preempting(now, not_granted(&record), out);
        }
        if record.token != p.target {
            // Another lower-priority grant replaced the one we asked: ask its holder.
            p.target = record.token;
            p.started = now;
            p.deadline = wait_end(now, record.cleanup_timeout, p.give_up_at);
        }
        if let Some(q) = record.request.as_ref().filter(|q| &q.by != owner)
            && q.priority >= options.priority
        {
            let reply = Err(LeaseError::Overtaken {
                name: self.cfg.name.clone(),
                by: q.by.clone(),
                priority: q.priority,
            });
            return self.finish_preempting(now, reply, out);
        }
        let ours = record.request.as_ref().filter(|q| &q.by == owner);
        let due = now >= p.deadline;
        if due && !options.forceful {
            let reply = Err(LeaseError::CleanupTimedOut {
                name: self.cfg.name.clone(),
                holder: record.owner,
                cleanup_timeout: record.cleanup_timeout,
                waited: now.saturating_duration_since(p.started),
            });
            if ours.is_some() {
                let then = AfterWithdraw::Finish(reply);
                let call = Call::WithdrawPreemption {
                    token: record.token,
                };
                return self.call(Awaiting::Withdraw(then), call, out);
            }
            return self.finish_preempting(now, reply, out);
        }
        let next = later(now, pace);
        let poll_at = if due { next } else { next.min(p.deadline) };
        let forceful = due && options.forceful;
        if ours.is_none_or(|q| forceful && !q.forceful) {
            let awaiting = Awaiting::Request(Asked {
                holder: record.owner,
                forceful,
                asked_at: now,
                poll_at,
            });
            let call = Call::RequestPreemption {
                token: record.token,
                forceful,
            };
            return self.call(awaiting, call, out);
        }
        self.schedule_poll(poll_at, out);
    }

    /// The store's answer to the request `asked`.
    pub(super) fn request_answered(
        &mut self,
        now: Instant,
        asked: Asked,
        answer: Result<PreemptAnswer, LeaseError>,
        out: &mut Out<A, L>,
    ) {
        let Asked {
            holder,
            forceful,
            asked_at,
            poll_at,
        } = asked;
        match answer {
            Ok(PreemptAnswer::Recorded(_)) => {
                out.push(Effect::Emit(Event::PreemptionRecorded { holder, forceful }));
            }
            Ok(PreemptAnswer::Refused(current)) => {
                let other = current.request.as_ref().filter(|q| q.by != self.cfg.owner);
                let reply = match other {
                    Some(q) if self.cfg.options.outranks(current.priority) => {
                        Err(LeaseError::Overtaken {
                            name: self.cfg.name.clone(),
                            by: q.by.clone(),
                            priority: q.priority,
                        })
                    }
                    _ => not_granted(&current),
                };
                return self.finish_preempting(now, reply, out);
            }
            // The grant ended meanwhile: try to acquire at once.
            Ok(PreemptAnswer::Gone) => return self.schedule_poll(asked_at, out),
            Err(e) => out.push(Effect::Emit(Event::PreemptionPolling {
                error: e.to_string(),
            })),
        }
        self.schedule_poll(poll_at, out);
    }

    /// The awaited withdrawal was answered.
    pub(super) fn withdrawn(
        &mut self,
        now: Instant,
        then: AfterWithdraw<A, L>,
        out: &mut Out<A, L>,
    ) {
        match then {
            AfterWithdraw::Finish(reply) => self.finish_preempting(now, reply, out),
            AfterWithdraw::Release { reply, cancelled } => {
                self.release_grant(reply, cancelled, out)
            }
        }
    }

    fn schedule_poll(&mut self, at: Instant, out: &mut Out<A, L>) {
        if self.preempting.is_some() {
            out.push(Effect::Arm {
                timer: Timer::Poll,
                at,
            });
        }
    }

    /// Ends the preemption with `reply` to its callers; a grant also answers `Acquire`
    /// waiters, anything else lets a wanted acquire retry later.
    fn finish_preempting(&mut self, now: Instant, reply: AcquireReply, out: &mut Out<A, L>) {
        let Some(p) = self.preempting.take() else {
            return;
        };
        out.push(Effect::Disarm(Timer::Poll));
        for to in p.replies {
            out.push(Effect::ReplyAcquire {
                to,
                answer: reply.clone(),
            });
        }
        if matches!(reply, Ok((Acquired::Granted { .. }, _))) {
            self.wanted = false;
            self.disarm_retry(out);
            self.answer_waiters(&reply, out);
        } else if self.wanted {
            out.push(Effect::Emit(Event::Retrying {
                outcome: format!("{reply:?}"),
            }));
            self.arm_retry(now, out);
        }
    }

    /// A renewal of `generation` sent at `sent_at` succeeded and showed `request` pending:
    /// announce a new request, or the withdrawal of the announced one, while the grant is
    /// believed (never after its loss).
    pub(super) fn observe_request(
        &mut self,
        now: Instant,
        generation: u64,
        request: Option<PreemptionRequest>,
        sent_at: Instant,
        out: &mut Out<A, L>,
    ) {
        let n = &mut self.notices;
        if n.generation != generation {
            return;
        }
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
                    events.push(Event::PreemptionWithdrawn { token, by: old.by });
                }
            }
            Some(r) if n.shown.as_ref().is_some_and(|s| same(s, &r)) => n.shown = Some(r),
            Some(r) => {
                if let Some(old) = n.shown.replace(r.clone()) {
                    events.push(Event::PreemptionWithdrawn { token, by: old.by });
                }
                let since = n.clean_sent_at.unwrap_or(sent_at);
                events.push(Event::PreemptionRequested {
                    token,
                    request: r,
                    cleanup_deadline: later(since, self.cfg.options.cleanup_timeout),
                });
            }
        }
        let believed = self
            .belief
            .current(now)
            .is_some_and(|h| h.generation == generation);
        if believed {
            out.extend(events.into_iter().map(Effect::Emit));
        }
    }
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
    // The holder's cleanup timeout comes from the store, written by another process.
    let end = later(now, cleanup);
    give_up_at.map_or(end, |g| end.min(g))
}
