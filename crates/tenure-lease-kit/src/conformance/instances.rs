//! Holder instances: another instance of the holder's owner is another holder.

use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::{Harness, granted_token, lease_on, poll_until_granted_as, request, test_settings};
use tenure_lease::{AcquireOutcome, AcquireRequest, Acquired};

fn instance(name: &str, owner: &str, instance: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest {
        instance: instance.into(),
        ..request(name, owner, ttl)
    }
}

/// While a grant is unexpired, another instance of its owner (a second process started
/// with the same owner, a node restarted on the same address while its predecessor is
/// frozen or cut off, a second handle in one process) is refused like another owner, through
/// the same client and through another; only the holder instance re-enters, with its token.
/// The other instance is granted once the holder releases, or once its grant expires.
pub async fn same_owner_other_instance_waits(h: &dyn Harness) {
    let store = h.client().await;
    let other_process = h.client().await;
    let ttl = Duration::from_millis(1500);
    let first = instance("same-owner", "a", "first", ttl);
    let second = instance("same-owner", "a", "second", ttl);
    let t1 = granted_token(&store.try_acquire(&first).await.expect("acquire"));
    for (client, through) in [
        (&store, "the same client"),
        (&other_process, "another client"),
    ] {
        match client.try_acquire(&second).await.expect("acquire") {
            AcquireOutcome::Held(r) => assert_eq!(
                (r.owner.as_str(), r.instance.as_str(), r.token),
                ("a", "first", t1),
                "through {through}"
            ),
            AcquireOutcome::Granted(r) => panic!(
                "another instance of the holder's owner was granted through {through} (token {} after {t1})",
                r.token
            ),
        }
    }
    assert_eq!(
        granted_token(&store.try_acquire(&first).await.expect("acquire")),
        t1,
        "the holder instance re-enters with its token"
    );
    assert!(store.release("same-owner", "a", t1).await.expect("release"));
    let sent = Instant::now();
    let t2 = granted_token(&other_process.try_acquire(&second).await.expect("acquire"));
    assert!(t2 > t1);
    // Now the first instance waits in turn, until the second's grant (never renewed) expires.
    let (granted_at, t3) = poll_until_granted_as(&*store, &first).await;
    assert!(t3 > t2);
    assert!(
        granted_at >= sent + ttl,
        "the first instance was granted {:?} after the second's grant, ttl {ttl:?}",
        granted_at - sent
    );

    // The same through the Lease API: one LeaseActor is one instance, on one client or two.
    let one = lease_on(store.clone(), "same-owner-api", "a").await;
    let two = lease_on(store.clone(), "same-owner-api", "a").await;
    let three = lease_on(other_process.clone(), "same-owner-api", "a").await;
    let Acquired::Granted { token } = one.acquire().await.expect("acquire") else {
        panic!("the free lease was not granted")
    };
    let refused = Acquired::NotGranted {
        holder: Some("a".into()),
        priority: 0,
    };
    // Across several renewals of the holder.
    for _ in 0..3 {
        assert_eq!(two.acquire().await.expect("acquire"), refused);
        assert_eq!(three.acquire().await.expect("acquire"), refused);
        sleep(test_settings().heartbeat_interval * 2).await;
    }
    assert!(one.check_lease() && !two.check_lease() && !three.check_lease());
    assert_eq!(
        one.acquire().await.expect("acquire"),
        Acquired::Granted { token }
    );
    assert!(one.release().await.expect("release"));
    let Acquired::Granted { token: next } = three.acquire().await.expect("acquire") else {
        panic!("not granted after the holder released")
    };
    assert!(next > token);
    assert_eq!(two.acquire().await.expect("acquire"), refused);
    assert!(three.release().await.expect("release"));
}
