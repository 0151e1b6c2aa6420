//! The SQL of the store, in one place: the store runs it, and the benchmark runs the very
//! same statements directly as its baseline.

/// The unexpired grant of `?1` at clock `?2` (columns as read by the store's `row_record`).
pub const SELECT_CURRENT: &str = "SELECT name, owner, instance, token, expires_at, version, note,
    priority, cleanup_ns, req_by, req_instance, req_priority, req_forceful, req_note
    FROM tenure_lease WHERE name = ?1 AND expires_at > ?2";

/// The value of key `?1` in `tenure_meta`; a new grant reads `lost_at` (when a lost file
/// was replaced: no grant for one ttl after it).
pub const META: &str = "SELECT value FROM tenure_meta WHERE key = ?1";

/// The file's identity: its store id and generation (see the store's `identity` module);
/// every transaction of the store reads it first.
pub const IDENTITY: &str = "SELECT store, generation FROM tenure_identity WHERE one = 1";

/// A write that changed anything sets generation `?1` before it commits.
pub const SET_GENERATION: &str = "UPDATE tenure_identity SET generation = ?1 WHERE one = 1";

/// A new identity: a random store id, generation `?1`.
pub const CREATE_IDENTITY: &str = "INSERT INTO tenure_identity (one, store, generation)
    VALUES (1, lower(hex(randomblob(16))), ?1)";

/// [`CREATE_IDENTITY`] unless the file has one.
pub const CREATE_IDENTITY_IF_NONE: &str =
    "INSERT OR IGNORE INTO tenure_identity (one, store, generation)
    VALUES (1, lower(hex(randomblob(16))), ?1)";

/// Reentrant acquire: a fresh expiry `?2` for `?1`, keeping the token (and the priority).
pub const EXTEND: &str = "UPDATE tenure_lease SET expires_at = ?2, version = version + 1,
    note = coalesce(?3, note) WHERE name = ?1";

/// The next token of `?1` when its counter row exists: above the last one issued in this
/// file (the counter row is never deleted) and at least the floor `?2` (the wall clock in
/// microseconds), so that it also exceeds any token of a lost earlier file. A single-row
/// update by key, without `RETURNING`: SQLite opens no statement journal for it. An upsert
/// or a `RETURNING` clause makes it open one per grant, a 64 KiB buffer allocated and
/// freed inside the transaction, after which glibc's allocator gave the memory back to the
/// kernel and faulted it in again on every grant.
pub const ADVANCE_TOKEN: &str =
    "UPDATE tenure_fence SET last_token = max(last_token + 1, ?2) WHERE name = ?1";

/// The last token issued for `?1`.
pub const LAST_TOKEN: &str = "SELECT last_token FROM tenure_fence WHERE name = ?1";

/// The first token of `?1`: the floor `?2`.
pub const FIRST_TOKEN: &str = "INSERT INTO tenure_fence (name, last_token) VALUES (?1, ?2)";

/// The next token of lease `name` at floor `floor` ([`ADVANCE_TOKEN`] then [`LAST_TOKEN`],
/// or [`FIRST_TOKEN`] for a name never granted in this file), inside `tx`, which holds the
/// write lock. The store and the benchmark's direct SQL both issue it.
///
/// # Errors
/// SQLite's.
pub fn next_token(tx: &rusqlite::Transaction<'_>, name: &str, floor: i64) -> rusqlite::Result<i64> {
    let advanced = tx
        .prepare_cached(ADVANCE_TOKEN)?
        .execute(rusqlite::params![name, floor])?;
    if advanced == 0 {
        tx.prepare_cached(FIRST_TOKEN)?
            .execute(rusqlite::params![name, floor])?;
        return Ok(floor);
    }
    tx.prepare_cached(LAST_TOKEN)?
        .query_row([name], |r| r.get(0))
}

/// A new grant of `?1` to owner `?2`, instance `?6`, with token `?3`, expiring at `?4`,
/// priority `?7` (bit-cast) and cleanup timeout `?8` (ns); no request pending.
pub const INSERT_GRANT: &str = "INSERT OR REPLACE INTO tenure_lease
    (name, owner, token, expires_at, version, note, instance, priority, cleanup_ns)
    VALUES (?1, ?2, ?3, ?4, 1, ?5, ?6, ?7, ?8)";

/// Batched renewal: every `[name, token]` of the JSON array `?4` still held unexpired (at
/// `?2`) by owner `?1`, without a forceful request pending, gets expiry `?3`; returns the
/// renewed ones with their pending request. One statement per batch.
pub const RENEW_BATCH: &str = "UPDATE tenure_lease SET expires_at = ?3, version = version + 1
    WHERE owner = ?1 AND expires_at > ?2 AND req_forceful = 0 AND (name, token) IN
      (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?4))
    RETURNING name, token, req_by, req_instance, req_priority, req_forceful, req_note";

/// The leases of the JSON array `?3` held unexpired (at `?2`) by owner `?1` whose renewal
/// a forceful request refused, with that request.
pub const REFUSED_BATCH: &str = "SELECT name, token, req_by, req_instance, req_priority,
    req_forceful, req_note FROM tenure_lease
    WHERE owner = ?1 AND expires_at > ?2 AND req_forceful = 1 AND (name, token) IN
      (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?3))";

/// Records request (by `?4`, instance `?5`, priority `?6`, forceful `?7`, note `?8`) on
/// grant `?2` of `?1`, unexpired at `?3`. The store checks the rule before, in the same
/// transaction.
pub const SET_REQUEST: &str = "UPDATE tenure_lease SET req_by = ?4, req_instance = ?5,
    req_priority = ?6, req_forceful = ?7, req_note = ?8
    WHERE name = ?1 AND token = ?2 AND expires_at > ?3";

/// Withdraws the request of `?4` from grant `?2` of `?1`, unexpired at `?3`.
pub const WITHDRAW_REQUEST: &str = "UPDATE tenure_lease SET req_by = NULL, req_instance = NULL,
    req_priority = NULL, req_forceful = 0, req_note = NULL
    WHERE name = ?1 AND token = ?2 AND expires_at > ?3 AND req_by = ?4";

/// Owner- and token-checked release of an unexpired grant.
pub const RELEASE: &str = "DELETE FROM tenure_lease
    WHERE name = ?1 AND owner = ?2 AND token = ?3 AND expires_at > ?4";

/// Unexpired (at `?2`) grants whose names start with `?1`, by name: the names from `?1`
/// up to, not including, `?3`, the least string above every name that starts with `?1`
/// ([`prefix_end`]). A range on the primary key's index: SQLite reads only those rows
/// (`substr(name, …) = ?1` would make it read every row of the table).
pub const LIST: &str = "SELECT name, owner, instance, token, expires_at, version, note,
    priority, cleanup_ns, req_by, req_instance, req_priority, req_forceful, req_note
    FROM tenure_lease
    WHERE name >= ?1 AND name < ?3 AND expires_at > ?2 ORDER BY name";

/// [`LIST`] for a prefix no string is above: every name from `?1` on.
pub const LIST_FROM: &str = "SELECT name, owner, instance, token, expires_at, version, note,
    priority, cleanup_ns, req_by, req_instance, req_priority, req_forceful, req_note
    FROM tenure_lease
    WHERE name >= ?1 AND expires_at > ?2 ORDER BY name";

pub use tenure_lease::names::prefix_end;

/// A grant of `?1` was made or ended: every watched prefix of it changed. Reads the
/// `tenure_change` rows, one per prefix any process asked about.
pub const CHANGED: &str = "UPDATE tenure_change SET changes = changes + 1
    WHERE prefix <= ?1 AND substr(?1, 1, length(prefix)) = prefix";

/// Every grant ended at once (a lost file's, a previous boot's): every watched prefix
/// changed.
pub const CHANGED_ALL: &str = "UPDATE tenure_change SET changes = changes + 1";

/// The count of changes under prefix `?1`.
pub const CHANGES: &str = "SELECT changes FROM tenure_change WHERE prefix = ?1";

/// Starts counting the changes under prefix `?1`, from `?2`, unless counted already.
pub const WATCH_PREFIX: &str =
    "INSERT OR IGNORE INTO tenure_change (prefix, changes) VALUES (?1, ?2)";

/// Whether a grant whose name starts with `?1` expired after `?2` and by `?3`: a range of
/// the expiry index (grants renewed meanwhile expire later and are not read), each row
/// found then checked for the prefix.
pub const EXPIRED_BETWEEN: &str = "SELECT 1 FROM tenure_lease INDEXED BY tenure_lease_expiry
    WHERE expires_at > ?2 AND expires_at <= ?3 AND substr(name, 1, length(?1)) = ?1 LIMIT 1";

/// Fair acquire, joining: removes the expired waiters of `?1` (at clock `?2`).
pub const PURGE_WAITERS: &str = "DELETE FROM tenure_waiter WHERE name = ?1 AND expires_at <= ?2";

/// Fair acquire, joining: a waiter of `?1` for owner `?2`, instance `?3`, expiring at `?4`;
/// returns its `seq`.
pub const JOIN: &str = "INSERT INTO tenure_waiter (name, owner, instance, expires_at)
    VALUES (?1, ?2, ?3, ?4) RETURNING seq";

/// Waiter `?1`, if unexpired at `?3`, gets expiry `?2`.
pub const REFRESH_WAITER: &str =
    "UPDATE tenure_waiter SET expires_at = ?2 WHERE seq = ?1 AND expires_at > ?3";

/// Whether waiter `?1` is unexpired at `?2`.
pub const WAITER_LIVE: &str = "SELECT 1 FROM tenure_waiter WHERE seq = ?1 AND expires_at > ?2";

/// The first waiter in line for `?1` at clock `?2`: `seq` and expiry.
pub const HEAD: &str = "SELECT seq, expires_at FROM tenure_waiter
    WHERE name = ?1 AND expires_at > ?2 ORDER BY seq LIMIT 1";

/// Removes waiter `?1` from its line.
pub const LEAVE: &str = "DELETE FROM tenure_waiter WHERE seq = ?1";

/// The waiters of `?1`: how many are in line (unexpired at `?2`), and how many rows there
/// are (expired ones stay until a waiter joins the line again).
pub const WAITING: &str = "SELECT count(CASE WHEN expires_at > ?2 THEN 1 END), count(*)
    FROM tenure_waiter WHERE name = ?1";
/// Whether owner `?2` holds `?1` with token `?3`, unexpired at `?4` (the fence's check).
pub const HELD: &str = "SELECT 1 FROM tenure_lease
    WHERE name = ?1 AND owner = ?2 AND token = ?3 AND expires_at > ?4";

/// Remembers id `?2` with lease `?1` (nothing when it already is).
pub const REMEMBER: &str = "INSERT OR IGNORE INTO tenure_remembered (name, id) VALUES (?1, ?2)";

/// Forgets id `?2` of lease `?1`.
pub const FORGET: &str = "DELETE FROM tenure_remembered WHERE name = ?1 AND id = ?2";

/// The ids remembered with lease `?1`, in byte order.
pub const REMEMBERED: &str = "SELECT id FROM tenure_remembered WHERE name = ?1 ORDER BY id";

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tenure_lease::{AcquireRequest, LeaseStore};

    use super::*;
    use crate::SqliteStore;

    #[test]
    fn a_prefix_ends_at_its_last_character_that_has_a_successor() {
        assert_eq!(prefix_end("m/"), Some("m0".into()));
        assert_eq!(prefix_end("ab"), Some("ac".into()));
        assert_eq!(prefix_end("a\u{D7FF}"), Some("a\u{E000}".into()));
        assert_eq!(prefix_end("a\u{10FFFF}"), Some("b".into()));
        assert_eq!(prefix_end("\u{10FFFF}"), None);
        assert_eq!(prefix_end(""), None);
    }

    /// The query plan SQLite chooses for `sql` with `params` on the schema of a new store
    /// in `dir` (file `file`): the plan's lines, joined by "; ".
    fn plans(
        dir: &tempfile::TempDir,
        file: &str,
    ) -> impl Fn(&str, &[&dyn rusqlite::ToSql]) -> String {
        let path = dir.path().join(file);
        drop(SqliteStore::open(&path, Duration::from_secs(1)).unwrap());
        let conn = rusqlite::Connection::open(&path).unwrap();
        move |sql, params| {
            conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .unwrap()
                .query_map(params, |r| r.get::<_, String>(3))
                .unwrap()
                .collect::<rusqlite::Result<Vec<_>>>()
                .unwrap()
                .join("; ")
        }
    }

    #[test]
    fn a_listing_reads_a_range_of_the_name_index() {
        let dir = tempfile::tempdir().unwrap();
        let plan = plans(&dir, "plan.sqlite");
        let bounded = plan(LIST, &[&"m/", &0i64, &"m0"]);
        assert!(
            bounded.contains("SEARCH tenure_lease USING INDEX")
                && bounded.contains("name>? AND name<?"),
            "{bounded}"
        );
        let open = plan(LIST_FROM, &[&"\u{10FFFF}", &0i64]);
        assert!(open.contains("SEARCH tenure_lease USING INDEX"), "{open}");
    }

    /// A change check reads one row of `tenure_change` by key and only the grants that
    /// expired in its window, through the expiry index; a grant's change reads the
    /// `tenure_change` rows alone.
    #[test]
    fn a_change_check_reads_by_index() {
        let dir = tempfile::tempdir().unwrap();
        let plan = plans(&dir, "changes.sqlite");
        let changes = plan(CHANGES, &[&"m/"]);
        assert!(
            changes.contains("SEARCH tenure_change USING PRIMARY KEY"),
            "{changes}"
        );
        let expired = plan(EXPIRED_BETWEEN, &[&"m/", &0i64, &1i64]);
        assert!(
            expired.contains("SEARCH tenure_lease USING INDEX tenure_lease_expiry"),
            "{expired}"
        );
        let changed = plan(CHANGED, &[&"m/a"]);
        assert!(
            changed.contains("tenure_change") && !changed.contains("tenure_lease"),
            "{changed}"
        );
    }

    #[tokio::test]
    async fn a_listing_holds_exactly_the_names_with_the_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            SqliteStore::open(dir.path().join("list.sqlite"), Duration::from_secs(1)).unwrap();
        let names = [
            "m",
            "m.",
            "m/",
            "m/a",
            "m/a/b",
            "m/\u{10FFFF}",
            "m0",
            "m\u{10FFFF}",
            "n",
            "\u{10FFFF}",
            "\u{10FFFF}x",
        ];
        for name in names {
            let req = AcquireRequest {
                name: name.into(),
                owner: "o".into(),
                instance: "i".into(),
                ttl: Duration::from_secs(60),
                ..AcquireRequest::default()
            };
            store.try_acquire(&req).await.unwrap();
        }
        for prefix in ["m/", "m", "m\u{10FFFF}", "\u{10FFFF}", ""] {
            let listed: Vec<String> = store
                .list(prefix)
                .await
                .unwrap()
                .into_iter()
                .map(|r| r.name)
                .collect();
            let mut expected: Vec<String> = names
                .iter()
                .filter(|n| n.starts_with(prefix))
                .map(|n| n.to_string())
                .collect();
            expected.sort();
            assert_eq!(listed, expected, "prefix {prefix:?}");
        }
    }
}
