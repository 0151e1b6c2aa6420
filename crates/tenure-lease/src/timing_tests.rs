//! The LeaseActor's timing under tokio's paused clock: deterministic, no real sleeps.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::time::{Instant, advance, sleep};

use crate::{
    Acquired, Fault, FencingToken, Lease, LeaseActor, LeaseEvent, LeaseEventSink, LeaseMsg,
    LeaseObserver, LeaseSettings, LeaseSpec, LeaseStore, LeaseTrace, LostReason, MemoryStore,
    RenewalBatcher,
};

/// The timing of the paused-clock tests: ttl 10 s, renewals every second, margin 1 s.
pub(crate) fn settings() -> LeaseSettings {
    let mut s = LeaseSettings::with_timeout(Duration::from_secs(10));
    s.heartbeat_interval = Duration::from_secs(1);
    s.safety_margin = Duration::from_secs(1);
    s.lease_operation_timeout = Duration::from_millis(500);
    s.lease_retry_interval = Duration::from_secs(2);
    s
}

type Log = Arc<Mutex<Vec<(Instant, LeaseEvent)>>>;

fn recording_sink() -> (LeaseEventSink, Log) {
    let log: Log = Arc::default();
    let l = log.clone();
    (
        LeaseEventSink::new(move |e| l.lock().unwrap().push((Instant::now(), e))),
        log,
    )
}

async fn started(
    store: &MemoryStore,
    name: &str,
    owner: &str,
) -> (ActorRef<LeaseMsg>, crate::LeaseView, Log) {
    let (sink, log) = recording_sink();
    let spec = LeaseSpec::new(name, owner, Arc::new(store.clone()), settings()).unwrap();
    let (actor, view) = LeaseActor::start(spec, sink, None).await.unwrap();
    (actor, view, log)
}

async fn try_acquire(actor: &ActorRef<LeaseMsg>) -> Acquired {
    ractor::call!(actor, LeaseMsg::TryAcquire)
        .unwrap()
        .unwrap()
        .0
}

fn lost_events(log: &Log) -> Vec<(Instant, crate::LeaseLost)> {
    log.lock()
        .unwrap()
        .iter()
        .filter_map(|(t, e)| match e {
            LeaseEvent::Lost(l) => Some((*t, l.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn renewals_keep_the_lease_for_many_ttls() {
    let store = MemoryStore::new();
    let (actor, view, log) = started(&store, "a", "node-1").await;
    assert!(matches!(
        try_acquire(&actor).await,
        Acquired::Granted { token } if token == FencingToken::new(1)
    ));
    for _ in 0..100 {
        sleep(Duration::from_millis(500)).await;
        assert!(view.check_lease());
    }
    assert!(lost_events(&log).is_empty());
    assert_eq!(log.lock().unwrap().len(), 1, "only the grant was announced");
    // 50 s at one renewal per second.
    let calls = store.renew_calls();
    assert!((49..=51).contains(&calls), "renew calls {calls}");
}

async fn loss_when(fault: Fault) {
    let store = MemoryStore::new();
    let (actor, view, log) = started(&store, "a", "node-1").await;
    let sent = Instant::now();
    assert!(matches!(
        try_acquire(&actor).await,
        Acquired::Granted { .. }
    ));
    sleep(Duration::from_millis(2500)).await;
    store.set_fault(fault);
    let last_renewal_sent = sent + Duration::from_secs(2); // grid ticks at 1 s, 2 s
    let deadline = view.deadline().unwrap();
    sleep(Duration::from_secs(30)).await;
    let lost = lost_events(&log);
    assert_eq!(lost.len(), 1, "exactly one loss: {lost:?}");
    let (at, ev) = &lost[0];
    assert_eq!(ev.reason, LostReason::Expired);
    assert!(
        *at <= deadline,
        "lost at {at:?} after the deadline {deadline:?}"
    );
    assert!(
        *at < last_renewal_sent + settings().heartbeat_timeout,
        "lost after the store could have re-granted"
    );
    assert!(!view.check_lease());
}

#[tokio::test(start_paused = true)]
async fn failing_renewals_lose_the_lease_by_the_deadline() {
    loss_when(Fault::FailRenewals).await;
}

#[tokio::test(start_paused = true)]
async fn hanging_renewals_lose_the_lease_by_the_deadline() {
    loss_when(Fault::HangRenewals).await;
}

#[tokio::test(start_paused = true)]
async fn after_a_loss_the_actor_acquires_again_at_once_with_a_new_token() {
    let store = MemoryStore::new();
    let (actor, view, log) = started(&store, "a", "node-1").await;
    let granted_at = Instant::now();
    let Acquired::Granted { token: t1 } = try_acquire(&actor).await else {
        panic!()
    };
    // Renewals fail: the belief lapses at its deadline while the store keeps the grant
    // until its ttl.
    store.set_fault(Fault::FailRenewals);
    while view.check_lease() {
        sleep(Duration::from_millis(100)).await;
    }
    store.set_fault(Fault::None);
    assert_eq!(store.read("a").await.unwrap().map(|r| r.token), Some(t1));
    // The same actor is another instance now: its lapsed grant is released first, so it
    // is granted at once, with a new token that fences off whatever the lost grant did.
    let Acquired::Granted { token: t2 } = try_acquire(&actor).await else {
        panic!("not granted again")
    };
    assert!(t2 > t1);
    assert!(Instant::now() < granted_at + settings().heartbeat_timeout);
    assert_eq!(lost_events(&log).len(), 1);
    assert_eq!(try_acquire(&actor).await, Acquired::Granted { token: t2 });
}

#[tokio::test(start_paused = true)]
async fn store_saying_not_held_loses_at_once() {
    let store = MemoryStore::new();
    let (actor, view, log) = started(&store, "a", "node-1").await;
    let Acquired::Granted { token } = try_acquire(&actor).await else {
        panic!()
    };
    // Someone removes our grant behind our back (an operator, a store restore).
    assert!(store.release("a", "node-1", token).await.unwrap());
    let removed = Instant::now();
    sleep(Duration::from_secs(3)).await;
    let lost = lost_events(&log);
    assert_eq!(lost.len(), 1);
    assert_eq!(lost[0].1.reason, LostReason::NotHeld);
    assert!(
        lost[0].0 <= removed + Duration::from_millis(1100),
        "noticed at the next renewal"
    );
    assert!(!view.check_lease());
}

#[tokio::test(start_paused = true)]
async fn no_signal_before_acquire_completes_and_one_per_grant() {
    let store = MemoryStore::new();
    let lease =
        Lease::start(LeaseSpec::new("a", "node-1", Arc::new(store.clone()), settings()).unwrap())
            .await
            .unwrap();
    // The store answers just before the validity runs out (operation timeout is 0.5 s,
    // so use a wider one here).
    let mut s = settings();
    s.lease_operation_timeout = Duration::from_secs(20);
    let lease2 = Lease::start(LeaseSpec::new("b", "node-1", Arc::new(store.clone()), s).unwrap())
        .await
        .unwrap();
    store.set_fault(Fault::Delay(Duration::from_millis(8990)));
    let returned = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (r, c) = (returned.clone(), calls.clone());
    let got = lease2
        .acquire_with_lost(move |_| {
            assert!(
                r.load(std::sync::atomic::Ordering::SeqCst),
                "lost before acquire returned"
            );
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
        .await
        .unwrap();
    returned.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(matches!(got, Acquired::Granted { .. }));
    sleep(Duration::from_secs(60)).await;
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);

    // A hanging store: acquire is an error (unknown), and no lost signal ever comes.
    store.set_fault(Fault::Hang);
    let lost = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let l = lost.clone();
    let err = lease
        .acquire_with_lost(move |_| {
            l.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            crate::LeaseError::Timeout {
                operation: "acquire",
                ..
            }
        ),
        "{err}"
    );
    sleep(Duration::from_secs(60)).await;
    assert_eq!(lost.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert!(!lease.check_lease());

    // A new grant after a loss gets a higher token and its own single loss.
    store.set_fault(Fault::None);
    let Acquired::Granted { token: t1 } = lease.acquire().await.unwrap() else {
        panic!()
    };
    store.set_fault(Fault::FailRenewals);
    sleep(Duration::from_secs(20)).await;
    store.set_fault(Fault::None);
    let Acquired::Granted { token: t2 } = lease.acquire().await.unwrap() else {
        panic!()
    };
    assert!(t2 > t1);
}

#[tokio::test(start_paused = true)]
async fn reentrant_acquire_returns_the_same_token() {
    let store = MemoryStore::new();
    let (actor, _view, log) = started(&store, "a", "node-1").await;
    let first = try_acquire(&actor).await;
    sleep(Duration::from_secs(3)).await;
    assert_eq!(try_acquire(&actor).await, first);
    assert_eq!(log.lock().unwrap().len(), 1, "one grant announced");
}

#[tokio::test(start_paused = true)]
async fn release_frees_without_a_loss_signal() {
    let store = MemoryStore::new();
    let (actor, view, log) = started(&store, "a", "node-1").await;
    try_acquire(&actor).await;
    let released = ractor::call!(actor, LeaseMsg::Release).unwrap().unwrap();
    assert!(released);
    assert!(!view.check_lease());
    assert!(store.read("a").await.unwrap().is_none());
    sleep(Duration::from_secs(30)).await;
    assert!(lost_events(&log).is_empty());
    assert!(
        !ractor::call!(actor, LeaseMsg::Release).unwrap().unwrap(),
        "nothing held"
    );
}

#[tokio::test(start_paused = true)]
async fn keeps_trying_until_granted() {
    let store = MemoryStore::new();
    let (holder, _, _) = started(&store, "a", "node-1").await;
    try_acquire(&holder).await;
    let (waiter, view, log) = started(&store, "a", "node-2").await;
    waiter.cast(LeaseMsg::Acquire { reply: None }).unwrap();
    sleep(Duration::from_secs(5)).await;
    assert!(!view.check_lease());
    let freed = Instant::now();
    ractor::call!(holder, LeaseMsg::Release).unwrap().unwrap();
    sleep(Duration::from_secs(3)).await;
    assert!(view.check_lease());
    let events = log.lock().unwrap().clone();
    assert!(
        matches!(&events[..], [(at, LeaseEvent::Granted(g))] if g.token == FencingToken::new(2) && *at <= freed + settings().lease_retry_interval)
    );
}

#[tokio::test(start_paused = true)]
async fn a_crashed_holders_grant_is_taken_when_it_expires_not_a_retry_interval_later() {
    let store = MemoryStore::new();
    let s = settings();
    // A holder that never renews (it crashed right after its grant).
    let crashed = crate::AcquireRequest {
        name: "a".into(),
        owner: "node-1".into(),
        instance: "crashed".into(),
        ttl: s.heartbeat_timeout,
        ..Default::default()
    };
    store.try_acquire(&crashed).await.unwrap();
    let expiry = Instant::now() + s.heartbeat_timeout;
    // Out of step with the expiry: tries at 1, 3, ... 9 s, and (by the retry interval
    // alone) 11 s.
    sleep(Duration::from_secs(1)).await;
    let (waiter, view, log) = started(&store, "a", "node-2").await;
    waiter.cast(LeaseMsg::Acquire { reply: None }).unwrap();
    sleep(s.heartbeat_timeout + s.lease_retry_interval).await;
    assert!(view.check_lease());
    let events = log.lock().unwrap().clone();
    assert!(
        matches!(&events[..], [(at, LeaseEvent::Granted(g))]
            if g.token.get() == 2 && *at >= expiry && *at < expiry + s.lease_retry_interval / 4),
        "granted just after the expiry at {expiry:?}: {events:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_retry_pace_replaces_the_retry_interval_while_trying() {
    let store = MemoryStore::new();
    let (holder, _, _) = started(&store, "a", "node-1").await;
    try_acquire(&holder).await;
    let (waiter, view, log) = started(&store, "a", "node-2").await;
    waiter.cast(LeaseMsg::Acquire { reply: None }).unwrap();
    sleep(Duration::from_millis(100)).await;
    let pace = Duration::from_millis(200);
    waiter.cast(LeaseMsg::RetryPace(Some(pace))).unwrap();
    sleep(Duration::from_millis(50)).await;
    let freed = Instant::now();
    ractor::call!(holder, LeaseMsg::Release).unwrap().unwrap();
    sleep(pace + Duration::from_millis(10)).await;
    assert!(
        view.check_lease(),
        "granted at the new pace, long before the 2 s retry interval"
    );
    let events = log.lock().unwrap().clone();
    assert!(matches!(&events[..], [(at, LeaseEvent::Granted(_))] if *at <= freed + pace));
}

/// A supervisor that is killed: its LeaseActor is killed with it (no post_stop), and the
/// lease must still be released.
struct Supervisor;
impl Actor for Supervisor {
    type Msg = ();
    type State = ();
    type Arguments = ();
    async fn pre_start(&self, _: ActorRef<()>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn killed_supervisor_releases_the_lease() {
    let store = MemoryStore::new();
    let (sup, handle) = Actor::spawn(None, Supervisor, ()).await.unwrap();
    let spec = LeaseSpec::new("a", "node-1", Arc::new(store.clone()), settings()).unwrap();
    let (actor, _view) = LeaseActor::start(spec, LeaseEventSink::ignore(), Some(sup.get_cell()))
        .await
        .unwrap();
    try_acquire(&actor).await;
    assert!(store.read("a").await.unwrap().is_some());
    sup.kill();
    handle.await.unwrap();
    sleep(Duration::from_millis(100)).await;
    assert!(
        store.read("a").await.unwrap().is_none(),
        "released although post_stop was skipped"
    );
}

#[tokio::test(start_paused = true)]
async fn one_store_round_trip_per_interval_for_many_leases() {
    let store = MemoryStore::new();
    let shared: Arc<dyn LeaseStore> = Arc::new(store.clone());
    let batcher = RenewalBatcher::new(shared.clone(), "node-1".into(), settings());
    let mut actors = Vec::new();
    for i in 0..300 {
        let spec = LeaseSpec::with_batcher(
            &format!("l{i}"),
            "node-1",
            shared.clone(),
            settings(),
            batcher.clone(),
        )
        .unwrap();
        let (actor, view) = LeaseActor::start(spec, LeaseEventSink::ignore(), None)
            .await
            .unwrap();
        try_acquire(&actor).await;
        actors.push((actor, view));
        advance(Duration::from_millis(7)).await;
    }
    sleep(Duration::from_secs(2)).await;
    let before = store.renew_calls();
    sleep(Duration::from_secs(10)).await;
    assert_eq!(store.renew_calls() - before, 10);
    assert!(actors.iter().all(|(_, v)| v.check_lease()));
}

/// Waits (in the background) until `actor` is granted through `LeaseMsg::Acquire`.
fn acquire_in_background(
    actor: &ActorRef<LeaseMsg>,
) -> tokio::task::JoinHandle<(Instant, Acquired)> {
    let actor = actor.clone();
    tokio::spawn(async move {
        let reply = ractor::call!(actor, |r| LeaseMsg::Acquire { reply: Some(r) });
        (Instant::now(), reply.unwrap().unwrap().0)
    })
}

#[tokio::test(start_paused = true)]
async fn another_instance_of_the_same_owner_waits_for_the_release() {
    let store = MemoryStore::new();
    let (old, old_view, old_log) = started(&store, "a", "node-1").await;
    let Acquired::Granted { token: t1 } = try_acquire(&old).await else {
        panic!()
    };
    // A second actor of the same owner (a second process started with the same owner, a
    // node restarted on the same address while its predecessor is frozen) is another
    // holder: refused while the grant lives, however often it asks.
    let (new, new_view, _) = started(&store, "a", "node-1").await;
    assert_eq!(
        try_acquire(&new).await,
        Acquired::NotGranted {
            holder: Some("node-1".into()),
            priority: 0
        }
    );
    let waiting = acquire_in_background(&new);
    sleep(Duration::from_secs(30)).await;
    assert!(old_view.check_lease() && !new_view.check_lease());
    assert!(!waiting.is_finished());
    assert!(ractor::call!(old, LeaseMsg::Release).unwrap().unwrap());
    let (_, granted) = waiting.await.unwrap();
    let Acquired::Granted { token: t2 } = granted else {
        panic!("{granted:?}")
    };
    assert!(t2 > t1);
    // The old actor's late release (as from a killed actor's Drop) does not free it.
    assert!(!ractor::call!(old, LeaseMsg::Release).unwrap().unwrap());
    assert_eq!(store.read("a").await.unwrap().map(|r| r.token), Some(t2));
    assert!(new_view.check_lease());
    assert!(lost_events(&old_log).is_empty(), "released, not lost");
}

#[tokio::test(start_paused = true)]
async fn another_instance_of_the_same_owner_waits_for_the_expiry() {
    let store = MemoryStore::new();
    // A holder instance that stops renewing (frozen, cut off, killed) right after its grant.
    let ttl = settings().heartbeat_timeout;
    let sent = Instant::now();
    let frozen = crate::AcquireRequest {
        name: "a".into(),
        owner: "node-1".into(),
        instance: "predecessor".into(),
        ttl,
        ..Default::default()
    };
    let crate::AcquireOutcome::Granted(first) = store.try_acquire(&frozen).await.unwrap() else {
        panic!()
    };
    let (new, new_view, _) = started(&store, "a", "node-1").await;
    let (granted_at, granted) = acquire_in_background(&new).await.unwrap();
    let Acquired::Granted { token } = granted else {
        panic!("{granted:?}")
    };
    assert!(token > first.token);
    assert!(
        granted_at >= sent + ttl,
        "granted {:?} after the predecessor's grant, ttl {ttl:?}",
        granted_at - sent
    );
    assert!(new_view.check_lease());
}

#[tokio::test(start_paused = true)]
async fn a_grant_replaced_behind_our_back_is_announced_lost_first() {
    let store = MemoryStore::new();
    let (actor, _view, log) = started(&store, "a", "node-1").await;
    let Acquired::Granted { token: t1 } = try_acquire(&actor).await else {
        panic!()
    };
    // An operator releases it, then the actor is asked to acquire again before its next
    // renewal noticed: the old grant is announced lost before the new one is announced.
    assert!(store.release("a", "node-1", t1).await.unwrap());
    let Acquired::Granted { token: t2 } = try_acquire(&actor).await else {
        panic!()
    };
    assert!(t2 > t1);
    let events: Vec<LeaseEvent> = log.lock().unwrap().iter().map(|(_, e)| e.clone()).collect();
    assert!(
        matches!(&events[..], [LeaseEvent::Granted(a), LeaseEvent::Lost(l), LeaseEvent::Granted(b)]
            if a.token == t1 && l.token == t1 && l.reason == LostReason::NotHeld && b.token == t2),
        "{events:?}"
    );
    // The new grant is this instance's: acquiring again re-enters it (same token, nothing
    // announced), also after the renewals run.
    for _ in 0..3 {
        assert_eq!(try_acquire(&actor).await, Acquired::Granted { token: t2 });
        sleep(Duration::from_secs(2)).await;
    }
    assert_eq!(log.lock().unwrap().len(), 3, "no new grant announced");
}

/// With a stop budget, the loss is announced (and `check_lease` turns false) the budget
/// before the local deadline, which itself does not move: the traces' `valid_until` stays
/// `send instant + ttl - margin`.
#[tokio::test(start_paused = true)]
async fn a_stop_budget_announces_the_loss_that_much_before_the_deadline() {
    let store = MemoryStore::new();
    let (sink, log) = recording_sink();
    let traces: Arc<Mutex<Vec<LeaseTrace>>> = Arc::default();
    let t = traces.clone();
    let budget = Duration::from_secs(3);
    let spec = LeaseSpec::new("a", "node-1", Arc::new(store.clone()), settings())
        .unwrap()
        .with_stop_budget(budget)
        .with_observer(LeaseObserver::new(move |_, _, trace| {
            t.lock().unwrap().push(trace.clone())
        }));
    let (actor, view, _) = LeaseActor::start(spec, sink, None)
        .await
        .map(|(a, v)| (a, v, ()))
        .unwrap();
    let sent = Instant::now();
    assert!(matches!(
        try_acquire(&actor).await,
        Acquired::Granted { .. }
    ));
    // ttl 10 s, margin 1 s: the local deadline is 9 s after the send instant. (Up to the
    // host's suspend time, which the holder clock reads anew at each use: two reads of it
    // may differ by the real nanoseconds between them, while tokio's clock is paused.)
    let deadline = view.deadline().unwrap();
    let expected = sent + Duration::from_secs(9);
    let apart = deadline.max(expected) - deadline.min(expected);
    assert!(
        apart < Duration::from_millis(1),
        "the deadline is 9 s after the send instant: {deadline:?} against {expected:?}"
    );
    let granted_until = traces.lock().unwrap().iter().find_map(|tr| match tr {
        LeaseTrace::Granted { valid_until, .. } => Some(*valid_until),
        _ => None,
    });
    // (boottime_ns maps the paused clock to the real one: equal up to the real time
    // between the two reads, far below the 3 s budget. The view's deadline is a tokio
    // instant: the holder clock's minus the host's suspends.)
    let holder = crate::clock::HolderClock::host();
    let off = granted_until.unwrap() - holder.boottime_ns(deadline + holder.suspended());
    assert!(
        off.abs() < 500_000_000,
        "histories record the true local deadline, off by {off} ns"
    );
    store.set_fault(Fault::FailRenewals);
    sleep(Duration::from_millis(5990)).await;
    assert!(view.check_lease(), "believed until the budget begins");
    assert!(lost_events(&log).is_empty());
    sleep(Duration::from_millis(20)).await;
    assert!(
        !view.check_lease(),
        "no longer believed once the budget began"
    );
    let lost = lost_events(&log);
    assert_eq!(lost.len(), 1, "{lost:?}");
    let (at, ev) = &lost[0];
    assert_eq!(ev.reason, LostReason::Expired);
    assert!(
        *at <= deadline - budget,
        "announced at {at:?}, deadline {deadline:?}"
    );
    assert!(*at >= deadline - budget - Duration::from_millis(5));
    // A renewal answered within the budget does not revive it.
    store.set_fault(Fault::None);
    sleep(Duration::from_secs(5)).await;
    assert!(!view.check_lease());
    assert_eq!(lost_events(&log).len(), 1);
}
