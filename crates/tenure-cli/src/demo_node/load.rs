//! The increment load of `tenure demo node --load-keys N`: asks to the demo's sharded counter
//! through the node's region, each recorded in the history with the instant it was issued
//! (`ack` when acknowledged, `no_ack` with the reason otherwise), so that availability and
//! latency can be read per key from the history (`tenure_cli::availability`).
//!
//! Two shapes: **closed loop** (a few workers, each sending its next increment once the
//! previous one ended, then pausing), which slows down with the cluster and so hides an
//! outage; and **open loop** (`--load-rate`: every key asked on a fixed schedule, whether
//! or not earlier asks were answered, each with its own timeout), which keeps measuring
//! through one.
//!
//! The load plays a load balancer's part: it sends nothing before the node is ready,
//! stops sending when the node's coordinated shutdown unbinds its services (the node turned
//! not ready just before), and when the node exits it records every ask still unanswered as
//! a `no_ack` (an ask dropped with the process would otherwise leave no line at all).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::cluster::{Node, Phase, Readiness};
use tenure::sharding::ShardRegion;
use tenure_cli::demo::counter::{Counter, CounterReply, CounterRequest};
use tenure_cli::history;
use tokio::time::{Instant, MissedTickBehavior};

/// Concurrent workers of the closed loop.
const WORKERS: usize = 8;

/// How a node drives increments of keys `key-0` … `key-(keys-1)`.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub keys: usize,
    pub shape: Shape,
    /// How long each ask waits for its answer.
    pub timeout: Duration,
}

#[derive(Debug, Clone, Copy)]
pub enum Shape {
    /// `WORKERS` workers, each one increment at a time, pausing this long between two.
    Closed { pause: Duration },
    /// Every key asked `rate` times per second on a fixed schedule.
    Open { rate: f64 },
}

/// How often the load looks whether the node turned ready.
const READY_POLL: Duration = Duration::from_millis(20);

/// The asks in flight: the number the next one gets, and each open one's (key, shard,
/// issued) by number.
type OpenAsks = (u64, BTreeMap<u64, (String, String, i64)>);

/// Whether the load may send, and the asks it sent that have not ended.
#[derive(Clone, Default)]
struct Traffic {
    /// Set when the node's shutdown unbinds its services: nothing new is sent.
    stopped: Arc<AtomicBool>,
    /// Asks in flight: (key, shard, issued) by number. Whoever takes an ask out records
    /// its end: its answer, or the node's exit.
    open: Arc<Mutex<OpenAsks>>,
}

impl Traffic {
    fn sending(&self) -> bool {
        !self.stopped.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, OpenAsks> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn begin(&self, key: &str, shard: &str, issued: i64) -> u64 {
        let mut open = self.lock();
        let n = open.0;
        open.0 += 1;
        open.1
            .insert(n, (key.to_string(), shard.to_string(), issued));
        n
    }

    /// Whether ask `n` was still open (its end is the caller's to record).
    fn end(&self, n: u64) -> bool {
        self.lock().1.remove(&n).is_some()
    }

    /// Records every ask still open as unanswered.
    fn abandon(&self) {
        for (key, shard, issued) in std::mem::take(&mut self.lock().1).into_values() {
            history::no_ack(&key, &shard, issued, "unanswered when the node exited");
        }
    }
}

/// Starts the load on `region` of `node` (background tasks that run until the node's
/// shutdown unbinds its services) once the node is ready. `start` spreads where the
/// closed-loop workers of different nodes begin in the key space.
pub fn drive(node: &Node, region: ShardRegion, start: usize, load: Load) {
    let traffic = Traffic::default();
    let shutdown = node.shutdown();
    let stopped = traffic.stopped.clone();
    shutdown.add_task(Phase::ServiceUnbind, "stop the load", move || async move {
        stopped.store(true, Ordering::SeqCst);
    });
    let open = traffic.clone();
    shutdown.add_task(
        Phase::BeforeExit,
        "record unanswered asks",
        move || async move {
            open.abandon();
        },
    );
    let readiness = node.readiness().clone();
    tokio::spawn(async move {
        wait_ready(&readiness, &traffic).await;
        match load.shape {
            Shape::Closed { pause } => closed_loop(region, start, load, pause, traffic),
            Shape::Open { rate } => open_loop(region, load, rate, traffic),
        }
    });
}

/// Waits until the node is ready (or its shutdown began).
async fn wait_ready(readiness: &Readiness, traffic: &Traffic) {
    while traffic.sending() && !readiness.is_ready() {
        tokio::time::sleep(READY_POLL).await;
    }
}

fn closed_loop(region: ShardRegion, start: usize, load: Load, pause: Duration, traffic: Traffic) {
    let keys = load.keys;
    for worker in 0..WORKERS {
        let (region, traffic) = (region.clone(), traffic.clone());
        let first = start.wrapping_add(worker * keys / WORKERS);
        tokio::spawn(async move {
            for i in (0..keys).cycle().skip(first % keys) {
                if !traffic.sending() {
                    return;
                }
                let issued = tenure::clock::monotonic_now_ns();
                increment(&region, &format!("key-{i}"), issued, load.timeout, &traffic).await;
                tokio::time::sleep(pause).await;
            }
        });
    }
}

fn open_loop(region: ShardRegion, load: Load, rate: f64, traffic: Traffic) {
    let period = Duration::from_secs_f64(1.0 / rate);
    // One pair of readings maps the schedule (tokio instants) onto the history's clock;
    // both are CLOCK_MONOTONIC.
    let (base, base_ns) = (Instant::now(), tenure::clock::monotonic_now_ns());
    for i in 0..load.keys {
        let (region, traffic) = (region.clone(), traffic.clone());
        // Keys start evenly spread over one period, so the load is smooth.
        let phase = period.mul_f64(i as f64 / load.keys as f64);
        tokio::spawn(async move {
            let key = format!("key-{i}");
            let mut schedule = tokio::time::interval_at(base + phase, period);
            // A late timer sends what was due at once: the schedule, not the cluster's
            // speed, decides when requests go out.
            schedule.set_missed_tick_behavior(MissedTickBehavior::Burst);
            loop {
                let due = schedule.tick().await;
                if !traffic.sending() {
                    return;
                }
                // Latency counts from the instant the request was due, so a stalled sender
                // does not hide a slow answer.
                let issued = base_ns + (due - base).as_nanos() as i64;
                let (region, key, traffic) = (region.clone(), key.clone(), traffic.clone());
                tokio::spawn(async move {
                    increment(&region, &key, issued, load.timeout, &traffic).await;
                });
            }
        });
    }
}

/// Asks `key` to increment and records the outcome: `ack` (the counter accepted it) with
/// key, shard, value, token, answering node and `issued`; otherwise `no_ack` with `why`
/// (unless the node's exit recorded it first).
async fn increment(
    region: &ShardRegion,
    key: &str,
    issued: i64,
    timeout: Duration,
    traffic: &Traffic,
) {
    let shard = region.shard_of(key);
    let n = traffic.begin(key, &shard, issued);
    let answer = region
        .entity_ref::<Counter>(key)
        .ask(&CounterRequest::Increment, timeout)
        .await;
    if !traffic.end(n) {
        return;
    }
    match answer {
        Ok(CounterReply {
            accepted: true,
            value: Some(value),
            token,
            node,
        }) => history::ack(key, &shard, value, token, &node, issued),
        Ok(reply) => {
            let why = format!("refused by the fenced counter (token {})", reply.token);
            history::no_ack(key, &shard, issued, &why)
        }
        Err(e) => history::no_ack(key, &shard, issued, &e.to_string()),
    }
}
