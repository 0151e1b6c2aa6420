//! The options of a `store = "postgres"` section, read and checked without connecting.

use std::str::FromStr;
use std::time::Duration;

use tenure_lease::{ConfigError, LeaseSection};

/// This crate's fragment of the reference configuration: the options of a `store =
/// "postgres"` section (shown under `[lease.postgres]` in `config/reference.toml`).
pub const REFERENCE: &str = include_str!("../reference.toml");

/// The options of a `store = "postgres"` section as written (defaults: [`REFERENCE`]);
/// [`PostgresOptions::from_section`] checks them.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
#[non_exhaustive]
pub struct PostgresConfig {
    /// `url`: libpq-style connection string.
    pub url: String,
    /// `password`, when the server asks for one and `url` has none.
    pub password: Option<String>,
    /// `schema` of the leases' table.
    pub schema: String,
    /// `table` of the leases.
    pub table: String,
    /// `pool-size`: 1 to 1000.
    pub pool_size: usize,
    /// `connect-timeout`.
    #[serde(deserialize_with = "tenure_lease::duration::serde::positive")]
    pub connect_timeout: Duration,
    /// `observed-expiry`.
    pub observed_expiry: bool,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            url: "postgres://postgres@127.0.0.1:5432/postgres".into(),
            password: None,
            schema: "tenure".into(),
            table: "tenure_lease".into(),
            pool_size: 8,
            connect_timeout: Duration::from_secs(5),
            observed_expiry: false,
        }
    }
}

impl std::fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("pool_size", &self.pool_size)
            .finish_non_exhaustive()
    }
}

/// Longest schema or table name: PostgreSQL cuts identifiers at 63 bytes, and the table
/// name gets a suffix (`_token`, `_owner`) for the objects beside it.
const MAX_IDENT: usize = 48;

/// How to reach the database and where the lease table lives.
#[derive(Clone)]
pub struct PostgresOptions {
    /// Connection parameters (from `url`, with `password` applied).
    pub connection: tokio_postgres::Config,
    /// Schema of the lease table; created if missing.
    pub schema: String,
    /// Name of the lease table; created if missing.
    pub table: String,
    /// Most connections the store keeps open.
    pub pool_size: usize,
    /// Bound on opening one connection.
    pub connect_timeout: Duration,
    /// `observed-expiry`: a contender takes an expired grant over only after observing its
    /// row unchanged for a full ttl on its own monotonic clock (client-go's rule), instead
    /// of trusting the server's clock alone.
    pub observed_expiry: bool,
    /// Bound on every store operation, retries included (`lease-operation-timeout`).
    pub operation_timeout: Duration,
}

impl std::fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOptions")
            .field("server", &self.server())
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("pool_size", &self.pool_size)
            .finish()
    }
}

impl PostgresOptions {
    /// Reads and checks the options of `section` ([`PostgresConfig`]; keys it leaves out
    /// take their defaults). Errors name the offending key.
    pub fn from_section(section: &LeaseSection) -> Result<PostgresOptions, ConfigError> {
        let c: PostgresConfig = section.options()?;
        let key = |k: &str| format!("{}.{k}", section.key());
        let mut connection = tokio_postgres::Config::from_str(&c.url).map_err(|e| {
            ConfigError::invalid(
                key("url"),
                format!("not a PostgreSQL connection string: {e}"),
            )
        })?;
        if connection.get_hosts().is_empty() {
            return Err(ConfigError::invalid(key("url"), "names no host"));
        }
        if connection.get_user().is_none() {
            return Err(ConfigError::invalid(key("url"), "names no user"));
        }
        if let Some(password) = c.password {
            connection.password(password);
        }
        connection.connect_timeout(c.connect_timeout);
        if connection.get_application_name().is_none() {
            connection.application_name("tenure");
        }
        if !(1..=1000).contains(&c.pool_size) {
            return Err(ConfigError::invalid(key("pool-size"), "must be 1 to 1000"));
        }
        Ok(PostgresOptions {
            connection,
            schema: identifier(&key("schema"), c.schema)?,
            table: identifier(&key("table"), c.table)?,
            pool_size: c.pool_size,
            connect_timeout: c.connect_timeout,
            observed_expiry: c.observed_expiry,
            operation_timeout: section.settings.lease_operation_timeout,
        })
    }

    /// Options for a server at `connection`, with the reference names (`tenure.tenure_lease`).
    pub fn new(connection: tokio_postgres::Config, operation_timeout: Duration) -> Self {
        PostgresOptions {
            connection,
            schema: "tenure".into(),
            table: "tenure_lease".into(),
            pool_size: 8,
            connect_timeout: operation_timeout,
            observed_expiry: false,
            operation_timeout,
        }
    }

    /// `user@host:port/dbname`, for messages (never the password).
    pub fn server(&self) -> String {
        let c = &self.connection;
        let host = match c.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
            None => "?".into(),
        };
        let port = c.get_ports().first().copied().unwrap_or(5432);
        format!(
            "{}@{host}:{port}/{}",
            c.get_user().unwrap_or("?"),
            c.get_dbname()
                .unwrap_or_else(|| c.get_user().unwrap_or("?"))
        )
    }
}

/// A schema or table name: lower-case ASCII letters, digits and `_`, not starting with a
/// digit, so it means the same quoted or not and needs no escaping.
fn identifier(key: &str, name: String) -> Result<String, ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_IDENT
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(name)
    } else {
        Err(ConfigError::invalid(
            key,
            format!(
                "{name:?} is not a plain identifier (a-z, 0-9, _, not starting with a digit, at most {MAX_IDENT} bytes)"
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure_lease::TenureConfig;

    fn section(extra: &str) -> Result<PostgresOptions, ConfigError> {
        let config = TenureConfig::from_toml_str(
            &format!("[lease.pg]\nstore = \"postgres\"\n{extra}"),
            "test",
        )
        .expect("config");
        PostgresOptions::from_section(&config.lease_section("pg").expect("section"))
    }

    #[test]
    fn a_provider_fills_in_the_options_a_section_leaves_out() {
        let config = tenure_lease::TenureConfig::from_toml_str(
            "[lease.pg]\nstore = \"postgres\"\ntable = \"mine\"\n",
            "test",
        )
        .expect("config");
        let registry = ["sqlite", "etcd", "zookeeper"]
            .into_iter()
            .fold(tenure_lease::StoreRegistry::new(), |r, kind| {
                r.left_out(kind, kind)
            })
            .with(crate::PostgresStoreFactory);
        let provider = tenure_lease::LeaseProvider::new(config, registry).expect("provider");
        let section = provider.section_with_defaults("pg").expect("section");
        let text = |k: &str| {
            section
                .options
                .get(k)
                .and_then(|v| v.as_str())
                .map(String::from)
        };
        // Left out: the kind's default; written: as written.
        assert_eq!(text("schema").as_deref(), Some("tenure"));
        assert_eq!(text("table").as_deref(), Some("mine"));
    }

    #[test]
    fn the_reference_fragment_is_the_defaults() {
        let c: PostgresConfig = toml::from_str(REFERENCE).unwrap();
        assert_eq!(c, PostgresConfig::default());
    }

    #[test]
    fn reference_defaults_parse() {
        let o = section("").unwrap();
        assert_eq!(
            (o.schema.as_str(), o.table.as_str()),
            ("tenure", "tenure_lease")
        );
        assert!(o.pool_size >= 1);
        assert!(o.server().contains("127.0.0.1:5432"), "{}", o.server());
    }

    #[test]
    fn errors_name_the_key() {
        let e = section("schema = \"Bad-Name\"").err().unwrap().to_string();
        assert!(e.contains("lease.pg.schema"), "{e}");
        let e = section("table = \"x; drop table y\"")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("lease.pg.table"), "{e}");
        let e = section("pool-size = 0").err().unwrap().to_string();
        assert!(e.contains("lease.pg.pool-size"), "{e}");
        let e = section("url = \"postgres://h:notaport/db\"")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("lease.pg.url"), "{e}");
        let e = section("connect-timeout = \"0s\"")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("lease.pg.connect-timeout"), "{e}");
        let e = section("tabel = \"x\"").err().unwrap().to_string();
        assert!(
            e.contains("`lease.pg.tabel`") && e.contains("unknown"),
            "{e}"
        );
        let e = section("connect-timeout = \"1m 30x\"")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("`lease.pg.connect-timeout`"), "{e}");
    }

    #[test]
    fn password_is_applied_and_never_shown() {
        let o = section("url = \"postgres://app@db:6543/leases\"\npassword = \"s3cret\"").unwrap();
        assert_eq!(o.connection.get_password(), Some(&b"s3cret"[..]));
        assert_eq!(o.server(), "app@db:6543/leases");
        assert!(!format!("{o:?}").contains("s3cret"));
    }
}
