//! The resource-side fencing check: remember the highest token seen per resource and
//! reject writes carrying a lower one.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Mutex;

use crate::{FencingToken, StoreError};

/// Why a write fenced inside the lease store's own transaction must not go ahead (the
/// SQLite store's `fence::check`, the PostgreSQL store's `Fence::check`): roll back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// The lease is not held by that owner with that token now (released, expired, or
    /// granted to someone else).
    #[error("lease `{name}` is not held by `{owner}` with token {token}: write refused")]
    NotHeld {
        /// The lease name.
        name: String,
        /// The owner the write claimed to be.
        owner: String,
        /// The fencing token the write presented.
        token: FencingToken,
    },
    /// The check itself failed (the store is locked, unreachable or unreadable); the
    /// transaction is unusable.
    #[error("lease `{name}`: fence check failed: {source}")]
    Store {
        /// The lease name.
        name: String,
        /// The store's error, with the database's own error as its source.
        #[source]
        source: StoreError,
    },
}

impl FenceError {
    /// [`FenceError::NotHeld`]: `owner` does not hold `name` with `token` now.
    pub fn not_held(name: &str, owner: &str, token: FencingToken) -> Self {
        FenceError::NotHeld {
            name: name.to_string(),
            owner: owner.to_string(),
            token,
        }
    }

    /// [`FenceError::Store`]: the check of `name` failed in the `store` kind's database
    /// with `cause` (kept as the source of the [`StoreError`]).
    pub fn failed(
        name: &str,
        store: &'static str,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        FenceError::Store {
            name: name.to_string(),
            source: StoreError::unavailable(store, cause.to_string()).caused_by(cause),
        }
    }
}

/// A write was refused because a later holder already wrote with a higher token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {presented}: resource already accepted token {highest}")]
#[non_exhaustive]
pub struct StaleToken {
    /// The token the writer presented.
    pub presented: FencingToken,
    /// The highest token the resource accepted before.
    pub highest: FencingToken,
}

/// Remembers, per resource, the highest fencing token it admitted. A holder that paused past
/// its time-to-live and resumes writing presents an older token than its successor's, and
/// is refused, so the resource stays safe even when two processes believe they hold the lease
/// (the [`FencingToken`] contract).
///
/// It remembers in memory only: it protects a resource that lives in the same process as
/// the check (a service that receives writes from lease holders and applies them), and
/// forgets on restart. A resource that outlives the process (a file, a table) needs the
/// highest token stored with it and compared in the same write, as the stores' own fences
/// do (`tenure::sqlite::fence::check` in a SQLite transaction, PostgreSQL's fenced write).
#[derive(Debug, Default)]
pub struct FenceCheck {
    highest: Mutex<HashMap<String, FencingToken>>,
}

impl FenceCheck {
    /// A check that has accepted no token yet.
    pub fn new() -> Self {
        FenceCheck::default()
    }

    /// Admits a write to `resource` carrying `token` when `token` is at least the highest
    /// admitted so far (the same holder may write many times), and records it. `Err` when a
    /// higher token was admitted before: the write must be dropped.
    pub fn admit(&self, resource: &str, token: FencingToken) -> Result<(), StaleToken> {
        let mut highest = self.highest.lock().unwrap_or_else(|e| e.into_inner());
        match highest.entry(resource.to_string()) {
            Entry::Vacant(entry) => {
                entry.insert(token);
            }
            Entry::Occupied(mut entry) => {
                let highest = *entry.get();
                if token < highest {
                    return Err(StaleToken {
                        presented: token,
                        highest,
                    });
                }
                entry.insert(token);
            }
        }
        Ok(())
    }

    /// The highest token admitted for `resource`, if any.
    pub fn highest(&self, resource: &str) -> Option<FencingToken> {
        self.highest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(resource)
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u64) -> FencingToken {
        FencingToken::new(n)
    }

    #[test]
    fn lower_tokens_are_refused() {
        let f = FenceCheck::new();
        f.admit("r", t(5)).unwrap();
        f.admit("r", t(5)).unwrap();
        f.admit("other", t(1)).unwrap();
        assert_eq!(
            f.admit("r", t(4)),
            Err(StaleToken {
                presented: t(4),
                highest: t(5)
            })
        );
        assert_eq!(
            f.admit("r", t(4)).map_err(|e| e.to_string()),
            Err("stale fencing token 4: resource already accepted token 5".to_string())
        );
        f.admit("r", t(6)).unwrap();
        assert_eq!(f.highest("r"), Some(t(6)));
    }
}
