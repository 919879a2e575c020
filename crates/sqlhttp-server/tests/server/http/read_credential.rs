//! A credential that may only read, refused the same way on every route that could write
//! (ADR 0057): `/api/v1/sql` (with and without an Idempotency-Key), `/api/v1/batch`,
//! `/api/v1/describe/statement` and `/api/v1/transaction/{open, statement}` each answer a
//! request that would write `403 READ_ONLY` with an error body, and nothing is written; the
//! same requests from a writer's credential run, so the refusal is the credential's.

use axum::Router;
use serde_json::{Value, json};
use sqlhttp_server::Config;

use crate::common::{Reply, app_with, send};

const WRITER: &str = "writer-token";
const READER: &str = "reader-token";

async fn post(
    router: &Router,
    path: &str,
    token: &str,
    extra: &[(&str, &str)],
    body: &Value,
) -> Reply {
    let authorization = format!("Bearer {token}");
    let mut headers = vec![
        ("content-type", "application/json"),
        ("authorization", authorization.as_str()),
    ];
    headers.extend_from_slice(extra);
    send(router, "POST", path, &headers, body.to_string()).await
}

async fn count(router: &Router) -> Value {
    let counted = post(
        router,
        "/api/v1/sql",
        READER,
        &[],
        &json!({ "sql": "SELECT count(*) FROM t" }),
    )
    .await;
    assert_eq!(
        counted.status,
        200,
        "{}",
        String::from_utf8_lossy(&counted.body)
    );
    counted.json()["rows"][0][0].clone()
}

/// A request that would write: the route's name, its path, extra headers and the body.
type Write = (
    &'static str,
    &'static str,
    Vec<(&'static str, &'static str)>,
    Value,
);

/// The requests that would write, one per route.
fn writes(read_only_tx: &str) -> Vec<Write> {
    vec![
        (
            "sql",
            "/api/v1/sql",
            vec![],
            json!({ "sql": "INSERT INTO t VALUES (2)" }),
        ),
        (
            "keyed sql",
            "/api/v1/sql",
            vec![("idempotency-key", "read-credential-key")],
            json!({ "sql": "INSERT INTO t VALUES (3)" }),
        ),
        (
            "batch",
            "/api/v1/batch",
            vec![],
            json!({ "statements": [{ "sql": "SELECT 1" }, { "sql": "DELETE FROM t" }] }),
        ),
        (
            "describe statement",
            "/api/v1/describe/statement",
            vec![],
            json!({ "sql": "DELETE FROM t" }),
        ),
        (
            "transaction open",
            "/api/v1/transaction/open",
            vec![],
            json!({}),
        ),
        (
            "transaction statement",
            "/api/v1/transaction/statement",
            vec![],
            json!({ "transaction": read_only_tx, "seq": 1, "sql": "DELETE FROM t" }),
        ),
    ]
}

#[tokio::test]
async fn a_read_credential_is_refused_the_same_way_on_every_route() {
    let router = app_with(&Config {
        tokens: vec![WRITER.into()],
        read_tokens: vec![READER.into()],
        ..Config::default()
    });
    let created = post(
        &router,
        "/api/v1/batch",
        WRITER,
        &[],
        &json!({ "statements": [
            { "sql": "CREATE TABLE t (x INTEGER)" },
            { "sql": "INSERT INTO t VALUES (1)" },
        ] }),
    )
    .await;
    assert_eq!(created.status, 200);
    let opened = post(
        &router,
        "/api/v1/transaction/open",
        READER,
        &[],
        &json!({ "read_only": true }),
    )
    .await;
    assert_eq!(
        opened.status,
        200,
        "{}",
        String::from_utf8_lossy(&opened.body)
    );
    let token = opened.json()["transaction"].as_str().unwrap().to_owned();

    for (route, path, headers, body) in writes(&token) {
        let refused = post(&router, path, READER, &headers, &body).await;
        assert_eq!(
            (refused.status, refused.code().as_str()),
            (403, "READ_ONLY"),
            "{route}: {}",
            String::from_utf8_lossy(&refused.body)
        );
        assert_eq!(count(&router).await, json!(1), "{route} wrote nothing");
    }

    // The same requests from the writer run (the refusal above was the credential's): the
    // writes add rows 2 and 3, the batch deletes them all; the writer's transaction is opened
    // last, since on SQLite it may hold the one writer the count reads on.
    let mut statuses = Vec::new();
    for (route, path, headers, body) in writes("") {
        if route.starts_with("transaction") {
            continue;
        }
        let ran = post(&router, path, WRITER, &headers, &body).await;
        statuses.push((route, ran.status));
    }
    assert_eq!(
        statuses,
        [
            ("sql", 200),
            ("keyed sql", 200),
            ("batch", 200),
            ("describe statement", 200),
        ]
    );
    assert_eq!(count(&router).await, json!(0));
    let opened = post(&router, "/api/v1/transaction/open", WRITER, &[], &json!({})).await;
    assert_eq!(opened.status, 200);
}
