//! `[cluster.management]` settings.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;
use tenure_lease::{ConfigError, TenureConfig};

/// This crate's fragment of the reference configuration: `[cluster.management]` (shown in
/// `config/reference.toml`).
pub const REFERENCE: &str = include_str!("../reference.toml");

/// `[cluster.management]` as written (defaults: [`REFERENCE`]);
/// [`ManagementSettings::from_config`] checks it.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
#[non_exhaustive]
pub struct ManagementConfig {
    /// `enabled`: serve the management endpoint.
    pub enabled: bool,
    /// `bind`: `host:port`.
    pub bind: String,
    /// `ready-suspended-after`: how long a lease may stay suspended before
    /// `/health/ready` fails.
    #[serde(deserialize_with = "tenure_lease::duration::serde::required")]
    pub ready_suspended_after: Duration,
    /// `token`; `None`: the operator routes are off.
    pub token: Option<String>,
}

impl Default for ManagementConfig {
    fn default() -> Self {
        ManagementConfig {
            enabled: false,
            bind: "127.0.0.1:8558".into(),
            ready_suspended_after: Duration::from_secs(3),
            token: None,
        }
    }
}

impl std::fmt::Debug for ManagementConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagementConfig")
            .field("enabled", &self.enabled)
            .field("bind", &self.bind)
            .field("ready_suspended_after", &self.ready_suspended_after)
            .finish_non_exhaustive()
    }
}

/// The management endpoint's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagementSettings {
    /// Whether a node serves the endpoint.
    pub enabled: bool,
    /// The address it listens on.
    pub bind: SocketAddr,
    /// How long a lease may stay suspended before the node is not ready.
    pub ready_suspended_after: Duration,
    /// The bearer token of the operator routes (`POST /cluster/members/{addr}/leave` and
    /// `/down`); `None` (no `token`): those routes are off.
    pub token: Option<OperatorToken>,
}

/// A bearer token; its `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct OperatorToken(String);

impl OperatorToken {
    /// Whether `presented` is this token, compared in time that does not depend on where
    /// they differ (a guess cannot be refined byte by byte from response times).
    pub fn matches(&self, presented: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), presented.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

impl std::fmt::Debug for OperatorToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OperatorToken(..)")
    }
}

impl ManagementSettings {
    /// Reads `[cluster.management]`; errors name the key.
    pub fn from_config(config: &TenureConfig) -> Result<Self, ConfigError> {
        let c: ManagementConfig = config.section("cluster.management")?;
        let bind = c.bind.parse().map_err(|e| {
            ConfigError::invalid(
                "cluster.management.bind",
                format!("`{}` is not a host:port address: {e}", c.bind),
            )
        })?;
        let token = match c.token {
            Some(token) if token.is_empty() => {
                return Err(ConfigError::invalid(
                    "cluster.management.token",
                    "must not be empty (leave it out to turn the operator routes off)",
                ));
            }
            Some(token) if token.chars().any(|c| c.is_whitespace() || c.is_control()) => {
                return Err(ConfigError::invalid(
                    "cluster.management.token",
                    "must not contain whitespace or control characters (it travels in an HTTP header)",
                ));
            }
            token => token.map(OperatorToken),
        };
        Ok(ManagementSettings {
            enabled: c.enabled,
            bind,
            ready_suspended_after: c.ready_suspended_after,
            token,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_fragment_is_the_defaults() {
        let fragment: toml::Table = toml::from_str(REFERENCE).unwrap();
        let table = fragment["cluster"]["management"].as_table().unwrap();
        let c: ManagementConfig =
            tenure_lease::config::read_table("cluster.management", table).unwrap();
        assert_eq!(c, ManagementConfig::default());
    }

    #[test]
    fn defaults_and_bad_input_naming_the_key() {
        let s = ManagementSettings::from_config(&TenureConfig::reference()).unwrap();
        assert!(!s.enabled);
        assert_eq!(s.bind, "127.0.0.1:8558".parse().unwrap());
        assert_eq!(s.ready_suspended_after, Duration::from_secs(3));
        assert_eq!(s.token, None);
        let with = TenureConfig::from_toml_str("[cluster.management]\ntoken = \"s3cret\"", "test")
            .unwrap();
        let token = ManagementSettings::from_config(&with)
            .unwrap()
            .token
            .unwrap();
        assert!(token.matches("s3cret") && !token.matches("s3cre") && !token.matches("s3creT"));
        assert!(!format!("{token:?}").contains("s3cret"));
        let bad = |toml: &str| {
            let config = TenureConfig::from_toml_str(toml, "test").unwrap();
            ManagementSettings::from_config(&config)
                .unwrap_err()
                .to_string()
        };
        let e = bad("[cluster.management]\nbind = \"nowhere\"");
        assert!(
            e.contains("cluster.management.bind") && e.contains("nowhere"),
            "{e}"
        );
        let e = bad("[cluster.management]\nbnid = \"127.0.0.1:1\"");
        assert!(e.contains("`cluster.management.bnid`"), "{e}");
        let e = bad("[cluster.management]\ntoken = \"\"");
        assert!(e.contains("cluster.management.token"), "{e}");
        let config = TenureConfig::from_toml_str(
            "[cluster.management]\nready-suspended-after = \"1500ms\"",
            "test",
        )
        .unwrap();
        let s = ManagementSettings::from_config(&config).unwrap();
        assert_eq!(s.ready_suspended_after, Duration::from_millis(1500));
        let e = bad("[cluster.management]\ntoken = \"two words\"");
        assert!(e.contains("cluster.management.token"), "{e}");
        let e = bad("[cluster.management]\nready-suspended-after = \"soon\"");
        assert!(
            e.contains("cluster.management.ready-suspended-after"),
            "{e}"
        );
    }
}
