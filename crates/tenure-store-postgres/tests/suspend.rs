//! A suspend of the contender's host counts in `observed-expiry` (the holder clock,
//! `CLOCK_BOOTTIME`): the holder's deadline went on while the contender's host slept.

mod support;
use support::PgOptions;

use std::time::Duration;

use tenure_lease::{AcquireOutcome, AcquireRequest, HolderClock, LeaseStore};
use tenure_lease_kit::conformance::owner_request;
use tenure_store_postgres::PostgresStore;
use tenure_test_kit::postgres::Exclusive;

fn request(owner: &str, ttl: Duration) -> AcquireRequest {
    owner_request("observed", owner, ttl)
}

#[tokio::test]
async fn observed_expiry_counts_a_suspend_of_the_contenders_host() {
    let exclusive = Exclusive::start().await;
    let ttl = Duration::from_secs(1);
    let mut options = exclusive.server.options(Duration::from_secs(5));
    options.observed_expiry = true;
    let holder = PostgresStore::connect(options.clone())
        .await
        .expect("connect");
    let (clock, suspend) = HolderClock::manual();
    let contender = PostgresStore::connect_with_clock(options, clock)
        .await
        .expect("connect");
    let granted = holder
        .try_acquire(&request("a", ttl))
        .await
        .expect("acquire");
    assert!(matches!(granted, AcquireOutcome::Granted(_)), "{granted:?}");
    // Expired on the server's clock, not renewed: the contender starts watching it.
    tokio::time::sleep(ttl + Duration::from_millis(500)).await;
    let b = request("b", ttl);
    let first = contender.try_acquire(&b).await.expect("acquire");
    assert!(matches!(first, AcquireOutcome::Held(_)), "{first:?}");
    // The contender's host sleeps for a ttl: the row stayed unchanged for that long.
    suspend.suspend(ttl);
    let after = contender.try_acquire(&b).await.expect("acquire");
    assert!(
        matches!(after, AcquireOutcome::Granted(_)),
        "observed unchanged for a ttl across the suspend: {after:?}"
    );
}
