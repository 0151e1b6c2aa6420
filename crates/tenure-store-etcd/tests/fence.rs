//! Writes fenced in the caller's own etcd transaction: committed for the holder's grant,
//! refused (the `or_else` branch) once the grant was released and another owner holds the
//! lease, against a real etcd.

mod support;
use support::EtcdStores;

use std::time::Duration;

use etcd_client::{Txn, TxnOp};
use tenure_lease::{AcquireOutcome, AcquireRequest, FencingToken, LeaseStore};
use tenure_lease_kit::conformance::owner_request;
use tenure_test_kit::etcd::Etcd;

fn request(owner: &str) -> AcquireRequest {
    owner_request("report", owner, Duration::from_secs(30))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_commits_only_under_the_grant_it_names() {
    let etcd = Etcd::single().await;
    let store = etcd.store().await;
    let mut client = store.client().clone();
    let write = |token: FencingToken, value: &str| {
        Txn::new()
            .when([store.fence("report", token)])
            .and_then([TxnOp::put("/app/report", value, None)])
    };
    let AcquireOutcome::Granted(first) = store.try_acquire(&request("a")).await.unwrap() else {
        panic!("a not granted")
    };
    assert!(
        client
            .txn(write(first.token, "a1"))
            .await
            .unwrap()
            .succeeded()
    );
    assert!(
        !client
            .txn(write(FencingToken::new(first.token.get() + 1), "x"))
            .await
            .unwrap()
            .succeeded(),
        "another token is refused"
    );
    assert!(store.release("report", "a", first.token).await.unwrap());
    assert!(
        !client
            .txn(write(first.token, "a2"))
            .await
            .unwrap()
            .succeeded(),
        "a released grant's token is refused"
    );
    let AcquireOutcome::Granted(second) = store.try_acquire(&request("b")).await.unwrap() else {
        panic!("b not granted")
    };
    assert!(second.token > first.token);
    assert!(
        !client
            .txn(write(first.token, "a3"))
            .await
            .unwrap()
            .succeeded(),
        "the old grant's token is refused under the new grant"
    );
    assert!(
        client
            .txn(write(second.token, "b1"))
            .await
            .unwrap()
            .succeeded()
    );
    let got = client.get("/app/report", None).await.unwrap();
    assert_eq!(
        got.kvs()[0].value(),
        b"b1",
        "only the holders' writes landed"
    );
}
