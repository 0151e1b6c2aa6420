//! The journal's SQL, in one place: the journal runs it, and the benchmark issues the very
//! same fenced insert by hand as its baseline.

/// The statements of the journal beside one lease table (`<table>_journal`,
/// `<table>_snapshot`).
#[derive(Debug, Clone)]
pub struct JournalStatements {
    /// Creates the journal's tables when missing (one transaction, serialised by an
    /// advisory lock so concurrent first starts do not collide).
    pub migrate: String,
    /// `$1` persistence id, `$2` first sequence number, `$3` token, `$4` writer, `$5` the
    /// events (`bytea[]`): inserts them numbered from `$2` if `$2` is the journal's next
    /// sequence number, nothing otherwise (rows affected: the number of events, or 0). Run
    /// after the fence's check, in its transaction.
    pub insert: String,
    /// `$1` persistence id: its last sequence number (0: none).
    pub last_seq: String,
    /// `$1` persistence ids (`text[]`): each one's last sequence number (0: none), as rows
    /// (persistence id, last), one per element. A batch reads every journal it writes to
    /// with it in one round trip.
    pub last_seqs: String,
    /// `$1` persistence ids, `$2` sequence numbers, `$3` tokens, `$4` writers, `$5`
    /// payloads (arrays of one element per event): inserts every event as given, in one
    /// statement. No sequence check of its own: the caller decided from
    /// [`last_seqs`](Self::last_seqs) read in the same transaction after the fence's
    /// check, and a sequence number another transaction wrote since fails the statement
    /// with a unique violation (nothing of it written).
    pub insert_rows: String,
    /// `$1` persistence id, `$2` from, `$3` at most: its events from `$2` on, in order
    /// (seq, token, writer, payload).
    pub read: String,
    /// `$1` persistence id, `$2` seq, `$3` token, `$4` payload: keeps the snapshot unless a
    /// later one is kept.
    pub save_snapshot: String,
    /// `$1` persistence ids, `$2` seqs, `$3` tokens, `$4` payloads (arrays, at most one
    /// element per persistence id): [`save_snapshot`](Self::save_snapshot) for each, in one
    /// statement.
    pub save_snapshots: String,
    /// `$1` persistence id: its snapshot (seq, token, payload).
    pub load_snapshot: String,
    /// Every persistence id with events, in byte order.
    pub persistence_ids: String,
}

impl JournalStatements {
    /// The statements of the journal beside lease table `table` of schema `schema` (plain
    /// identifiers, checked by [`PostgresOptions`](crate::PostgresOptions)).
    pub fn new(schema: &str, table: &str) -> JournalStatements {
        let j = format!("\"{schema}\".\"{table}_journal\"");
        let s = format!("\"{schema}\".\"{table}_snapshot\"");
        JournalStatements {
            migrate: format!(
                "SELECT pg_advisory_xact_lock(hashtext('tenure-migrate-journal'));
CREATE SCHEMA IF NOT EXISTS \"{schema}\";
CREATE TABLE IF NOT EXISTS {j} (
    ordering       bigserial PRIMARY KEY,
    persistence_id text COLLATE \"C\" NOT NULL,
    seq            bigint NOT NULL,
    token          bigint NOT NULL,
    writer         text NOT NULL,
    written_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    payload        bytea NOT NULL,
    UNIQUE (persistence_id, seq)
);
COMMENT ON TABLE {j} IS 'Tenure journal: the events of each persistence id numbered 1, 2, 3... without gaps, each appended in one transaction with the check of the grant (token) of a lease of {schema}.{table}.';
CREATE TABLE IF NOT EXISTS {s} (
    persistence_id text COLLATE \"C\" PRIMARY KEY,
    seq            bigint NOT NULL,
    token          bigint NOT NULL,
    payload        bytea NOT NULL
);"
            ),
            insert: format!(
                "INSERT INTO {j} (persistence_id, seq, token, writer, payload)
SELECT $1::text, $2::bigint + u.ord - 1, $3::bigint, $4::text, u.p
FROM unnest($5::bytea[]) WITH ORDINALITY AS u(p, ord)
WHERE (SELECT coalesce(max(seq), 0) FROM {j} WHERE persistence_id = $1::text) = $2::bigint - 1"
            ),
            last_seq: format!(
                "SELECT coalesce(max(seq), 0)::bigint FROM {j} WHERE persistence_id = $1::text"
            ),
            last_seqs: format!(
                "SELECT p.id, coalesce((SELECT max(seq) FROM {j} WHERE persistence_id = p.id), 0)::bigint
FROM unnest($1::text[]) AS p(id)"
            ),
            insert_rows: format!(
                "INSERT INTO {j} (persistence_id, seq, token, writer, payload)
SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::bytea[])"
            ),
            read: format!(
                "SELECT seq, token, writer, payload FROM {j}
WHERE persistence_id = $1::text AND seq >= $2::bigint ORDER BY seq LIMIT $3::bigint"
            ),
            save_snapshot: format!(
                "INSERT INTO {s} AS k (persistence_id, seq, token, payload)
VALUES ($1::text, $2::bigint, $3::bigint, $4::bytea)
ON CONFLICT (persistence_id) DO UPDATE SET seq = excluded.seq, token = excluded.token,
    payload = excluded.payload
WHERE excluded.seq >= k.seq"
            ),
            save_snapshots: format!(
                "INSERT INTO {s} AS k (persistence_id, seq, token, payload)
SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bytea[])
ON CONFLICT (persistence_id) DO UPDATE SET seq = excluded.seq, token = excluded.token,
    payload = excluded.payload
WHERE excluded.seq >= k.seq"
            ),
            load_snapshot: format!(
                "SELECT seq, token, payload FROM {s} WHERE persistence_id = $1::text"
            ),
            persistence_ids: format!(
                "SELECT DISTINCT persistence_id FROM {j} ORDER BY persistence_id"
            ),
        }
    }
}
