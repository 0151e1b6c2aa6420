//! `[singleton]` settings (defaults: [`SingletonConfig`]'s), overridable per singleton
//! in `[singleton.<name>]`.

use std::time::Duration;

use serde::Deserialize;
use tenure_lease::{ConfigError, LeaseSettings, StopBudget, TenureConfig, WhenKillFails};

/// This crate's fragment of the reference configuration: `[singleton]` (shown in
/// `config/reference.toml`).
pub const REFERENCE: &str = include_str!("../reference.toml");

/// `[singleton]` (with `[singleton.<name>]` over it) as written (defaults: [`REFERENCE`]);
/// [`SingletonSettings::from_config`] checks it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
#[non_exhaustive]
pub struct SingletonConfig {
    /// `None`: every member.
    pub role: Option<String>,
    /// `None`: the cluster's lease section.
    pub lease_section: Option<String>,
    /// `hand-over-retry-interval`: how often a hand-over is asked again.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub hand_over_retry_interval: Duration,
    /// `None`: the lease section's `heartbeat-timeout / 10`.
    #[serde(deserialize_with = "tenure_lease::duration::serde::optional")]
    pub stop_timeout: Option<Duration>,
    /// `buffer-size`: messages a proxy keeps while no instance runs.
    pub buffer_size: usize,
    /// `when-kill-fails`: what happens when the instance outlives its kill while its lease
    /// is being lost.
    pub when_kill_fails: WhenKillFails,
}

impl Default for SingletonConfig {
    fn default() -> Self {
        SingletonConfig {
            role: None,
            lease_section: None,
            hand_over_retry_interval: Duration::from_millis(200),
            stop_timeout: None,
            buffer_size: 1000,
            when_kill_fails: WhenKillFails::Abort,
        }
    }
}

/// How one singleton is run.
#[derive(Debug, Clone, PartialEq)]
pub struct SingletonSettings {
    /// `role`: only members with this role host it (`None`: every member).
    pub role: Option<String>,
    /// `lease-section`: the lease section of its lease (when not set, the cluster's).
    pub lease_section: String,
    /// Timing of its lease (the section's); `lease-retry-interval` paces acquire attempts.
    pub lease: LeaseSettings,
    /// `hand-over-retry-interval`: acquire retry pace while the previous oldest is leaving
    /// (it releases the lease once its instance has stopped).
    pub hand_over_retry_interval: Duration,
    /// `stop-timeout`: how long the instance gets to stop before it is killed (when not set
    /// in config: the lease section's `heartbeat-timeout / 10`). Its
    /// [`stop_budget`](Self::stop_budget) fits the singleton lease's timing.
    pub stop_timeout: Duration,
    /// `buffer-size`: messages a proxy keeps while no instance is known.
    pub buffer_size: usize,
    /// `when-kill-fails`: what the manager does when the instance (or a descendant)
    /// outlives its kill while the lease is being lost: end the process before the lease's
    /// local deadline (the default), or, unsafely, let it run on. Graceful hand-overs never
    /// need it: they keep the lease until the instance has ended.
    pub when_kill_fails: WhenKillFails,
}

impl SingletonSettings {
    /// Reads `[singleton]`, then `[singleton.<name>]` over it; `cluster_lease_section` is
    /// used when neither names a lease section. Errors name the key.
    pub fn from_config(
        config: &TenureConfig,
        name: &str,
        cluster_lease_section: &str,
    ) -> Result<SingletonSettings, ConfigError> {
        tenure_lease::names::check_component("singleton name", name)?;
        let c: SingletonConfig = config.named_section("singleton", name)?;
        let lease_section = c
            .lease_section
            .unwrap_or_else(|| cluster_lease_section.to_string());
        let lease = config.lease_section(&lease_section)?.settings;
        if c.buffer_size == 0 {
            return Err(ConfigError::invalid(
                config.key_for("singleton", name, "buffer-size"),
                "expected a positive integer",
            ));
        }
        let budget = StopBudget::for_actors_configured(
            c.stop_timeout,
            &lease,
            &format!("lease.{lease_section}"),
            &config.key_for("singleton", name, "stop-timeout"),
        )?;
        Ok(SingletonSettings {
            role: c.role,
            lease_section,
            lease,
            hand_over_retry_interval: c.hand_over_retry_interval,
            stop_timeout: budget.stop_timeout,
            buffer_size: c.buffer_size,
            when_kill_fails: c.when_kill_fails,
        })
    }
}

impl SingletonSettings {
    /// How long before the singleton lease's local deadline its manager must learn of a
    /// loss: the loss delivered, `stop-timeout` for the instance, a kill if it still runs,
    /// and the process ended if it outlived the kill.
    pub fn stop_budget(&self) -> StopBudget {
        StopBudget::for_actors(self.stop_timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_fragment_is_the_defaults() {
        let fragment: toml::Table = toml::from_str(REFERENCE).unwrap();
        let c: SingletonConfig = tenure_lease::config::read_table(
            "singleton",
            fragment["singleton"].as_table().unwrap(),
        )
        .unwrap();
        assert_eq!(c, SingletonConfig::default());
    }

    #[test]
    fn defaults_overrides_and_errors() {
        let config = TenureConfig::from_toml_str(
            "[singleton.billing]\nbuffer-size = 7\nrole = \"backend\"",
            "t",
        )
        .unwrap();
        let s = SingletonSettings::from_config(&config, "billing", "sqlite").unwrap();
        assert_eq!(
            (s.buffer_size, s.role.as_deref(), s.lease_section.as_str()),
            (7, Some("backend"), "sqlite")
        );
        let other = SingletonSettings::from_config(&config, "other", "sqlite").unwrap();
        assert_eq!(other.role, None);
        assert_eq!(
            other.when_kill_fails,
            WhenKillFails::Abort,
            "safe by default"
        );
        for (text, key) in [
            ("[singleton]\nbuffer-size = 0", "singleton.buffer-size"),
            ("[singleton.billing]\nrole = 1", "`singleton.billing.role`"),
            ("[singleton]\nrole = 1", "`singleton.role`"),
            (
                "[singleton]\nstop-timeout = \"0s\"",
                "`singleton.stop-timeout`",
            ),
            (
                "[singleton.billing]\nhand-over-retry-interval = \"fast\"",
                "`singleton.billing.hand-over-retry-interval`",
            ),
            (
                "[singleton.billing]\nbufer-size = 1",
                "`singleton.billing.bufer-size`",
            ),
            ("[singleton]\nlease-section = \"nope\"", "nope"),
            (
                "[singleton.billing]\nwhen-kill-fails = \"ignore\"",
                "`singleton.billing.when-kill-fails`",
            ),
        ] {
            let config = TenureConfig::from_toml_str(text, "t").unwrap();
            let err = SingletonSettings::from_config(&config, "billing", "sqlite")
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
    }

    #[test]
    fn a_stop_timeout_that_does_not_fit_the_lease_is_refused_naming_both_keys() {
        // Issue 15: ttl 30 s (margin 3 s, interval 5 s) with a 5 s stop-timeout now fits,
        // since the loss is announced early by the budget; 25 s cannot.
        let lease = "[lease.sqlite]\nheartbeat-timeout = \"30s\"\n";
        let text = format!("{lease}[singleton]\nstop-timeout = \"5s\"\n");
        let config = TenureConfig::from_toml_str(&text, "t").unwrap();
        let s = SingletonSettings::from_config(&config, "billing", "sqlite").unwrap();
        assert_eq!(s.stop_budget().total(), Duration::from_millis(5500));
        let text = format!("{lease}[singleton.billing]\nstop-timeout = \"25s\"\n");
        let config = TenureConfig::from_toml_str(&text, "t").unwrap();
        let err = SingletonSettings::from_config(&config, "billing", "sqlite")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`singleton.billing.stop-timeout`")
                && err.contains("`lease.sqlite.heartbeat-timeout`"),
            "{err}"
        );
        let config = TenureConfig::from_toml_str(lease, "t").unwrap();
        let s = SingletonSettings::from_config(&config, "billing", "sqlite").unwrap();
        assert_eq!(
            s.stop_timeout,
            Duration::from_secs(3),
            "not set: heartbeat-timeout / 10"
        );
    }
}
