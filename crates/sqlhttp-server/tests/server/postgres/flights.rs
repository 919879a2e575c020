//! Verified reads on the primary in one flight (ADR 0061): the server's statements prepared on
//! the pooled session once, a cached statement that DDL made stale answered as a fresh one, and a
//! session that served a refused, a failed and an oversized read still clean for the next.
//!
//! Each test runs on a pool of one connection, so every request meets the session the last one
//! left. A verified read whose client left mid-stream (its answer lost) frees that connection
//! at once and leaves nothing running behind it.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{ENDLESS_ON_POSTGRES, abandon_mid_stream, ok, post_with};
use crate::engines::{needs_postgres, postgres_app};

fn one_connection(config: &mut sqlhttp_server::Config) {
    config.limits.pool_size = 1;
    config.limits.max_value_bytes = 64 * 1024;
}

/// A verified read (`"read_only": true`, as the SDK's `query` sends it): its status and body.
async fn read(router: &axum::Router, sql: &str, params: Value) -> (u16, Value) {
    let reply = post_with(
        router,
        &[],
        &json!({"sql": sql, "params": params, "read_only": true}),
    )
    .await;
    (reply.status, reply.json())
}

/// How many of the session's statements carry `marker` in their text (this statement's own text
/// does not).
async fn held(router: &axum::Router, marker: &str) -> i64 {
    let (status, body) = read(
        router,
        "SELECT count(*)::int FROM pg_catalog.pg_prepared_statements \
         WHERE statement LIKE '%' || $1 || '%'",
        json!([marker]),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["rows"][0][0].as_i64().unwrap()
}

needs_postgres! {
    #[tokio::test]
    async fn a_verified_read_runs_on_the_servers_statements_prepared_once() {
        let router = postgres_app!(
            "a_verified_read_runs_on_the_servers_statements_prepared_once",
            one_connection
        );
        ok(&router, "CREATE TABLE t (k int PRIMARY KEY, v text)", json!([])).await;
        ok(&router, "INSERT INTO t VALUES (1, 'one'), (2, NULL)", json!([])).await;
        for _ in 0..3 {
            let (status, body) = read(&router, "SELECT k, v FROM t ORDER BY k", json!([])).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["rows"], json!([[1, "one"], [2, null]]));
            assert_eq!(body["columns"][0], json!({"name": "k", "type": "int4"}));
        }
        let (status, body) = read(
            &router,
            "SELECT name FROM pg_prepared_statements WHERE name LIKE '\\_sqlhttp\\_%' ORDER BY name",
            json!([]),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let names: Vec<&str> = body["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| row[0].as_str().unwrap())
            .collect();
        for fixed in ["_sqlhttp_begin_read", "_sqlhttp_read_settings"] {
            assert!(names.contains(&fixed), "{fixed} prepared once: {names:?}");
        }
        // The client statements, each prepared once however often it ran: the two writes (ADR
        // 0064), the read run three times, and this one.
        assert_eq!(names.iter().filter(|n| n.starts_with("_sqlhttp_f")).count(), 4, "{names:?}");
        for fixed in ["_sqlhttp_begin_write", "_sqlhttp_write_settings"] {
            assert!(names.contains(&fixed), "{fixed} prepared once: {names:?}");
        }
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_cached_read_that_ddl_made_stale_answers_as_a_fresh_one() {
        let router = postgres_app!(
            "a_cached_read_that_ddl_made_stale_answers_as_a_fresh_one",
            one_connection
        );
        ok(&router, "CREATE TABLE t (k int PRIMARY KEY, v int)", json!([])).await;
        ok(&router, "INSERT INTO t VALUES (1, 10)", json!([])).await;
        let sql = "SELECT v FROM t WHERE k = ?";
        let (status, body) = read(&router, sql, json!([1])).await;
        assert_eq!((status, &body["rows"]), (200, &json!([[10]])), "{body}");
        ok(&router, "ALTER TABLE t ALTER COLUMN v TYPE text", json!([])).await;
        let (status, body) = read(&router, sql, json!([1])).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["columns"], json!([{"name": "v", "type": "text"}]));
        assert_eq!(body["rows"], json!([["10"]]));
        // The parameter's type changes under the cached statement.
        ok(&router, "ALTER TABLE t ALTER COLUMN k TYPE text", json!([])).await;
        let (status, body) = read(&router, sql, json!(["1"])).await;
        assert_eq!((status, &body["rows"]), (200, &json!([["10"]])), "{body}");
    }
}

needs_postgres! {
    #[tokio::test]
    async fn refused_failed_and_oversized_reads_leave_the_next_one_a_clean_session() {
        let router = postgres_app!(
            "refused_failed_and_oversized_reads_leave_the_next_one_a_clean_session",
            one_connection
        );
        ok(&router, "CREATE SEQUENCE s", json!([])).await;
        ok(
            &router,
            "CREATE FUNCTION mess() RETURNS int LANGUAGE plpgsql AS $$ BEGIN \
             EXECUTE 'SELECT set_' || 'config(''statement_timeout'', ''1'', false)'; \
             EXECUTE 'PREPARE planted AS SELECT 1'; \
             PERFORM pg_advisory_lock(42); RETURN 1; END $$",
            json!([]),
        )
        .await;
        ok(
            &router,
            "CREATE FUNCTION squat() RETURNS int LANGUAGE plpgsql AS $$ BEGIN \
             EXECUTE 'DEALLOCATE ALL'; \
             EXECUTE 'PREPARE _sqlhttp_read_settings(text, text) AS \
                 SELECT $1, $2, ''FFFFFFFF/FFFFFFFF''::text'; \
             EXECUTE 'PREPARE _sqlhttp_begin_read AS SELECT 1'; \
             PERFORM pg_advisory_lock(43); RETURN 1; END $$",
            json!([]),
        )
        .await;
        let probe = "SELECT current_setting('statement_timeout'), \
                     current_setting('transaction_read_only'), \
                     (SELECT count(*) FROM pg_prepared_statements WHERE from_sql)::int, \
                     (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
                      AND pid = pg_backend_pid())::int";
        let (status, clean) = read(&router, probe, json!([])).await;
        assert_eq!(status, 200, "{clean}");
        let attempts: [(&str, u16); 8] = [
            // PostgreSQL's refusal of the statement: the flight skipped to its Sync.
            ("SELECT 1 / 0", 400),
            ("SELECT nope FROM nowhere", 400),
            // A write in the read's transaction.
            ("SELECT nextval('s')", 403),
            // A cell past --max-value-bytes: the statement is cancelled mid-result.
            ("SELECT repeat('x', 100000) FROM generate_series(1, 50)", 400),
            // A client's function changes the session: its setting goes with the rollback, its
            // prepared statement and session lock outlive it and the reset ends them.
            ("SELECT mess()", 200),
            // The same, and then it fails: the end and the reset go in a flight of their own.
            ("SELECT mess() / 0", 400),
            // It takes the server's statements' names over: the reset, sent unnamed, drops
            // what it prepared, and the next read prepares the server's statements again.
            ("SELECT squat()", 200),
            ("SELECT squat() / 0", 400),
        ];
        for (sql, expected) in attempts {
            let (status, body) = read(&router, sql, json!([])).await;
            assert_eq!(status, expected, "{sql}: {body}");
            let (status, seen) = read(&router, probe, json!([])).await;
            assert_eq!(status, 200, "after {sql}: {seen}");
            assert_eq!(seen["rows"], clean["rows"], "after {sql}");
            // And the driver's requests on the same session.
            let write = ok(&router, "SELECT 1 AS one", json!([])).await;
            assert_eq!(write["rows"], json!([[1]]), "after {sql}");
        }
    }
}

needs_postgres! {
    #[tokio::test]
    async fn many_texts_keep_the_sessions_statements_bounded() {
        let router = postgres_app!(
            "many_texts_keep_the_sessions_statements_bounded",
            one_connection
        );
        // Past the cache's bound (256) its statements are closed on the session by the next
        // flight, not left there.
        for n in 0..300 {
            let (status, body) = read(&router, &format!("SELECT {n}::int AS n"), json!([])).await;
            assert_eq!((status, &body["rows"]), (200, &json!([[n]])), "{body}");
        }
        let (status, body) = read(
            &router,
            "SELECT count(*)::int FROM pg_prepared_statements WHERE name LIKE '\\_sqlhttp\\_f%'",
            json!([]),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let held = body["rows"][0][0].as_i64().unwrap();
        assert!(held <= 256, "{held} client statements prepared on the session");
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_statement_its_connection_stopped_using_is_closed_and_prepared_again_when_sent() {
        let router = postgres_app!(
            "a_statement_its_connection_stopped_using_is_closed_and_prepared_again_when_sent",
            one_connection
        );
        let (status, body) = read(&router, "SELECT 1 AS cold_one", json!([])).await;
        assert_eq!((status, &body["rows"]), (200, &json!([[1]])), "{body}");
        assert_eq!(held(&router, "cold_one").await, 1, "prepared and cached");
        // Every look for statements prepared from SQL text reads each one the session holds
        // (ADR 0066): one its connection has not used for 256 lookups and more is closed, by
        // the next flight (the sweeps at lookups 320 and 384 fall on writes' flights here).
        for n in 0..400 {
            if n % 2 == 0 {
                let (status, body) = read(&router, "SELECT 2 AS warm_one", json!([])).await;
                assert_eq!((status, &body["rows"]), (200, &json!([[2]])), "{body}");
            } else {
                ok(&router, "SELECT 2 AS warm_one", json!([])).await;
            }
        }
        assert_eq!(held(&router, "cold_one").await, 0, "closed once cold");
        assert_eq!(held(&router, "warm_one").await, 1, "kept while used");
        let (status, body) = read(&router, "SELECT 1 AS cold_one", json!([])).await;
        assert_eq!((status, &body["rows"]), (200, &json!([[1]])), "{body}");
        assert_eq!(held(&router, "cold_one").await, 1, "prepared again when sent again");
    }
}

needs_postgres! {
    /// The driver's cache (batches, keyed writes, transactions) forgets what its connection
    /// stopped using as the flights' cache does, counting the connection's requests (ADR 0068):
    /// every statement held costs every read's reset on that session.
    #[tokio::test]
    async fn a_statement_the_driver_stopped_using_is_closed_and_prepared_again_when_sent() {
        let router = postgres_app!(
            "a_statement_the_driver_stopped_using_is_closed_and_prepared_again_when_sent",
            one_connection
        );
        let batch = async |sql: &str| {
            let reply = crate::sandbox::effects::batch(&router, &[], &[sql]).await;
            assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
        };
        batch("SELECT 1 AS cold_in_driver").await;
        assert_eq!(held(&router, "cold_in_driver").await, 1, "prepared and cached");
        // Most requests are verified reads, which never look the driver's cache up: its clock
        // counts the connection's requests.
        for n in 0..400 {
            if n % 100 == 0 {
                batch("SELECT 2 AS warm_in_driver").await;
            } else {
                let (status, body) = read(&router, "SELECT 3 AS in_flights", json!([])).await;
                assert_eq!((status, &body["rows"]), (200, &json!([[3]])), "{body}");
            }
        }
        assert_eq!(held(&router, "cold_in_driver").await, 0, "closed once cold");
        assert_eq!(held(&router, "warm_in_driver").await, 1, "kept while used");
        batch("SELECT 1 AS cold_in_driver").await;
        assert_eq!(held(&router, "cold_in_driver").await, 1, "prepared again when sent again");
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_verified_read_whose_client_left_mid_stream_frees_its_session_and_leaves_nothing_running() {
        let router = postgres_app!(
            "a_verified_read_whose_client_left_mid_stream_frees_its_session_and_leaves_nothing_running",
            one_connection
        );
        let running = "SELECT count(*)::int FROM pg_stat_activity \
                       WHERE datname = current_database() AND pid <> pg_backend_pid() \
                       AND query LIKE '%generate\\_series(0, 9999)%'";
        let probe = "SELECT current_setting('transaction_read_only'), \
                     (SELECT count(*) FROM pg_prepared_statements WHERE from_sql)::int";
        let (status, clean) = read(&router, probe, json!([])).await;
        assert_eq!(status, 200, "{clean}");
        for read_first in [true, false] {
            // The answer is lost: the client goes away mid-stream.
            let endless = json!({"sql": ENDLESS_ON_POSTGRES, "read_only": true});
            abandon_mid_stream(&router, &endless, read_first).await;
            // The only connection serves the next read, verified or not, long before the
            // statement timeout, on a clean session.
            let (status, seen) = tokio::time::timeout(
                Duration::from_secs(5),
                read(&router, probe, json!([])),
            )
            .await
            .expect("the session was freed");
            assert_eq!(status, 200, "{seen}");
            assert_eq!(seen["rows"], clean["rows"]);
            let one = ok(&router, "SELECT 1 AS one", json!([])).await;
            assert_eq!(one["rows"], json!([[1]]));
            // The abandoned statement does not run on behind the client's back.
            let mut left = Value::Null;
            for _ in 0..50 {
                let (status, body) = read(&router, running, json!([])).await;
                assert_eq!(status, 200, "{body}");
                left = body["rows"][0][0].clone();
                if left == json!(0) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert_eq!(left, json!(0), "the abandoned read still runs (read_first: {read_first})");
        }
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_seed_a_verified_read_sets_does_not_reach_the_next() {
        let router = postgres_app!(
            "a_seed_a_verified_read_sets_does_not_reach_the_next",
            one_connection
        );
        // The first two values after setseed(0.5), in one read.
        let (status, body) = read(&router, "SELECT setseed(0.5), random(), random()", json!([])).await;
        assert_eq!(status, 200, "{body}");
        let (first, second) = (body["rows"][0][1].clone(), body["rows"][0][2].clone());
        for _ in 0..3 {
            let (status, seeded) = read(&router, "SELECT setseed(0.5), random()", json!([])).await;
            assert_eq!(status, 200, "{seeded}");
            assert_eq!(seeded["rows"][0][1], first, "setseed(0.5) is deterministic");
            // The next read on the same session does not go on from that seed.
            let (status, next) = read(&router, "SELECT random()", json!([])).await;
            assert_eq!(status, 200, "{next}");
            assert_ne!(next["rows"][0][0], second, "the next read's random() was predictable");
        }
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_cached_reads_own_42xxx_error_after_its_rows_is_answered_as_itself() {
        let router = postgres_app!(
            "a_cached_reads_own_42xxx_error_after_its_rows_is_answered_as_itself",
            one_connection
        );
        ok(
            &router,
            "CREATE FUNCTION boom(i int) RETURNS int LANGUAGE plpgsql AS $$ BEGIN \
             IF i > 2000 THEN RAISE EXCEPTION 'boom at %', i USING ERRCODE = '42501'; END IF; \
             RETURN i; END $$",
            json!([]),
        )
        .await;
        // Past a chunk of rows before the error: the body has started when it comes.
        let streamed = "SELECT boom(x) AS n, repeat('y', 100) AS pad FROM generate_series(1, 3000) AS x";
        // Before its rows: the first row fails.
        let at_once = "SELECT boom(x + 5000) AS n FROM generate_series(1, 3) AS x";
        for sql in [streamed, at_once] {
            // The first run prepares the statement; the second runs it from the cache.
            let mut answers = Vec::new();
            for _ in 0..2 {
                let (status, body) = read(&router, sql, json!([])).await;
                answers.push((status, body["error"].clone()));
            }
            for (status, error) in &answers {
                let text = error.to_string();
                assert!(!text.contains("stale"), "{sql}: {status} {text}");
                assert!(text.contains("boom at"), "{sql}: {status} {text}");
            }
            assert_eq!(answers[0], answers[1], "{sql}: the cached run answers as the first");
        }
    }
}

needs_postgres! {
    #[tokio::test]
    async fn the_reset_parsed_once_runs_after_driver_requests_and_a_squatted_end_closes_the_session() {
        let router = postgres_app!(
            "the_reset_parsed_once_runs_after_driver_requests_and_a_squatted_end_closes_the_session",
            one_connection
        );
        ok(
            &router,
            "CREATE FUNCTION mess() RETURNS int LANGUAGE plpgsql AS $$ BEGIN \
             EXECUTE 'PREPARE planted AS SELECT 1'; \
             PERFORM pg_advisory_lock(42); PERFORM setseed(0.5); RETURN 1; END $$",
            json!([]),
        )
        .await;
        // It takes the read's prepared ROLLBACK over with a statement of its own.
        ok(
            &router,
            "CREATE FUNCTION squat_end() RETURNS int LANGUAGE plpgsql AS $$ BEGIN \
             EXECUTE 'DEALLOCATE _sqlhttp_end_read'; \
             EXECUTE 'PREPARE _sqlhttp_end_read AS SELECT 1'; \
             PERFORM pg_advisory_lock(44); RETURN 1; END $$",
            json!([]),
        )
        .await;
        let probe = "SELECT pg_backend_pid(), current_setting('transaction_read_only'), \
                     (SELECT count(*) FROM pg_prepared_statements WHERE from_sql)::int, \
                     (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
                      AND pid = pg_backend_pid())::int";
        let (status, clean) = read(&router, probe, json!([])).await;
        assert_eq!(status, 200, "{clean}");
        let session = clean["rows"][0][0].clone();
        // Twice: the second's reset is the unnamed statement the first parsed; then again after
        // a request through the driver, whose own reset (a simple Query) replaced it.
        for round in 0..3 {
            if round == 2 {
                let one = ok(&router, "SELECT 1 AS one", json!([])).await;
                assert_eq!(one["rows"], json!([[1]]));
            }
            let (status, body) = read(&router, "SELECT mess()", json!([])).await;
            assert_eq!((status, &body["rows"]), (200, &json!([[1]])), "{body}");
            let (status, seen) = read(&router, probe, json!([])).await;
            assert_eq!(status, 200, "{seen}");
            // The same session, reset and pooled, not closed for a reset that failed.
            assert_eq!(seen["rows"], clean["rows"], "round {round}");
        }
        // The squatter runs where ROLLBACK stood: the read is answered whole, and the session,
        // left in its transaction with the function's lock, is closed rather than pooled.
        let (status, body) = read(&router, "SELECT squat_end()", json!([])).await;
        assert_eq!((status, &body["rows"]), (200, &json!([[1]])), "{body}");
        let (status, seen) = read(&router, probe, json!([])).await;
        assert_eq!(status, 200, "{seen}");
        assert_ne!(seen["rows"][0][0], session, "the squatted session was pooled");
        let rest = |probed: &Value| probed["rows"][0].as_array().unwrap()[1..].to_vec();
        assert_eq!(rest(&seen), rest(&clean), "the new session is clean");
        let (status, seen) = read(&router, "SELECT 2 AS two", json!([])).await;
        assert_eq!((status, &seen["rows"]), (200, &json!([[2]])), "{seen}");
    }
}
