//! The active-entity limit of a region (Akka's `active-entity-limit`): the entities its
//! shards run, least recently used first, so that starting one past the limit passivates
//! the one used least recently, in whichever of the region's shards it runs.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use ractor::ActorRef;

use crate::shard::ShardMsg;

/// The running entities of one region, by recency of use, bounded by a limit. Clones share
/// the set; every shard of the region holds one.
#[derive(Clone)]
pub struct ActiveEntities {
    limit: usize,
    inner: Arc<Mutex<Lru>>,
}

/// An entity: its shard id and entity id.
type Key = (String, String);

#[derive(Default)]
struct Lru {
    /// Bumped at every use: the recency of a use.
    clock: u64,
    by_key: HashMap<Key, u64>,
    by_use: BTreeMap<u64, Key>,
    /// The actor of each shard with entities here, to passivate them.
    shards: HashMap<String, ActorRef<ShardMsg>>,
}

impl std::fmt::Debug for ActiveEntities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActiveEntities")
            .field("limit", &self.limit)
            .field("active", &self.len())
            .finish()
    }
}

impl ActiveEntities {
    /// An empty set for a region that runs at most `limit` entities (at least 1).
    pub fn new(limit: usize) -> Self {
        ActiveEntities {
            limit: limit.max(1),
            inner: Arc::default(),
        }
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// How many entities are counted as running.
    pub fn len(&self) -> usize {
        self.lock().by_key.len()
    }

    /// `true` when no entity is counted as running.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Entity `entity` of shard `shard_id` (whose actor is `shard`) started or got a
    /// message: it becomes the most recently used. Past the limit, the least recently used
    /// entities are no longer counted and are asked to passivate (through their shard).
    pub(crate) fn used(&self, shard: &ActorRef<ShardMsg>, shard_id: &str, entity: &str) {
        let evicted = {
            let mut lru = self.lock();
            lru.clock += 1;
            let now = lru.clock;
            let key = (shard_id.to_string(), entity.to_string());
            if let Some(before) = lru.by_key.insert(key.clone(), now) {
                lru.by_use.remove(&before);
            }
            lru.by_use.insert(now, key);
            lru.shards.insert(shard_id.to_string(), shard.clone());
            let mut evicted = Vec::new();
            while lru.by_key.len() > self.limit {
                let Some((_, key)) = lru.by_use.pop_first() else {
                    break;
                };
                lru.by_key.remove(&key);
                if let Some(actor) = lru.shards.get(&key.0) {
                    evicted.push((actor.clone(), key));
                }
            }
            evicted
        };
        for (actor, (shard_id, entity)) in evicted {
            tracing::debug!(shard = %shard_id, entity, limit = self.limit,
                "active-entity-limit reached: passivating the least recently used entity");
            let _ = actor.cast(ShardMsg::Evict(entity));
        }
    }

    /// Entity `entity` of shard `shard_id` stopped.
    pub(crate) fn stopped(&self, shard_id: &str, entity: &str) {
        let mut lru = self.lock();
        if let Some(at) = lru
            .by_key
            .remove(&(shard_id.to_string(), entity.to_string()))
        {
            lru.by_use.remove(&at);
        }
    }
}
