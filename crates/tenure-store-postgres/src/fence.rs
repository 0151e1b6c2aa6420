//! Writes guarded by the lease, in the same database: the token check runs inside the
//! caller's own transaction and keeps the grant from changing until it commits, without
//! holding back the holder's renewals.
//!
//! ```no_run
//! # async fn f(store: &tenure_store_postgres::PostgresStore, token: tenure_lease::FencingToken) -> Result<(), Box<dyn std::error::Error>> {
//! let mut conn = store.connection().await?;
//! let tx = conn.transaction().await?;
//! store.fence().check(&tx, "nightly-report", "10.0.0.7:2552", token).await?;
//! tx.execute("UPDATE report SET done = true", &[]).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```

use tenure_lease::{FenceError, FencingToken};

/// The token check of one lease table (from [`PostgresStore::fence`](crate::PostgresStore::fence)).
#[derive(Debug, Clone)]
pub struct Fence {
    check: String,
    /// The same check for many grants at once (the journal's batches).
    check_many: String,
}

impl Fence {
    pub(crate) fn new(schema: &str, table: &str) -> Fence {
        Fence {
            // The lease table's unique index on (name, token) makes the token a key column:
            // a new grant changes it, which takes the row's FOR UPDATE lock, and FOR KEY
            // SHARE conflicts with that, so no other grant of the name can commit until the
            // caller's transaction ends. Renewals and releases change no key column (FOR NO
            // KEY UPDATE): they do not wait for the caller, nor the caller for them.
            check: format!(
                "SELECT 1 FROM \"{schema}\".\"{table}\"
WHERE name = $1::text AND owner = $2::text AND token = $3::bigint
  AND expires_at > clock_timestamp() FOR KEY SHARE"
            ),
            // The same lock on every grant that is held, in one statement.
            check_many: format!(
                "SELECT f.i FROM unnest($1::text[], $2::text[], $3::bigint[])
    WITH ORDINALITY AS f(name, owner, token, i)
JOIN \"{schema}\".\"{table}\" AS t
  ON t.name = f.name AND t.owner = f.owner AND t.token = f.token
WHERE t.expires_at > clock_timestamp() FOR KEY SHARE OF t"
            ),
        }
    }

    /// Inside the caller's transaction `tx` (a transaction, because the row lock that
    /// makes the check hold until commit ends with it): `Ok(())` when `owner` holds `name` with
    /// `token`, unexpired on the server's clock. The grant then stays locked until `tx`
    /// ends, so the caller's writes commit before any later grant of `name` can: a holder
    /// that paused past its ttl is refused here, never after. The holder's renewals (and
    /// its release) do not wait for `tx`; another holder's acquire does, so keep such
    /// transactions short. `Err(FenceError)` not held, or the check failed (the store's
    /// error as its source).
    pub async fn check(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        name: &str,
        owner: &str,
        token: FencingToken,
    ) -> Result<(), FenceError> {
        let not_held = || FenceError::not_held(name, owner, token);
        let Ok(t) = i64::try_from(token.get()) else {
            return Err(not_held());
        };
        let rows = tx
            .query(&self.check, &[&name, &owner, &t])
            .await
            .map_err(|e| FenceError::failed(name, crate::error::STORE, e))?;
        if rows.is_empty() {
            Err(not_held())
        } else {
            Ok(())
        }
    }

    /// [`check`](Self::check) of every `(name, owner, token)` of `grants` in one statement
    /// (prepared once per connection) inside `tx`: `Ok(held)` with `held[i]` true when
    /// `grants[i]` is held, its grant then locked until `tx` ends as `check` locks it.
    /// `Err`: the check failed (nothing is known of any grant).
    pub(crate) async fn check_many(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        grants: &[(&str, &str, FencingToken)],
    ) -> Result<Vec<bool>, tokio_postgres::Error> {
        let mut held = vec![false; grants.len()];
        // A token past the database's integer is held by nobody.
        let (mut names, mut owners, mut tokens, mut index) = (vec![], vec![], vec![], vec![]);
        for (i, (name, owner, token)) in grants.iter().enumerate() {
            if let Ok(t) = i64::try_from(token.get()) {
                names.push(*name);
                owners.push(*owner);
                tokens.push(t);
                index.push(i);
            }
        }
        if index.is_empty() {
            return Ok(held);
        }
        let statement = tx.prepare_cached(&self.check_many).await?;
        for row in tx.query(&statement, &[&names, &owners, &tokens]).await? {
            let at = row.get::<_, i64>(0);
            if let Some(&i) = usize::try_from(at - 1).ok().and_then(|a| index.get(a)) {
                held[i] = true;
            }
        }
        Ok(held)
    }
}
