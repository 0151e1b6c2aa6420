//! The cheap check for changed grants ([`GrantChanges`](tenure_lease::GrantChanges)): a store
//! runs this case when its [`conformance_tests!`](crate::conformance_tests) lists
//! `grant_changes`.

use std::time::Duration;

use super::{Harness, grant_changes_of, granted_token, request};
use tenure_lease::{AcquireRequest, ChangeVersion, Changes, HeldLease, LeaseStore};

/// Asks whether the grants under `c-` changed since `since`; answers the version to hold and
/// whether they changed.
async fn check(store: &dyn LeaseStore, since: Option<ChangeVersion>) -> (ChangeVersion, bool) {
    match grant_changes_of(store)
        .changes_since("c-", since)
        .await
        .expect("changes_since")
    {
        Changes::Unchanged(v) => (v, false),
        Changes::Changed(v) => (v, true),
    }
}

/// The version moves when a grant under the prefix is made, released, expires, or is taken
/// over after expiring, whichever client (connection) wrote it; it does not move on
/// renewals or grants outside the prefix.
pub async fn grant_changes_move_on_grants_and_ends_not_on_renewals(h: &dyn Harness) {
    let watcher = h.client().await;
    let a = h.client().await;
    let b = h.client().await;
    // The longest ttl every store's suite accepts (ZooKeeper refuses a ttl above its
    // negotiated session timeout, 5 s in its suite); the steps between two renewals of a
    // grant take milliseconds.
    let long = Duration::from_secs(5);

    let (v, changed) = check(&*watcher, None).await;
    assert!(changed, "with no version held, the answer is changed");
    let (v, changed) = check(&*watcher, Some(v)).await;
    assert!(!changed, "nothing happened, yet the grants changed");

    // A grant under the prefix.
    let t1 = granted_token(
        &a.try_acquire(&request("c-1", "a", long))
            .await
            .expect("acquire"),
    );
    let (v, changed) = check(&*watcher, Some(v)).await;
    assert!(changed, "a new grant is a change");
    let (v, changed) = check(&*watcher, Some(v)).await;
    assert!(!changed, "the same grant seen twice");

    // Renewals and grants elsewhere are none.
    for _ in 0..3 {
        let held = HeldLease {
            name: "c-1".into(),
            token: t1,
        };
        a.renew("a", &[held], long).await.expect("renew");
    }
    let elsewhere = granted_token(
        &a.try_acquire(&request("other-1", "a", long))
            .await
            .expect("acquire"),
    );
    assert!(a.release("other-1", "a", elsewhere).await.expect("release"));
    let (v2, changed) = check(&*watcher, Some(v)).await;
    assert!(
        !changed,
        "renewals or a lease outside the prefix changed the grants"
    );
    let mut v = v2;
    // A reentrant acquire may count as a change (a store may rewrite the grant): an
    // answer "changed" only costs a listing, so either answer is right.
    granted_token(
        &a.try_acquire(&request("c-1", "a", long))
            .await
            .expect("reentrant"),
    );
    let (v2, _) = check(&*watcher, Some(v)).await;
    v = v2;

    // A release.
    assert!(a.release("c-1", "a", t1).await.expect("release"));
    let (v2, changed) = check(&*watcher, Some(v)).await;
    assert!(changed, "a release is a change");
    v = v2;

    // An expiry, which nobody writes.
    let short = Duration::from_secs(2);
    granted_token(
        &a.try_acquire(&request("c-2", "a", short))
            .await
            .expect("acquire"),
    );
    let (v2, changed) = check(&*watcher, Some(v)).await;
    assert!(changed, "a new grant is a change");
    v = v2;
    for _ in 0..600 {
        if watcher.read("c-2").await.expect("read").is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        watcher.read("c-2").await.expect("read").is_none(),
        "the short grant never expired"
    );
    // Reported at once on stores that judge expiry where they answer the check; where
    // listings judge it on a client clock (etcd), once the server removes the grant.
    let mut reported = false;
    for _ in 0..600 {
        let (v2, changed) = check(&*watcher, Some(v)).await;
        v = v2;
        if changed {
            reported = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(reported, "an expiry is a change");
    let (v2, changed) = check(&*watcher, Some(v)).await;
    assert!(!changed, "the same expiry seen twice");
    v = v2;

    // Another owner takes the expired lease over.
    let next = AcquireRequest {
        instance: "b-instance".into(),
        ..request("c-2", "b", long)
    };
    let t2 = granted_token(&b.try_acquire(&next).await.expect("take over"));
    let (v2, changed) = check(&*watcher, Some(v)).await;
    assert!(changed, "taking an expired lease over is a change");
    v = v2;
    let (v2, changed) = check(&*watcher, Some(v)).await;
    assert!(!changed, "the take-over seen twice");
    v = v2;

    // Among several grants: the release of one that is not the latest, and a grant made
    // while another ends (as many grants as before).
    let t3 = granted_token(
        &a.try_acquire(&request("c-3", "a", long))
            .await
            .expect("acquire"),
    );
    let (v2, _) = check(&*watcher, Some(v)).await;
    v = v2;
    assert!(b.release("c-2", "b", t2).await.expect("release"));
    let (v2, changed) = check(&*watcher, Some(v)).await;
    assert!(changed, "the release of an older grant is a change");
    v = v2;
    granted_token(
        &a.try_acquire(&request("c-4", "a", long))
            .await
            .expect("acquire"),
    );
    assert!(a.release("c-3", "a", t3).await.expect("release"));
    let (_, changed) = check(&*watcher, Some(v)).await;
    assert!(changed, "one grant made and another ended is a change");
}
