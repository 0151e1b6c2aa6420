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
    /// `allowed-hosts`: host names requests may name in `Host` besides IP addresses,
    /// `localhost` and the node's cluster host.
    #[serde(deserialize_with = "tenure_lease::config::list")]
    pub allowed_hosts: Vec<String>,
    /// `max-connections`: connections served at once.
    pub max_connections: usize,
    /// `max-header-bytes`: the largest request head (request line and headers).
    pub max_header_bytes: usize,
    /// `idle-timeout`: how long a connection may go without sending a complete request head.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub idle_timeout: Duration,
    /// `shard-map-timeout`: the longest `/cluster/shards` waits for the shard maps.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub shard_map_timeout: Duration,
}

impl Default for ManagementConfig {
    fn default() -> Self {
        ManagementConfig {
            enabled: false,
            bind: "127.0.0.1:8558".into(),
            ready_suspended_after: Duration::from_secs(3),
            token: None,
            allowed_hosts: Vec::new(),
            max_connections: 64,
            max_header_bytes: 16 * 1024,
            idle_timeout: Duration::from_secs(30),
            shard_map_timeout: Duration::from_secs(3),
        }
    }
}

impl std::fmt::Debug for ManagementConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagementConfig")
            .field("enabled", &self.enabled)
            .field("bind", &self.bind)
            .field("ready_suspended_after", &self.ready_suspended_after)
            .field("allowed_hosts", &self.allowed_hosts)
            .field("max_connections", &self.max_connections)
            .field("max_header_bytes", &self.max_header_bytes)
            .field("idle_timeout", &self.idle_timeout)
            .field("shard_map_timeout", &self.shard_map_timeout)
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
    /// Host names (lower case) a request's `Host` may name besides IP addresses, `localhost`
    /// and the node's cluster host: a page that reaches the endpoint through DNS rebinding
    /// names its own host, which is not among them.
    pub allowed_hosts: Vec<String>,
    /// Connections served at once; more wait to be accepted.
    pub max_connections: usize,
    /// The largest request head in bytes; a larger one is answered 431.
    pub max_header_bytes: usize,
    /// How long a connection may go without a complete request head (a new one, or one
    /// kept alive between requests) before it is closed.
    pub idle_timeout: Duration,
    /// The longest `/cluster/shards` waits for the regions' shard maps.
    pub shard_map_timeout: Duration,
}

/// The fewest bytes `max-header-bytes` may allow (a browser's ordinary request head fits).
const MIN_HEADER_BYTES: usize = 1024;
/// The most bytes `max-header-bytes` may allow.
const MAX_HEADER_BYTES: usize = 1024 * 1024;

/// A bearer token; its `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct OperatorToken(String);

impl OperatorToken {
    /// The token itself, to present it (a client's `Authorization: Bearer` header).
    pub fn secret(&self) -> &str {
        &self.0
    }

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
        let allowed_hosts = c
            .allowed_hosts
            .iter()
            .enumerate()
            .map(|(i, host)| allowed_host(i, host))
            .collect::<Result<Vec<_>, _>>()?;
        if c.max_connections == 0 {
            return Err(ConfigError::invalid(
                "cluster.management.max-connections",
                "must be at least 1",
            ));
        }
        if !(MIN_HEADER_BYTES..=MAX_HEADER_BYTES).contains(&c.max_header_bytes) {
            return Err(ConfigError::invalid(
                "cluster.management.max-header-bytes",
                format!(
                    "{} is outside {MIN_HEADER_BYTES}..={MAX_HEADER_BYTES} (bytes)",
                    c.max_header_bytes
                ),
            ));
        }
        Ok(ManagementSettings {
            enabled: c.enabled,
            bind,
            ready_suspended_after: c.ready_suspended_after,
            token,
            allowed_hosts,
            max_connections: c.max_connections,
            max_header_bytes: c.max_header_bytes,
            idle_timeout: c.idle_timeout,
            shard_map_timeout: c.shard_map_timeout,
        })
    }
}

/// Entry `i` of `allowed-hosts`: a DNS name (letters, digits, `-`, `.`), without a port,
/// in lower case.
fn allowed_host(i: usize, host: &str) -> Result<String, ConfigError> {
    let name = host.strip_suffix('.').unwrap_or(host);
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .split('.')
            .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    if !ok {
        return Err(ConfigError::invalid(
            format!("cluster.management.allowed-hosts[{i}]"),
            format!(
                "`{host}` is not a host name (letters, digits, `-` and `.`, without a port; IP addresses are always accepted)"
            ),
        ));
    }
    Ok(name.to_ascii_lowercase())
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

    #[test]
    fn the_doors_settings_read_and_bad_ones_name_the_key() {
        let s = ManagementSettings::from_config(&TenureConfig::reference()).unwrap();
        assert!(s.allowed_hosts.is_empty());
        assert_eq!(s.max_connections, 64);
        assert_eq!(s.max_header_bytes, 16 * 1024);
        assert_eq!(s.idle_timeout, Duration::from_secs(30));
        assert_eq!(s.shard_map_timeout, Duration::from_secs(3));
        let config = TenureConfig::from_toml_str(
            "[cluster.management]\nallowed-hosts = [\"Node-A.example.\", \"ops\"]\nmax-connections = 2\nmax-header-bytes = 4096\nidle-timeout = \"250ms\"\nshard-map-timeout = \"1s\"",
            "test",
        )
        .unwrap();
        let s = ManagementSettings::from_config(&config).unwrap();
        assert_eq!(s.allowed_hosts, ["node-a.example", "ops"]);
        assert_eq!((s.max_connections, s.max_header_bytes), (2, 4096));
        assert_eq!(s.idle_timeout, Duration::from_millis(250));
        assert_eq!(s.shard_map_timeout, Duration::from_secs(1));
        let bad = |toml: &str| {
            let config = TenureConfig::from_toml_str(toml, "test").unwrap();
            ManagementSettings::from_config(&config)
                .unwrap_err()
                .to_string()
        };
        for (toml, key) in [
            (
                "allowed-hosts = [\"ok.example\", \"evil.example:80\"]",
                "cluster.management.allowed-hosts[1]",
            ),
            (
                "allowed-hosts = [\"\"]",
                "cluster.management.allowed-hosts[0]",
            ),
            ("max-connections = 0", "cluster.management.max-connections"),
            (
                "max-header-bytes = 100",
                "cluster.management.max-header-bytes",
            ),
            ("idle-timeout = \"0s\"", "cluster.management.idle-timeout"),
            (
                "shard-map-timeout = \"never\"",
                "cluster.management.shard-map-timeout",
            ),
        ] {
            let e = bad(&format!("[cluster.management]\n{toml}"));
            assert!(e.contains(key), "{toml}: {e}");
        }
    }
}
