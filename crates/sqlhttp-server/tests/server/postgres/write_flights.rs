//! Statements sent without `"read_only": true` on the primary, in two flights (ADR 0064): the
//! statement in the write's transaction, then the COMMIT's message and the session's reset as
//! simple queries; a query that wrote nothing in one (ADR 0069), its COMMIT and reset behind it. What each test asks is what the next request meets when this one failed,
//! was tampered with, or lost its answer: a clean session, nothing kept twice, nothing kept of
//! work reported failed, and an outcome the server cannot know answered as unknown.
//!
//! Each runs on a pool of one connection (two where a second request must reach the database
//! while the first holds its connection), so every request meets the session the last one
//! left.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{abandon_mid_stream, ok, sql};
use crate::engines::{config, database};
use crate::engines::{needs_postgres, postgres_app};

fn one_connection(config: &mut sqlhttp_server::Config) {
    config.limits.pool_size = 1;
    config.limits.max_value_bytes = 64 * 1024;
}

fn two_connections(config: &mut sqlhttp_server::Config) {
    config.limits.pool_size = 2;
}

/// What a request may leave in its session, as a verified read sees it: the statement timeout,
/// whether the session defaults to read-only, statements prepared from SQL text, session
/// advisory locks, the session's role, the search path, listens and held cursors.
const PROBE: &str = "SELECT current_setting('statement_timeout'), \
    current_setting('default_transaction_read_only'), \
    (SELECT count(*) FROM pg_prepared_statements WHERE from_sql)::int, \
    (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())::int, \
    current_user::text, \
    current_setting('search_path'), \
    (SELECT count(*) FROM pg_listening_channels())::int, \
    (SELECT count(*) FROM pg_cursors WHERE is_holdable)::int, \
    pg_backend_pid() > 0";

async fn probe(router: &axum::Router) -> Value {
    let reply = crate::common::post_with(
        router,
        &[],
        &json!({"sql": PROBE, "params": [], "read_only": true}),
    )
    .await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    reply.json()["rows"].clone()
}

async fn count(router: &axum::Router, table: &str) -> i64 {
    let rows = ok(
        router,
        &format!("SELECT count(*)::int FROM {table}"),
        json!([]),
    )
    .await;
    rows["rows"][0][0].as_i64().unwrap()
}

needs_postgres! {
    #[tokio::test]
    async fn writes_that_fail_change_the_session_or_take_the_servers_names_leave_the_next_request_a_clean_session() {
        let router = postgres_app!(
            "writes_that_fail_change_the_session_or_take_the_servers_names_leave_the_next_request_a_clean_session",
            one_connection
        );
        ok(&router, "CREATE TABLE t (k int PRIMARY KEY)", json!([])).await;
        ok(&router, "CREATE SEQUENCE s", json!([])).await;
        ok(
            &router,
            "CREATE TABLE d (k int, CONSTRAINT d_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)",
            json!([]),
        )
        .await;
        ok(&router, "INSERT INTO d VALUES (1)", json!([])).await;
        // Changes the session for good from inside a write that commits: a setting for the
        // session, a statement prepared from SQL, a session lock, `currval`.
        ok(
            &router,
            "CREATE FUNCTION mess() RETURNS int LANGUAGE plpgsql AS $$ BEGIN \
             EXECUTE 'SELECT set_' || 'config(''statement_timeout'', ''1'', false)'; \
             EXECUTE 'PREPARE planted AS SELECT 1'; \
             PERFORM nextval('s'); \
             PERFORM pg_advisory_lock(42); RETURN 1; END $$",
            json!([]),
        )
        .await;
        // Takes the names of the server's prepared statements over, after dropping them all.
        ok(
            &router,
            "CREATE FUNCTION squat() RETURNS int LANGUAGE plpgsql AS $$ BEGIN \
             EXECUTE 'DEALLOCATE ALL'; \
             EXECUTE 'PREPARE _sqlhttp_begin_write AS SELECT 1'; \
             EXECUTE 'PREPARE _sqlhttp_write_settings(text, text) AS SELECT $1, $2, ''1''::text'; \
             EXECUTE 'PREPARE _sqlhttp_begin_read AS SELECT 1'; \
             RETURN 1; END $$",
            json!([]),
        )
        .await;
        let clean = probe(&router).await;
        let mut kept = 0;
        let attempts: [(&str, u16, bool); 9] = [
            ("INSERT INTO t VALUES ($1)", 200, true),
            // Refused by PostgreSQL: the flight skipped to its Sync, and the end went alone.
            ("INSERT INTO t VALUES ($1 / 0)", 400, false),
            ("INSERT INTO nowhere VALUES ($1)", 400, false),
            // Fails only at COMMIT's message (the deferred unique check): nothing kept.
            ("INSERT INTO d SELECT 1 WHERE $1 > 0", 409, false),
            // A cell past --max-value-bytes in a write's rows: nothing kept either.
            ("INSERT INTO t VALUES ($1) RETURNING repeat('x', 100000)", 400, false),
            // Commits, and what it left in the session is undone by the reset.
            ("INSERT INTO t SELECT $1 WHERE mess() = 1", 200, true),
            ("INSERT INTO t SELECT $1 WHERE mess() / 0 = 1", 400, false),
            // Commits once, and the next write prepares the server's statements again and
            // commits once too.
            ("INSERT INTO t SELECT $1 WHERE squat() = 1", 200, true),
            ("INSERT INTO t SELECT $1 WHERE squat() / 0 = 1", 400, false),
        ];
        for (n, (statement, expected, keeps)) in attempts.into_iter().enumerate() {
            let n = i64::try_from(n).unwrap() + 1;
            let reply = sql(&router, statement, json!([n])).await;
            assert_eq!(
                reply.status,
                expected,
                "{statement}: {}",
                String::from_utf8_lossy(&reply.body)
            );
            kept += i64::from(keeps);
            assert_eq!(count(&router, "t").await, kept, "after {statement}");
            assert_eq!(probe(&router).await, clean, "after {statement}");
            let currval = sql(&router, "SELECT currval('s')", json!([])).await;
            assert_eq!(currval.status, 400, "currval outlived {statement}");
            // A plain write right after, on the same session: kept once.
            let next = 100 + n;
            ok(&router, "INSERT INTO t VALUES ($1)", json!([next])).await;
            kept += 1;
            assert_eq!(count(&router, "t").await, kept, "after {statement}");
        }
        assert_eq!(count(&router, "d").await, 1);
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_write_whose_answer_was_lost_mid_stream_keeps_nothing_and_frees_its_session() {
        let router = postgres_app!(
            "a_write_whose_answer_was_lost_mid_stream_keeps_nothing_and_frees_its_session",
            one_connection
        );
        ok(&router, "CREATE TABLE t (k int PRIMARY KEY, v text)", json!([])).await;
        // Its rows stream before its COMMIT, which waits for the last of them: the client that
        // goes away mid-stream leaves a write that is cancelled and rolled back, never kept.
        let body = json!({
            "sql": "INSERT INTO t SELECT g, repeat('x', 1000) FROM generate_series(1, 300000) AS g \
                    RETURNING k, v",
            "params": [],
        });
        abandon_mid_stream(&router, &body, true).await;
        let reply = tokio::time::timeout(
            Duration::from_secs(20),
            sql(&router, "SELECT count(*)::int FROM t", json!([])),
        )
        .await
        .expect("the one connection was freed");
        assert_eq!(reply.status, 200);
        assert_eq!(reply.json()["rows"], json!([[0]]), "nothing of it was kept");
        // The same write, read whole this time, commits once.
        let reply = sql(
            &router,
            "INSERT INTO t SELECT g, 'y' FROM generate_series(1, 3) AS g RETURNING k",
            json!([]),
        )
        .await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.json()["rows"], json!([[1], [2], [3]]));
        assert_eq!(count(&router, "t").await, 3);
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_write_whose_session_ends_during_its_commit_message_is_answered_outcome_unknown() {
        let router = postgres_app!(
            "a_write_whose_session_ends_during_its_commit_message_is_answered_outcome_unknown",
            two_connections
        );
        ok(&router, "CREATE TABLE t (k int PRIMARY KEY)", json!([])).await;
        // A deferred trigger that runs in the COMMIT's message (`SET CONSTRAINTS ALL
        // IMMEDIATE`) and sleeps there, so the session can be ended while the message runs.
        ok(
            &router,
            "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             PERFORM pg_sleep(5); RETURN NULL; END $$",
            json!([]),
        )
        .await;
        ok(
            &router,
            "CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON t DEFERRABLE INITIALLY DEFERRED \
             FOR EACH ROW EXECUTE FUNCTION slow()",
            json!([]),
        )
        .await;
        let writing = {
            let router = router.clone();
            tokio::spawn(async move { sql(&router, "INSERT INTO t VALUES (1)", json!([])).await })
        };
        // The write's session, found once it sleeps in its COMMIT's message, is ended.
        let mut ended = false;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let reply = ok(
                &router,
                "SELECT count(pg_terminate_backend(pid))::int FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid() \
                 AND wait_event = 'PgSleep' AND query LIKE '%SET CONSTRAINTS ALL IMMEDIATE%'",
                json!([]),
            )
            .await;
            if reply["rows"] == json!([[1]]) {
                ended = true;
                break;
            }
        }
        assert!(ended, "the write's COMMIT message was never seen running");
        let reply = writing.await.unwrap();
        assert_eq!(
            (reply.status, reply.code().as_str()),
            (503, "OUTCOME_UNKNOWN"),
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        // It was ended before its COMMIT: nothing was kept, and the pool serves on.
        ok(&router, "DROP TRIGGER slow ON t", json!([])).await;
        assert_eq!(count(&router, "t").await, 0);
        ok(&router, "INSERT INTO t VALUES (2)", json!([])).await;
        assert_eq!(count(&router, "t").await, 1);
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_cached_write_whose_function_fails_as_a_stale_statement_would_runs_once() {
        let router = postgres_app!(
            "a_cached_write_whose_function_fails_as_a_stale_statement_would_runs_once",
            one_connection
        );
        ok(&router, "CREATE TABLE u (k int)", json!([])).await;
        ok(&router, "CREATE SEQUENCE s2", json!([])).await;
        // A sequence is not rolled back: it counts how often the function ran.
        ok(
            &router,
            "CREATE FUNCTION f(x int) RETURNS int LANGUAGE plpgsql AS $$ BEGIN \
             PERFORM nextval('s2'); \
             IF x < 0 THEN RAISE EXCEPTION 'refused' USING ERRCODE = '42501'; END IF; \
             RETURN x; END $$",
            json!([]),
        )
        .await;
        ok(&router, "CREATE TYPE mood AS ENUM ('fine')", json!([])).await;
        // In flights, and through the driver (flights hand a statement with a column of a type
        // of the database's own to it).
        let writes = [
            "INSERT INTO u SELECT f($1)",
            "INSERT INTO u SELECT f($1) RETURNING 'fine'::mood AS m",
        ];
        for (n, write) in writes.into_iter().enumerate() {
            let n = i64::try_from(n).unwrap();
            ok(&router, write, json!([1])).await;
            // The cached statement was bound and ran: its `42501` is the function's, after its
            // side effect, not a stale statement's, and the write is not run a second time.
            let refused = sql(&router, write, json!([-1])).await;
            assert_eq!(refused.status, 403, "{}", String::from_utf8_lossy(&refused.body));
            let ran = ok(&router, "SELECT last_value::int FROM s2", json!([])).await;
            assert_eq!(ran["rows"], json!([[2 * n + 2]]), "{write}: once per request");
            assert_eq!(count(&router, "u").await, n + 1);
        }
    }
}

needs_postgres! {
    #[tokio::test]
    async fn unflagged_queries_that_write_nothing_or_write_through_a_function_keep_exactly_what_they_did_and_leave_a_clean_session() {
        let router = postgres_app!(
            "unflagged_queries_that_write_nothing_or_write_through_a_function_keep_exactly_what_they_did_and_leave_a_clean_session",
            one_connection
        );
        ok(&router, "CREATE TABLE t (k int PRIMARY KEY)", json!([])).await;
        ok(&router, "CREATE TABLE w (k int)", json!([])).await;
        ok(&router, "CREATE SEQUENCE s", json!([])).await;
        // A query that writes through a function: only the check after it can tell.
        ok(
            &router,
            "CREATE FUNCTION add(k int) RETURNS int LANGUAGE sql AS \
             $$ INSERT INTO public.t VALUES (k) RETURNING k $$",
            json!([]),
        )
        .await;
        // Changes the session for good without writing: the COMMIT after it keeps all of it
        // in the session, for the reset behind it to undo.
        ok(
            &router,
            "CREATE FUNCTION mess() RETURNS int LANGUAGE plpgsql AS $$ BEGIN \
             EXECUTE 'SELECT set_' || 'config(''statement_timeout'', ''4321'', false)'; \
             EXECUTE 'SELECT set_' || 'config(''search_path'', ''nowhere'', false)'; \
             EXECUTE 'PREPARE planted AS SELECT 1'; \
             EXECUTE 'LISTEN planted'; \
             PERFORM nextval('public.s'); \
             PERFORM pg_advisory_lock(42); RETURN 1; END $$",
            json!([]),
        )
        .await;
        // Opens a held cursor whose query writes: it runs at COMMIT, with no id assigned
        // before, so the check sends the query to the second flight, after its rows.
        ok(
            &router,
            "CREATE FUNCTION note() RETURNS int LANGUAGE sql AS \
             $$ INSERT INTO public.w VALUES (1) RETURNING 1 $$",
            json!([]),
        )
        .await;
        ok(
            &router,
            "CREATE FUNCTION hold() RETURNS int LANGUAGE plpgsql AS $$ BEGIN \
             EXECUTE 'DECLARE held CURSOR WITH HOLD FOR SELECT public.note()'; \
             RETURN 1; END $$",
            json!([]),
        )
        .await;
        // Drops the server's statements and squats their names, without writing.
        ok(
            &router,
            "CREATE FUNCTION squat() RETURNS int LANGUAGE plpgsql AS $$ BEGIN \
             EXECUTE 'DEALLOCATE ALL'; \
             EXECUTE 'PREPARE _sqlhttp_begin_write AS SELECT 1'; \
             EXECUTE 'PREPARE _sqlhttp_write_settings(text, text) AS SELECT $1, $2, ''1''::text'; \
             EXECUTE 'PREPARE _sqlhttp_end_read AS SELECT 1'; \
             RETURN 1; END $$",
            json!([]),
        )
        .await;
        let clean = probe(&router).await;
        let mut kept = 0;
        let mut noted = 0;
        let attempts: [(&str, u16, i64); 12] = [
            ("SELECT $1::int", 200, 0),
            ("SELECT add($1)", 200, 1),
            ("WITH w AS (SELECT add($1)) SELECT * FROM w", 200, 1),
            // The rows decide the COMMIT: a cell past --max-value-bytes keeps nothing, though
            // the statement wrote before its rows were read.
            ("SELECT add($1), repeat('x', 100000)", 400, 0),
            ("SELECT add($1) / 0", 400, 0),
            ("SELECT $1::int / 0", 400, 0),
            ("SELECT mess() * $1", 200, 0),
            ("SELECT mess() * add($1)", 200, 1),
            ("SELECT squat() * $1", 200, 0),
            ("SELECT squat() * add($1)", 200, 1),
            // Kept in `w`, by the held cursor's query at COMMIT, only when the rows were whole.
            ("SELECT hold(), repeat('x', 100000) WHERE $1 > 0", 400, 0),
            ("SELECT hold() * $1", 200, 0),
        ];
        for (n, (statement, expected, keeps)) in attempts.into_iter().enumerate() {
            let n = i64::try_from(n).unwrap() + 1;
            let reply = sql(&router, statement, json!([n])).await;
            assert_eq!(
                reply.status,
                expected,
                "{statement}: {}",
                String::from_utf8_lossy(&reply.body)
            );
            if expected == 200 {
                assert_eq!(reply.json()["rows"][0][0], json!(n), "{statement}");
                assert!(
                    reply.header("sqlhttp-bookmark").is_some(),
                    "{statement}: a write's answer names its position"
                );
            }
            kept += keeps;
            if statement.starts_with("SELECT hold()") && expected == 200 {
                noted += 1;
            }
            assert_eq!(count(&router, "t").await, kept, "after {statement}");
            assert_eq!(count(&router, "w").await, noted, "after {statement}");
            assert_eq!(probe(&router).await, clean, "after {statement}");
            let currval = sql(&router, "SELECT currval('s')", json!([])).await;
            assert_eq!(currval.status, 400, "currval outlived {statement}");
            // A plain write and an unflagged query right after, on the same session.
            let next = 100 + n;
            ok(&router, "INSERT INTO t VALUES ($1)", json!([next])).await;
            kept += 1;
            let again = sql(&router, "SELECT $1::int", json!([next])).await;
            assert_eq!(again.json()["rows"], json!([[next]]), "after {statement}");
            assert_eq!(count(&router, "t").await, kept, "after {statement}");
        }
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_notification_from_a_query_that_writes_nothing_is_delivered_once() {
        let test = "a_notification_from_a_query_that_writes_nothing_is_delivered_once";
        let Some(url) = database(test).await else {
            return;
        };
        let mut server = config(&url);
        one_connection(&mut server);
        let router = sqlhttp_server::app(sqlhttp_server::AppState::new(&server).unwrap());
        ok(
            &router,
            "CREATE FUNCTION ping(what text) RETURNS int LANGUAGE plpgsql AS $$ BEGIN \
             PERFORM pg_notify('pings', what); RETURN 1; END $$",
            json!([]),
        )
        .await;
        // A listener of the operator's own, outside the server.
        let (listener, mut connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        let (heard, mut hear) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(message) =
                std::future::poll_fn(|cx| connection.poll_message(cx)).await
            {
                if let Ok(tokio_postgres::AsyncMessage::Notification(n)) = message {
                    let _ = heard.send(n.payload().to_owned());
                }
            }
        });
        listener.batch_execute("LISTEN pings").await.unwrap();
        // A function that notifies and writes nothing: the one flight's COMMIT delivers it;
        // then one that names pg_notify in its text, which goes in two flights.
        for (statement, payload) in [
            ("SELECT ping($1)", "from a function"),
            ("SELECT pg_notify('pings', $1)::text", "by name"),
        ] {
            let reply = sql(&router, statement, json!([payload])).await;
            assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
            let got = tokio::time::timeout(Duration::from_secs(10), hear.recv())
                .await
                .expect("the notification was delivered")
                .unwrap();
            assert_eq!(got, payload);
        }
        // Each once: a refused query's notification is not delivered at all.
        let reply = sql(&router, "SELECT ping($1) / 0", json!(["refused"])).await;
        assert_eq!(reply.status, 400);
        listener.batch_execute("SELECT 1").await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(hear.try_recv().is_err(), "nothing else was delivered");
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_query_whose_answer_was_lost_mid_stream_frees_its_session() {
        let router = postgres_app!(
            "a_query_whose_answer_was_lost_mid_stream_frees_its_session",
            one_connection
        );
        ok(&router, "CREATE TABLE t (k int PRIMARY KEY)", json!([])).await;
        // A query that writes nothing, its COMMIT and reset behind its rows in one flight: the
        // client that goes away mid-stream leaves the one connection free for the next. 20 MB,
        // many chunks: light enough not to crowd the suite's timed tests.
        let body = json!({
            "sql": "SELECT g, repeat('x', 1000) FROM generate_series(1, 20000) AS g",
            "params": [],
        });
        abandon_mid_stream(&router, &body, true).await;
        let reply = tokio::time::timeout(
            Duration::from_secs(20),
            sql(&router, "INSERT INTO t VALUES (1) RETURNING k", json!([])),
        )
        .await
        .expect("the one connection was freed");
        assert_eq!(reply.status, 200);
        assert_eq!(count(&router, "t").await, 1);
        let clean = probe(&router).await;
        let again = sql(&router, "SELECT count(*)::int FROM t", json!([])).await;
        assert_eq!(again.json()["rows"], json!([[1]]));
        assert_eq!(probe(&router).await, clean);
    }
}
