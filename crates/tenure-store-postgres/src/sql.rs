//! The SQL of the store, in one place: the store runs it, and the benchmark runs the very
//! same statements directly as its baseline. Every statement is one autocommit round trip.
//!
//! All times are the database server's: `clock_timestamp()` is read while the statement
//! runs (after any row lock it waited for), never sent by a client.

/// `expires_at` as microseconds left on the server's clock (0 once passed).
const EXPIRES_IN_US: &str =
    "greatest(0, (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint)";

/// The columns every record-returning statement yields, in [`crate::store`]'s order:
/// the grant, then its priority and cleanup timeout, then the pending preemption request
/// (all NULL when none). Priorities are `numeric(20)` (a `u64` does not fit a `bigint`)
/// and travel as text.
fn record_columns(prefix: &str) -> String {
    format!(
        "{p}name, {p}owner, {p}instance, {p}token, {expires}, {p}version, {p}note, \
         {p}priority::text, (extract(epoch FROM {p}cleanup_timeout) * 1000000)::bigint, \
         {request}",
        p = prefix,
        expires = EXPIRES_IN_US.replace("expires_at", &format!("{prefix}expires_at")),
        request = request_columns(prefix),
    )
}

/// The pending request's columns, as [`record_columns`] ends.
fn request_columns(prefix: &str) -> String {
    format!(
        "{p}request_by, {p}request_instance, {p}request_priority::text, \
         {p}request_forceful, {p}request_note",
        p = prefix
    )
}

/// The columns added for priority leases, created on new tables and added to
/// tables made by earlier versions. A request is pending exactly when `request_by` is set.
const PRIORITY_COLUMNS: &str = "ADD COLUMN priority numeric(20) NOT NULL DEFAULT 0,
        ADD COLUMN cleanup_timeout interval NOT NULL DEFAULT '0',
        ADD COLUMN request_by text,
        ADD COLUMN request_instance text,
        ADD COLUMN request_priority numeric(20),
        ADD COLUMN request_forceful boolean,
        ADD COLUMN request_note text";

/// A forceful preemption request is pending on the row `l`: its renewals are refused.
const FORCED: &str = "coalesce(l.request_forceful, false)";

/// The statements of one lease table.
#[derive(Debug, Clone)]
pub struct Statements {
    /// Creates schema, token sequence, table and index when the table is missing, the
    /// priority columns when a table of an earlier version lacks them, and the fair
    /// waiters' table (`<table>_waiter`), the change counts (`<table>_change`), the
    /// expiry index (`<table>_expiry`), the grant index (`<table>_grant`, unique on name
    /// and token: it makes a new grant wait for the [`Fence`](crate::Fence)'s fenced writes
    /// and lets renewals pass them) and the remembered ids' table when they are missing (one transaction,
    /// serialised by an advisory lock so concurrent first starts do not collide). With the
    /// table complete it changes nothing and needs no DDL rights.
    pub migrate: String,
    /// `$1` name, `$2` owner, `$3` instance, `$4` ttl in µs, `$5` note, `$6` priority
    /// (text), `$7` cleanup timeout in µs, `$8` whether the request may take over a
    /// lower-priority grant at once (emergency). One row: `granted` (bool) and the record,
    /// either the caller's grant or the other holder's unexpired one (another owner's, or
    /// another instance's of the same owner). No row: the lease was released between the
    /// insert and the look-up; ask again. A grant with a forceful request pending is not
    /// refreshed, even by its own instance: it ends at its expiry. `$9` token and `$10`
    /// version (or NULL): an expired grant is taken over only if it is still that one (the
    /// contender rule of `observed-expiry`).
    pub acquire: String,
    /// `$1` name: the row whatever its expiry: the record, then whether it is unexpired
    /// and whether it was released.
    pub observe: String,
    /// `$1` count: takes that many values of the token sequence (past a high-water mark
    /// after the sequence went back); returns the last.
    pub advance: String,
    /// `$1` owner, `$2` names, `$3` tokens, `$4` ttl in µs: renews every listed grant that
    /// `$1` holds unexpired with that token and without a forceful request pending; returns
    /// `(name, token)` and the request columns of every such grant, refused ones included
    /// (their `request_forceful` is true and their expiry unchanged).
    pub renew: String,
    /// `$1` name, `$2` owner, `$3` token: ends that unexpired grant (and drops its
    /// request); one row (the name) when it ended, none otherwise. When fair waiters of
    /// the name are in line, the same statement notifies them (`pg_notify` on
    /// [`Statements::channel`], delivered when it commits).
    pub release: String,
    /// The channel fair waiters LISTEN on and releases and departures from the line
    /// `pg_notify` on: `<schema>.<table>`, cut to PostgreSQL's 63 bytes (tables whose names
    /// share those bytes share a channel: more wake-ups, never fewer). The payload is the
    /// lease name, or empty (wake every waiter) for names longer than 1000 bytes.
    pub channel: String,
    /// Fair acquire, joining the line: `$1` name, `$2` owner, `$3` instance, `$4` the
    /// waiter's ttl in µs. Removes the name's expired waiter rows and adds one for the
    /// caller, returning its `seq`; no row when `$2` and `$3` already hold the lease
    /// unexpired (and not forcefully preempted): re-enter with [`Statements::acquire`].
    pub join: String,
    /// `$1` seq, `$2` name, `$3` the waiter's ttl in µs: one row: whether waiter `$1` is
    /// still in line (unexpired; its expiry is then refreshed), and the first waiter in
    /// line for `$2` (`seq`, then its expiry in µs; NULLs when the line is empty).
    pub line: String,
    /// [`Statements::acquire`] for waiter `$11` (a `seq`), the same parameters before it:
    /// only when `$11` is unexpired and no unexpired waiter of the name came before it
    /// (it is first in line). A grant removes the waiter's row in the same statement.
    pub fair_acquire: String,
    /// `$1` seq: removes that waiter from the line and notifies the name's channel (one
    /// row, the name, when it was there).
    pub leave: String,
    /// `$1` name: how many waiters are in line (unexpired), and how many rows there are
    /// (expired ones stay until a waiter joins the name's line again).
    pub waiting: String,
    /// `$1` name, `$2` token, `$3` by, `$4` instance, `$5` priority (text), `$6` forceful,
    /// `$7` note: records the request on that unexpired grant when it outranks the grant
    /// and the pending request (if any) is `$3`'s or of lower priority
    /// ([`PreemptionRequest::may_replace`](tenure_lease::PreemptionRequest::may_replace)).
    /// One row: `recorded` (bool) and the record; no row: the grant is gone.
    pub request_preemption: String,
    /// `$1` name, `$2` token, `$3` by: removes `$3`'s request from that unexpired grant;
    /// one row affected or none.
    pub withdraw_preemption: String,
    /// `$1` name: the unexpired grant.
    pub read: String,
    /// `$1` prefix, `$2` [`prefix_end`](tenure_lease::names::prefix_end) of it: the
    /// unexpired grants whose names start with `$1`, by name. A range of the primary key's
    /// index, which a generic plan of the prepared statement keeps (`LIKE $1` would make
    /// such a plan read the whole table).
    pub list: String,
    /// `$1` prefix that no string is above: the unexpired grants from `$1` on, by name.
    pub list_from: String,
    /// `$1` name, `$2` owner, `$3` token, `$4` ids to add, `$5` ids to remove: applies both
    /// to the ids remembered with `$1` (table `<table>_remembered`) if `$2` holds `$1`
    /// unexpired with `$3`, whose grant it locks (`FOR KEY SHARE`, as the fence does) so
    /// that no other grant commits in between. One row: whether it did. Idempotent.
    pub remember: String,
    /// `$1` name: the ids remembered with it, in byte order.
    pub remembered: String,
    /// `$1` prefix, `$2` the previous check's instant (µs since the epoch on the server's
    /// clock, or NULL): one row: the prefix's count of grants made and ended (table
    /// `<table>_change`, bumped by [`Statements::acquire`] and [`Statements::release`];
    /// the row is made by the first check of a prefix, starting at the clock in µs),
    /// this check's instant in µs, and whether a grant under the prefix expired after `$2`
    /// and by now (a range of the expiry index: only such grants are read). A NULL count:
    /// the row was made by a check running at the same time.
    pub changes: String,
}

/// The statements the store prepares on its connections, each in its own slot
/// ([`crate::pool::Connection::statement`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sql {
    Acquire,
    FairAcquire,
    Observe,
    Advance,
    Renew,
    Release,
    Join,
    Line,
    Leave,
    RequestPreemption,
    WithdrawPreemption,
    Read,
    List,
    ListFrom,
    Remember,
    Remembered,
    Changes,
}

impl Sql {
    /// How many there are: the slots of a connection.
    pub(crate) const COUNT: usize = Sql::Changes as usize + 1;
}

impl Statements {
    /// The text of statement `sql`.
    pub(crate) fn text(&self, sql: Sql) -> &str {
        match sql {
            Sql::Acquire => &self.acquire,
            Sql::FairAcquire => &self.fair_acquire,
            Sql::Observe => &self.observe,
            Sql::Advance => &self.advance,
            Sql::Renew => &self.renew,
            Sql::Release => &self.release,
            Sql::Join => &self.join,
            Sql::Line => &self.line,
            Sql::Leave => &self.leave,
            Sql::RequestPreemption => &self.request_preemption,
            Sql::WithdrawPreemption => &self.withdraw_preemption,
            Sql::Read => &self.read,
            Sql::List => &self.list,
            Sql::ListFrom => &self.list_from,
            Sql::Remember => &self.remember,
            Sql::Remembered => &self.remembered,
            Sql::Changes => &self.changes,
        }
    }

    /// The statements for table `table` in schema `schema` (plain identifiers, checked by
    /// [`PostgresOptions`](crate::PostgresOptions)).
    pub fn new(schema: &str, table: &str) -> Statements {
        let t = format!("\"{schema}\".\"{table}\"");
        let seq = format!("\"{schema}\".\"{table}_token\"");
        let w = format!("\"{schema}\".\"{table}_waiter\"");
        let channel = channel(schema, table);
        // Wakes the fair waiters of the lease named by `name_expr` (see `channel`).
        let notify = |name_expr: &str| {
            format!(
                "(SELECT count(*) FROM (SELECT pg_notify('{channel}', \
                 CASE WHEN octet_length({name_expr}) <= {MAX_PAYLOAD} THEN {name_expr} ELSE '' END)) n)"
            )
        };
        let r = format!("\"{schema}\".\"{table}_remembered\"");
        let ch = format!("\"{schema}\".\"{table}_change\"");
        // Every prefix counted in `ch` that the name `name_expr` starts with changed, once
        // the statement's `cte` returned a row.
        let changed = |cte: &str, name_expr: &str| {
            format!(
                "changed AS (UPDATE {ch} SET changes = changes + 1
    WHERE EXISTS (SELECT 1 FROM {cte}) AND starts_with({name_expr}, prefix))"
            )
        };
        // Drops the pending preemption request.
        let clear = "request_by = NULL, request_instance = NULL, request_priority = NULL, \
                     request_forceful = NULL, request_note = NULL";
        Statements {
            migrate: format!(
                "SELECT pg_advisory_xact_lock(hashtext('tenure-migrate'));
DO $migrate$ BEGIN
IF to_regclass('{t}') IS NULL THEN
    CREATE SCHEMA IF NOT EXISTS \"{schema}\";
    CREATE SEQUENCE IF NOT EXISTS {seq} AS bigint;
    CREATE TABLE {t} (
        name       text COLLATE \"C\" PRIMARY KEY,
        owner      text NOT NULL,
        instance   text NOT NULL,
        token      bigint NOT NULL,
        granted_at timestamptz NOT NULL,
        expires_at timestamptz NOT NULL,
        version    bigint NOT NULL,
        note       text
    );
    CREATE INDEX \"{table}_owner\" ON {t} (owner);
    COMMENT ON TABLE {t} IS 'Tenure leases: one row per lease name, never deleted (a release sets expires_at to -infinity). Times are this server''s clock.';
    COMMENT ON COLUMN {t}.token IS 'Fencing token from {schema}.{table}_token: strictly increasing per name, unique per grant.';
    COMMENT ON COLUMN {t}.note IS 'Free text the holder gave when acquiring (who and why).';
END IF;
IF NOT EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = '{t}'::regclass AND attname = 'priority' AND NOT attisdropped) THEN
    ALTER TABLE {t} {PRIORITY_COLUMNS};
    COMMENT ON COLUMN {t}.request_by IS 'Owner of the pending preemption request on the grant (NULL: none). A forceful one stops renewals: the grant ends at expires_at.';
END IF;
IF to_regclass('{w}') IS NULL THEN
    CREATE TABLE {w} (
        seq        bigserial PRIMARY KEY,
        name       text COLLATE \"C\" NOT NULL,
        owner      text NOT NULL,
        instance   text NOT NULL,
        joined_at  timestamptz NOT NULL,
        expires_at timestamptz NOT NULL
    );
    CREATE INDEX \"{table}_waiter_line\" ON {w} (name, seq);
    COMMENT ON TABLE {w} IS 'Tenure fair acquires in line, per lease name in seq order. A waiter refreshes expires_at while it waits; an expired row holds nobody back. Times are this server''s clock.';
END IF;
IF to_regclass('{ch}') IS NULL THEN
    CREATE TABLE {ch} (
        prefix  text COLLATE \"C\" PRIMARY KEY,
        changes bigint NOT NULL
    );
    COMMENT ON TABLE {ch} IS 'Tenure change counts: per lease name prefix a client asked about, the grants under it made and ended, bumped in the statement that makes or ends one.';
END IF;
IF to_regclass('\"{schema}\".\"{table}_expiry\"') IS NULL THEN
    CREATE INDEX \"{table}_expiry\" ON {t} (expires_at);
END IF;
IF to_regclass('\"{schema}\".\"{table}_grant\"') IS NULL THEN
    CREATE UNIQUE INDEX \"{table}_grant\" ON {t} (name, token);
    COMMENT ON INDEX \"{schema}\".\"{table}_grant\" IS 'Makes token a key column: a new grant (a new token) takes the row''s FOR UPDATE lock, which waits for every fenced write (FOR KEY SHARE) of the grant before it; renewals and releases do not.';
END IF;
IF to_regclass('{r}') IS NULL THEN
    CREATE TABLE {r} (
        name text COLLATE \"C\" NOT NULL,
        id   text COLLATE \"C\" NOT NULL,
        PRIMARY KEY (name, id)
    );
    COMMENT ON TABLE {r} IS 'Ids remembered with a lease of {schema}.{table} (remember-entities): written only under the lease''s current grant, never expiring.';
END IF;
END $migrate$"
            ),
            acquire: acquire(&t, &seq, &ch, None),
            fair_acquire: acquire(&t, &seq, &ch, Some(&w)),
            // A refused (forced) row is "updated" to itself, so that the row lock and the
            // re-check of a concurrently changed row (READ COMMITTED) decide renewal and
            // refusal alike, on the row's latest version.
            renew: format!(
                "UPDATE {t} AS l
SET expires_at = CASE WHEN {FORCED} THEN l.expires_at
                      ELSE clock_timestamp() + $4::bigint * interval '1 microsecond' END,
    version = CASE WHEN {FORCED} THEN l.version ELSE l.version + 1 END
FROM unnest($2::text[], $3::bigint[]) AS b(name, token)
WHERE l.name = b.name AND l.token = b.token AND l.owner = $1::text
  AND l.expires_at > clock_timestamp()
RETURNING l.name, l.token, {request}",
                request = request_columns("l."),
            ),
            // A waiter that joins after this statement's snapshot is not notified; it
            // needs not be: it reads the lease after joining, and its acquire takes the
            // lease row's lock, so it sees this release once committed.
            release: format!(
                "WITH released AS (
    UPDATE {t} SET expires_at = '-infinity', {clear}
    WHERE name = $1::text AND owner = $2::text AND token = $3::bigint
      AND expires_at > clock_timestamp()
    RETURNING name
),
{changed}
SELECT r.name FROM released r
WHERE NOT EXISTS (SELECT 1 FROM {w} w WHERE w.name = r.name) OR {woken} >= 0",
                woken = notify("r.name"),
                changed = changed("released", "$1::text"),
            ),
            join: format!(
                "WITH c AS (SELECT clock_timestamp() AS now),
purged AS (DELETE FROM {w} w USING c WHERE w.name = $1::text AND w.expires_at <= c.now),
joined AS (
    INSERT INTO {w} (name, owner, instance, joined_at, expires_at)
    SELECT $1::text, $2::text, $3::text, c.now, c.now + $4::bigint * interval '1 microsecond'
    FROM c
    WHERE NOT EXISTS (SELECT 1 FROM {t} l WHERE l.name = $1::text AND l.owner = $2::text
                      AND l.instance = $3::text AND l.expires_at > c.now AND NOT {FORCED})
    RETURNING seq
)
SELECT seq FROM joined"
            ),
            line: format!(
                "WITH c AS (SELECT clock_timestamp() AS now),
me AS (
    UPDATE {w} w SET expires_at = c.now + $3::bigint * interval '1 microsecond' FROM c
    WHERE w.seq = $1::bigint AND w.expires_at > c.now
    RETURNING w.seq
)
SELECT EXISTS (SELECT 1 FROM me), h.seq, {head_expires}
FROM c LEFT JOIN LATERAL (
    SELECT w.seq, w.expires_at FROM {w} w
    WHERE w.name = $2::text AND w.expires_at > c.now ORDER BY w.seq LIMIT 1
) h ON true",
                head_expires = EXPIRES_IN_US.replace("expires_at", "h.expires_at"),
            ),
            leave: format!(
                "WITH gone AS (DELETE FROM {w} WHERE seq = $1::bigint RETURNING name)
SELECT g.name FROM gone g WHERE {woken} >= 0",
                woken = notify("g.name"),
            ),
            waiting: format!(
                "SELECT count(CASE WHEN expires_at > clock_timestamp() THEN 1 END), count(*)
FROM {w} WHERE name = $1::text"
            ),
            channel,
            request_preemption: format!(
                "WITH c AS (SELECT clock_timestamp() AS now),
recorded AS (
    UPDATE {t} AS l SET request_by = $3::text, request_instance = $4::text,
        request_priority = $5::text::numeric, request_forceful = $6::boolean,
        request_note = $7::text
    FROM c
    WHERE l.name = $1::text AND l.token = $2::bigint AND l.expires_at > c.now
      AND l.priority < $5::text::numeric
      AND (l.request_by IS NULL OR l.request_by = $3::text
           OR l.request_priority < $5::text::numeric)
    RETURNING l.*
)
SELECT true AS recorded, {recorded_cols} FROM recorded
UNION ALL
SELECT false, {held_cols} FROM {t} AS l, c
WHERE l.name = $1::text AND l.token = $2::bigint AND l.expires_at > c.now
  AND NOT EXISTS (SELECT 1 FROM recorded)",
                recorded_cols = record_columns(""),
                held_cols = record_columns("l."),
            ),
            withdraw_preemption: format!(
                "UPDATE {t} SET {clear}
WHERE name = $1::text AND token = $2::bigint AND request_by = $3::text
  AND expires_at > clock_timestamp()"
            ),
            observe: format!(
                "SELECT {cols}, expires_at > clock_timestamp(), expires_at = '-infinity'
FROM {t} WHERE name = $1::text",
                cols = record_columns("")
            ),
            advance: format!(
                "SELECT max(nextval('{seq}')) FROM generate_series(1, $1::bigint)"
            ),
            read: format!(
                "SELECT {cols} FROM {t} WHERE name = $1::text AND expires_at > clock_timestamp()",
                cols = record_columns("")
            ),
            list: format!(
                "SELECT {cols} FROM {t}
WHERE name >= $1::text AND name < $2::text AND expires_at > clock_timestamp() ORDER BY name",
                cols = record_columns("")
            ),
            list_from: format!(
                "SELECT {cols} FROM {t}
WHERE name >= $1::text AND expires_at > clock_timestamp() ORDER BY name",
                cols = record_columns("")
            ),
            remember: format!(
                "WITH held AS (
    SELECT 1 FROM {t}
    WHERE name = $1::text AND owner = $2::text AND token = $3::bigint
      AND expires_at > clock_timestamp()
    FOR KEY SHARE
),
added AS (
    INSERT INTO {r} (name, id)
    SELECT $1::text, a.id FROM held, unnest($4::text[]) AS a(id)
    ON CONFLICT DO NOTHING
),
removed AS (
    DELETE FROM {r}
    WHERE name = $1::text AND id = ANY($5::text[]) AND EXISTS (SELECT 1 FROM held)
)
SELECT EXISTS (SELECT 1 FROM held)"
            ),
            remembered: format!("SELECT id FROM {r} WHERE name = $1::text ORDER BY id"),
            changes: format!(
                "WITH c AS (SELECT clock_timestamp() AS now),
watched AS (
    INSERT INTO {ch} (prefix, changes)
    SELECT $1::text, (extract(epoch FROM c.now) * 1000000)::bigint FROM c
    ON CONFLICT (prefix) DO NOTHING
    RETURNING changes
)
SELECT coalesce((SELECT changes FROM watched), (SELECT changes FROM {ch} WHERE prefix = $1::text)),
       (extract(epoch FROM c.now) * 1000000)::bigint,
       EXISTS (SELECT 1 FROM {t}
               WHERE expires_at > timestamptz 'epoch' + $2::bigint * interval '1 microsecond'
                 AND expires_at <= c.now AND starts_with(name, $1::text))
FROM c"
            ),
        }
    }
}

/// The acquire statement of lease table `t` with token sequence `seq`; with `waiters`
/// (the waiters' table), the fair variant for waiter `$11` (see [`Statements::fair_acquire`]).
fn acquire(t: &str, seq: &str, ch: &str, waiters: Option<&str>) -> String {
    // Reentrant: the same owner and instance still hold an unexpired grant.
    let same = "l.owner = excluded.owner AND l.instance = excluded.instance \
                AND l.expires_at > excluded.granted_at";
    let (first_in_line, leave_line) = match waiters {
        None => (String::new(), String::new()),
        Some(w) => (
            format!(
                "
    WHERE EXISTS (SELECT 1 FROM {w} w WHERE w.seq = $11::bigint AND w.expires_at > c.now)
      AND NOT EXISTS (SELECT 1 FROM {w} w WHERE w.name = $1::text AND w.seq < $11::bigint
                      AND w.expires_at > c.now)"
            ),
            format!(
                ",
left_line AS (DELETE FROM {w} w WHERE w.seq = $11::bigint AND EXISTS (SELECT 1 FROM granted))"
            ),
        ),
    };
    format!(
        "WITH c AS (SELECT clock_timestamp() AS now),
granted AS (
    INSERT INTO {t} AS l (name, owner, instance, token, granted_at, expires_at, version, note,
                          priority, cleanup_timeout)
    SELECT $1, $2, $3, nextval('{seq}'), c.now, c.now + $4::bigint * interval '1 microsecond', 1,
           $5::text, $6::text::numeric, $7::bigint * interval '1 microsecond'
    FROM c{first_in_line}
    ON CONFLICT (name) DO UPDATE SET
        owner = excluded.owner,
        instance = excluded.instance,
        token = CASE WHEN {same} THEN l.token ELSE nextval('{seq}') END,
        granted_at = CASE WHEN {same} THEN l.granted_at ELSE excluded.granted_at END,
        version = CASE WHEN {same} THEN l.version + 1 ELSE 1 END,
        note = CASE WHEN {same} THEN coalesce(excluded.note, l.note) ELSE excluded.note END,
        priority = CASE WHEN {same} THEN l.priority ELSE excluded.priority END,
        cleanup_timeout = CASE WHEN {same} THEN l.cleanup_timeout ELSE excluded.cleanup_timeout END,
        request_by = CASE WHEN {same} THEN l.request_by END,
        request_instance = CASE WHEN {same} THEN l.request_instance END,
        request_priority = CASE WHEN {same} THEN l.request_priority END,
        request_forceful = CASE WHEN {same} THEN l.request_forceful END,
        request_note = CASE WHEN {same} THEN l.request_note END,
        expires_at = excluded.expires_at
    WHERE (l.expires_at <= excluded.granted_at
           AND ($9::bigint IS NULL OR (l.token = $9::bigint AND l.version = $10::bigint)))
       OR (l.owner = excluded.owner AND l.instance = excluded.instance AND NOT {FORCED})
       OR ($8::boolean AND l.owner <> excluded.owner AND l.priority < excluded.priority)
    RETURNING l.*
),
before AS (SELECT note FROM {t} WHERE name = $1::text),
changed AS (UPDATE {ch} SET changes = changes + 1
    WHERE EXISTS (SELECT 1 FROM granted g
                  WHERE g.version = 1 OR g.note IS DISTINCT FROM (SELECT note FROM before))
      AND starts_with($1::text, prefix)){leave_line}
SELECT true AS granted, {granted_cols} FROM granted
UNION ALL
SELECT false, {held_cols} FROM {t} AS l, c
WHERE l.name = $1 AND l.expires_at > c.now AND NOT EXISTS (SELECT 1 FROM granted)",
        granted_cols = record_columns(""),
        held_cols = record_columns("l."),
    )
}

/// Longest lease name sent as a notification's payload; longer names send an empty one
/// (PostgreSQL refuses payloads of 8000 bytes and more).
const MAX_PAYLOAD: usize = 1000;

/// PostgreSQL's longest identifier (and channel name), in bytes.
const MAX_CHANNEL: usize = 63;

/// The notification channel of a lease table (see [`Statements::channel`]). Schema and
/// table are plain ASCII identifiers, so a byte cut is a character cut.
fn channel(schema: &str, table: &str) -> String {
    let mut channel = format!("{schema}.{table}");
    channel.truncate(MAX_CHANNEL);
    channel
}
