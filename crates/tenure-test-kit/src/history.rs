//! A history file for one test: what a node's layers emit on the test's threads, and what
//! the harness records about it, in the file format the checker reads.

use std::time::Duration;

use tenure_history::{Entry, Event, HistoryFile, HistoryLayer, read_history};
use tracing::Dispatch;
use tracing_subscriber::layer::SubscriberExt;

/// The test's history file, written by a [`HistoryLayer`] that [`recorded`] installs on
/// every thread of the test's runtime.
pub struct TestHistory {
    _dir: tempfile::TempDir,
    file: HistoryFile,
    node: String,
    inc: String,
    dispatch: Dispatch,
}

impl TestHistory {
    /// A history about node `node` in its life `incarnation`, in a new temporary directory.
    /// Panics when the file cannot be made (a test tool).
    pub fn new(node: &str, incarnation: &str) -> TestHistory {
        let dir = tempfile::tempdir().expect("a temporary directory for the history");
        let file = HistoryFile::open(&dir.path().join("history.jsonl"))
            .expect("open the test's history file");
        let layer = HistoryLayer::new(file.clone(), node, incarnation.to_string());
        let dispatch = Dispatch::new(tracing_subscriber::registry().with(layer.filtered()));
        TestHistory {
            _dir: dir,
            file,
            node: node.to_string(),
            inc: incarnation.to_string(),
            dispatch,
        }
    }

    /// Appends `event` about the node, as the harness. Panics when the write fails.
    pub fn record(&self, event: Event) {
        let entry = Entry::now(self.node.clone(), self.inc.clone(), event);
        self.file
            .append(&entry)
            .expect("append to the test's history");
    }

    /// Every entry recorded so far. Panics when the file cannot be read.
    pub fn read(&self) -> Vec<Entry> {
        read_history(self.file.path()).expect("read the test's history")
    }

    /// The checker's violations of the history so far, as text (empty: none).
    pub fn violations(&self) -> Vec<String> {
        tenure_history::check::check(&self.read())
            .violations
            .iter()
            .map(|v| v.to_string())
            .collect()
    }

    /// The last `valid_until` recorded before the first `lease_lost`: the local deadline of
    /// the grant that was lost. Panics when no grant was recorded before it (a test tool).
    pub fn deadline_of_the_lost_grant(&self) -> i64 {
        let mut deadline = None;
        for e in self.read() {
            match e.event {
                Event::LeaseGranted { valid_until, .. }
                | Event::LeaseRenewed { valid_until, .. } => {
                    deadline = deadline.max(Some(valid_until))
                }
                Event::LeaseLost { .. } => break,
                _ => {}
            }
        }
        deadline.expect("a grant before the loss")
    }

    /// For a test that holds a thread blocked while its lease is lost: waits for the
    /// `lease_lost` event, then until `ended()` says the process was ended (by the test's
    /// hook) or, should it never be, until 100 ms past the lost grant's local deadline (surely
    /// passed). Returns that deadline (ns of `CLOCK_BOOTTIME`).
    pub async fn await_end_after_the_loss(&self, ended: impl Fn() -> bool) -> i64 {
        self.wait_for("lease_lost", |e| matches!(e, Event::LeaseLost { .. }))
            .await;
        let valid_until = self.deadline_of_the_lost_grant();
        while !ended() && tenure_history::boottime_now_ns() < valid_until + 100_000_000 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        valid_until
    }

    /// Waits until the history shows an event matching `want`, and returns its entry;
    /// panics naming `what` when none came within 10 s.
    pub async fn wait_for(&self, what: &str, want: impl Fn(&Event) -> bool) -> Entry {
        crate::eventually_async(what, Duration::from_secs(10), async || {
            self.read()
                .into_iter()
                .find(|e| want(&e.event))
                .ok_or("not in the history yet")
        })
        .await
    }
}

/// Runs `test` on a 4-thread runtime whose every thread, the test's own included, records
/// the history events emitted on it into a new [`TestHistory`] about `node` in its life
/// `incarnation`: a dispatcher does not follow the tasks spawned under it.
pub fn recorded(node: &str, incarnation: &str, test: impl AsyncFnOnce(TestHistory)) {
    let history = TestHistory::new(node, incarnation);
    let dispatch = history.dispatch.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .on_thread_start({
            let dispatch = dispatch.clone();
            move || std::mem::forget(tracing::dispatcher::set_default(&dispatch))
        })
        .build()
        .expect("the test's runtime");
    tracing::dispatcher::with_default(&dispatch, || runtime.block_on(test(history)));
}
