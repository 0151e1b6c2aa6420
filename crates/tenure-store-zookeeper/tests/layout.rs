//! The root's layout: on a root this version creates, a family of leases (the cluster's
//! member leases) lives under its own parent and is listed from it alone; a root an earlier
//! version created keeps the flat layout; and a client of an earlier version, which knows
//! only the flat layout, can never grant a lease on a families root at another path than
//! this version grants it.

mod common;

use std::time::Duration;

use tenure_lease::{AcquireOutcome, LeaseStore};
use tenure_lease_kit::conformance::owner_request;
use tenure_store_zookeeper::zookeeper_client as zk;
use tenure_store_zookeeper::{ZooKeeperOptions, ZooKeeperStore};

const SESSION: Duration = Duration::from_secs(5);
const CONNECTION: Duration = Duration::from_secs(5);

/// A plain session, as a client of an earlier version opens it (no gate identity).
async fn earlier_client(shared: &common::Shared) -> zk::Client {
    zk::Client::connector()
        .with_session_timeout(SESSION)
        .connect(&shared.server.connect_string())
        .await
        .expect("connect")
}

/// The flat layout's acquire, as an earlier version sends it: one multi that creates the
/// lease node `<root>/<name>` (when not known to exist), sets its data and creates the
/// ephemeral holder node; on `NodeExists` for the lease node again without creating it,
/// on `NoNode` after creating it with its parents. `Ok` is a grant.
async fn earlier_acquire(
    client: &zk::Client,
    root: &str,
    name: &str,
    owner: &str,
) -> Result<(), zk::Error> {
    let (lease, holder) = (format!("{root}/{name}"), format!("{root}/{name}/holder"));
    let data = format!(r#"{{"owner":"{owner}","instance":"{owner}-1","ttl_ms":5000}}"#);
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    let mut fresh = true;
    let mut last = zk::Error::NoNode;
    for _ in 0..4 {
        let mut multi = client.new_multi_writer();
        if fresh {
            multi.add_create(&lease, &[], &persistent)?;
        }
        multi.add_set_data(&lease, &[], None)?;
        multi.add_create(&holder, data.as_bytes(), &ephemeral)?;
        match multi.commit().await {
            Ok(_) => return Ok(()),
            Err(zk::MultiWriteError::OperationFailed {
                index: 0,
                source: zk::Error::NodeExists,
            }) if fresh => fresh = false,
            Err(zk::MultiWriteError::OperationFailed {
                index: 0,
                source: zk::Error::NoNode,
            }) => client.mkdir(&lease, &persistent).await?,
            Err(e) => last = e.into(),
        }
        if !matches!(last, zk::Error::NoNode) {
            return Err(last);
        }
    }
    Err(last)
}

async fn grant(store: &ZooKeeperStore, name: &str, owner: &str) {
    match store
        .try_acquire(&owner_request(name, owner, SESSION))
        .await
        .expect("acquire")
    {
        AcquireOutcome::Granted(_) => {}
        other => panic!("{name} not granted to {owner}: {other:?}"),
    }
}

/// Every holder node under `path`, at any depth.
async fn holder_nodes(client: &zk::Client, path: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut todo = vec![path.to_string()];
    while let Some(node) = todo.pop() {
        let children = match client.list_children(&node).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => continue,
            Err(e) => panic!("list {node}: {e}"),
        };
        for child in children {
            let full = format!("{node}/{child}");
            if child == "holder" {
                found.push(full.clone());
            }
            todo.push(full);
        }
    }
    found.sort();
    found
}

/// The listing of the member leases reads the member family's parent and nothing else:
/// with read permission taken from the root and from another family's parent, it still
/// answers (a listing that read the root's children, as the flat layout's must, fails).
#[tokio::test]
async fn listing_a_family_reads_only_its_parent() {
    let shared = common::exclusive().await;
    let store = shared.store(SESSION, CONNECTION);
    for (name, owner) in [
        ("s-member-10.0.0.1:2552", "a"),
        ("s-member-node-2:2552", "b"),
        ("s-shard-t-1", "a"),
        ("s-shard-t-2", "b"),
        ("s-join", "a"),
        ("other", "b"),
    ] {
        grant(&store, name, owner).await;
    }
    let admin = earlier_client(&shared).await;
    let root = &shared.root;
    let unreadable = [
        zk::Acl::new(
            zk::Permission::WRITE | zk::Permission::DELETE | zk::Permission::ADMIN,
            zk::AuthId::anyone(),
        ),
        zk::Acl::new(
            zk::Permission::CREATE,
            zk::AuthId::new(
                "digest",
                "tenure-layout-families-1://poyjk3CFocb3AhCKmo+vt5mKE=",
            ),
        ),
    ];
    for node in [root.clone(), format!("{root}/s-shard-")] {
        // (The shard family's parent is checked to exist below, with the root readable.)
        match admin.set_acl(&node, &unreadable, None).await {
            Ok(_) | Err(zk::Error::NoNode) => {}
            Err(e) => panic!("take read permission from {node}: {e}"),
        }
    }
    let listed: Vec<(String, String)> = store
        .list("s-member-")
        .await
        .expect("the member family is listed from its parent alone")
        .into_iter()
        .map(|r| (r.name, r.owner))
        .collect();
    assert_eq!(
        listed,
        [
            ("s-member-10.0.0.1:2552".to_string(), "a".to_string()),
            ("s-member-node-2:2552".to_string(), "b".to_string())
        ]
    );
    store
        .list("s-")
        .await
        .expect_err("a listing across families reads the unreadable root");

    admin
        .set_acl(
            root,
            &[zk::Acl::new(zk::Permission::READ, zk::AuthId::anyone())],
            None,
        )
        .await
        .expect("give read permission back");
    let mut members = admin
        .list_children(&format!("{root}/s-member-"))
        .await
        .expect("the member family's parent");
    members.sort();
    assert_eq!(members, ["s-member-10.0.0.1:2552", "s-member-node-2:2552"]);
    let mut top = admin.list_children(root).await.expect("root");
    top.sort();
    assert_eq!(top, ["other", "s-join", "s-member-", "s-shard-"]);
}

/// A root an earlier version created (flat: every lease node a child of the root) stays
/// flat: this version finds the earlier client's grant where that client made it, and grants
/// member leases at their flat paths, creating no family parent.
#[tokio::test]
async fn a_flat_root_stays_flat_and_is_never_mixed() {
    let shared = common::exclusive().await;
    let root = &shared.root;
    let earlier = earlier_client(&shared).await;
    earlier_acquire(&earlier, root, "s-member-old:1", "old")
        .await
        .expect("the earlier client creates the flat root and is granted");

    let store = shared.store(SESSION, CONNECTION);
    match store
        .try_acquire(&owner_request("s-member-old:1", "new", SESSION))
        .await
        .expect("acquire")
    {
        AcquireOutcome::Held(r) => assert_eq!(r.owner, "old"),
        other => panic!("the earlier client's grant was not seen: {other:?}"),
    }
    grant(&store, "s-member-new:2", "new").await;
    assert_eq!(
        holder_nodes(&earlier, root).await,
        [
            format!("{root}/s-member-new:2/holder"),
            format!("{root}/s-member-old:1/holder"),
        ]
    );
    let owners: Vec<String> = store
        .list("s-member-")
        .await
        .expect("list")
        .into_iter()
        .map(|r| r.owner)
        .collect();
    assert_eq!(owners, ["new", "old"]);
    // And the earlier client sees this version's grant where it looks.
    assert!(matches!(
        earlier_acquire(&earlier, root, "s-member-new:2", "old").await,
        Err(zk::Error::NodeExists)
    ));
}

/// On a root this version created, a client of an earlier version (flat paths, no gate
/// identity) is refused the lease node its acquire creates first, so it is granted nothing,
/// and never a lease beside this version's holder of it; a lease without a family has the
/// same path in both layouts, where the earlier client finds this version's grant.
#[tokio::test]
async fn an_earlier_client_cannot_grant_on_a_families_root() {
    let shared = common::exclusive().await;
    let root = &shared.root;
    let store = shared.store(SESSION, CONNECTION);
    grant(&store, "s-member-a:1", "a").await;
    grant(&store, "plain", "a").await;

    let earlier = earlier_client(&shared).await;
    for name in ["s-member-a:1", "s-member-b:2", "s-member-", "plain", "new"] {
        match earlier_acquire(&earlier, root, name, "old").await {
            Err(zk::Error::NoAuth) => {}
            other => panic!("an earlier client acquiring {name}: {other:?}"),
        }
    }
    // Where it looks for a lease without a family, it finds this version's grant.
    let (data, _) = earlier
        .get_data(&format!("{root}/plain/holder"))
        .await
        .expect("the holder of plain at its flat path");
    assert!(String::from_utf8_lossy(&data).contains(r#""owner":"a""#));
    assert_eq!(
        holder_nodes(&earlier, root).await,
        [
            format!("{root}/plain/holder"),
            format!("{root}/s-member-/s-member-a:1/holder"),
        ]
    );
    // A store opened now on the same root reads the same layout.
    let other = shared.store(SESSION, CONNECTION);
    match other
        .try_acquire(&owner_request("s-member-a:1", "b", SESSION))
        .await
        .expect("acquire")
    {
        AcquireOutcome::Held(r) => assert_eq!(r.owner, "a"),
        other => panic!("a second holder: {other:?}"),
    }
}

/// A store with `auth` creates a flat root: its creator-only ACL has no room for the gate
/// identity, so the member leases go to their flat paths.
#[tokio::test]
async fn a_root_created_with_auth_is_flat() {
    let shared = common::exclusive().await;
    let root = &shared.root;
    let mut options = ZooKeeperOptions::new(shared.server.connect_string(), root.clone(), SESSION);
    options.auth = Some(("digest".into(), b"tenure-test:secret".to_vec()));
    let store = ZooKeeperStore::new(options).expect("options");
    grant(&store, "s-member-a:1", "a").await;
    let admin = zk::Client::connector()
        .with_session_timeout(SESSION)
        .with_auth("digest", b"tenure-test:secret")
        .connect(&shared.server.connect_string())
        .await
        .expect("connect");
    let (acls, _) = admin.get_acl(root).await.expect("the root's ACL");
    assert!(
        acls.iter()
            .all(|a| a.scheme() == "digest" && a.id().starts_with("tenure-test:")),
        "{acls:?}"
    );
    assert_eq!(
        holder_nodes(&admin, root).await,
        [format!("{root}/s-member-a:1/holder")]
    );
}
