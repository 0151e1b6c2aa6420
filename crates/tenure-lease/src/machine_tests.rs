//! The LeaseActor's machine driven directly: explicit `now` values, no runtime, no actors,
//! no sleeps. Table tests of the contract's scenarios, then random input sequences checked
//! against the contract's invariants.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use crate::machine::{
    Call, Config, Effect, Event, Input, Machine, Outcome, Phase, ReleaseScope, Timer, WAKE_EARLY,
};
use crate::store::{AcquireOutcome, LeaseRecord, PreemptAnswer, PreemptionRequest, Renewal};
use crate::validity::LostReason;
use crate::{AcquireOptions, Acquired, FencingToken, LeaseError};

type M = Machine<u32, u32>;
type Fx = Vec<Effect<u32, u32>>;

/// ttl 10 s, margin 1 s: a grant is believed 9 s after its request was sent.
const VALIDITY: Duration = Duration::from_secs(9);
const RETRY: Duration = Duration::from_secs(2);

const T3: FencingToken = FencingToken::new(3);
const T7: FencingToken = FencingToken::new(7);
const T8: FencingToken = FencingToken::new(8);

fn config() -> Config {
    Config {
        name: "a".into(),
        owner: "me".into(),
        validity: VALIDITY,
        stop_budget: Duration::ZERO,
        retry_interval: RETRY,
        options: AcquireOptions::default(),
        fair: false,
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A machine and the instant its story starts at.
struct Story {
    m: M,
    t0: Instant,
}

impl Story {
    fn new(config: Config) -> Self {
        Story {
            m: Machine::new(config),
            t0: Instant::now(),
        }
    }

    fn at(&self, millis: u64) -> Instant {
        self.t0 + ms(millis)
    }

    fn feed(&mut self, millis: u64, input: Input<u32, u32>) -> Fx {
        let now = self.at(millis);
        self.m.handle(now, input)
    }

    fn deadline(&mut self, millis: u64) -> Vec<Event> {
        let now = self.at(millis);
        self.m.deadline(now)
    }

    fn answer(&mut self, millis: u64, outcome: Outcome) -> Fx {
        self.feed(millis, Input::Answered(outcome))
    }

    /// Acquired `token` (generation `generation`) by a `TryAcquire` sent at `sent` and
    /// answered at `answered`.
    fn granted(&mut self, sent: u64, answered: u64, token: u64) -> Fx {
        let fx = self.feed(sent, Input::TryAcquire { reply: 0 });
        assert!(matches!(calls(&fx)[..], [Call::Acquire { .. }]), "{fx:?}");
        self.answer(answered, acquired(token))
    }
}

fn acquired(token: u64) -> Outcome {
    Outcome::Acquire(Ok(AcquireOutcome::Granted(record("me", token, 0))))
}

fn held_by(owner: &str, token: u64, priority: u64) -> Outcome {
    Outcome::Acquire(Ok(AcquireOutcome::Held(record(owner, token, priority))))
}

fn record(owner: &str, token: u64, priority: u64) -> LeaseRecord {
    LeaseRecord {
        name: "a".into(),
        owner: owner.into(),
        token: FencingToken::new(token),
        priority,
        // A live grant of the other owner: its expiry is far beyond any retry.
        expires_in: Duration::from_secs(60),
        ..LeaseRecord::default()
    }
}

fn timeout(operation: &'static str) -> LeaseError {
    LeaseError::Timeout {
        name: "a".into(),
        operation,
        timeout: ms(500),
    }
}

fn renewed(sent_at: Instant) -> Option<(Instant, Result<Renewal, LeaseError>)> {
    Some((sent_at, Ok(Renewal::Renewed { request: None })))
}

fn events(fx: &Fx) -> Vec<Event> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Emit(ev) => Some(ev.clone()),
            _ => None,
        })
        .collect()
}

fn calls(fx: &Fx) -> Vec<Call> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Call(c) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

fn lost(fx: &[Event]) -> Vec<(FencingToken, LostReason)> {
    fx.iter()
        .filter_map(|e| match e {
            Event::Lost { token, reason, .. } => Some((*token, *reason)),
            _ => None,
        })
        .collect()
}

/// An acquire answer, its error as text.
type AcquireText = Result<(Acquired, Option<u64>), String>;

fn acquire_replies(fx: &Fx) -> Vec<(u32, AcquireText)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::ReplyAcquire { to, answer } => {
                Some((*to, answer.clone().map_err(|e| e.to_string())))
            }
            _ => None,
        })
        .collect()
}

fn granted_reply(token: u64, generation: u64) -> AcquireText {
    Ok((
        Acquired::Granted {
            token: FencingToken::new(token),
        },
        Some(generation),
    ))
}

#[test]
fn grant_renewals_then_failing_renewals_suspend_and_the_deadline_loses_exactly_once() {
    let mut s = Story::new(config());
    assert_eq!(s.m.phase(s.at(0)), Phase::Idle);
    let fx = s.feed(0, Input::TryAcquire { reply: 1 });
    assert_eq!(events(&fx), [Event::AcquireInvoked]);
    assert_eq!(calls(&fx), [Call::Acquire { instance: 1 }]);
    assert_eq!(s.m.phase(s.at(0)), Phase::Acquiring);

    let fx = s.answer(100, acquired(7));
    assert_eq!(
        events(&fx),
        [Event::Granted {
            generation: 1,
            token: T7,
            // From the send instant, not the answer's.
            deadline: s.at(9000),
        }]
    );
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::StartWatchdog { generation: 1 }))
    );
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::ArmRenewal { generation: 1 }))
    );
    assert_eq!(acquire_replies(&fx), [(1, granted_reply(7, 1))]);
    assert_eq!(s.m.phase(s.at(100)), Phase::Held);
    assert_eq!(s.m.watchdog_wake(1), Some(s.at(9000) - WAKE_EARLY));

    // A renewal sent at 1 s moves the deadline to 10 s.
    let fx = s.feed(1000, Input::RenewDue { generation: 1 });
    assert!(matches!(
        fx[..],
        [
            Effect::Renew {
                generation: 1,
                token: T7
            },
            Effect::ArmRenewal { generation: 1 }
        ]
    ));
    assert_eq!(s.m.phase(s.at(1000)), Phase::Renewing);
    let fx = s.feed(
        1200,
        Input::Renewed {
            generation: 1,
            answer: renewed(s.at(1000)),
        },
    );
    assert_eq!(
        events(&fx),
        [Event::Renewed {
            token: T7,
            deadline: s.at(10_000)
        }]
    );
    assert_eq!(s.m.watchdog_wake(1), Some(s.at(10_000) - WAKE_EARLY));

    // Renewals time out: suspended once, still held until the deadline.
    for (due, answered) in [(2000, 2500), (3000, 3500), (4000, 4500)] {
        let fx = s.feed(due, Input::RenewDue { generation: 1 });
        assert!(matches!(fx[0], Effect::Renew { token: T7, .. }), "{fx:?}");
        let answer = Some((s.at(due), Err(timeout("renew"))));
        let fx = s.feed(
            answered,
            Input::Renewed {
                generation: 1,
                answer,
            },
        );
        let evs = events(&fx);
        assert!(
            matches!(
                evs[0],
                Event::StoreError {
                    operation: "renew",
                    ..
                }
            ),
            "{evs:?}"
        );
        let suspended = evs
            .iter()
            .filter(|e| matches!(e, Event::Suspended { token: T7, .. }));
        assert_eq!(suspended.count(), usize::from(due == 2000), "{evs:?}");
        assert_eq!(s.m.phase(s.at(answered)), Phase::Suspended);
        assert!(s.m.current(s.at(answered)).is_some());
    }

    // Not believed from the deadline on, even before the watchdog announces it.
    assert!(s.m.current(s.at(9999)).is_some());
    assert!(s.m.current(s.at(10_000)).is_none());
    assert!(s.deadline(9000).is_empty(), "too early");
    let evs = s.deadline(10_000 - 2);
    assert_eq!(
        evs,
        [Event::Lost {
            token: T7,
            reason: LostReason::Expired,
            suspended: true
        }]
    );
    assert_eq!(s.m.phase(s.at(10_000)), Phase::Lost);
    assert_eq!(s.m.watchdog_wake(1), None, "the watchdog ends");
    // Nothing revives it or announces it again: not the watchdog, not a late answer to a
    // renewal sent in time, not the renewal timer.
    assert!(s.deadline(10_500).is_empty());
    let fx = s.feed(
        10_600,
        Input::Renewed {
            generation: 1,
            answer: renewed(s.at(9500)),
        },
    );
    assert!(fx.is_empty(), "{fx:?}");
    assert!(s.feed(11_000, Input::RenewDue { generation: 1 }).is_empty());
    assert!(s.m.current(s.at(10_600)).is_none());
}

#[test]
fn an_acquire_answer_after_the_local_deadline_is_released_not_believed() {
    let mut s = Story::new(config());
    s.feed(0, Input::TryAcquire { reply: 1 });
    let fx = s.answer(9000, acquired(7));
    assert!(events(&fx).is_empty(), "no grant announced: {fx:?}");
    assert_eq!(calls(&fx), [Call::Release { token: Some(T7) }]);
    assert!(s.m.current(s.at(9000)).is_none());
    let fx = s.answer(9100, Outcome::Release(Ok(true)));
    let replies = acquire_replies(&fx);
    assert!(
        matches!(&replies[..], [(1, Err(e))] if e.contains("acquire")),
        "{replies:?}"
    );
    assert!(s.deadline(20_000).is_empty(), "never lost: never granted");

    // One millisecond earlier it is believed, for that millisecond.
    let mut s = Story::new(config());
    let fx = s.granted(0, 8999, 7);
    assert!(matches!(
        events(&fx)[..],
        [Event::Granted { token: T7, .. }]
    ));
    assert_eq!(
        s.deadline(8999),
        [Event::Lost {
            token: T7,
            reason: LostReason::Expired,
            suspended: false
        }]
    );
}

#[test]
fn release_while_renewing_gives_up_at_once_and_a_late_renewal_changes_nothing() {
    let mut s = Story::new(config());
    s.granted(0, 50, 7);
    s.feed(1000, Input::RenewDue { generation: 1 });
    let fx = s.feed(
        1100,
        Input::Release {
            reply: 9,
            scope: ReleaseScope::Any,
        },
    );
    assert_eq!(
        events(&fx),
        [Event::Released {
            token: T7,
            suspended: false
        }]
    );
    assert!(fx.iter().any(|e| matches!(e, Effect::DisarmRenewal)));
    assert!(fx.iter().any(|e| matches!(e, Effect::StopWatchdog)));
    assert_eq!(calls(&fx), [Call::Release { token: Some(T7) }]);
    assert!(
        matches!(fx.last(), Some(Effect::Call(_))),
        "the call comes last"
    );
    assert_eq!(s.m.phase(s.at(1100)), Phase::Releasing);
    assert!(
        s.m.current(s.at(1100)).is_none(),
        "given up before the store answers"
    );

    let fx = s.answer(1200, Outcome::Release(Ok(true)));
    assert!(matches!(
        fx.last(),
        Some(Effect::ReplyRelease {
            to: 9,
            answer: Ok(true)
        })
    ));
    // The renewal sent before the release is answered after it.
    let fx = s.feed(
        1300,
        Input::Renewed {
            generation: 1,
            answer: renewed(s.at(1000)),
        },
    );
    assert!(fx.is_empty(), "{fx:?}");
    assert!(s.m.current(s.at(1300)).is_none());
    assert_eq!(s.m.phase(s.at(1300)), Phase::Idle);
    // Nothing is held any more, and nothing of ours can be in the store.
    let fx = s.feed(
        1400,
        Input::Release {
            reply: 10,
            scope: ReleaseScope::Any,
        },
    );
    assert!(
        matches!(
            fx[..],
            [
                ..,
                Effect::ReplyRelease {
                    to: 10,
                    answer: Ok(false)
                }
            ]
        ),
        "{fx:?}"
    );
    assert!(calls(&fx).is_empty());
}

#[test]
fn a_release_the_store_failed_is_sent_again_with_its_token_and_answered_by_the_last_try() {
    let error = || Event::StoreError {
        operation: "release",
        error: timeout("release").to_string(),
    };
    // Failed once, then released: the caller hears only the retry's answer.
    let mut s = Story::new(config());
    s.granted(0, 50, 7);
    s.feed(
        100,
        Input::Release {
            reply: 9,
            scope: ReleaseScope::Any,
        },
    );
    let fx = s.answer(200, Outcome::Release(Err(timeout("release"))));
    assert_eq!(events(&fx), [error()]);
    assert_eq!(calls(&fx), [Call::Release { token: Some(T7) }]);
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::ReplyRelease { .. })),
        "{fx:?}"
    );
    let fx = s.answer(250, Outcome::Release(Ok(true)));
    assert_eq!(
        events(&fx),
        [Event::ReleaseAnswered {
            token: Some(T7),
            released: Some(true),
        }]
    );
    assert!(
        matches!(
            fx[..],
            [
                ..,
                Effect::ReplyRelease {
                    to: 9,
                    answer: Ok(true)
                }
            ]
        ),
        "{fx:?}"
    );
}

#[test]
fn a_release_the_store_failed_every_try_is_answered_unknown_and_each_error_named_once() {
    let mut s = Story::new(config());
    s.granted(0, 50, 7);
    s.feed(
        100,
        Input::Release {
            reply: 9,
            scope: ReleaseScope::Any,
        },
    );
    for at in [200, 300] {
        let fx = s.answer(at, Outcome::Release(Err(timeout("release"))));
        assert_eq!(calls(&fx), [Call::Release { token: Some(T7) }], "{fx:?}");
    }
    let fx = s.answer(400, Outcome::Release(Err(timeout("release"))));
    assert!(calls(&fx).is_empty(), "three tries in all: {fx:?}");
    assert_eq!(
        events(&fx),
        [
            Event::StoreError {
                operation: "release",
                error: timeout("release").to_string(),
            },
            Event::ReleaseAnswered {
                token: Some(T7),
                released: None,
            },
        ]
    );
    assert!(
        matches!(
            fx.last(),
            Some(Effect::ReplyRelease {
                to: 9,
                answer: Err(LeaseError::Timeout { .. })
            })
        ),
        "{fx:?}"
    );
    let mut s = Story::new(config());
    s.granted(0, 50, 7);
    s.feed(
        100,
        Input::Release {
            reply: 9,
            scope: ReleaseScope::Any,
        },
    );
    let fx = s.answer(200, Outcome::Release(Ok(true)));
    assert_eq!(
        events(&fx),
        [Event::ReleaseAnswered {
            token: Some(T7),
            released: Some(true),
        }]
    );
}

#[test]
fn a_clock_jump_past_the_deadline_loses_the_grant_once() {
    // The watchdog wakes after a host suspend.
    let mut s = Story::new(config());
    s.granted(0, 10, 7);
    assert!(
        s.m.current(s.at(60_000)).is_none(),
        "check_lease is right at once"
    );
    assert_eq!(
        s.deadline(60_000),
        [Event::Lost {
            token: T7,
            reason: LostReason::Expired,
            suspended: false
        }]
    );
    assert!(s.deadline(60_001).is_empty());

    // A renewal answered after the jump, sent before it, is not believed: the answer
    // itself announces the loss if the watchdog has not yet.
    let mut s = Story::new(config());
    s.granted(0, 10, 7);
    s.feed(1000, Input::RenewDue { generation: 1 });
    let fx = s.feed(
        61_000,
        Input::Renewed {
            generation: 1,
            answer: renewed(s.at(1000)),
        },
    );
    assert_eq!(lost(&events(&fx)), [(T7, LostReason::Expired)], "{fx:?}");
    assert!(s.deadline(61_000).is_empty());
    assert!(s.feed(61_000, Input::RenewDue { generation: 1 }).is_empty());
}

#[test]
fn a_reentrant_acquire_returns_the_same_token_and_announces_nothing() {
    let mut s = Story::new(config());
    s.granted(0, 10, 7);
    // `Acquire` while held: answered at once, no store call.
    let fx = s.feed(500, Input::Acquire { reply: Some(2) });
    assert_eq!(acquire_replies(&fx), [(2, granted_reply(7, 1))]);
    assert!(calls(&fx).is_empty());
    // `TryAcquire` asks the store as the same instance and keeps the generation; the
    // deadline moves to the new send instant's.
    let fx = s.feed(3000, Input::TryAcquire { reply: 3 });
    assert_eq!(calls(&fx), [Call::Acquire { instance: 1 }]);
    let fx = s.answer(3050, acquired(7));
    assert_eq!(events(&fx), []);
    assert_eq!(acquire_replies(&fx), [(3, granted_reply(7, 1))]);
    assert_eq!(
        s.m.current(s.at(3050)).map(|h| h.deadline),
        Some(s.at(12_000))
    );
}

#[test]
fn after_a_loss_the_ended_instance_is_released_and_the_next_attempt_is_a_new_instance() {
    let mut s = Story::new(config());
    s.granted(0, 10, 7);
    s.deadline(9000);
    let fx = s.feed(9500, Input::TryAcquire { reply: 2 });
    assert_eq!(calls(&fx), [Call::Release { token: None }]);
    let fx = s.answer(9600, Outcome::Release(Ok(true)));
    assert_eq!(events(&fx), [Event::AcquireInvoked]);
    assert_eq!(calls(&fx), [Call::Acquire { instance: 2 }]);
    let fx = s.answer(9700, acquired(8));
    assert!(matches!(
        events(&fx)[..],
        [Event::Granted {
            generation: 2,
            token: T8,
            ..
        }]
    ));
}

/// A reentrant acquire sent while the grant was believed and answered after its loss was
/// announced: the answer is for an instance whose belief ended, so it is never believed,
/// whether the store extended the lost grant (same token) or granted the instance anew.
/// Its grant is released and the next instance asks: the loss is followed by a grant
/// with a higher token, never by the lost token again.
#[test]
fn a_reentrant_acquire_answered_after_the_loss_never_brings_the_lost_token_back() {
    for (answered_token, next_token) in [(7, 8), (8, 9)] {
        let mut s = Story::new(config());
        s.granted(0, 10, 7);
        let fx = s.feed(3000, Input::TryAcquire { reply: 2 });
        assert_eq!(calls(&fx), [Call::Acquire { instance: 1 }]);
        // No renewal succeeded: the watchdog announces the loss while the acquire is out.
        assert_eq!(
            s.deadline(9000),
            [Event::Lost {
                token: T7,
                reason: LostReason::Expired,
                suspended: false
            }]
        );
        // The answer would be believed until 12 s (sent at 3 s), but its instance ended.
        let fx = s.answer(9100, acquired(answered_token));
        assert_eq!(events(&fx), [], "nothing granted: {fx:?}");
        assert_eq!(
            calls(&fx),
            [Call::Release {
                token: Some(FencingToken::new(answered_token))
            }]
        );
        assert!(acquire_replies(&fx).is_empty(), "the caller waits: {fx:?}");
        assert!(s.m.current(s.at(9100)).is_none());
        let fx = s.answer(9200, Outcome::Release(Ok(true)));
        assert_eq!(events(&fx), [Event::AcquireInvoked]);
        assert_eq!(calls(&fx), [Call::Acquire { instance: 2 }]);
        let fx = s.answer(9300, acquired(next_token));
        assert_eq!(
            events(&fx),
            [Event::Granted {
                generation: 2,
                token: FencingToken::new(next_token),
                deadline: s.at(18_200),
            }]
        );
        assert_eq!(acquire_replies(&fx), [(2, granted_reply(next_token, 2))]);
    }
}

#[test]
fn an_unknown_acquire_outcome_is_maybe_granted() {
    let mut s = Story::new(config());
    s.feed(0, Input::TryAcquire { reply: 1 });
    let fx = s.answer(500, Outcome::Acquire(Err(timeout("acquire"))));
    assert!(matches!(
        events(&fx)[..],
        [Event::StoreError {
            operation: "acquire",
            ..
        }]
    ));
    assert!(matches!(&acquire_replies(&fx)[..], [(1, Err(_))]));
    assert!(s.m.current(s.at(500)).is_none(), "never believed");
    // Release looks for a grant of ours in the store instead of answering "nothing held".
    let fx = s.feed(
        600,
        Input::Release {
            reply: 2,
            scope: ReleaseScope::Any,
        },
    );
    assert_eq!(calls(&fx), [Call::Release { token: None }]);
    let fx = s.answer(700, Outcome::Release(Ok(true)));
    assert!(matches!(
        fx.last(),
        Some(Effect::ReplyRelease {
            to: 2,
            answer: Ok(true)
        })
    ));
    // A certain "held by another owner" leaves nothing of ours.
    s.feed(800, Input::TryAcquire { reply: 3 });
    s.answer(900, held_by("other", 3, 0));
    let fx = s.feed(
        1000,
        Input::Release {
            reply: 4,
            scope: ReleaseScope::Any,
        },
    );
    assert!(matches!(
        fx.last(),
        Some(Effect::ReplyRelease {
            to: 4,
            answer: Ok(false)
        })
    ));
}

#[test]
fn keeps_trying_at_the_retry_pace_until_granted_then_answers_every_waiter() {
    let mut s = Story::new(config());
    s.feed(0, Input::Acquire { reply: Some(1) });
    let fx = s.answer(100, held_by("other", 3, 0));
    assert_eq!(
        events(&fx)[0],
        Event::NotGranted {
            holder: "other".into()
        }
    );
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::Arm { timer: Timer::Retry, at } if *at == s.at(2100)))
    );
    // A second waiter joins; no second attempt while the retry is pending.
    let fx = s.feed(200, Input::Acquire { reply: Some(2) });
    assert!(fx.is_empty(), "{fx:?}");
    // A faster pace reschedules the pending retry.
    let fx = s.feed(300, Input::RetryPace(Some(ms(200))));
    assert!(matches!(fx[..], [Effect::Arm { timer: Timer::Retry, at }] if at == s.at(500)));
    let fx = s.feed(500, Input::Timer(Timer::Retry));
    assert_eq!(calls(&fx), [Call::Acquire { instance: 1 }]);
    let fx = s.answer(600, acquired(4));
    assert_eq!(
        acquire_replies(&fx),
        [(1, granted_reply(4, 1)), (2, granted_reply(4, 1))]
    );
    // Granted: no more retries even if a stale timer fires.
    assert!(s.feed(700, Input::Timer(Timer::Retry)).is_empty());
}

#[test]
fn a_grant_replaced_behind_our_back_is_lost_before_the_new_one_is_granted() {
    let mut s = Story::new(config());
    s.granted(0, 10, 7);
    s.feed(2000, Input::TryAcquire { reply: 2 });
    let fx = s.answer(2010, acquired(8));
    assert_eq!(
        events(&fx),
        [
            Event::Lost {
                token: T7,
                reason: LostReason::NotHeld,
                suspended: false
            },
            Event::Granted {
                generation: 2,
                token: T8,
                deadline: s.at(11_000)
            },
        ]
    );
    // The store saying another owner holds it ends the belief too.
    s.feed(3000, Input::TryAcquire { reply: 3 });
    let fx = s.answer(3010, held_by("other", 9, 0));
    assert_eq!(lost(&events(&fx)), [(T8, LostReason::NotHeld)]);
    // A renewal answer "not held" for a grant already lost announces nothing more.
    let fx = s.feed(
        3100,
        Input::Renewed {
            generation: 2,
            answer: Some((s.at(3000), Ok(Renewal::NotHeld))),
        },
    );
    assert!(events(&fx).is_empty());
}

#[test]
fn a_write_refused_for_the_grant_believed_ends_the_belief_at_once() {
    let mut s = Story::new(config());
    s.granted(0, 10, 7);
    // Another token's refusal (a grant lost before, or never held) changes nothing.
    assert!(s.feed(100, Input::NotCurrent { token: T3 }).is_empty());
    assert!(s.m.current(s.at(100)).is_some());
    // The store refused a write under the grant believed: lost at once, not at the next
    // renewal or the deadline.
    let fx = s.feed(200, Input::NotCurrent { token: T7 });
    assert_eq!(lost(&events(&fx)), [(T7, LostReason::NotHeld)]);
    assert!(s.m.current(s.at(200)).is_none());
    assert_eq!(s.m.watchdog_wake(1), None, "the watchdog ends");
    // Nothing announces it again: another refusal, the renewal timer, the deadline.
    assert!(s.feed(300, Input::NotCurrent { token: T7 }).is_empty());
    assert!(s.feed(1000, Input::RenewDue { generation: 1 }).is_empty());
    assert!(s.deadline(9000).is_empty());
}

#[test]
fn a_stop_budget_ends_the_belief_early_and_keeps_the_deadline() {
    let mut s = Story::new(Config {
        stop_budget: Duration::from_secs(3),
        ..config()
    });
    let fx = s.granted(0, 10, 7);
    assert!(matches!(events(&fx)[..], [Event::Granted { deadline, .. }] if deadline == s.at(9000)));
    assert_eq!(s.m.watchdog_wake(1), Some(s.at(6000) - WAKE_EARLY));
    assert!(s.m.current(s.at(5999)).is_some());
    assert!(s.m.current(s.at(6000)).is_none());
}

#[test]
fn commands_that_arrive_while_a_call_is_awaited_are_handled_after_its_answer() {
    let mut s = Story::new(config());
    s.feed(0, Input::TryAcquire { reply: 1 });
    assert!(s.m.awaiting());
    assert!(
        s.feed(
            10,
            Input::Release {
                reply: 2,
                scope: ReleaseScope::Any
            }
        )
        .is_empty()
    );
    let fx = s.answer(20, acquired(7));
    let evs = events(&fx);
    assert!(
        matches!(
            evs[..],
            [
                Event::Granted { token: T7, .. },
                Event::Released { token: T7, .. }
            ]
        ),
        "{evs:?}"
    );
    assert_eq!(acquire_replies(&fx), [(1, granted_reply(7, 1))]);
    assert_eq!(calls(&fx), [Call::Release { token: Some(T7) }]);
}

#[test]
fn a_release_that_waited_behind_an_attempt_keeps_the_grant_its_caller_did_not_see() {
    let mut s = Story::new(config());
    s.feed(0, Input::Acquire { reply: None });
    assert!(s.m.awaiting());
    // The caller had seen no grant when it asked (its call then timed out and it moved on).
    let scope = ReleaseScope::Seen(None);
    assert!(s.feed(10, Input::Release { reply: 2, scope }).is_empty());
    let fx = s.answer(20, acquired(7));
    let evs = events(&fx);
    assert!(
        matches!(evs[..], [Event::Granted { token: T7, .. }]),
        "the grant is announced and kept: {evs:?}"
    );
    assert!(calls(&fx).is_empty(), "nothing released: {fx:?}");
    assert!(
        fx.iter().any(|e| matches!(
            e,
            Effect::ReplyRelease {
                to: 2,
                answer: Ok(false)
            }
        )),
        "{fx:?}"
    );
    assert_eq!(s.m.held().map(|h| h.token), Some(T7));
    // Once seen, a release in its scope ends it.
    let fx = s.feed(
        30,
        Input::Release {
            reply: 3,
            scope: ReleaseScope::Seen(Some(T7)),
        },
    );
    assert!(
        matches!(events(&fx)[..], [Event::Released { token: T7, .. }]),
        "{fx:?}"
    );
    assert_eq!(calls(&fx), [Call::Release { token: Some(T7) }]);
}

fn detached(fx: &Fx) -> Vec<Call> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Detach(c) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn an_abandoned_machine_cleans_up_in_the_background_what_may_be_ours() {
    // Never acquired: nothing to clean up.
    let mut s = Story::new(config());
    assert!(s.feed(0, Input::Abandon).is_empty());
    // Held: given up, and its grant released by token.
    let mut s = Story::new(config());
    s.granted(0, 10, 7);
    let fx = s.feed(100, Input::Abandon);
    assert_eq!(
        events(&fx),
        [Event::Released {
            token: T7,
            suspended: false
        }]
    );
    assert_eq!(detached(&fx), [Call::Release { token: Some(T7) }]);
    assert!(s.m.current(s.at(100)).is_none());
    // Gone while an acquire was in flight: maybe granted, so whatever grant of ours the
    // store holds is released.
    let mut s = Story::new(config());
    s.feed(0, Input::TryAcquire { reply: 1 });
    let fx = s.feed(10, Input::Abandon);
    assert_eq!(detached(&fx), [Call::Release { token: None }]);
    assert!(
        s.answer(20, acquired(7)).is_empty(),
        "a late answer changes nothing"
    );
    assert!(s.m.current(s.at(20)).is_none());
    // Waiting for a lower-priority holder: the request is withdrawn.
    let mut s = Story::new(Config {
        options: AcquireOptions {
            priority: 5,
            ..AcquireOptions::default()
        },
        ..config()
    });
    let mut holder = record("h", 3, 1);
    holder.cleanup_timeout = Duration::from_secs(5);
    s.feed(0, Input::TryAcquire { reply: 1 });
    let fx = s.answer(
        10,
        Outcome::Acquire(Ok(AcquireOutcome::Held(holder.clone()))),
    );
    assert_eq!(
        calls(&fx),
        [Call::RequestPreemption {
            token: T3,
            forceful: false
        }]
    );
    s.answer(20, Outcome::Preempt(Ok(PreemptAnswer::Recorded(holder))));
    let fx = s.feed(30, Input::Abandon);
    assert_eq!(detached(&fx), [Call::WithdrawPreemption { token: T3 }]);
}

fn request(by: &str, priority: u64, forceful: bool) -> PreemptionRequest {
    PreemptionRequest {
        by: by.into(),
        instance: format!("{by}-1"),
        priority,
        forceful,
        note: None,
    }
}

#[test]
fn the_holder_announces_a_request_once_and_its_withdrawal_and_a_forceful_one_loses() {
    let mut s = Story::new(Config {
        options: AcquireOptions {
            cleanup_timeout: Duration::from_secs(5),
            ..AcquireOptions::default()
        },
        ..config()
    });
    s.granted(0, 10, 7);
    let shown = |sent: Instant, r: Option<PreemptionRequest>| {
        Some((sent, Ok(Renewal::Renewed { request: r })))
    };
    s.feed(1000, Input::RenewDue { generation: 1 });
    let fx = s.feed(
        1100,
        Input::Renewed {
            generation: 1,
            answer: shown(s.at(1000), None),
        },
    );
    assert_eq!(events(&fx).len(), 1, "renewed only");
    s.feed(2000, Input::RenewDue { generation: 1 });
    let fx = s.feed(
        2100,
        Input::Renewed {
            generation: 1,
            answer: shown(s.at(2000), Some(request("r", 3, false))),
        },
    );
    // The cleanup deadline counts from the last renewal that showed no request.
    assert_eq!(
        events(&fx)[1],
        Event::PreemptionRequested {
            token: T7,
            request: request("r", 3, false),
            cleanup_deadline: s.at(6000),
        }
    );
    s.feed(3000, Input::RenewDue { generation: 1 });
    let fx = s.feed(
        3100,
        Input::Renewed {
            generation: 1,
            answer: shown(s.at(3000), Some(request("r", 3, false))),
        },
    );
    assert_eq!(events(&fx).len(), 1, "announced once");
    s.feed(4000, Input::RenewDue { generation: 1 });
    let fx = s.feed(
        4100,
        Input::Renewed {
            generation: 1,
            answer: shown(s.at(4000), None),
        },
    );
    assert_eq!(
        events(&fx)[1],
        Event::PreemptionWithdrawn {
            token: T7,
            by: "r".into()
        }
    );
    s.feed(5000, Input::RenewDue { generation: 1 });
    let refused = Some((s.at(5000), Ok(Renewal::Refused(request("r", 3, true)))));
    let fx = s.feed(
        5100,
        Input::Renewed {
            generation: 1,
            answer: refused,
        },
    );
    let evs = events(&fx);
    assert!(
        matches!(evs[0], Event::PreemptionRequested { .. }),
        "{evs:?}"
    );
    assert_eq!(lost(&evs), [(T7, LostReason::Preempted)]);
}

#[test]
fn a_requester_waits_for_the_cleanup_then_withdraws_and_gives_up() {
    let mut s = Story::new(Config {
        options: AcquireOptions {
            priority: 5,
            ..AcquireOptions::default()
        },
        retry_interval: ms(200),
        ..config()
    });
    s.feed(0, Input::TryAcquire { reply: 1 });
    let mut holder = record("h", 3, 1);
    holder.cleanup_timeout = Duration::from_secs(1);
    let fx = s.answer(
        10,
        Outcome::Acquire(Ok(AcquireOutcome::Held(holder.clone()))),
    );
    assert!(
        acquire_replies(&fx).is_empty(),
        "it waits instead of answering"
    );
    assert!(events(&fx).iter().any(|e| matches!(
        e,
        Event::PreemptionStarted {
            holder_priority: 1,
            ..
        }
    )));
    assert_eq!(
        calls(&fx),
        [Call::RequestPreemption {
            token: T3,
            forceful: false
        }]
    );
    holder.request = Some(request("me", 5, false));
    let fx = s.answer(
        20,
        Outcome::Preempt(Ok(PreemptAnswer::Recorded(holder.clone()))),
    );
    assert!(matches!(fx.last(), Some(Effect::Arm { timer: Timer::Poll, at }) if *at == s.at(210)));
    // Polls until the holder's cleanup timeout (1 s from 10 ms) is over.
    let mut t = 210;
    loop {
        let fx = s.feed(t, Input::Timer(Timer::Poll));
        assert_eq!(calls(&fx), [Call::Acquire { instance: 1 }]);
        let fx = s.answer(
            t,
            Outcome::Acquire(Ok(AcquireOutcome::Held(holder.clone()))),
        );
        if let [Call::WithdrawPreemption { token: T3 }] = calls(&fx)[..] {
            assert_eq!(t, 1010, "gave up at the cleanup deadline");
            break;
        }
        let next = fx.iter().find_map(|e| match e {
            Effect::Arm {
                timer: Timer::Poll,
                at,
            } => Some(*at),
            _ => None,
        });
        t = u64::try_from((next.expect("polls on") - s.t0).as_millis()).unwrap();
        assert!(t <= 1010);
    }
    let fx = s.answer(1020, Outcome::Withdrawn);
    let replies = acquire_replies(&fx);
    assert!(
        matches!(&replies[..], [(1, Err(e))] if e.contains("clean")),
        "{replies:?}"
    );
    assert!(fx.iter().any(|e| matches!(e, Effect::Disarm(Timer::Poll))));
}

// --- random input sequences against the contract's invariants ---

/// A small deterministic generator (xorshift64*): the same seed gives the same sequence.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A driver of the machine for one random run: it plays the store, the timers, the
/// renewal batcher and the watchdog, and checks every step's effects.
struct Sim {
    m: M,
    now: Instant,
    rng: Rng,
    /// The awaited call.
    call: Option<Call>,
    /// Renewals in flight: (generation, sent at).
    renewals: Vec<(u64, Instant)>,
    retry_at: Option<Instant>,
    poll_at: Option<Instant>,
    renew_due: Option<u64>,
    watchdog: Option<u64>,
    /// Instants requests were sent at: every deadline counts from one of them.
    sent: BTreeSet<Instant>,
    /// The store's last token, and the grant it holds for us: (instance, token).
    store_token: u64,
    ours: Option<(u64, u64)>,
    /// The grant (generation, token) announced and not yet lost or released.
    open: Option<(u64, FencingToken)>,
    last_generation: u64,
    last_token: FencingToken,
    /// The highest token of a grant whose loss or release was announced.
    ended: FencingToken,
    /// Losses announced per generation.
    losses: HashMap<u64, u32>,
    answered: BTreeSet<u32>,
    next_caller: u32,
    stop_budget: Duration,
}

impl Sim {
    fn new(seed: u64) -> Self {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let stop_budget = ms(rng.below(3) * 1000);
        let t0 = Instant::now();
        Sim {
            m: Machine::new(Config {
                stop_budget,
                options: AcquireOptions {
                    priority: rng.below(3),
                    cleanup_timeout: ms(rng.below(3) * 1000),
                    waiting_timeout: rng.chance(30).then(|| ms(1500)),
                    forceful: rng.chance(30),
                    emergency: false,
                },
                fair: rng.chance(50),
                ..config()
            }),
            now: t0,
            rng,
            call: None,
            renewals: Vec::new(),
            retry_at: None,
            poll_at: None,
            renew_due: None,
            watchdog: None,
            sent: BTreeSet::new(),
            store_token: 0,
            ours: None,
            open: None,
            last_generation: 0,
            last_token: FencingToken::new(0),
            ended: FencingToken::new(0),
            losses: HashMap::new(),
            answered: BTreeSet::new(),
            next_caller: 0,
            stop_budget,
        }
    }

    fn caller(&mut self) -> u32 {
        self.next_caller += 1;
        self.next_caller
    }

    /// Moves the clock on by `d`, letting the watchdog fire on its way (as its task would).
    fn advance(&mut self, d: Duration) {
        let until = self.now + d;
        while let Some(wake) = self.watchdog.and_then(|g| self.m.watchdog_wake(g)) {
            if wake > until {
                break;
            }
            self.now = self.now.max(wake);
            let evs = self.m.deadline(self.now);
            self.check_events(&evs);
        }
        self.now = until;
    }

    fn feed(&mut self, input: Input<u32, u32>) {
        let renewal = matches!(input, Input::RenewDue { .. } | Input::Renewed { .. });
        let fx = self.m.handle(self.now, input);
        let evs = events(&fx);
        self.check_events(&evs);
        let calls = fx.iter().filter(|e| matches!(e, Effect::Call(_))).count();
        assert!(calls <= 1, "one call per step: {fx:?}");
        assert!(!renewal || calls == 0, "a call for a renewal input: {fx:?}");
        if calls == 1 {
            assert!(
                matches!(fx.last(), Some(Effect::Call(_))),
                "the call comes last: {fx:?}"
            );
        }
        for effect in fx {
            match effect {
                Effect::Emit(_) => {}
                Effect::ReplyAcquire { to, .. } | Effect::ReplyRelease { to, .. } => {
                    assert!(self.answered.insert(to), "caller {to} answered twice");
                }
                Effect::Arm {
                    timer: Timer::Retry,
                    at,
                } => self.retry_at = Some(at),
                Effect::Arm {
                    timer: Timer::Poll,
                    at,
                } => self.poll_at = Some(at),
                Effect::Disarm(Timer::Retry) => self.retry_at = None,
                Effect::Disarm(Timer::Poll) => self.poll_at = None,
                Effect::ArmRenewal { generation } => self.renew_due = Some(generation),
                Effect::DisarmRenewal => self.renew_due = None,
                Effect::StartWatchdog { generation } => self.watchdog = Some(generation),
                Effect::StopWatchdog => self.watchdog = None,
                Effect::Renew { generation, .. } => {
                    self.sent.insert(self.now);
                    self.renewals.push((generation, self.now));
                }
                Effect::Call(call) => {
                    if matches!(call, Call::Acquire { .. }) {
                        self.sent.insert(self.now);
                    }
                    self.call = Some(call);
                }
                Effect::Detach(_) => {}
            }
        }
        self.check_belief();
    }

    fn check_events(&mut self, evs: &[Event]) {
        for ev in evs {
            match ev {
                Event::Granted {
                    generation,
                    token,
                    deadline,
                } => {
                    assert!(
                        self.open.is_none(),
                        "granted {token} while {:?} is open",
                        self.open
                    );
                    assert!(*generation > self.last_generation, "generations go on");
                    assert!(*token >= self.last_token, "tokens never go back");
                    assert!(
                        *token > self.ended,
                        "granted {token} after the end of grant {}",
                        self.ended
                    );
                    assert!(*deadline > self.now, "granted past its deadline");
                    self.open = Some((*generation, *token));
                    self.last_generation = *generation;
                    self.last_token = *token;
                }
                Event::Lost { token, .. } => {
                    let Some((generation, open)) = self.open.take() else {
                        panic!("lost {token}, a grant not announced");
                    };
                    assert_eq!(open, *token);
                    self.ended = self.ended.max(*token);
                    let n = self.losses.entry(generation).or_default();
                    *n += 1;
                    assert_eq!(*n, 1, "grant {generation} lost twice");
                }
                Event::Released { token, .. } => {
                    assert_eq!(self.open.map(|o| o.1), Some(*token));
                    self.ended = self.ended.max(*token);
                    self.open = None;
                }
                Event::Renewed { token, .. }
                | Event::Suspended { token, .. }
                | Event::Resumed { token }
                | Event::PreemptionRequested { token, .. }
                | Event::PreemptionWithdrawn { token, .. } => {
                    assert_eq!(
                        self.open.map(|o| o.1),
                        Some(*token),
                        "{ev:?} outside its grant"
                    );
                }
                _ => {}
            }
        }
    }

    /// Never believed past the deadline; the deadline counts from a send instant; a belief
    /// past its end has been announced lost (the watchdog ran up to now).
    fn check_belief(&self) {
        if let Some(h) = self.m.current(self.now) {
            assert!(self.now < h.believed_until && h.believed_until <= h.deadline);
            assert_eq!(
                h.deadline - h.believed_until,
                self.stop_budget.min(VALIDITY)
            );
            assert!(
                self.sent.contains(&(h.deadline - VALIDITY)),
                "deadline not from a send instant"
            );
            assert_eq!(
                self.open.map(|o| o.0),
                Some(h.generation),
                "believed but not announced"
            );
        }
        if let Some(h) = self.m.held() {
            assert!(
                self.now + WAKE_EARLY < h.believed_until || self.watchdog != Some(h.generation),
                "held past its end without the loss announced"
            );
        }
    }

    fn answer_call(&mut self, call: Call) {
        let outcome = match call {
            Call::Acquire { instance } => {
                let r = self.rng.below(10);
                if r < 4 {
                    // Granted: the instance holding our grant re-enters it with its token
                    // (the store may also have let it lapse: a new grant), any other
                    // instance gets a new grant (the store let ours lapse).
                    let token = match self.ours {
                        Some((i, t)) if i == instance && self.rng.chance(60) => t,
                        _ => {
                            self.store_token += 1;
                            self.store_token
                        }
                    };
                    self.ours = Some((instance, token));
                    Outcome::Acquire(Ok(AcquireOutcome::Granted(record("me", token, 0))))
                } else if r < 7 {
                    self.store_token += 1;
                    let mut holder = record("other", self.store_token, self.rng.below(3));
                    holder.cleanup_timeout = ms(self.rng.below(2000));
                    if self.rng.chance(30) {
                        holder.request = Some(request("me", 1, false));
                    }
                    Outcome::Acquire(Ok(AcquireOutcome::Held(holder)))
                } else {
                    Outcome::Acquire(Err(timeout("acquire")))
                }
            }
            Call::Release { .. } => match self.rng.below(3) {
                0 => Outcome::Release(Err(timeout("release"))),
                _ => {
                    self.ours = None;
                    Outcome::Release(Ok(true))
                }
            },
            Call::RequestPreemption { .. } => {
                let holder = record("other", self.store_token, 0);
                Outcome::Preempt(match self.rng.below(4) {
                    0 => Ok(PreemptAnswer::Recorded(holder)),
                    1 => Ok(PreemptAnswer::Refused(holder)),
                    2 => Ok(PreemptAnswer::Gone),
                    _ => Err(timeout("request preemption")),
                })
            }
            Call::WithdrawPreemption { .. } => Outcome::Withdrawn,
            // Whatever the line answers, the machine's next call is an attempt, which the
            // store answers as any other.
            Call::WaitInLine { .. } => Outcome::InLine(match self.rng.below(5) {
                0 => Err(timeout("acquire")),
                _ => Ok(()),
            }),
        };
        self.feed(Input::Answered(outcome));
    }

    fn answer_renewal(&mut self, i: usize) {
        let (generation, sent_at) = self.renewals.swap_remove(i);
        let answer = match self.rng.below(10) {
            0..=4 => Ok(Renewal::Renewed {
                request: self.rng.chance(20).then(|| request("r", 9, false)),
            }),
            5 => Ok(Renewal::NotHeld),
            6 => Ok(Renewal::Refused(request("r", 9, true))),
            _ => Err(timeout("renew")),
        };
        let answer = if self.rng.chance(3) {
            None
        } else {
            Some((sent_at, answer))
        };
        self.feed(Input::Renewed { generation, answer });
    }

    /// One random step: the clock moves (sometimes far: a host suspend), then one input.
    fn step(&mut self) {
        let d = match self.rng.below(20) {
            0 => Duration::from_secs(20 + self.rng.below(60)),
            _ => ms(self.rng.below(1500)),
        };
        self.advance(d);
        if let Some(call) = self.call.take() {
            // The actor awaits its call: its answer comes next (or, rarely, a command the
            // machine must defer).
            if self.rng.chance(90) {
                return self.answer_call(call);
            }
            self.call = Some(call);
        }
        let input = match self.rng.below(12) {
            0 => Input::Acquire {
                reply: self.rng.chance(70).then(|| self.caller()),
            },
            1 => Input::TryAcquire {
                reply: self.caller(),
            },
            2 if self.rng.chance(40) => Input::Release {
                reply: self.caller(),
                scope: match self.rng.below(3) {
                    0 => ReleaseScope::Any,
                    1 => ReleaseScope::Seen(self.open.map(|(_, token)| token)),
                    _ => ReleaseScope::Seen(None),
                },
            },
            3 => Input::RetryPace(self.rng.chance(50).then(|| ms(300))),
            4 if self.retry_at.is_some_and(|at| at <= self.now) => {
                self.retry_at = None;
                Input::Timer(Timer::Retry)
            }
            5 if self.poll_at.is_some_and(|at| at <= self.now) => {
                self.poll_at = None;
                Input::Timer(Timer::Poll)
            }
            6 | 7 if self.renew_due.is_some() => Input::RenewDue {
                generation: self.renew_due.unwrap_or_default(),
            },
            8 | 9 if !self.renewals.is_empty() => {
                let i = usize::try_from(self.rng.below(self.renewals.len() as u64)).unwrap();
                return self.answer_renewal(i);
            }
            // A stale timer firing.
            10 => Input::Timer(if self.rng.chance(50) {
                Timer::Retry
            } else {
                Timer::Poll
            }),
            _ => return,
        };
        self.feed(input);
    }
}

#[test]
fn random_input_sequences_keep_the_contract() {
    let mut grants = 0;
    let mut losses = 0;
    for seed in 1..=400 {
        let mut sim = Sim::new(seed);
        for _ in 0..300 {
            sim.step();
        }
        // Killed: whatever was believed is given up (announced as released).
        sim.feed(Input::Abandon);
        assert!(sim.m.held().is_none() && sim.open.is_none());
        grants += sim.last_generation;
        losses += sim.losses.len();
    }
    // The runs reach the interesting states (not a test that cannot fail quietly).
    eprintln!("grants {grants}, losses {losses}");
    assert!(
        grants > 1000 && losses > 200,
        "grants {grants}, losses {losses}"
    );
}
