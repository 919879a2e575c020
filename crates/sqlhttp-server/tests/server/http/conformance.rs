//! Cases found by driving the server black-box against docs/protocol.md, the way an
//! independent conformance suite would: each test pins one behaviour that once differed from
//! the written protocol.

use serde_json::{Value, json};

use crate::common::{http_client, memory_app, ok, send, sql, sqlhttpd, start};

#[tokio::test]
async fn negative_zero_is_an_integer_parameter() {
    let router = memory_app();
    let reply = send(
        &router,
        "POST",
        "/api/v1/sql",
        &[("content-type", "application/json")],
        r#"{"sql": "SELECT ?, typeof(?)", "params": [-0, -0]}"#,
    )
    .await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.json()["rows"], json!([[0, "integer"]]));
}

#[tokio::test]
async fn a_json_array_body_is_not_a_request_object() {
    let router = memory_app();
    for body in [r#"["SELECT 1", []]"#, r#" ["SELECT ?", [1]]"#] {
        let reply = send(
            &router,
            "POST",
            "/api/v1/sql",
            &[("content-type", "application/json")],
            body,
        )
        .await;
        assert_eq!(reply.status, 400, "{body}");
        assert_eq!(reply.code(), "BAD_REQUEST", "{body}");
    }
}

#[tokio::test]
async fn a_nul_in_the_sql_text_is_refused_not_truncated() {
    let router = memory_app();
    let reply = sql(&router, "SELECT 1\u{0}; CREATE TABLE hidden (x)", json!([])).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.code(), "SQL_ERROR");
    let tables = ok(
        &router,
        "SELECT count(*) FROM sqlite_schema WHERE name = 'hidden'",
        json!([]),
    )
    .await;
    assert_eq!(tables["rows"], json!([[0]]));
}

#[tokio::test]
async fn a_strict_table_type_error_is_a_sql_error_not_a_constraint_violation() {
    let router = memory_app();
    ok(&router, "CREATE TABLE s (x INTEGER) STRICT", json!([])).await;
    let reply = sql(&router, "INSERT INTO s VALUES (?)", json!(["abc"])).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.code(), "SQL_ERROR");
}

#[tokio::test]
async fn ddl_reports_zero_rows_affected_even_when_it_cascades() {
    let router = memory_app();
    for statement in [
        "CREATE TABLE parent (id INTEGER PRIMARY KEY)",
        "CREATE TABLE child (p INTEGER REFERENCES parent(id) ON DELETE CASCADE)",
        "INSERT INTO parent VALUES (1), (2)",
        "INSERT INTO child VALUES (1), (2)",
    ] {
        ok(&router, statement, json!([])).await;
    }
    let dropped = ok(&router, "DROP TABLE parent", json!([])).await;
    assert_eq!(dropped["rows_affected"], 0);
    assert_eq!(dropped["last_insert_id"], Value::Null);
    // The cascade did happen; it is just not the statement's row count.
    let left = ok(&router, "SELECT count(*) FROM child", json!([])).await;
    assert_eq!(left["rows"], json!([[0]]));
}

#[test]
fn an_empty_token_flag_is_refused_rather_than_leaving_the_server_open() {
    for token in ["", "   "] {
        let output = sqlhttpd()
            .args(["--listen", "127.0.0.1:0", "--token", token])
            .output()
            .unwrap();
        assert!(!output.status.success(), "{token:?}");
        assert!(output.stdout.is_empty(), "{token:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("--token"), "{stderr}");
        assert!(stderr.contains("empty"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[tokio::test]
async fn a_token_flag_with_surrounding_spaces_is_trimmed() {
    let (mut child, url) = start(&["--listen", "127.0.0.1:0", "--token", " padded "]);
    let status = |token: &'static str| {
        let url = url.clone();
        async move {
            http_client()
                .post(format!("{url}/api/v1/sql"))
                .header("content-type", "application/json")
                .bearer_auth(token)
                .body(r#"{"sql": "SELECT 1"}"#)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(status("padded").await, 200);
    assert_eq!(status("wrong").await, 401);
    child.kill().unwrap();
    child.wait().unwrap();
}
