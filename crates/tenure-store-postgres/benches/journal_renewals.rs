//! Renewals of a shard's lease while its entities append: does the journal's fence hold
//! the holder's own renewals back? Every append checks the grant of the lease it is fenced
//! by in its transaction and keeps the row locked until the commit, so that no later grant
//! commits in between; a renewal updates the same row.
//!
//! One store (its own pool) renews two leases of one owner, `fenced` and `control`, one
//! renewal at a time, alternating between them, every 5 ms. A journal (a pool of its own,
//! as another part of the node) appends under the grant of `fenced` from
//! `TENURE_BENCH_WRITERS` tasks (default 32), each its own persistence id, one event per
//! append, back to back, in every other slice of the run (20 slices: 10 with the appends,
//! 10 without, alternating). Reported: the renewal latency of `fenced` with the appends
//! against without them (the appends' load and any lock wait), and, in the same slices,
//! against `control`'s (the load alone: no append is fenced by it), p50 and p99. A ratio
//! of `fenced` to `control` near 1 means the renewals do not wait for the appends.
//!
//! Run: `cargo bench -p tenure-store-postgres --bench journal_renewals`.

#[path = "../tests/support/mod.rs"]
mod support;
use support::PgOptions;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tenure_journal::{Append, Fence, Journal, Written};
use tenure_lease::{AcquireOutcome, HeldLease, LeaseStore};
use tenure_lease_kit::bench::{knob, percentile, runtime, spi_request};
use tenure_lease_kit::report::Report;
use tenure_store_postgres::{PostgresJournal, PostgresStore};
use tenure_test_kit::postgres::PgServer;

const TTL: Duration = Duration::from_secs(60);
const OWNER: &str = "bench-owner";
const SLICES: usize = 20;
const RENEW_EVERY: Duration = Duration::from_millis(5);

fn main() {
    tenure_lease_kit::bench::answer_test_runner();
    let writers = knob("TENURE_BENCH_WRITERS", 32, 4) as usize;
    let per_slice = knob("TENURE_BENCH_RENEWALS", 100, 5) as usize;
    let server = PgServer::start();
    let rt = runtime().expect("runtime");
    rt.block_on(run(&server, writers, per_slice));
}

async fn run(server: &PgServer, writers: usize, per_slice: usize) {
    let options = || server.options(Duration::from_secs(10));
    let store = PostgresStore::connect(options()).await.expect("connect");
    let journal = PostgresJournal::open(&PostgresStore::connect(options()).await.expect("connect"))
        .await
        .expect("open the journal");
    let fenced = grant(&store, "fenced").await;
    let control = grant(&store, "control").await;

    let appending = Arc::new(AtomicBool::new(false));
    let appended = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..writers)
        .map(|i| {
            let (journal, appending, appended, stop) = (
                journal.clone(),
                appending.clone(),
                appended.clone(),
                stop.clone(),
            );
            let fence = Fence::new("fenced", OWNER, fenced.token);
            tokio::spawn(async move {
                let mut next = 1;
                while !stop.load(Ordering::Relaxed) {
                    if !appending.load(Ordering::Relaxed) {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                    let append = Append {
                        persistence_id: format!("entity-{i}"),
                        first_seq: next,
                        events: vec![vec![7; 32]],
                        fence: fence.clone(),
                    };
                    match journal.append(append).await {
                        Ok(Written::Appended(_)) => {
                            next += 1;
                            appended.fetch_add(1, Ordering::Relaxed);
                        }
                        other => panic!("append of entity-{i} at {next}: {other:?}"),
                    }
                }
            })
        })
        .collect();

    // (fenced, control) renewal latencies, with the appends and without.
    let mut with = (Vec::new(), Vec::new());
    let mut without = (Vec::new(), Vec::new());
    let mut append_time = Duration::ZERO;
    for slice in 0..SLICES {
        let on = slice % 2 == 0;
        appending.store(on, Ordering::Relaxed);
        // Let the writers reach full speed (or drain) before timing.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (started, before) = (Instant::now(), appended.load(Ordering::Relaxed));
        let into = if on { &mut with } else { &mut without };
        for _ in 0..per_slice {
            into.0.push(renew(&store, &fenced).await);
            tokio::time::sleep(RENEW_EVERY).await;
            into.1.push(renew(&store, &control).await);
            tokio::time::sleep(RENEW_EVERY).await;
        }
        if on {
            append_time += started.elapsed();
            assert!(
                appended.load(Ordering::Relaxed) > before,
                "no append completed during slice {slice}"
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("a writer task");
    }

    let total = appended.load(Ordering::Relaxed);
    println!(
        "journal_renewals: {writers} writers, {} renewals of each lease per way, {total} appends ({:.0}/s while appending)",
        with.0.len(),
        total as f64 / append_time.as_secs_f64()
    );
    let (wf, wc, of, oc) = (
        sorted(with.0),
        sorted(with.1),
        sorted(without.0),
        sorted(without.1),
    );
    let mut report = Report::new(
        "journal_renewals",
        "cargo bench -p tenure-store-postgres --bench journal_renewals",
        &[
            "percentile",
            "fenced, with appends",
            "fenced, without",
            "control, with appends",
            "control, without",
            "fenced / control, with appends",
        ],
    );
    for (label, pct) in [("p50", 50), ("p99", 99)] {
        let at = |v: &[Duration]| percentile(v, pct).expect("renewals").as_secs_f64() * 1e3;
        report.row([
            label.to_string(),
            format!("{:.2} ms", at(&wf)),
            format!("{:.2} ms ({:.2}x)", at(&of), at(&wf) / at(&of)),
            format!("{:.2} ms", at(&wc)),
            format!("{:.2} ms ({:.2}x)", at(&oc), at(&wc) / at(&oc)),
            format!("{:.2}x", at(&wf) / at(&wc)),
        ]);
        println!(
            "  {label}: fenced {:.2} ms with appends, {:.2} ms without ({:.2}x); control {:.2} ms with appends ({:.2}x), {:.2} ms without; fenced / control with appends {:.2}x",
            at(&wf),
            at(&of),
            at(&wf) / at(&of),
            at(&wc),
            at(&wc) / at(&oc),
            at(&oc),
            at(&wf) / at(&wc),
        );
    }
    report.note(format!(
        "{writers} writers appending back to back under `fenced`'s grant in every other slice, {} renewals of each lease per way, {total} appends ({:.0}/s while appending); in brackets, with / without appends.",
        wf.len(),
        total as f64 / append_time.as_secs_f64()
    ));
    report.finish().expect("the report");
}

fn sorted(mut v: Vec<Duration>) -> Vec<Duration> {
    v.sort();
    v
}

async fn grant(store: &PostgresStore, name: &str) -> HeldLease {
    let mut req = spi_request(name, TTL);
    req.owner = OWNER.into();
    match store.try_acquire(&req).await.expect("acquire") {
        AcquireOutcome::Granted(record) => HeldLease {
            name: name.into(),
            token: record.token,
        },
        AcquireOutcome::Held(record) => panic!("{name} held by {record:?}"),
    }
}

/// One renewal of `lease` (asserted renewed) and how long it took.
async fn renew(store: &PostgresStore, lease: &HeldLease) -> Duration {
    let started = Instant::now();
    let answers = store
        .renew(OWNER, std::slice::from_ref(lease), TTL)
        .await
        .expect("renew");
    let took = started.elapsed();
    assert!(
        answers.iter().all(|a| a.is_renewed()),
        "{} not renewed: {answers:?}",
        lease.name
    );
    took
}
