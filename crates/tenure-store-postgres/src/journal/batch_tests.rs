//! The batched writer against the savepoint writer and against one transaction per write,
//! on a real server (Debian's `postgresql`): same answers, same journal, and a number of
//! statements that does not grow with the batch.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tenure_journal::group::Write;
use tenure_journal::{Append, Fence, Journal, JournalError, SaveSnapshot, Written};
use tenure_lease::{AcquireOutcome, AcquireRequest, LeaseStore};
use tenure_test_kit::eventually_async;
use tenure_test_kit::postgres::{Exclusive, PgServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::PostgresJournal;
use super::writer::{Mode, write_all};
use crate::{PostgresOptions, PostgresStore};

const TIMEOUT: Duration = Duration::from_secs(30);

/// A store on `table` of `server` through `port` (the server's or a proxy's).
async fn store(server: &PgServer, port: u16, table: &str, pool_size: usize) -> PostgresStore {
    let mut connection = server.connection_via(port);
    connection.connect_timeout(TIMEOUT);
    let mut options = PostgresOptions::new(connection, TIMEOUT);
    options.table = table.into();
    options.pool_size = pool_size;
    PostgresStore::connect(options).await.expect("connect")
}

async fn grant(store: &PostgresStore, lease: &str, owner: &str) -> Fence {
    let request = AcquireRequest {
        name: lease.into(),
        owner: owner.into(),
        instance: format!("{owner}-instance"),
        ttl: Duration::from_secs(600),
        ..AcquireRequest::default()
    };
    match store.try_acquire(&request).await.expect("acquire") {
        AcquireOutcome::Granted(r) => Fence::new(lease, owner, r.token),
        AcquireOutcome::Held(_) => panic!("{lease} is held"),
    }
}

fn append(pid: &str, first_seq: u64, events: &[&str], fence: &Fence) -> Write {
    Write::Append(Append {
        persistence_id: pid.into(),
        first_seq,
        events: events.iter().map(|e| e.as_bytes().to_vec()).collect(),
        fence: fence.clone(),
    })
}

fn snapshot(pid: &str, seq: u64, payload: &str, fence: &Fence) -> Write {
    Write::Snapshot(SaveSnapshot {
        persistence_id: pid.into(),
        seq,
        payload: payload.as_bytes().to_vec(),
        fence: fence.clone(),
    })
}

/// What a way of writing left: every answer, and per persistence id its events (seq,
/// token, writer, payload) and its snapshot (seq, token, payload).
type Left = (
    Vec<Result<Written, String>>,
    Vec<(
        String,
        Vec<(u64, u64, String, Vec<u8>)>,
        Option<(u64, u64, Vec<u8>)>,
    )>,
);

const PIDS: [&str; 6] = ["p1", "p2", "p3", "p4", "p5", "p6"];

/// The mixed batch on its own lease table (so that each way gets the same tokens and
/// names), written `way`: the whole batch batched, the whole batch one savepoint per
/// write, or each write alone in its own transaction.
async fn mixed(server: &PgServer, table: &str, way: &str) -> Left {
    let store = store(server, server.port(), table, 4).await;
    let journal = PostgresJournal::open(&store).await.expect("the journal");
    let live = grant(&store, "shard-1", "node-a").await;
    let other = grant(&store, "shard-2", "node-a").await;
    let gone = grant(&store, "shard-3", "node-a").await;
    assert!(
        store
            .release(&gone.lease, &gone.owner, gone.token)
            .await
            .expect("release")
    );
    let impostor = Fence::new("shard-1", "node-b", live.token);
    let before = journal
        .append(Append {
            persistence_id: "p1".into(),
            first_seq: 1,
            events: vec![b"e1".to_vec(), b"e2".to_vec(), b"e3".to_vec()],
            fence: live.clone(),
        })
        .await
        .expect("the events before");
    assert_eq!(before, Written::Appended(1..=3));
    let batch = [
        append("p1", 4, &["p1-4"], &live),
        append("p2", 1, &["p2-1", "p2-2"], &live),
        // A stale token, then a good write to the same journal under another grant.
        append("p3", 1, &["stale"], &gone),
        append("p3", 1, &["p3-1"], &other),
        // Out of sequence: skips one, then the right one.
        append("p1", 6, &["skipped"], &live),
        append("p1", 5, &["p1-5"], &live),
        snapshot("p1", 5, "s1-5", &live),
        // An older snapshot after it: answered, not kept.
        snapshot("p1", 4, "s1-4", &live),
        snapshot("p2", 3, "beyond", &live),
        snapshot("p4", 1, "stale", &gone),
        append("p2", 3, &["impostor"], &impostor),
        append("p2", 3, &["p2-3"], &live),
        append("p5", 2, &["gap"], &live),
        // A repeated sequence number after the batch's own append.
        append("p2", 3, &["again"], &live),
        snapshot("p2", 2, "s2-2", &other),
        append("p6", 1, &["p6-1", "p6-2", "p6-3"], &other),
    ];
    let writes: Vec<&Write> = batch.iter().collect();
    let answers = match way {
        "batched" => write_all(&journal.shared, &writes, Mode::Batched).await,
        "savepoints" => write_all(&journal.shared, &writes, Mode::Savepoints).await,
        "one by one" => {
            let mut answers = Vec::new();
            for w in &writes {
                answers.extend(write_all(&journal.shared, &[*w], Mode::Savepoints).await);
            }
            answers
        }
        other => panic!("no way {other}"),
    };
    let answers = answers
        .into_iter()
        .map(|a| a.map_err(|e: JournalError| e.to_string()))
        .collect();
    let mut journals = Vec::new();
    for pid in PIDS {
        let events = journal.read(pid, 1, 100).await.expect("read");
        let events = events
            .into_iter()
            .map(|e| (e.seq, e.token.get(), e.writer, e.payload))
            .collect();
        let kept = journal.load_snapshot(pid).await.expect("load");
        let kept = kept.map(|s| (s.seq, s.token.get(), s.payload));
        journals.push((pid.to_string(), events, kept));
    }
    (answers, journals)
}

/// A batch mixing good writes, a stale token, an impostor, out-of-sequence appends,
/// snapshots (kept, older, beyond the journal, stale) answers each write as one
/// transaction per write does, and leaves the same journal; so does the savepoint writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_batch_answers_each_write_as_one_by_one() {
    let exclusive = Exclusive::start().await;
    let server = &exclusive.server;
    let alone = mixed(server, "alone", "one by one").await;
    let batched = mixed(server, "batched", "batched").await;
    let savepoints = mixed(server, "savepoints", "savepoints").await;
    // The reference itself is what the batch was written to show.
    let refused = alone
        .0
        .iter()
        .filter(|a| matches!(a, Ok(Written::Refused(_))))
        .count();
    assert_eq!(refused, 7, "{:#?}", alone.0);
    assert!(alone.0.iter().all(Result::is_ok), "{:#?}", alone.0);
    assert_eq!(batched.0, alone.0, "answers, batched");
    assert_eq!(batched.1, alone.1, "journals, batched");
    assert_eq!(savepoints, alone, "savepoints");
}

/// A TCP proxy that counts the statements a client sends: its simple queries and the
/// `Sync`s that end its extended-protocol requests, each a request the client waits on.
struct StatementCounter {
    port: u16,
    sent: Arc<AtomicUsize>,
}

impl StatementCounter {
    async fn start(upstream: u16) -> StatementCounter {
        // Bound to port 0 and held: no other process can take it.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("the proxy's address").port();
        let sent = Arc::new(AtomicUsize::new(0));
        let counted = sent.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = tokio::net::TcpStream::connect(("127.0.0.1", upstream))
                    .await
                    .expect("connect to the server");
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, to_server) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                });
                let counted = counted.clone();
                tokio::spawn(async move {
                    let _ = count_frontend(&mut from_client, to_server, &counted).await;
                });
            }
        });
        StatementCounter { port, sent }
    }

    fn sent(&self) -> usize {
        self.sent.load(Ordering::SeqCst)
    }
}

/// Forwards the frontend's messages to `to`, counting `Q` and `S` messages: first the
/// untyped start-up messages (an SSL or GSS request before the start-up itself), then
/// typed ones.
async fn count_frontend(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    sent: &AtomicUsize,
) -> std::io::Result<()> {
    const SSL_REQUEST: u32 = 80877103;
    const GSS_REQUEST: u32 = 80877104;
    loop {
        let len = from.read_u32().await?;
        let mut body = vec![0; (len as usize).saturating_sub(4)];
        from.read_exact(&mut body).await?;
        to.write_all(&len.to_be_bytes()).await?;
        to.write_all(&body).await?;
        let code = body
            .get(..4)
            .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
        if code != Some(SSL_REQUEST) && code != Some(GSS_REQUEST) {
            break;
        }
    }
    loop {
        let kind = from.read_u8().await?;
        let len = from.read_u32().await?;
        let mut body = vec![0; (len as usize).saturating_sub(4)];
        from.read_exact(&mut body).await?;
        if kind == b'Q' || kind == b'S' {
            sent.fetch_add(1, Ordering::SeqCst);
        }
        to.write_all(&[kind]).await?;
        to.write_all(&len.to_be_bytes()).await?;
        to.write_all(&body).await?;
    }
}

/// A batch of `size` writes to fresh journals: appends (one refused as out of sequence,
/// one under a stale token), each journal's snapshot.
fn sized_batch(tag: &str, size: usize, live: &Fence, gone: &Fence) -> Vec<Write> {
    let mut batch = Vec::new();
    for i in 0..size {
        let pid = format!("{tag}-{}", i / 2);
        batch.push(match i % 8 {
            5 => append(&pid, 9, &["gap"], live),
            6 => append(&pid, 1, &["stale"], gone),
            7 => snapshot(&format!("{tag}-{}", i / 2 - 1), 1, "s", live),
            k => append(&pid, 1 + (k as u64 % 2), &["e"], live),
        });
    }
    batch
}

/// The statements a batch costs do not grow with its size: a batch of 64 writes sends
/// as many as a batch of 8 (appends, refusals, snapshots alike), each after a first batch
/// that prepared the statements on the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_costs_the_same_statements_whatever_its_size() {
    let exclusive = Exclusive::start().await;
    let server = &exclusive.server;
    let counter = StatementCounter::start(server.port()).await;
    // One connection, through the proxy: every statement of the journal is counted.
    let store = store(server, counter.port, "sized", 1).await;
    let journal = PostgresJournal::open(&store).await.expect("the journal");
    let live = grant(&store, "shard-1", "node-a").await;
    let gone = grant(&store, "shard-2", "node-a").await;
    assert!(
        store
            .release(&gone.lease, &gone.owner, gone.token)
            .await
            .expect("release")
    );
    let mut costs = Vec::new();
    for (tag, size) in [("warm", 8), ("small", 8), ("large", 64)] {
        let batch = sized_batch(tag, size, &live, &gone);
        let writes: Vec<&Write> = batch.iter().collect();
        let before = counter.sent();
        let answers = write_all(&journal.shared, &writes, Mode::Batched).await;
        costs.push(counter.sent() - before);
        let appended = answers
            .iter()
            .filter(|a| matches!(a, Ok(Written::Appended(_))))
            .count();
        assert_eq!(appended, size - size / 4, "{tag}: {answers:#?}");
    }
    println!(
        "statements per batch: first 8 writes {}, 8 writes {}, 64 writes {}",
        costs[0], costs[1], costs[2]
    );
    assert_eq!(
        costs[2], costs[1],
        "statements for 64 writes against 8 (after a first batch of 8 that cost {})",
        costs[0]
    );
}

/// Another transaction writes one of the batch's sequence numbers between the batch's read
/// and its insert: that write is refused as a sequence conflict, the others committed,
/// as one transaction per write would have answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_writer_between_read_and_insert_is_answered_exactly() {
    let exclusive = Exclusive::start().await;
    let server = &exclusive.server;
    let store = store(server, server.port(), "raced", 4).await;
    let journal = PostgresJournal::open(&store).await.expect("the journal");
    let live = grant(&store, "shard-1", "node-a").await;
    let first = journal
        .append(Append {
            persistence_id: "q".into(),
            first_seq: 1,
            events: vec![b"q1".to_vec(), b"q2".to_vec()],
            fence: live.clone(),
        })
        .await
        .expect("append");
    assert_eq!(first, Written::Appended(1..=2));
    // The intruder's event 3 of `q`, written and not yet committed: the batch's read does
    // not see it, its insert waits for it.
    let mut intruder = store.connection().await.expect("a connection");
    let tx = intruder.transaction().await.expect("begin");
    let token = live.token.get() as i64;
    let inserted = tx
        .execute(
            journal.statements().insert.as_str(),
            &[&"q", &3i64, &token, &"intruder", &vec![b"q3".to_vec()]],
        )
        .await
        .expect("the intruder's insert");
    assert_eq!(inserted, 1);
    let batch = Arc::new([
        append("q", 3, &["mine"], &live),
        append("r", 1, &["r1"], &live),
        snapshot("q", 2, "s2", &live),
    ]);
    let writer = {
        let (shared, batch) = (journal.shared.clone(), batch.clone());
        tokio::spawn(async move {
            let writes: Vec<&Write> = batch.iter().collect();
            write_all(&shared, &writes, Mode::Batched).await
        })
    };
    let watcher = store.connection().await.expect("a connection");
    eventually_async(
        "the batch's insert waiting for the intruder",
        TIMEOUT,
        async || {
            let waiting: i64 = watcher
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO%raced_journal%'",
                    &[],
                )
                .await
                .expect("pg_stat_activity")
                .get(0);
            if waiting == 1 { Ok(()) } else { Err(waiting) }
        },
    )
    .await;
    tx.commit().await.expect("the intruder's commit");
    let answers = writer.await.expect("the writer");
    assert_eq!(
        answers
            .into_iter()
            .map(|a| a.expect("answered"))
            .collect::<Vec<_>>(),
        [
            Written::Refused(tenure_journal::Refusal::SequenceConflict {
                persistence_id: "q".into(),
                expected: 3,
                next: 4
            }),
            Written::Appended(1..=1),
            Written::Appended(2..=2),
        ]
    );
    let q: Vec<_> = journal
        .read("q", 1, 10)
        .await
        .expect("read")
        .into_iter()
        .map(|e| (e.seq, e.writer))
        .collect();
    assert_eq!(
        q,
        [
            (1, "node-a".into()),
            (2, "node-a".into()),
            (3, "intruder".into())
        ]
    );
    assert_eq!(journal.read("r", 1, 10).await.expect("read").len(), 1);
    let kept = journal
        .load_snapshot("q")
        .await
        .expect("load")
        .expect("kept");
    assert_eq!(kept.seq, 2);
}
