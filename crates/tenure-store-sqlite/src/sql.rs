//! The SQL of the store, in one place: the store runs it, and the benchmark runs the very
//! same statements directly as its baseline.

/// The unexpired grant of `?1` at clock `?2`.
pub const SELECT_CURRENT: &str = "SELECT name, owner, instance, token, expires_at, version, note
    FROM tenure_lease WHERE name = ?1 AND expires_at > ?2";

/// Reentrant acquire: a fresh expiry `?2` for `?1`, keeping the token.
pub const EXTEND: &str = "UPDATE tenure_lease SET expires_at = ?2, version = version + 1,
    note = coalesce(?3, note) WHERE name = ?1";

/// The next token of `?1` (the counter row is never deleted).
pub const NEXT_TOKEN: &str = "INSERT INTO tenure_fence (name, last_token) VALUES (?1, 1)
    ON CONFLICT (name) DO UPDATE SET last_token = last_token + 1
    RETURNING last_token";

/// A new grant of `?1` to owner `?2`, instance `?6`, with token `?3`, expiring at `?4`.
pub const INSERT_GRANT: &str = "INSERT OR REPLACE INTO tenure_lease
    (name, owner, token, expires_at, version, note, instance) VALUES (?1, ?2, ?3, ?4, 1, ?5, ?6)";

/// Batched renewal: every `[name, token]` of the JSON array `?4` still held unexpired (at
/// `?2`) by owner `?1` gets expiry `?3`; returns the renewed ones. One statement per batch.
pub const RENEW_BATCH: &str = "UPDATE tenure_lease SET expires_at = ?3, version = version + 1
    WHERE owner = ?1 AND expires_at > ?2 AND (name, token) IN
      (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?4))
    RETURNING name, token";

/// Owner- and token-checked release of an unexpired grant.
pub const RELEASE: &str = "DELETE FROM tenure_lease
    WHERE name = ?1 AND owner = ?2 AND token = ?3 AND expires_at > ?4";

/// Unexpired grants whose names start with `?1`, by name.
pub const LIST: &str =
    "SELECT name, owner, instance, token, expires_at, version, note FROM tenure_lease
    WHERE substr(name, 1, length(?1)) = ?1 AND expires_at > ?2 ORDER BY name";
