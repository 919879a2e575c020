//! Streamed results (ADR 0016): a large success body is written while the statement runs, in
//! the protocol's shape and key order; a failure after the head is signalled inside the body;
//! a client that goes away mid-stream frees the engine connection at once; compression. The
//! cases that hold for both engines run on both (see [`crate::engines`]).

use std::time::Duration;

use axum::body::{Body, HttpBody as _};
use axum::http::Request;
use serde_json::{Value, json};
use sqlhttp_server::{Config, Limits};
use tower::ServiceExt as _;

use crate::common::{
    ENDLESS_ON_POSTGRES, abandon_mid_stream, app_with, memory_app, post_with, sql,
};
use crate::engines::{Engine, engine_app, on_both_engines};

on_both_engines!(
    a_large_result_streams_in_the_protocols_shape,
    an_engine_error_after_the_head_ends_the_body_with_the_error,
    a_client_gone_mid_stream_frees_the_connection,
);

/// `n` rows of two columns, computed (no table needed).
fn counted(n: u64) -> String {
    format!(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT {n}) \
         SELECT x, 'row ' || x AS label FROM c"
    )
}

const ENDLESS: &str =
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c";

fn request(sql: &str) -> Request<Body> {
    Request::post("/api/v1/sql")
        .header("content-type", "application/json")
        .body(Body::from(json!({ "sql": sql }).to_string()))
        .unwrap()
}

async fn a_large_result_streams_in_the_protocols_shape(engine: Engine) {
    let router = engine_app!(engine);
    let rows = engine.pick(
        counted(50_000),
        "SELECT x, 'row ' || x AS label FROM generate_series(1, 50000) AS x".to_owned(),
    );
    let response = router.clone().oneshot(request(&rows)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.body().size_hint().exact().is_none(),
        "a large body is streamed, without a length"
    );
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let text = std::str::from_utf8(&body).unwrap();
    // No type for an expression on SQLite; PostgreSQL's own.
    let (x, label) = engine.pick(("", ""), ("int4", "text"));
    let head = format!(
        r#"{{"columns":[{{"name":"x","type":"{x}"}},{{"name":"label","type":"{label}"}}],"rows":[[1,"row 1"],"#
    );
    assert!(text.starts_with(&head), "{}", &text[..120]);
    // Sent without `read_only`, it ran as a write: on PostgreSQL its body ends with the bookmark
    // its headers could not carry (they went out before it committed).
    let tail = engine.pick(r#","stats":{"#, r#","bookmark":""#);
    assert!(
        text.contains(&format!(
            r#"[50000,"row 50000"]],"rows_affected":0,"last_insert_id":null{tail}"#
        )) && text.ends_with('}'),
        "{}",
        &text[text.len() - 100..]
    );
    let json: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["rows"].as_array().unwrap().len(), 50_000);

    // A small result is answered whole, with its length.
    let response = router.oneshot(request("SELECT 1 AS one")).await.unwrap();
    assert!(response.body().size_hint().exact().is_some());
}

async fn an_engine_error_after_the_head_ends_the_body_with_the_error(engine: Engine) {
    let router = engine_app!(engine);
    // An engine error at row 20 000, after several chunks have gone out: abs() of the smallest
    // integer overflows on SQLite, a division by zero on PostgreSQL.
    let failing = engine.pick(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 30000) \
         SELECT CASE WHEN x < 20000 THEN x ELSE abs(-9223372036854775807 - 1) END AS v FROM c",
        "SELECT CASE WHEN x < 20000 THEN x ELSE 1 / (x - x) END AS v \
         FROM generate_series(1, 30000) AS x",
    );
    let reply = sql(&router, failing, json!([])).await;
    assert_eq!(
        reply.status,
        200,
        "the head was sent before the error: {}",
        String::from_utf8_lossy(&reply.body[..reply.body.len().min(300)])
    );
    let text = String::from_utf8(reply.body.clone()).unwrap();
    if engine == Engine::Sqlite {
        assert!(
            text.ends_with(
                r#"[19999]],"error":{"code":"SQL_ERROR","message":"integer overflow"}}"#
            ),
            "{}",
            &text[text.len() - 200..]
        );
    }
    let json = reply.json();
    let mut keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_by_key(|key| text.find(&format!("\"{key}\":")).unwrap());
    assert_eq!(
        keys,
        ["columns", "rows", "error"],
        "no rows_affected, no last_insert_id"
    );
    assert_eq!(json["error"]["code"], "SQL_ERROR", "{}", json["error"]);
    let message = engine.pick("integer overflow", "division by zero");
    assert!(
        json["error"]["message"].as_str().unwrap().contains(message),
        "{json:?}",
    );
    // Every row SQLite made before the error; on PostgreSQL, the rows sent before it.
    let rows = json["rows"].as_array().unwrap().len();
    match engine {
        Engine::Sqlite => assert_eq!(rows, 19_999),
        Engine::Postgres => assert!(rows > 0 && rows < 20_000, "{rows}"),
    }
}

#[tokio::test]
async fn an_error_before_the_first_chunk_is_an_ordinary_error_response() {
    let router = memory_app();
    let reply = sql(
        &router,
        "SELECT CASE WHEN x < 3 THEN x ELSE abs(-9223372036854775807 - 1) END FROM \
         (SELECT 1 AS x UNION ALL SELECT 2 UNION ALL SELECT 3)",
        json!([]),
    )
    .await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.code(), "SQL_ERROR");
}

#[tokio::test]
async fn a_statement_timeout_mid_stream_is_signalled_in_the_body() {
    let router = app_with(&Config {
        limits: Limits {
            statement_timeout: Duration::from_millis(200),
            ..Limits::default()
        },
        ..Config::default()
    });
    let reply = sql(&router, ENDLESS, json!([])).await;
    assert_eq!(reply.status, 200);
    let json = reply.json();
    assert_eq!(
        json["error"]["code"], "STATEMENT_TIMEOUT",
        "{}",
        json["error"]
    );
    assert!(json.get("rows_affected").is_none());
    assert!(!json["rows"].as_array().unwrap().is_empty());
}

async fn a_client_gone_mid_stream_frees_the_connection(engine: Engine) {
    // One connection serves every read: a reader on SQLite, the writer alone on PostgreSQL.
    let router = engine_app!(engine, |config| {
        config.limits.read_connections = 1;
        config.limits.pool_size = 1;
    });
    // Rows that stream until the client goes.
    let endless = engine.pick(ENDLESS, ENDLESS_ON_POSTGRES);
    for read_first in [true, false] {
        // The client goes away: the body is dropped mid-stream.
        abandon_mid_stream(&router, &json!({ "sql": endless }), read_first).await;
        // The only connection is free again long before the 30 s statement timeout.
        let quick = tokio::time::timeout(
            Duration::from_secs(5),
            sql(&router, "SELECT 1 AS one", json!([])),
        )
        .await
        .expect("the reader was released");
        assert_eq!(quick.json()["rows"], json!([[1]]));
    }
}

#[tokio::test]
async fn large_bodies_are_compressed_on_request_and_small_ones_are_not() {
    let router = memory_app();
    for (encoding, expected) in [
        ("gzip", Some("gzip")),
        ("zstd", Some("zstd")),
        ("identity", None),
    ] {
        let reply = post_with(
            &router,
            &[("accept-encoding", encoding)],
            &json!({ "sql": counted(20_000) }),
        )
        .await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("content-encoding"), expected, "{encoding}");
        if expected.is_some() {
            assert!(reply.body.len() < 100_000, "{} bytes", reply.body.len());
        }
    }
    let small = post_with(
        &router,
        &[("accept-encoding", "gzip")],
        &json!({ "sql": "SELECT 1" }),
    )
    .await;
    assert_eq!(small.header("content-encoding"), None);
    assert_eq!(small.json()["rows"], json!([[1]]));
}

#[tokio::test]
async fn blobs_travel_as_base64_both_ways() {
    let router = memory_app();
    let reply = sql(
        &router,
        "SELECT ?, length(?), x''",
        json!([{"base64": "AP8Q"}, {"base64": ""}]),
    )
    .await;
    assert_eq!(
        reply.json()["rows"],
        json!([[{"base64": "AP8Q"}, 0, {"base64": ""}]])
    );
    let bad = sql(&router, "SELECT ?", json!([{"base64": "not base64!"}])).await;
    assert_eq!((bad.status, bad.code().as_str()), (400, "BAD_REQUEST"));
}
