//! `[sharding]` settings (defaults: [`ShardingConfig`]'s), overridable per entity type
//! in `[sharding.<type>]`.

use std::time::Duration;

use serde::Deserialize;
use tenure_cluster::placement::{DEFAULT_NUMBER_OF_SHARDS, EntityPlacement};
use tenure_lease::{ConfigError, LeaseSettings, StopBudget, TenureConfig, WhenKillFails};

/// This crate's fragment of the reference configuration: `[sharding]` (shown in
/// `config/reference.toml`).
pub const REFERENCE: &str = include_str!("../reference.toml");

/// `[sharding]` (with `[sharding.<type>]` over it) as written (defaults: [`REFERENCE`]);
/// [`ShardingSettings::from_config`] checks it. Each field is the key of the same name in
/// kebab-case, documented in the reference; `number-of-shards` and `lease-section` are
/// read as placement (see `tenure_cluster::placement`), which every member must share.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
#[non_exhaustive]
pub struct ShardingConfig {
    /// `None`: every member.
    pub role: Option<String>,
    /// `None`: the cluster's lease section.
    pub lease_section: Option<String>,
    /// `number-of-shards`: the same on every member (it decides where entities live).
    pub number_of_shards: usize,
    /// `buffer-size`: messages kept per shard while its home or lease is unknown.
    pub buffer_size: usize,
    /// `"off"` (`None`): entities are not passivated.
    #[serde(deserialize_with = "tenure_lease::duration::serde::or_off")]
    pub idle_timeout: Option<Duration>,
    /// `active-entity-limit`: most entities a region runs (`None`: no limit).
    pub active_entity_limit: Option<usize>,
    /// `None`: the lease section's `heartbeat-timeout / 10`.
    #[serde(deserialize_with = "tenure_lease::duration::serde::optional")]
    pub stop_timeout: Option<Duration>,
    /// `retry-interval`: how often a region asks the coordinator again.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub retry_interval: Duration,
    /// `unreachable-reallocate-after`: how long the shards of an unreachable region wait
    /// before the coordinator moves them.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub unreachable_reallocate_after: Duration,
    /// `rebalance-interval`: how often the coordinator considers a rebalance.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub rebalance_interval: Duration,
    /// `rebalance-threshold`: the regions are balanced while the most loaded has at most
    /// this many shards more than the least.
    pub rebalance_threshold: usize,
    /// `rebalance-relative-limit`: share of the allocated shards one rebalance round moves
    /// at most.
    pub rebalance_relative_limit: f64,
    /// `rebalance-absolute-limit`: most shards one rebalance round moves.
    pub rebalance_absolute_limit: usize,
    /// `max-simultaneous-rebalance`, deprecated: read as `rebalance-absolute-limit` (with a
    /// warning at load).
    pub max_simultaneous_rebalance: Option<usize>,
    /// `hand-off-timeout`: how long a hand-off may take before the coordinator gives up.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub hand_off_timeout: Duration,
    /// `remember-entities`: entities are started again, with no message, wherever their
    /// shard goes (hand-off, rebalance, a crashed node); their ids are kept in the lease
    /// store with the shard's lease.
    pub remember_entities: bool,
    /// `entity-restart-backoff`: with `remember-entities`, how long a remembered entity that
    /// stopped without passivating waits before it is started again.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub entity_restart_backoff: Duration,
    /// `when-kill-fails`: what happens when an entity outlives its kill while its shard's
    /// lease is being lost.
    pub when_kill_fails: WhenKillFails,
}

impl Default for ShardingConfig {
    fn default() -> Self {
        ShardingConfig {
            role: None,
            lease_section: None,
            number_of_shards: DEFAULT_NUMBER_OF_SHARDS,
            buffer_size: 1000,
            idle_timeout: Some(Duration::from_secs(120)),
            active_entity_limit: None,
            stop_timeout: None,
            retry_interval: Duration::from_millis(500),
            unreachable_reallocate_after: Duration::from_secs(5),
            rebalance_interval: Duration::from_secs(10),
            rebalance_threshold: 1,
            rebalance_relative_limit: 0.1,
            rebalance_absolute_limit: 100,
            max_simultaneous_rebalance: None,
            hand_off_timeout: Duration::from_secs(15),
            remember_entities: false,
            entity_restart_backoff: Duration::from_secs(10),
            when_kill_fails: WhenKillFails::Abort,
        }
    }
}

/// How one entity type is sharded.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardingSettings {
    /// `role`: only members with this role host shards (`None`: every member).
    pub role: Option<String>,
    /// `lease-section`: the lease section of shard leases.
    pub lease_section: String,
    /// Timing of shard leases (the section's).
    pub lease: LeaseSettings,
    /// `number-of-shards`.
    pub number_of_shards: usize,
    /// `buffer-size`: messages kept for one shard while they cannot be delivered, by a
    /// region (each shard has its own buffer there) and by the shard itself.
    pub buffer_size: usize,
    /// `idle-timeout`: idle entities are passivated after it (`None`: never; always `None`
    /// with `remember-entities`, as in Akka: a remembered entity stops only when it asks).
    pub idle_timeout: Option<Duration>,
    /// `active-entity-limit`: a region runs at most this many entities (all its shards
    /// together); starting one more passivates the least recently used (`None`: no limit;
    /// always `None` with `remember-entities`, as `idle_timeout`).
    pub active_entity_limit: Option<usize>,
    /// `stop-timeout`: how long a stopping entity gets before it is killed (when not set in
    /// config: the lease section's `heartbeat-timeout / 10`). Its
    /// [`stop_budget`](Self::stop_budget) fits the shard lease's timing.
    pub stop_timeout: Duration,
    /// `retry-interval`: region reports and re-asked shard homes.
    pub retry_interval: Duration,
    /// `unreachable-reallocate-after`.
    pub unreachable_reallocate_after: Duration,
    /// `rebalance-interval`.
    pub rebalance_interval: Duration,
    /// `rebalance-threshold`: the regions are balanced while the most loaded has at most
    /// this many shards more than the least (at least 1).
    pub rebalance_threshold: usize,
    /// `rebalance-relative-limit`: share of the allocated shards one rebalance round moves
    /// at most (above 0, at most 1).
    pub rebalance_relative_limit: f64,
    /// `rebalance-absolute-limit`: most shards one rebalance round moves (at least 1; a
    /// round moves at least one shard whatever the share).
    pub rebalance_absolute_limit: usize,
    /// `hand-off-timeout`.
    pub hand_off_timeout: Duration,
    /// `remember-entities`: a shard keeps the ids of its entities in the lease store with
    /// its lease, and starts them again, with no message, whenever it starts serving (after
    /// a hand-off, a rebalance, a crash); an entity that passivates itself
    /// ([`EntityContext::passivate`](crate::EntityContext::passivate)) is forgotten. It must
    /// be the same on every member hosting the type.
    pub remember_entities: bool,
    /// `entity-restart-backoff`: with `remember_entities`, how long a remembered entity that
    /// stopped without passivating (its start or a request failed) waits before its shard
    /// starts it again.
    pub entity_restart_backoff: Duration,
    /// `when-kill-fails`: what a shard does when an entity outlives its kill (a thread
    /// blocked outside an await) while the shard's lease is being lost: end the process
    /// before the lease's local deadline (the default), or, unsafely, let it run on.
    /// Graceful moves never need it: they keep the lease until the entity has ended.
    pub when_kill_fails: WhenKillFails,
}

impl ShardingSettings {
    /// Reads `[sharding]`, then `[sharding.<type_name>]` over it; `cluster_lease_section`
    /// is used when neither names a lease section. Errors name the key.
    pub fn from_config(
        config: &TenureConfig,
        type_name: &str,
        cluster_lease_section: &str,
    ) -> Result<ShardingSettings, ConfigError> {
        tenure_lease::names::check_component("entity type name", type_name)?;
        let c: ShardingConfig = config.named_section("sharding", type_name)?;
        // What decides where an entity lives is read once, as members compare it at join.
        let placement = EntityPlacement::read(config, Some(type_name), cluster_lease_section)?;
        let lease_section = placement.lease_section;
        let lease = config.lease_section(&lease_section)?.settings;
        for (k, n) in [
            ("buffer-size", c.buffer_size),
            ("rebalance-threshold", c.rebalance_threshold),
            ("rebalance-absolute-limit", c.rebalance_absolute_limit),
            (
                "max-simultaneous-rebalance",
                c.max_simultaneous_rebalance.unwrap_or(1),
            ),
            ("active-entity-limit", c.active_entity_limit.unwrap_or(1)),
        ] {
            if n == 0 {
                return Err(ConfigError::invalid(
                    config.key_for("sharding", type_name, k),
                    "expected a positive integer",
                ));
            }
        }
        let relative = c.rebalance_relative_limit;
        if !(relative > 0.0 && relative <= 1.0) {
            return Err(ConfigError::invalid(
                config.key_for("sharding", type_name, "rebalance-relative-limit"),
                format!("expected a share above 0 and at most 1 (0.1 is 10 %), got {relative}"),
            ));
        }
        let mut absolute = c.rebalance_absolute_limit;
        if let Some(n) = c.max_simultaneous_rebalance {
            let old = config.key_for("sharding", type_name, "max-simultaneous-rebalance");
            let new = config.key_for("sharding", type_name, "rebalance-absolute-limit");
            tracing::warn!(
                "`{old}` is deprecated: read as `{new}` = {n} (most shards one rebalance round moves, over {absolute}); set `{new}` (and `rebalance-relative-limit`) instead"
            );
            absolute = n;
        }
        let budget = StopBudget::for_actors_configured(
            c.stop_timeout,
            &lease,
            &format!("lease.{lease_section}"),
            &config.key_for("sharding", type_name, "stop-timeout"),
        )?;
        Ok(ShardingSettings {
            role: c.role,
            lease_section,
            lease,
            number_of_shards: placement.number_of_shards,
            buffer_size: c.buffer_size,
            idle_timeout: c.idle_timeout.filter(|_| !c.remember_entities),
            active_entity_limit: c.active_entity_limit.filter(|_| !c.remember_entities),
            stop_timeout: budget.stop_timeout,
            retry_interval: c.retry_interval,
            unreachable_reallocate_after: c.unreachable_reallocate_after,
            rebalance_interval: c.rebalance_interval,
            rebalance_threshold: c.rebalance_threshold,
            rebalance_relative_limit: relative,
            rebalance_absolute_limit: absolute,
            hand_off_timeout: c.hand_off_timeout,
            remember_entities: c.remember_entities,
            entity_restart_backoff: c.entity_restart_backoff,
            when_kill_fails: c.when_kill_fails,
        })
    }
}

impl ShardingSettings {
    /// How long before a shard lease's local deadline its shard must learn of a loss: the
    /// loss delivered, `stop-timeout` for its entities, a kill of those still running, and
    /// the process ended if one outlived the kill.
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
        let c: ShardingConfig =
            tenure_lease::config::read_table("sharding", fragment["sharding"].as_table().unwrap())
                .unwrap();
        assert_eq!(c, ShardingConfig::default());
    }

    #[test]
    fn defaults_overrides_and_errors() {
        let config = TenureConfig::from_toml_str(
            "[sharding.counter]\nnumber-of-shards = 64\nidle-timeout = \"off\"",
            "t",
        )
        .unwrap();
        let s = ShardingSettings::from_config(&config, "counter", "sqlite").unwrap();
        assert_eq!((s.number_of_shards, s.idle_timeout), (64, None));
        let config =
            TenureConfig::from_toml_str("[sharding.counter]\nidle-timeout = \"1m 30s\"", "t")
                .unwrap();
        let s = ShardingSettings::from_config(&config, "counter", "sqlite").unwrap();
        assert_eq!(s.idle_timeout, Some(Duration::from_secs(90)));
        let other = ShardingSettings::from_config(&config, "other", "sqlite").unwrap();
        assert_eq!(other.number_of_shards, 100);
        assert_eq!(other.idle_timeout, Some(Duration::from_secs(120)));
        assert_eq!(other.buffer_size, 1000, "the reference's per-shard buffer");
        for (text, key) in [
            (
                "[sharding]\nnumber-of-shards = 0",
                "sharding.number-of-shards",
            ),
            ("[sharding.counter]\nrole = 1", "`sharding.counter.role`"),
            ("[sharding]\nrole = 1", "`sharding.role`"),
            (
                "[sharding.counter]\nshards = 1",
                "`sharding.counter.shards`",
            ),
            (
                "[sharding]\nidle-timeout = \"0s\"",
                "`sharding.idle-timeout`",
            ),
            (
                "[sharding.counter]\nbuffer-size = 0",
                "`sharding.counter.buffer-size`",
            ),
            (
                "[sharding.counter]\nhand-off-timeout = \"1m 30\"",
                "`sharding.counter.hand-off-timeout`",
            ),
            ("[sharding]\nlease-section = \"nope\"", "nope"),
            (
                "[sharding.counter]\nremember-entities = \"yes\"",
                "`sharding.counter.remember-entities`",
            ),
            (
                "[sharding]\nentity-restart-backoff = \"0s\"",
                "`sharding.entity-restart-backoff`",
            ),
            (
                "[sharding.counter]\nwhen-kill-fails = \"run-on\"",
                "`sharding.counter.when-kill-fails`",
            ),
            (
                "[sharding.counter]\nrebalance-relative-limit = 0.0",
                "`sharding.counter.rebalance-relative-limit`",
            ),
            (
                "[sharding]\nrebalance-relative-limit = 1.5",
                "`sharding.rebalance-relative-limit`",
            ),
            (
                "[sharding]\nrebalance-relative-limit = \"10%\"",
                "`sharding.rebalance-relative-limit`",
            ),
            (
                "[sharding.counter]\nrebalance-absolute-limit = 0",
                "`sharding.counter.rebalance-absolute-limit`",
            ),
            (
                "[sharding]\nrebalance-threshold = 0",
                "`sharding.rebalance-threshold`",
            ),
            (
                "[sharding]\nmax-simultaneous-rebalance = 0",
                "`sharding.max-simultaneous-rebalance`",
            ),
        ] {
            let config = TenureConfig::from_toml_str(text, "t").unwrap();
            let err = ShardingSettings::from_config(&config, "counter", "sqlite")
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
        let config = TenureConfig::from_toml_str(
            "[sharding.counter]\nremember-entities = true\nentity-restart-backoff = \"2s\"",
            "t",
        )
        .unwrap();
        let s = ShardingSettings::from_config(&config, "counter", "sqlite").unwrap();
        assert!(s.remember_entities);
        assert_eq!(s.entity_restart_backoff, Duration::from_secs(2));
        assert_eq!(
            s.idle_timeout, None,
            "no idle passivation of remembered entities"
        );
        let other = ShardingSettings::from_config(&config, "other", "sqlite").unwrap();
        assert!(!other.remember_entities, "off by default");
        assert_eq!(
            other.when_kill_fails,
            WhenKillFails::Abort,
            "safe by default"
        );
        assert_eq!(other.entity_restart_backoff, Duration::from_secs(10));
        let err = ShardingSettings::from_config(&config, "", "sqlite").unwrap_err();
        assert!(err.to_string().contains("entity type name"), "{err}");
    }

    #[test]
    fn rebalance_limits_and_the_deprecated_max_simultaneous_rebalance() {
        let config = TenureConfig::from_toml_str("", "t").unwrap();
        let s = ShardingSettings::from_config(&config, "counter", "sqlite").unwrap();
        assert_eq!(
            (
                s.rebalance_threshold,
                s.rebalance_relative_limit,
                s.rebalance_absolute_limit
            ),
            (1, 0.1, 100),
            "the reference's"
        );
        let config = TenureConfig::from_toml_str(
            "[sharding.counter]\nrebalance-relative-limit = 0.25\nrebalance-absolute-limit = 7",
            "t",
        )
        .unwrap();
        let s = ShardingSettings::from_config(&config, "counter", "sqlite").unwrap();
        assert_eq!(
            (s.rebalance_relative_limit, s.rebalance_absolute_limit),
            (0.25, 7)
        );
        // The deprecated key still bounds a round, as the absolute limit.
        let config =
            TenureConfig::from_toml_str("[sharding]\nmax-simultaneous-rebalance = 4", "t").unwrap();
        let s = ShardingSettings::from_config(&config, "counter", "sqlite").unwrap();
        assert_eq!(
            (s.rebalance_relative_limit, s.rebalance_absolute_limit),
            (0.1, 4)
        );
    }

    #[test]
    fn a_stop_timeout_that_does_not_fit_the_lease_is_refused_naming_both_keys() {
        // ttl 30 s, margin 3 s, interval 5 s: the budget must stay under 17 s.
        let lease = "[lease.sqlite]\nheartbeat-timeout = \"30s\"\n";
        let config = TenureConfig::from_toml_str(lease, "t").unwrap();
        let s = ShardingSettings::from_config(&config, "counter", "sqlite").unwrap();
        assert_eq!(
            s.stop_timeout,
            Duration::from_secs(3),
            "not set: heartbeat-timeout / 10"
        );
        let text = format!("{lease}[sharding.counter]\nstop-timeout = \"17s\"\n");
        let config = TenureConfig::from_toml_str(&text, "t").unwrap();
        let err = ShardingSettings::from_config(&config, "counter", "sqlite")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`sharding.counter.stop-timeout`")
                && err.contains("`lease.sqlite.heartbeat-timeout`"),
            "{err}"
        );
        // Another type keeps the default and is fine.
        ShardingSettings::from_config(&config, "other", "sqlite").unwrap();
        let text = format!("{lease}[sharding]\nstop-timeout = \"16s\"\n");
        let config = TenureConfig::from_toml_str(&text, "t").unwrap();
        ShardingSettings::from_config(&config, "counter", "sqlite").unwrap();
    }
}
