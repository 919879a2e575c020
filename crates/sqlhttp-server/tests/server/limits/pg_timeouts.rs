//! The statement timeout and cancels on PostgreSQL: the server's clock holds when a client's
//! function lowers PostgreSQL's own `statement_timeout`, also for work done at COMMIT; a session
//! that catches every cancel is ended; a requester that goes away cancels its statement, as
//! PostgreSQL's own activity view shows. What holds on both engines is `limits/timeouts.rs`.

use std::time::Duration;

use serde_json::json;
use sqlhttp_server::{AppState, app};

use crate::common::{batch_with as batch, ok, sql};
use crate::engines::{config, database, needs_postgres, postgres_app};

needs_postgres! {
    /// A client's function can lower PostgreSQL's statement_timeout for its own transaction; the
    /// server's own clock still ends the request and frees the connection.
    #[tokio::test]
    async fn the_statement_timeout_holds_when_a_client_lowers_its_guard() {
        let router = postgres_app!(
            "the_statement_timeout_holds_when_a_client_lowers_its_guard",
            |config| config.limits.statement_timeout = Duration::from_millis(300)
        );
        let started = std::time::Instant::now();
        let reply = batch(
            &router,
            &[],
            &json!({"statements": [
                {"sql": "SELECT query_to_xml('select pg_catalog.set_' || 'config(''statement_timeout'', ''0'', true)', true, false, '')::text"},
                {"sql": "SELECT pg_sleep(30)"},
            ]}),
        )
        .await;
        timed_out(&reply, started);
        ok(&router, "SELECT 1", json!([])).await;
    }
}

needs_postgres! {
    /// Work PostgreSQL does at COMMIT (a deferred trigger) is bounded too, even after a client's
    /// function lowered the statement timeout.
    #[tokio::test]
    async fn the_statement_timeout_holds_at_commit() {
        let router = postgres_app!("the_statement_timeout_holds_at_commit", |config| {
            config.limits.statement_timeout = Duration::from_millis(300);
        });
        ok(&router, "CREATE TABLE dt (x int)", json!([])).await;
        ok(
            &router,
            "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
         PERFORM pg_sleep(30); RETURN NULL; END $$",
            json!([]),
        )
        .await;
        ok(
            &router,
            "CREATE CONSTRAINT TRIGGER late AFTER INSERT ON dt DEFERRABLE INITIALLY DEFERRED \
         FOR EACH ROW EXECUTE FUNCTION slow()",
            json!([]),
        )
        .await;
        let started = std::time::Instant::now();
        let reply = batch(
            &router,
            &[],
            &json!({"statements": [
                {"sql": "SELECT query_to_xml('select pg_catalog.set_' || 'config(''statement_timeout'', ''0'', true)', true, false, '')::text"},
                {"sql": "INSERT INTO dt VALUES (1)"},
            ]}),
        )
        .await;
        timed_out(&reply, started);
        let count = ok(&router, "SELECT count(*) FROM dt", json!([])).await;
        assert_eq!(count["rows"], json!([[0]]));
    }
}

/// Asserts `422 STATEMENT_TIMEOUT`, well before the 30 s the statements would take.
fn timed_out(reply: &crate::common::Reply, started: std::time::Instant) {
    assert_eq!(
        reply.code(),
        "STATEMENT_TIMEOUT",
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

needs_postgres! {
    /// A function can catch the cancel PostgreSQL's timeout and the server send, and go on: the
    /// server ends that session, so it does not keep its locks and a connection slot.
    #[tokio::test]
    async fn a_session_that_ignores_cancels_is_ended() {
        let Some(url) = database("a_session_that_ignores_cancels_is_ended").await else {
            return;
        };
        let mut config = config(&url);
        config.limits.statement_timeout = Duration::from_millis(300);
        let router = app(AppState::new(&config).unwrap());
        ok(
            &router,
            "CREATE FUNCTION stubborn(secs int) RETURNS int LANGUAGE plpgsql AS $$ \
         DECLARE t0 timestamptz := clock_timestamp(); BEGIN \
         WHILE clock_timestamp() < t0 + make_interval(secs => secs) LOOP \
         BEGIN PERFORM pg_sleep(0.1); EXCEPTION WHEN query_canceled THEN NULL; END; \
         END LOOP; RETURN 0; END $$",
            json!([]),
        )
        .await;
        let started = std::time::Instant::now();
        let reply = sql(&router, "SELECT stubborn(30) AS stubborn_call", json!([])).await;
        assert_eq!(reply.code(), "STATEMENT_TIMEOUT");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        let (owner, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        let driver = tokio::spawn(connection);
        let mut running = i64::MAX;
        for _ in 0..50 {
            running = owner
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%stubborn_call%' \
                 AND pid <> pg_backend_pid()",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if running == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(running, 0, "the session the server gave up on still runs");
        drop(owner);
        let _ = driver.await;
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_requester_that_goes_away_cancels_its_statement() {
        let Some(url) = database("a_requester_that_goes_away_cancels_its_statement").await else {
            return;
        };
        let router = app(AppState::new(&config(&url)).unwrap());
        let abandoned = tokio::time::timeout(
            Duration::from_millis(300),
            sql(&router, "SELECT pg_sleep(30) AS abandoned_sleep", json!([])),
        )
        .await;
        assert!(abandoned.is_err(), "the sleep was still running");
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        let driver = tokio::spawn(connection);
        let mut running = i64::MAX;
        for _ in 0..100 {
            running = client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' \
                 AND query LIKE '%abandoned_sleep%' AND pid <> pg_backend_pid()",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if running == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(running, 0, "the abandoned statement was cancelled");
        drop(client);
        let _ = driver.await;
        ok(&router, "SELECT 1", json!([])).await;
    }
}
