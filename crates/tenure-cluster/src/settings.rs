//! The `[cluster]` configuration section (defaults in `config/reference.toml`).

use std::path::PathBuf;
use std::time::Duration;

use tenure_lease::config::TableReader;
use tenure_lease::{ConfigError, LeaseSettings, TenureConfig};

use crate::error::ClusterError;
use crate::identity::NodeAddr;
use crate::placement::Placement;
use crate::sbr::SbrSettings;

/// Files for TLS between nodes (mutual: each side presents a certificate signed by `ca`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// `cluster.tls.cert`: this node's certificate (PEM).
    pub cert: PathBuf,
    /// `cluster.tls.key`: this node's private key (PEM).
    pub key: PathBuf,
    /// `cluster.tls.ca`: the CA certificates that sign every node's certificate (PEM).
    pub ca: PathBuf,
}

/// Everything a node reads from `[cluster]`.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// `[tenure] system`: prefixes member, singleton and shard lease names.
    pub system: String,
    /// `host` and `port`: where this node listens and how peers dial it; its identity.
    pub addr: NodeAddr,
    /// `cookie`: shared secret; a peer with another cookie is refused.
    pub cookie: String,
    /// `seeds`: nodes dialled at start (and again whenever no session to them is up).
    pub seeds: Vec<NodeAddr>,
    /// `roles`: what this node offers (singletons and entity types may require a role).
    pub roles: Vec<String>,
    /// `lease-section`: the lease section holding member leases.
    pub lease_section: String,
    /// Timing of the member lease: the section's, with `member-lease-ttl` and
    /// `member-lease-interval` applied.
    pub member_lease: LeaseSettings,
    /// `membership-interval`: how often the member leases are listed from the store.
    pub membership_interval: Duration,
    /// `heartbeat-interval`: node-to-node heartbeat period.
    pub heartbeat_interval: Duration,
    /// `unreachable-after`: silence after which a peer is marked unreachable.
    pub unreachable_after: Duration,
    /// `reconnect-backoff-min` / `-max`: bounds of the jittered exponential redial backoff.
    pub reconnect_backoff_min: Duration,
    /// `reconnect-backoff-max`: the longest redial wait (before jitter).
    pub reconnect_backoff_max: Duration,
    /// `dial-timeout`: bound on one TCP (and TLS) connect.
    pub dial_timeout: Duration,
    /// `leave-timeout`: how long a leaving node waits for its subscribers to hand over.
    pub leave_timeout: Duration,
    /// `max-frame-size`: largest inbound frame in bytes; a peer sending more is disconnected.
    pub max_frame_size: u64,
    /// `fault-injection`: accept link-cut commands (tests and drills only).
    pub fault_injection: bool,
    /// `[cluster.tls]` when `enabled`.
    pub tls: Option<TlsFiles>,
    /// The settings that decide where entities live (`[sharding]`): every member must have
    /// the same; a node whose placement differs from a member's is refused at join.
    pub placement: Placement,
    /// `[cluster.split-brain-resolver]`, unless its `active-strategy` is `"off"`.
    pub split_brain_resolver: Option<SbrSettings>,
}

const KEYS: [&str; 20] = [
    "host",
    "roles",
    "port",
    "cookie",
    "seeds",
    "lease-section",
    "member-lease-ttl",
    "member-lease-interval",
    "membership-interval",
    "heartbeat-interval",
    "unreachable-after",
    "reconnect-backoff-min",
    "reconnect-backoff-max",
    "dial-timeout",
    "leave-timeout",
    "max-frame-size",
    "fault-injection",
    "tls",
    "management",
    "split-brain-resolver",
];

impl ClusterSettings {
    /// Reads and checks `[cluster]`; every error names the key.
    pub fn from_config(config: &TenureConfig) -> Result<ClusterSettings, ClusterError> {
        let table = config
            .table()
            .get("cluster")
            .and_then(|v| v.as_table())
            .ok_or_else(|| ConfigError::invalid("cluster", "must be a table"))?;
        let r = TableReader::new("cluster", table);
        r.reject_unknown(&KEYS)?;

        let host = r.string("host")?;
        let port = r.integer("port")?;
        let port = u16::try_from(port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| {
                ConfigError::invalid(
                    "cluster.port",
                    format!("{port} is not a port from 1 to 65535"),
                )
            })?;
        let addr = NodeAddr::parse("cluster.host", &format!("{host}:{port}"))?;

        let cookie = r.string("cookie")?;
        if cookie.is_empty() {
            return Err(ConfigError::invalid(
                "cluster.cookie",
                "required: the shared secret every node of the cluster uses (set it in the config file or TENURE_CLUSTER__COOKIE)",
            )
            .into());
        }

        let seeds = match table.get("seeds") {
            Some(toml::Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let key = format!("cluster.seeds[{i}]");
                    match v.as_str() {
                        Some(s) => NodeAddr::parse(&key, s),
                        None => {
                            Err(ConfigError::invalid(key, "expected a \"host:port\" string").into())
                        }
                    }
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(toml::Value::String(s)) if s.is_empty() => Vec::new(),
            Some(toml::Value::String(s)) => s
                .split(',')
                .enumerate()
                .map(|(i, s)| NodeAddr::parse(&format!("cluster.seeds[{i}]"), s.trim()))
                .collect::<Result<Vec<_>, _>>()?,
            _ => {
                return Err(ConfigError::invalid(
                    "cluster.seeds",
                    "expected a list of \"host:port\" strings",
                )
                .into());
            }
        };

        let roles = match table.get("roles") {
            None => Vec::new(),
            Some(toml::Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let key = format!("cluster.roles[{i}]");
                    match v.as_str() {
                        Some(role)
                            if !role.is_empty()
                                && !role.contains(',')
                                && !role.chars().any(char::is_control) =>
                        {
                            Ok(role.to_string())
                        }
                        _ => Err(ConfigError::invalid(
                            key,
                            "expected a non-empty role name without commas",
                        )),
                    }
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => {
                return Err(
                    ConfigError::invalid("cluster.roles", "expected a list of role names").into(),
                );
            }
        };
        let mut lease_section = r.string("lease-section")?;
        if lease_section.is_empty() {
            lease_section = config.default_lease_section()?;
        }
        let section = config.lease_section(&lease_section)?;
        let ttl = r.duration("member-lease-ttl")?;
        let interval = r.duration("member-lease-interval")?;
        let member_lease = LeaseSettings {
            heartbeat_timeout: ttl,
            heartbeat_interval: interval,
            lease_retry_interval: interval,
            safety_margin: ttl / 10,
            lease_operation_timeout: section.settings.lease_operation_timeout.min(ttl / 2),
        };
        member_lease
            .validate("cluster")
            .map_err(rename_member_keys)?;

        let placement = Placement::from_config(config, &lease_section)?;
        let settings = ClusterSettings {
            system: config.system()?,
            addr,
            cookie,
            seeds,
            roles,
            lease_section,
            member_lease,
            membership_interval: r.positive_duration("membership-interval")?,
            heartbeat_interval: r.positive_duration("heartbeat-interval")?,
            unreachable_after: r.positive_duration("unreachable-after")?,
            reconnect_backoff_min: r.positive_duration("reconnect-backoff-min")?,
            reconnect_backoff_max: r.positive_duration("reconnect-backoff-max")?,
            dial_timeout: r.positive_duration("dial-timeout")?,
            leave_timeout: r.positive_duration("leave-timeout")?,
            max_frame_size: r.integer("max-frame-size").and_then(|n| {
                u64::try_from(n).ok().filter(|n| *n >= 4096).ok_or_else(|| {
                    ConfigError::invalid(
                        "cluster.max-frame-size",
                        format!("{n} must be at least 4096 (bytes)"),
                    )
                })
            })?,
            fault_injection: fault_injection(r.boolean("fault-injection")?)?,
            tls: tls_files(table)?,
            placement,
            split_brain_resolver: match table.get("split-brain-resolver") {
                Some(toml::Value::Table(t)) => SbrSettings::from_table(t)?,
                Some(_) => {
                    return Err(ConfigError::invalid(
                        "cluster.split-brain-resolver",
                        "must be a table",
                    )
                    .into());
                }
                None => None,
            },
        };
        if settings.heartbeat_interval * 2 > settings.unreachable_after {
            return Err(ConfigError::invalid(
                "cluster.unreachable-after",
                "must be at least twice cluster.heartbeat-interval",
            )
            .into());
        }
        if settings.reconnect_backoff_min > settings.reconnect_backoff_max {
            return Err(ConfigError::invalid(
                "cluster.reconnect-backoff-min",
                "must not exceed cluster.reconnect-backoff-max",
            )
            .into());
        }
        Ok(settings)
    }

    /// The member lease name of `addr`: `<system>-member-<host:port>`.
    pub fn member_lease_name(&self, addr: &NodeAddr) -> String {
        format!("{}{addr}", self.member_prefix())
    }

    /// The prefix of all member lease names of this system.
    pub fn member_prefix(&self) -> String {
        format!("{}-member-", self.system)
    }
}

/// `cluster.fault-injection`, which only a build with the `fault-injection` feature can
/// honour: elsewhere `true` is an error rather than a setting silently ignored.
fn fault_injection(wanted: bool) -> Result<bool, ConfigError> {
    if wanted && !cfg!(feature = "fault-injection") {
        return Err(ConfigError::invalid(
            "cluster.fault-injection",
            "is true, but this build has no fault injection: enable the `fault-injection` \
             feature of tenure-cluster (tenure-cli enables it)",
        ));
    }
    Ok(wanted)
}

fn rename_member_keys(e: ConfigError) -> ConfigError {
    match e {
        ConfigError::Invalid { key, detail } => ConfigError::Invalid {
            key: key
                .replace("cluster.heartbeat-timeout", "cluster.member-lease-ttl")
                .replace(
                    "cluster.heartbeat-interval",
                    "cluster.member-lease-interval",
                )
                .replace("cluster.safety-margin", "cluster.member-lease-interval"),
            detail: detail.replace("heartbeat-timeout", "member-lease-ttl"),
        },
        other => other,
    }
}

fn tls_files(table: &toml::Table) -> Result<Option<TlsFiles>, ConfigError> {
    let Some(tls) = table.get("tls") else {
        return Ok(None);
    };
    let tls = tls
        .as_table()
        .ok_or_else(|| ConfigError::invalid("cluster.tls", "must be a table"))?;
    let r = TableReader::new("cluster.tls", tls);
    r.reject_unknown(&["enabled", "cert", "key", "ca"])?;
    if !r.boolean("enabled")? {
        return Ok(None);
    }
    let path = |k: &str| -> Result<PathBuf, ConfigError> {
        let p = r.string(k)?;
        if p.is_empty() {
            return Err(ConfigError::invalid(
                r.key(k),
                "required when cluster.tls.enabled = true",
            ));
        }
        Ok(PathBuf::from(p))
    };
    Ok(Some(TlsFiles {
        cert: path("cert")?,
        key: path("key")?,
        ca: path("ca")?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(extra: &str) -> Result<ClusterSettings, ClusterError> {
        let text = format!("[cluster]\ncookie = \"secret\"\nport = 4701\n{extra}");
        ClusterSettings::from_config(&TenureConfig::from_toml_str(&text, "test")?)
    }

    #[test]
    fn defaults_and_overrides() {
        let s = load("seeds = [\"127.0.0.1:4702\", \"node-b:4703\"]").unwrap();
        assert_eq!(s.addr.to_string(), "127.0.0.1:4701");
        assert_eq!(s.seeds.len(), 2);
        assert_eq!(s.member_lease_name(&s.addr), "tenure-member-127.0.0.1:4701");
        assert!(s.tls.is_none());
        s.member_lease.validate("x").unwrap();
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            ("seeds = [\"nope\"]", "cluster.seeds[0]"),
            ("seeds = [1]", "cluster.seeds[0]"),
            ("heartbeat-interval = \"0s\"", "cluster.heartbeat-interval"),
            ("unraechable-after = \"1s\"", "cluster.unraechable-after"),
            (
                "member-lease-interval = \"9s\"",
                "cluster.member-lease-interval",
            ),
            ("[cluster.tls]\nenabled = true", "cluster.tls.cert"),
        ];
        for (extra, key) in cases {
            let err = load(extra).unwrap_err().to_string();
            assert!(err.contains(key), "{extra}: {err}");
        }
        let text = "[cluster]\nport = 4701\n";
        let err = ClusterSettings::from_config(&TenureConfig::from_toml_str(text, "t").unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("cluster.cookie"), "{err}");
        let text = "[cluster]\ncookie = \"c\"\nport = 0\n";
        let err = ClusterSettings::from_config(&TenureConfig::from_toml_str(text, "t").unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("cluster.port"), "{err}");
    }

    #[test]
    #[cfg(not(feature = "fault-injection"))]
    fn fault_injection_without_the_feature_names_the_key_and_the_feature() {
        let err = load("fault-injection = true").unwrap_err().to_string();
        assert!(err.contains("cluster.fault-injection"), "{err}");
        assert!(err.contains("`fault-injection` feature"), "{err}");
        assert!(!load("fault-injection = false").unwrap().fault_injection);
    }

    #[test]
    #[cfg(feature = "fault-injection")]
    fn fault_injection_with_the_feature_is_a_setting() {
        assert!(load("fault-injection = true").unwrap().fault_injection);
        assert!(!load("").unwrap().fault_injection);
    }
}
