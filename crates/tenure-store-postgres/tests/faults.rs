//! Real faults and PostgreSQL specifics against a real server: the server stopped or
//! crashed under a holder, restarts, LIKE wildcards in prefixes, byte-order listing,
//! concurrent first starts, notes, and writes guarded in the caller's transaction.

mod support;
use support::PgOptions;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure_lease::{
    AcquireOutcome, AcquireRequest, Acquired, EMERGENCY_PRIORITY, FencingToken, HeldLease, Lease,
    LeaseSpec, LeaseStore, LostReason, PreemptAnswer, PreemptionRequest, PreemptionRequests,
    Renewal,
};
use tenure_lease_kit::conformance::{owner_request, test_settings};
use tenure_store_postgres::{FenceError, PostgresOptions, PostgresStore};
use tenure_test_kit::postgres::{Exclusive, PgServer};
use tokio::time::{Instant, sleep};

async fn start() -> Exclusive {
    Exclusive::start().await
}

async fn blocking(server: &Arc<PgServer>, f: impl FnOnce(&PgServer) + Send + 'static) {
    let s = server.clone();
    tokio::task::spawn_blocking(move || f(&s))
        .await
        .expect("server control");
}

async fn store(server: &PgServer) -> PostgresStore {
    PostgresStore::connect(server.options(test_settings().lease_operation_timeout))
        .await
        .expect("connect")
}

async fn grant(store: &PostgresStore, req: &AcquireRequest) -> FencingToken {
    match store.try_acquire(req).await.expect("acquire") {
        AcquireOutcome::Granted(r) => r.token,
        AcquireOutcome::Held(r) => panic!("{}: held by {}", req.name, r.owner),
    }
}

/// The server stopped under a holder: store calls answer errors (bounded by the operation
/// timeout, never "not granted"), and the holder announces the loss before the store could
/// expire its grant. After the restart the tokens go on increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_server_gives_errors_and_the_holder_signals_loss() {
    let exclusive = start().await;
    let server = exclusive.server.clone();
    let settings = test_settings();
    let holder_store: Arc<dyn LeaseStore> = Arc::new(store(&server).await);
    let lease = Lease::start(LeaseSpec::new("stopped", "a", holder_store, settings).expect("spec"))
        .await
        .expect("lease actor");
    let lost: Arc<Mutex<Vec<(Instant, LostReason)>>> = Arc::default();
    let l = lost.clone();
    let Acquired::Granted { token } = lease
        .acquire_with_lost(move |ev| l.lock().unwrap().push((Instant::now(), ev.reason)))
        .await
        .expect("acquire")
    else {
        panic!("not granted")
    };
    let other = store(&server).await;
    blocking(&server, |s| s.stop(true)).await;
    // No renewal can succeed from here on: this is the holder's last deadline.
    let deadline = lease.deadline();

    let bound = settings.lease_operation_timeout * 10;
    for outcome in [
        tokio::time::timeout(
            bound,
            other.try_acquire(&owner_request("stopped", "b", settings.heartbeat_timeout)),
        )
        .await
        .map(|r| r.map(drop)),
        tokio::time::timeout(bound, other.release("stopped", "a", token))
            .await
            .map(|r| r.map(drop)),
        tokio::time::timeout(bound, other.read("stopped"))
            .await
            .map(|r| r.map(drop)),
        tokio::time::timeout(
            bound,
            other.renew(
                "a",
                &[HeldLease {
                    name: "stopped".into(),
                    token,
                }],
                settings.heartbeat_timeout,
            ),
        )
        .await
        .map(|r| r.map(drop)),
    ] {
        let answered = outcome.expect("the store answers (an error) instead of hanging");
        assert!(
            answered.is_err(),
            "a stopped server gives errors: {answered:?}"
        );
    }
    let acquire = lease.acquire().await;
    assert!(
        acquire.as_ref().is_err()
            || acquire
                .as_ref()
                .is_ok_and(|a| *a == Acquired::Granted { token }),
        "the holder's own acquire during the outage: {acquire:?}"
    );

    let waited = Instant::now();
    while lost.lock().unwrap().is_empty() {
        assert!(
            waited.elapsed() < settings.heartbeat_timeout * 10,
            "no loss signalled"
        );
        sleep(Duration::from_millis(20)).await;
    }
    let (lost_at, reason) = lost.lock().unwrap()[0];
    assert_eq!(reason, LostReason::Expired);
    assert!(!lease.check_lease());
    if let Some(deadline) = deadline {
        // The store keeps the grant at least `margin` past the holder's deadline.
        assert!(
            lost_at < deadline + settings.safety_margin,
            "loss signalled {:?} after the local deadline",
            lost_at.saturating_duration_since(deadline)
        );
    }

    blocking(&server, |s| s.start_again()).await;
    // The old pool finds its connections closed and opens new ones.
    let (granted_at, later) = loop {
        match other
            .try_acquire(&owner_request("stopped", "b", settings.heartbeat_timeout))
            .await
        {
            Ok(AcquireOutcome::Granted(r)) => break (Instant::now(), r.token),
            Ok(AcquireOutcome::Held(_)) | Err(_) => sleep(Duration::from_millis(20)).await,
        }
    };
    assert!(later > token, "token {later} after {token}");
    assert!(lost_at <= granted_at);
    assert_eq!(lost.lock().unwrap().len(), 1, "one loss signal");
}

/// Crashes (immediate shutdown, crash recovery) and clean restarts: tokens of a name keep
/// increasing, and a grant from before the crash is still what the table says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_across_crashes_and_restarts() {
    let exclusive = start().await;
    let server = exclusive.server.clone();
    let mut last = FencingToken::new(0);
    for (round, fast) in [false, true, false].into_iter().enumerate() {
        let s = store(&server).await;
        let long = grant(&s, &owner_request("kept", "a", Duration::from_secs(60))).await;
        let t = grant(
            &s,
            &owner_request("crash", &format!("owner-{round}"), Duration::from_secs(60)),
        )
        .await;
        assert!(t > last, "round {round}: token {t} after {last}");
        assert!(
            s.release("crash", &format!("owner-{round}"), t)
                .await
                .expect("release")
        );
        last = t;
        blocking(&server, move |srv| {
            srv.stop(fast);
            srv.start_again();
        })
        .await;
        let s = store(&server).await;
        let rec = s
            .read("kept")
            .await
            .expect("read")
            .expect("survives the restart");
        assert_eq!((rec.owner.as_str(), rec.token), ("a", long));
        assert!(s.release("kept", "a", long).await.expect("release"));
    }
    let s = store(&server).await;
    let t = grant(&s, &owner_request("crash", "z", Duration::from_secs(5))).await;
    assert!(t > last, "after the last restart: token {t} after {last}");
}

/// `list` treats `%`, `_` and `\` in a prefix literally and sorts by bytes, as Rust does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_prefix_is_literal_and_sorted_bytewise() {
    let exclusive = start().await;
    let server = exclusive.server.clone();
    let s = store(&server).await;
    let ttl = Duration::from_secs(30);
    for name in ["p_x", "p%x", "pax", "p\\x", "q-B", "q-a", "q-Z", "q-é"] {
        grant(&s, &owner_request(name, "a", ttl)).await;
    }
    let names =
        |v: Vec<tenure_lease::LeaseRecord>| v.into_iter().map(|r| r.name).collect::<Vec<_>>();
    assert_eq!(names(s.list("p_").await.unwrap()), ["p_x"]);
    assert_eq!(names(s.list("p%").await.unwrap()), ["p%x"]);
    assert_eq!(names(s.list("p\\").await.unwrap()), ["p\\x"]);
    let mut q = vec!["q-B", "q-a", "q-Z", "q-é"];
    q.sort();
    assert_eq!(names(s.list("q-").await.unwrap()), q);
    assert_eq!(s.list("").await.unwrap().len(), 8);
}

/// The note is kept (and kept by a reentrant acquire without one), versions count writes,
/// and `expires_in` is the server's view of the ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notes_versions_and_expiry() {
    let exclusive = start().await;
    let server = exclusive.server.clone();
    let s = store(&server).await;
    let ttl = Duration::from_secs(30);
    let req = AcquireRequest {
        note: Some("nightly report, pid 42".into()),
        ..owner_request("noted", "a", ttl)
    };
    let t = grant(&s, &req).await;
    let again = grant(&s, &owner_request("noted", "a", ttl)).await;
    assert_eq!(t, again);
    let rec = s.read("noted").await.unwrap().expect("held");
    assert_eq!(rec.note.as_deref(), Some("nightly report, pid 42"));
    assert_eq!(rec.version, 2);
    assert!(
        rec.expires_in <= ttl && rec.expires_in > Duration::ZERO,
        "{rec:?}"
    );
    assert_eq!(
        s.renew(
            "a",
            &[HeldLease {
                name: "noted".into(),
                token: t
            }],
            ttl
        )
        .await
        .unwrap(),
        [Renewal::plain(true)]
    );
    assert_eq!(s.read("noted").await.unwrap().unwrap().version, 3);
    assert_eq!(s.renew("a", &[], ttl).await.unwrap(), Vec::<Renewal>::new());
}

/// Many processes opening a fresh database at once: every migration succeeds, in a
/// schema and table of the configuration's choosing, and they share the one table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_starts_share_one_table() {
    let exclusive = start().await;
    let server = exclusive.server.clone();
    let options = |_: usize| {
        let mut o: PostgresOptions = server.options(Duration::from_secs(5));
        o.schema = "app_leases".into();
        o.table = "locks".into();
        o
    };
    let stores = futures::future::join_all((0..6).map(|i| PostgresStore::connect(options(i))))
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .expect("every migration succeeds");
    let t = grant(
        &stores[0],
        &owner_request("shared", "a", Duration::from_secs(30)),
    )
    .await;
    match stores[5]
        .try_acquire(&owner_request("shared", "b", Duration::from_secs(30)))
        .await
        .unwrap()
    {
        AcquireOutcome::Held(r) => assert_eq!((r.owner.as_str(), r.token), ("a", t)),
        AcquireOutcome::Granted(_) => panic!("two tables"),
    }
    let conn = stores[1].connection().await.unwrap();
    let n: i64 = conn
        .query_one("SELECT count(*) FROM app_leases.locks", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}

/// A table made before priority leases (without their columns, rows in it) gains the
/// columns when a store opens it: its grants read as priority 0 without a request, and
/// preemption works on them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_of_earlier_versions_gain_the_priority_columns() {
    let exclusive = start().await;
    let server = exclusive.server.clone();
    let s = store(&server).await;
    let ttl = Duration::from_secs(30);
    let t = grant(&s, &owner_request("old", "a", ttl)).await;
    let conn = s.connection().await.unwrap();
    let table = format!("\"{}\".\"{}\"", s.options().schema, s.options().table);
    conn.batch_execute(&format!(
        "ALTER TABLE {table} DROP COLUMN priority, DROP COLUMN cleanup_timeout, \
         DROP COLUMN request_by, DROP COLUMN request_instance, DROP COLUMN request_priority, \
         DROP COLUMN request_forceful, DROP COLUMN request_note"
    ))
    .await
    .expect("back to the earlier layout");
    drop(conn);
    drop(s);
    let s = store(&server).await;
    let rec = s.read("old").await.unwrap().expect("held");
    assert_eq!((rec.token, rec.priority, rec.request), (t, 0, None));
    let by = PreemptionRequest {
        by: "b".into(),
        instance: "b-1".into(),
        priority: 1,
        forceful: false,
        note: None,
    };
    match s.request_preemption("old", t, &by).await.unwrap() {
        PreemptAnswer::Recorded(r) => assert_eq!(r.request, Some(by.clone())),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        s.renew(
            "a",
            &[HeldLease {
                name: "old".into(),
                token: t
            }],
            ttl
        )
        .await
        .unwrap(),
        [Renewal::Renewed { request: Some(by) }]
    );
}

/// A write guarded by the fence commits only while the writer holds the lease; the lease
/// row stays locked until it commits, so a later grant comes after the write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_writes_refuse_stale_tokens() {
    let exclusive = start().await;
    let server = exclusive.server.clone();
    let s = PostgresStore::connect(server.options(Duration::from_secs(10)))
        .await
        .expect("connect");
    let mut conn = s.connection().await.unwrap();
    conn.batch_execute("CREATE TABLE report (id int PRIMARY KEY, by_token bigint)")
        .await
        .unwrap();
    let fence = s.fence();
    let short = Duration::from_millis(300);
    let t1 = grant(&s, &owner_request("guarded", "a", short)).await;

    let tx = conn.transaction().await.unwrap();
    fence.check(&tx, "guarded", "a", t1).await.expect("held");
    tx.execute("INSERT INTO report VALUES (1, $1)", &[&(t1.get() as i64)])
        .await
        .unwrap();
    // The grant expires on the server while the transaction is open; a contender must
    // still wait for the commit.
    sleep(short + Duration::from_millis(200)).await;
    let contender = s.clone();
    let b = tokio::spawn(async move {
        let t = grant(
            &contender,
            &owner_request("guarded", "b", Duration::from_secs(30)),
        )
        .await;
        (Instant::now(), t)
    });
    sleep(Duration::from_millis(200)).await;
    let committed = Instant::now();
    tx.commit().await.unwrap();
    let (granted_at, t2) = b.await.unwrap();
    assert!(
        granted_at >= committed,
        "b was granted before a's guarded write committed"
    );
    assert!(t2 > t1);

    let tx = conn.transaction().await.unwrap();
    let refused = fence.check(&tx, "guarded", "a", t1).await;
    assert!(
        matches!(refused, Err(FenceError::NotHeld { .. })),
        "{refused:?}"
    );
    tx.rollback().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    // A token past the database's integer is held by nobody; the transaction stays usable.
    let beyond = FencingToken::new(u64::MAX);
    let refused = fence.check(&tx, "guarded", "b", beyond).await;
    assert!(
        matches!(refused, Err(FenceError::NotHeld { token, .. }) if token == beyond),
        "{refused:?}"
    );
    fence
        .check(&tx, "guarded", "b", t2)
        .await
        .expect("b holds it");
    tx.execute(
        "UPDATE report SET by_token = $1 WHERE id = 1",
        &[&(t2.get() as i64)],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

/// A guarded write holds back every later grant of its lease, and nothing else: while its
/// transaction is open the holder renews and releases its grant without waiting for it,
/// and a new grant waits until it commits: an emergency take-over of the unexpired grant,
/// and an acquire after the release. Waits are read from the server
/// (`pg_stat_activity`), not timed: a renewal or release that waits for the write's lock,
/// or a new grant that does not, fails the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_writes_hold_back_later_grants_but_not_renewals() {
    let exclusive = start().await;
    let server = exclusive.server.clone();
    let options = || server.options(Duration::from_secs(10));
    let s = PostgresStore::connect(options()).await.expect("connect");
    let watch = PostgresStore::connect(options()).await.expect("connect");
    let watch = watch.connection().await.unwrap();
    let mut conn = s.connection().await.unwrap();
    conn.batch_execute("CREATE TABLE report (id int PRIMARY KEY, by_token bigint)")
        .await
        .unwrap();
    let fence = s.fence();
    let ttl = Duration::from_secs(30);
    let t1 = grant(&s, &owner_request("guarded", "a", ttl)).await;

    // a writes under t1; b takes the grant over at once (emergency).
    let tx = conn.transaction().await.unwrap();
    fence.check(&tx, "guarded", "a", t1).await.expect("held");
    tx.execute("INSERT INTO report VALUES (1, $1)", &[&(t1.get() as i64)])
        .await
        .unwrap();
    let renewed = until_a_lock_wait(&watch, s.renew("a", &[held("guarded", t1)], ttl))
        .await
        .expect("the holder's renewal waited for its own guarded write");
    assert_eq!(renewed.unwrap(), [Renewal::Renewed { request: None }]);
    let mut takeover = owner_request("guarded", "b", ttl);
    takeover.priority = EMERGENCY_PRIORITY;
    takeover.emergency = true;
    let t2 = later_grant(&watch, &s, takeover, tx, t1).await;

    // b writes under t2 and releases its grant meanwhile; then a acquires.
    let tx = conn.transaction().await.unwrap();
    let refused = fence.check(&tx, "guarded", "a", t1).await;
    assert!(
        matches!(refused, Err(FenceError::NotHeld { .. })),
        "{refused:?}"
    );
    drop(tx);
    let tx = conn.transaction().await.unwrap();
    fence.check(&tx, "guarded", "b", t2).await.expect("held");
    tx.execute("UPDATE report SET by_token = $1", &[&(t2.get() as i64)])
        .await
        .unwrap();
    let released = until_a_lock_wait(&watch, s.release("guarded", "b", t2))
        .await
        .expect("the holder's release waited for its own guarded write");
    assert!(released.unwrap());
    later_grant(&watch, &s, owner_request("guarded", "a", ttl), tx, t2).await;
}

/// Spawns an acquire of `req`, checks that it waits for a lock while the guarded write
/// `tx` under `before` is open, commits `tx` and returns the acquire's token.
async fn later_grant(
    watch: &tokio_postgres::Client,
    store: &PostgresStore,
    req: AcquireRequest,
    tx: deadpool_postgres::Transaction<'_>,
    before: FencingToken,
) -> FencingToken {
    let store = store.clone();
    let mut acquire = std::pin::pin!(tokio::spawn(async move { grant(&store, &req).await }));
    if let Some(token) = until_a_lock_wait(watch, &mut acquire).await {
        let token = token.expect("the acquire");
        panic!("granted {token:?} while a guarded write under {before:?} was open");
    }
    tx.commit().await.unwrap();
    let token = acquire.await.unwrap();
    assert!(token > before);
    token
}

fn held(name: &str, token: FencingToken) -> HeldLease {
    HeldLease {
        name: name.into(),
        token,
    }
}

/// Runs `op` until it ends (`Some` of its output) or until a backend of the server waits
/// for a lock (`None`), as `watch` reads it every 10 ms.
async fn until_a_lock_wait<T>(
    watch: &tokio_postgres::Client,
    op: impl std::future::Future<Output = T>,
) -> Option<T> {
    let mut op = std::pin::pin!(op);
    loop {
        tokio::select! {
            done = &mut op => return Some(done),
            () = sleep(Duration::from_millis(10)) => {
                let waiting: i64 = watch
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
                        &[],
                    )
                    .await
                    .expect("read the lock waits")
                    .get(0);
                if waiting > 0 {
                    return None;
                }
            }
        }
    }
}

/// Polls `try_acquire` every 20 ms for at most `limit`; the instant of the grant, if any.
async fn granted_within(
    store: &PostgresStore,
    req: &AcquireRequest,
    limit: Duration,
) -> Option<Instant> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if let AcquireOutcome::Granted(_) = store.try_acquire(req).await.expect("acquire") {
            return Some(Instant::now());
        }
        sleep(Duration::from_millis(20)).await;
    }
    None
}

/// The server's wall clock steps forward (libfaketime on every postgres process): each
/// grant looks expired on the server's clock at once. On the server's clock alone a
/// contender takes a grant over while its holder still believes in it (the holder's
/// deadline is on its own clock); with `observed-expiry` the contender first watches the
/// row unchanged for a full ttl on its own monotonic clock, and is granted only after the
/// holder's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_clock_stepped_forward_takes_over_only_with_the_server_clock_rule() {
    let exclusive = start().await;
    let server = exclusive.server.clone();
    blocking(&server, |s| s.with_fake_clock()).await;
    let settings = test_settings();
    let ttl = settings.heartbeat_timeout;
    for (observed, offset) in [(false, "+1h"), (true, "+2h")] {
        let mut options = server.options(settings.lease_operation_timeout);
        options.observed_expiry = observed;
        let holder = PostgresStore::connect(options.clone())
            .await
            .expect("connect");
        let contender = PostgresStore::connect(options).await.expect("connect");
        let name = format!("jump-{observed}");
        let sent = Instant::now();
        grant(&holder, &owner_request(&name, "a", ttl)).await;
        // The holder believes until its send instant + ttl - margin, on its own clock.
        let believes_until = sent + settings.validity();
        let b = owner_request(&name, "b", ttl);
        assert!(matches!(
            contender.try_acquire(&b).await.expect("acquire"),
            AcquireOutcome::Held(_)
        ));
        server.step_clock(offset);
        let granted = granted_within(&contender, &b, ttl * 3)
            .await
            .unwrap_or_else(|| panic!("observed-expiry {observed}: never granted"));
        if observed {
            assert!(
                granted >= believes_until,
                "taken over {:?} before the holder's deadline",
                believes_until - granted
            );
        } else {
            assert!(
                granted < believes_until,
                "the server clock's rule took over at once (this is what observed-expiry prevents)"
            );
        }
    }
}
