//! `[sharding]` settings (defaults in `config/reference.toml`), overridable per entity type
//! in `[sharding.<type>]`.

use std::time::Duration;

use tenure_cluster::placement::EntityPlacement;
use tenure_lease::config::TableReader;
use tenure_lease::{ConfigError, LeaseSettings, StopBudget, TenureConfig};

/// How one entity type is sharded.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardingSettings {
    /// `role`: only members with this role host shards ("" = every member).
    pub role: String,
    /// `lease-section`: the lease section of shard leases.
    pub lease_section: String,
    /// Timing of shard leases (the section's).
    pub lease: LeaseSettings,
    /// `number-of-shards`.
    pub number_of_shards: usize,
    /// `buffer-size`: messages kept for one shard while they cannot be delivered, by a
    /// region (each shard has its own buffer there) and by the shard itself.
    pub buffer_size: usize,
    /// `idle-timeout`: idle entities are passivated after it (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// `stop-timeout`: how long a stopping entity gets before it is killed (`0s` in config:
    /// the lease section's `heartbeat-timeout / 10`). Its [`stop_budget`](Self::stop_budget)
    /// fits the shard lease's timing.
    pub stop_timeout: Duration,
    /// `retry-interval`: region reports and re-asked shard homes.
    pub retry_interval: Duration,
    /// `unreachable-reallocate-after`.
    pub unreachable_reallocate_after: Duration,
    /// `rebalance-interval`.
    pub rebalance_interval: Duration,
    /// `rebalance-threshold`.
    pub rebalance_threshold: usize,
    /// `max-simultaneous-rebalance`.
    pub max_simultaneous_rebalance: usize,
    /// `hand-off-timeout`.
    pub hand_off_timeout: Duration,
}

const KEYS: [&str; 12] = [
    "role",
    "lease-section",
    "number-of-shards",
    "buffer-size",
    "idle-timeout",
    "stop-timeout",
    "retry-interval",
    "unreachable-reallocate-after",
    "rebalance-interval",
    "rebalance-threshold",
    "max-simultaneous-rebalance",
    "hand-off-timeout",
];

impl ShardingSettings {
    /// Reads `[sharding]`, then `[sharding.<type_name>]` over it; `cluster_lease_section`
    /// is used when neither names a lease section. Errors name the key.
    pub fn from_config(
        config: &TenureConfig,
        type_name: &str,
        cluster_lease_section: &str,
    ) -> Result<ShardingSettings, ConfigError> {
        tenure_lease::names::check_component("entity type name", type_name)?;
        let merged = config.table_for("sharding", type_name, &KEYS)?;
        let r = TableReader::new("sharding", &merged);
        // What decides where an entity lives is read once, as members compare it at join.
        let placement = EntityPlacement::read(config, Some(type_name), cluster_lease_section)?;
        let lease_section = placement.lease_section;
        let lease = config.lease_section(&lease_section)?.settings;
        let idle = r.duration("idle-timeout")?;
        let budget = StopBudget::for_actors_configured(
            r.duration("stop-timeout")?,
            &lease,
            &format!("lease.{lease_section}"),
            &config.key_for("sharding", type_name, "stop-timeout"),
        )?;
        Ok(ShardingSettings {
            role: r.string("role")?,
            lease_section,
            lease,
            number_of_shards: placement.number_of_shards,
            buffer_size: r.count("buffer-size")?,
            idle_timeout: (!idle.is_zero()).then_some(idle),
            stop_timeout: budget.stop_timeout,
            retry_interval: r.positive_duration("retry-interval")?,
            unreachable_reallocate_after: r.positive_duration("unreachable-reallocate-after")?,
            rebalance_interval: r.positive_duration("rebalance-interval")?,
            rebalance_threshold: r.count("rebalance-threshold")?,
            max_simultaneous_rebalance: r.count("max-simultaneous-rebalance")?,
            hand_off_timeout: r.positive_duration("hand-off-timeout")?,
        })
    }
}

impl ShardingSettings {
    /// How long before a shard lease's local deadline its shard must learn of a loss: the
    /// loss delivered, `stop-timeout` for its entities, a kill of those still running.
    pub fn stop_budget(&self) -> StopBudget {
        StopBudget::for_actors(self.stop_timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_overrides_and_errors() {
        let config = TenureConfig::from_toml_str(
            "[sharding.counter]\nnumber-of-shards = 64\nidle-timeout = \"0s\"",
            "t",
        )
        .unwrap();
        let s = ShardingSettings::from_config(&config, "counter", "sqlite").unwrap();
        assert_eq!((s.number_of_shards, s.idle_timeout), (64, None));
        let other = ShardingSettings::from_config(&config, "other", "sqlite").unwrap();
        assert_eq!(other.number_of_shards, 100);
        assert_eq!(other.idle_timeout, Some(Duration::from_secs(120)));
        assert_eq!(other.buffer_size, 1000, "the reference's per-shard buffer");
        for (text, key) in [
            (
                "[sharding]\nnumber-of-shards = 0",
                "sharding.number-of-shards",
            ),
            ("[sharding.counter]\nrole = 1", "sharding.role"),
            ("[sharding.counter]\nshards = 1", "sharding.counter.shards"),
            ("[sharding]\nlease-section = \"nope\"", "nope"),
        ] {
            let config = TenureConfig::from_toml_str(text, "t").unwrap();
            let err = ShardingSettings::from_config(&config, "counter", "sqlite")
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
        let err = ShardingSettings::from_config(&config, "", "sqlite").unwrap_err();
        assert!(err.to_string().contains("entity type name"), "{err}");
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
            "0s: heartbeat-timeout / 10"
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
