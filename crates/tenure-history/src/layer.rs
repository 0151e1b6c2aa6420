//! The history writer: a `tracing` layer that turns the events of [`TARGET`] back into typed
//! [`Event`](crate::Event)s and appends them, stamped, to a history.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tracing::span::{Attributes, Id};
use tracing::{Metadata, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{Filtered, LevelFilter, Targets};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use crate::TARGET;
use crate::entry::{Entry, boottime_now_ns};
use crate::fields::{Fields, typed};
use crate::file::HistoryFile;

/// How many reasons [`UnknownEvents`] keeps.
const REASONS_KEPT: usize = 16;

/// The events on [`TARGET`] a layer dropped because they are no known event (a kind it does
/// not know, a field missing, mistyped or unknown): each is a bug in its emitter. Shared by
/// the layer and whoever asked for it (a test asserting there are none).
#[derive(Clone, Debug, Default)]
pub struct UnknownEvents {
    count: Arc<AtomicU64>,
    reasons: Arc<Mutex<Vec<String>>>,
}

impl UnknownEvents {
    /// How many events were dropped.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Why, for the first few of them.
    pub fn reasons(&self) -> Vec<String> {
        self.reasons
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn add(&self, reason: String) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut reasons = self.reasons.lock().unwrap_or_else(|e| e.into_inner());
        if reasons.len() < REASONS_KEPT {
            reasons.push(reason);
        }
    }
}

/// Where a layer's entries go.
#[derive(Clone)]
enum Out {
    File(HistoryFile),
    Memory(Arc<Mutex<Vec<Entry>>>),
}

impl Out {
    fn append(&self, entry: Entry) {
        match self {
            Out::File(file) => {
                if let Err(e) = file.append(&entry) {
                    tracing::warn!(error = %e, "history line lost");
                }
            }
            Out::Memory(entries) => entries
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(entry),
        }
    }
}

/// The node named by a span of [`node_span`], kept in the span's extensions.
struct NodeOf {
    node: String,
    inc: String,
}

/// The history writer, a `tracing_subscriber` [`Layer`]: each event on [`TARGET`] becomes
/// its typed [`Event`](crate::Event) (through serde, so that a field the kind lacks or
/// mistypes is noticed), stamped with the host's `CLOCK_BOOTTIME` instant when it is
/// handled (inline, where it was emitted) and with the node it is about, and is appended as
/// one line. The node and incarnation come from the innermost enclosing [`node_span`] when
/// there is one, else from what the layer was built with: a process usually hosts one node,
/// and spans do not follow the tasks spawned inside them (ractor spawns every actor with
/// `tokio::spawn`).
///
/// An event that is no known event is dropped, counted ([`HistoryLayer::unknown_events`])
/// and logged at warn: it is a bug in its emitter.
///
/// Install it with its target filter ([`HistoryLayer::filtered`]): unfiltered, it would
/// see, and ignore, every other event of the process.
#[derive(Clone)]
pub struct HistoryLayer {
    out: Out,
    node: String,
    inc: String,
    unknown: UnknownEvents,
}

impl std::fmt::Debug for HistoryLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HistoryLayer")
            .field("node", &self.node)
            .field("inc", &self.inc)
            .finish()
    }
}

impl HistoryLayer {
    /// A writer appending to `file` the events about `node` (a cluster address `host:port`,
    /// or a lease owner for a process that is no node) of incarnation `inc`, unless a span
    /// names another.
    pub fn new(file: HistoryFile, node: impl Into<String>, inc: impl Into<String>) -> Self {
        HistoryLayer::to(Out::File(file), node.into(), inc.into())
    }

    /// A writer keeping its entries in `entries` (a [`Recorder`](crate::Recorder)).
    pub(crate) fn in_memory(entries: Arc<Mutex<Vec<Entry>>>, node: &str, inc: &str) -> Self {
        HistoryLayer::to(Out::Memory(entries), node.into(), inc.into())
    }

    fn to(out: Out, node: String, inc: String) -> Self {
        HistoryLayer {
            out,
            node,
            inc,
            unknown: UnknownEvents::default(),
        }
    }

    /// The events this layer dropped as no known event.
    pub fn unknown_events(&self) -> UnknownEvents {
        self.unknown.clone()
    }

    /// This layer behind a filter of its own that lets only [`TARGET`] through, to add to a
    /// registry beside other layers (a log formatter with its own filter): other events
    /// never reach it, and it disables nothing for the other layers.
    pub fn filtered<S>(self) -> Filtered<HistoryLayer, Targets, S>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        self.with_filter(Targets::new().with_target(TARGET, LevelFilter::TRACE))
    }
}

/// Whether `metadata` is of a history event or span.
fn is_history(metadata: &Metadata<'_>) -> bool {
    metadata
        .target()
        .strip_prefix(TARGET)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
}

impl<S> Layer<S> for HistoryLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if !is_history(attrs.metadata()) {
            return;
        }
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let (Some(node), Some(inc), Some(span)) =
            (fields.text("node"), fields.text("inc"), ctx.span(id))
        {
            span.extensions_mut().insert(NodeOf {
                node: node.to_string(),
                inc: inc.to_string(),
            });
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        if !is_history(event.metadata()) {
            return;
        }
        let t = boottime_now_ns();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let typed = match typed(fields.0) {
            Ok(typed) => typed,
            Err(why) => {
                tracing::warn!(
                    why = %why,
                    "a history event that is no known event was dropped: a bug in its emitter"
                );
                self.unknown.add(why.to_string());
                return;
            }
        };
        let named = ctx.event_scope(event).and_then(|scope| {
            scope.into_iter().find_map(|span| {
                let ext = span.extensions();
                ext.get::<NodeOf>().map(|n| (n.node.clone(), n.inc.clone()))
            })
        });
        let (node, inc) = named.unwrap_or_else(|| (self.node.clone(), self.inc.clone()));
        self.out.append(Entry::new(t, node, inc, typed));
    }
}

/// A span naming the node, and its incarnation, that the history events emitted inside it
/// are about, for a process that records several: a [`HistoryLayer`] takes the innermost
/// one's over the node it was built with. It does not follow tasks spawned inside it.
pub fn node_span(node: &str, inc: &str) -> tracing::Span {
    tracing::info_span!(target: TARGET, "node", node, inc)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use tracing_subscriber::layer::SubscriberExt;

    use super::*;
    use crate::{Event, Recorder, read_history};

    /// Counts the events that reach it, behind a filter letting everything through.
    struct Counting(Arc<AtomicUsize>);

    impl<S: Subscriber> Layer<S> for Counting {
        fn on_event(&self, _: &tracing::Event<'_>, _: Context<'_, S>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn an_event_becomes_a_line_of_the_documented_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.jsonl");
        let layer = HistoryLayer::new(HistoryFile::open(&path).unwrap(), "a:1", "1f");
        let subscriber = tracing_subscriber::registry().with(layer.filtered());
        let before = boottime_now_ns();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: TARGET, event = "lease_granted", lease = "s-shard-c-1",
                owner = "a:1", token = 3u64, valid_until = 9i64);
            tracing::info!(target: TARGET, event = "tick", singleton = "s", token = 3u64,
                value = None::<u64>, accepted = false);
        });
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let t = read_history(&path).unwrap()[0].t;
        assert!(t >= before, "stamped when handled");
        assert_eq!(
            lines,
            [
                format!(
                    r#"{{"event":"lease_granted","inc":"1f","lease":"s-shard-c-1","node":"a:1","owner":"a:1","t":{t},"token":3,"valid_until":9}}"#
                ),
                format!(
                    r#"{{"accepted":false,"event":"tick","inc":"1f","node":"a:1","singleton":"s","t":{},"token":3,"value":null}}"#,
                    read_history(&path).unwrap()[1].t
                ),
            ]
        );
    }

    #[test]
    fn the_innermost_node_span_names_the_node() {
        let recorder = Recorder::new("default:1", "d");
        recorder.record(|| {
            tracing::info!(target: TARGET, event = "node_started");
            node_span("outer:1", "o").in_scope(|| {
                node_span("inner:2", "i").in_scope(|| {
                    tracing::info!(target: TARGET, event = "node_left");
                });
                tracing::info!(target: TARGET, event = "self_down");
            });
        });
        let named: Vec<(String, String, String)> = recorder
            .entries()
            .into_iter()
            .map(|e| (e.node.clone(), e.inc.clone(), e.kind()))
            .collect();
        let expect = |n: &str, i: &str, k: &str| (n.to_string(), i.to_string(), k.to_string());
        assert_eq!(
            named,
            [
                expect("default:1", "d", "node_started"),
                expect("inner:2", "i", "node_left"),
                expect("outer:1", "o", "self_down"),
            ]
        );
    }

    #[test]
    fn an_event_that_is_no_known_event_is_counted_and_dropped() {
        let recorder = Recorder::new("a:1", "1f");
        recorder.record(|| {
            tracing::info!(target: TARGET, event = "lease_released", lease = "l", owner = "o");
            tracing::info!(target: TARGET, event = "node_started", extra = 1u64);
            tracing::info!(target: TARGET, event = "lease_acquire", lease = "l", owner = "o");
        });
        let kinds: Vec<String> = recorder.entries().iter().map(Entry::kind).collect();
        assert_eq!(kinds, ["lease_acquire"]);
        let unknown = recorder.unknown_events();
        assert_eq!(unknown.count(), 2, "{:?}", unknown.reasons());
        assert!(
            unknown.reasons()[0].contains("token"),
            "{:?}",
            unknown.reasons()
        );
        assert!(
            unknown.reasons()[1].contains("extra"),
            "{:?}",
            unknown.reasons()
        );
    }

    #[test]
    fn the_filtered_layer_takes_only_history_events_and_hides_nothing_from_others() {
        let seen = Arc::new(AtomicUsize::new(0));
        let recorder_entries = Arc::new(Mutex::new(Vec::new()));
        let history = HistoryLayer::in_memory(recorder_entries.clone(), "a:1", "1f");
        let subscriber = tracing_subscriber::registry()
            .with(Counting(seen.clone()).with_filter(LevelFilter::TRACE))
            .with(history.filtered());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "tenure::historyx", event = "node_started");
            tracing::debug!(answer = 42u64, "an ordinary log line");
            tracing::info!(target: TARGET, event = "node_started");
        });
        assert_eq!(seen.load(Ordering::Relaxed), 3);
        let entries = recorder_entries.lock().unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].event, Event::NodeStarted {});
    }
}
