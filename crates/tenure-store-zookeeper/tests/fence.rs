//! Writes fenced in the caller's own multi: committed for the current grant, refused (the
//! whole multi fails, writing nothing) once the grant was released or replaced, against a
//! real ZooKeeper server.

mod common;

use std::time::Duration;

use tenure_lease::{AcquireRequest, FencingToken, LeaseStore};
use tenure_lease_kit::conformance::{granted_token, owner_request};
use tenure_store_zookeeper::ZooKeeperStore;
use tenure_store_zookeeper::zookeeper_client as zk;

fn request(owner: &str) -> AcquireRequest {
    owner_request("report", owner, Duration::from_secs(3))
}

/// One fenced write of `value` to `path` with `token`: `true` when it committed.
async fn write(
    store: &ZooKeeperStore,
    client: &zk::Client,
    path: &str,
    token: FencingToken,
    value: &[u8],
) -> bool {
    let Some(fence) = store.fence("report", token).await.unwrap() else {
        return false;
    };
    let mut multi = client.new_multi_writer();
    fence.add_to(&mut multi).unwrap();
    multi.add_set_data(path, value, None).unwrap();
    multi.commit().await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_commits_only_under_the_grant_it_names() {
    let shared = common::exclusive().await;
    let client = zk::Client::connect(&shared.server.connect_string())
        .await
        .unwrap();
    let path = format!("{}-report-data", shared.root);
    client
        .mkdir(
            &path,
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .unwrap();
    let store = shared.store(Duration::from_secs(3), Duration::from_secs(2));
    let first = granted_token(&store.try_acquire(&request("a")).await.unwrap());
    assert!(write(&store, &client, &path, first, b"a1").await);
    let other = FencingToken::new(first.get() + 1);
    assert!(
        !write(&store, &client, &path, other, b"x").await,
        "another token"
    );
    // A fence taken under the grant, then the grant replaced before the multi commits.
    let stale = store
        .fence("report", first)
        .await
        .unwrap()
        .expect("current");
    assert!(store.release("report", "a", first).await.unwrap());
    assert!(
        !write(&store, &client, &path, first, b"a2").await,
        "released"
    );
    let second = granted_token(&store.try_acquire(&request("b")).await.unwrap());
    assert!(second > first);
    let mut multi = client.new_multi_writer();
    stale.add_to(&mut multi).unwrap();
    multi.add_set_data(&path, b"late", None).unwrap();
    assert!(
        multi.commit().await.is_err(),
        "a fence of the replaced grant fails the multi"
    );
    assert!(write(&store, &client, &path, second, b"b1").await);
    let (data, _) = client.get_data(&path).await.unwrap();
    assert_eq!(data, b"b1", "only the holders' writes landed");
}
