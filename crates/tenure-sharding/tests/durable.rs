//! Durable entities on one shard over the real journals (SQLite in the lease file and in a
//! file of its own, PostgreSQL on a real server): sequence numbers are contiguous and a
//! reply comes only once its events are in the journal; an append under a grant that is
//! not current any more is refused and stops the entity; the shard's next host recovers
//! exactly the acknowledged events, from the latest snapshot on, and with remember-entities
//! starts the entity with its state and no message.
//!
//! Every test is bounded: a few shards, at most a dozen events each.

use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use ractor::{ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};
use tenure_journal::conformance::JournalHarness;
use tenure_journal::{
    Append, Fence, Journal, JournalError, SaveSnapshot, Snapshot, StoredEvent, Written, read_all,
};
use tenure_lease::{
    AcquireOutcome, AcquireRequest, FencingToken, LeaseSettings, LeaseSpec, LeaseStore,
    TenureConfig,
};
use tenure_sharding::{
    AskReply, DurableEntity, Effect, EntityContext, Shard, ShardArgs, ShardMsg, ShardStatus,
    ShardingSettings, durable_entity_factory, persistence_id,
};
use tenure_store_postgres::{PostgresJournal, PostgresOptions, PostgresStore};
use tenure_store_sqlite::conformance::JournalFiles;
use tenure_test_kit::eventually_async;
use tenure_test_kit::postgres::Exclusive;

const TYPE: &str = "ledger";
const LEASE: &str = "test-shard-ledger-0";

/// What a ledger is told: add these numbers (one event each), or answer what it holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Command {
    Add(Vec<u32>),
    Get,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Added(u32);

/// A ledger of numbers: every `Add` persists one event per number, the reply is the ledger
/// after them. Counts the events it applied (at recovery and at run time); a snapshot
/// every 3 events.
struct Ledger {
    applied: Arc<AtomicU64>,
}

impl DurableEntity for Ledger {
    type Command = Command;
    type Event = Added;
    type State = Vec<u32>;
    type Reply = Vec<u32>;

    fn empty_state(&self, _ctx: &EntityContext) -> Vec<u32> {
        Vec::new()
    }

    fn on_command(
        &self,
        _ctx: &EntityContext,
        state: &Vec<u32>,
        command: Command,
    ) -> Effect<Added, Vec<u32>, Vec<u32>> {
        match command {
            Command::Add(numbers) => {
                Effect::persist(numbers.into_iter().map(Added), |s: &Vec<u32>| s.clone())
            }
            Command::Get => Effect::reply(state.clone()),
        }
    }

    fn on_event(&self, state: &mut Vec<u32>, event: &Added) {
        self.applied.fetch_add(1, Ordering::SeqCst);
        state.push(event.0);
    }

    fn snapshot_every(&self) -> Option<NonZeroU64> {
        NonZeroU64::new(3)
    }
}

/// The PostgreSQL lease store and journal on a real server of this test.
struct Postgres(Exclusive);

impl Postgres {
    async fn start() -> Postgres {
        Postgres(Exclusive::start().await)
    }

    async fn store(&self) -> PostgresStore {
        let mut connection = self.0.server.connection();
        connection.connect_timeout(Duration::from_secs(5));
        let options = PostgresOptions::new(connection, Duration::from_secs(5));
        PostgresStore::connect(options).await.expect("connect")
    }
}

#[async_trait]
impl JournalHarness for Postgres {
    async fn leases(&self) -> Arc<dyn LeaseStore> {
        Arc::new(self.store().await)
    }

    async fn journal(&self) -> Arc<dyn Journal> {
        Arc::new(
            PostgresJournal::open(&self.store().await)
                .await
                .expect("open the journal"),
        )
    }
}

/// Lease settings under which the shard does not renew during a test (its first renewal
/// is 50 s after its grant): a grant taken from it behind its back stays unnoticed, as by a
/// holder paused past its ttl.
fn lease_settings() -> LeaseSettings {
    LeaseSettings {
        heartbeat_timeout: Duration::from_secs(120),
        heartbeat_interval: Duration::from_secs(50),
        lease_operation_timeout: Duration::from_secs(5),
        lease_retry_interval: Duration::from_millis(100),
        safety_margin: Duration::from_secs(1),
        lock_delay: Duration::ZERO,
    }
}

/// A shard of the ledger type on node `owner`, its one shard holding every id.
struct Host {
    shard: ActorRef<ShardMsg>,
    applied: Arc<AtomicU64>,
    store_name: String,
}

async fn host(h: &dyn JournalHarness, owner: &str) -> Host {
    host_with(h, owner, false).await
}

/// As [`host`], with remember-entities on or off.
async fn host_with(h: &dyn JournalHarness, owner: &str, remember: bool) -> Host {
    host_on(h, owner, remember, h.journal().await).await
}

/// As [`host_with`], its entities writing to `journal`.
async fn host_on(
    h: &dyn JournalHarness,
    owner: &str,
    remember: bool,
    journal: Arc<dyn Journal>,
) -> Host {
    let config = TenureConfig::from_toml_str(
        &format!("[sharding]\nretry-interval = \"50ms\"\nremember-entities = {remember}"),
        "test",
    )
    .expect("settings");
    let mut settings = ShardingSettings::from_config(&config, TYPE, "sqlite").expect("settings");
    settings.number_of_shards = 1;
    settings.idle_timeout = None;
    settings.stop_timeout = Duration::from_secs(5);
    settings.lease = lease_settings();
    let applied = Arc::new(AtomicU64::new(0));
    let lease = LeaseSpec::new(LEASE, owner, h.leases().await, lease_settings()).expect("spec");
    let store_name = lease.store_name.clone();
    let factory = durable_entity_factory(
        Ledger {
            applied: applied.clone(),
        },
        journal,
    );
    let args = ShardArgs {
        type_name: TYPE.into(),
        shard_id: "0".into(),
        node: owner.into(),
        lease,
        factory,
        active: None,
        settings: Arc::new(settings),
        process_end: tenure_lease::ProcessEnd::abort(),
    };
    let shard = Shard::start(args, None).await.expect("start the shard");
    Host {
        shard,
        applied,
        store_name,
    }
}

impl Host {
    async fn ask(&self, entity: &str, command: Command) -> Result<Vec<u32>, String> {
        let payload =
            tenure_cluster::codec::encode_inner("entity request", TYPE, &command).expect("encode");
        let reply = self
            .shard
            .call(
                |r: RpcReplyPort<AskReply>| ShardMsg::Deliver {
                    entity: entity.into(),
                    payload,
                    reply: Some(r),
                },
                Some(Duration::from_secs(20)),
            )
            .await
            .expect("the shard answers");
        let ractor::rpc::CallResult::Success(AskReply { result }) = reply else {
            panic!("no answer from the shard within 20 s");
        };
        result
            .map(|b| tenure_cluster::codec::decode_inner("entity request", TYPE, &b).unwrap())
            .map_err(|e| e.to_string())
    }

    fn tell(&self, entity: &str, command: Command) {
        let payload =
            tenure_cluster::codec::encode_inner("entity request", TYPE, &command).expect("encode");
        self.shard
            .cast(ShardMsg::Deliver {
                entity: entity.into(),
                payload,
                reply: None,
            })
            .expect("the shard takes messages");
    }

    /// Waits (at most 10 s) until the shard's status satisfies `done`; panics naming `what`
    /// and the last status if it never did.
    async fn until(&self, what: &str, done: impl Fn(&ShardStatus) -> bool) {
        eventually_async(what, Duration::from_secs(10), async || {
            let status = self.status().await;
            if done(&status) { Ok(()) } else { Err(status) }
        })
        .await
    }

    async fn status(&self) -> ShardStatus {
        ractor::call!(self.shard, ShardMsg::Status).expect("status")
    }

    /// The token the shard serves under (it waits for its grant).
    async fn serving(&self) -> FencingToken {
        eventually_async(
            "the shard to be granted its lease",
            Duration::from_secs(10),
            async || {
                let status = self.status().await;
                status.serving.ok_or(status)
            },
        )
        .await
    }

    async fn hand_off(&self) {
        let handed = ractor::call!(self.shard, ShardMsg::HandOff).expect("hand-off");
        assert!(handed.released, "the hand-off released the lease");
    }
}

/// A journal that counts the reads of recoveries (snapshot loads and event reads), every
/// call forwarded unchanged.
struct CountingReads {
    inner: Arc<dyn Journal>,
    reads: AtomicU64,
}

impl CountingReads {
    fn new(inner: Arc<dyn Journal>) -> Arc<CountingReads> {
        Arc::new(CountingReads {
            inner,
            reads: AtomicU64::new(0),
        })
    }

    fn reads(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Journal for CountingReads {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn append(&self, append: Append) -> Result<Written, JournalError> {
        self.inner.append(append).await
    }

    async fn read(
        &self,
        persistence_id: &str,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredEvent>, JournalError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.read(persistence_id, from, max).await
    }

    async fn claim(&self, persistence_id: &str, fence: &Fence) -> Result<bool, JournalError> {
        self.inner.claim(persistence_id, fence).await
    }

    async fn save_snapshot(&self, snapshot: SaveSnapshot) -> Result<Written, JournalError> {
        self.inner.save_snapshot(snapshot).await
    }

    async fn load_snapshot(&self, persistence_id: &str) -> Result<Option<Snapshot>, JournalError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.load_snapshot(persistence_id).await
    }

    async fn persistence_ids(&self) -> Result<Vec<String>, JournalError> {
        self.inner.persistence_ids().await
    }
}

/// Every event of `entity` as (sequence number, number, token, writer).
async fn journal_of(h: &dyn JournalHarness, entity: &str) -> Vec<(u64, u32, u64, String)> {
    let journal = h.journal().await;
    read_all(journal.as_ref(), &persistence_id(TYPE, entity), 1, 4)
        .await
        .expect("read the journal")
        .into_iter()
        .map(|e| {
            let Added(n) = serde_json::from_slice(&e.payload).expect("an event");
            (e.seq, n, e.token.get(), e.writer)
        })
        .collect()
}

const A: &str = "127.0.0.1:2551";
const B: &str = "127.0.0.1:2552";
const C: &str = "127.0.0.1:2553";

/// Numbered 1, 2, 3… with no gap across commands of one and several events, each under
/// the shard's grant by its node; every reply is the state after the command's events,
/// which are in the journal when it arrives.
async fn contiguous_and_durable_before_the_reply(h: &dyn JournalHarness) {
    let a = host(h, A).await;
    let token = a.serving().await.get();
    let mut expected = Vec::new();
    let mut ledger = Vec::new();
    for numbers in [vec![10], vec![11, 12], vec![], vec![13, 14, 15], vec![16]] {
        let reply = a.ask("e1", Command::Add(numbers.clone())).await.unwrap();
        for n in numbers {
            ledger.push(n);
            expected.push((expected.len() as u64 + 1, n, token, A.to_string()));
        }
        assert_eq!(reply, ledger, "the reply is the state after the events");
        assert_eq!(
            journal_of(h, "e1").await,
            expected,
            "the events are durable when the reply arrives"
        );
    }
    // Another entity's numbers start at 1.
    a.ask("e2", Command::Add(vec![20])).await.unwrap();
    assert_eq!(
        journal_of(h, "e2").await,
        vec![(1, 20, token, A.to_string())]
    );
    // The snapshot every 3 events: the latest at 6 (events 1-3, then 4-6).
    let snapshot = h
        .journal()
        .await
        .load_snapshot(&persistence_id(TYPE, "e1"))
        .await
        .unwrap()
        .expect("a snapshot");
    assert_eq!(snapshot.seq, 6);
    let state: Vec<u32> = serde_json::from_slice(&snapshot.payload).unwrap();
    assert_eq!(state, vec![10, 11, 12, 13, 14, 15]);
}

/// A's grant is taken behind its back (it expired while A paused, and B was granted);
/// A's next append is refused by the journal, the caller gets the refusal, and the entity
/// stops. The refusal is the store's word that A's grant is gone: A's shard gives the grant
/// up at once (not at its next renewal, 50 s on), so the next messages wait for a grant
/// instead of starting the entity again, each recovery reading the journal only to be
/// refused. Once the lease is free, A is granted it again and the waiting messages reach
/// the entity under the new grant; the journal holds exactly the acknowledged events, and
/// the next host recovers them and appends after them.
async fn stale_grant_refused_and_entity_stopped(h: &dyn JournalHarness) {
    let journal = CountingReads::new(h.journal().await);
    let a = host_on(h, A, false, journal.clone()).await;
    let first = a.serving().await;
    assert_eq!(a.ask("e1", Command::Add(vec![1, 2])).await.unwrap(), [1, 2]);
    assert_eq!(a.status().await.entities, ["e1"]);

    let leases = h.leases().await;
    assert!(
        leases.release(&a.store_name, A, first).await.unwrap(),
        "A's grant ends behind its back"
    );
    let request = AcquireRequest {
        name: a.store_name.clone(),
        owner: B.into(),
        instance: format!("{B}-by-hand"),
        ttl: Duration::from_secs(60),
        ..AcquireRequest::default()
    };
    let AcquireOutcome::Granted(stolen) = leases.try_acquire(&request).await.unwrap() else {
        panic!("B is granted the released lease");
    };
    assert!(stolen.token > first);

    let refused = a
        .ask("e1", Command::Add(vec![3]))
        .await
        .expect_err("an append under A's stale grant is refused");
    assert!(
        refused.contains("refused") && refused.contains(&first.get().to_string()),
        "the caller is told why: {refused}"
    );
    a.until("the entity to stop after the refusal", |s| {
        s.entities.is_empty()
    })
    .await;
    let reads = journal.reads();
    for n in [4, 5, 6] {
        a.tell("e1", Command::Add(vec![n]));
    }
    a.until(
        "the shard to give its grant up and keep the messages for the next one",
        |s| s.serving.is_none() && s.entities.is_empty() && s.waiting == 3,
    )
    .await;
    assert_eq!(
        journal.reads(),
        reads,
        "the entity was not started again under the refused grant"
    );
    assert_eq!(
        journal_of(h, "e1").await,
        vec![
            (1, 1, first.get(), A.to_string()),
            (2, 2, first.get(), A.to_string())
        ],
        "only the acknowledged events, all under A's grant"
    );

    // B's grant ends: A acquires again, and the messages that waited reach the entity,
    // started under the new grant with the acknowledged events.
    assert!(
        leases
            .release(&a.store_name, B, stolen.token)
            .await
            .unwrap()
    );
    let second = a.serving().await;
    assert!(second > stolen.token);
    assert_eq!(a.ask("e1", Command::Get).await.unwrap(), [1, 2, 4, 5, 6]);
    let tail: Vec<_> = journal_of(h, "e1").await.split_off(2);
    assert_eq!(
        tail,
        [4, 5, 6]
            .iter()
            .zip(3..)
            .map(|(n, seq)| (seq, *n, second.get(), A.to_string()))
            .collect::<Vec<_>>()
    );

    // C, the next host, recovers what A's callers were acknowledged.
    a.hand_off().await;
    let c = host(h, C).await;
    let third = c.serving().await;
    assert_eq!(c.ask("e1", Command::Get).await.unwrap(), [1, 2, 4, 5, 6]);
    assert_eq!(
        c.ask("e1", Command::Add(vec![7])).await.unwrap(),
        [1, 2, 4, 5, 6, 7]
    );
    assert_eq!(
        journal_of(h, "e1").await.last(),
        Some(&(6, 7, third.get(), C.to_string()))
    );
}

/// Hand-offs A → B → C: each next host recovers exactly the acknowledged events, from
/// the latest snapshot and the events after it, and appends after them.
async fn recovery_after_hand_off(h: &dyn JournalHarness) {
    let a = host(h, A).await;
    for n in 1..=7 {
        a.ask("e1", Command::Add(vec![n])).await.unwrap();
    }
    a.hand_off().await;

    let b = host(h, B).await;
    let second = b.serving().await;
    assert_eq!(
        b.ask("e1", Command::Get).await.unwrap(),
        (1..=7).collect::<Vec<_>>()
    );
    assert_eq!(
        b.applied.load(Ordering::SeqCst),
        1,
        "recovered from the snapshot at 6 and event 7"
    );
    b.ask("e1", Command::Add(vec![8, 9])).await.unwrap();
    b.hand_off().await;

    let c = host(h, C).await;
    assert_eq!(
        c.ask("e1", Command::Get).await.unwrap(),
        (1..=9).collect::<Vec<_>>()
    );
    assert_eq!(
        c.applied.load(Ordering::SeqCst),
        0,
        "recovered from the snapshot at 9 alone"
    );
    let journal = journal_of(h, "e1").await;
    assert_eq!(
        journal.iter().map(|e| (e.0, e.1)).collect::<Vec<_>>(),
        (1..=9).map(|n| (n as u64, n)).collect::<Vec<_>>()
    );
    assert!(journal[7..].iter().all(|e| e.2 == second.get() && e.3 == B));
}

/// With remember-entities, the next host starts the entity with no message, and it
/// recovers its state from the journal.
async fn remembered_entity_restarts_with_its_state(h: &dyn JournalHarness) {
    let a = host_with(h, A, true).await;
    for n in 1..=4 {
        a.ask("e1", Command::Add(vec![n])).await.unwrap();
    }
    a.hand_off().await;

    let b = host_with(h, B, true).await;
    // Recovery replays event 4 after the snapshot at 3, with no message to the entity.
    eventually_async(
        "e1 started on B by remember-entities and recovered",
        Duration::from_secs(10),
        async || {
            let applied = b.applied.load(Ordering::SeqCst);
            let status = b.status().await;
            if applied == 1 && status.entities == ["e1"] {
                Ok(())
            } else {
                Err((applied, status))
            }
        },
    )
    .await;
    assert_eq!(b.ask("e1", Command::Get).await.unwrap(), [1, 2, 3, 4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_remembered_entity_restarts_with_its_state() {
    remembered_entity_restarts_with_its_state(&JournalFiles::new(false)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_remembered_entity_restarts_with_its_state() {
    remembered_entity_restarts_with_its_state(&Postgres::start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_contiguous_and_durable_before_the_reply() {
    contiguous_and_durable_before_the_reply(&JournalFiles::new(false)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_stale_grant_refused_and_entity_stopped() {
    stale_grant_refused_and_entity_stopped(&JournalFiles::new(false)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_recovery_after_hand_off() {
    recovery_after_hand_off(&JournalFiles::new(false)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_own_file_stale_grant_refused_and_entity_stopped() {
    stale_grant_refused_and_entity_stopped(&JournalFiles::new(true)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_own_file_recovery_after_hand_off() {
    recovery_after_hand_off(&JournalFiles::new(true)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_contiguous_and_durable_before_the_reply() {
    contiguous_and_durable_before_the_reply(&Postgres::start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stale_grant_refused_and_entity_stopped() {
    stale_grant_refused_and_entity_stopped(&Postgres::start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_recovery_after_hand_off() {
    recovery_after_hand_off(&Postgres::start().await).await;
}
