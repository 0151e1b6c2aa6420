//! The resource-side fencing check: remember the highest token seen per resource and
//! reject writes carrying a lower one.

use std::collections::HashMap;
use std::sync::Mutex;

/// A write was refused because a later holder already wrote with a higher token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {presented}: resource already accepted token {highest}")]
#[non_exhaustive]
pub struct StaleToken {
    /// The token the writer presented.
    pub presented: u64,
    /// The highest token the resource accepted before.
    pub highest: u64,
}

/// Remembers, per resource, the highest fencing token it admitted. A holder that paused past
/// its time-to-live and resumes writing presents an older token than its successor's, and
/// is refused, so the resource stays safe even when two processes believe they hold the lease.
#[derive(Debug, Default)]
pub struct FenceCheck {
    highest: Mutex<HashMap<String, u64>>,
}

impl FenceCheck {
    /// A check that has accepted no token yet.
    pub fn new() -> Self {
        FenceCheck::default()
    }

    /// Admits a write to `resource` carrying `token` when `token` is at least the highest
    /// admitted so far (the same holder may write many times), and records it. `Err` when a
    /// higher token was admitted before: the write must be dropped.
    pub fn admit(&self, resource: &str, token: u64) -> Result<(), StaleToken> {
        let mut highest = self.highest.lock().unwrap_or_else(|e| e.into_inner());
        let entry = highest.entry(resource.to_string()).or_insert(0);
        if token < *entry {
            return Err(StaleToken {
                presented: token,
                highest: *entry,
            });
        }
        *entry = token;
        Ok(())
    }

    /// The highest token admitted for `resource`, if any.
    pub fn highest(&self, resource: &str) -> Option<u64> {
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

    #[test]
    fn lower_tokens_are_refused() {
        let f = FenceCheck::new();
        f.admit("r", 5).unwrap();
        f.admit("r", 5).unwrap();
        f.admit("other", 1).unwrap();
        assert_eq!(
            f.admit("r", 4),
            Err(StaleToken {
                presented: 4,
                highest: 5
            })
        );
        f.admit("r", 6).unwrap();
        assert_eq!(f.highest("r"), Some(6));
    }
}
