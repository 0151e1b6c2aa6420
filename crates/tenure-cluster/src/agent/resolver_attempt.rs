//! One side's attempt to learn whether it holds the resolver lease of lease-majority, as a
//! pure machine ([`Attempt`]): every timing and counting rule of the attempt is decided
//! here, once, and nowhere else. The machine reads no clock, awaits nothing and does no
//! I/O: its drivers (the agent's [`super::resolver_lease`] and the simulator) carry out
//! what it asks for ([`Next`]) no earlier than the instant it names, and feed back the
//! store's answer ([`Answer`]) stamped with the instants they read.
//!
//! The rules:
//! - The side's leader tries to acquire the lease, and reads its record right after a
//!   refusal; the side's other members (watchers) only read it. Either tries again one retry
//!   interval after the last answer.
//! - A grant held by a member of the side decides for the side ([`Holder::Ours`]).
//! - A grant held by a node outside the side decides against the side
//!   ([`Holder::Theirs`]) only once its holder shows that it runs: the same grant is still
//!   held when read after the latest instant it could have lapsed unrenewed plus the slack,
//!   or a new grant outside the side was taken. A frozen or crashed node's grant lapses
//!   unrenewed; a side that can run must not down itself for it.
//! - A watcher gives up ([`ResolverLeaseError::Unheld`]) once nobody held the lease for
//!   its give-up time (two ttls: its leader cannot reach the store).
//! - [`TRIES`] store errors in a row end the attempt with the last error; a read that
//!   answered resets the count.

use std::time::Duration;

use tenure_lease::{FencingToken, LeaseError, LeaseRecord};
use tokio::time::Instant;

use super::resolver_lease::ResolverLeaseError;

/// How many store errors in a row end an attempt with `Err`.
pub(crate) const TRIES: u32 = 3;

/// One read of the resolver lease's record (`None`: nobody holds it), with the instants
/// the read was sent and answered.
#[derive(Debug, Clone)]
pub(crate) struct Look {
    pub(crate) record: Option<LeaseRecord>,
    pub(crate) sent: Instant,
    pub(crate) answered: Instant,
}

/// Who holds the resolver lease, as an attempt decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    /// A member of the side holds it: the side survives.
    Ours,
    /// A running node outside the side holds it: the side goes.
    Theirs,
}

/// What the driver does next.
#[derive(Debug)]
pub(crate) enum Next {
    /// Try to acquire the resolver lease (the leader only), not before this instant, and
    /// feed [`Answer::Granted`], [`Answer::NotGranted`] or [`Answer::Failed`].
    Acquire(Instant),
    /// Read the resolver lease's record, not before this instant, and feed
    /// [`Answer::Looked`] or [`Answer::Failed`].
    Look(Instant),
    /// The attempt is over: `Ok` who holds the lease, `Err` why the side could not learn
    /// it. Nothing more is fed.
    Done(Result<Holder, ResolverLeaseError>),
}

/// What the store answered to the call [`Next`] asked for.
#[derive(Debug)]
pub(crate) enum Answer {
    /// The acquire was granted: this node holds the lease.
    Granted,
    /// The acquire was refused at `at`: someone holds the lease.
    NotGranted { at: Instant },
    /// The read answered.
    Looked(Look),
    /// The call failed at `at`.
    Failed { error: LeaseError, at: Instant },
}

/// The first grant seen held outside the side: whose, and the latest instant it lapses
/// unless renewed.
#[derive(Debug, Clone)]
struct Outsider {
    owner: String,
    token: FencingToken,
    lapses_by: Instant,
}

/// The side's leader acquires; a watcher reads and gives up after `give_up_after` of
/// nobody holding the lease.
#[derive(Debug, Clone, Copy)]
enum Role {
    Leader,
    Watcher { give_up_after: Duration },
}

/// One attempt of a side at the resolver lease: fed the store's answers, it names the next
/// call and its instant until it decides (see the module's rules).
#[derive(Debug)]
pub(crate) struct Attempt {
    /// The resolver lease's name, as errors name it.
    lease: String,
    /// The members of this side (their addresses, the lease's owners).
    side: Vec<String>,
    /// The retry interval; also how long past its expiry a store may still show a grant
    /// that lapsed (its clock's granularity).
    every: Duration,
    role: Role,
    outsider: Option<Outsider>,
    /// Store errors in a row.
    failures: u32,
    /// When the attempt started: its first call is due then.
    started: Instant,
    /// Since when nobody was seen holding the lease (a watcher's give-up clock).
    free_since: Instant,
}

impl Attempt {
    /// The side leader's attempt at the lease `lease` for `side` (whose members'
    /// addresses are the lease's owners), starting at `now` and retrying every `every`.
    pub(crate) fn leader(lease: String, side: Vec<String>, every: Duration, now: Instant) -> Self {
        Attempt::new(lease, side, every, Role::Leader, now)
    }

    /// A watcher's attempt (a member of `side` other than its leader) starting at `now`,
    /// reading every `every` and giving up once nobody held the lease for `give_up_after`.
    pub(crate) fn watcher(
        lease: String,
        side: Vec<String>,
        every: Duration,
        give_up_after: Duration,
        now: Instant,
    ) -> Self {
        Attempt::new(lease, side, every, Role::Watcher { give_up_after }, now)
    }

    fn new(lease: String, side: Vec<String>, every: Duration, role: Role, now: Instant) -> Self {
        Attempt {
            lease,
            side,
            every,
            role,
            outsider: None,
            failures: 0,
            started: now,
            free_since: now,
        }
    }

    /// The first call: at the start instant, the leader acquires and a watcher reads.
    pub(crate) fn first(&self) -> Next {
        self.call_at(self.started)
    }

    /// Takes the store's answer to the last call asked for; what to do next.
    pub(crate) fn step(&mut self, answer: Answer) -> Next {
        match answer {
            Answer::Granted => Next::Done(Ok(Holder::Ours)),
            // Read at once who holds it.
            Answer::NotGranted { at } => Next::Look(at),
            Answer::Looked(look) => {
                self.failures = 0;
                self.looked(&look)
            }
            Answer::Failed { error, at } => {
                self.failures += 1;
                if self.failures >= TRIES {
                    Next::Done(Err(error.into()))
                } else {
                    self.again(at)
                }
            }
        }
    }

    fn looked(&mut self, look: &Look) -> Next {
        let Some(record) = &look.record else {
            if let Role::Watcher { give_up_after } = self.role {
                let waited = look.answered.saturating_duration_since(self.free_since);
                if waited >= give_up_after {
                    return Next::Done(Err(ResolverLeaseError::Unheld {
                        lease: self.lease.clone(),
                        waited,
                    }));
                }
            }
            return self.again(look.answered);
        };
        if self.side.contains(&record.owner) {
            return Next::Done(Ok(Holder::Ours));
        }
        self.free_since = look.answered;
        match &self.outsider {
            None => {
                // The store measured `expires_in` between sending and answering: the grant
                // lapses unrenewed by `answered + expires_in` at the latest.
                self.outsider = Some(Outsider {
                    owner: record.owner.clone(),
                    token: record.token,
                    lapses_by: look.answered + record.expires_in,
                });
                self.again(look.answered)
            }
            Some(first) if first.owner == record.owner && first.token == record.token => {
                if look.sent > first.lapses_by + self.every {
                    // Still held past its expiry: renewed, so its holder runs.
                    Next::Done(Ok(Holder::Theirs))
                } else {
                    self.again(look.answered)
                }
            }
            // A new grant outside the side: a running node took it.
            Some(_) => Next::Done(Ok(Holder::Theirs)),
        }
    }

    /// The next try, one retry interval after the answer at `at`.
    fn again(&self, at: Instant) -> Next {
        self.call_at(at + self.every)
    }

    /// The role's call (the leader acquires, a watcher reads) at `at`.
    fn call_at(&self, at: Instant) -> Next {
        match self.role {
            Role::Leader => Next::Acquire(at),
            Role::Watcher { .. } => Next::Look(at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SBR: &str = "sys-sbr";
    /// The retry interval, also the slack.
    const EVERY: Duration = Duration::from_millis(500);
    /// A watcher's give-up time: two ttls of 3 s.
    const GIVE_UP: Duration = Duration::from_secs(6);

    /// The side of the tests: nodes 2 (its leader) and 3; node 1 is on the other side.
    fn side() -> Vec<String> {
        vec!["127.0.0.1:2".into(), "127.0.0.1:3".into()]
    }

    /// Instants as offsets from one origin.
    struct Clock(Instant);

    impl Clock {
        fn new() -> Clock {
            Clock(Instant::now())
        }

        fn at(&self, ms: u64) -> Instant {
            self.0 + Duration::from_millis(ms)
        }
    }

    fn leader(t: &Clock) -> Attempt {
        Attempt::leader(SBR.into(), side(), EVERY, t.at(0))
    }

    fn watcher(t: &Clock) -> Attempt {
        Attempt::watcher(SBR.into(), side(), EVERY, GIVE_UP, t.at(0))
    }

    fn record(owner: &str, token: u64, expires_in: Duration) -> LeaseRecord {
        LeaseRecord {
            name: SBR.into(),
            owner: owner.into(),
            token: FencingToken::new(token),
            expires_in,
            version: 1,
            ..LeaseRecord::default()
        }
    }

    fn looked(record: Option<&LeaseRecord>, sent: Instant, answered: Instant) -> Answer {
        Answer::Looked(Look {
            record: record.cloned(),
            sent,
            answered,
        })
    }

    /// A read that timed out after `timeout` at `at`.
    fn timed_out(timeout: Duration, at: Instant) -> Answer {
        Answer::Failed {
            error: LeaseError::Timeout {
                name: SBR.into(),
                operation: "read",
                timeout,
            },
            at,
        }
    }

    fn failed(at: Instant) -> Answer {
        timed_out(Duration::from_secs(1), at)
    }

    /// What `next` says, in a comparable form.
    #[derive(Debug, PartialEq, Eq)]
    enum Said {
        Acquire(Instant),
        Look(Instant),
        Ours,
        Theirs,
        Unheld(Duration),
        Failed,
    }

    fn said(next: Next) -> Said {
        match next {
            Next::Acquire(at) => Said::Acquire(at),
            Next::Look(at) => Said::Look(at),
            Next::Done(Ok(Holder::Ours)) => Said::Ours,
            Next::Done(Ok(Holder::Theirs)) => Said::Theirs,
            Next::Done(Err(ResolverLeaseError::Unheld { waited, .. })) => Said::Unheld(waited),
            Next::Done(Err(ResolverLeaseError::Lease(_))) => Said::Failed,
            Next::Done(Err(e)) => panic!("unexpected error: {e}"),
        }
    }

    /// A grant outside the side is the other side's only once it is still held past the
    /// latest instant it could lapse (plus the slack), or replaced by another.
    #[test]
    fn an_outsiders_grant_decides_only_once_it_outlives_its_expiry() {
        let t = Clock::new();
        let frozen = record("127.0.0.1:1", 7, Duration::from_secs(2));
        let mut attempt = watcher(&t);
        // First seen answered at 100 ms: it lapses by 2.1 s unless renewed.
        let first = attempt.step(looked(Some(&frozen), t.at(0), t.at(100)));
        assert_eq!(said(first), Said::Look(t.at(600)));
        let held = attempt.step(looked(Some(&frozen), t.at(2_600), t.at(2_650)));
        assert_eq!(said(held), Said::Look(t.at(3_150)));
        let free = attempt.step(looked(None, t.at(2_700), t.at(2_750)));
        assert_eq!(said(free), Said::Look(t.at(3_250)));
        let outlived = attempt.step(looked(Some(&frozen), t.at(2_601), t.at(2_650)));
        assert_eq!(said(outlived), Said::Theirs);

        let mut attempt = watcher(&t);
        attempt.step(looked(Some(&frozen), t.at(0), t.at(100)));
        let retaken = record("127.0.0.1:1", 8, Duration::from_secs(3));
        let next = attempt.step(looked(Some(&retaken), t.at(500), t.at(600)));
        assert_eq!(said(next), Said::Theirs);

        let ours = record("127.0.0.1:3", 9, Duration::from_secs(3));
        let next = watcher(&t).step(looked(Some(&ours), t.at(0), t.at(1)));
        assert_eq!(said(next), Said::Ours);
    }

    /// The leader acquires at its start, reads right after a refusal, and acquires again
    /// one retry interval after the read answered; a grant is the side's.
    #[test]
    fn the_leader_reads_after_a_refusal_and_acquires_again_a_retry_interval_later() {
        let t = Clock::new();
        let frozen = record("127.0.0.1:1", 7, Duration::from_secs(3));
        let mut attempt = leader(&t);
        assert_eq!(said(attempt.first()), Said::Acquire(t.at(0)));
        let refused = attempt.step(Answer::NotGranted { at: t.at(40) });
        assert_eq!(said(refused), Said::Look(t.at(40)));
        let seen = attempt.step(looked(Some(&frozen), t.at(40), t.at(90)));
        assert_eq!(said(seen), Said::Acquire(t.at(590)));
        assert_eq!(said(attempt.step(Answer::Granted)), Said::Ours);
        assert_eq!(said(watcher(&t).first()), Said::Look(t.at(0)));
    }

    /// A frozen outsider's grant (first answered at 100 ms with 3 s left: it lapses by
    /// 3.1 s) is waited out up to the lapse plus the slack (3.6 s), then acquired.
    #[test]
    fn a_frozen_outsiders_grant_is_waited_out_to_its_lapse_plus_the_slack() {
        let t = Clock::new();
        let frozen = record("127.0.0.1:1", 7, Duration::from_secs(3));
        for mut attempt in [leader(&t), watcher(&t)] {
            attempt.step(looked(Some(&frozen), t.at(0), t.at(100)));
            // Expiry shrinks as read; the record is the same grant.
            let mut sent = 600;
            while sent <= 3_600 {
                let next = attempt.step(looked(Some(&frozen), t.at(sent), t.at(sent + 10)));
                assert!(
                    matches!(said(next), Said::Acquire(at) | Said::Look(at) if at == t.at(sent + 510)),
                    "a grant that may yet lapse is waited out (read sent at {sent} ms)"
                );
                sent += 500;
            }
            let at_slack = attempt.step(looked(Some(&frozen), t.at(3_600), t.at(3_610)));
            assert!(!matches!(said(at_slack), Said::Theirs), "not at 3.6 s");
            let lapsed = attempt.step(looked(None, t.at(3_620), t.at(3_630)));
            assert!(matches!(said(lapsed), Said::Acquire(_) | Said::Look(_)));
        }
        let mut attempt = leader(&t);
        attempt.step(looked(Some(&frozen), t.at(0), t.at(100)));
        let past = attempt.step(looked(Some(&frozen), t.at(3_601), t.at(3_610)));
        assert_eq!(
            said(past),
            Said::Theirs,
            "still held once it must have lapsed"
        );
    }

    /// A new grant outside the side, by the same owner or another, shows a running node.
    #[test]
    fn a_new_grant_outside_the_side_decides_theirs() {
        let t = Clock::new();
        let frozen = record("127.0.0.1:1", 7, Duration::from_secs(3));
        for other in [
            record("127.0.0.1:1", 8, Duration::from_secs(3)),
            record("127.0.0.1:4", 8, Duration::from_secs(3)),
        ] {
            for mut attempt in [leader(&t), watcher(&t)] {
                attempt.step(looked(Some(&frozen), t.at(0), t.at(100)));
                let next = attempt.step(looked(Some(&other), t.at(600), t.at(610)));
                assert_eq!(said(next), Said::Theirs, "{other:?}");
            }
        }
    }

    /// A watcher gives up exactly when nobody held the lease for its give-up time, counted
    /// from its start or from the last read that showed a holder.
    #[test]
    fn a_watcher_gives_up_exactly_when_nobody_held_it_for_two_ttls() {
        let t = Clock::new();
        let mut attempt = watcher(&t);
        let before = attempt.step(looked(None, t.at(5_990), t.at(5_999)));
        assert_eq!(said(before), Said::Look(t.at(6_499)));
        let at = attempt.step(looked(None, t.at(5_999), t.at(6_000)));
        assert_eq!(said(at), Said::Unheld(GIVE_UP));

        let mut attempt = watcher(&t);
        let outsider = record("127.0.0.1:1", 7, Duration::from_secs(3));
        attempt.step(looked(Some(&outsider), t.at(1_990), t.at(2_000)));
        let before = attempt.step(looked(None, t.at(7_990), t.at(7_999)));
        assert_eq!(said(before), Said::Look(t.at(8_499)));
        let at = attempt.step(looked(None, t.at(7_999), t.at(8_000)));
        assert_eq!(said(at), Said::Unheld(GIVE_UP));

        // The leader acquires a free lease rather than giving up on it.
        let mut attempt = leader(&t);
        let free = attempt.step(looked(None, t.at(9_990), t.at(10_000)));
        assert_eq!(said(free), Said::Acquire(t.at(10_500)));
    }

    /// [`TRIES`] store errors in a row end the attempt with the last one; each error before
    /// is retried one retry interval after it.
    #[test]
    fn store_errors_in_a_row_end_the_attempt() {
        let t = Clock::new();
        for mut attempt in [leader(&t), watcher(&t)] {
            for n in 1..TRIES {
                let at = u64::from(n) * 1_000;
                let next = attempt.step(failed(t.at(at)));
                assert!(
                    matches!(said(next), Said::Acquire(a) | Said::Look(a) if a == t.at(at + 500)),
                    "error {n} is retried"
                );
            }
            let last = attempt.step(timed_out(Duration::from_secs(2), t.at(9_000)));
            match last {
                Next::Done(Err(ResolverLeaseError::Lease(LeaseError::Timeout {
                    timeout, ..
                }))) => {
                    assert_eq!(timeout, Duration::from_secs(2), "the last error");
                }
                other => panic!("not ended by the last error: {other:?}"),
            }
        }
    }

    /// A read that answered starts the count of errors again; a refused acquire does not
    /// (the read after it tells whether the store answers).
    #[test]
    fn a_read_that_answered_resets_the_error_count() {
        let t = Clock::new();
        for mut attempt in [leader(&t), watcher(&t)] {
            for n in 1..TRIES {
                attempt.step(failed(t.at(u64::from(n))));
            }
            attempt.step(looked(None, t.at(10), t.at(20)));
            for n in 1..TRIES {
                let next = attempt.step(failed(t.at(100 + u64::from(n))));
                assert!(
                    matches!(said(next), Said::Acquire(_) | Said::Look(_)),
                    "error {n} after a read is retried"
                );
            }
        }
        let mut attempt = leader(&t);
        for n in 1..TRIES {
            attempt.step(failed(t.at(u64::from(n))));
        }
        assert_eq!(
            said(attempt.step(Answer::NotGranted { at: t.at(10) })),
            Said::Look(t.at(10))
        );
        assert_eq!(said(attempt.step(failed(t.at(20)))), Said::Failed);
    }
}
