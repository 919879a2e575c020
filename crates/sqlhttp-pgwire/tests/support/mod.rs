//! What the test files share: [`needs_postgres!`], the one place a test that needs a PostgreSQL
//! cluster says so and why it is ignored without one. Knows nothing about the connection under
//! test.

/// Marks a test that needs PostgreSQL: wrapped in `needs_postgres! { ... }`, the test (with its
/// docs and its own `#[tokio::test]`) is reported as ignored, with the reason, where the build
/// script set `cfg(pgwire_no_postgres)` (no `SQLHTTPD_TEST_POSTGRES_URL`).
macro_rules! needs_postgres {
    ($test:item) => {
        #[cfg_attr(
            pgwire_no_postgres,
            ignore = "needs PostgreSQL: set SQLHTTPD_TEST_POSTGRES_URL (a test that starts a cluster of its own also needs scripts/start-postgres's binaries)"
        )]
        $test
    };
}
pub(crate) use needs_postgres;
