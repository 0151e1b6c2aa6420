//! The `[cluster]` configuration section (defaults: [`ClusterConfig`]'s, documented in this
//! crate's `reference.toml`).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use tenure_lease::{ConfigError, LeaseSettings, TenureConfig};

use crate::app_version::AppVersion;
use crate::error::ClusterError;
use crate::identity::NodeAddr;
use crate::placement::Placement;
use crate::sbr::{SbrConfig, SbrSettings};
use crate::shutdown::ShutdownConfig;

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
    /// `app-version`: the version of the application this node runs (rolling updates).
    pub app_version: AppVersion,
    /// `lease-section`: the lease section holding member leases.
    pub lease_section: String,
    /// Timing of the member lease: the section's, with `member-lease-ttl` and
    /// `member-lease-interval` applied.
    pub member_lease: LeaseSettings,
    /// `membership-interval`: how often the member leases are listed from the store.
    pub membership_interval: Duration,
    /// `membership-listing-every`: on a store that answers whether the member leases
    /// changed ([`tenure_lease::GrantChanges`]), every this many `membership-interval`s a
    /// node lists them even though nothing changed (a repair); at least 1 (1: every
    /// interval lists, as on stores without the capability).
    pub membership_listing_every: u32,
    /// `peer-heartbeat-interval`: node-to-node heartbeat period.
    pub heartbeat_interval: Duration,
    /// `unreachable-after`: silence after which a peer is marked unreachable.
    pub unreachable_after: Duration,
    /// `monitored-by-nr-of-members`: how many members watch each member ([`crate::ring`]).
    pub monitored_by: usize,
    /// `indirect-probes`: how many members probe a late peer before it is unreachable.
    pub indirect_probes: usize,
    /// `reachability-sync-interval`: at most how often a node asks a peer for its whole
    /// reachability table ([`crate::sbr::Spread`]).
    pub reachability_sync_interval: Duration,
    /// `reconnect-backoff-min` / `-max`: bounds of the jittered exponential redial backoff.
    pub reconnect_backoff_min: Duration,
    /// `reconnect-backoff-max`: the longest redial wait (before jitter).
    pub reconnect_backoff_max: Duration,
    /// `dial-timeout`: bound on one TCP (and TLS) connect.
    pub dial_timeout: Duration,
    /// `handshake-timeout`: how long a connection, inbound or outbound, may take to
    /// authenticate (TLS handshake and cookie) before it is closed.
    pub handshake_timeout: Duration,
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
    /// `[cluster.coordinated-shutdown]`: the timeout of each phase of a graceful shutdown.
    pub shutdown: ShutdownConfig,
}

/// This crate's fragment of the reference configuration: `[cluster]`, `[cluster.tls]` and
/// `[cluster.split-brain-resolver]` (shown in `config/reference.toml`).
pub const REFERENCE: &str = include_str!("../reference.toml");

/// `[cluster]` as written (defaults: [`REFERENCE`]); [`ClusterSettings::from_config`]
/// checks it and resolves what depends on other sections. Each field is the key of the
/// same name in kebab-case, documented in the reference.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
#[non_exhaustive]
pub struct ClusterConfig {
    /// `host`: the host part of this node's address (its identity and lease owner).
    pub host: String,
    /// `port`: its port, for TCP sessions and UDP heartbeats alike.
    pub port: u16,
    /// Required: there is no default secret.
    pub cookie: Option<String>,
    /// `seeds`: nodes dialled at start, as `host:port`.
    #[serde(deserialize_with = "tenure_lease::config::list")]
    pub seeds: Vec<String>,
    /// `roles`: this node's roles (singletons and entity types may require one).
    #[serde(deserialize_with = "tenure_lease::config::list")]
    pub roles: Vec<String>,
    /// `app-version`: the application version this node runs.
    pub app_version: String,
    /// `None`: `[tenure] default-lease-section`.
    pub lease_section: Option<String>,
    /// `member-lease-ttl`: the member lease's time-to-live.
    #[serde(deserialize_with = "tenure_lease::duration::serde::required")]
    pub member_lease_ttl: Duration,
    /// `member-lease-interval`: how often the member lease is renewed.
    #[serde(deserialize_with = "tenure_lease::duration::serde::required")]
    pub member_lease_interval: Duration,
    /// `membership-interval`: how often the member leases are listed.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub membership_interval: Duration,
    /// `membership-listing-every`: how many intervals apart the repair listings are.
    pub membership_listing_every: u32,
    /// `peer-heartbeat-interval`: how often each watched peer gets a heartbeat.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub peer_heartbeat_interval: Duration,
    /// `unreachable-after`: the silence after which a peer is unreachable.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub unreachable_after: Duration,
    /// `monitored-by-nr-of-members`: how many members watch each member.
    pub monitored_by_nr_of_members: usize,
    /// `indirect-probes`: how many members probe a late peer (0: none).
    pub indirect_probes: usize,
    /// `reachability-sync-interval`: at most how often a node asks a peer for its whole
    /// table.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub reachability_sync_interval: Duration,
    /// `reconnect-backoff-min`: the first redial delay.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub reconnect_backoff_min: Duration,
    /// `reconnect-backoff-max`: the longest redial delay.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub reconnect_backoff_max: Duration,
    /// `dial-timeout`: how long one dial may take.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub dial_timeout: Duration,
    /// `handshake-timeout`: how long a connection may take to authenticate.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub handshake_timeout: Duration,
    /// `leave-timeout`: how long a graceful leave waits for its hand-overs.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub leave_timeout: Duration,
    /// `max-frame-size`: the largest frame a session accepts, in bytes.
    pub max_frame_size: u64,
    /// `fault-injection`: accept link faults on request (feature `fault-injection`).
    pub fault_injection: bool,
    /// `[cluster.tls]`.
    pub tls: TlsConfig,
    /// `[cluster.split-brain-resolver]`.
    pub split_brain_resolver: SbrConfig,
    /// `[cluster.coordinated-shutdown]`.
    pub coordinated_shutdown: ShutdownConfig,
    /// `[cluster.management]`: read by the management endpoint's crate (tenure-management).
    pub management: Option<toml::Table>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            host: "127.0.0.1".into(),
            port: 2552,
            cookie: None,
            seeds: Vec::new(),
            roles: Vec::new(),
            app_version: crate::app_version::DEFAULT_APP_VERSION.to_string(),
            lease_section: None,
            member_lease_ttl: Duration::from_secs(10),
            member_lease_interval: Duration::from_secs(1),
            membership_interval: Duration::from_secs(1),
            membership_listing_every: 30,
            peer_heartbeat_interval: Duration::from_millis(500),
            unreachable_after: Duration::from_secs(3),
            monitored_by_nr_of_members: 9,
            indirect_probes: 3,
            reachability_sync_interval: Duration::from_secs(5),
            reconnect_backoff_min: Duration::from_millis(200),
            reconnect_backoff_max: Duration::from_secs(5),
            dial_timeout: Duration::from_secs(3),
            handshake_timeout: Duration::from_secs(5),
            leave_timeout: Duration::from_secs(20),
            max_frame_size: 8 * 1024 * 1024,
            fault_injection: false,
            tls: TlsConfig::default(),
            split_brain_resolver: SbrConfig::default(),
            coordinated_shutdown: ShutdownConfig::default(),
            management: None,
        }
    }
}

/// `[cluster.tls]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
#[non_exhaustive]
pub struct TlsConfig {
    /// `enabled`: sessions between nodes use TLS.
    pub enabled: bool,
    /// `cert`: this node's certificate chain (PEM); required when `enabled`.
    pub cert: Option<PathBuf>,
    /// `key`: its private key (PEM); required when `enabled`.
    pub key: Option<PathBuf>,
    /// `ca`: the CA that signs every node's certificate (PEM); required when `enabled`.
    pub ca: Option<PathBuf>,
}

impl ClusterSettings {
    /// Reads and checks `[cluster]`; every error names the key.
    pub fn from_config(config: &TenureConfig) -> Result<ClusterSettings, ClusterError> {
        let c: ClusterConfig = config.section("cluster")?;
        if c.port == 0 {
            return Err(
                ConfigError::invalid("cluster.port", "0 is not a port from 1 to 65535").into(),
            );
        }
        let addr = NodeAddr::parse("cluster.host", &format!("{}:{}", c.host, c.port))?;
        let cookie = c.cookie.clone().filter(|c| !c.is_empty()).ok_or_else(|| {
            ConfigError::invalid(
                "cluster.cookie",
                "required: the shared secret every node of the cluster uses (set it in the config file or TENURE_CLUSTER__COOKIE)",
            )
        })?;
        check_cookie(&cookie)?;
        let seeds = c
            .seeds
            .iter()
            .enumerate()
            .map(|(i, s)| NodeAddr::parse(&format!("cluster.seeds[{i}]"), s.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        let roles = c
            .roles
            .iter()
            .enumerate()
            .map(|(i, role)| {
                if role.is_empty() || role.contains(',') || role.chars().any(char::is_control) {
                    Err(ConfigError::invalid(
                        format!("cluster.roles[{i}]"),
                        "expected a non-empty role name without commas",
                    ))
                } else {
                    Ok(role.clone())
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        if c.app_version.is_empty() || c.app_version.chars().any(char::is_whitespace) {
            return Err(ConfigError::invalid(
                "cluster.app-version",
                format!(
                    "{:?}: expected a version without spaces, such as \"1.4.2\" (compared as semantic versions when both parse, else as text)",
                    c.app_version
                ),
            )
            .into());
        }
        let lease_section = match &c.lease_section {
            Some(section) => section.clone(),
            None => config.default_lease_section()?,
        };
        let section = config.lease_section(&lease_section)?;
        let ttl = c.member_lease_ttl;
        let interval = c.member_lease_interval;
        let member_lease = LeaseSettings {
            heartbeat_timeout: ttl,
            heartbeat_interval: interval,
            lease_retry_interval: interval,
            safety_margin: ttl / 10,
            lease_operation_timeout: section.settings.lease_operation_timeout.min(ttl / 2),
            // A member lease lapsing means the node is gone: no reason to wait longer.
            lock_delay: Duration::ZERO,
        };
        member_lease
            .validate("cluster")
            .map_err(rename_member_keys)?;
        if c.max_frame_size < 4096 {
            return Err(ConfigError::invalid(
                "cluster.max-frame-size",
                format!("{} must be at least 4096 (bytes)", c.max_frame_size),
            )
            .into());
        }
        let settings = ClusterSettings {
            system: config.system()?,
            addr,
            cookie,
            seeds,
            roles,
            app_version: AppVersion::new(c.app_version.clone()),
            placement: Placement::from_config(config, &lease_section)?,
            lease_section,
            member_lease,
            membership_interval: c.membership_interval,
            membership_listing_every: c.membership_listing_every.max(1),
            heartbeat_interval: c.peer_heartbeat_interval,
            unreachable_after: c.unreachable_after,
            monitored_by: c.monitored_by_nr_of_members,
            indirect_probes: c.indirect_probes,
            reachability_sync_interval: c.reachability_sync_interval,
            reconnect_backoff_min: c.reconnect_backoff_min,
            reconnect_backoff_max: c.reconnect_backoff_max,
            dial_timeout: c.dial_timeout,
            handshake_timeout: c.handshake_timeout,
            leave_timeout: c.leave_timeout,
            max_frame_size: c.max_frame_size,
            fault_injection: fault_injection(c.fault_injection)?,
            tls: tls_files(&c.tls)?,
            split_brain_resolver: c.split_brain_resolver.resolve()?,
            shutdown: c.coordinated_shutdown.clone(),
        };
        if settings.heartbeat_interval * 2 > settings.unreachable_after {
            return Err(ConfigError::invalid(
                "cluster.unreachable-after",
                "must be at least twice cluster.peer-heartbeat-interval",
            )
            .into());
        }
        if settings.monitored_by == 0 {
            return Err(ConfigError::invalid(
                "cluster.monitored-by-nr-of-members",
                "must be at least 1 (a member nobody watches is never found unreachable)",
            )
            .into());
        }
        if settings.reachability_sync_interval < settings.heartbeat_interval {
            return Err(ConfigError::invalid(
                "cluster.reachability-sync-interval",
                "must be at least cluster.peer-heartbeat-interval",
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

/// The fewest bytes a cookie may have: 32 random characters (`openssl rand -hex 16`) carry
/// 128 bits. Anyone who can read the lease store can test guesses of the cookie offline
/// against a member lease's proof, and anyone who captures a session's authentication
/// against its challenge: only a cookie too long to enumerate resists that.
pub const MIN_COOKIE_BYTES: usize = 32;

/// The fewest distinct characters a cookie may have (a long run of one character is no
/// secret).
const MIN_COOKIE_DISTINCT: usize = 8;

/// Refuses a cookie short enough, or plain enough, to be guessed offline.
fn check_cookie(cookie: &str) -> Result<(), ConfigError> {
    let distinct = cookie
        .chars()
        .collect::<std::collections::BTreeSet<char>>()
        .len();
    if cookie.len() < MIN_COOKIE_BYTES || distinct < MIN_COOKIE_DISTINCT {
        return Err(ConfigError::invalid(
            "cluster.cookie",
            format!(
                "too easy to guess offline ({} bytes, {distinct} distinct characters): anyone who reads the lease store can test guesses against the member leases; use at least {MIN_COOKIE_BYTES} random characters, e.g. `openssl rand -hex 16`",
                cookie.len()
            ),
        ));
    }
    Ok(())
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

fn tls_files(tls: &TlsConfig) -> Result<Option<TlsFiles>, ConfigError> {
    if !tls.enabled {
        return Ok(None);
    }
    let path = |k: &str, p: &Option<PathBuf>| -> Result<PathBuf, ConfigError> {
        p.clone()
            .filter(|p| !p.as_os_str().is_empty())
            .ok_or_else(|| {
                ConfigError::invalid(
                    format!("cluster.tls.{k}"),
                    "required when cluster.tls.enabled = true",
                )
            })
    };
    Ok(Some(TlsFiles {
        cert: path("cert", &tls.cert)?,
        key: path("key", &tls.key)?,
        ca: path("ca", &tls.ca)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const COOKIE: &str = "settings-test-cookie-0123456789abcdef";

    fn load(extra: &str) -> Result<ClusterSettings, ClusterError> {
        let text = format!("[cluster]\ncookie = \"{COOKIE}\"\nport = 4701\n{extra}");
        ClusterSettings::from_config(&TenureConfig::from_toml_str(&text, "test")?)
    }

    #[test]
    fn the_reference_fragment_is_the_defaults() {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Fragment {
            cluster: ClusterConfig,
        }
        let fragment: Fragment = toml::from_str(REFERENCE).unwrap();
        assert_eq!(fragment.cluster, ClusterConfig::default());
    }

    #[test]
    fn defaults_and_overrides() {
        let s = load("seeds = [\"127.0.0.1:4702\", \"node-b:4703\"]").unwrap();
        assert_eq!(s.addr.to_string(), "127.0.0.1:4701");
        assert_eq!(s.app_version.as_str(), "0.0.0");
        let versioned = load("app-version = \"1.10.0\"").unwrap();
        assert!(versioned.app_version > crate::AppVersion::new("1.9.0"));
        assert_eq!(s.seeds.len(), 2);
        let mut config =
            TenureConfig::from_toml_str(&format!("[cluster]\ncookie = \"{COOKIE}\""), "t").unwrap();
        config
            .merge_env([(
                "TENURE_CLUSTER__SEEDS".to_string(),
                "127.0.0.1:1, 127.0.0.1:2".to_string(),
            )])
            .unwrap();
        let from_env = ClusterSettings::from_config(&config).unwrap();
        assert_eq!(from_env.seeds.len(), 2);
        let dial = load("dial-timeout = \"1m 30s\"").unwrap().dial_timeout;
        assert_eq!(dial, Duration::from_secs(90));
        assert_eq!(s.member_lease_name(&s.addr), "tenure-member-127.0.0.1:4701");
        assert!(s.tls.is_none());
        s.member_lease.validate("x").unwrap();
    }

    /// The repair listings' spacing is read, defaults to 30, and is at least one interval.
    #[test]
    fn membership_listing_every_is_read_and_at_least_one() {
        assert_eq!(load("").unwrap().membership_listing_every, 30);
        let s = load("membership-listing-every = 7").unwrap();
        assert_eq!(s.membership_listing_every, 7);
        let s = load("membership-listing-every = 0").unwrap();
        assert_eq!(s.membership_listing_every, 1);
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            ("seeds = [\"nope\"]", "cluster.seeds[0]"),
            ("seeds = [1]", "cluster.seeds[0]"),
            (
                "peer-heartbeat-interval = \"0s\"",
                "cluster.peer-heartbeat-interval",
            ),
            (
                "heartbeat-interval = \"1s\"",
                "`cluster.heartbeat-interval`",
            ),
            ("unraechable-after = \"1s\"", "`cluster.unraechable-after`"),
            ("dial-timeout = \"3 parsecs\"", "`cluster.dial-timeout`"),
            ("handshake-timeout = \"0s\"", "cluster.handshake-timeout"),
            ("app-version = \"\"", "cluster.app-version"),
            ("app-version = \"1 .2\"", "cluster.app-version"),
            (
                "monitored-by-nr-of-members = 0",
                "cluster.monitored-by-nr-of-members",
            ),
            ("indirect-probes = -1", "`cluster.indirect-probes`"),
            (
                "reachability-sync-interval = \"100ms\"",
                "cluster.reachability-sync-interval",
            ),
            ("max-frame-size = -1", "`cluster.max-frame-size`"),
            ("[cluster.tls]\nenable = true", "`cluster.tls.enable`"),
            (
                "[cluster.split-brain-resolver]\nstable-after = \"soon\"",
                "`cluster.split-brain-resolver.stable-after`",
            ),
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
        let text = format!("[cluster]\ncookie = \"{COOKIE}\"\nport = 0\n");
        let err = ClusterSettings::from_config(&TenureConfig::from_toml_str(&text, "t").unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("cluster.port"), "{err}");
    }

    #[test]
    fn a_cookie_easy_to_guess_offline_is_refused_naming_the_key() {
        let load_cookie = |cookie: &str| {
            let text = format!("[cluster]\ncookie = \"{cookie}\"\nport = 4701\n");
            ClusterSettings::from_config(&TenureConfig::from_toml_str(&text, "t").unwrap())
        };
        for short in [
            "secret",
            "harness-cookie",
            &"ab".repeat(16),
            &"x".repeat(64),
        ] {
            let err = load_cookie(short).unwrap_err().to_string();
            assert!(
                err.contains("cluster.cookie") && err.contains("openssl rand -hex 16"),
                "{short}: {err}"
            );
            assert!(
                !err.contains(short),
                "the error must not repeat the cookie: {err}"
            );
        }
        assert!(load_cookie("0f6c1e2a9b7d4c3e8a5f1b0d2c9e7a64").is_ok());
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
