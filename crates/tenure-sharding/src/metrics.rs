//! Sharding metrics through the [`metrics`] facade, labelled with the entity type.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `tenure_sharding_asks_total` | counter | `type`, `outcome` | asks by outcome: `ok`, `failed`, `timeout`, `stopped` |
//! | `tenure_sharding_tells_total` | counter | `type` | tells sent |
//! | `tenure_sharding_tells_dropped_total` | counter | `type` | tells a region dropped (its buffer full; each logged) |
//! | `tenure_sharding_region_buffer` | gauge | `type` | messages a region keeps while it learns where their shards live |
//! | `tenure_sharding_shard_serving` | gauge | `type`, `shard` | 1 while this node serves the shard under its lease |
//! | `tenure_sharding_entities` | gauge | `type`, `shard` | entities running in the shard on this node |
//! | `tenure_sharding_hand_offs_total` | counter | `type` | shards handed off by this node |
//! | `tenure_sharding_entities_outlived_kill_total` | counter | `type` | entities that outlived their kill (a thread blocked outside an await); their shard keeps its lease until they end |
//! | `tenure_sharding_rebalance_moves_total` | counter | `type` | shards the coordinator moved to balance the load |

/// A region handle's counters, registered once when the region starts (every message
/// counts, so it must not build a key per message): install the metrics recorder before
/// starting regions, as the `metrics` crate asks.
#[derive(Clone)]
pub(crate) struct HandleMeters {
    tells: metrics::Counter,
    /// Indexed by [`AskOutcome`].
    asks: [metrics::Counter; 4],
}

/// How an ask ended (the `outcome` label of `tenure_sharding_asks_total`).
#[derive(Clone, Copy)]
pub(crate) enum AskOutcome {
    Ok,
    Failed,
    Timeout,
    Stopped,
}

impl HandleMeters {
    pub(crate) fn new(type_name: &str) -> Self {
        let ask = |outcome: &'static str| metrics::counter!("tenure_sharding_asks_total", "type" => type_name.to_string(), "outcome" => outcome);
        HandleMeters {
            tells: metrics::counter!("tenure_sharding_tells_total", "type" => type_name.to_string()),
            asks: [ask("ok"), ask("failed"), ask("timeout"), ask("stopped")],
        }
    }

    pub(crate) fn tell(&self) {
        self.tells.increment(1);
    }

    pub(crate) fn ask(&self, outcome: AskOutcome) {
        self.asks[outcome as usize].increment(1);
    }
}

pub(crate) fn tell_dropped(type_name: &str) {
    metrics::counter!("tenure_sharding_tells_dropped_total", "type" => type_name.to_string())
        .increment(1);
}

/// A region's `tenure_sharding_region_buffer` gauge, registered once when the region starts:
/// the region reports its depth after every message it handles, so it must not build a key
/// per message, and it sets the gauge only when the depth changed.
pub(crate) struct RegionBuffer {
    gauge: metrics::Gauge,
    reported: Option<usize>,
}

impl RegionBuffer {
    pub(crate) fn new(type_name: &str) -> Self {
        RegionBuffer {
            gauge: metrics::gauge!("tenure_sharding_region_buffer", "type" => type_name.to_string()),
            reported: None,
        }
    }

    pub(crate) fn set(&mut self, depth: usize) {
        if self.reported != Some(depth) {
            self.gauge.set(depth as f64);
            self.reported = Some(depth);
        }
    }
}

pub(crate) fn shard(type_name: &str, shard: &str, serving: bool, entities: usize) {
    let labels = [
        ("type", type_name.to_string()),
        ("shard", shard.to_string()),
    ];
    metrics::gauge!("tenure_sharding_shard_serving", &labels).set(f64::from(u8::from(serving)));
    metrics::gauge!("tenure_sharding_entities", &labels).set(entities as f64);
}

pub(crate) fn hand_off(type_name: &str) {
    metrics::counter!("tenure_sharding_hand_offs_total", "type" => type_name.to_string())
        .increment(1);
}

pub(crate) fn entity_outlived_kill(type_name: &str) {
    metrics::counter!("tenure_sharding_entities_outlived_kill_total", "type" => type_name.to_string())
        .increment(1);
}

pub(crate) fn rebalance_move(type_name: &str) {
    metrics::counter!("tenure_sharding_rebalance_moves_total", "type" => type_name.to_string())
        .increment(1);
}
