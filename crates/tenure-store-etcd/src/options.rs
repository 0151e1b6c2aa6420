//! The `[lease.<section>]` options of an etcd store and the factory that opens it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use tenure_lease::{ConfigError, LeaseSection, LeaseStore, StoreFactory};

use crate::store::EtcdStore;

/// This crate's fragment of the reference configuration: the options of a `store =
/// "etcd"` section (shown under `[lease.etcd]` in `config/reference.toml`).
pub const REFERENCE: &str = include_str!("../reference.toml");

/// The options of a `store = "etcd"` section as written (defaults: [`REFERENCE`]);
/// [`EtcdOptions::from_section`] checks them.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// `endpoints`: an array, or a comma-separated string.
    #[serde(deserialize_with = "tenure_lease::config::list")]
    pub endpoints: Vec<String>,
    /// `prefix`.
    pub prefix: String,
    /// `dial-timeout`.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub dial_timeout: Duration,
    /// `request-timeout`.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub request_timeout: Duration,
    /// `user` (no authentication without a user).
    pub user: Option<String>,
    /// `password` of `user`.
    pub password: Option<String>,
    /// `ca`: the CA of the servers' certificates (PEM).
    pub ca: Option<PathBuf>,
    /// `cert`: this client's certificate (PEM), with `key`.
    pub cert: Option<PathBuf>,
    /// `key`: this client's private key (PEM), with `cert`.
    pub key: Option<PathBuf>,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: "/tenure/".into(),
            dial_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(5),
            user: None,
            password: None,
            ca: None,
            cert: None,
            key: None,
        }
    }
}

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// How to reach an etcd cluster, checked (from [`EtcdConfig`], or built in code).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdOptions {
    /// Client URLs of the members, e.g. `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// Prefix of every key the store writes; sections with different prefixes never see
    /// each other's leases.
    pub prefix: String,
    /// Bound on establishing a connection to one member.
    pub dial_timeout: Duration,
    /// Bound on one request (the lease operation timeout bounds whole operations).
    pub request_timeout: Duration,
    /// User for etcd authentication (none: no authentication).
    pub user: Option<String>,
    /// The password of `user`.
    pub password: Option<String>,
    /// PEM files for TLS: `ca` verifies the servers, `cert` and `key` identify this client
    /// (empty: not used). Endpoints must then be `https://` URLs.
    pub ca: Option<PathBuf>,
    /// This client's certificate (PEM).
    pub cert: Option<PathBuf>,
    /// This client's private key (PEM).
    pub key: Option<PathBuf>,
}

/// A PEM file option: it must exist.
fn existing(key: String, path: Option<PathBuf>) -> Result<Option<PathBuf>, ConfigError> {
    if let Some(p) = &path {
        std::fs::metadata(p)
            .map_err(|e| ConfigError::invalid(key, format!("{}: {e}", p.display())))?;
    }
    Ok(path)
}

impl EtcdOptions {
    /// Reads and checks the options of `section` ([`EtcdConfig`]); errors name the offending
    /// key. Keys the section leaves out take their defaults, so any section with
    /// `store = "etcd"` needs only what differs.
    pub fn from_section(section: &LeaseSection) -> Result<Self, ConfigError> {
        let c: EtcdConfig = section.options()?;
        let key = |k: &str| format!("{}.{k}", section.key());
        if c.endpoints.is_empty() {
            return Err(ConfigError::invalid(
                key("endpoints"),
                "needs at least one URL",
            ));
        }
        if c.prefix.is_empty() {
            return Err(ConfigError::invalid(key("prefix"), "must not be empty"));
        }
        let cert = existing(key("cert"), c.cert)?;
        let tls_key = existing(key("key"), c.key)?;
        if cert.is_some() != tls_key.is_some() {
            return Err(ConfigError::invalid(
                key(if cert.is_some() { "key" } else { "cert" }),
                "cert and key must be given together",
            ));
        }
        if c.password.is_some() && c.user.is_none() {
            return Err(ConfigError::invalid(
                key("user"),
                "required with a password",
            ));
        }
        Ok(EtcdOptions {
            endpoints: c.endpoints,
            prefix: c.prefix,
            dial_timeout: c.dial_timeout,
            request_timeout: c.request_timeout,
            user: c.user,
            password: c.password,
            ca: existing(key("ca"), c.ca)?,
            cert,
            key: tls_key,
        })
    }

    /// The client options: timeouts, TLS, credentials. Reads the PEM files.
    pub fn connect_options(&self, section: &str) -> Result<ConnectOptions, ConfigError> {
        let mut o = ConnectOptions::new()
            .with_connect_timeout(self.dial_timeout)
            .with_timeout(self.request_timeout)
            .with_keep_alive(self.request_timeout, self.request_timeout);
        if let Some(user) = &self.user {
            o = o.with_user(user.clone(), self.password.clone().unwrap_or_default());
        }
        let read = |k: &str, p: &PathBuf| {
            std::fs::read(p).map_err(|e| {
                ConfigError::invalid(format!("{section}.{k}"), format!("{}: {e}", p.display()))
            })
        };
        if self.ca.is_some() || self.cert.is_some() {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &self.ca {
                tls = tls.ca_certificate(Certificate::from_pem(read("ca", ca)?));
            }
            if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
                tls = tls.identity(Identity::from_pem(read("cert", cert)?, read("key", key)?));
            }
            o = o.with_tls(tls);
        }
        Ok(o)
    }

    /// Connects (lazily: members are dialled on first use, except when a user is set,
    /// which authenticates now).
    pub async fn connect(&self, section: &str) -> Result<EtcdStore, ConfigError> {
        let client = Client::connect(&self.endpoints, Some(self.connect_options(section)?))
            .await
            .map_err(|e| {
                ConfigError::invalid(
                    format!("{section}.endpoints"),
                    format!("cannot connect to {}: {e}", self.endpoints.join(", ")),
                )
            })?;
        Ok(EtcdStore::new(client, &self.prefix))
    }
}

/// Opens [`EtcdStore`]s from sections with `store = "etcd"`.
#[derive(Debug, Default, Clone, Copy)]
pub struct EtcdStoreFactory;

#[async_trait]
impl StoreFactory for EtcdStoreFactory {
    fn kind(&self) -> &'static str {
        "etcd"
    }

    fn defaults(&self) -> toml::Table {
        // The fragment is checked to parse (and to match the options' defaults) by a test.
        REFERENCE.parse().unwrap_or_default()
    }

    fn check(&self, section: &LeaseSection) -> Result<(), ConfigError> {
        EtcdOptions::from_section(section).map(|_| ())
    }

    async fn open(&self, section: &LeaseSection) -> Result<Arc<dyn LeaseStore>, ConfigError> {
        let options = EtcdOptions::from_section(section)?;
        Ok(Arc::new(options.connect(&section.key()).await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure_lease::TenureConfig;

    fn section(extra: &str) -> Result<EtcdOptions, ConfigError> {
        let config =
            TenureConfig::from_toml_str(&format!("[lease.e]\nstore = \"etcd\"\n{extra}"), "test")
                .expect("toml");
        EtcdOptions::from_section(&config.lease_section("e").expect("section"))
    }

    #[test]
    fn the_reference_fragment_is_the_defaults() {
        let c: EtcdConfig = toml::from_str(REFERENCE).unwrap();
        assert_eq!(c, EtcdConfig::default());
    }

    #[test]
    fn defaults_come_from_the_reference() {
        let o = section("").expect("defaults");
        assert_eq!(o.endpoints, vec!["http://127.0.0.1:2379".to_string()]);
        assert_eq!(o.prefix, "/tenure/");
        assert_eq!(o.dial_timeout, Duration::from_secs(3));
        assert_eq!((o.ca, o.cert, o.key), (None, None, None));
    }

    #[test]
    fn endpoints_from_an_array_or_a_comma_separated_string() {
        let o = section("endpoints = [\"http://a:1\", \"http://b:2\"]").unwrap();
        assert_eq!(o.endpoints, ["http://a:1", "http://b:2"]);
        let o = section("endpoints = \"http://a:1, http://b:2\"").unwrap();
        assert_eq!(o.endpoints, ["http://a:1", "http://b:2"]);
    }

    #[test]
    fn errors_name_the_key() {
        for (extra, key) in [
            ("endpoints = []", "lease.e.endpoints"),
            ("endpoints = 3", "lease.e.endpoints"),
            ("prefix = \"\"", "lease.e.prefix"),
            ("dial-timeout = \"0s\"", "lease.e.dial-timeout"),
            ("cert = \"/nonexistent/cert.pem\"", "lease.e.cert"),
            ("cert = \"Cargo.toml\"", "lease.e.key"),
            ("endpionts = []", "`lease.e.endpionts`"),
            ("password = \"p\"", "lease.e.user"),
            ("request-timeout = \"2x\"", "`lease.e.request-timeout`"),
        ] {
            let err = section(extra).expect_err(extra).to_string();
            assert!(err.contains(key), "{extra}: {err}");
        }
    }
}
