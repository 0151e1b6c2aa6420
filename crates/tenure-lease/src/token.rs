//! The fencing token: the number every grant of a lease carries.

use std::fmt;

/// The fencing token of one grant of a lease.
///
/// The contract, kept by every store: the tokens of successive grants of one lease name are
/// strictly increasing, across holders, expiries and releases (the same holder granted it
/// again after a loss or a release gets a higher token too), and across restarts of the
/// store. Renewing a grant, or acquiring a lease already held, keeps its token. Tokens of
/// different lease names are unrelated.
///
/// So a resource that remembers the highest token it accepted and refuses writes carrying a
/// lower one is safe even when two processes believe they hold the lease at once (a holder
/// paused past its time-to-live presents an older token than its successor's): see
/// [`FenceCheck`](crate::FenceCheck), and the stores' fenced resources.
///
/// It serializes as the bare number (`#[serde(transparent)]`), and both displays and
/// debug-formats as the bare number, so histories, wire messages, JSON, log lines and the
/// `{:?}` of records and events holding tokens read as they did when tokens were `u64`. Stores
/// mint tokens with [`FencingToken::new`] from their own counters (a column, a revision, a
/// zxid) and store them with [`FencingToken::get`]. There are no `From` conversions on
/// purpose: making a token out of any number is a store's act, spelled `new` where it
/// happens, and `get` is the one way back.
///
/// Its [`Default`] is token 0, the lowest (as in a default [`LeaseRecord`](crate::LeaseRecord)).
#[derive(
    Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct FencingToken(u64);

impl FencingToken {
    /// The token with number `token`: for stores minting tokens from their counters, and for
    /// reading a token back from where it was stored as a number.
    pub const fn new(token: u64) -> FencingToken {
        FencingToken(token)
    }

    /// The token's number: for storing it, and for recording it where plain numbers are
    /// kept (the history's records).
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    /// The bare number, as log lines and messages have always shown tokens.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for FencingToken {
    /// The bare number too: `Some(5)`, `LeaseRecord { token: 5, .. }`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::FencingToken;

    #[test]
    fn reads_and_writes_as_the_bare_number() {
        let t = FencingToken::new(42);
        assert_eq!(t.get(), 42);
        assert_eq!(t.to_string(), "42");
        assert_eq!(format!("{t:>4}"), "  42");
        assert_eq!(format!("{t:06}"), "000042");
        assert_eq!(format!("{:?}", Some(t)), "Some(42)");
        assert_eq!(
            toml::Value::try_from(t).ok(),
            Some(toml::Value::Integer(42))
        );
        assert!(FencingToken::new(7) < t);
    }
}
