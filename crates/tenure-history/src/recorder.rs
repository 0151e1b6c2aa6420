//! A history kept in memory, for tests and the conformance kit.

use std::sync::{Arc, Mutex, OnceLock};

use tracing::Dispatch;
use tracing::subscriber::NoSubscriber;
use tracing_subscriber::layer::SubscriberExt;

use crate::entry::Entry;
use crate::event::Event;
use crate::layer::{HistoryLayer, UnknownEvents, node_span};

/// A history kept in memory: a [`HistoryLayer`] in a subscriber of its own, which code runs
/// under on the current thread ([`Recorder::record`]). Scoping it to the thread and the
/// call, rather than installing it for the process, lets the tests of one process each keep
/// their own history, whatever runtime they run on: a caller that is told of each event
/// where it happens (a lease observer) emits it again under [`Recorder::record_as`]. Clones
/// share the history.
#[derive(Clone)]
pub struct Recorder {
    entries: Arc<Mutex<Vec<Entry>>>,
    unknown: UnknownEvents,
    dispatch: Dispatch,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("entries", &self.entries().len())
            .finish()
    }
}

impl Recorder {
    /// An empty history whose events are about `node` of incarnation `inc` unless a
    /// [`node_span`] names another.
    pub fn new(node: &str, inc: &str) -> Recorder {
        let entries = Arc::new(Mutex::new(Vec::new()));
        let layer = HistoryLayer::in_memory(entries.clone(), node, inc);
        let unknown = layer.unknown_events();
        let dispatch = Dispatch::new(tracing_subscriber::registry().with(layer.filtered()));
        // While a single dispatcher exists, tracing takes it for the global default and
        // caches each callsite's interest as the thread's current default sees it: a
        // callsite first hit outside `record` (a lease's own emission, before its observer
        // emits again) would stay disabled for good. A second dispatcher, alive for the
        // process, makes tracing ask every dispatcher, and each event the current one.
        static SECOND: OnceLock<Dispatch> = OnceLock::new();
        SECOND.get_or_init(|| Dispatch::new(NoSubscriber::default()));
        Recorder {
            entries,
            unknown,
            dispatch,
        }
    }

    /// Runs `f`, recording the history events it emits on this thread.
    pub fn record<T>(&self, f: impl FnOnce() -> T) -> T {
        tracing::dispatcher::with_default(&self.dispatch, f)
    }

    /// Runs `f`, recording the history events it emits on this thread as about `node` of
    /// incarnation `inc`.
    pub fn record_as<T>(&self, node: &str, inc: &str, f: impl FnOnce() -> T) -> T {
        self.record(|| node_span(node, inc).in_scope(f))
    }

    /// The subscriber that records, to install for longer than a call
    /// (`tracing::dispatcher::set_default`).
    pub fn dispatch(&self) -> &Dispatch {
        &self.dispatch
    }

    /// The entries recorded so far, in the order they were recorded.
    pub fn entries(&self) -> Vec<Entry> {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The events dropped as no known event (bugs in their emitters).
    pub fn unknown_events(&self) -> &UnknownEvents {
        &self.unknown
    }

    /// The events recorded so far, in order, when every event emitted was a known one;
    /// `Err` says how many were not, and why (a test of an emitter fails on it).
    pub fn known_events(&self) -> Result<Vec<Event>, UnknownEventsError> {
        match self.unknown.count() {
            0 => Ok(self.entries().into_iter().map(|e| e.event).collect()),
            count => Err(UnknownEventsError {
                count,
                reasons: self.unknown.reasons(),
            }),
        }
    }
}

/// Events were emitted on the history target that no history knows (a bug in their
/// emitters): they were dropped, so the recorded history is incomplete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{count} events no history knows: {reasons:?}")]
pub struct UnknownEventsError {
    /// How many events were dropped.
    pub count: u64,
    /// Why, for the first few of them.
    pub reasons: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_started() {
        tracing::info!(target: crate::TARGET, event = "node_started");
    }

    #[test]
    fn a_callsite_first_hit_outside_the_recorder_is_recorded_inside_on_any_thread() {
        let recorder = Recorder::new("a:1", "1f");
        node_started();
        recorder.record(node_started);
        let other = recorder.clone();
        std::thread::spawn(move || other.record_as("b:2", "2e", node_started))
            .join()
            .unwrap();
        node_started();
        let nodes: Vec<String> = recorder.entries().into_iter().map(|e| e.node).collect();
        assert_eq!(nodes, ["a:1", "b:2"]);
    }
}
