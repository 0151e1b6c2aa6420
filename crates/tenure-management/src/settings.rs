//! `[cluster.management]` settings.

use std::net::SocketAddr;
use std::time::Duration;

use tenure_lease::config::TableReader;
use tenure_lease::{ConfigError, TenureConfig};

const KEYS: [&str; 3] = ["enabled", "bind", "ready-suspended-after"];

/// The management endpoint's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagementSettings {
    /// Whether a node serves the endpoint.
    pub enabled: bool,
    /// The address it listens on.
    pub bind: SocketAddr,
    /// How long a lease may stay suspended before the node is not ready.
    pub ready_suspended_after: Duration,
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
        Ok(ManagementSettings {
            enabled: r.boolean("enabled")?,
            bind,
            ready_suspended_after: r.duration("ready-suspended-after")?,
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
        let e = bad("[cluster.management]\nready-suspended-after = \"soon\"");
        assert!(
            e.contains("cluster.management.ready-suspended-after"),
            "{e}"
        );
    }
}
