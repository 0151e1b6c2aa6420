//! The `[lease.<section>]` options of an etcd store and the factory that opens it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use tenure_lease::config::TableReader;
use tenure_lease::{ConfigError, LeaseSection, LeaseStore, StoreFactory};

use crate::store::EtcdStore;

const KEYS: &[&str] = &[
    "endpoints",
    "prefix",
    "dial-timeout",
    "request-timeout",
    "user",
    "password",
    "ca",
    "cert",
    "key",
];

/// How to reach an etcd cluster (defaults in `config/reference.toml`, `[lease.etcd]`).
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
    /// User and password for etcd authentication (empty user: none).
    pub user: String,
    /// The password of `user`.
    pub password: String,
    /// PEM files for TLS: `ca` verifies the servers, `cert` and `key` identify this client
    /// (empty: not used). Endpoints must then be `https://` URLs.
    pub ca: Option<PathBuf>,
    /// This client's certificate (PEM).
    pub cert: Option<PathBuf>,
    /// This client's private key (PEM).
    pub key: Option<PathBuf>,
}

fn optional_path(r: &TableReader<'_>, k: &str) -> Result<Option<PathBuf>, ConfigError> {
    let s = r.string(k)?;
    if s.is_empty() {
        return Ok(None);
    }
    let path = PathBuf::from(&s);
    std::fs::metadata(&path).map_err(|e| ConfigError::invalid(r.key(k), format!("{s}: {e}")))?;
    Ok(Some(path))
}

impl EtcdOptions {
    /// Reads and checks the options of `section`. Errors name the offending key.
    /// Keys the section leaves out take their defaults from the reference's
    /// `[lease.etcd]`, so any section with `store = "etcd"` needs only what differs.
    pub fn from_section(section: &LeaseSection) -> Result<Self, ConfigError> {
        let prefix_key = section.key();
        let options = section.options_with_defaults(KEYS)?;
        let r = TableReader::new(&prefix_key, &options);
        let endpoints = match options.get("endpoints") {
            Some(toml::Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    toml::Value::String(s) if !s.trim().is_empty() => Ok(s.trim().to_string()),
                    other => Err(ConfigError::invalid(
                        r.key("endpoints"),
                        format!("expected URL strings, found {other}"),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?,
            // A comma-separated string, as an environment variable gives it.
            Some(toml::Value::String(s)) => s
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
            Some(other) => {
                return Err(ConfigError::invalid(
                    r.key("endpoints"),
                    format!("expected an array of URLs, found {}", other.type_str()),
                ));
            }
            None => return Err(ConfigError::invalid(r.key("endpoints"), "missing")),
        };
        if endpoints.is_empty() {
            return Err(ConfigError::invalid(
                r.key("endpoints"),
                "needs at least one URL",
            ));
        }
        let prefix = r.string("prefix")?;
        if prefix.is_empty() {
            return Err(ConfigError::invalid(r.key("prefix"), "must not be empty"));
        }
        let cert = optional_path(&r, "cert")?;
        let key = optional_path(&r, "key")?;
        if cert.is_some() != key.is_some() {
            return Err(ConfigError::invalid(
                r.key(if cert.is_some() { "key" } else { "cert" }),
                "cert and key must be given together",
            ));
        }
        Ok(EtcdOptions {
            endpoints,
            prefix,
            dial_timeout: r.positive_duration("dial-timeout")?,
            request_timeout: r.positive_duration("request-timeout")?,
            user: r.string("user")?,
            password: r.string("password")?,
            ca: optional_path(&r, "ca")?,
            cert,
            key,
        })
    }

    /// The client options: timeouts, TLS, credentials. Reads the PEM files.
    pub fn connect_options(&self, section: &str) -> Result<ConnectOptions, ConfigError> {
        let mut o = ConnectOptions::new()
            .with_connect_timeout(self.dial_timeout)
            .with_timeout(self.request_timeout)
            .with_keep_alive(self.request_timeout, self.request_timeout);
        if !self.user.is_empty() {
            o = o.with_user(self.user.clone(), self.password.clone());
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
            ("endpionts = []", "lease.e.endpionts"),
        ] {
            let err = section(extra).expect_err(extra).to_string();
            assert!(err.contains(key), "{extra}: {err}");
        }
    }
}
