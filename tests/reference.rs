//! `config/reference.toml`, the reference users read, is every crate's fragment together:
//! tenure-lease's (`[tenure]`, `[lease]` and its built-in sections) with each store crate's
//! options under its `[lease.<kind>]`, then the cluster's, the management endpoint's, the
//! singleton's and sharding's sections. Each crate checks its fragment against its defaults;
//! this checks the file against the fragments. `TENURE_BLESS=1` rewrites the file.

use std::path::Path;

/// The fragments put together.
fn assembled() -> String {
    let mut text = tenure::config::REFERENCE.to_string();
    for (kind, options) in [
        ("sqlite", tenure::sqlite::REFERENCE),
        ("postgres", tenure::postgres::REFERENCE),
        ("etcd", tenure::etcd::REFERENCE),
        ("zookeeper", tenure::zookeeper::REFERENCE),
    ] {
        // Each store's options follow the `store` line of its section.
        let store = format!("[lease.{kind}]\n");
        let line = format!("\nstore = \"{kind}\"\n");
        let section = text.find(&store).expect("a section per store kind");
        let at = section + text[section..].find(&line).expect("its store line") + line.len();
        text.insert_str(at, options);
    }
    for fragment in [
        tenure::cluster::REFERENCE,
        tenure_management::REFERENCE,
        tenure::singleton::REFERENCE,
        tenure::sharding::REFERENCE,
    ] {
        text.push('\n');
        text.push_str(fragment);
    }
    text
}

#[test]
fn the_reference_is_the_fragments_together() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/reference.toml");
    let expected = assembled();
    if std::env::var_os("TENURE_BLESS").is_some() {
        std::fs::write(&path, &expected).expect("write config/reference.toml");
    }
    let actual = std::fs::read_to_string(&path).expect("config/reference.toml");
    assert!(
        actual == expected,
        "config/reference.toml is not the crates' reference fragments together; rewrite it \
         with `TENURE_BLESS=1 cargo test -p tenure --all-features --test reference`"
    );
}

#[test]
fn the_reference_loads_and_every_section_reads_it() {
    let config = tenure::TenureConfig::from_toml_str(&assembled(), "config/reference.toml")
        .expect("the reference loads");
    let provider = tenure::provider(config).expect("provider");
    for name in provider.config().lease_section_names().unwrap() {
        provider.section(&name).expect("store options read");
    }
    let config = provider.config();
    tenure::singleton::SingletonSettings::from_config(config, "s", "sqlite").unwrap();
    tenure::sharding::ShardingSettings::from_config(config, "t", "sqlite").unwrap();
    tenure_management::ManagementSettings::from_config(config).unwrap();
    // The cluster's only required key has no default.
    let err = tenure::cluster::ClusterSettings::from_config(config)
        .unwrap_err()
        .to_string();
    assert!(err.contains("cluster.cookie"), "{err}");
}
