//! The SQL of the store, in one place: the store runs it, and the benchmark runs the very
//! same statements directly as its baseline. Every statement is one autocommit round trip.
//!
//! All times are the database server's: `clock_timestamp()` is read while the statement
//! runs (after any row lock it waited for), never sent by a client.

/// `expires_at` as microseconds left on the server's clock (0 once passed).
const EXPIRES_IN_US: &str =
    "greatest(0, (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint)";

/// The columns every record-returning statement yields, in [`crate::store`]'s order.
fn record_columns(prefix: &str) -> String {
    format!(
        "{p}name, {p}owner, {p}instance, {p}token, {expires}, {p}version, {p}note",
        p = prefix,
        expires = EXPIRES_IN_US.replace("expires_at", &format!("{prefix}expires_at"))
    )
}

/// The statements of one lease table.
#[derive(Debug, Clone)]
pub struct Statements {
    /// Creates schema, token sequence, table and index when the table is missing (one
    /// transaction, serialised by an advisory lock so concurrent first starts do not
    /// collide). With the table in place it changes nothing and needs no DDL rights.
    pub migrate: String,
    /// `$1` name, `$2` owner, `$3` instance, `$4` ttl in µs, `$5` note. One row: `granted`
    /// (bool) and the record, either the caller's grant or the other owner's unexpired one.
    /// No row: the lease was released between the insert and the look-up; ask again.
    pub acquire: String,
    /// `$1` owner, `$2` names, `$3` tokens, `$4` ttl in µs: renews every listed grant that
    /// `$1` holds unexpired with that token; returns `(name, token)` of the renewed ones.
    pub renew: String,
    /// `$1` name, `$2` owner, `$3` token: ends that unexpired grant; one row affected or none.
    pub release: String,
    /// `$1` name: the unexpired grant.
    pub read: String,
    /// `$1` LIKE pattern (see [`like_prefix`]): the unexpired grants it matches, by name.
    pub list: String,
}

impl Statements {
    /// The statements for table `table` in schema `schema` (plain identifiers, checked by
    /// [`PostgresOptions`](crate::PostgresOptions)).
    pub fn new(schema: &str, table: &str) -> Statements {
        let t = format!("\"{schema}\".\"{table}\"");
        let seq = format!("\"{schema}\".\"{table}_token\"");
        // Reentrant: the same owner and instance still hold an unexpired grant.
        let same = "l.owner = excluded.owner AND l.instance = excluded.instance \
                    AND l.expires_at > excluded.granted_at";
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
END $migrate$"
            ),
            acquire: format!(
                "WITH c AS (SELECT clock_timestamp() AS now),
granted AS (
    INSERT INTO {t} AS l (name, owner, instance, token, granted_at, expires_at, version, note)
    SELECT $1, $2, $3, nextval('{seq}'), c.now, c.now + $4::bigint * interval '1 microsecond', 1, $5::text
    FROM c
    ON CONFLICT (name) DO UPDATE SET
        owner = excluded.owner,
        instance = excluded.instance,
        token = CASE WHEN {same} THEN l.token ELSE nextval('{seq}') END,
        granted_at = CASE WHEN {same} THEN l.granted_at ELSE excluded.granted_at END,
        version = CASE WHEN {same} THEN l.version + 1 ELSE 1 END,
        note = CASE WHEN {same} THEN coalesce(excluded.note, l.note) ELSE excluded.note END,
        expires_at = excluded.expires_at
    WHERE l.expires_at <= excluded.granted_at OR l.owner = excluded.owner
    RETURNING l.*
)
SELECT true AS granted, {granted_cols} FROM granted
UNION ALL
SELECT false, {held_cols} FROM {t} AS l, c
WHERE l.name = $1 AND l.expires_at > c.now AND NOT EXISTS (SELECT 1 FROM granted)",
                granted_cols = record_columns(""),
                held_cols = record_columns("l."),
            ),
            renew: format!(
                "UPDATE {t} AS l
SET expires_at = clock_timestamp() + $4::bigint * interval '1 microsecond', version = l.version + 1
FROM unnest($2::text[], $3::bigint[]) AS b(name, token)
WHERE l.name = b.name AND l.token = b.token AND l.owner = $1::text
  AND l.expires_at > clock_timestamp()
RETURNING l.name, l.token"
            ),
            release: format!(
                "UPDATE {t} SET expires_at = '-infinity'
WHERE name = $1::text AND owner = $2::text AND token = $3::bigint
  AND expires_at > clock_timestamp()"
            ),
            read: format!(
                "SELECT {cols} FROM {t} WHERE name = $1::text AND expires_at > clock_timestamp()",
                cols = record_columns("")
            ),
            list: format!(
                "SELECT {cols} FROM {t}
WHERE name LIKE $1::text ESCAPE '\\' AND expires_at > clock_timestamp() ORDER BY name",
                cols = record_columns("")
            ),
        }
    }
}

/// The LIKE pattern matching every name that starts with `prefix`: `\`, `%` and `_` in
/// the prefix are escaped, so they match only themselves.
pub fn like_prefix(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '\\' | '%' | '_') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_prefix_escapes_wildcards() {
        assert_eq!(like_prefix(""), "%");
        assert_eq!(like_prefix("a_b%c\\"), "a\\_b\\%c\\\\%");
    }
}
