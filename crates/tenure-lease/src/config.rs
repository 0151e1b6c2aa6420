//! TOML configuration: the embedded reference defaults, user files and `TENURE_…`
//! environment overrides, merged into one table; lease sections resolved from it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use crate::error::ConfigError;
use crate::settings::{LeaseSettings, TIMING_KEYS};

/// The variable naming the configuration file when no file is given.
pub const CONFIG_VAR: &str = "TENURE_CONFIG";

/// The reference configuration (`reference.toml` of this crate, linked from
/// `config/reference.toml`), compiled in: the single source of defaults.
pub const REFERENCE_TOML: &str = include_str!("../reference.toml");

pub(crate) fn reference_config() -> &'static toml::Table {
    static REFERENCE: OnceLock<toml::Table> = OnceLock::new();
    REFERENCE.get_or_init(|| {
        REFERENCE_TOML
            .parse::<toml::Table>()
            .expect("config/reference.toml is valid TOML")
    })
}

/// The merged configuration of one process.
#[derive(Debug, Clone)]
pub struct TenureConfig {
    table: toml::Table,
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
    /// Every other key of the section: options for the store kind.
    pub options: toml::Table,
}

impl LeaseSection {
    /// The dotted config path of this section, for error messages.
    pub fn key(&self) -> String {
        format!("lease.{}", self.name)
    }

    /// The section's store options over the defaults of its kind: the reference's
    /// `[lease.<kind>]` options, so that any section of a kind needs only what differs.
    /// Keys outside `known` in the section are refused, naming the key.
    pub fn options_with_defaults(&self, known: &[&str]) -> Result<toml::Table, ConfigError> {
        TableReader::new(&self.key(), &self.options).reject_unknown(known)?;
        let mut options = TenureConfig::reference()
            .lease_section(&self.store)
            .map(|s| s.options)
            .unwrap_or_default();
        options.extend(self.options.clone());
        Ok(options)
    }
}

impl TenureConfig {
    /// The reference defaults only.
    pub fn reference() -> Self {
        TenureConfig {
            table: reference_config().clone(),
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
            detail: e.to_string(),
        })?;
        self.merge_str(&text, &path.display().to_string())
    }

    /// Merges TOML text over the current values.
    pub fn merge_str(&mut self, text: &str, origin: &str) -> Result<(), ConfigError> {
        let overlay = text
            .parse::<toml::Table>()
            .map_err(|e| ConfigError::Parse {
                origin: origin.to_string(),
                detail: e.to_string(),
            })?;
        merge_tables(&mut self.table, overlay);
        Ok(())
    }

    /// Applies `TENURE_A__B__C_D=value` pairs as `a.b.c-d = value`. The value is read as a
    /// TOML value when it parses as one (number, boolean, quoted string), else as a string.
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

    /// Checks every lease section's timing and the `[tenure]` keys.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.system()?;
        self.default_lease_section()?;
        for name in self.lease_section_names()? {
            self.lease_section(&name)?;
        }
        Ok(())
    }

    /// `[tenure] system`.
    pub fn system(&self) -> Result<String, ConfigError> {
        let name = TableReader::new("tenure", self.tenure_table()?).string("system")?;
        crate::names::check_component("tenure.system", &name)?;
        Ok(name)
    }

    /// `[tenure] default-lease-section`.
    pub fn default_lease_section(&self) -> Result<String, ConfigError> {
        TableReader::new("tenure", self.tenure_table()?).string("default-lease-section")
    }

    fn tenure_table(&self) -> Result<&toml::Table, ConfigError> {
        self.table
            .get("tenure")
            .and_then(|v| v.as_table())
            .ok_or_else(|| ConfigError::invalid("tenure", "must be a table"))
    }

    fn lease_table(&self) -> Result<&toml::Table, ConfigError> {
        self.table
            .get("lease")
            .and_then(|v| v.as_table())
            .ok_or_else(|| ConfigError::invalid("lease", "must be a table"))
    }

    /// The names of the lease sections (sub-tables of `[lease]`).
    pub fn lease_section_names(&self) -> Result<Vec<String>, ConfigError> {
        Ok(self
            .lease_table()?
            .iter()
            .filter(|(_, v)| v.is_table())
            .map(|(k, _)| k.clone())
            .collect())
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
        let mut timing = toml::Table::new();
        for k in TIMING_KEYS {
            let value = section.get(k).or_else(|| lease.get(k)).ok_or_else(|| {
                ConfigError::invalid(format!("{key}.{k}"), "missing (and no [lease] default)")
            })?;
            timing.insert(k.to_string(), value.clone());
        }
        let settings = LeaseSettings::from_table(&key, &timing)?;
        let store = TableReader::new(&key, section).string("store")?;
        let options: toml::Table = section
            .iter()
            .filter(|(k, _)| k.as_str() != "store" && !TIMING_KEYS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Ok(LeaseSection {
            name: name.to_string(),
            store,
            settings,
            options,
        })
    }

    /// The merged table, for crates that keep their own sections (cluster, singleton…).
    pub fn table(&self) -> &toml::Table {
        &self.table
    }

    /// The dotted key that sets `key` for `name` in [`table_for`](Self::table_for)'s merge:
    /// `<table>.<name>.<key>` when `[<table>.<name>]` sets it, else `<table>.<key>`.
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

    /// The plain keys of `[<table>]` with those of `[<table>.<name>]` over them (per-name
    /// overrides, as singletons and entity types have). Unknown keys in either are refused;
    /// errors name the key.
    pub fn table_for(
        &self,
        table: &str,
        name: &str,
        known: &[&str],
    ) -> Result<toml::Table, ConfigError> {
        let base = self
            .table
            .get(table)
            .and_then(|v| v.as_table())
            .ok_or_else(|| ConfigError::invalid(table, "must be a table"))?;
        let mut merged = toml::Table::new();
        for (k, v) in base.iter().filter(|(_, v)| !v.is_table()) {
            merged.insert(k.clone(), v.clone());
        }
        TableReader::new(table, &merged).reject_unknown(known)?;
        if let Some(own) = base.get(name) {
            let key = format!("{table}.{name}");
            let own = own
                .as_table()
                .ok_or_else(|| ConfigError::invalid(&key, "must be a table"))?;
            TableReader::new(&key, own).reject_unknown(known)?;
            merged.extend(own.clone());
        }
        Ok(merged)
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

/// Typed reads of a table's keys with errors naming the full dotted key.
pub struct TableReader<'a> {
    prefix: &'a str,
    table: &'a toml::Table,
}

impl<'a> TableReader<'a> {
    /// Reads `table`, whose dotted key is `prefix` (e.g. `lease.default`).
    pub fn new(prefix: &'a str, table: &'a toml::Table) -> Self {
        TableReader { prefix, table }
    }

    /// The dotted key of `k` in this table.
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.prefix)
    }

    fn get(&self, k: &str) -> Result<&'a toml::Value, ConfigError> {
        self.table
            .get(k)
            .ok_or_else(|| ConfigError::invalid(self.key(k), "missing"))
    }

    /// A required string.
    pub fn string(&self, k: &str) -> Result<String, ConfigError> {
        match self.get(k)? {
            toml::Value::String(s) => Ok(s.clone()),
            other => Err(ConfigError::invalid(
                self.key(k),
                format!("expected a string, found {}", other.type_str()),
            )),
        }
    }

    /// A required duration such as `"5s"` or `"250ms"`, at most 365 days.
    pub fn duration(&self, k: &str) -> Result<Duration, ConfigError> {
        let text = self.string(k).map_err(|_| {
            ConfigError::invalid(self.key(k), "expected a duration string such as \"5s\"")
        })?;
        crate::duration::parse(&text).map_err(|e| ConfigError::invalid(self.key(k), e))
    }

    /// A required duration that must not be zero.
    pub fn positive_duration(&self, k: &str) -> Result<Duration, ConfigError> {
        let d = self.duration(k)?;
        if d.is_zero() {
            return Err(ConfigError::invalid(self.key(k), "must be > 0"));
        }
        Ok(d)
    }

    /// A required integer (also accepted as a decimal string, as environment variables may
    /// give it).
    pub fn integer(&self, k: &str) -> Result<i64, ConfigError> {
        match self.get(k)? {
            toml::Value::Integer(n) => Ok(*n),
            toml::Value::String(s) => s.trim().parse().map_err(|_| {
                ConfigError::invalid(self.key(k), format!("expected an integer, found {s:?}"))
            }),
            other => Err(ConfigError::invalid(
                self.key(k),
                format!("expected an integer, found {}", other.type_str()),
            )),
        }
    }

    /// A required positive integer that fits a `usize` (a count or a size).
    pub fn count(&self, k: &str) -> Result<usize, ConfigError> {
        usize::try_from(self.integer(k)?)
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| ConfigError::invalid(self.key(k), "expected a positive integer"))
    }

    /// A required `true` or `false`.
    pub fn boolean(&self, k: &str) -> Result<bool, ConfigError> {
        match self.get(k)? {
            toml::Value::Boolean(b) => Ok(*b),
            other => Err(ConfigError::invalid(
                self.key(k),
                format!("expected true or false, found {other}"),
            )),
        }
    }

    /// Fails on any key not in `known`, naming it (catches typos in store options).
    pub fn reject_unknown(&self, known: &[&str]) -> Result<(), ConfigError> {
        let unknown: BTreeMap<_, _> = self
            .table
            .iter()
            .filter(|(k, _)| !known.contains(&k.as_str()))
            .collect();
        match unknown.keys().next() {
            Some(k) => Err(ConfigError::invalid(
                self.key(k),
                format!("unknown key (known: {})", known.join(", ")),
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(s.options.contains_key("path"));
        assert!(!s.options.contains_key("heartbeat-timeout"));
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
