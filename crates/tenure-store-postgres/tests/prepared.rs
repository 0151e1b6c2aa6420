//! The store prepares each statement once per connection, not once per call.

mod support;
use support::PgOptions;

use std::time::Duration;

use tenure_lease::{AcquireOutcome, AcquireRequest, FencingToken, LeaseStore};
use tenure_store_postgres::{PostgresOptions, PostgresStore};
use tenure_test_kit::postgres::Exclusive;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_statement_is_prepared_once_per_connection() {
    let exclusive = Exclusive::start().await;
    let mut options: PostgresOptions = exclusive.server.options(Duration::from_secs(5));
    // One connection: every call below runs on it.
    options.pool_size = 1;
    let store = PostgresStore::connect(options).await.expect("connect");
    let req = AcquireRequest {
        name: "prepared".into(),
        owner: "owner".into(),
        instance: "one".into(),
        ttl: Duration::from_secs(60),
        ..AcquireRequest::default()
    };
    for _ in 0..10 {
        let AcquireOutcome::Granted(record) = store.try_acquire(&req).await.expect("acquire")
        else {
            panic!("the lease is free");
        };
        assert!(
            store
                .release(&req.name, &req.owner, record.token)
                .await
                .expect("release")
        );
    }
    // A release of a grant that is gone runs the same prepared statement.
    assert!(
        !store
            .release(&req.name, &req.owner, FencingToken::new(1))
            .await
            .expect("release")
    );
    let conn = store.connection().await.expect("the connection");
    let statements = store.statements();
    for (text, calls) in [(&statements.acquire, 10), (&statements.release, 11)] {
        let rows = conn
            .query(
                "SELECT generic_plans + custom_plans FROM pg_prepared_statements WHERE statement = $1",
                &[text],
            )
            .await
            .expect("the connection's prepared statements");
        assert_eq!(rows.len(), 1, "prepared once: {text}");
        let executed: i64 = rows[0].get(0);
        assert_eq!(executed, calls, "every call ran the one prepared statement");
    }
}
