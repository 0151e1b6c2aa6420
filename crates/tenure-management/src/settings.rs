//! `[cluster.management]` settings.

use std::net::SocketAddr;
use std::time::Duration;

use tenure_lease::config::TableReader;
use tenure_lease::{ConfigError, TenureConfig};

const KEYS: [&str; 4] = ["enabled", "bind", "ready-suspended-after", "token"];

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
    /// `/down`); `None` (`token = ""`): those routes are off.
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
        let empty = toml_table();
        let table = config
            .table()
            .get("cluster")
            .and_then(|c| c.get("management"))
            .map(|m| {
                m.as_table()
                    .ok_or_else(|| ConfigError::invalid("cluster.management", "must be a table"))
            })
            .transpose()?
            .unwrap_or(&empty);
        let r = TableReader::new("cluster.management", table);
        r.reject_unknown(&KEYS)?;
        let bind = r.string("bind")?;
        let bind = bind.parse().map_err(|e| {
            ConfigError::invalid(
                "cluster.management.bind",
                format!("`{bind}` is not a host:port address: {e}"),
            )
        })?;
        let token = r.string("token")?;
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ConfigError::invalid(
                "cluster.management.token",
                "must not contain whitespace or control characters (it travels in an HTTP header)",
            ));
        }
        Ok(ManagementSettings {
            enabled: r.boolean("enabled")?,
            bind,
            ready_suspended_after: r.duration("ready-suspended-after")?,
            token: (!token.is_empty()).then_some(OperatorToken(token)),
        })
    }
}

fn toml_table() -> toml::Table {
    toml::Table::new()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(e.contains("bnid"), "{e}");
        let e = bad("[cluster.management]\ntoken = \"two words\"");
        assert!(e.contains("cluster.management.token"), "{e}");
        let e = bad("[cluster.management]\nready-suspended-after = \"soon\"");
        assert!(
            e.contains("cluster.management.ready-suspended-after"),
            "{e}"
        );
    }
}
