//! TOML configuration: this crate's reference defaults, user files and `TENURE_…`
//! environment overrides, merged into one table; sections read from it through serde.
//!
//! Each crate owns its sections: a settings struct with serde's `deny_unknown_fields`, whose
//! `Default` is that crate's defaults and whose reference fragment (`reference.toml` next
//! to its `Cargo.toml`) documents them; `config/reference.toml` shows every fragment
//! together. Keys a file leaves out take the struct's defaults, so the merged table only
//! holds this crate's fragment (which declares the built-in lease sections) and what the
//! user wrote.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

use crate::error::ConfigError;
use crate::settings::{LeaseSettings, LeaseTiming, TIMING_KEYS};

/// The variable naming the configuration file when no file is given.
pub const CONFIG_VAR: &str = "TENURE_CONFIG";

/// This crate's fragment of the reference configuration (`reference.toml` of this crate):
/// `[tenure]`, `[lease]` and the lease section of each built-in store kind. Compiled in:
/// it is the table every configuration starts from.
pub const REFERENCE: &str = include_str!("../reference.toml");

/// The top-level tables of a configuration; any other is refused (a misspelt table would
/// otherwise be ignored).
pub const SECTIONS: [&str; 5] = ["tenure", "lease", "cluster", "singleton", "sharding"];

fn reference_table() -> &'static toml::Table {
    static REFERENCE_TABLE: OnceLock<toml::Table> = OnceLock::new();
    REFERENCE_TABLE.get_or_init(|| {
        REFERENCE
            .parse::<toml::Table>()
            .expect("tenure-lease's reference.toml is valid TOML (a test reads it)")
    })
}

/// Deserializes `table`, the table at dotted key `key`, into `T`. An error names the full
/// dotted key of the offending value, an unknown key included.
pub fn read_table<T: DeserializeOwned>(key: &str, table: &toml::Table) -> Result<T, ConfigError> {
    read_layers(&[(key, table)])
}

/// Deserializes the plain keys of `layers` merged in order (later layers win) into `T`, as
/// per-name overrides are read (`[singleton]`, then `[singleton.<name>]`). An error names
/// the dotted key in the last layer that sets the offending key (or the last layer's key
/// when none does, as for a missing key).
fn read_layers<T: DeserializeOwned>(layers: &[(&str, &toml::Table)]) -> Result<T, ConfigError> {
    let mut merged = toml::Table::new();
    for (_, table) in layers {
        merged.extend(table.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    serde_path_to_error::deserialize(toml::Value::Table(merged)).map_err(|e| {
        let path = e.path().to_string();
        let first = path.split(['.', '[']).next().unwrap_or_default();
        let prefix = layers
            .iter()
            .rev()
            .find(|(_, t)| t.contains_key(first))
            .or(layers.last())
            .map_or("", |(key, _)| *key);
        let key = match (prefix, path.as_str()) {
            (prefix, ".") => prefix.to_string(),
            ("", path) => path.to_string(),
            (prefix, path) if path.starts_with('[') => format!("{prefix}{path}"),
            (prefix, path) => format!("{prefix}.{path}"),
        };
        // TOML speaks of keys where serde speaks of fields.
        let detail = e
            .into_inner()
            .message()
            .trim_end()
            .replacen("unknown field", "unknown key", 1)
            .replacen("missing field", "missing key", 1);
        ConfigError::invalid(key, detail)
    })
}

/// A list of strings given as a TOML array, or as one comma-separated string as an
/// environment variable gives it (`TENURE_CLUSTER__SEEDS=a:2552,b:2552`: items trimmed,
/// empty ones dropped). For `#[serde(deserialize_with = "tenure_lease::config::list")]`.
pub fn list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct List;
    impl<'de> serde::de::Visitor<'de> for List {
        type Value = Vec<String>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of strings, or one comma-separated string")
        }

        fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Self::Value, E> {
            Ok(text
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect())
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut items = Vec::new();
            while let Some(item) = seq.next_element::<String>()? {
                items.push(item);
            }
            Ok(items)
        }
    }
    d.deserialize_any(List)
}

/// The merged configuration of one process.
#[derive(Debug, Clone)]
pub struct TenureConfig {
    table: toml::Table,
}

/// `[tenure]`: what names the system and the default lease section.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
#[non_exhaustive]
pub struct TenureSettings {
    /// `system`: name of the actor system; prefixes singleton and shard lease names.
    pub system: String,
    /// `default-lease-section`: the lease section used when a caller names none.
    pub default_lease_section: String,
}

impl Default for TenureSettings {
    fn default() -> Self {
        TenureSettings {
            system: "tenure".into(),
            default_lease_section: "sqlite".into(),
        }
    }
}

/// One resolved lease section: its store kind, timing and store options.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseSection {
    /// The section name (`sqlite` for `[lease.sqlite]`).
    pub name: String,
    /// The store kind named by the section's `store` key.
    pub store: String,
    /// Timing, inherited from `[lease]` and overridden by the section.
    pub settings: LeaseSettings,
    /// Every other key of the section: options for the store kind, as written (the store
    /// kind's options struct supplies the defaults, see [`options`](Self::options)).
    pub options: toml::Table,
}

impl LeaseSection {
    /// The dotted config path of this section, for error messages.
    pub fn key(&self) -> String {
        format!("lease.{}", self.name)
    }

    /// The section's store options read as `T`, the options struct of its store kind (with
    /// serde's `deny_unknown_fields`, and defaults for what the section leaves out). Errors
    /// name the dotted key (`lease.pg.pool-size`), an unknown key included.
    pub fn options<T: DeserializeOwned>(&self) -> Result<T, ConfigError> {
        read_table(&self.key(), &self.options)
    }
}

impl TenureConfig {
    /// The reference defaults only.
    pub fn reference() -> Self {
        TenureConfig {
            table: reference_table().clone(),
        }
    }

    /// Reference defaults, overridden by a file and then by `TENURE_…` variables of the
    /// process environment. The file is `file` when given, else the one `TENURE_CONFIG`
    /// names (when set and not empty), else none: the same rule as the CLI's `--config`.
    /// `Err` names the file or key that could not be read or is invalid.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_from(file, std::env::vars().collect())
    }

    fn load_from(file: Option<&Path>, vars: Vec<(String, String)>) -> Result<Self, ConfigError> {
        let named = vars
            .iter()
            .find(|(k, v)| k == CONFIG_VAR && !v.is_empty())
            .map(|(_, v)| PathBuf::from(v));
        let mut config = TenureConfig::reference();
        if let Some(path) = file.map(Path::to_path_buf).or(named) {
            config.merge_file(&path)?;
        }
        config.merge_env(vars)?;
        config.validate()?;
        Ok(config)
    }

    /// Reference defaults overridden by TOML text (`origin` names it in errors).
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let mut config = TenureConfig::reference();
        config.merge_str(text, origin)?;
        config.validate()?;
        Ok(config)
    }

    /// Merges a TOML file over the current values.
    pub fn merge_file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.display().to_string(),
            source: Arc::new(e),
        })?;
        self.merge_str(&text, &path.display().to_string())
    }

    /// Merges TOML text over the current values.
    pub fn merge_str(&mut self, text: &str, origin: &str) -> Result<(), ConfigError> {
        let overlay = text
            .parse::<toml::Table>()
            .map_err(|source| ConfigError::Parse {
                origin: origin.to_string(),
                source: Box::new(source),
            })?;
        merge_tables(&mut self.table, overlay);
        Ok(())
    }

    /// Applies `TENURE_A__B__C_D=value` pairs as `a.b.c-d = value`. The value is read as a
    /// TOML value when it parses as one (number, boolean, quoted string, array), else as a
    /// string.
    pub fn merge_env(
        &mut self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(), ConfigError> {
        for (name, value) in vars {
            let Some(rest) = name.strip_prefix("TENURE_") else {
                continue;
            };
            if !rest.contains("__") {
                // Plain TENURE_X variables (TENURE_CONFIG, TENURE_LEASE_TOKEN, …) are not keys.
                continue;
            }
            let path: Vec<String> = rest
                .split("__")
                .map(|p| p.to_ascii_lowercase().replace('_', "-"))
                .collect();
            if path.iter().any(|p| p.is_empty()) {
                return Err(ConfigError::invalid(
                    name,
                    "empty key segment in variable name",
                ));
            }
            let parsed = format!("v = {value}")
                .parse::<toml::Table>()
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or(toml::Value::String(value));
            let mut table = &mut self.table;
            for segment in &path[..path.len() - 1] {
                let entry = table
                    .entry(segment.clone())
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()));
                table = entry.as_table_mut().ok_or_else(|| {
                    ConfigError::invalid(name.clone(), format!("`{segment}` is not a table"))
                })?;
            }
            table.insert(path[path.len() - 1].clone(), parsed);
        }
        Ok(())
    }

    /// Checks the top-level tables, `[tenure]` and every lease section (timing, store
    /// kind). The other crates' sections are checked when they are read.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, value) in &self.table {
            if !SECTIONS.contains(&key.as_str()) {
                return Err(ConfigError::invalid(
                    key,
                    format!("unknown table (known: {})", SECTIONS.join(", ")),
                ));
            }
            if !value.is_table() {
                return Err(ConfigError::invalid(key, "must be a table"));
            }
        }
        self.tenure()?;
        for name in self.lease_section_names()? {
            self.lease_section(&name)?;
        }
        Ok(())
    }

    /// `[tenure]`, with the system name checked.
    pub fn tenure(&self) -> Result<TenureSettings, ConfigError> {
        let tenure: TenureSettings = self.section("tenure")?;
        crate::names::check_component("tenure.system", &tenure.system)?;
        Ok(tenure)
    }

    /// `[tenure] system`.
    pub fn system(&self) -> Result<String, ConfigError> {
        Ok(self.tenure()?.system)
    }

    /// `[tenure] default-lease-section`.
    pub fn default_lease_section(&self) -> Result<String, ConfigError> {
        Ok(self.tenure()?.default_lease_section)
    }

    /// The table at dotted key `key` (`cluster.management`); `None` when absent.
    fn table_at(&self, key: &str) -> Result<Option<&toml::Table>, ConfigError> {
        let mut table = &self.table;
        for (i, segment) in key.split('.').enumerate() {
            match table.get(segment) {
                None => return Ok(None),
                Some(toml::Value::Table(t)) => table = t,
                Some(_) => {
                    let at = key.split('.').take(i + 1).collect::<Vec<_>>().join(".");
                    return Err(ConfigError::invalid(at, "must be a table"));
                }
            }
        }
        Ok(Some(table))
    }

    /// The table at dotted key `key` (`cluster`, `cluster.management`) read as `T`; an
    /// absent table reads as an empty one (so `T`'s defaults). Errors name the dotted key.
    pub fn section<T: DeserializeOwned>(&self, key: &str) -> Result<T, ConfigError> {
        let empty = toml::Table::new();
        read_table(key, self.table_at(key)?.unwrap_or(&empty))
    }

    /// The plain keys of `[<table>]` with those of `[<table>.<name>]` over them, read as `T`
    /// (per-name overrides, as singletons and entity types have). Errors name the dotted key
    /// where the offending value is written (`singleton.billing.role`, or `singleton.role`
    /// when inherited). An empty `name` reads the plain keys of `[<table>]` alone.
    pub fn named_section<T: DeserializeOwned>(
        &self,
        table: &str,
        name: &str,
    ) -> Result<T, ConfigError> {
        let base: toml::Table = self
            .table_at(table)?
            .map(|t| {
                t.iter()
                    .filter(|(_, v)| !v.is_table())
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        if name.is_empty() {
            return read_table(table, &base);
        }
        let own_key = format!("{table}.{name}");
        let empty = toml::Table::new();
        let own = self.table_at(&own_key)?.unwrap_or(&empty);
        read_layers(&[(table, &base), (&own_key, own)])
    }

    /// The names of the tables under `[<table>]` (`[sharding.<type>]`, …).
    pub fn table_names(&self, table: &str) -> Result<Vec<String>, ConfigError> {
        Ok(self
            .table_at(table)?
            .map(|t| {
                t.iter()
                    .filter(|(_, v)| v.is_table())
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default())
    }

    fn lease_table(&self) -> Result<&toml::Table, ConfigError> {
        self.table_at("lease")?
            .ok_or_else(|| ConfigError::invalid("lease", "must be a table"))
    }

    /// The names of the lease sections (sub-tables of `[lease]`).
    pub fn lease_section_names(&self) -> Result<Vec<String>, ConfigError> {
        self.table_names("lease")
    }

    /// Resolves `[lease.<name>]`: inherited timing, store kind and store options.
    pub fn lease_section(&self, name: &str) -> Result<LeaseSection, ConfigError> {
        let lease = self.lease_table()?;
        let Some(section) = lease.get(name).and_then(|v| v.as_table()) else {
            return Err(ConfigError::UnknownSection {
                section: name.to_string(),
                known: self.lease_section_names()?.join(", "),
            });
        };
        let key = format!("lease.{name}");
        let inherited: toml::Table = lease
            .iter()
            .filter(|(_, v)| !v.is_table())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let (mut timing, mut options) = (toml::Table::new(), toml::Table::new());
        for (k, v) in section {
            if TIMING_KEYS.contains(&k.as_str()) {
                timing.insert(k.clone(), v.clone());
            } else if k != "store" {
                options.insert(k.clone(), v.clone());
            }
        }
        let timing: LeaseTiming = read_layers(&[("lease", &inherited), (&key, &timing)])?;
        let settings = timing.resolve(&key)?;
        let store = match section.get("store") {
            Some(toml::Value::String(kind)) => kind.clone(),
            Some(other) => {
                return Err(ConfigError::invalid(
                    format!("{key}.store"),
                    format!("expected a store kind string, found {}", other.type_str()),
                ));
            }
            None => {
                return Err(ConfigError::invalid(
                    format!("{key}.store"),
                    "missing: every lease section names its store kind",
                ));
            }
        };
        Ok(LeaseSection {
            name: name.to_string(),
            store,
            settings,
            options,
        })
    }

    /// The merged table (this crate's reference fragment, files, environment).
    pub fn table(&self) -> &toml::Table {
        &self.table
    }

    /// The dotted key that sets `key` for `name` in [`named_section`](Self::named_section)'s
    /// merge: `<table>.<name>.<key>` when `[<table>.<name>]` sets it, else `<table>.<key>`.
    pub fn key_for(&self, table: &str, name: &str, key: &str) -> String {
        let own = self
            .table
            .get(table)
            .and_then(|t| t.get(name))
            .and_then(|t| t.get(key))
            .is_some();
        if own {
            format!("{table}.{name}.{key}")
        } else {
            format!("{table}.{key}")
        }
    }
}

fn merge_tables(base: &mut toml::Table, overlay: toml::Table) {
    for (k, v) in overlay {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge_tables(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::StoreFactory;
    use std::time::Duration;

    #[test]
    fn the_file_named_by_tenure_config_is_loaded_unless_a_file_is_given() {
        let dir = std::env::temp_dir().join(format!("tenure-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let named = dir.join("named.toml");
        let given = dir.join("given.toml");
        std::fs::write(&named, "[tenure]\nsystem = \"named\"\n").unwrap();
        std::fs::write(&given, "[tenure]\nsystem = \"given\"\n").unwrap();
        let env = vec![(CONFIG_VAR.to_string(), named.display().to_string())];
        let system = |c: TenureConfig| c.system().unwrap();
        assert_eq!(
            system(TenureConfig::load_from(None, env.clone()).unwrap()),
            "named"
        );
        assert_eq!(
            system(TenureConfig::load_from(Some(&given), env).unwrap()),
            "given"
        );
        assert_eq!(
            system(TenureConfig::load_from(None, vec![]).unwrap()),
            "tenure"
        );
        let missing = vec![(
            CONFIG_VAR.to_string(),
            dir.join("nope.toml").display().to_string(),
        )];
        let err = TenureConfig::load_from(None, missing)
            .unwrap_err()
            .to_string();
        assert!(err.contains("nope.toml"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reference_is_valid() {
        let c = TenureConfig::reference();
        c.validate().unwrap();
        assert_eq!(c.system().unwrap(), "tenure");
        let s = c.lease_section("sqlite").unwrap();
        assert_eq!(s.store, "sqlite");
        assert!(s.options.is_empty(), "the store kind's defaults apply");
        assert_eq!(s.settings, LeaseSettings::default());
        let zk = c.lease_section("zookeeper").unwrap();
        assert_eq!(zk.settings.heartbeat_timeout, Duration::from_secs(30));
    }

    /// This crate's reference fragment holds exactly the defaults in code.
    #[test]
    fn the_reference_fragment_is_the_defaults() {
        let c = TenureConfig::reference();
        assert_eq!(c.tenure().unwrap(), TenureSettings::default());
        let lease: LeaseTiming = c.named_section("lease", "").unwrap();
        assert_eq!(lease, LeaseTiming::default());
        let mut names = c.lease_section_names().unwrap();
        names.sort();
        assert_eq!(names, ["etcd", "memory", "postgres", "sqlite", "zookeeper"]);
        for name in names {
            let section = c.lease_section(&name).unwrap();
            assert_eq!(
                section.store, name,
                "each built-in section is named after its kind"
            );
            assert!(
                section.options.is_empty(),
                "{name}: options belong to the store crate"
            );
        }
    }

    #[test]
    fn lock_delay_is_per_section_and_inherited_from_lease() {
        let c = TenureConfig::from_toml_str(
            "[lease]\nlock-delay = \"15s\"\n[lease.x]\nstore = \"memory\"\n\
             [lease.y]\nstore = \"memory\"\nlock-delay = \"1s\"",
            "t",
        )
        .unwrap();
        let x = c.lease_section("x").unwrap().settings;
        assert_eq!(x.lock_delay, Duration::from_secs(15));
        assert_eq!(x.store_ttl(), x.heartbeat_timeout + Duration::from_secs(15));
        let y = c.lease_section("y").unwrap().settings;
        assert_eq!(y.lock_delay, Duration::from_secs(1));
        let plain = TenureConfig::reference().lease_section("sqlite").unwrap();
        assert_eq!(plain.settings.lock_delay, Duration::ZERO);
    }

    #[test]
    fn durations_are_humantime() {
        for (text, expected) in [
            ("1500ms", Duration::from_millis(1500)),
            ("2s", Duration::from_secs(2)),
            ("1m 30s", Duration::from_secs(90)),
        ] {
            let c = TenureConfig::from_toml_str(
                &format!("[lease.x]\nstore = \"memory\"\nlease-retry-interval = \"{text}\""),
                "t",
            )
            .unwrap();
            let s = c.lease_section("x").unwrap();
            assert_eq!(s.settings.lease_retry_interval, expected, "{text}");
        }
    }

    #[test]
    fn durations_keep_their_bound_and_name_the_key() {
        for (text, says) in [
            ("400days", "365 days"),
            ("5 sec0nds", "5 sec0nds"),
            ("5", "5"),
        ] {
            let err = TenureConfig::from_toml_str(
                &format!("[lease.x]\nstore = \"memory\"\nheartbeat-timeout = \"{text}\""),
                "t",
            )
            .unwrap_err()
            .to_string();
            assert!(
                err.contains("`lease.x.heartbeat-timeout`") && err.contains(says),
                "{text}: {err}"
            );
        }
        let err = TenureConfig::from_toml_str("[lease]\nlease-retry-interval = 5", "t")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`lease.lease-retry-interval`") && err.contains("duration string"),
            "{err}"
        );
    }

    #[test]
    fn unknown_keys_are_refused_naming_the_key() {
        for (text, key) in [
            ("[tenure]\nsytem = \"x\"", "`tenure.sytem`"),
            (
                "[lease]\nheartbeat-timout = \"9s\"",
                "`lease.heartbeat-timout`",
            ),
            ("[clutser]\nport = 1", "`clutser`"),
            (
                "[lease.m]\nstore = \"memory\"\nnamespce = \"x\"",
                "`lease.m.namespce`",
            ),
        ] {
            let err = TenureConfig::from_toml_str(text, "t")
                .and_then(|c| {
                    let section = c.lease_section("m")?;
                    crate::memory::MemoryStoreFactory.check(&section)
                })
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(key) && err.contains("unknown"),
                "{text}: {err}"
            );
        }
    }

    #[test]
    fn zero_no_longer_means_the_default() {
        let err = TenureConfig::from_toml_str("[lease]\nheartbeat-interval = \"0s\"", "t")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("lease.heartbeat-interval") && err.contains("leave the key out"),
            "{err}"
        );
        let c = TenureConfig::from_toml_str(
            "[lease.x]\nstore = \"memory\"\nheartbeat-timeout = \"60s\"",
            "t",
        )
        .unwrap();
        let s = c.lease_section("x").unwrap().settings;
        assert_eq!(
            (s.heartbeat_interval, s.safety_margin),
            (Duration::from_secs(6), Duration::from_secs(6)),
            "left out: derived from the section's own timeout"
        );
    }

    #[test]
    fn read_and_parse_errors_keep_their_source() {
        use std::error::Error as _;
        let mut c = TenureConfig::reference();
        let err = c
            .merge_file(Path::new("/nonexistent/tenure.toml"))
            .unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/tenure.toml"),
            "{err}"
        );
        let source = err.source().expect("the io error");
        let io = source
            .downcast_ref::<Arc<std::io::Error>>()
            .expect("an io::Error");
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        let err = c.merge_str("[lease\n", "f.toml").unwrap_err();
        assert!(err.to_string().contains("f.toml"), "{err}");
        let source = err.source().expect("the toml error");
        assert!(
            source.downcast_ref::<Box<toml::de::Error>>().is_some(),
            "{source:?}"
        );
    }

    #[test]
    fn sections_inherit_and_override() {
        let c = TenureConfig::from_toml_str(
            "[lease]\nlease-retry-interval = \"1s\"\n[lease.fast]\nstore = \"memory\"\nheartbeat-timeout = \"2s\"\nheartbeat-interval = \"500ms\"\n",
            "test",
        )
        .unwrap();
        let s = c.lease_section("fast").unwrap();
        assert_eq!(s.settings.heartbeat_timeout, Duration::from_secs(2));
        assert_eq!(s.settings.lease_retry_interval, Duration::from_secs(1));
        assert_eq!(s.settings.safety_margin, Duration::from_millis(200));
    }

    #[test]
    fn bad_input_names_the_key() {
        let err = TenureConfig::from_toml_str(
            "[lease.x]\nstore=\"memory\"\nheartbeat-timeout=\"12x\"",
            "f.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("lease.x.heartbeat-timeout") && err.contains("12x"),
            "{err}"
        );
        let err = TenureConfig::from_toml_str("[lease\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("malformed TOML in f.toml"), "{err}");
        let err = TenureConfig::from_toml_str(
            "[lease.y]\nheartbeat-timeout=\"10s\"\nheartbeat-interval=\"5s\"\nstore=\"memory\"",
            "f.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("lease.y.heartbeat-interval"), "{err}");
        let err = TenureConfig::reference()
            .lease_section("nope")
            .unwrap_err()
            .to_string();
        assert!(err.contains("nope") && err.contains("sqlite"), "{err}");
    }

    #[test]
    fn environment_overrides() {
        let vars = |v: &[(&str, &str)]| {
            v.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>()
        };
        let c = TenureConfig::load_from(
            None,
            vars(&[
                ("TENURE_LEASE__HEARTBEAT_TIMEOUT", "1m 30s"),
                ("TENURE_TENURE__SYSTEM", "envsys"),
                ("TENURE_LEASE__ZOOKEEPER__HEARTBEAT_INTERVAL", "1500ms"),
            ]),
        )
        .unwrap();
        assert_eq!(c.system().unwrap(), "envsys");
        let s = c.lease_section("sqlite").unwrap().settings;
        assert_eq!(s.heartbeat_timeout, Duration::from_secs(90));
        let zk = c.lease_section("zookeeper").unwrap().settings;
        assert_eq!(zk.heartbeat_interval, Duration::from_millis(1500));
        let err = TenureConfig::load_from(None, vars(&[("TENURE_LEASE__HEARTBEAT_TIMOUT", "9s")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("`lease.heartbeat-timout`"), "{err}");
        let mut c = TenureConfig::reference();
        c.merge_env([
            (
                "TENURE_LEASE__SQLITE__HEARTBEAT_TIMEOUT".to_string(),
                "30s".to_string(),
            ),
            (
                "TENURE_LEASE__SQLITE__PATH".to_string(),
                "/x/y.db".to_string(),
            ),
            ("TENURE_CONFIG".to_string(), "ignored".to_string()),
        ])
        .unwrap();
        let s = c.lease_section("sqlite").unwrap();
        assert_eq!(s.settings.heartbeat_timeout, Duration::from_secs(30));
        assert_eq!(s.options["path"].as_str(), Some("/x/y.db"));
    }
}
