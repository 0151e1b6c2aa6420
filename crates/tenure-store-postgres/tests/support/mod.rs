//! What this crate's tests and benches build on the test kit's PostgreSQL: store options.
#![allow(dead_code, reason = "each test binary uses its own part of it")]

use std::time::Duration;

use tenure_store_postgres::PostgresOptions;
use tenure_test_kit::postgres::PgServer;

/// Store options for a test server.
pub trait PgOptions {
    /// Store options for this server with `operation_timeout` (also its connect timeout).
    fn options(&self, operation_timeout: Duration) -> PostgresOptions;
    /// Store options for this server through `port` on loopback (a proxy), as
    /// [`options`](PgOptions::options) makes them.
    fn options_via(&self, port: u16, operation_timeout: Duration) -> PostgresOptions;
}

impl PgOptions for PgServer {
    fn options(&self, operation_timeout: Duration) -> PostgresOptions {
        self.options_via(self.port(), operation_timeout)
    }

    fn options_via(&self, port: u16, operation_timeout: Duration) -> PostgresOptions {
        let mut c = self.connection_via(port);
        c.connect_timeout(operation_timeout);
        PostgresOptions::new(c, operation_timeout)
    }
}
