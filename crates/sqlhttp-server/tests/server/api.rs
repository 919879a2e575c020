//! The protocol driven in-process: routing, the error table, value mapping, rows_affected /
//! last_insert_id, RETURNING, authentication and the body limit.

use serde_json::{Value, json};
use sqlhttp_server::Config;

use crate::common::{app_with, memory_app, ok, post_with, send, sql};

#[tokio::test]
async fn healthz_is_open_and_plain() {
    let router = app_with(&Config {
        tokens: vec!["t".into()],
        ..Config::default()
    });
    let reply = send(&router, "GET", "/healthz", &[], "").await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, b"ok");
    let reply = send(&router, "POST", "/healthz", &[], "").await;
    assert_eq!(reply.status, 405);
    assert_eq!(reply.code(), "METHOD_NOT_ALLOWED");
    assert_eq!(reply.header("allow"), Some("GET, HEAD"));
}

#[tokio::test]
async fn unknown_paths_are_json_404() {
    let router = memory_app();
    for path in ["/", "/api/v1/sql/", "/api/v2/sql", "/nope"] {
        let reply = send(&router, "POST", path, &[], "{}").await;
        assert_eq!(reply.status, 404, "{path}");
        assert_eq!(reply.code(), "NOT_FOUND");
        assert_eq!(reply.header("content-type"), Some("application/json"));
    }
}

#[tokio::test]
async fn other_methods_on_the_sql_endpoint_are_405_with_allow() {
    let router = memory_app();
    for method in ["GET", "PUT", "DELETE", "PATCH", "HEAD"] {
        let reply = send(&router, method, "/api/v1/sql", &[], "").await;
        assert_eq!(reply.status, 405, "{method}");
        assert_eq!(reply.header("allow"), Some("POST"), "{method}");
        if method != "HEAD" {
            assert_eq!(reply.code(), "METHOD_NOT_ALLOWED");
        }
    }
}

#[tokio::test]
async fn malformed_requests_are_bad_request() {
    let router = memory_app();
    let bodies = [
        "not json".to_owned(),
        String::new(),
        "[]".to_owned(),
        json!({"params": []}).to_string(),
        json!({"sql": 1}).to_string(),
        json!({"sql": "SELECT ?", "params": [[1]]}).to_string(),
        json!({"sql": "SELECT ?", "params": [{"a": 1}]}).to_string(),
        r#"{"sql": "SELECT ?", "params": [9223372036854775808]}"#.to_owned(),
        r#"{"sql": "SELECT ?", "params": [-9223372036854775809]}"#.to_owned(),
    ];
    for body in bodies {
        let reply = send(&router, "POST", "/api/v1/sql", JSON, body.clone()).await;
        assert_eq!(reply.status, 400, "{body}");
        assert_eq!(reply.code(), "BAD_REQUEST", "{body}");
    }
}

#[tokio::test]
async fn engine_rejections_are_sql_errors_with_the_engine_message() {
    let router = memory_app();
    let cases: [(&str, Value, &str); 6] = [
        ("SELEC 1", json!([]), "syntax error"),
        ("SELECT * FROM missing", json!([]), "no such table"),
        ("SELECT ?, ?", json!([1]), "parameters"),
        ("SELECT 1", json!([1]), "parameters"),
        ("SELECT 1; SELECT 2", json!([]), "several statements"),
        ("   ", json!([]), "no statement"),
    ];
    for (text, params, needle) in cases {
        let reply = sql(&router, text, params).await;
        assert_eq!(reply.status, 400, "{text}");
        assert_eq!(reply.code(), "SQL_ERROR", "{text}");
        let message = reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(message.contains(needle), "{text}: {message}");
    }
}

#[tokio::test]
async fn constraint_violations_are_409() {
    let router = memory_app();
    ok(
        &router,
        "CREATE TABLE parent (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, n INTEGER CHECK (n > 0))",
        json!([]),
    )
    .await;
    ok(
        &router,
        "CREATE TABLE child (parent_id INTEGER REFERENCES parent(id))",
        json!([]),
    )
    .await;
    ok(&router, "INSERT INTO parent VALUES (1, 'a', 1)", json!([])).await;
    for statement in [
        "INSERT INTO parent VALUES (1, 'b', 1)",
        "INSERT INTO parent VALUES (2, 'a', 1)",
        "INSERT INTO parent VALUES (3, NULL, 1)",
        "INSERT INTO parent VALUES (4, 'd', 0)",
        "INSERT INTO child VALUES (99)",
    ] {
        let reply = sql(&router, statement, json!([])).await;
        assert_eq!(reply.status, 409, "{statement}");
        assert_eq!(reply.code(), "CONSTRAINT_VIOLATION", "{statement}");
    }
}

#[tokio::test]
async fn values_map_to_json_exactly() {
    let router = memory_app();
    ok(
        &router,
        "CREATE TABLE v (i INTEGER, r REAL, t TEXT, b BLOB, n NUMERIC)",
        json!([]),
    )
    .await;
    ok(
        &router,
        "INSERT INTO v VALUES (?, ?, ?, x'0001ff', ?)",
        json!([i64::MAX, 2.5, "h\u{e9}llo \"q\"", null]),
    )
    .await;
    ok(
        &router,
        "INSERT INTO v VALUES (?, ?, ?, NULL, ?)",
        json!([i64::MIN, -0.125, "", true]),
    )
    .await;
    let body = ok(
        &router,
        "SELECT i, r, t, b, n, i + 0 AS expr FROM v ORDER BY rowid",
        json!([]),
    )
    .await;
    assert_eq!(
        body["columns"],
        json!([
            {"name": "i", "type": "INTEGER"},
            {"name": "r", "type": "REAL"},
            {"name": "t", "type": "TEXT"},
            {"name": "b", "type": "BLOB"},
            {"name": "n", "type": "NUMERIC"},
            {"name": "expr", "type": ""},
        ])
    );
    assert_eq!(
        body["rows"],
        json!([
            [
                i64::MAX,
                2.5,
                "h\u{e9}llo \"q\"",
                {"base64": "AAH/"},
                null,
                i64::MAX
            ],
            [i64::MIN, -0.125, "", null, 1, i64::MIN],
        ])
    );
    let raw = String::from_utf8(
        sql(&router, "SELECT i FROM v WHERE i > 0", json!([]))
            .await
            .body,
    )
    .unwrap();
    assert!(raw.contains("[[9223372036854775807]]"), "{raw}");
    let bools = ok(&router, "SELECT ?, ?, typeof(?)", json!([true, false, 1.0])).await;
    assert_eq!(bools["rows"], json!([[1, 0, "real"]]));
    let special = ok(&router, "SELECT 1e308 * 10, -1e308 * 10", json!([])).await;
    assert_eq!(special["rows"], json!([[null, null]]));
}

#[tokio::test]
async fn envelope_keys_come_in_protocol_order() {
    let router = memory_app();
    let reply = sql(&router, "SELECT 1 AS a", json!([])).await;
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(
        String::from_utf8(reply.body).unwrap(),
        r#"{"columns":[{"name":"a","type":""}],"rows":[[1]],"rows_affected":0,"last_insert_id":null}"#
    );
}

#[tokio::test]
async fn rows_affected_and_last_insert_id() {
    let router = memory_app();
    let created = ok(
        &router,
        "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)",
        json!([]),
    )
    .await;
    assert_eq!(created["columns"], json!([]));
    assert_eq!(created["rows"], json!([]));
    assert_eq!(created["rows_affected"], 0);
    assert_eq!(created["last_insert_id"], Value::Null);

    let one = ok(&router, "INSERT INTO t (v) VALUES (?)", json!(["a"])).await;
    assert_eq!(
        (one["rows_affected"].clone(), one["last_insert_id"].clone()),
        (json!(1), json!(1))
    );
    let many = ok(&router, "INSERT INTO t (v) VALUES ('b'), ('c')", json!([])).await;
    assert_eq!(
        (
            many["rows_affected"].clone(),
            many["last_insert_id"].clone()
        ),
        (json!(2), json!(3))
    );
    let explicit = ok(
        &router,
        "INSERT INTO t (id, v) VALUES (9000000000, 'd')",
        json!([]),
    )
    .await;
    assert_eq!(explicit["last_insert_id"], 9_000_000_000_i64);

    let updated = ok(&router, "UPDATE t SET v = 'z' WHERE id < 3", json!([])).await;
    assert_eq!(updated["rows_affected"], 2);
    assert_eq!(updated["last_insert_id"], Value::Null);
    let selected = ok(&router, "SELECT * FROM t", json!([])).await;
    assert_eq!(selected["rows_affected"], 0);
    assert_eq!(selected["last_insert_id"], Value::Null);
    let none = ok(
        &router,
        "INSERT INTO t (v) SELECT v FROM t WHERE 0",
        json!([]),
    )
    .await;
    assert_eq!(none["rows_affected"], 0);
    assert_eq!(none["last_insert_id"], Value::Null);
    let deleted = ok(&router, "DELETE FROM t", json!([])).await;
    assert_eq!(deleted["rows_affected"], 4);
    assert_eq!(deleted["last_insert_id"], Value::Null);
}

#[tokio::test]
async fn returning_streams_rows_and_counts_changes() {
    let router = memory_app();
    ok(
        &router,
        "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)",
        json!([]),
    )
    .await;
    let body = ok(
        &router,
        "INSERT INTO t (v) VALUES (?), (?) RETURNING id, v",
        json!(["x", "y"]),
    )
    .await;
    assert_eq!(body["columns"][0]["name"], "id");
    assert_eq!(body["rows"], json!([[1, "x"], [2, "y"]]));
    assert_eq!(body["rows_affected"], 2);
    assert_eq!(body["last_insert_id"], 2);
    let deleted = ok(&router, "DELETE FROM t WHERE id = 1 RETURNING v", json!([])).await;
    assert_eq!(deleted["rows"], json!([["x"]]));
    assert_eq!(deleted["rows_affected"], 1);
}

#[tokio::test]
async fn one_database_is_shared_by_every_request() {
    let router = memory_app();
    ok(&router, "CREATE TABLE t (v)", json!([])).await;
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let router = router.clone();
            tokio::spawn(async move { ok(&router, "INSERT INTO t VALUES (?)", json!([i])).await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let count = ok(&router, "SELECT count(*) FROM t", json!([])).await;
    assert_eq!(count["rows"], json!([[8]]));
}

#[tokio::test]
async fn bearer_tokens_guard_the_sql_endpoint() {
    let router = app_with(&Config {
        tokens: vec!["alpha".into(), "beta".into()],
        ..Config::default()
    });
    let body = json!({"sql": "SELECT 1"});
    for headers in [
        vec![],
        vec![("authorization", "Bearer gamma")],
        vec![("authorization", "Basic YWxwaGE6")],
        vec![("authorization", "alpha")],
    ] {
        let reply = post_with(&router, &headers, &body).await;
        assert_eq!(reply.status, 401, "{headers:?}");
        assert_eq!(reply.code(), "UNAUTHORIZED");
        assert_eq!(reply.header("www-authenticate"), Some("Bearer"));
    }
    for token in ["Bearer alpha", "Bearer beta"] {
        let reply = post_with(&router, &[("authorization", token)], &body).await;
        assert_eq!(reply.status, 200, "{token}");
    }
}

#[tokio::test]
async fn auth_is_checked_before_the_body_is_read() {
    let router = app_with(&Config {
        tokens: vec!["alpha".into()],
        max_body_bytes: 16,
        ..Config::default()
    });
    let reply = send(&router, "POST", "/api/v1/sql", &[], "x".repeat(1000)).await;
    assert_eq!(reply.status, 401);
}

#[tokio::test]
async fn oversized_bodies_are_413_with_a_json_body() {
    let router = app_with(&Config {
        max_body_bytes: 64,
        ..Config::default()
    });
    let fits = json!({"sql": "SELECT 1"}).to_string();
    assert_eq!(
        send(&router, "POST", "/api/v1/sql", JSON, fits)
            .await
            .status,
        200
    );
    let big = json!({"sql": format!("SELECT '{}'", "x".repeat(100))}).to_string();
    let reply = send(&router, "POST", "/api/v1/sql", JSON, big).await;
    assert_eq!(reply.status, 413);
    assert_eq!(reply.code(), "PAYLOAD_TOO_LARGE");
    assert_eq!(reply.header("content-type"), Some("application/json"));
}

/// The headers of a JSON POST.
const JSON: &[(&str, &str)] = &[("content-type", "application/json")];

#[tokio::test]
async fn no_transaction_spans_requests() {
    let router = memory_app();
    ok(&router, "CREATE TABLE t (v)", json!([])).await;
    for statement in [
        "BEGIN",
        "begin immediate",
        "SAVEPOINT s",
        "COMMIT",
        "END",
        "ROLLBACK",
    ] {
        let reply = sql(&router, statement, json!([])).await;
        assert_eq!(reply.status, 400, "{statement}");
        assert_eq!(reply.code(), "BAD_REQUEST", "{statement}");
        let message = reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            message.contains("batch"),
            "says how to get atomic work: {message}"
        );
    }
    ok(&router, "INSERT INTO t VALUES (1)", json!([])).await;
    // Nothing can undo an acknowledged write: ROLLBACK was refused, the row stays.
    let _ = sql(&router, "ROLLBACK", json!([])).await;
    let count = ok(&router, "SELECT count(*) FROM t", json!([])).await;
    assert_eq!(count["rows"], json!([[1]]));
}

#[tokio::test]
async fn a_body_not_declared_as_json_is_415() {
    let router = memory_app();
    let body = json!({"sql": "SELECT 1"}).to_string();
    for headers in [
        &[][..],
        &[("content-type", "text/plain")][..],
        &[("content-type", "application/x-www-form-urlencoded")][..],
    ] {
        let reply = send(&router, "POST", "/api/v1/sql", headers, body.clone()).await;
        assert_eq!(reply.status, 415, "{headers:?}");
        assert_eq!(reply.code(), "UNSUPPORTED_MEDIA_TYPE");
    }
    let charset = [("content-type", "application/json; charset=utf-8")];
    assert_eq!(
        send(&router, "POST", "/api/v1/sql", &charset, body)
            .await
            .status,
        200
    );
}
