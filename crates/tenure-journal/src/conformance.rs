//! The journal conformance kit: one suite every journal runs against itself, with a real
//! database (server started by the crate's harness). Enable feature `conformance` in
//! dev-dependencies and invoke [`journal_conformance_tests!`](crate::journal_conformance_tests):
//!
//! ```text
//! tenure_journal::journal_conformance_tests!(async { MyHarness::start().await });
//! ```
//!
//! Assertions are about what was written and refused, never about how fast.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tenure_lease::{AcquireOutcome, AcquireRequest, FencingToken, LeaseStore};

use crate::{
    Append, Fence, Journal, JournalError, Refusal, SaveSnapshot, StoredEvent, Written, read_all,
};

/// A journal under test and the lease store it is fenced by.
#[async_trait]
pub trait JournalHarness: Send + Sync + 'static {
    /// A new client of the lease store the journal is fenced by (its own connection, as
    /// another process would open it).
    async fn leases(&self) -> Arc<dyn LeaseStore>;
    /// A new client of the journal (its own connection and writer, as another process
    /// would open it), fenced by the same leases.
    async fn journal(&self) -> Arc<dyn Journal>;
}

/// A lease name no other case or run uses (the database may be shared).
fn unique(case: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "journal-kit-{case}-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn request(name: &str, owner: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(name, owner, format!("{owner}-instance"), ttl)
}

/// Acquires `name` for `owner` with `ttl`, waiting (at most ten ttls) while another holds it.
async fn grant(store: &dyn LeaseStore, name: &str, owner: &str, ttl: Duration) -> Fence {
    let req = request(name, owner, ttl);
    let started = tokio::time::Instant::now();
    loop {
        match store.try_acquire(&req).await.expect("acquire") {
            AcquireOutcome::Granted(r) => return Fence::new(name, owner, r.token),
            AcquireOutcome::Held(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
        assert!(
            started.elapsed() < ttl.max(Duration::from_secs(1)) * 10,
            "{name}: never granted to {owner}"
        );
    }
}

async fn release(store: &dyn LeaseStore, fence: &Fence) {
    assert!(
        store
            .release(&fence.lease, &fence.owner, fence.token)
            .await
            .expect("release"),
        "{}: release by {} refused",
        fence.lease,
        fence.owner
    );
}

const LONG: Duration = Duration::from_secs(60);

fn append(pid: &str, first_seq: u64, events: &[&str], fence: &Fence) -> Append {
    Append {
        persistence_id: pid.into(),
        first_seq,
        events: events.iter().map(|e| e.as_bytes().to_vec()).collect(),
        fence: fence.clone(),
    }
}

fn appended(w: Result<Written, JournalError>) -> std::ops::RangeInclusive<u64> {
    match w {
        Ok(Written::Appended(r)) => r,
        other => panic!("expected the append to be committed, got {other:?}"),
    }
}

fn refused(w: Result<Written, JournalError>) -> Refusal {
    match w {
        Ok(Written::Refused(r)) => r,
        other => panic!("expected the write to be refused, got {other:?}"),
    }
}

fn seqs(events: &[StoredEvent]) -> Vec<u64> {
    events.iter().map(|e| e.seq).collect()
}

/// Sequence numbers run 1, 2, 3… whoever writes: an append must name the next one (a
/// repeated or skipped number is refused), and the next holder of the lease continues
/// where the previous one stopped. Events keep their payload, token and writer.
pub async fn contiguous_whoever_writes(h: &impl JournalHarness) {
    let (leases, journal, other) = (h.leases().await, h.journal().await, h.journal().await);
    let (lease, pid) = (unique("contiguous"), unique("contiguous-pid"));
    let a = grant(&*leases, &lease, "node-a", LONG).await;
    assert_eq!(
        appended(journal.append(append(&pid, 1, &["e1", "e2"], &a)).await),
        1..=2
    );
    assert_eq!(
        appended(journal.append(append(&pid, 3, &["e3"], &a)).await),
        3..=3
    );
    for (first, name) in [(3, "repeated"), (5, "skipped"), (1, "restarted")] {
        let r = refused(journal.append(append(&pid, first, &["x"], &a)).await);
        assert_eq!(
            r,
            Refusal::SequenceConflict {
                persistence_id: pid.clone(),
                expected: first,
                next: 4
            },
            "a {name} sequence number"
        );
    }
    release(&*leases, &a).await;
    let b = grant(&*leases, &lease, "node-b", LONG).await;
    assert!(b.token > a.token);
    assert_eq!(
        appended(other.append(append(&pid, 4, &["e4", "e5"], &b)).await),
        4..=5
    );
    let events = read_all(&*journal, &pid, 1, 2).await.expect("read");
    assert_eq!(seqs(&events), [1, 2, 3, 4, 5]);
    let payloads: Vec<&[u8]> = events.iter().map(|e| e.payload.as_slice()).collect();
    assert_eq!(
        payloads,
        [&b"e1"[..], b"e2", b"e3", b"e4", b"e5"],
        "payloads kept"
    );
    let owners: Vec<(&str, FencingToken)> = events
        .iter()
        .map(|e| (e.writer.as_str(), e.token))
        .collect();
    assert_eq!(
        owners,
        [
            ("node-a", a.token),
            ("node-a", a.token),
            ("node-a", a.token),
            ("node-b", b.token),
            ("node-b", b.token)
        ]
    );
    let page = journal.read(&pid, 3, 1).await.expect("read a page");
    assert_eq!(seqs(&page), [3]);
    assert!(journal.read(&pid, 6, 10).await.expect("read").is_empty());
    assert!(
        journal
            .read(&unique("nobody"), 1, 10)
            .await
            .expect("read")
            .is_empty()
    );
}

/// An append under a grant that is not current is refused, however right its sequence
/// number: after a release and a new grant to another owner, after the grant expired
/// with nobody holding the lease, and under another owner's name with the right token.
/// Nothing refused is written.
pub async fn stale_token_refused(h: &impl JournalHarness) {
    let (leases, journal) = (h.leases().await, h.journal().await);
    let (lease, pid) = (unique("stale"), unique("stale-pid"));
    let a = grant(&*leases, &lease, "node-a", LONG).await;
    appended(journal.append(append(&pid, 1, &["a1"], &a)).await);
    release(&*leases, &a).await;
    let r = refused(journal.append(append(&pid, 2, &["a2"], &a)).await);
    assert_eq!(r, Refusal::not_held(&pid, &a), "released");
    let b = grant(&*leases, &lease, "node-b", LONG).await;
    let r = refused(journal.append(append(&pid, 2, &["a2"], &a)).await);
    assert_eq!(r, Refusal::not_held(&pid, &a), "granted to another owner");
    let impostor = Fence::new(&lease, "node-a", b.token);
    let r = refused(journal.append(append(&pid, 2, &["a2"], &impostor)).await);
    assert_eq!(
        r,
        Refusal::not_held(&pid, &impostor),
        "another owner's token"
    );
    release(&*leases, &b).await;
    // A grant that ran out with nobody after it.
    let ttl = Duration::from_millis(400);
    let c = grant(&*leases, &lease, "node-c", ttl).await;
    appended(journal.append(append(&pid, 2, &["c2"], &c)).await);
    let started = tokio::time::Instant::now();
    while leases.read(&lease).await.expect("read the lease").is_some() {
        assert!(started.elapsed() < ttl * 20, "the grant never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = refused(journal.append(append(&pid, 3, &["c3"], &c)).await);
    assert_eq!(r, Refusal::not_held(&pid, &c), "expired");
    let events = read_all(&*journal, &pid, 1, 100).await.expect("read");
    assert_eq!(seqs(&events), [1, 2], "nothing refused was written");
}

/// Two holders append at once, the current one and the one it replaced, each at the
/// journal's next sequence number from its own client: the current one's append is
/// committed and the stale one's refused, round after round. Two appends under the same
/// current grant at the same sequence number: exactly one is committed, the other refused
/// as a sequence conflict.
pub async fn concurrent_appends_one_wins(h: &impl JournalHarness) {
    let leases = h.leases().await;
    let (ja, jb) = (h.journal().await, h.journal().await);
    let (lease, pid) = (unique("concurrent"), unique("concurrent-pid"));
    let mut next = 1;
    let mut holder = grant(&*leases, &lease, "node-a", LONG).await;
    for round in 0..10 {
        let owner = if round % 2 == 0 { "node-b" } else { "node-a" };
        release(&*leases, &holder).await;
        let stale = holder;
        holder = grant(&*leases, &lease, owner, LONG).await;
        let (old, new) = (
            append(&pid, next, &["stale"], &stale),
            append(&pid, next, &["current"], &holder),
        );
        let (o, n) = tokio::join!(ja.append(old), jb.append(new));
        assert_eq!(refused(o), Refusal::not_held(&pid, &stale), "round {round}");
        assert_eq!(appended(n), next..=next, "round {round}");
        next += 1;
    }
    for round in 0..10 {
        let (x, y) = (
            append(&pid, next, &["x"], &holder),
            append(&pid, next, &["y"], &holder),
        );
        let (x, y) = tokio::join!(ja.append(x), jb.append(y));
        let (won, lost) = match (x, y) {
            (Ok(Written::Appended(r)), other) | (other, Ok(Written::Appended(r))) => (r, other),
            other => panic!("round {round}: neither append committed: {other:?}"),
        };
        assert_eq!(won, next..=next);
        assert_eq!(
            refused(lost),
            Refusal::SequenceConflict {
                persistence_id: pid.clone(),
                expected: next,
                next: next + 1
            },
            "round {round}"
        );
        next += 1;
    }
    let events = read_all(&*ja, &pid, 1, 7).await.expect("read");
    assert_eq!(seqs(&events), (1..next).collect::<Vec<_>>());
    assert!(
        events.iter().all(|e| e.payload != b"stale"),
        "no stale append was written"
    );
}

/// A holder whose grant runs out keeps appending while its successor waits for the
/// lease: once the successor is granted and has [claimed](Journal::claim) the journal,
/// none of the old holder's appends is committed, so the successor appends after the last
/// event it read, and the tokens along the
/// journal never go down.
pub async fn a_holder_racing_its_successor(h: &impl JournalHarness) {
    let leases = h.leases().await;
    let (ja, jb) = (h.journal().await, h.journal().await);
    let (lease, pid) = (unique("race"), unique("race-pid"));
    let ttl = Duration::from_millis(500);
    let old = grant(&*leases, &lease, "node-a", ttl).await;
    let writer = {
        let (journal, pid, fence) = (ja.clone(), pid.clone(), old.clone());
        tokio::spawn(async move {
            let mut next = 1;
            // A journal that never refuses would keep this loop going: it gives up long
            // after the grant ran out.
            let give_up = tokio::time::Instant::now() + ttl * 20;
            while tokio::time::Instant::now() < give_up {
                match journal.append(append(&pid, next, &["old"], &fence)).await {
                    Ok(Written::Appended(_)) => next += 1,
                    Ok(Written::Refused(r)) => return (next - 1, Some(r)),
                    Err(e) => panic!("append: {e}"),
                }
            }
            (next - 1, None)
        })
    };
    let new = grant(&*leases, &lease, "node-b", ttl * 20).await;
    assert!(
        jb.claim(&pid, &new).await.expect("claim"),
        "the successor claims the journal"
    );
    let last = read_all(&*jb, &pid, 1, 1000)
        .await
        .expect("read")
        .last()
        .map_or(0, |e| e.seq);
    assert_eq!(
        appended(jb.append(append(&pid, last + 1, &["new"], &new)).await),
        last + 1..=last + 1,
        "the successor appends after the last event it read"
    );
    let (written, why) = writer.await.expect("the old holder's writer");
    assert_eq!(
        why,
        Some(Refusal::not_held(&pid, &old)),
        "the old holder is refused"
    );
    assert_eq!(
        written, last,
        "the old holder wrote nothing after its successor read"
    );
    let events = read_all(&*ja, &pid, 1, 1000).await.expect("read");
    assert!(
        events.windows(2).all(|w| w[0].token <= w[1].token),
        "tokens never go down along the journal"
    );
    assert_eq!(events.last().map(|e| e.token), Some(new.token));
}

/// A new holder claims the journal and recovers: it reads the old holder's events, the
/// old holder's claim (when the journal looks) is refused, and so are its appends and
/// snapshots afterwards; the new holder appends after what it read.
pub async fn an_old_holder_refused_after_its_successor_claimed(h: &impl JournalHarness) {
    let leases = h.leases().await;
    let (ja, jb) = (h.journal().await, h.journal().await);
    let (lease, pid) = (unique("claim"), unique("claim-pid"));
    let old = grant(&*leases, &lease, "node-a", LONG).await;
    assert!(
        ja.claim(&pid, &old).await.expect("claim"),
        "the first holder claims"
    );
    appended(ja.append(append(&pid, 1, &["a1", "a2"], &old)).await);
    release(&*leases, &old).await;
    let new = grant(&*leases, &lease, "node-b", LONG).await;
    assert!(
        jb.claim(&pid, &new).await.expect("claim"),
        "the successor claims"
    );
    // Claiming again under the same grant (another entity of the shard) is no change.
    assert!(jb.claim(&pid, &new).await.expect("claim"), "claimed again");
    let read = read_all(&*jb, &pid, 1, 10).await.expect("read");
    assert_eq!(
        seqs(&read),
        [1, 2],
        "the successor reads the old holder's events"
    );
    // A journal whose claim does nothing answers true; one that looks refuses.
    let _ = ja.claim(&pid, &old).await.expect("claim");
    assert_eq!(
        refused(ja.append(append(&pid, 3, &["late"], &old)).await),
        Refusal::not_held(&pid, &old),
        "the old holder's append"
    );
    let late = SaveSnapshot {
        persistence_id: pid.clone(),
        seq: 2,
        payload: b"late".to_vec(),
        fence: old.clone(),
    };
    assert_eq!(
        refused(ja.save_snapshot(late).await),
        Refusal::not_held(&pid, &old),
        "the old holder's snapshot"
    );
    assert_eq!(
        appended(jb.append(append(&pid, 3, &["b3"], &new)).await),
        3..=3
    );
    let events = read_all(&*ja, &pid, 1, 10).await.expect("read");
    assert_eq!(seqs(&events), [1, 2, 3]);
    assert!(events.iter().all(|e| e.payload != b"late"));
}

/// Snapshots are fenced and the latest one is kept: a stale grant's is refused, an older
/// one does not replace a newer one, one past the journal's last event is refused.
pub async fn snapshots_latest_and_fenced(h: &impl JournalHarness) {
    let (leases, journal) = (h.leases().await, h.journal().await);
    let (lease, pid) = (unique("snapshot"), unique("snapshot-pid"));
    assert_eq!(journal.load_snapshot(&pid).await.expect("load"), None);
    let a = grant(&*leases, &lease, "node-a", LONG).await;
    appended(journal.append(append(&pid, 1, &["1", "2", "3"], &a)).await);
    let snap = |seq: u64, payload: &str, fence: &Fence| SaveSnapshot {
        persistence_id: pid.clone(),
        seq,
        payload: payload.as_bytes().to_vec(),
        fence: fence.clone(),
    };
    assert_eq!(
        journal
            .save_snapshot(snap(2, "s2", &a))
            .await
            .expect("save"),
        Written::Appended(2..=2)
    );
    journal
        .save_snapshot(snap(1, "s1", &a))
        .await
        .expect("save");
    let kept = journal
        .load_snapshot(&pid)
        .await
        .expect("load")
        .expect("a snapshot");
    assert_eq!(
        (kept.seq, kept.payload.as_slice(), kept.token),
        (2, &b"s2"[..], a.token)
    );
    assert_eq!(
        refused(journal.save_snapshot(snap(4, "s4", &a)).await),
        Refusal::SnapshotBeyondJournal {
            persistence_id: pid.clone(),
            seq: 4,
            last: 3
        }
    );
    release(&*leases, &a).await;
    assert_eq!(
        refused(journal.save_snapshot(snap(3, "s3", &a)).await),
        Refusal::not_held(&pid, &a)
    );
    let b = grant(&*leases, &lease, "node-b", LONG).await;
    journal
        .save_snapshot(snap(3, "s3", &b))
        .await
        .expect("save");
    let kept = journal
        .load_snapshot(&pid)
        .await
        .expect("load")
        .expect("a snapshot");
    assert_eq!(
        (kept.seq, kept.payload.as_slice(), kept.token),
        (3, &b"s3"[..], b.token)
    );
}

/// Requests that cannot be carried out are errors naming the persistence id, and write
/// nothing.
pub async fn invalid_requests_named(h: &impl JournalHarness) {
    let (leases, journal) = (h.leases().await, h.journal().await);
    let (lease, pid) = (unique("invalid"), unique("invalid-pid"));
    let a = grant(&*leases, &lease, "node-a", LONG).await;
    let cases = [
        (append("", 1, &["x"], &a), "empty"),
        (append("a\0b", 1, &["x"], &a), "NUL"),
        (append(&pid, 0, &["x"], &a), "start at 1"),
        (append(&pid, 1, &[], &a), "at least one event"),
        (append(&pid, i64::MAX as u64, &["x", "y"], &a), "run past"),
    ];
    for (request, expected) in cases {
        let shown = request.persistence_id.clone();
        match journal.append(request).await {
            Err(e @ JournalError::Invalid { .. }) => {
                let text = e.to_string();
                assert!(
                    text.contains(expected) && text.contains(&format!("`{shown}`")),
                    "{text}"
                );
            }
            other => panic!("{expected}: expected an invalid request, got {other:?}"),
        }
    }
    assert!(journal.read(&pid, 1, 10).await.expect("read").is_empty());
    assert!(matches!(
        journal.read("", 1, 10).await,
        Err(JournalError::Invalid { .. })
    ));
}

/// Many writers at once, each entity its own persistence id and some under grants that
/// are no longer current: every current append is committed with contiguous numbers, and
/// every stale one is refused on its own without failing the others (journals that batch
/// concurrent appends into one transaction refuse each append alone).
pub async fn concurrent_writers_refused_alone(h: &impl JournalHarness) {
    let leases = h.leases().await;
    let journal = h.journal().await;
    let (live_lease, gone_lease) = (unique("batch-live"), unique("batch-gone"));
    let live = grant(&*leases, &live_lease, "node-a", LONG).await;
    let gone = grant(&*leases, &gone_lease, "node-a", LONG).await;
    release(&*leases, &gone).await;
    let base = unique("batch-pid");
    let mut tasks = Vec::new();
    for entity in 0..16 {
        let (journal, pid) = (journal.clone(), format!("{base}-{entity}"));
        let fence = if entity % 4 == 3 {
            gone.clone()
        } else {
            live.clone()
        };
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            for seq in 1..=8u64 {
                let w = journal.append(append(&pid, seq, &["e"], &fence)).await;
                answers.push(w.expect("append"));
            }
            (pid, fence, answers)
        }));
    }
    for task in tasks {
        let (pid, fence, answers) = task.await.expect("writer");
        let events = journal.read(&pid, 1, 100).await.expect("read");
        if fence == gone {
            assert!(
                answers
                    .iter()
                    .all(|w| *w == Written::Refused(Refusal::not_held(&pid, &gone))),
                "{pid}: {answers:?}"
            );
            assert!(events.is_empty(), "{pid}: nothing written");
        } else {
            let ranges: Vec<_> = (1..=8).map(|s| Written::Appended(s..=s)).collect();
            assert_eq!(answers, ranges, "{pid}");
            assert_eq!(seqs(&events), (1..=8).collect::<Vec<_>>());
        }
    }
    let ids = journal.persistence_ids().await.expect("list");
    for entity in 0..16 {
        let pid = format!("{base}-{entity}");
        assert_eq!(
            ids.contains(&pid),
            entity % 4 != 3,
            "{pid} listed only when it has events"
        );
    }
}

/// Generates a `#[tokio::test]` per conformance case, each with a harness from
/// `$harness` (an expression giving a future of a [`JournalHarness`]).
#[macro_export]
macro_rules! journal_conformance_tests {
    (@case $harness:expr; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness = $harness.await;
                $crate::conformance::$case(&harness).await;
            }
        )*
    };
    ($harness:expr) => {
        $crate::journal_conformance_tests!(@case $harness; contiguous_whoever_writes,
            stale_token_refused, concurrent_appends_one_wins, a_holder_racing_its_successor,
            an_old_holder_refused_after_its_successor_claimed,
            snapshots_latest_and_fenced, invalid_requests_named,
            concurrent_writers_refused_alone);
    };
}
