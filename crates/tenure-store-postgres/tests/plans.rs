//! The listing and the change check read by index, in the generic plans a prepared
//! statement ends up with (the plans PostgreSQL keeps after a few executions).

mod support;
use support::PgOptions;

use std::time::Duration;

use tenure_lease::{AcquireRequest, GrantChanges, LeaseStore};
use tenure_store_postgres::PostgresStore;
use tenure_test_kit::postgres::Exclusive;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_and_change_checks_read_by_index_in_generic_plans() {
    let exclusive = Exclusive::start().await;
    let store = PostgresStore::connect(exclusive.server.options(Duration::from_secs(5)))
        .await
        .expect("connect");
    // The tables and a few rows, and the change table's row of the prefix.
    for i in 0..20 {
        let req = AcquireRequest {
            name: format!("m/{i}"),
            owner: "o".into(),
            instance: "i".into(),
            ttl: Duration::from_secs(60),
            ..AcquireRequest::default()
        };
        store.try_acquire(&req).await.expect("acquire");
    }
    store
        .changes_since("m/", None)
        .await
        .expect("changes_since");
    let conn = store.connection().await.expect("the connection");
    // Sequential scans off: a plan that can read the index by range does so, however few
    // rows the table holds; one that cannot still shows no such range.
    conn.batch_execute("SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off")
        .await
        .expect("plan settings");
    let plan = |name: &'static str, sql: String, args: &'static str| {
        let conn = &conn;
        async move {
            conn.batch_execute(&format!("PREPARE {name} AS {sql}"))
                .await
                .expect("prepare");
            conn.query(&format!("EXPLAIN EXECUTE {name}{args}"), &[])
                .await
                .expect("explain")
                .iter()
                .map(|r| r.get::<_, String>(0))
                .collect::<Vec<_>>()
                .join("\n")
        }
    };
    let statements = store.statements();
    let list = plan("list", statements.list.clone(), "('m/', 'm0')").await;
    assert!(
        list.contains("Index Cond: ((name >= $1) AND (name < $2))"),
        "{list}"
    );
    let list_from = plan("list_from", statements.list_from.clone(), "('m/')").await;
    assert!(
        list_from.contains("Index Cond: (name >= $1)"),
        "{list_from}"
    );
    let changes = plan("changes", statements.changes.clone(), "('m/', 0)").await;
    assert!(
        changes.contains("_expiry") && changes.contains("Index Cond: ((expires_at >"),
        "{changes}"
    );
    assert!(changes.contains("_change_pkey"), "{changes}");
}
