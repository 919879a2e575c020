//! Statement text read once, the way each engine reads it (issue 27, finding 1; ADR 0027): a
//! leading `;` (an empty statement both engines drop) hides no keyword from the checks, on
//! PostgreSQL and on SQLite; `$N` past the request's parameters never reaches PostgreSQL;
//! `COPY` to or from the client is refused with 403 and leaves the connection healthy. Ends
//! with a property test that asks a real PostgreSQL what it runs.
//!
//! PostgreSQL tests use the cluster of `engines.rs` (and skip without one, unless
//! `SQLHTTPD_TEST_REQUIRE_POSTGRES` is set).

use std::time::{Duration, Instant};

use axum::Router;
use serde_json::json;
use sqlhttp_server::{AppState, Config, app};

use crate::common::{TempDb, app_with, batch_with, post_with};
use crate::engines::{config, database, needs_postgres};

const WRITER: [(&str, &str); 1] = [("authorization", "Bearer writer")];
const READER: [(&str, &str); 1] = [("authorization", "Bearer reader")];

fn tokens(config: &mut Config) {
    config.tokens = vec!["writer".into()];
    config.read_tokens = vec!["reader".into()];
}

/// A server on a fresh PostgreSQL database with a writer and a reader token, and the
/// database's URL (to look at it as its owner); `None` when there is no PostgreSQL.
async fn pg(test: &str) -> Option<(Router, String)> {
    let url = database(test).await?;
    let mut config = config(&url);
    tokens(&mut config);
    Some((app(AppState::new(&config).unwrap()), url))
}

macro_rules! pg {
    ($test:expr) => {
        match pg($test).await {
            Some(found) => found,
            None => return,
        }
    };
}

/// Runs `sql` as the database's owner (outside the server), returning the first column of
/// each row as text.
async fn as_owner(url: &str, sql: &str) -> Vec<Option<String>> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(connection);
    let rows = client.query(sql, &[]).await.unwrap();
    drop(client);
    let _ = driver.await;
    rows.iter().map(|row| row.get(0)).collect()
}

fn body(reply: &crate::common::Reply) -> String {
    String::from_utf8_lossy(&reply.body).into_owned()
}

async fn run(router: &Router, token: &[(&str, &str)], sql: &str) -> crate::common::Reply {
    post_with(router, token, &json!({ "sql": sql })).await
}

needs_postgres! {
    /// The issue's batch: a read token ends the server's transaction with `;COMMIT`, begins a
    /// read-write one, writes, drops another client's table, plants a function and re-creates the
    /// guard savepoint so the server's own RELEASE and COMMIT succeed. On main: 200, all kept.
    #[tokio::test]
    async fn a_read_tokens_semicolon_batch_is_refused_and_keeps_nothing() {
        let (router, url) = pg!("a_read_tokens_semicolon_batch_is_refused_and_keeps_nothing");
        for setup in [
            "CREATE TABLE t (x int)",
            "CREATE TABLE other_clients_table (x int)",
        ] {
            assert_eq!(run(&router, &WRITER, setup).await.status, 200, "{setup}");
        }
        let statements = [
            ";COMMIT",
            ";BEGIN READ WRITE",
            "INSERT INTO t VALUES (1)",
            "DROP TABLE other_clients_table",
            "CREATE FUNCTION planted() RETURNS int LANGUAGE sql AS 'SELECT 1'",
            ";SAVEPOINT _sqlhttp_guard",
        ];
        let batch = json!({
            "statements": statements.iter().map(|s| json!({"sql": s})).collect::<Vec<_>>()
        });
        let reply = batch_with(&router, &READER, &batch).await;
        assert_eq!(reply.status, 400, "{}", body(&reply));
        assert_eq!(reply.code(), "BAD_REQUEST");
        // The same batch as a read-only batch of a full token.
        let mut read_only = batch.clone();
        read_only["read_only"] = json!(true);
        let reply = batch_with(&router, &WRITER, &read_only).await;
        assert_eq!(reply.status, 400, "{}", body(&reply));
        // And each statement alone, for the reader.
        for statement in [";COMMIT", ";BEGIN READ WRITE", ";SAVEPOINT _sqlhttp_guard"] {
            let reply = run(&router, &READER, statement).await;
            assert_eq!(reply.status, 400, "{statement}: {}", body(&reply));
        }
        assert_eq!(
            as_owner(&url, "SELECT count(*)::text FROM t").await,
            [Some("0".into())]
        );
        assert_eq!(
            as_owner(
                &url,
                "SELECT count(*)::text FROM pg_class WHERE relname = 'other_clients_table'"
            )
            .await,
            [Some("1".into())]
        );
        assert_eq!(
            as_owner(
                &url,
                "SELECT count(*)::text FROM pg_proc WHERE proname = 'planted'"
            )
            .await,
            [Some("0".into())]
        );
    }
}

needs_postgres! {
    /// Every statement the sandbox refuses is refused with empty statements before it, for the
    /// token the check is for.
    #[tokio::test]
    async fn semicolon_prefixed_statements_are_refused_for_the_right_token() {
        let (router, _url) = pg!("semicolon_prefixed_statements_are_refused_for_the_right_token");
        assert_eq!(
            run(&router, &WRITER, "CREATE TABLE t (x int)").await.status,
            200
        );
        for statement in [
            ";SET statement_timeout = 0",
            ";RESET ALL",
            ";DO $$ BEGIN PERFORM 1; END $$",
            ";LISTEN c",
            ";PREPARE p AS SELECT 1",
            ";DECLARE c CURSOR FOR SELECT 1",
            ";ALTER ROLE CURRENT_USER SET work_mem = '1GB'",
            " ; /* x */ ;\n-- y\r;SET search_path = evil",
        ] {
            for token in [WRITER, READER] {
                let reply = run(&router, &token, statement).await;
                assert_eq!(reply.status, 403, "{statement}: {}", body(&reply));
                assert_eq!(reply.code(), "STATEMENT_NOT_ALLOWED", "{statement}");
            }
        }
        for statement in [";LOCK TABLE t", ";NOTIFY c", ";ANALYZE t", ";;VACUUM t"] {
            let reply = run(&router, &READER, statement).await;
            assert_eq!(reply.status, 403, "{statement}: {}", body(&reply));
        }
        for statement in [";LOCK TABLE t", ";NOTIFY c", ";ANALYZE t"] {
            let reply = run(&router, &READER, statement).await;
            assert_eq!(reply.code(), "READ_ONLY", "{statement}");
        }
        for statement in [";COMMIT", ";END", ";ROLLBACK", ";RELEASE x", ";BEGIN"] {
            for token in [WRITER, READER] {
                let reply = run(&router, &token, statement).await;
                assert_eq!(reply.status, 400, "{statement}: {}", body(&reply));
                assert_eq!(reply.code(), "BAD_REQUEST", "{statement}");
            }
        }
    }
}

needs_postgres! {
    /// A keyed batch that ends the server's transaction, writes, re-creates the savepoints the
    /// server rolls back to and releases, then fails: on main a 4xx was stored with the write kept.
    #[tokio::test]
    async fn a_keyed_batch_that_recreates_the_savepoints_stores_and_keeps_nothing() {
        let (router, url) = pg!("a_keyed_batch_that_recreates_the_savepoints_stores_and_keeps_nothing");
        assert_eq!(
            run(&router, &WRITER, "CREATE TABLE t (x int)").await.status,
            200
        );
        let key = [WRITER[0], ("idempotency-key", "tampered-1")];
        let statements = [
            ";COMMIT",
            ";BEGIN",
            "INSERT INTO t VALUES (1)",
            ";SAVEPOINT _sqlhttp_work",
            ";SAVEPOINT _sqlhttp_guard",
            "SELECT 1 / 0",
        ];
        let batch = json!({
            "statements": statements.iter().map(|s| json!({"sql": s})).collect::<Vec<_>>()
        });
        let reply = batch_with(&router, &key, &batch).await;
        assert_eq!(reply.status, 400, "{}", body(&reply));
        assert_eq!(reply.code(), "BAD_REQUEST");
        assert_eq!(
            as_owner(&url, "SELECT count(*)::text FROM t").await,
            [Some("0".into())]
        );
        assert_eq!(
            as_owner(
                &url,
                "SELECT count(*)::text FROM _sqlhttp.idempotency WHERE key <> 'sqlhttp peer secret'"
            )
            .await,
            [Some("0".into())]
        );
        // Nothing was stored under the key: another request with it runs (no 422, no replay).
        let other = batch_with(
            &router,
            &key,
            &json!({"statements": [{"sql": "SELECT 1 AS one"}]}),
        )
        .await;
        assert_eq!(other.status, 200, "{}", body(&other));
        assert_eq!(other.header("idempotent-replayed"), None);
    }
}

needs_postgres! {
    /// `$N` is bounded before the text reaches PostgreSQL, which would otherwise size its
    /// parameter array by N (`$268435455` allocates 1 GiB; `$536870911` answered 500).
    #[tokio::test]
    async fn placeholders_past_the_parameters_are_refused_before_postgresql() {
        let (router, _url) = pg!("placeholders_past_the_parameters_are_refused_before_postgresql");
        for (text, named) in [
            ("SELECT $536870911::int", "$536870911"),
            ("SELECT $268435455::int", "$268435455"),
            ("SELECT ?268435455", "$268435455"),
            ("SELECT $2::int", "$2"),
        ] {
            let started = Instant::now();
            let reply = post_with(&router, &WRITER, &json!({"sql": text, "params": [1]})).await;
            assert_eq!(reply.status, 400, "{text}: {}", body(&reply));
            assert_eq!(reply.code(), "SQL_ERROR", "{text}");
            let message = reply.json()["error"]["message"]
                .as_str()
                .unwrap()
                .to_owned();
            assert!(message.contains(named), "{text}: {message}");
            // Generous: PostgreSQL's 1 GiB allocation and its 500 are what is excluded.
            assert!(started.elapsed() < Duration::from_secs(10), "{text}");
        }
        let reply = post_with(
            &router,
            &WRITER,
            &json!({"sql": "SELECT $1::int + ?1", "params": [2]}),
        )
        .await;
        assert_eq!(reply.json()["rows"], json!([[4]]), "{}", body(&reply));
    }
}

needs_postgres! {
    /// `COPY` to or from the client would switch the connection into the copy protocol: refused
    /// with 403 and how to bulk load instead; a function cannot reach it either; the server goes on
    /// answering (on main: a retryable 503 and a dead pooled connection).
    #[tokio::test]
    async fn copy_to_or_from_the_client_is_refused_and_the_server_goes_on() {
        let Some(url) = database("copy_to_or_from_the_client_is_refused_and_the_server_goes_on").await
        else {
            return;
        };
        // One pooled connection: the next request gets the same session.
        let mut config = config(&url);
        tokens(&mut config);
        config.limits.pool_size = 1;
        let router = app(AppState::new(&config).unwrap());
        assert_eq!(
            run(&router, &WRITER, "CREATE TABLE t (x int)").await.status,
            200
        );
        for statement in [
            "COPY t TO STDOUT",
            "copy (SELECT 1) to stdout with (format csv)",
            "COPY t FROM STDIN",
            ";COPY t FROM STDIN",
            "/* x */ COPY t (x) FROM STDIN WITH (FORMAT binary)",
        ] {
            for token in [WRITER, READER] {
                let reply = run(&router, &token, statement).await;
                assert_eq!(reply.status, 403, "{statement}: {}", body(&reply));
                assert_eq!(reply.code(), "STATEMENT_NOT_ALLOWED", "{statement}");
                let message = reply.json()["error"]["message"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                assert!(
                    message.contains("insert") && message.contains("import"),
                    "{message}"
                );
            }
            let next = run(&router, &WRITER, "SELECT count(*) FROM t").await;
            assert_eq!(next.status, 200, "after {statement}: {}", body(&next));
        }
        // PL/pgSQL and SQL functions refuse COPY to or from the client themselves.
        for (function, call) in [
            (
                "CREATE FUNCTION out_plpgsql() RETURNS void LANGUAGE plpgsql AS \
             $$ BEGIN EXECUTE 'COPY t TO STDOUT'; END $$",
                "SELECT out_plpgsql()",
            ),
            (
                "CREATE FUNCTION out_sql() RETURNS void LANGUAGE sql AS $$ COPY t TO STDOUT $$",
                "SELECT out_sql()",
            ),
        ] {
            let created = run(&router, &WRITER, function).await;
            if created.status == 200 {
                let called = run(&router, &WRITER, call).await;
                assert!(
                    (400..500).contains(&called.status),
                    "{function}: {}",
                    body(&called)
                );
            } else {
                assert!(
                    (400..500).contains(&created.status),
                    "{function}: {}",
                    body(&created)
                );
            }
            let next = run(&router, &WRITER, "SELECT count(*) FROM t").await;
            assert_eq!(next.status, 200, "after {function}: {}", body(&next));
        }
    }
}

/// SQLite drops empty statements too (rusqlite's `Batch` skips them): `;COMMIT` is a COMMIT
/// there, and both engines answer it the same way, before the engine sees it.
#[tokio::test]
async fn sqlite_refuses_semicolon_prefixed_statements_as_postgresql_does() {
    let db = TempDb::new("pg_text_sqlite");
    let mut config = Config {
        database: db.database(),
        ..Config::default()
    };
    tokens(&mut config);
    let router = app_with(&config);
    assert_eq!(
        run(&router, &WRITER, "CREATE TABLE t (x)").await.status,
        200
    );
    for statement in [
        ";COMMIT",
        "; ;BEGIN",
        "/* x */;END",
        ";SAVEPOINT s",
        ";RELEASE s",
        ";ROLLBACK",
        // SQLite ends a line comment at a newline only.
        "-- x\r;\nCOMMIT",
    ] {
        for token in [WRITER, READER] {
            let reply = run(&router, &token, statement).await;
            assert_eq!(reply.status, 400, "{statement}: {}", body(&reply));
            assert_eq!(reply.code(), "BAD_REQUEST", "{statement}");
            let message = reply.json()["error"]["message"]
                .as_str()
                .unwrap()
                .to_owned();
            assert!(message.contains("POST /api/v1/batch"), "{message}");
        }
    }
    let reply = run(&router, &WRITER, ";VACUUM").await;
    assert_eq!(reply.status, 403, "{}", body(&reply));
    assert_eq!(reply.code(), "STATEMENT_NOT_ALLOWED");
    // SQLite refuses `?NNN` past its variable limit (32766) as PostgreSQL's `$N` past the
    // parameters is refused: 400 SQL_ERROR.
    for text in ["SELECT ?40000", "SELECT ?2"] {
        let reply = post_with(&router, &WRITER, &json!({"sql": text, "params": [1]})).await;
        assert_eq!(reply.status, 400, "{text}: {}", body(&reply));
        assert_eq!(reply.code(), "SQL_ERROR", "{text}");
    }
    // Ordinary statements after empty ones still run.
    let reply = run(&router, &WRITER, ";INSERT INTO t VALUES (1)").await;
    assert_eq!(reply.status, 200, "{}", body(&reply));
    assert_eq!(reply.json()["rows_affected"], 1);
}

needs_postgres! {
    /// Statement texts with random leading and interleaved `;`, comments and whitespace of every
    /// kind (some that only one engine skips, some that none does) before a keyword. Whenever
    /// PostgreSQL itself parses the text as the statement (its Parse succeeds), the server must
    /// answer as for that statement: refused for `LISTEN` / `SET` / `COMMIT`, the row for
    /// `SELECT`. What PostgreSQL does not parse, the server may refuse or pass on.
    #[tokio::test]
    async fn the_lexer_reads_what_postgresql_runs() {
        use proptest::prelude::*;
        use proptest::strategy::ValueTree as _;
        use proptest::test_runner::TestRunner;

        let (router, url) = pg!("the_lexer_reads_what_postgresql_runs");
        let (owner, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);

        let piece = prop_oneof![
            Just(";"),
            Just(" "),
            Just("\t"),
            Just("\n"),
            Just("\r"),
            Just("\x0b"),
            Just("\x0c"),
            Just("\u{a0}"),
            Just("\u{2003}"),
            Just("-- c\n"),
            Just("-- c\r"),
            Just("-- c ; x\r;"),
            Just("/* c */"),
            Just("/* ; */"),
            Just("/* /* c */ */"),
            Just("/* /* c */"),
            Just("*/"),
            Just("/**/"),
            Just("--\n"),
        ];
        let statement = prop_oneof![
            Just(("SELECT", "SELECT 7 AS k")),
            Just(("LISTEN", "LISTEN k")),
            Just(("SET", "SET work_mem = '64kB'")),
            Just(("COMMIT", "COMMIT")),
        ];
        let texts = (
            proptest::collection::vec(piece.clone(), 0..8),
            statement,
            proptest::collection::vec(piece, 0..3),
        )
            .prop_map(|(before, (keyword, text), after)| {
                (
                    keyword,
                    format!("{}{text}{}", before.concat(), after.concat()),
                )
            });
        let mut runner = TestRunner::deterministic();
        let mut parsed = 0;
        for _ in 0..160 {
            let (keyword, text) = texts.new_tree(&mut runner).unwrap().current();
            // Parse only: PostgreSQL tells whether this is the statement, without running it.
            if owner.prepare(&text).await.is_err() {
                continue;
            }
            parsed += 1;
            let reply = run(&router, &WRITER, &text).await;
            let shown = format!("{text:?} ({keyword}): {} {}", reply.status, body(&reply));
            match keyword {
                "SELECT" => {
                    assert_eq!(reply.status, 200, "{shown}");
                    assert_eq!(reply.json()["rows"], json!([[7]]), "{shown}");
                }
                "COMMIT" => assert_eq!(reply.status, 400, "{shown}"),
                _ => assert_eq!(reply.status, 403, "{shown}"),
            }
        }
        // Enough of the texts were ones PostgreSQL runs for the check to mean something.
        assert!(parsed > 40, "only {parsed} texts parsed");
    }
}
