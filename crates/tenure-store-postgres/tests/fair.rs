//! PostgreSQL specifics of fair acquire against a real server: which statements notify the
//! waiters' channel (and with what payload), and the waiters' table added to a lease table
//! of an earlier version. The shared fair cases run in `conformance.rs`.

mod support;
use support::PgOptions;

use std::sync::Arc;
use std::time::Duration;

use futures::future::poll_fn;
use tenure_lease::{AcquireOutcome, AcquireRequest, FairQueue, LeaseStore};
use tenure_lease_kit::conformance::{granted_token, owner_request, test_settings};
use tenure_store_postgres::PostgresStore;
use tenure_test_kit::eventually_async;
use tenure_test_kit::postgres::{Exclusive, PgServer};
use tokio::sync::mpsc;
use tokio::time::timeout;
use tokio_postgres::{AsyncMessage, NoTls};

const TTL: Duration = Duration::from_secs(2);

/// Bound on waiting for something that must happen: failing it fails the test, it is no
/// claim about speed.
const PATIENCE: Duration = Duration::from_secs(30);

async fn store(server: &PgServer) -> PostgresStore {
    PostgresStore::connect(server.options(test_settings().lease_operation_timeout))
        .await
        .expect("connect")
}

fn request(name: &str, owner: &str) -> AcquireRequest {
    owner_request(name, owner, TTL)
}

/// The notifications a plain client LISTENing on a channel receives.
struct Heard {
    /// Keeps the connection open.
    _client: tokio_postgres::Client,
    payloads: mpsc::UnboundedReceiver<String>,
}

impl Heard {
    async fn start(server: &PgServer, channel: &str) -> Heard {
        let (client, mut connection) = server.connection().connect(NoTls).await.expect("connect");
        let (tx, payloads) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(Ok(message)) = poll_fn(|cx| connection.poll_message(cx)).await {
                if let AsyncMessage::Notification(n) = message
                    && tx.send(n.payload().to_string()).is_err()
                {
                    return;
                }
            }
        });
        client
            .batch_execute(&format!("LISTEN \"{channel}\""))
            .await
            .expect("LISTEN");
        Heard {
            _client: client,
            payloads,
        }
    }

    /// The payload of the next notification.
    async fn next(&mut self) -> String {
        timeout(PATIENCE, self.payloads.recv())
            .await
            .expect("a notification")
            .expect("the listening connection is open")
    }
}

/// The rows of `name` in the waiters' table.
async fn waiter_rows(store: &PostgresStore, name: &str) -> i64 {
    let conn = store.connection().await.expect("a connection");
    conn.query_one(&store.statements().waiting, &[&name])
        .await
        .expect("count the waiters")
        .get(1)
}

async fn until_waiter_rows(store: &PostgresStore, name: &str, n: i64) {
    let what = format!("{n} waiter rows of {name}");
    eventually_async(&what, PATIENCE, async || {
        let rows = waiter_rows(store, name).await;
        if rows == n { Ok(()) } else { Err(rows) }
    })
    .await
}

/// A release with nobody in line sends nothing; with a waiter in line it notifies the
/// lease's name, and so does a waiter leaving the line when its `wait` passed. Names too
/// long for a payload send an empty one (every waiter of the table looks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_and_departures_notify_the_line() {
    let exclusive = Exclusive::start().await;
    let server = exclusive.server.clone();
    let holder = store(&server).await;
    let mut heard = Heard::start(&server, &holder.statements().channel).await;

    let quiet = granted_token(&holder.try_acquire(&request("quiet", "h")).await.unwrap());
    assert!(holder.release("quiet", "h", quiet).await.unwrap());

    let busy = granted_token(&holder.try_acquire(&request("busy", "h")).await.unwrap());
    let waiter: Arc<dyn FairQueue> = Arc::new(store(&server).await);
    let w = waiter.clone();
    let waiting =
        tokio::spawn(async move { w.acquire_fair(&request("busy", "w"), PATIENCE).await });
    until_waiter_rows(&holder, "busy", 1).await;
    assert!(holder.release("busy", "h", busy).await.unwrap());
    // Delivered in commit order: had the first release notified, "quiet" would come first.
    assert_eq!(heard.next().await, "busy");
    let token = granted_token(&waiting.await.unwrap().unwrap());
    until_waiter_rows(&holder, "busy", 0).await;

    let impatient = store(&server).await;
    match impatient
        .acquire_fair(&request("busy", "i"), Duration::from_millis(300))
        .await
        .unwrap()
    {
        AcquireOutcome::Held(r) => assert_eq!((r.owner.as_str(), r.token), ("w", token)),
        AcquireOutcome::Granted(r) => panic!("granted while w holds it: {r:?}"),
    }
    assert_eq!(heard.next().await, "busy", "the departure notifies");
    assert_eq!(waiter_rows(&holder, "busy").await, 0);
    assert!(waiter.release("busy", "w", token).await.unwrap());

    let long = "l".repeat(1500);
    let t = granted_token(&holder.try_acquire(&request(&long, "h")).await.unwrap());
    let w = waiter.clone();
    let name = long.clone();
    let waiting = tokio::spawn(async move { w.acquire_fair(&request(&name, "w"), PATIENCE).await });
    until_waiter_rows(&holder, &long, 1).await;
    assert!(holder.release(&long, "h", t).await.unwrap());
    assert_eq!(heard.next().await, "", "a long name wakes every waiter");
    assert!(granted_token(&waiting.await.unwrap().unwrap()) > t);
}

/// A lease table made before fair waiting (no waiters' table) gains it when a store opens
/// it, and its grants are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_lease_table_gains_the_waiters_table() {
    let exclusive = Exclusive::start().await;
    let server = exclusive.server.clone();
    let first = store(&server).await;
    let token = granted_token(&first.try_acquire(&request("kept", "h")).await.unwrap());
    let conn = first.connection().await.unwrap();
    conn.batch_execute("DROP TABLE tenure.tenure_lease_waiter")
        .await
        .expect("drop the waiters' table");
    drop(conn);
    let reopened = store(&server).await;
    assert_eq!(
        reopened.read("kept").await.unwrap().map(|r| r.token),
        Some(token)
    );
    match reopened
        .acquire_fair(&request("kept", "w"), Duration::from_millis(300))
        .await
        .unwrap()
    {
        AcquireOutcome::Held(r) => assert_eq!(r.token, token),
        AcquireOutcome::Granted(r) => panic!("granted while h holds it: {r:?}"),
    }
    assert_eq!(waiter_rows(&reopened, "kept").await, 0);
}
