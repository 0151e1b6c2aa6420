//! The stop budget: how long before its local deadline a holder must learn of a loss so
//! that what it runs under the lease (entities, a singleton instance, a guarded command)
//! has *terminated*, not merely been told to stop, by the deadline.
//!
//! A LeaseActor given a budget (`LeaseSpec::with_stop_budget`) ends its belief and
//! announces `LeaseLost` that long before the local deadline; the deadline itself, recorded
//! as `valid_until` in histories, does not move. Its supervisor then has the whole budget:
//! the loss reaching it, a graceful stop of `stop_timeout`, a kill, the kill landing, and,
//! when something outlived even the kill (a thread blocked outside an await), ending the
//! process ([`StopBudget::exit_wait`]): what cannot be stopped must not run on under a lease
//! another holder may be granted once the deadline has passed.
//!
//! The arithmetic, for a loss announced at `A = deadline - total()` and handled at
//! `R <= A + delivery_slack`: the supervisor kills at `R + stop_timeout`
//! ([`StopDeadlines::kill`]) and gives up waiting at `R + stop_timeout + kill_wait`
//! ([`StopDeadlines::give_up`]), which is at most `deadline - exit_wait`; whatever still
//! runs then has `exit_wait` left in which the process records why and ends.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::ConfigError;
use crate::settings::LeaseSettings;

/// The parts of a stop budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopBudget {
    /// What runs under the lease gets this long to stop gracefully (a `stop-timeout`, or
    /// `lease run --grace`).
    pub stop_timeout: Duration,
    /// After the graceful stop, how long a forced stop (an actor kill, SIGKILL) may take to
    /// land and be seen.
    pub kill_wait: Duration,
    /// After the kill wait, how long recording that something outlived its kill and ending
    /// the process may take (zero for a holder that does not end its process).
    pub exit_wait: Duration,
    /// How long the loss may take to reach the supervisor (through its mailbox) and be
    /// handled, given that its handlers never await user code.
    pub delivery_slack: Duration,
}

impl StopBudget {
    /// The kill wait of actors: a ractor kill aborts the actor's task at its next await
    /// point; only code blocking a thread outlives it.
    pub const ACTOR_KILL_WAIT: Duration = Duration::from_millis(200);
    /// The exit wait of actor supervisors: one history line written and `abort(3)` called,
    /// with no await in between.
    pub const ACTOR_EXIT_WAIT: Duration = Duration::from_millis(50);
    /// The delivery slack of actor supervisors (shards, singleton managers).
    pub const ACTOR_DELIVERY_SLACK: Duration = Duration::from_millis(250);

    /// The budget of an actor supervisor whose children get `stop_timeout` to stop.
    pub fn for_actors(stop_timeout: Duration) -> Self {
        StopBudget {
            stop_timeout,
            kill_wait: Self::ACTOR_KILL_WAIT,
            exit_wait: Self::ACTOR_EXIT_WAIT,
            delivery_slack: Self::ACTOR_DELIVERY_SLACK,
        }
    }

    /// The budget of actors whose `stop-timeout` setting reads `configured` (`None`: the
    /// lease section's `heartbeat-timeout / 10`), checked against that section's timing `lease`
    /// (`lease_key`: `lease.sqlite`); errors name `key` (`sharding.stop-timeout`) and the
    /// section's `heartbeat-timeout`.
    pub fn for_actors_configured(
        configured: Option<Duration>,
        lease: &LeaseSettings,
        lease_key: &str,
        key: &str,
    ) -> Result<StopBudget, ConfigError> {
        let stop_timeout = configured.unwrap_or(lease.heartbeat_timeout / 10);
        let budget = StopBudget::for_actors(stop_timeout);
        lease.check_stop_budget(lease_key, key, &budget)?;
        Ok(budget)
    }

    /// The whole budget: delivery slack + stop timeout + kill wait + exit wait.
    pub fn total(&self) -> Duration {
        self.delivery_slack
            .saturating_add(self.stop_timeout)
            .saturating_add(self.kill_wait)
            .saturating_add(self.exit_wait)
    }

    /// The instants of a stop that began at `began` (when the supervisor handled the loss,
    /// or began a graceful move): see [`StopDeadlines`].
    pub fn deadlines(&self, began: Instant) -> StopDeadlines {
        let kill = began + self.stop_timeout;
        StopDeadlines {
            kill,
            give_up: kill + self.kill_wait,
        }
    }
}

/// When a supervisor escalates a stop that began at some instant `began`
/// ([`StopBudget::deadlines`]). For a loss handled within the delivery slack of its
/// announcement, `give_up` is at least the exit wait before the lease's local deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopDeadlines {
    /// `began + stop_timeout`: what has not stopped gracefully by then is killed.
    pub kill: Instant,
    /// `kill + kill_wait`: what still runs then outlived its kill. Under a lease being
    /// lost, the process must end before `exit_wait` has passed from here.
    pub give_up: Instant,
}

impl LeaseSettings {
    /// Checks that a holder with stop budget `budget` can keep its lease through one failed
    /// renewal, as Akka's `heartbeat-interval < heartbeat-timeout / 2` lets a plain holder:
    /// after a renewal sent at `s` the belief lasts until `s + ttl - margin - budget`, and
    /// the renewal after next is sent at `s + 2 x interval`, so
    /// `safety-margin + budget + 2 x heartbeat-interval < heartbeat-timeout`. `budget_key`
    /// names the setting the budget comes from (`sharding.stop-timeout`, `--grace`),
    /// `key_prefix` the lease section (`lease.sqlite`); the error names both.
    pub fn check_stop_budget(
        &self,
        key_prefix: &str,
        budget_key: &str,
        budget: &StopBudget,
    ) -> Result<(), ConfigError> {
        let show = |d: Duration| humantime::format_duration(d).to_string();
        let needed = self
            .safety_margin
            .saturating_add(budget.total())
            .saturating_add(self.heartbeat_interval.saturating_mul(2));
        if needed < self.heartbeat_timeout {
            return Ok(());
        }
        Err(ConfigError::Conflict {
            key: budget_key.to_string(),
            other: format!("{key_prefix}.heartbeat-timeout"),
            detail: format!(
                "{budget_key} {} gives a stop budget of {} (with {} kill wait, {} exit wait and {} \
                 delivery slack); safety-margin ({}) + stop budget + 2 x heartbeat-interval ({}) \
                 = {} must be < heartbeat-timeout ({}), or one failed renewal would lose the \
                 lease: shorten {budget_key} or lengthen {key_prefix}.heartbeat-timeout",
                show(budget.stop_timeout),
                show(budget.total()),
                show(budget.kill_wait),
                show(budget.exit_wait),
                show(budget.delivery_slack),
                show(self.safety_margin),
                show(self.heartbeat_interval),
                show(needed),
                show(self.heartbeat_timeout),
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_must_leave_room_for_the_next_renewal() {
        // ttl 3 s, interval 500 ms, margin 300 ms: 1.7 s of room.
        let mut s = LeaseSettings::with_timeout(Duration::from_secs(3));
        s.heartbeat_interval = Duration::from_millis(500);
        let fits = StopBudget::for_actors(Duration::from_millis(1100));
        assert_eq!(fits.total(), Duration::from_millis(1600));
        s.check_stop_budget("lease.sqlite", "sharding.stop-timeout", &fits)
            .unwrap();
        let err = s
            .check_stop_budget(
                "lease.sqlite",
                "sharding.stop-timeout",
                &StopBudget::for_actors(Duration::from_millis(1200)),
            )
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`sharding.stop-timeout`")
                && err.contains("`lease.sqlite.heartbeat-timeout`")
                && err.contains("stop budget of 1s 700ms"),
            "{err}"
        );
    }

    #[test]
    fn a_loss_handled_within_the_slack_gives_up_an_exit_wait_before_the_deadline() {
        let budget = StopBudget::for_actors(Duration::from_millis(300));
        assert_eq!(budget.total(), Duration::from_millis(800));
        let deadline = Instant::now() + Duration::from_secs(10);
        let announced = deadline - budget.total();
        // Handled at the end of the delivery slack: the latest the budget allows.
        let latest = budget.deadlines(announced + budget.delivery_slack);
        assert_eq!(latest.kill, deadline - Duration::from_millis(250));
        assert_eq!(latest.give_up + budget.exit_wait, deadline);
        // Handled at once: more room before the deadline, never less.
        let early = budget.deadlines(announced);
        assert_eq!(
            early.give_up + budget.exit_wait + budget.delivery_slack,
            deadline
        );
    }

    #[test]
    fn the_reference_stop_timeout_of_five_seconds_fits_a_30s_ttl() {
        // Issue 15's example: ttl 30 s, margin 3 s, interval 5 s.
        let s = LeaseSettings::with_timeout(Duration::from_secs(30));
        s.check_stop_budget(
            "lease",
            "singleton.stop-timeout",
            &StopBudget::for_actors(Duration::from_secs(5)),
        )
        .unwrap();
    }
}
