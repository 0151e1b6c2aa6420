//! How database and pool failures map onto the SPI's "outcome unknown" errors.

use deadpool_postgres::PoolError;
use tenure_lease::StoreError;
use tokio_postgres::error::SqlState;

pub(crate) const STORE: &str = "postgres";

/// A failed attempt, and whether another attempt could succeed.
#[derive(Debug)]
pub(crate) struct Failure {
    pub error: StoreError,
    /// The server may come back (connection lost or refused, shutting down, starting up,
    /// too many connections, deadlock or serialisation conflict).
    pub transient: bool,
    /// The connection is no good any more: do not return it to the pool.
    pub broken: bool,
}

/// SQLSTATE classes and codes that a later attempt may not meet again.
fn transient_state(code: &SqlState) -> bool {
    let c = code.code();
    c.starts_with("08") // connection exception
        || c.starts_with("57P") // admin/crash shutdown, cannot connect now
        || *code == SqlState::TOO_MANY_CONNECTIONS
        || *code == SqlState::T_R_SERIALIZATION_FAILURE
        || *code == SqlState::T_R_DEADLOCK_DETECTED
        || *code == SqlState::READ_ONLY_SQL_TRANSACTION // a failed-over primary, briefly
}

pub(crate) fn from_pg(server: &str, e: tokio_postgres::Error) -> Failure {
    let failure = match e.as_db_error() {
        Some(db) => {
            let transient = transient_state(db.code());
            let detail = format!("{server}: {} ({})", db.message(), db.code().code());
            Failure {
                error: if transient {
                    StoreError::unavailable(STORE, detail)
                } else {
                    StoreError::backend(STORE, detail)
                },
                transient,
                broken: transient && db.code().code().starts_with("57P"),
            }
        }
        // No answer from the server: connection closed, I/O error, timeout.
        None => Failure {
            error: StoreError::unavailable(STORE, format!("{server}: {}", with_causes(&e))),
            transient: true,
            broken: true,
        },
    };
    Failure {
        error: failure.error.caused_by(e),
        ..failure
    }
}

/// `e: cause: cause…` (tokio-postgres keeps the I/O reason, e.g. "connection refused", in
/// the source chain).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

pub(crate) fn from_pool(server: &str, e: PoolError) -> Failure {
    match e {
        PoolError::Backend(e) => from_pg(server, e),
        PoolError::Closed => Failure {
            error: StoreError::backend(STORE, format!("{server}: connection pool closed")),
            transient: false,
            broken: false,
        },
        other => Failure {
            error: StoreError::unavailable(STORE, format!("{server}: no connection: {other}")),
            transient: true,
            broken: false,
        },
    }
}

pub(crate) fn timed_out(server: &str, timeout: std::time::Duration) -> StoreError {
    StoreError::unavailable(
        STORE,
        format!("{server}: no answer within the operation timeout {timeout:?}"),
    )
}

pub(crate) fn bad_value(server: &str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::backend(STORE, format!("{server}: {detail}"))
}
