//! A suspend of the holder's host counts in the store's local expiry (the holder clock,
//! `CLOCK_BOOTTIME`): a grant whose ttl passed during a suspend is not renewed after it.

mod common;

use std::time::Duration;

use tenure_lease::{AcquireOutcome, AcquireRequest, HeldLease, HolderClock, LeaseStore, Renewal};
use tenure_store_zookeeper::{ZooKeeperOptions, ZooKeeperStore};

#[tokio::test]
async fn a_grant_whose_ttl_passed_during_a_suspend_is_not_renewed() {
    let shared = common::exclusive().await;
    let (clock, suspend) = HolderClock::manual();
    let options = ZooKeeperOptions::new(
        shared.server.connect_string(),
        shared.root.clone(),
        Duration::from_secs(4),
    );
    let store = ZooKeeperStore::with_clock(options, clock).expect("options");
    let ttl = Duration::from_secs(2);
    let req = AcquireRequest {
        name: "suspended".into(),
        owner: "a".into(),
        instance: "a-1".into(),
        ttl,
        ..AcquireRequest::default()
    };
    let AcquireOutcome::Granted(grant) = store.try_acquire(&req).await.expect("acquire") else {
        panic!("held")
    };
    let held = [HeldLease {
        name: "suspended".into(),
        token: grant.token,
    }];
    assert_eq!(
        store.renew("a", &held, ttl).await.expect("renew"),
        vec![Renewal::plain(true)]
    );
    suspend.suspend(ttl + Duration::from_millis(500));
    assert_eq!(
        store.renew("a", &held, ttl).await.expect("renew"),
        vec![Renewal::NotHeld],
        "the grant's ttl passed while the host slept: its holder gave it up"
    );
}
