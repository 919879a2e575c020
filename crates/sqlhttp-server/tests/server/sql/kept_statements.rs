//! SQLite keeps a connection's read-only client statements compiled between requests (ADR
//! 0071): what a kept statement answers is what a fresh compile would, after the schema moves
//! under it (new columns, a view redefined to do what the sandbox refuses), and what a run
//! reports it read is that run's alone. One reader, so every read lands on the connection that
//! kept the statement.

use serde_json::{Value, json};
use sqlhttp_protocol::body::QueryResult;
use sqlhttp_server::{Config, Limits};

use crate::common::{Reply, app_with, ok, sql};

/// One reader (and the writer): a text read twice is kept by the connection the third read
/// runs on.
fn one_reader() -> axum::Router {
    app_with(&Config {
        limits: Limits {
            read_connections: 1,
            ..Limits::default()
        },
        ..Config::default()
    })
}

async fn read(router: &axum::Router, text: &str) -> Reply {
    crate::common::post_with(router, &[], &json!({"sql": text, "read_only": true})).await
}

async fn rows(router: &axum::Router, text: &str) -> Value {
    let reply = read(router, text).await;
    assert_eq!(
        reply.status,
        200,
        "{text}: {}",
        String::from_utf8_lossy(&reply.body)
    );
    reply.json()["rows"].clone()
}

/// A statement kept while `v` was the client's table, then `v` made a view of the server's
/// own store: SQLite compiles the kept statement again as it runs it, and the sandbox's
/// authorizer refuses it there as it refuses a fresh compile.
#[tokio::test]
async fn a_kept_statement_meets_the_sandbox_again_when_the_schema_moves() {
    let router = one_reader();
    ok(&router, "CREATE TABLE v (key TEXT)", json!([])).await;
    for _ in 0..3 {
        assert_eq!(rows(&router, "SELECT count(*) FROM v").await, json!([[0]]));
    }
    ok(&router, "DROP TABLE v", json!([])).await;
    let made = sql(
        &router,
        "CREATE VIEW v AS SELECT key FROM _sqlhttp_idempotency",
        json!([]),
    )
    .await;
    // The view is the client's to make; reading through it is what the sandbox refuses.
    assert_eq!(made.status, 200, "{}", String::from_utf8_lossy(&made.body));
    let refused = read(&router, "SELECT count(*) FROM v").await;
    assert_eq!(
        refused.status,
        403,
        "{}",
        String::from_utf8_lossy(&refused.body)
    );
    assert_eq!(refused.code(), "STATEMENT_NOT_ALLOWED");
}

/// A kept `SELECT *` answers the table's columns as they are now, after another connection
/// (the writer) changed them.
#[tokio::test]
async fn a_kept_statement_answers_the_columns_the_table_has_now() {
    let router = one_reader();
    ok(&router, "CREATE TABLE t (a INTEGER)", json!([])).await;
    ok(&router, "INSERT INTO t VALUES (1)", json!([])).await;
    for _ in 0..3 {
        assert_eq!(rows(&router, "SELECT * FROM t").await, json!([[1]]));
    }
    ok(
        &router,
        "ALTER TABLE t ADD COLUMN b TEXT DEFAULT 'x'",
        json!([]),
    )
    .await;
    let reply = read(&router, "SELECT * FROM t").await;
    let names: Vec<Value> = reply.json()["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|column| column["name"].clone())
        .collect();
    assert_eq!(names, [json!("a"), json!("b")]);
    assert_eq!(reply.json()["rows"], json!([[1, "x"]]));
    ok(&router, "DROP TABLE t", json!([])).await;
    let gone = read(&router, "SELECT * FROM t").await;
    assert_eq!(gone.status, 400, "{}", String::from_utf8_lossy(&gone.body));
}

/// A text whose end holds a no-break space names another table than the text without it
/// (SQLite reads the space as part of the name), and is answered from its own table, never by
/// the kept statement of its trimmed twin.
#[tokio::test]
async fn a_text_is_never_answered_by_the_kept_statement_of_its_trimmed_twin() {
    let router = one_reader();
    for setup in [
        "CREATE TABLE v (x INTEGER)",
        "INSERT INTO v VALUES (1)",
        "CREATE TABLE \"v\u{a0}\" (x INTEGER)",
        "INSERT INTO \"v\u{a0}\" VALUES (1), (2)",
    ] {
        ok(&router, setup, json!([])).await;
    }
    for _ in 0..3 {
        assert_eq!(rows(&router, "SELECT count(*) FROM v").await, json!([[1]]));
    }
    for _ in 0..3 {
        assert_eq!(
            rows(&router, "SELECT count(*) FROM v\u{a0}").await,
            json!([[2]])
        );
    }
}

/// The rows a full scan read are counted per run: a kept statement's counter does not carry
/// over from one run to the next, nor from a run that failed half-way.
#[tokio::test]
async fn a_kept_statement_reports_the_rows_each_run_read() {
    let router = one_reader();
    ok(
        &router,
        "CREATE TABLE t AS WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g \
         WHERE n < 100) SELECT n FROM g",
        json!([]),
    )
    .await;
    // `json('x')` fails when it is evaluated: at row `?1` of the scan.
    let scan = "SELECT count(*) FROM t WHERE n % 7 = 0 AND CASE WHEN n = ?1 THEN json('x') \
                ELSE 1 END";
    let run = |fail_at: i64| {
        let router = router.clone();
        async move {
            crate::common::post_with(
                &router,
                &[],
                &json!({"sql": scan, "params": [fail_at], "read_only": true}),
            )
            .await
        }
    };
    let mut read_each_run = Vec::new();
    for round in 0..4 {
        if round == 2 {
            let failed = run(49).await;
            assert_eq!(
                failed.status,
                400,
                "{}",
                String::from_utf8_lossy(&failed.body)
            );
        }
        let reply = run(0).await;
        let typed: QueryResult = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(typed.rows, vec![vec![json!(14)]]);
        read_each_run.push(typed.stats.unwrap().rows_read.unwrap());
    }
    assert!(read_each_run[0] >= 99, "{read_each_run:?}");
    assert!(
        read_each_run.iter().all(|n| *n == read_each_run[0]),
        "{read_each_run:?}"
    );
}

/// Statements whose answers SQLite may compute as it compiles them, and texts beyond what a
/// connection keeps: each answer is right however often, and among however many others, it is
/// sent.
#[tokio::test]
async fn every_text_is_answered_right_however_many_a_connection_has_seen() {
    let router = one_reader();
    ok(&router, "CREATE TABLE t (a INTEGER)", json!([])).await;
    for round in 0..3 {
        // More texts than a connection keeps, each read every round.
        for k in 0..40 {
            assert_eq!(
                rows(&router, &format!("SELECT {k} + count(*) FROM t")).await,
                json!([[k + round]])
            );
        }
        let columns = rows(&router, "PRAGMA table_info(t)").await;
        assert_eq!(columns.as_array().unwrap().len(), round + 1, "{columns}");
        ok(&router, "INSERT INTO t (a) VALUES (1)", json!([])).await;
        ok(
            &router,
            &format!("ALTER TABLE t ADD COLUMN c{round} INTEGER"),
            json!([]),
        )
        .await;
    }
}
