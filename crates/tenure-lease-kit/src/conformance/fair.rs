//! Fair acquire ([`FairQueue::acquire_fair`](tenure_lease::FairQueue::acquire_fair)): first come, first served. A waiter that gives up (its `wait` passed),
//! is cancelled (its future dropped) or whose process died leaves the line, so that it
//! never blocks the waiters behind it for longer than its own ttl.
//!
//! A store runs these cases when its [`conformance_tests!`](crate::conformance_tests) lists
//! `fair_queue`; its harness then counts the waiters' entries ([`Harness::fair_waiters`]),
//! and the cases check order and outcomes (never how fast something happened). Real time,
//! ttls of 2 s.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep};

use super::{Harness, fair_queue_of, granted_token, lease_on, request, test_settings};
use tenure_lease::{AcquireOutcome, AcquireRequest, Acquired, FencingToken, Lease, LeaseStore};

/// The ttl of every grant and waiter here (within a ZooKeeper test server's session bound).
const TTL: Duration = Duration::from_secs(2);

/// A `wait` that does not pass in a passing test: reaching it fails the case (the waiter
/// answers `Held` or an error, never the grant the case expects).
const LONG_WAIT: Duration = Duration::from_secs(60);

/// How long to poll the harness for a number of waiters before failing: a bound on a
/// waiter that never joins or never leaves, not a claim about speed.
const PATIENCE: Duration = Duration::from_secs(30);

fn fair(name: &str, owner: &str) -> AcquireRequest {
    request(name, owner, TTL)
}

/// Polls until `n` waiters of `name` are in line (bounded by [`PATIENCE`]).
async fn until_waiters(h: &dyn Harness, name: &str, n: usize) {
    let started = Instant::now();
    loop {
        let queued = h.fair_waiters(name).await.unwrap_or_else(|| {
            panic!(
                "the store keeps a fair queue: its harness must count waiters (Harness::fair_waiters)"
            )
        });
        if queued == n {
            return;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "{name}: {queued} waiters in line, never {n}"
        );
        sleep(Duration::from_millis(10)).await;
    }
}

/// A holder of `name` for as long as a case needs: a [`Lease`] of owner `holder` on its
/// own client (its actor renews the grant), that client, and the grant's token.
async fn hold(h: &dyn Harness, name: &str) -> (Lease, Arc<dyn LeaseStore>, FencingToken) {
    let store = h.client().await;
    let lease = lease_on(store.clone(), name, "holder").await;
    match lease.acquire().await.expect("acquire") {
        Acquired::Granted { token } => (lease, store, token),
        other => panic!("{name}: the free lease was not granted: {other:?}"),
    }
}

/// The holder of `name` now, as a third client reads it.
async fn holder_of(h: &dyn Harness, name: &str) -> Option<String> {
    let store = h.client().await;
    store.read(name).await.expect("read").map(|r| r.owner)
}

/// Runs `work` until `death` fires, then forgets it: never polled again and never dropped,
/// like a future of a process that died (none of its clean-up runs). `None`: it died first.
async fn until_death<F: Future>(work: F, death: oneshot::Receiver<()>) -> Option<F::Output> {
    let mut work = Box::pin(work);
    let mut death = death;
    let out = std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = work.as_mut().poll(cx) {
            return Poll::Ready(Some(v));
        }
        match Pin::new(&mut death).poll(cx) {
            Poll::Ready(_) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    })
    .await;
    if out.is_none() {
        std::mem::forget(work);
    }
    out
}

/// Four waiters, each on its own client, queue one after the other behind a holder: once
/// it releases, they are granted in the order they queued, each with a token above the one
/// before; while they wait, the holder is the holder for every client. No waiter is left.
pub async fn fair_waiters_served_in_arrival_order(h: &dyn Harness) {
    const NAME: &str = "fair-fifo";
    let (holder, _, first) = hold(h, NAME).await;
    let owners = ["w1", "w2", "w3", "w4"];
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for (i, owner) in owners.into_iter().enumerate() {
        let store = h.client().await;
        let tx = tx.clone();
        waiters.push(tokio::spawn(async move {
            let got = fair_queue_of(&*store)
                .acquire_fair(&fair(NAME, owner), LONG_WAIT)
                .await
                .expect("fair acquire");
            let token = granted_token(&got);
            tx.send((owner, token)).expect("report the grant");
            // Hold a moment, so that a grant out of order would show, then release.
            sleep(Duration::from_millis(50)).await;
            assert!(
                store.release(NAME, owner, token).await.expect("release"),
                "{owner} could not release its grant"
            );
        }));
        until_waiters(h, NAME, i + 1).await;
    }
    drop(tx);
    assert_eq!(holder_of(h, NAME).await.as_deref(), Some("holder"));
    assert!(holder.release().await.expect("release"));
    let mut order = Vec::new();
    let mut last = first;
    while let Some((owner, token)) = rx.recv().await {
        assert!(token > last, "{owner} granted token {token} after {last}");
        last = token;
        order.push(owner);
    }
    for waiter in waiters {
        waiter.await.expect("waiter");
    }
    assert_eq!(order, owners, "granted out of arrival order");
    until_waiters(h, NAME, 0).await;
}

/// A waiter whose `wait` passes while another owner holds the lease is answered `Held`
/// with that holder and leaves the line: the next waiter is granted the lease when the
/// holder releases. The holder's own fair acquire re-enters with its token.
pub async fn fair_wait_timeout_answers_held(h: &dyn Harness) {
    const NAME: &str = "fair-timeout";
    let (holder, holder_store, token) = hold(h, NAME).await;
    let impatient = h.client().await;
    match fair_queue_of(&*impatient)
        .acquire_fair(&fair(NAME, "impatient"), Duration::from_millis(300))
        .await
        .expect("fair acquire")
    {
        AcquireOutcome::Held(r) => assert_eq!((r.owner.as_str(), r.token), ("holder", token)),
        AcquireOutcome::Granted(r) => panic!("granted while the holder holds it: {r:?}"),
    }
    until_waiters(h, NAME, 0).await;
    // The holder's instance, on its client and with its ttl, as its actor acquired.
    let instance = holder_store
        .read(NAME)
        .await
        .expect("read")
        .expect("held")
        .instance;
    let again = AcquireRequest {
        instance,
        ..request(NAME, "holder", test_settings().heartbeat_timeout)
    };
    assert_eq!(
        granted_token(
            &fair_queue_of(&*holder_store)
                .acquire_fair(&again, Duration::from_millis(300))
                .await
                .expect("reentrant fair acquire")
        ),
        token,
        "the holder's fair acquire re-enters with its token"
    );
    until_waiters(h, NAME, 0).await;
    let later = h.client().await;
    let next = tokio::spawn(async move {
        fair_queue_of(&*later)
            .acquire_fair(&fair(NAME, "later"), LONG_WAIT)
            .await
    });
    until_waiters(h, NAME, 1).await;
    assert!(holder.release().await.expect("release"));
    let got = next.await.expect("waiter").expect("fair acquire");
    assert!(granted_token(&got) > token);
    assert_eq!(holder_of(h, NAME).await.as_deref(), Some("later"));
    until_waiters(h, NAME, 0).await;
}

/// A waiter whose future is dropped (the task aborted) leaves the line: it never takes the
/// lease, and the waiter that came after it is granted the lease when the holder releases.
pub async fn fair_cancelled_waiter_leaves_the_line(h: &dyn Harness) {
    const NAME: &str = "fair-cancel";
    let (holder, _, token) = hold(h, NAME).await;
    let cancelled_store = h.client().await;
    let cancelled = tokio::spawn(async move {
        fair_queue_of(&*cancelled_store)
            .acquire_fair(&fair(NAME, "cancelled"), LONG_WAIT)
            .await
    });
    until_waiters(h, NAME, 1).await;
    cancelled.abort();
    assert!(
        cancelled.await.expect_err("aborted").is_cancelled(),
        "the waiter was answered before it was cancelled"
    );
    until_waiters(h, NAME, 0).await;
    let next_store = h.client().await;
    let next = tokio::spawn(async move {
        fair_queue_of(&*next_store)
            .acquire_fair(&fair(NAME, "next"), LONG_WAIT)
            .await
    });
    until_waiters(h, NAME, 1).await;
    assert!(holder.release().await.expect("release"));
    let got = next.await.expect("waiter").expect("fair acquire");
    assert!(granted_token(&got) > token);
    assert_eq!(holder_of(h, NAME).await.as_deref(), Some("next"));
    until_waiters(h, NAME, 0).await;
}

/// A waiter whose process dies while queued (its future is never polled nor dropped again,
/// and its sessions end as the server ends a dead process's sessions,
/// [`Harness::expire_sessions`]) does not block the line for good: the waiter behind it
/// is granted the lease once the holder releases (at the latest when the dead waiter's own
/// ttl has passed).
pub async fn fair_dead_waiter_does_not_block_the_line(h: &dyn Harness) {
    const NAME: &str = "fair-dead";
    let (holder, _, token) = hold(h, NAME).await;
    let dead_store = h.client().await;
    let (kill, death) = oneshot::channel();
    let dead = tokio::spawn(until_death(
        async move {
            fair_queue_of(&*dead_store)
                .acquire_fair(&fair(NAME, "dead"), LONG_WAIT)
                .await
        },
        death,
    ));
    until_waiters(h, NAME, 1).await;
    let live_store = h.client().await;
    let live = tokio::spawn(async move {
        fair_queue_of(&*live_store)
            .acquire_fair(&fair(NAME, "live"), LONG_WAIT)
            .await
    });
    until_waiters(h, NAME, 2).await;
    kill.send(()).expect("the dying task waits");
    if let Some(answer) = dead.await.expect("dying task") {
        panic!("the dead waiter was answered before it died: {answer:?}");
    }
    h.expire_sessions("dead").await;
    assert!(holder.release().await.expect("release"));
    let got = live.await.expect("waiter").expect("fair acquire");
    assert!(granted_token(&got) > token);
    assert_eq!(holder_of(h, NAME).await.as_deref(), Some("live"));
}
