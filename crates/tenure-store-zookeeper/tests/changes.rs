//! The change check sees grants end that no client deletes: a holder whose session the
//! server ends (a crashed or cut-off process) loses its grant with its ephemeral holder
//! node, and that is a change.

mod common;

use std::time::Duration;

use tenure_lease::{AcquireOutcome, AcquireRequest, ChangeVersion, Changes, HeldLease, LeaseStore};
use tenure_lease_kit::conformance::owner_request;
use tenure_store_zookeeper::ZooKeeperStore;

const SESSION: Duration = Duration::from_secs(5);
const CONNECTION: Duration = Duration::from_secs(5);

async fn check(store: &ZooKeeperStore, since: Option<ChangeVersion>) -> (ChangeVersion, bool) {
    let changes = store
        .as_grant_changes()
        .expect("the store checks for changes");
    match changes.changes_since("m-", since).await.expect("changes") {
        Changes::Unchanged(v) => (v, false),
        Changes::Changed(v) => (v, true),
    }
}

fn member(name: &str, owner: &str) -> AcquireRequest {
    owner_request(name, owner, SESSION)
}

#[tokio::test]
async fn a_grant_ended_with_its_holders_session_is_a_change() {
    let shared = common::exclusive().await;
    let holder = shared.store(SESSION, CONNECTION);
    let watcher = shared.store(SESSION, CONNECTION);
    let mut held = Vec::new();
    for (name, owner) in [("m-a", "a"), ("m-b", "b")] {
        let outcome = holder
            .try_acquire(&member(name, owner))
            .await
            .expect("acquire");
        let AcquireOutcome::Granted(grant) = outcome else {
            panic!("{name} is held: {outcome:?}")
        };
        held.push((
            owner,
            HeldLease {
                name: name.into(),
                token: grant.token,
            },
        ));
    }
    // Both grants renewed all along, so that this store never expires them itself: only
    // the server ends a's grant.
    let renewing = {
        let holder = holder.clone();
        tokio::spawn(async move {
            loop {
                for (owner, lease) in &held {
                    let _ = holder
                        .renew(owner, std::slice::from_ref(lease), SESSION)
                        .await;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let (v, _) = check(&watcher, None).await;
    let (v, changed) = check(&watcher, Some(v)).await;
    assert!(!changed, "nothing happened, yet the grants changed");

    // The server ends a's session: its holder node goes, and no client writes anything.
    let session = holder.session_of("a").await.expect("a's session");
    shared.end_session(&session).await;
    let (v, changed) = check(&watcher, Some(v)).await;
    assert!(changed, "a grant ended with its session is a change");
    let listed: Vec<String> = watcher
        .list("m-")
        .await
        .expect("list")
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(listed, ["m-b"]);
    let (_, changed) = check(&watcher, Some(v)).await;
    assert!(!changed, "the same end seen twice");
    renewing.abort();
}

/// Watch events are lost while the session is disconnected (ZOOKEEPER-4698): a grant made
/// meanwhile is reported through the disconnection itself.
#[tokio::test]
async fn a_grant_made_while_the_checker_was_disconnected_is_a_change() {
    let shared = common::exclusive().await;
    let (watcher, proxy) = shared.store_via_proxy(SESSION, CONNECTION);
    let holder = shared.store(SESSION, CONNECTION);
    let (v, _) = check(&watcher, None).await;
    let (v, changed) = check(&watcher, Some(v)).await;
    assert!(!changed, "nothing happened, yet the grants changed");

    // Cut off until the watcher's client notices (a check fails), then a grant is made.
    proxy.set_cut(true);
    let changes = watcher
        .as_grant_changes()
        .expect("the store checks for changes");
    let mut failed = false;
    for _ in 0..60 {
        let answer = tokio::time::timeout(
            Duration::from_millis(500),
            changes.changes_since("m-", Some(v)),
        )
        .await;
        if matches!(answer, Ok(Err(_))) {
            failed = true;
            break;
        }
    }
    assert!(failed, "the cut-off client never noticed");
    let outcome = holder
        .try_acquire(&member("m-x", "x"))
        .await
        .expect("acquire");
    assert!(matches!(outcome, AcquireOutcome::Granted(_)), "{outcome:?}");
    proxy.set_cut(false);

    let answer = tenure_test_kit::eventually_async(
        "the client to reconnect and answer",
        Duration::from_secs(10),
        async || changes.changes_since("m-", Some(v)).await,
    )
    .await;
    assert!(
        matches!(answer, Changes::Changed(_)),
        "a grant made while disconnected went unseen: {answer:?}"
    );
}
