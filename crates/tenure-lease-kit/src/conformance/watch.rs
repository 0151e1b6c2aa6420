//! The watch of holder changes ([`HolderWatch`](tenure_lease::HolderWatch)): a store runs this case
//! when its [`conformance_tests!`](crate::conformance_tests) lists `holder_watch`.

use std::time::Duration;

use super::{Harness, granted_token, holder_watch_of, request};
use tenure_lease::{AcquireRequest, WatchEvent};

/// A watch reports new grants and ended grants under its prefix, not renewals or reentrant
/// acquires, nor leases outside the prefix.
pub async fn holder_watch_pushes_grants_and_ends(h: &dyn Harness) {
    let store = h.client().await;
    let mut events = holder_watch_of(&*store).watch("w-").await.expect("watch");
    let ttl = Duration::from_secs(5);
    let t1 = granted_token(
        &store
            .try_acquire(&request("w-1", "a", ttl))
            .await
            .expect("acquire"),
    );
    granted_token(
        &store
            .try_acquire(&request("w-1", "a", ttl))
            .await
            .expect("reentrant"),
    );
    granted_token(
        &store
            .try_acquire(&request("other", "a", ttl))
            .await
            .expect("acquire"),
    );
    assert!(store.release("w-1", "a", t1).await.expect("release"));
    let next = AcquireRequest {
        instance: "a-2".into(),
        ..request("w-1", "a", ttl)
    };
    let t2 = granted_token(&store.try_acquire(&next).await.expect("acquire"));
    assert!(store.release("w-1", "a", t2).await.expect("release"));
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(events.recv().await.expect("event"));
    }
    let granted = |e: &WatchEvent| match e {
        WatchEvent::Granted(r) => Some((r.name.clone(), r.owner.clone(), r.token)),
        WatchEvent::Ended { .. } => None,
    };
    assert_eq!(granted(&seen[0]), Some(("w-1".into(), "a".into(), t1)));
    assert_eq!(seen[1], WatchEvent::Ended { name: "w-1".into() });
    assert_eq!(granted(&seen[2]), Some(("w-1".into(), "a".into(), t2)));
    assert_eq!(seen[3], WatchEvent::Ended { name: "w-1".into() });
}
