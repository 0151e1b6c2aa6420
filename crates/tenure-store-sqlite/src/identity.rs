//! The identity of a lease file's content: a random store id, made with the file, and a
//! generation that every write transaction advances (`max(generation + 1, wall clock in
//! microseconds)`, so that a copy of another file or an old copy of this one shows a lower
//! one than what was written since). Every transaction of the store reads it first.
//!
//! A transaction finds the file's state lost when the identity differs from what its
//! process knew ([`Lost::StoreChanged`], [`Lost::WentBack`]) or, for a write, when a live
//! process of the host relies on a higher generation ([`Lost::Behind`], see `witness`):
//! the file was replaced by a copy (even in place, keeping its inode), or its `-wal` was
//! deleted under its users. The store then handles it as any lost file: grants gone,
//! nothing granted for one ttl, tokens above their floor (see `SqliteStore`).

use rusqlite::{OptionalExtension, Transaction};

use crate::sql;
use crate::witness::Seen;

/// The identity row of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    pub store: String,
    pub generation: i64,
}

/// Why a transaction found the file's state lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lost {
    /// The store id is not the one this process used: another file's content.
    StoreChanged { was: String, now: String },
    /// The generation is below one this process read or committed: older content.
    WentBack { seen: i64, now: i64 },
    /// A live process of this host committed a higher generation than the file shows.
    Behind { relied: i64, now: i64 },
    /// The file has no identity row (an older version's file copied over it).
    NoIdentity,
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lost::StoreChanged { was, now } => write!(
                f,
                "its store id changed from {was} to {now} (another lease file was copied over it)"
            ),
            Lost::WentBack { seen, now } => write!(
                f,
                "its generation went back from {seen} to {now} (an older copy was restored over it, or its -wal was deleted)"
            ),
            Lost::Behind { relied, now } => write!(
                f,
                "it shows generation {now} while a live process of this host committed generation {relied} (an older copy was restored over it, or its -wal was deleted)"
            ),
            Lost::NoIdentity => write!(
                f,
                "it has no identity row (a file of an older version was copied over it)"
            ),
        }
    }
}

/// The identity row, if the file has one.
pub(crate) fn read(tx: &Transaction<'_>) -> rusqlite::Result<Option<Identity>> {
    tx.prepare_cached(sql::IDENTITY)?
        .query_row([], |r| {
            Ok(Identity {
                store: r.get(0)?,
                generation: r.get(1)?,
            })
        })
        .optional()
}

/// Judges `found` against what this process `known` before the transaction read it.
pub(crate) fn check(known: &Seen, found: Option<Identity>) -> Result<Identity, Lost> {
    let Some(found) = found else {
        return Err(Lost::NoIdentity);
    };
    if let Some(was) = &known.store
        && *was != found.store
    {
        return Err(Lost::StoreChanged {
            was: was.clone(),
            now: found.store,
        });
    }
    if found.generation < known.generation {
        return Err(Lost::WentBack {
            seen: known.generation,
            now: found.generation,
        });
    }
    Ok(found)
}

/// The generation a write commits after `generation`: one more, and at least the wall
/// clock in microseconds, so that generations of unrelated files (and of a file's old
/// copies) stay below those written later.
pub(crate) fn next(generation: i64) -> i64 {
    generation
        .saturating_add(1)
        .max(crate::clock::token_floor())
        .min(crate::witness::MAX_GENERATION)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(store: &str, generation: i64) -> Identity {
        Identity {
            store: store.into(),
            generation,
        }
    }

    #[test]
    fn a_changed_store_or_an_older_generation_is_a_loss() {
        let fresh = Seen::default();
        assert_eq!(check(&fresh, Some(id("s", 5))), Ok(id("s", 5)));
        let known = Seen {
            store: Some("s".into()),
            generation: 5,
            ..Seen::default()
        };
        assert_eq!(check(&known, Some(id("s", 7))), Ok(id("s", 7)));
        assert_eq!(check(&known, Some(id("s", 5))), Ok(id("s", 5)));
        assert_eq!(
            check(&known, Some(id("s", 4))),
            Err(Lost::WentBack { seen: 5, now: 4 })
        );
        assert_eq!(
            check(&known, Some(id("t", 9))),
            Err(Lost::StoreChanged {
                was: "s".into(),
                now: "t".into()
            })
        );
        assert_eq!(check(&known, None), Err(Lost::NoIdentity));
    }

    #[test]
    fn the_next_generation_is_above_the_last_and_the_wall_clock() {
        let now = crate::clock::token_floor();
        assert!(next(0) >= now);
        assert_eq!(next(now + 1_000_000), now + 1_000_001);
    }
}
