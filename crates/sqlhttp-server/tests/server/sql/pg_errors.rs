//! PostgreSQL's errors beyond the table both engines share (`sql/answers.rs`): errors met while a
//! statement runs, messages a function makes huge cut short, and errors a client's own code
//! raises answered as its own. The SQLSTATEs such code raises are `sql/pg_answers.rs`.

use serde_json::json;

use crate::common::{ok, sql};
use crate::engines::{needs_postgres, postgres_app};

needs_postgres! {
    /// An error met while the statement runs is a SQL error; errors stay small, and those a
    /// client's own code raises are its own.
    #[tokio::test]
    async fn errors_at_run_time_are_sql_errors_and_stay_small() {
        let router = postgres_app!("errors_at_run_time_are_sql_errors_and_stay_small");
        let reply = sql(&router, "SELECT 1/0", json!([])).await;
        assert_eq!(reply.code(), "SQL_ERROR");
        ok(
            &router,
            "CREATE FUNCTION shout(n int) RETURNS int LANGUAGE plpgsql AS $$ BEGIN \
         RAISE EXCEPTION USING MESSAGE = repeat('A', n); END $$",
            json!([]),
        )
        .await;
        let loud = sql(&router, "SELECT shout(1000000)", json!([])).await;
        assert_eq!(loud.code(), "SQL_ERROR");
        assert!(loud.body.len() < 8192, "{} bytes", loud.body.len());

        // Errors a client's own code raises are its errors, not the server's.
        let unmatched = sql(
            &router,
            "CREATE FUNCTION pick(n int) RETURNS int LANGUAGE plpgsql AS $$ BEGIN \
         CASE n WHEN 1 THEN RETURN 1; END CASE; END $$",
            json!([]),
        )
        .await;
        assert_eq!(unmatched.status, 200);
        assert_eq!(
            sql(&router, "SELECT pick(2)", json!([])).await.code(),
            "SQL_ERROR"
        );
    }
}

needs_postgres! {
    /// A database connection lost under a statement is an outage, answered `503 UNAVAILABLE`
    /// without `Retry-After`: a client reads a `503` with it as load shed (a cheap retry, its
    /// adaptive rate slowed), which an outage is not. A full pool is load, and keeps it
    /// (`hardening/pg_hostile_client.rs`).
    #[tokio::test]
    async fn a_lost_database_connection_is_an_outage_without_retry_after() {
        let router = postgres_app!("a_lost_database_connection_is_an_outage_without_retry_after");
        let lost = sql(
            &router,
            "SELECT pg_terminate_backend(pg_backend_pid())",
            json!([]),
        )
        .await;
        assert_eq!(
            (lost.status, lost.code()),
            (503, "UNAVAILABLE".to_owned()),
            "{}",
            String::from_utf8_lossy(&lost.body)
        );
        assert!(lost.header("retry-after").is_none());
        // The next request finds a new session.
        let mut answered = false;
        for _ in 0..5 {
            if sql(&router, "SELECT 1", json!([])).await.status == 200 {
                answered = true;
                break;
            }
        }
        assert!(answered);
    }
}
