//! Placement: the settings that decide where an entity lives. Every member must have the
//! same, or one entity would run under two shard leases at once and the leases could not
//! see it: with another `number-of-shards` a node maps the entity to another shard (another
//! lease), and with shard leases kept elsewhere (another store, prefix, schema or file) the
//! same shard has two leases that know nothing of each other.
//!
//! A node publishes its placement in its member lease (covered by the member proof) and
//! compares it with every member it lists before it counts itself up; see the agent for
//! why two nodes joining at once cannot both get in with different placements.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tenure_lease::{ConfigError, LeaseSection, TenureConfig};

/// Where the entities of one type live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntityPlacement {
    /// `number-of-shards`: ids map to shards by a stable hash modulo this.
    pub number_of_shards: usize,
    /// `lease-section`, resolved (when not set: the cluster's lease section).
    pub lease_section: String,
    /// Where that section keeps its leases: the store kind and the place in it (file,
    /// prefix, schema and table, root, namespace), not how this node reaches it, since
    /// nodes may reach one store through different addresses.
    pub lease_store: String,
}

/// `number-of-shards` when neither `[sharding]` nor `[sharding.<type>]` sets it (Cluster
/// Sharding's settings take their default from here).
pub const DEFAULT_NUMBER_OF_SHARDS: usize = 100;

/// The keys of `[sharding]` that decide placement. Other keys are Cluster Sharding's, which
/// reads the whole section (and refuses unknown keys).
#[derive(Deserialize)]
#[serde(rename_all = "kebab-case", default)]
struct PlacementKeys {
    number_of_shards: usize,
    lease_section: Option<String>,
}

impl Default for PlacementKeys {
    fn default() -> Self {
        PlacementKeys {
            number_of_shards: DEFAULT_NUMBER_OF_SHARDS,
            lease_section: None,
        }
    }
}

impl EntityPlacement {
    /// The placement of entity type `type_name` (`None`: a type without a table of its
    /// own), as Cluster Sharding reads it: `[sharding]` with `[sharding.<type>]` over it.
    /// Errors name the key.
    pub fn read(
        config: &TenureConfig,
        type_name: Option<&str>,
        cluster_lease_section: &str,
    ) -> Result<EntityPlacement, ConfigError> {
        Self::read_with(config, type_name, cluster_lease_section, &|name| {
            config.lease_section(name)
        })
    }

    /// As [`read`](Self::read), with lease sections from `section` (e.g. with their
    /// store kind's defaults filled in, so that an option written out and the same option
    /// left to its default compare equal).
    pub fn read_with(
        config: &TenureConfig,
        type_name: Option<&str>,
        cluster_lease_section: &str,
        section: &dyn Fn(&str) -> Result<LeaseSection, ConfigError>,
    ) -> Result<EntityPlacement, ConfigError> {
        // No type name: `[sharding]` alone.
        let keys: PlacementKeys = config.named_section("sharding", type_name.unwrap_or(""))?;
        if keys.number_of_shards == 0 {
            return Err(ConfigError::invalid(
                config.key_for("sharding", type_name.unwrap_or(""), "number-of-shards"),
                "expected a positive integer",
            ));
        }
        let lease_section = keys
            .lease_section
            .unwrap_or_else(|| cluster_lease_section.to_string());
        let section = section(&lease_section)?;
        Ok(EntityPlacement {
            number_of_shards: keys.number_of_shards,
            lease_section,
            lease_store: lease_store(&section),
        })
    }
}

/// The placement of every entity type a config names, and of all others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// Types without a `[sharding.<type>]` table of their own.
    pub defaults: EntityPlacement,
    /// Types with one.
    pub types: BTreeMap<String, EntityPlacement>,
}

/// A placement setting on which two members differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacementMismatch {
    /// The dotted config key (`sharding.number-of-shards`, `sharding.counter.lease-section`).
    pub key: String,
    /// This node's value.
    pub mine: String,
    /// The other member's value.
    pub theirs: String,
}

impl Placement {
    /// Reads the placement of `[sharding]` and each `[sharding.<type>]`; errors name the key.
    pub fn from_config(
        config: &TenureConfig,
        cluster_lease_section: &str,
    ) -> Result<Placement, ConfigError> {
        Self::from_config_with(config, cluster_lease_section, &|name| {
            config.lease_section(name)
        })
    }

    /// As [`from_config`](Self::from_config), with lease sections from `section` (see
    /// [`EntityPlacement::read_with`]).
    pub fn from_config_with(
        config: &TenureConfig,
        cluster_lease_section: &str,
        section: &dyn Fn(&str) -> Result<LeaseSection, ConfigError>,
    ) -> Result<Placement, ConfigError> {
        let defaults = EntityPlacement::read_with(config, None, cluster_lease_section, section)?;
        let names = config.table_names("sharding")?;
        let mut types = BTreeMap::new();
        for name in names {
            let placement =
                EntityPlacement::read_with(config, Some(&name), cluster_lease_section, section)?;
            types.insert(name, placement);
        }
        Ok(Placement { defaults, types })
    }

    /// The placement of entity type `type_name`.
    pub fn of(&self, type_name: &str) -> &EntityPlacement {
        self.types.get(type_name).unwrap_or(&self.defaults)
    }

    /// The first setting on which `self` (this node) and `other` (another member) place
    /// some entity type differently, or `None` when they agree for every type.
    pub fn mismatch(&self, other: &Placement) -> Option<PlacementMismatch> {
        let differ = |prefix: &str, mine: &EntityPlacement, theirs: &EntityPlacement| {
            if mine.number_of_shards != theirs.number_of_shards {
                return Some(PlacementMismatch {
                    key: format!("{prefix}.number-of-shards"),
                    mine: mine.number_of_shards.to_string(),
                    theirs: theirs.number_of_shards.to_string(),
                });
            }
            let shown = |p: &EntityPlacement| format!("{} ({})", p.lease_section, p.lease_store);
            (mine.lease_store != theirs.lease_store).then(|| PlacementMismatch {
                key: format!("{prefix}.lease-section"),
                mine: shown(mine),
                theirs: shown(theirs),
            })
        };
        if let Some(m) = differ("sharding", &self.defaults, &other.defaults) {
            return Some(m);
        }
        let mut names: Vec<&String> = self.types.keys().chain(other.types.keys()).collect();
        names.sort();
        names.dedup();
        names
            .into_iter()
            .find_map(|name| differ(&format!("sharding.{name}"), self.of(name), other.of(name)))
    }
}

/// Where a lease section keeps its leases: its store kind and the place in the store, from
/// the options as written (an option left out shows as its kind's default, unnamed: the
/// store crates own those values).
fn lease_store(section: &LeaseSection) -> String {
    let options = &section.options;
    let text = |key: &str| match options.get(key) {
        Some(toml::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => format!("(default {key})"),
    };
    let place = match section.store.as_str() {
        // The default state file is resolved from the process's environment
        // (XDG_STATE_HOME, HOME): nodes of one host with the same environment share it.
        "sqlite" => match options.get("path") {
            None => "(default state file)".to_string(),
            Some(_) => text("path"),
        },
        "postgres" => format!("{}.{}", text("schema"), text("table")),
        "etcd" => text("prefix"),
        // A chroot in the connect string moves every path under it.
        "zookeeper" => {
            let chroot = options
                .get("connect")
                .and_then(|c| c.as_str())
                .and_then(|c| c.split_once('/'))
                .map(|(_, c)| format!("/{c}"))
                .unwrap_or_default();
            format!("{chroot}{}", text("root"))
        }
        "memory" => match options.get("namespace") {
            None => section.name.clone(),
            Some(_) => text("namespace"),
        },
        // A store kind Tenure does not know: all its options but credentials.
        _ => options
            .iter()
            .filter(|(k, _)| {
                !matches!(
                    k.as_str(),
                    "password" | "user" | "auth" | "key" | "cert" | "ca"
                )
            })
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
    };
    format!("{} {place}", section.store)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement(text: &str) -> Placement {
        let config = TenureConfig::from_toml_str(text, "t").unwrap();
        Placement::from_config(&config, "sqlite").unwrap()
    }

    #[test]
    fn every_setting_that_decides_where_an_entity_lives_is_compared() {
        let base = placement("[sharding.counter]\nnumber-of-shards = 30\n");
        assert_eq!(base.of("counter").number_of_shards, 30);
        assert_eq!(base.of("other").number_of_shards, 100);
        assert_eq!(base.mismatch(&base.clone()), None);
        // Another number of shards for the type.
        let other = placement("[sharding.counter]\nnumber-of-shards = 64\n");
        assert_eq!(
            base.mismatch(&other),
            Some(PlacementMismatch {
                key: "sharding.counter.number-of-shards".into(),
                mine: "30".into(),
                theirs: "64".into(),
            })
        );
        // The same effective value, set in [sharding] instead: they agree on counter, not
        // on the defaults other types use.
        let via_defaults = placement("[sharding]\nnumber-of-shards = 30\n");
        let m = base.mismatch(&via_defaults).unwrap();
        assert_eq!(
            (m.key.as_str(), m.mine.as_str(), m.theirs.as_str()),
            ("sharding.number-of-shards", "100", "30")
        );
        // A type only one side configures is compared with the other's defaults.
        let extra = placement(
            "[sharding.counter]\nnumber-of-shards = 30\n[sharding.cart]\nnumber-of-shards = 7\n",
        );
        assert_eq!(
            base.mismatch(&extra).unwrap().key,
            "sharding.cart.number-of-shards"
        );
        // Shard leases in another file.
        let elsewhere = placement(
            "[sharding.counter]\nnumber-of-shards = 30\nlease-section = \"other\"\n\
             [lease.other]\nstore = \"sqlite\"\npath = \"/tmp/other.sqlite\"\n",
        );
        let m = base.mismatch(&elsewhere).unwrap();
        assert_eq!(m.key, "sharding.counter.lease-section");
        assert!(m.mine.contains("sqlite (default state file)"), "{m:?}");
        assert!(
            m.theirs.contains("other (sqlite /tmp/other.sqlite)"),
            "{m:?}"
        );
        // The same place under another section name, reached at another address: agrees.
        let etcd = |section: &str, endpoint: &str| {
            placement(&format!(
                "[sharding]\nlease-section = \"{section}\"\n\
                 [lease.{section}]\nstore = \"etcd\"\nendpoints = [\"{endpoint}\"]\nprefix = \"/p/\"\n"
            ))
        };
        assert_eq!(
            etcd("a", "http://10.0.0.1:2379").mismatch(&etcd("b", "http://10.0.0.2:2379")),
            None
        );
    }

    #[test]
    fn bad_placement_settings_name_the_key() {
        let config =
            TenureConfig::from_toml_str("[sharding.counter]\nnumber-of-shards = 0\n", "t").unwrap();
        let err = Placement::from_config(&config, "sqlite")
            .unwrap_err()
            .to_string();
        assert!(err.contains("`sharding.counter.number-of-shards`"), "{err}");
    }

    #[test]
    fn an_option_written_out_and_left_to_its_default_place_alike_with_the_defaults_filled_in() {
        let config = |extra: &str| {
            TenureConfig::from_toml_str(
                &format!(
                    "[sharding]\nlease-section = \"pg\"\n\
                     [lease.pg]\nstore = \"postgres\"\nurl = \"postgres://x@h/db\"\n{extra}"
                ),
                "t",
            )
            .unwrap()
        };
        let (written, left) = (config("schema = \"tenure\"\n"), config(""));
        // As written, they differ: the kind's defaults belong to its store crate.
        let as_written = |c: &TenureConfig| Placement::from_config(c, "sqlite").unwrap();
        assert!(as_written(&written).mismatch(&as_written(&left)).is_some());
        // With the kind's defaults filled in (what a node does through its provider), they
        // agree; another schema still differs.
        let with_defaults = |c: &TenureConfig| {
            Placement::from_config_with(c, "sqlite", &|name| {
                let mut section = c.lease_section(name)?;
                let mut options: toml::Table = "schema = \"tenure\"\ntable = \"tenure_lease\""
                    .parse()
                    .unwrap();
                options.extend(std::mem::take(&mut section.options));
                section.options = options;
                Ok(section)
            })
            .unwrap()
        };
        assert_eq!(
            with_defaults(&written).mismatch(&with_defaults(&left)),
            None
        );
        let other = config("schema = \"other\"\n");
        assert!(
            with_defaults(&other)
                .mismatch(&with_defaults(&left))
                .is_some()
        );
    }
}
