//! # tenure-store-postgres
//!
//! A lease store in one PostgreSQL table (and one for fair waiters), for processes on many
//! hosts that share a database.
//!
//! ```toml
//! [lease.postgres]
//! store = "postgres"
//! url = "postgres://tenure@db.internal:5432/app"
//! schema = "tenure"
//! ```
//!
//! **Time.** Expiry is computed by the database server, on its clock (`clock_timestamp()`),
//! never on a client's: `expires_at = <server time when it processed the request> + ttl`,
//! and a grant is free once the server's clock passes it. Holders measure their own
//! deadline on their monotonic clocks from when they *sent* the request (see
//! `tenure_lease::validity`), so no two machines' wall clocks are ever compared. The server's
//! clock must not be stepped forward by more than the safety margin (slewing NTP is fine),
//! and a fail-over to another server compares its clock with the old one's. With
//! `observed-expiry` a contender also waits until it has seen an expired row unchanged for
//! a full ttl on its own monotonic clock (client-go's rule), which covers both.
//!
//! **Tokens** come from one sequence (`<table>_token`). A new grant takes `nextval` while
//! it holds the lease row's lock, so tokens of one name strictly increase across holders,
//! releases, expiries and server restarts (sequences never go back, not even after a crash).
//! They are unique across all names, so a token also identifies its grant: a release or
//! renewal names `(name, owner, token)` and can never touch a later grant.
//! A fail-over to an asynchronous replica (or a restored backup) can lose the latest grants
//! and set the sequence back: a client that gets a new token not above one it has seen
//! releases that grant unused, advances the sequence past it, and refuses to grant for one
//! ttl ([`StoreError::StateLost`](tenure_lease::StoreError)). A client that saw none of the
//! lost tokens cannot tell.
//!
//! **Lease rows are never deleted**: a release expires its row (`expires_at = '-infinity'`), so
//! the row of a name, once created, is the one place every later grant of that name is
//! serialised on. Operators who want to revoke a grant should do the same, not `DELETE`.
//!
//! **Priority leases.** Each row also keeps the grant's priority and cleanup timeout and
//! the pending preemption request (`request_*` columns, NULL when none; added to tables of
//! earlier versions when a store opens them). Recording a request is one compare-and-set
//! statement; the batched renewal returns each grant's request and leaves a grant with a
//! forceful one unextended (`Refused`), so it ends at its `expires_at`, on the server's
//! clock, after which any contender is granted it with a new token.
//!
//! **Fair acquire** ([`LeaseStore::acquire_fair`](tenure_lease::LeaseStore::acquire_fair),
//! capability `fair_waiting`): waiters queue as rows of `<table>_waiter`, ordered by that
//! table's sequence, each with its own expiry that it refreshes while it waits, so a
//! waiter whose process died holds the line back for at most its ttl. The first waiter in
//! line acquires with the acquire statement itself (extended to check its place and remove
//! its row). Waiters are woken by **LISTEN/NOTIFY**: a release and a waiter leaving the line
//! `pg_notify` the lease's name in their own transaction, and each store client keeps one
//! connection (besides its pool) LISTENing for its waiters; an expiry sends nothing, so
//! waiters also wake when the holder's grant (or the row of a waiter ahead of them)
//! expires. [`try_acquire`](tenure_lease::LeaseStore::try_acquire) does not queue and may
//! take a free lease ahead of waiters, as on etcd and ZooKeeper. The `fair` module has
//! the details.
//!
//! **Errors.** Every operation runs as one statement in autocommit. Transient failures
//! (no connection, connection lost, server starting or shutting down) are retried within
//! the store's operation timeout when retrying cannot change the meaning of the answer
//! (acquire, renew, read, list; a release only before it was sent). Past that they surface
//! as [`StoreError::Unavailable`](tenure_lease::StoreError): outcome unknown.

mod error;
mod fair;
mod fence;
pub mod journal;
mod options;
mod pool;
mod schema;
pub mod sql;
mod store;

pub use fence::Fence;
pub use journal::PostgresJournal;
pub use options::{PostgresConfig, PostgresOptions, REFERENCE};
pub use pool::{Connection, Connector, Pooled};
pub use store::{PostgresStore, PostgresStoreFactory};
pub use tenure_lease::FenceError;
