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
    /// One statement for one grant ([`check`](Self::check)) and for many (the journal's
    /// batches): the grants travel as arrays.
    check: String,
}

impl Fence {
    pub(crate) fn new(schema: &str, table: &str) -> Fence {
        Fence {
            // The lease table's unique index on (name, token) makes the token a key column:
            // a new grant changes it, which takes the row's FOR UPDATE lock, and FOR KEY
            // SHARE conflicts with that, so no other grant of the name can commit until the
            // caller's transaction ends. Renewals and releases change no key column (FOR NO
            // KEY UPDATE): they do not wait for the caller, nor the caller for them. Each
            // grant's row is locked, in one statement.
            check: format!(
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
        let grants = Grants::new(&[(name, owner, token)]);
        let held = match grants.params() {
            None => false,
            Some(params) => {
                let rows = tx
                    .query(self.check.as_str(), &params)
                    .await
                    .map_err(|e| FenceError::failed(name, crate::error::STORE, e))?;
                grants.held(&rows)[0]
            }
        };
        if held {
            Ok(())
        } else {
            Err(FenceError::not_held(name, owner, token))
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
        let grants = Grants::new(grants);
        let Some(params) = grants.params() else {
            return Ok(grants.held(&[]));
        };
        let statement = tx.prepare_cached(&self.check).await?;
        let rows = tx.query(&statement, &params).await?;
        Ok(grants.held(&rows))
    }
}

/// Grants to check, as the statement's array parameters.
struct Grants<'a> {
    names: Vec<&'a str>,
    owners: Vec<&'a str>,
    tokens: Vec<i64>,
    /// The grant each array element is (a token past the database's integer is held by
    /// nobody, and not sent).
    index: Vec<usize>,
    len: usize,
}

impl<'a> Grants<'a> {
    fn new(grants: &[(&'a str, &'a str, FencingToken)]) -> Self {
        let mut g = Grants {
            names: vec![],
            owners: vec![],
            tokens: vec![],
            index: vec![],
            len: grants.len(),
        };
        for (i, &(name, owner, token)) in grants.iter().enumerate() {
            if let Ok(t) = i64::try_from(token.get()) {
                g.names.push(name);
                g.owners.push(owner);
                g.tokens.push(t);
                g.index.push(i);
            }
        }
        g
    }

    /// The statement's parameters; `None` when no grant can be held.
    fn params(&self) -> Option<[&(dyn tokio_postgres::types::ToSql + Sync); 3]> {
        (!self.index.is_empty()).then_some([
            &self.names as &(dyn tokio_postgres::types::ToSql + Sync),
            &self.owners,
            &self.tokens,
        ])
    }

    /// Whether each grant is held, from the rows the statement returned (each the
    /// 1-based ordinal of a held grant's array element).
    fn held(&self, rows: &[tokio_postgres::Row]) -> Vec<bool> {
        let mut held = vec![false; self.len];
        for row in rows {
            let at = row.get::<_, i64>(0);
            if let Some(&i) = usize::try_from(at - 1).ok().and_then(|a| self.index.get(a)) {
                held[i] = true;
            }
        }
        held
    }
}
