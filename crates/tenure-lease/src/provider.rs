//! The provider: loads a lease by (lease name, config section, owner). The section names a
//! store kind; store crates plug their kinds in through a [`StoreRegistry`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Mutex;

use crate::actor::LeaseSpec;
use crate::config::{LeaseSection, TenureConfig};
use crate::error::{ConfigError, LeaseError};
use crate::handle::Lease;
use crate::memory::MemoryStoreFactory;
use crate::names::check_lease_name;
use crate::renewal::RenewalBatcher;
use crate::store::LeaseStore;
use crate::trace::LeaseObserver;

/// Opens stores of one kind from lease sections.
#[async_trait]
pub trait StoreFactory: Send + Sync + 'static {
    /// The kind named by a section's `store` key.
    fn kind(&self) -> &'static str;

    /// Validates a section's store options without opening anything (unknown keys, wrong
    /// types, paths). Errors name the key or path.
    fn check(&self, section: &LeaseSection) -> Result<(), ConfigError>;

    /// Opens (or connects to) the store of a section.
    async fn open(&self, section: &LeaseSection) -> Result<Arc<dyn LeaseStore>, ConfigError>;

    /// The options a section of this kind takes when it leaves them out (the kind's
    /// reference fragment): what [`LeaseProvider::section_with_defaults`] fills in, so
    /// that a setting written out and the same setting left to its default compare equal.
    /// The default is none.
    fn defaults(&self) -> toml::Table {
        toml::Table::new()
    }
}

/// The store kinds a provider can open.
#[derive(Clone, Default)]
pub struct StoreRegistry {
    factories: BTreeMap<&'static str, Arc<dyn StoreFactory>>,
    /// Kinds a build left out, with the cargo feature that turns each on.
    left_out: BTreeMap<&'static str, &'static str>,
}

impl StoreRegistry {
    /// A registry with the in-memory store only.
    pub fn new() -> Self {
        StoreRegistry::default().with(MemoryStoreFactory)
    }

    /// Adds (or replaces) a kind.
    pub fn with(mut self, factory: impl StoreFactory) -> Self {
        self.factories.insert(factory.kind(), Arc::new(factory));
        self
    }

    /// Records that this build left `kind` out: sections of that kind load (the reference
    /// defines one per kind), and using one is an error naming `feature`.
    pub fn left_out(mut self, kind: &'static str, feature: &'static str) -> Self {
        self.left_out.insert(kind, feature);
        self
    }

    /// The factory of `kind`.
    pub fn get(&self, kind: &str) -> Option<&Arc<dyn StoreFactory>> {
        self.factories.get(kind)
    }

    /// The factory of the store kind of `section`; the error names the section's `store` key
    /// and either the known kinds or the feature that would build this one.
    pub fn factory(&self, section: &LeaseSection) -> Result<&Arc<dyn StoreFactory>, ConfigError> {
        let key = || format!("{}.store", section.key());
        if let Some(factory) = self.factories.get(section.store.as_str()) {
            return Ok(factory);
        }
        Err(match self.left_out.get(section.store.as_str()) {
            Some(feature) => ConfigError::StoreNotBuilt {
                key: key(),
                kind: section.store.clone(),
                feature: feature.to_string(),
            },
            None => ConfigError::UnknownStore {
                key: key(),
                kind: section.store.clone(),
                known: self
                    .factories
                    .keys()
                    .map(|k| k.to_string())
                    .chain(
                        self.left_out
                            .iter()
                            .map(|(k, f)| format!("{k} with feature `{f}`")),
                    )
                    .collect::<Vec<_>>()
                    .join(", "),
            },
        })
    }

    /// The registered kinds, comma-separated.
    pub fn kinds(&self) -> String {
        self.factories
            .keys()
            .copied()
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[derive(Default)]
struct Loaded {
    stores: HashMap<String, Arc<dyn LeaseStore>>,
    batchers: HashMap<(String, String), RenewalBatcher>,
    leases: HashMap<(String, String, String), Lease>,
}

/// Loads leases by (name, section, owner); the same triple returns the same [`Lease`].
/// One store per section and one renewal batcher per (section, owner) are shared.
pub struct LeaseProvider {
    config: TenureConfig,
    registry: StoreRegistry,
    loaded: Mutex<Loaded>,
    observers: std::sync::Mutex<Vec<LeaseObserver>>,
}

impl LeaseProvider {
    /// Checks every lease section of `config` (known store kind, valid timing and options)
    /// and returns a provider. Errors name the offending key or path. A section of a kind
    /// this build left out loads; using it is an error naming the feature to enable.
    pub fn new(config: TenureConfig, registry: StoreRegistry) -> Result<Self, ConfigError> {
        for name in config.lease_section_names()? {
            let section = config.lease_section(&name)?;
            match registry.factory(&section) {
                Ok(_) | Err(ConfigError::StoreNotBuilt { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        // Options are checked for sections that are used (the reference defines sections
        // of every built-in kind, which a user need not have set up).
        Ok(LeaseProvider {
            config,
            registry,
            loaded: Mutex::new(Loaded::default()),
            observers: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// The configuration this provider reads.
    pub fn config(&self) -> &TenureConfig {
        &self.config
    }

    /// The resolved section `name` with its options checked by its store kind.
    pub fn section(&self, name: &str) -> Result<LeaseSection, ConfigError> {
        let section = self.config.lease_section(name)?;
        self.registry.factory(&section)?.check(&section)?;
        Ok(section)
    }

    /// Section `name` with the options it leaves out filled in from its kind's
    /// [defaults](StoreFactory::defaults) (not checked: see [`section`](Self::section)).
    /// A kind this build left out keeps its options as written.
    pub fn section_with_defaults(&self, name: &str) -> Result<LeaseSection, ConfigError> {
        let mut section = self.config.lease_section(name)?;
        if let Ok(factory) = self.registry.factory(&section) {
            let mut options = factory.defaults();
            options.extend(std::mem::take(&mut section.options));
            section.options = options;
        }
        Ok(section)
    }

    /// The store of section `name`, opened on first use.
    pub async fn store(&self, name: &str) -> Result<Arc<dyn LeaseStore>, ConfigError> {
        let mut loaded = self.loaded.lock().await;
        self.store_locked(&mut loaded, name).await
    }

    async fn store_locked(
        &self,
        loaded: &mut Loaded,
        name: &str,
    ) -> Result<Arc<dyn LeaseStore>, ConfigError> {
        if let Some(store) = loaded.stores.get(name) {
            return Ok(store.clone());
        }
        let section = self.section(name)?;
        let store = self.registry.factory(&section)?.open(&section).await?;
        loaded.stores.insert(name.to_string(), store.clone());
        Ok(store)
    }

    /// The spec of lease `name` in section `section` for `owner`, sharing the section's
    /// store and the owner's renewal batcher. Use it to start a LeaseActor under a supervisor.
    pub async fn spec(
        &self,
        name: &str,
        section: &str,
        owner: &str,
    ) -> Result<LeaseSpec, ConfigError> {
        check_lease_name(name)?;
        let mut loaded = self.loaded.lock().await;
        let store = self.store_locked(&mut loaded, section).await?;
        let settings = self.config.lease_section(section)?.settings;
        let batcher = loaded
            .batchers
            .entry((section.to_string(), owner.to_string()))
            .or_insert_with(|| RenewalBatcher::new(store.clone(), owner.to_string(), settings))
            .clone();
        let spec = LeaseSpec::with_batcher(name, owner, store, settings, batcher)?;
        Ok(match self.observer() {
            Some(o) => spec.with_observer(o),
            None => spec,
        })
    }

    /// One observer reporting to every observer added so far, in order (for leases whose
    /// specs are built elsewhere, such as a node's member lease); `None` without any.
    pub fn observer(&self) -> Option<LeaseObserver> {
        let observers = self
            .observers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        match observers.len() {
            0 => None,
            1 => observers.into_iter().next(),
            _ => Some(LeaseObserver::new(move |lease, owner, trace| {
                for o in &observers {
                    o.report(lease, owner, trace);
                }
            })),
        }
    }

    /// Also reports the traces of every lease whose spec this provider builds from now on
    /// to `observer` (a node's history, a management endpoint), after the observers added
    /// before it.
    pub fn observe(&self, observer: LeaseObserver) {
        self.observers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(observer);
    }

    /// The lease `name` of section `section` held for `owner`; the same triple returns the
    /// same lease (sharing its state). The provider keeps it until
    /// [`shutdown`](LeaseProvider::shutdown), so dropping the returned handle does not
    /// release a grant: use [`Lease::hold`] for a grant that releases on drop.
    pub async fn lease(&self, name: &str, section: &str, owner: &str) -> Result<Lease, LeaseError> {
        let key = (name.to_string(), section.to_string(), owner.to_string());
        if let Some(lease) = self.loaded.lock().await.leases.get(&key) {
            return Ok(lease.clone());
        }
        let spec = self.spec(name, section, owner).await?;
        let mut loaded = self.loaded.lock().await;
        if let Some(lease) = loaded.leases.get(&key) {
            return Ok(lease.clone());
        }
        let lease = Lease::start(spec).await?;
        loaded.leases.insert(key, lease.clone());
        Ok(lease)
    }

    /// Releases and forgets every lease this provider loaded.
    pub async fn shutdown(&self) {
        let leases: Vec<Lease> = self
            .loaded
            .lock()
            .await
            .leases
            .drain()
            .map(|(_, l)| l)
            .collect();
        for lease in leases {
            if let Err(e) = lease.release().await {
                tracing::warn!(lease = lease.name(), error = %e, "release at shutdown failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(store: &str) -> TenureConfig {
        let mut config = TenureConfig::reference();
        config
            .merge_str(
                &format!(
                    "[tenure]\ndefault-lease-section = \"a\"\n[lease.a]\nstore = \"{store}\"\n"
                ),
                "test",
            )
            .expect("merges");
        config
    }

    #[test]
    fn a_kind_left_out_of_the_build_loads_and_names_its_feature_when_used() {
        // The reference has a section of every kind: a registry must know them all.
        let registry = || {
            ["sqlite", "postgres", "etcd", "zookeeper"]
                .into_iter()
                .fold(StoreRegistry::new(), |r, kind| r.left_out(kind, kind))
        };
        let provider = LeaseProvider::new(config("etcd"), registry()).expect("loads");
        let err = provider.section("a").expect_err("not built");
        assert!(
            matches!(&err, ConfigError::StoreNotBuilt { key, kind, feature }
                if key == "lease.a.store" && kind == "etcd" && feature == "etcd"),
            "{err}"
        );
        assert!(err.to_string().contains("cargo feature `etcd`"), "{err}");

        let err = LeaseProvider::new(config("consul"), registry())
            .err()
            .expect("unknown kind");
        let text = err.to_string();
        assert!(
            text.contains("lease.a.store")
                && text.contains("`consul`")
                && text.contains("memory")
                && text.contains("etcd with feature `etcd`"),
            "{text}"
        );
    }
}
