//! Pending preemption requests as renewals see them, against a real ZooKeeper server: a
//! renewal skips the holder nodes while the root's data version (the count of request
//! writes) stays, so every way a request can change must move it, and nothing kept from an
//! earlier renewal may outlive its grant.

mod common;

use std::time::Duration;

use tenure_lease::{
    AcquireOutcome, AcquireRequest, HeldLease, LeaseStore, PreemptAnswer, PreemptionRequest,
    PreemptionRequests, Renewal,
};
use tenure_lease_kit::conformance::owner_request;
use tenure_store_zookeeper::ZooKeeperStore;
use tenure_store_zookeeper::zookeeper_client as zk;

const TTL: Duration = Duration::from_secs(2);

fn acquire_request(name: &str, owner: &str) -> AcquireRequest {
    owner_request(name, owner, TTL)
}

async fn hold(store: &ZooKeeperStore, name: &str, owner: &str) -> HeldLease {
    match store
        .try_acquire(&acquire_request(name, owner))
        .await
        .expect("acquire")
    {
        AcquireOutcome::Granted(r) => HeldLease {
            name: name.into(),
            token: r.token,
        },
        AcquireOutcome::Held(r) => panic!("{name} held by {}", r.owner),
    }
}

fn preemption(by: &str, priority: u64, forceful: bool) -> PreemptionRequest {
    PreemptionRequest {
        by: by.into(),
        instance: format!("{by}-1"),
        priority,
        forceful,
        note: None,
    }
}

async fn request(store: &ZooKeeperStore, lease: &HeldLease, r: &PreemptionRequest) {
    match store
        .request_preemption(&lease.name, lease.token, r)
        .await
        .expect("request preemption")
    {
        PreemptAnswer::Recorded(_) => {}
        other => panic!("request on {} not recorded: {other:?}", lease.name),
    }
}

/// One batched renewal of `leases` by `owner` (must not fail).
async fn renew(store: &ZooKeeperStore, owner: &str, leases: &[HeldLease]) -> Vec<Renewal> {
    store.renew(owner, leases, TTL).await.expect("renew")
}

fn renewed(request: Option<PreemptionRequest>) -> Renewal {
    Renewal::Renewed { request }
}

/// Requests written, replaced and withdrawn by another client after the holder's renewals
/// have read its holder nodes are each seen by the next renewal, of this owner and of
/// another owner of the same root; unchanged, they are seen again by later renewals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_see_every_request_change() {
    let shared = common::exclusive().await;
    let (holder, requester) = (shared.store(TTL, TTL), shared.store(TTL, TTL));
    let held = vec![
        hold(&holder, "r-0", "a").await,
        hold(&holder, "r-1", "a").await,
        hold(&holder, "r-2", "a").await,
    ];
    let other = vec![hold(&holder, "r-b", "b").await];
    let plain = vec![Renewal::plain(true); 3];
    assert_eq!(renew(&holder, "a", &held).await, plain);
    assert_eq!(renew(&holder, "a", &held).await, plain);
    assert_eq!(
        renew(&holder, "b", &other).await,
        vec![Renewal::plain(true)]
    );

    let polite = preemption("c", 5, false);
    request(&requester, &held[1], &polite).await;
    let expected = vec![renewed(None), renewed(Some(polite.clone())), renewed(None)];
    for _ in 0..2 {
        assert_eq!(renew(&holder, "a", &held).await, expected);
    }
    // A renewal of a subset, then of all again: still the same request.
    assert_eq!(
        renew(&holder, "a", &held[1..2]).await,
        vec![renewed(Some(polite.clone()))]
    );
    assert_eq!(renew(&holder, "a", &held).await, expected);
    // Another owner's renewal after the write still sees nothing on its grant.
    assert_eq!(
        renew(&holder, "b", &other).await,
        vec![Renewal::plain(true)]
    );

    // Overtaken by a forceful one: refused from the next renewal on, every time.
    let forceful = preemption("d", 9, true);
    request(&requester, &held[1], &forceful).await;
    let expected = vec![
        renewed(None),
        Renewal::Refused(forceful.clone()),
        renewed(None),
    ];
    for _ in 0..2 {
        assert_eq!(renew(&holder, "a", &held).await, expected);
    }

    // Withdrawn: renewed again with no request.
    assert!(
        requester
            .withdraw_preemption(&held[1].name, held[1].token, "d")
            .await
            .expect("withdraw")
    );
    for _ in 0..2 {
        assert_eq!(renew(&holder, "a", &held).await, plain);
    }
}

/// A grant released with a request pending, then granted again (a new token), carries no
/// request: what a renewal learnt of the old grant does not outlive it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_does_not_outlive_its_grant() {
    let shared = common::exclusive().await;
    let (holder, requester) = (shared.store(TTL, TTL), shared.store(TTL, TTL));
    let first = hold(&holder, "g", "a").await;
    let forceful = preemption("c", 5, true);
    request(&requester, &first, &forceful).await;
    assert_eq!(
        renew(&holder, "a", std::slice::from_ref(&first)).await,
        vec![Renewal::Refused(forceful)]
    );
    assert!(
        holder
            .release(&first.name, "a", first.token)
            .await
            .expect("release")
    );
    let second = hold(&holder, "g", "a").await;
    assert!(second.token > first.token);
    for _ in 0..2 {
        assert_eq!(
            renew(&holder, "a", &[first.clone(), second.clone()]).await,
            vec![Renewal::NotHeld, Renewal::plain(true)]
        );
    }
}

/// A request whose count cannot be written (the root's ACL forbids writing its data) is
/// not recorded either: the request and its count are one transaction, so no renewal can
/// miss a recorded request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_recorded_only_with_its_count() {
    let shared = common::exclusive().await;
    let (holder, requester) = (shared.store(TTL, TTL), shared.store(TTL, TTL));
    let held = hold(&holder, "w", "a").await;
    assert_eq!(
        renew(&holder, "a", std::slice::from_ref(&held)).await,
        vec![Renewal::plain(true)]
    );
    let admin = zk::Client::connector()
        .with_session_timeout(TTL)
        .connect(&shared.server.connect_string())
        .await
        .expect("admin session");
    let (_, stat) = admin.get_acl(&shared.root).await.expect("root acl");
    let no_write = [zk::Acl::new(
        zk::Permission::READ
            | zk::Permission::CREATE
            | zk::Permission::DELETE
            | zk::Permission::ADMIN,
        zk::AuthId::anyone(),
    )];
    admin
        .set_acl(&shared.root, &no_write, Some(stat.aversion))
        .await
        .expect("take write permission from the root");
    let err = requester
        .request_preemption(&held.name, held.token, &preemption("c", 5, true))
        .await
        .expect_err("the count cannot be written");
    let text = err.to_string();
    assert!(
        text.contains(&held.name)
            && text.contains(&shared.root)
            && text.contains("write permission"),
        "{text}"
    );
    assert_eq!(
        holder
            .read(&held.name)
            .await
            .expect("read")
            .expect("still held")
            .request,
        None
    );
    assert_eq!(
        renew(&holder, "a", std::slice::from_ref(&held)).await,
        vec![Renewal::plain(true)]
    );
    admin
        .set_acl(
            &shared.root,
            &[zk::Acl::new(zk::Permission::ALL, zk::AuthId::anyone())],
            None,
        )
        .await
        .expect("give write permission back");
    let forceful = preemption("c", 5, true);
    request(&requester, &held, &forceful).await;
    assert_eq!(
        renew(&holder, "a", std::slice::from_ref(&held)).await,
        vec![Renewal::Refused(forceful)]
    );
}
