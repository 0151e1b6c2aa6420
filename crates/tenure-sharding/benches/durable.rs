//! Durable entities' costs, each reported against a baseline measured in the same run, on
//! SQLite (the journal in the lease file) and PostgreSQL (a server the bench starts):
//!
//! 1. **append**: command → event durable → reply through a durable entity (an ask to its
//!    shard, one event per command) against the same fenced insert issued by hand (one
//!    transaction: the fence's check, the sequence check, the insert, the commit, on a
//!    connection of the bench's own), alternating in slices, rounds, median of the rounds'
//!    ratios (goal: at most 1.25x);
//! 2. **group commit**: concurrent commands to different entities, the journal batching
//!    the appends waiting at once into one transaction against the same journal with one
//!    transaction per append (`with_max_batch(1)`), alternating in slices;
//! 3. **recovery**: entities with 100 events each and a snapshot every 50, remember-entities
//!    on: their shard handed off to a new host in the same process, the time from the new
//!    host's shard starting until every entity answered with its recovered state, against
//!    the same snapshot loads and event reads issued by hand through the journal
//!    (concurrently, one task per entity);
//! 4. **memory** (SQLite): `active-entity-limit` 10,000 and 100,000 entities touched (one
//!    event each): resident memory after every 10,000 touched. The run stops itself, with a
//!    message, once resident memory passes 2 GiB.
//!
//! `cargo bench -p tenure-sharding --bench durable`; `cargo test --benches` runs each part
//! once, small. Knobs: TENURE_BENCH_ROUNDS (append and group commit rounds),
//! TENURE_BENCH_PART (`append`, `group`, `recovery` or `memory`: that part alone), and
//! TENURE_BENCH_PG_FSYNC=on (the PostgreSQL server flushes its commits to disk, as a
//! deployment does; the test kit's server runs with fsync off).

use std::num::NonZeroU64;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};
use tenure_journal::Journal;
use tenure_lease::{
    AcquireOutcome, AcquireRequest, FencingToken, LeaseSettings, LeaseSpec, LeaseStore,
    TenureConfig,
};
use tenure_lease_kit::bench::{PairedRounds, SLICES, knob, paired, size, smoke, timed};
use tenure_lease_kit::report::Report;
use tenure_sharding::{
    ActiveEntities, AskReply, DurableEntity, Effect, EntityContext, Shard, ShardArgs, ShardMsg,
    ShardStatus, ShardingSettings, durable_entity_factory, persistence_id,
};
use tenure_store_postgres::{PostgresJournal, PostgresOptions, PostgresStore};
use tenure_store_sqlite::{SqliteJournal, SqliteStore};
use tenure_test_kit::postgres::PgServer;

const BUSY: Duration = Duration::from_secs(5);
const OWNER: &str = "127.0.0.1:2551";
const NEXT_HOST: &str = "127.0.0.1:2552";
const KIND: &str = "entity request";

/// What a tally is told.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Command {
    Add(u64),
    Get,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Added(u64);

/// Its state: how many events, and their sum.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Total {
    events: u64,
    sum: u64,
}

/// A durable tally: `Add` persists one event; the reply is the state after it.
struct Tally {
    snapshot_every: Option<NonZeroU64>,
}

impl DurableEntity for Tally {
    type Command = Command;
    type Event = Added;
    type State = Total;
    type Reply = Total;

    fn empty_state(&self, _: &EntityContext) -> Total {
        Total::default()
    }

    fn on_command(
        &self,
        _: &EntityContext,
        state: &Total,
        command: Command,
    ) -> Effect<Added, Total, Total> {
        match command {
            Command::Add(n) => Effect::persist([Added(n)], |s: &Total| *s),
            Command::Get => Effect::reply(*state),
        }
    }

    fn on_event(&self, state: &mut Total, event: &Added) {
        state.events += 1;
        state.sum += event.0;
    }

    fn snapshot_every(&self) -> Option<NonZeroU64> {
        self.snapshot_every
    }
}

/// No renewal during a run (the first is 50 s after a grant).
fn lease_settings() -> LeaseSettings {
    LeaseSettings {
        heartbeat_timeout: Duration::from_secs(120),
        heartbeat_interval: Duration::from_secs(50),
        lease_operation_timeout: Duration::from_secs(10),
        lease_retry_interval: Duration::from_millis(50),
        safety_margin: Duration::from_secs(1),
        lock_delay: Duration::ZERO,
    }
}

/// A lease store and a journal fenced by its leases.
#[derive(Clone)]
struct Stores {
    name: &'static str,
    leases: Arc<dyn LeaseStore>,
    journal: Arc<dyn Journal>,
    /// The same journal writing one transaction per append.
    single: Arc<dyn Journal>,
}

/// One shard (holding every id) of entity type `type_name` on `owner`, under lease
/// `bench-shard-<type>`.
struct Host {
    shard: ActorRef<ShardMsg>,
    type_name: String,
}

struct HostOptions {
    remember: bool,
    snapshot_every: Option<NonZeroU64>,
    active: Option<ActiveEntities>,
}

async fn host(
    stores: &Stores,
    journal: Arc<dyn Journal>,
    type_name: &str,
    owner: &str,
    o: HostOptions,
) -> Host {
    let config = TenureConfig::from_toml_str(
        &format!(
            "[sharding]\nretry-interval = \"50ms\"\nremember-entities = {}",
            o.remember
        ),
        "bench",
    )
    .expect("settings");
    let mut settings =
        ShardingSettings::from_config(&config, type_name, "sqlite").expect("settings");
    settings.number_of_shards = 1;
    settings.idle_timeout = None;
    settings.stop_timeout = Duration::from_secs(10);
    settings.buffer_size = 1_000_000;
    settings.lease = lease_settings();
    let lease = LeaseSpec::new(
        &format!("bench-shard-{type_name}"),
        owner,
        stores.leases.clone(),
        lease_settings(),
    )
    .expect("lease spec");
    let factory = durable_entity_factory(
        Tally {
            snapshot_every: o.snapshot_every,
        },
        journal,
    );
    let args = ShardArgs {
        type_name: type_name.into(),
        shard_id: "0".into(),
        node: owner.into(),
        lease,
        factory,
        active: o.active,
        settings: Arc::new(settings),
        process_end: tenure_lease::ProcessEnd::abort(),
    };
    let shard = Shard::start(args, None).await.expect("start the shard");
    let host = Host {
        shard,
        type_name: type_name.into(),
    };
    host.serving().await;
    host
}

impl Host {
    async fn ask(&self, entity: &str, command: &Command) -> Total {
        let payload =
            tenure_cluster::codec::encode_inner(KIND, &self.type_name, command).expect("encode");
        let reply = self
            .shard
            .call(
                |r: RpcReplyPort<AskReply>| ShardMsg::Deliver {
                    entity: entity.into(),
                    payload,
                    reply: Some(r),
                },
                Some(Duration::from_secs(120)),
            )
            .await
            .expect("the shard answers");
        let ractor::rpc::CallResult::Success(AskReply { result }) = reply else {
            panic!("no answer from the shard within 120 s");
        };
        let bytes = result.unwrap_or_else(|e| panic!("entity {entity}: {e}"));
        tenure_cluster::codec::decode_inner(KIND, &self.type_name, &bytes).expect("decode")
    }

    async fn status(&self) -> ShardStatus {
        ractor::call!(self.shard, ShardMsg::Status).expect("status")
    }

    async fn serving(&self) -> FencingToken {
        for _ in 0..12_000 {
            if let Some(t) = self.status().await.serving {
                return t;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the shard was not granted its lease within 60 s");
    }

    async fn hand_off(&self) {
        let handed = ractor::call!(self.shard, ShardMsg::HandOff).expect("hand-off");
        assert!(handed.released, "the hand-off released the lease");
    }
}

/// A grant of lease `name` for the appends by hand.
async fn grant(leases: &dyn LeaseStore, name: &str) -> FencingToken {
    let request = AcquireRequest {
        name: name.into(),
        owner: OWNER.into(),
        instance: format!("{OWNER}-by-hand"),
        ttl: Duration::from_secs(3600),
        ..AcquireRequest::default()
    };
    match leases.try_acquire(&request).await.expect("acquire") {
        AcquireOutcome::Granted(g) => g.token,
        other => panic!("lease {name} not granted: {other:?}"),
    }
}

/// Appends one event by hand: the journal's fenced insert in a transaction of its own.
trait ByHand {
    async fn append(&mut self, persistence_id: &str, seq: u64, payload: Vec<u8>);
}

/// SQLite by hand: a connection configured as the journal's, an IMMEDIATE transaction with
/// the journal's own statements ([`tenure_store_sqlite::journal::sql::append_in`]).
struct SqliteByHand {
    conn: tenure_store_sqlite::rusqlite::Connection,
    lease: String,
    token: FencingToken,
}

impl SqliteByHand {
    fn open(path: &Path, lease: &str, token: FencingToken) -> SqliteByHand {
        let conn = tenure_store_sqlite::rusqlite::Connection::open(path).expect("open");
        conn.busy_timeout(BUSY).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.pragma_update(None, "synchronous", "FULL").unwrap();
        SqliteByHand {
            conn,
            lease: lease.into(),
            token,
        }
    }
}

impl ByHand for SqliteByHand {
    async fn append(&mut self, persistence_id: &str, seq: u64, payload: Vec<u8>) {
        let tx = self
            .conn
            .transaction_with_behavior(
                tenure_store_sqlite::rusqlite::TransactionBehavior::Immediate,
            )
            .unwrap();
        tenure_store_sqlite::journal::sql::append_in(
            &tx,
            (&self.lease, OWNER, self.token),
            persistence_id,
            seq,
            &[payload],
        )
        .expect("fenced")
        .expect("the next sequence number");
        tx.commit().unwrap();
    }
}

/// PostgreSQL by hand: a connection of the store's pool, a transaction with the store's
/// fence check and the journal's insert.
struct PostgresByHand {
    store: PostgresStore,
    insert: String,
    lease: String,
    token: FencingToken,
}

impl ByHand for PostgresByHand {
    async fn append(&mut self, persistence_id: &str, seq: u64, payload: Vec<u8>) {
        let mut conn = self.store.connection().await.expect("a connection");
        let tx = conn.transaction().await.unwrap();
        self.store
            .fence()
            .check(&tx, &self.lease, OWNER, self.token)
            .await
            .expect("fenced");
        let events = vec![payload];
        let inserted = tx
            .execute(
                self.insert.as_str(),
                &[
                    &persistence_id,
                    &(seq as i64),
                    &(self.token.get() as i64),
                    &OWNER,
                    &events,
                ],
            )
            .await
            .unwrap();
        assert_eq!(inserted, 1, "the next sequence number");
        tx.commit().await.unwrap();
    }
}

fn rounds() -> usize {
    knob("TENURE_BENCH_ROUNDS", 7, 1) as usize
}

/// 1. Append through a durable entity against the fenced insert by hand.
async fn append(stores: &Stores, mut by_hand: impl ByHand, report: &mut Report) {
    let h = host(
        stores,
        stores.journal.clone(),
        "append",
        OWNER,
        HostOptions {
            remember: false,
            snapshot_every: None,
            active: None,
        },
    )
    .await;
    // Started and recovered before timing.
    h.ask("e1", &Command::Get).await;
    let direct_pid = persistence_id("direct", "e1");
    let mut next_seq = 1;
    let per_round = size(400, 40) as u64;
    let mut r = PairedRounds::default();
    for _ in 0..rounds() {
        r.push(
            paired(
                per_round,
                async |k| {
                    timed(async || {
                        for i in 0..k {
                            h.ask("e1", &Command::Add(i)).await;
                        }
                    })
                    .await
                },
                async |k| {
                    timed(async || {
                        for i in 0..k {
                            let payload = serde_json::to_vec(&Added(i)).unwrap();
                            by_hand.append(&direct_pid, next_seq, payload).await;
                            next_seq += 1;
                        }
                    })
                    .await
                },
            )
            .await,
        );
    }
    println!(
        "{}: append through a durable entity {:>7.0}/s   fenced insert by hand {:>7.0}/s   {:.2}x slower ({} rounds of {per_round} each way in {SLICES} alternating slices, median of the rounds' ratios)",
        stores.name,
        r.ours(),
        r.base(),
        r.ratio(),
        rounds()
    );
    report.row([
        stores.name.to_string(),
        "append: command → event durable → reply".to_string(),
        format!("{:.0}/s through a durable entity", r.ours()),
        format!("{:.0}/s, the same fenced insert by hand", r.base()),
        format!("{:.2}x slower", r.ratio()),
        format!("{} rounds of {per_round} each way in {SLICES} alternating slices, median of the rounds' ratios", rounds()),
    ]);
    h.hand_off().await;
}

/// `per_task` asks to each of `entities` entities of `h`, one task per entity: how long
/// until all were answered.
async fn concurrent_asks(h: &Arc<Host>, entities: &[String], per_task: u64) -> Duration {
    timed(async || {
        let tasks: Vec<_> = entities
            .iter()
            .map(|e| {
                let (h, e) = (h.clone(), e.clone());
                tokio::spawn(async move {
                    for i in 0..per_task {
                        h.ask(&e, &Command::Add(i)).await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("an asking task");
        }
    })
    .await
}

/// 2. Group commit against one transaction per append, under concurrency.
async fn group_commit(stores: &Stores, report: &mut Report) {
    let options = || HostOptions {
        remember: false,
        snapshot_every: None,
        active: None,
    };
    let grouped = Arc::new(host(stores, stores.journal.clone(), "grouped", OWNER, options()).await);
    let single = Arc::new(host(stores, stores.single.clone(), "single", OWNER, options()).await);
    let concurrency = size(32, 8);
    let entities: Vec<String> = (0..concurrency).map(|i| format!("e{i}")).collect();
    for e in &entities {
        grouped.ask(e, &Command::Get).await;
        single.ask(e, &Command::Get).await;
    }
    let per_round = size(1280, 160) as u64;
    let mut r = PairedRounds::default();
    for _ in 0..rounds() {
        r.push(
            paired(
                per_round,
                async |k| concurrent_asks(&single, &entities, k / concurrency as u64).await,
                async |k| concurrent_asks(&grouped, &entities, k / concurrency as u64).await,
            )
            .await,
        );
    }
    println!(
        "{}: {concurrency} entities asked at once: group commit {:>7.0} appends/s   one transaction per append {:>7.0}/s   group commit {:.2}x faster ({} rounds of {per_round} each way in {SLICES} alternating slices)",
        stores.name,
        r.base(),
        r.ours(),
        r.ratio(),
        rounds()
    );
    report.row([
        stores.name.to_string(),
        format!("group commit: {concurrency} entities asked at once"),
        format!("{:.0} appends/s, group commit", r.base()),
        format!("{:.0}/s, one transaction per append", r.ours()),
        format!("{:.2}x faster", r.ratio()),
        format!("{} rounds of {per_round} each way in {SLICES} alternating slices, median of the rounds' ratios", rounds()),
    ]);
    grouped.hand_off().await;
    single.hand_off().await;
}

/// 3. Recovery of remembered entities on the next host after a hand-off.
async fn recovery(stores: &Stores, report: &mut Report) {
    let entities = size(1000, 20);
    let events = size(100, 10) as u64;
    let every = NonZeroU64::new(events / 2);
    let options = || HostOptions {
        remember: true,
        snapshot_every: every,
        active: None,
    };
    let ids: Vec<String> = (0..entities).map(|i| format!("e{i}")).collect();
    let a = Arc::new(host(stores, stores.journal.clone(), "recover", OWNER, options()).await);
    let started = Instant::now();
    concurrent_asks(&a, &ids, events).await;
    let filled = started.elapsed();
    a.hand_off().await;

    // By hand: the latest snapshot and the events after it, for every entity at once.
    let journal = stores.journal.clone();
    let by_hand = timed(async || {
        let tasks: Vec<_> = ids
            .iter()
            .map(|id| {
                let (journal, pid) = (journal.clone(), persistence_id("recover", id));
                tokio::spawn(async move {
                    let snapshot = journal.load_snapshot(&pid).await.unwrap();
                    let (mut total, from) = match snapshot {
                        Some(s) => (
                            serde_json::from_slice::<Total>(&s.payload).unwrap(),
                            s.seq + 1,
                        ),
                        None => (Total::default(), 1),
                    };
                    for e in journal.read(&pid, from, 1000).await.unwrap() {
                        let Added(n) = serde_json::from_slice(&e.payload).unwrap();
                        total.events += 1;
                        total.sum += n;
                    }
                    assert_eq!(total.events, events);
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;

    let expected = Total {
        events,
        sum: (0..events).sum(),
    };
    let started = Instant::now();
    let b = Arc::new(
        host(
            stores,
            stores.journal.clone(),
            "recover",
            NEXT_HOST,
            options(),
        )
        .await,
    );
    let granted = started.elapsed();
    let tasks: Vec<_> = ids
        .iter()
        .map(|id| {
            let (b, id) = (b.clone(), id.clone());
            tokio::spawn(async move {
                let total = b.ask(&id, &Command::Get).await;
                assert_eq!(total, expected, "{id} recovered");
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("a recovered entity");
    }
    let recovered = started.elapsed();
    println!(
        "{}: recovery of {entities} remembered entities x {events} events (a snapshot every {}) on the next host after a hand-off, in one process: lease granted after {:.0} ms, then every entity answering with its recovered state {:.0} ms later, vs {:.0} ms for the same snapshot loads and event reads by hand: {:.2}x (journal filled in {:.1} s)",
        stores.name,
        every.map_or(0, NonZeroU64::get),
        granted.as_secs_f64() * 1e3,
        (recovered - granted).as_secs_f64() * 1e3,
        by_hand.as_secs_f64() * 1e3,
        (recovered - granted).as_secs_f64() / by_hand.as_secs_f64(),
        filled.as_secs_f64()
    );
    report.row([
        stores.name.to_string(),
        format!("recovery: {entities} remembered entities × {events} events, a snapshot every {}, after a hand-off in one process", every.map_or(0, NonZeroU64::get)),
        format!("lease granted after {:.0} ms, then all answering {:.0} ms later", granted.as_secs_f64() * 1e3, (recovered - granted).as_secs_f64() * 1e3),
        format!("{:.0} ms, the same loads and reads by hand", by_hand.as_secs_f64() * 1e3),
        format!("{:.2}x", (recovered - granted).as_secs_f64() / by_hand.as_secs_f64()),
        format!("journal filled in {:.1} s", filled.as_secs_f64()),
    ]);
    b.hand_off().await;
}

/// Resident memory of this process, in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm's resident pages");
    // 4 KiB pages (x86_64).
    pages * 4096
}

const RSS_LIMIT: u64 = 2 << 30;

/// 4. Memory under an active-entity limit.
async fn memory(stores: &Stores, report: &mut Report) {
    let limit = size(10_000, 100);
    let touched = size(100_000, 1_000);
    let step = size(10_000, 100);
    // As many at once as the journal keeps read connections (4): more would have each
    // recovery beyond them open a connection of its own.
    let concurrency = 4;
    let h = Arc::new(
        host(
            stores,
            stores.journal.clone(),
            "memory",
            OWNER,
            HostOptions {
                remember: false,
                snapshot_every: None,
                active: Some(ActiveEntities::new(limit)),
            },
        )
        .await,
    );
    let mut last = rss();
    let start = last;
    let mut line = Vec::new();
    let mut next = 0;
    while next < touched {
        // One event to each of `step` new entities, `concurrency` at a time.
        let batch: Vec<String> = (next..next + step).map(|i| format!("m{i}")).collect();
        for chunk in batch.chunks(concurrency) {
            let tasks: Vec<_> = chunk
                .iter()
                .map(|id| {
                    let (h, id) = (h.clone(), id.clone());
                    tokio::spawn(async move { h.ask(&id, &Command::Add(1)).await })
                })
                .collect();
            for t in tasks {
                t.await.expect("an asking task");
            }
            if rss() > RSS_LIMIT {
                println!(
                    "{}: memory: stopped at {} entities touched, resident memory {} MiB passed the bench's bound of {} MiB",
                    stores.name,
                    next,
                    rss() >> 20,
                    RSS_LIMIT >> 20
                );
                report.note(format!(
                    "{}: memory with active-entity-limit {limit}: stopped at {next} entities touched, resident memory past the bench's bound of {} MiB.",
                    stores.name,
                    RSS_LIMIT >> 20
                ));
                return;
            }
        }
        next += step;
        let now = rss();
        let running = h.status().await.entities.len();
        line.push(format!(
            "{next}: {:+.1} MB ({running} running)",
            (now as f64 - last as f64) / 1e6
        ));
        last = now;
    }
    println!(
        "{}: memory with active-entity-limit {limit}, {touched} entities touched (one event each), resident memory per {step} touched: {}; {:.1} MB in all ({:.0} MB resident at the end)",
        stores.name,
        line.join(", "),
        (last as f64 - start as f64) / 1e6,
        last as f64 / 1e6
    );
    report.note(format!(
        "{}: memory with active-entity-limit {limit}, {touched} entities touched (one event each), resident memory per {step} touched: {}; {:.1} MB in all ({:.0} MB resident at the end).",
        stores.name,
        line.join(", "),
        (last as f64 - start as f64) / 1e6,
        last as f64 / 1e6
    ));
    h.hand_off().await;
}

async fn run(
    stores: &Stores,
    by_hand: impl ByHand,
    part: Option<&str>,
    memory_too: bool,
    report: &mut Report,
) {
    let want = |p: &str| part.is_none_or(|w| w == p);
    if want("append") {
        append(stores, by_hand, report).await;
    }
    if want("group") {
        group_commit(stores, report).await;
    }
    if want("recovery") {
        recovery(stores, report).await;
    }
    if memory_too && want("memory") {
        memory(stores, report).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    tenure_lease_kit::bench::answer_test_runner();
    let part = std::env::var("TENURE_BENCH_PART").ok();
    let part = part.as_deref();
    if smoke() {
        println!("durable bench: smoke run (small sizes)");
    }
    let mut report = Report::new(
        "durable",
        "cargo bench -p tenure-sharding --bench durable",
        &[
            "store",
            "part",
            "through Tenure",
            "baseline",
            "ratio",
            "how",
        ],
    );

    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("leases.sqlite");
    let leases: Arc<dyn LeaseStore> =
        Arc::new(SqliteStore::open(&path, BUSY).expect("the lease store"));
    let journal = SqliteJournal::open(&path, BUSY).expect("the journal");
    let single = SqliteJournal::open(&path, BUSY)
        .expect("the journal")
        .with_max_batch(1);
    let sqlite = Stores {
        name: "SQLite",
        leases: leases.clone(),
        journal: Arc::new(journal),
        single: Arc::new(single),
    };
    let token = grant(leases.as_ref(), "bench-direct").await;
    run(
        &sqlite,
        SqliteByHand::open(&path, "bench-direct", token),
        part,
        true,
        &mut report,
    )
    .await;

    let server = tokio::task::spawn_blocking(PgServer::start)
        .await
        .expect("the PostgreSQL server");
    let fsync = std::env::var("TENURE_BENCH_PG_FSYNC").is_ok_and(|v| v == "on");
    let server = if fsync {
        tokio::task::spawn_blocking(move || {
            server.with_fsync();
            server
        })
        .await
        .expect("the server restarted with fsync on")
    } else {
        server
    };
    let mut connection = server.connection();
    connection.connect_timeout(Duration::from_secs(10));
    let options = PostgresOptions::new(connection, Duration::from_secs(10));
    let store = PostgresStore::connect(options).await.expect("connect");
    let shown: String = store
        .connection()
        .await
        .expect("a connection")
        .query_one("SHOW fsync", &[])
        .await
        .expect("the server's fsync")
        .get(0);
    assert_eq!(
        shown,
        if fsync { "on" } else { "off" },
        "the server's fsync"
    );
    let journal = PostgresJournal::open(&store).await.expect("the journal");
    let single = PostgresJournal::open(&store)
        .await
        .expect("the journal")
        .with_max_batch(1);
    let insert = journal.statements().insert.clone();
    let leases: Arc<dyn LeaseStore> = Arc::new(store.clone());
    let postgres = Stores {
        name: "PostgreSQL",
        leases: leases.clone(),
        journal: Arc::new(journal),
        single: Arc::new(single),
    };
    let token = grant(leases.as_ref(), "bench-direct").await;
    let by_hand = PostgresByHand {
        store,
        insert,
        lease: "bench-direct".into(),
        token,
    };
    run(&postgres, by_hand, part, false, &mut report).await;
    let flushed = if fsync {
        "fsync on (TENURE_BENCH_PG_FSYNC=on: every commit flushed to disk)"
    } else {
        "fsync off (commits are not flushed to disk)"
    };
    println!("(PostgreSQL: the test kit's server, {flushed})");
    report.note(format!("SQLite: the journal in the lease file, `synchronous = FULL`. PostgreSQL: the test kit's server on loopback, {flushed}."));
    report.finish().expect("the report");
}
