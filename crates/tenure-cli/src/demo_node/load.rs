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

use std::time::Duration;

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

/// Starts the load on `region` (background tasks that run until the process ends). `start`
/// spreads where the closed-loop workers of different nodes begin in the key space.
pub fn drive(region: ShardRegion, start: usize, load: Load) {
    match load.shape {
        Shape::Closed { pause } => closed_loop(region, start, load, pause),
        Shape::Open { rate } => open_loop(region, load, rate),
    }
}

fn closed_loop(region: ShardRegion, start: usize, load: Load, pause: Duration) {
    let keys = load.keys;
    for worker in 0..WORKERS {
        let region = region.clone();
        let first = start.wrapping_add(worker * keys / WORKERS);
        tokio::spawn(async move {
            for i in (0..keys).cycle().skip(first % keys) {
                let issued = tenure::clock::monotonic_now_ns();
                increment(&region, &format!("key-{i}"), issued, load.timeout).await;
                tokio::time::sleep(pause).await;
            }
        });
    }
}

fn open_loop(region: ShardRegion, load: Load, rate: f64) {
    let period = Duration::from_secs_f64(1.0 / rate);
    // One pair of readings maps the schedule (tokio instants) onto the history's clock;
    // both are CLOCK_MONOTONIC.
    let (base, base_ns) = (Instant::now(), tenure::clock::monotonic_now_ns());
    for i in 0..load.keys {
        let region = region.clone();
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
                // Latency counts from the instant the request was due, so a stalled sender
                // does not hide a slow answer.
                let issued = base_ns + (due - base).as_nanos() as i64;
                let (region, key) = (region.clone(), key.clone());
                tokio::spawn(async move {
                    increment(&region, &key, issued, load.timeout).await;
                });
            }
        });
    }
}

/// Asks `key` to increment and records the outcome: `ack` (the counter accepted it) with
/// key, shard, value, token, answering node and `issued`; otherwise `no_ack` with `why`.
async fn increment(region: &ShardRegion, key: &str, issued: i64, timeout: Duration) {
    let answer = region
        .entity_ref::<Counter>(key)
        .ask(&CounterRequest::Increment, timeout)
        .await;
    let shard = region.shard_of(key);
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
