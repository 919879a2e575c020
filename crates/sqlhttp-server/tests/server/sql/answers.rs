//! What a statement answers, in-process: the v1 body, the error table (SQL errors, constraint
//! violations with their kind), no transaction spanning requests, value mapping,
//! `rows_affected` / `last_insert_id` and `RETURNING`. The cases that hold for both engines run
//! on both (see [`crate::engines`]); the value mapping and the counts of SQLite's own
//! `last_insert_id` are SQLite's here (PostgreSQL's types are `sql/pg_types.rs`).

use serde_json::{Value, json};

use crate::common::{memory_app, ok, send, sql, without_stats};
use crate::engines::{Engine, engine_app, on_both_engines};

on_both_engines!(
    statements_answer_the_v1_body,
    engine_rejections_are_sql_errors_with_the_engine_message,
    constraint_violations_are_409_with_their_kind,
    no_transaction_spans_requests,
    one_database_is_shared_by_every_request,
);

async fn statements_answer_the_v1_body(engine: Engine) {
    let router = engine_app!(engine);
    let created = ok(
        &router,
        "CREATE TABLE items (id bigint PRIMARY KEY, name text NOT NULL, price real)",
        json!([]),
    )
    .await;
    assert_eq!(
        created,
        json!({"columns": [], "rows": [], "rows_affected": 0, "last_insert_id": null})
    );
    let inserted = ok(
        &router,
        "INSERT INTO items VALUES (?, ?, ?), (?, ?, ?)",
        json!([1, "a \"quoted\" ✓", 1.25, i64::MAX, "b", null]),
    )
    .await;
    assert_eq!(inserted["rows_affected"], 2);
    // SQLite's rowid (this table's key is not it); PostgreSQL has none.
    assert_eq!(
        inserted["last_insert_id"],
        engine.pick(json!(2), Value::Null)
    );
    let rows = ok(
        &router,
        "SELECT id, name, price FROM items WHERE id >= ? ORDER BY id",
        json!([0]),
    )
    .await;
    // SQLite names a column by its declared type (a standard name in capitals), PostgreSQL by
    // the type's own name.
    let [id, name, price] = engine.pick(["bigint", "TEXT", "REAL"], ["int8", "text", "float4"]);
    assert_eq!(
        rows,
        json!({
            "columns": [
                {"name": "id", "type": id},
                {"name": "name", "type": name},
                {"name": "price", "type": price}
            ],
            "rows": [[1, "a \"quoted\" ✓", 1.25], [i64::MAX, "b", null]],
            "rows_affected": 0,
            "last_insert_id": null
        })
    );
    let returning = ok(
        &router,
        "UPDATE items SET price = ? WHERE id = ? RETURNING id, price",
        json!([2.5, 1]),
    )
    .await;
    assert_eq!(returning["rows"], json!([[1, 2.5]]));
    assert_eq!(returning["rows_affected"], 1);
    let ready = send(&router, "GET", "/readyz", &[], "").await;
    assert_eq!(ready.status, 200);
}

async fn engine_rejections_are_sql_errors_with_the_engine_message(engine: Engine) {
    let router = engine_app!(engine);
    // The message is the engine's where the engine refused, the server's where it did.
    let missing = engine.pick("no such table", "does not exist");
    let count = engine.pick("parameters", "parameter");
    let several = engine.pick("several statements", "multiple commands");
    let cases: Vec<(&str, Value, &str)> = vec![
        ("SELEC 1", json!([]), "syntax error"),
        ("SELECT * FROM missing", json!([]), missing),
        ("SELECT ?, ?", json!([1]), count),
        ("SELECT 1", json!([1]), count),
        ("SELECT 1; SELECT 2", json!([]), several),
        // docs/protocol.md: a text with no statement, on both engines.
        ("   ", json!([]), "no statement"),
        ("-- nothing\n;", json!([]), "no statement"),
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

async fn constraint_violations_are_409_with_their_kind(engine: Engine) {
    let router = engine_app!(engine);
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
    for (statement, kind) in [
        ("INSERT INTO parent VALUES (1, 'b', 1)", "primary_key"),
        ("INSERT INTO parent VALUES (2, 'a', 1)", "unique"),
        ("INSERT INTO parent VALUES (3, NULL, 1)", "not_null"),
        ("INSERT INTO parent VALUES (4, 'd', 0)", "check"),
        ("INSERT INTO child VALUES (99)", "foreign_key"),
    ] {
        let reply = sql(&router, statement, json!([])).await;
        assert_eq!(reply.status, 409, "{statement}");
        assert_eq!(reply.code(), "CONSTRAINT_VIOLATION", "{statement}");
        assert_eq!(reply.json()["error"]["constraint"], kind, "{statement}");
    }
}

async fn no_transaction_spans_requests(engine: Engine) {
    let router = engine_app!(engine);
    ok(&router, "CREATE TABLE t (v INTEGER)", json!([])).await;
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

async fn one_database_is_shared_by_every_request(engine: Engine) {
    let router = engine_app!(engine);
    ok(&router, "CREATE TABLE t (v INTEGER)", json!([])).await;
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
    let text = String::from_utf8(reply.body).unwrap();
    assert_eq!(
        without_stats(&text),
        r#"{"columns":[{"name":"a","type":""}],"rows":[[1]],"rows_affected":0,"last_insert_id":null}"#
    );
    assert!(
        text.ends_with(r#""served_by":"primary"}}"#),
        "stats come last: {text}"
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
