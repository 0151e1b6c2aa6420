//! Lease timing settings, with Akka Coordination's names and rules.

use std::time::Duration;

use serde::Deserialize;

use crate::error::ConfigError;

/// Timing of one lease section. Defaults: [`LeaseTiming`]'s (`[lease]` of the reference).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseSettings {
    /// `heartbeat-timeout`: the time-to-live the store gives each grant or renewal.
    pub heartbeat_timeout: Duration,
    /// `heartbeat-interval`: how often a holder renews (when not set in config:
    /// `max(heartbeat-timeout / 10, 5s)`). Must be `< heartbeat-timeout / 2`.
    pub heartbeat_interval: Duration,
    /// `lease-operation-timeout`: bound on every store operation; past it the outcome is unknown.
    pub lease_operation_timeout: Duration,
    /// `lease-retry-interval`: pause between acquire attempts of a user that keeps trying.
    pub lease_retry_interval: Duration,
    /// `safety-margin`: the holder stops believing in its lease this long before the earliest
    /// instant the store could expire it (when not set in config: `heartbeat-timeout / 10`).
    pub safety_margin: Duration,
    /// `lock-delay` (Chubby's and Consul's): after a grant lapses rather than being released
    /// (its holder crashed, froze or was cut off), the store grants the lease to nobody else
    /// for this long past the holder's time-to-live. Zero (the default): no delay. The
    /// holder's own deadline does not move; only the store keeps the grant longer, so a
    /// release frees the lease at once.
    pub lock_delay: Duration,
}

/// The timing keys of `[lease]` and of each lease section, as written: a section's keys
/// over `[lease]`'s, over these defaults. [`resolve`](Self::resolve) derives what is left
/// out and checks the rules between the values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
#[non_exhaustive]
pub struct LeaseTiming {
    /// `heartbeat-timeout` (120s).
    #[serde(deserialize_with = "crate::duration::serde::required")]
    pub heartbeat_timeout: Duration,
    /// `heartbeat-interval`; `None`: `max(heartbeat-timeout / 10, 5s)`.
    #[serde(deserialize_with = "crate::duration::serde::optional")]
    pub heartbeat_interval: Option<Duration>,
    /// `lease-operation-timeout` (5s).
    #[serde(deserialize_with = "crate::duration::serde::required")]
    pub lease_operation_timeout: Duration,
    /// `lease-retry-interval` (5s).
    #[serde(deserialize_with = "crate::duration::serde::required")]
    pub lease_retry_interval: Duration,
    /// `safety-margin`; `None`: `heartbeat-timeout / 10`.
    #[serde(deserialize_with = "crate::duration::serde::optional")]
    pub safety_margin: Option<Duration>,
    /// `lock-delay`; `None`: no delay.
    #[serde(deserialize_with = "crate::duration::serde::optional")]
    pub lock_delay: Option<Duration>,
}

/// The keys of [`LeaseTiming`]: in a lease section, every other key but `store` is a store
/// option.
pub(crate) const TIMING_KEYS: [&str; 6] = [
    "heartbeat-timeout",
    "heartbeat-interval",
    "lease-operation-timeout",
    "lease-retry-interval",
    "safety-margin",
    "lock-delay",
];

impl Default for LeaseTiming {
    /// Akka Coordination's defaults.
    fn default() -> Self {
        LeaseTiming {
            heartbeat_timeout: Duration::from_secs(120),
            heartbeat_interval: None,
            lease_operation_timeout: Duration::from_secs(5),
            lease_retry_interval: Duration::from_secs(5),
            safety_margin: None,
            lock_delay: None,
        }
    }
}

impl LeaseTiming {
    /// The settings these keys give, with the interval and margin derived when left out;
    /// errors name the offending key under `key_prefix` (`lease.sqlite`).
    pub fn resolve(&self, key_prefix: &str) -> Result<LeaseSettings, ConfigError> {
        let timeout = self.heartbeat_timeout;
        let settings = LeaseSettings {
            heartbeat_timeout: timeout,
            heartbeat_interval: self
                .heartbeat_interval
                .unwrap_or_else(|| default_interval(timeout)),
            lease_operation_timeout: self.lease_operation_timeout,
            lease_retry_interval: self.lease_retry_interval,
            safety_margin: self
                .safety_margin
                .unwrap_or_else(|| default_margin(timeout)),
            lock_delay: self.lock_delay.unwrap_or_default(),
        };
        settings.validate(key_prefix)?;
        Ok(settings)
    }
}

impl Default for LeaseSettings {
    /// [`LeaseTiming`]'s defaults, resolved.
    fn default() -> Self {
        LeaseTiming::default()
            .resolve("lease")
            .expect("the default lease timing is valid (a test checks it)")
    }
}

impl LeaseSettings {
    /// How long to wait for a LeaseActor's answer to a release: its store calls (a failed
    /// release is sent again, three tries in all, each bounded by `lease-operation-timeout`)
    /// may queue behind one renewal (bounded the same way).
    pub fn release_answer_timeout(&self) -> Duration {
        self.lease_operation_timeout * (crate::machine::RELEASE_TRIES + 1) + Duration::from_secs(1)
    }

    /// Settings with the given time-to-live, the interval and margin derived by the default
    /// rules, and the other values from the reference defaults.
    pub fn with_timeout(heartbeat_timeout: Duration) -> Self {
        let defaults = LeaseSettings::default();
        LeaseSettings {
            heartbeat_timeout,
            heartbeat_interval: default_interval(heartbeat_timeout),
            safety_margin: default_margin(heartbeat_timeout),
            ..defaults
        }
    }

    /// Checks the rules between the values; errors name the offending key under `key_prefix`.
    pub fn validate(&self, key_prefix: &str) -> Result<(), ConfigError> {
        let key = |k: &str| format!("{key_prefix}.{k}");
        let show = |d: Duration| humantime::format_duration(d).to_string();
        if self.heartbeat_timeout.is_zero() {
            return Err(ConfigError::invalid(
                key("heartbeat-timeout"),
                "must be > 0",
            ));
        }
        if self.heartbeat_interval.is_zero() {
            return Err(ConfigError::invalid(
                key("heartbeat-interval"),
                "must be > 0",
            ));
        }
        for (k, d) in [
            ("heartbeat-timeout", self.heartbeat_timeout),
            ("heartbeat-interval", self.heartbeat_interval),
            ("lease-operation-timeout", self.lease_operation_timeout),
            ("lease-retry-interval", self.lease_retry_interval),
            ("safety-margin", self.safety_margin),
            ("lock-delay", self.lock_delay),
        ] {
            crate::duration::check(d).map_err(|e| ConfigError::duration(key(k), e))?;
        }
        if self.heartbeat_interval * 2 >= self.heartbeat_timeout {
            return Err(ConfigError::invalid(
                key("heartbeat-interval"),
                format!(
                    "{} must be < heartbeat-timeout/2 ({}); the default is max(timeout/10, 5s), so set it explicitly for short timeouts",
                    show(self.heartbeat_interval),
                    show(self.heartbeat_timeout / 2)
                ),
            ));
        }
        if self.lease_operation_timeout.is_zero() {
            return Err(ConfigError::invalid(
                key("lease-operation-timeout"),
                "must be > 0",
            ));
        }
        if self.lease_retry_interval.is_zero() {
            return Err(ConfigError::invalid(
                key("lease-retry-interval"),
                "must be > 0",
            ));
        }
        if self.safety_margin + self.heartbeat_interval >= self.heartbeat_timeout {
            return Err(ConfigError::invalid(
                key("safety-margin"),
                format!(
                    "{} plus heartbeat-interval ({}) must be < heartbeat-timeout ({}), or a renewed lease would lapse before its next renewal",
                    show(self.safety_margin),
                    show(self.heartbeat_interval),
                    show(self.heartbeat_timeout)
                ),
            ));
        }
        crate::duration::check(self.store_ttl())
            .map_err(|e| ConfigError::duration(key("lock-delay"), e))?;
        Ok(())
    }

    /// The time-to-live the store gives each grant and renewal: `heartbeat-timeout` plus
    /// `lock-delay`. The holder believes for [`validity`](Self::validity) only; the rest is
    /// the delay in which nobody else can be granted a lease whose holder stopped renewing.
    pub fn store_ttl(&self) -> Duration {
        self.heartbeat_timeout.saturating_add(self.lock_delay)
    }

    /// How long after a request was *sent* its holder may still believe in the grant.
    pub fn validity(&self) -> Duration {
        self.heartbeat_timeout - self.safety_margin
    }
}

fn default_margin(timeout: Duration) -> Duration {
    timeout / 10
}

fn default_interval(timeout: Duration) -> Duration {
    (timeout / 10).max(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn akka_defaults() {
        let s = LeaseSettings::default();
        assert_eq!(s.heartbeat_timeout, Duration::from_secs(120));
        assert_eq!(s.heartbeat_interval, Duration::from_secs(12));
        assert_eq!(s.lease_operation_timeout, Duration::from_secs(5));
        assert_eq!(s.lease_retry_interval, Duration::from_secs(5));
        assert_eq!(s.safety_margin, Duration::from_secs(12));
        assert_eq!(s.lock_delay, Duration::ZERO);
        assert_eq!(s.store_ttl(), s.heartbeat_timeout);
    }

    #[test]
    fn lock_delay_lengthens_the_store_ttl_only() {
        let timing = LeaseTiming {
            heartbeat_timeout: Duration::from_secs(30),
            lock_delay: Some(Duration::from_secs(15)),
            ..LeaseTiming::default()
        };
        let s = timing.resolve("lease.x").unwrap();
        assert_eq!(s.store_ttl(), Duration::from_secs(45));
        assert_eq!(s.validity(), Duration::from_secs(27));
        let absurd = LeaseTiming {
            lock_delay: Some(Duration::from_secs(365 * 24 * 3600)),
            ..timing
        };
        let err = absurd.resolve("lease.x").unwrap_err().to_string();
        assert!(err.contains("lease.x.lock-delay"), "{err}");
    }

    #[test]
    fn interval_defaults_to_at_least_five_seconds() {
        let s = LeaseSettings::with_timeout(Duration::from_secs(30));
        assert_eq!(s.heartbeat_interval, Duration::from_secs(5));
        assert!(s.validate("lease").is_ok());
        // 10 s timeout: the default 5 s interval is not < 5 s.
        let err = LeaseSettings::with_timeout(Duration::from_secs(10))
            .validate("lease.x")
            .unwrap_err();
        assert!(
            err.to_string().contains("lease.x.heartbeat-interval"),
            "{err}"
        );
    }

    #[test]
    fn absurd_durations_are_refused() {
        let s = LeaseSettings {
            heartbeat_timeout: Duration::from_secs(1 << 40),
            ..Default::default()
        };
        let err = s.validate("lease.x").unwrap_err().to_string();
        assert!(
            err.contains("lease.x.heartbeat-timeout") && err.contains("365 days"),
            "{err}"
        );
    }

    #[test]
    fn margin_must_leave_room_for_a_renewal() {
        let mut s = LeaseSettings::with_timeout(Duration::from_secs(2));
        s.heartbeat_interval = Duration::from_millis(500);
        s.safety_margin = Duration::from_millis(1500);
        let err = s.validate("lease.t").unwrap_err();
        assert!(err.to_string().contains("lease.t.safety-margin"), "{err}");
    }
}
