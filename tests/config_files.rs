//! Every config file shipped in config/ loads, every lease section in it opens, and
//! singletons and shards fit the timing of each.

use std::path::Path;

#[tokio::test]
async fn shipped_configs_load_and_open() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let (mut checked, mut clusters) = (0, 0);
    for entry in std::fs::read_dir(&dir).expect("config dir") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        // The demo's scenario file is another format (tenure-cli's tests read it); as a
        // Tenure config its `[[step]]` tables are refused, as an unknown table must be.
        if path.to_string_lossy().contains("scenario") {
            let err = tenure::TenureConfig::from_toml_str(
                &std::fs::read_to_string(&path).expect("read"),
                "scenario",
            )
            .unwrap_err()
            .to_string();
            assert!(err.contains("`step`"), "{err}");
            continue;
        }
        let mut config = tenure::TenureConfig::reference();
        config
            .merge_file(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        config
            .validate()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let provider =
            tenure::provider(config).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let default = provider
            .config()
            .default_lease_section()
            .expect("default section");
        provider
            .section(&default)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // Singletons and shards on any of its lease sections: their default stop budgets
        // fit the section's timing.
        for section in provider.config().lease_section_names().expect("sections") {
            tenure::singleton::SingletonSettings::from_config(provider.config(), "s", &section)
                .unwrap_or_else(|e| panic!("{} [lease.{section}]: {e}", path.display()));
            tenure::sharding::ShardingSettings::from_config(provider.config(), "t", &section)
                .unwrap_or_else(|e| panic!("{} [lease.{section}]: {e}", path.display()));
        }
        let cluster: tenure::cluster::ClusterConfig = provider
            .config()
            .section("cluster")
            .expect("[cluster] reads");
        if cluster.cookie.is_some() {
            let cluster = tenure::cluster::ClusterSettings::from_config(provider.config())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            // A crashed node's singletons and shards come back one lease ttl after its last
            // renewal: an example cluster must not keep them away for long after the node
            // itself is seen down (the [lease] default of 120s would).
            let singleton = tenure::singleton::SingletonSettings::from_config(
                provider.config(),
                "s",
                &cluster.lease_section,
            )
            .unwrap();
            let ttl = singleton.lease.heartbeat_timeout;
            let member_ttl = cluster.member_lease.heartbeat_timeout;
            assert!(
                ttl <= 2 * member_ttl,
                "{}: singleton and shard leases (ttl {ttl:?}) fail over far slower than members (ttl {member_ttl:?})",
                path.display()
            );
            clusters += 1;
        }
        checked += 1;
    }
    assert!(checked >= 4, "reference and examples: {checked}");
    assert!(
        clusters >= 1,
        "the cluster example's [cluster] section is checked"
    );
}

#[tokio::test]
async fn same_triple_gives_the_same_lease() {
    let config = tenure::TenureConfig::from_toml_str(
        "[lease.t]\nstore = \"memory\"\nnamespace = \"triple\"\nheartbeat-timeout = \"10s\"\nheartbeat-interval = \"1s\"",
        "test",
    )
    .unwrap();
    let provider = tenure::provider(config).unwrap();
    let a = provider.lease("x", "t", "n1:1").await.unwrap();
    let b = provider.lease("x", "t", "n1:1").await.unwrap();
    let c = provider.lease("x", "t", "n2:1").await.unwrap();
    assert!(matches!(
        a.acquire().await.unwrap(),
        tenure::Acquired::Granted { .. }
    ));
    assert!(b.check_lease(), "same instance shares the grant");
    assert!(!c.check_lease());
    assert!(
        matches!(c.acquire().await.unwrap(), tenure::Acquired::NotGranted { holder: Some(h), .. } if h == "n1:1")
    );
    let err = provider
        .lease("", "t", "n1:1")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("must not be empty"), "{err}");
    let err = provider
        .lease("x", "nope", "n1:1")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("no lease section `nope`"), "{err}");
}
