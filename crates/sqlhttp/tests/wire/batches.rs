//! Batches against wiremock: the request's exact shape on `/api/v1/batch`, the classes (a write batch
//! retried only under `retry_writes`, with one key; a read-only batch retried by default, without
//! one), the failing statement's index, checks made before sending, and `insert(..).atomic(true)`.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlhttp::ErrorKind;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::*;

const BATCH: &str = "/api/v1/batch";

fn results(results: &Value) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({ "results": results }))
}

fn effect(rows_affected: u64) -> Value {
    json!({"columns": [], "rows": [], "rows_affected": rows_affected, "last_insert_id": null})
}

async fn mount(server: &MockServer, route: &str, response: ResponseTemplate, times: Option<u64>) {
    let mock = Mock::given(method("POST"))
        .and(path(route))
        .respond_with(response);
    match times {
        Some(times) => mock.up_to_n_times(times).mount(server).await,
        None => mock.mount(server).await,
    }
}

async fn bodies(server: &MockServer) -> Vec<(String, Value)> {
    server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| {
            (
                r.url.path().to_owned(),
                serde_json::from_slice(&r.body).unwrap(),
            )
        })
        .collect()
}

#[derive(Debug, PartialEq, Deserialize)]
struct Account {
    id: i64,
    balance: i64,
}

#[tokio::test(start_paused = true)]
async fn a_batch_sends_its_statements_in_order_and_gets_one_table_each() {
    let server = server().await;
    mount(
        &server,
        BATCH,
        results(&json!([
            effect(1),
            effect(1),
            rows_body(&["id", "balance"], &json!([[1, 75], [2, 25]]))
        ])),
        None,
    )
    .await;
    let client = builder(&server).build().unwrap();
    let tables = client
        .batch()
        .statement("UPDATE accounts SET balance = balance - ? WHERE id = ?")
        .bind(25)
        .bind(1)
        .statement("UPDATE accounts SET balance = balance + ? WHERE id = ?")
        .bind(25)
        .bind(2)
        .statement("SELECT id, balance FROM accounts ORDER BY id")
        .idempotency_key("transfer-1")
        .await
        .unwrap();
    assert_eq!(tables.len(), 3);
    assert_eq!(tables[0].rows_affected(), 1);
    assert_eq!(
        tables[2].rows_as::<Account>().unwrap(),
        [
            Account { id: 1, balance: 75 },
            Account { id: 2, balance: 25 }
        ]
    );
    assert_eq!(
        tables[2].rows_as::<(i64, i64)>().unwrap(),
        [(1, 75), (2, 25)]
    );

    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.url.path(), BATCH);
    assert_eq!(request.headers["content-type"], "application/json");
    assert_eq!(request.headers["idempotency-key"], "transfer-1");
    assert_eq!(
        String::from_utf8(request.body.clone()).unwrap(),
        concat!(
            r#"{"statements":["#,
            r#"{"sql":"UPDATE accounts SET balance = balance - ? WHERE id = ?","params":[25,1]},"#,
            r#"{"sql":"UPDATE accounts SET balance = balance + ? WHERE id = ?","params":[25,2]},"#,
            r#"{"sql":"SELECT id, balance FROM accounts ORDER BY id"}"#,
            r#"],"read_only":false}"#
        )
    );
}

#[tokio::test(start_paused = true)]
async fn a_write_batch_is_one_attempt_unless_retry_writes() {
    let server = server().await;
    mount(&server, BATCH, error(503, "UNAVAILABLE", "busy"), None).await;
    let client = client_with(&server, quick(3));
    let err = client.batch().statement("DELETE FROM t").await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable { .. }),
        "{err:?}"
    );
    assert_eq!((err.attempts(), hits(&server).await), (1, 1));
    assert!(
        err.idempotency_key().is_some(),
        "a write batch carries a key"
    );
}

#[tokio::test(start_paused = true)]
async fn a_write_batch_under_retry_writes_sends_one_key_on_every_attempt() {
    let server = server().await;
    mount(&server, BATCH, error(503, "UNAVAILABLE", "busy"), Some(2)).await;
    mount(&server, BATCH, results(&json!([effect(1)])), None).await;
    let client = builder(&server)
        .retry(quick(3))
        .retry_writes(true)
        .build()
        .unwrap();
    let tables = client.batch().statement("DELETE FROM t").await.unwrap();
    assert_eq!(tables[0].rows_affected(), 1);
    let keys = header_values(&server, "idempotency-key").await;
    assert_eq!(keys.len(), 3);
    assert!(
        !keys[0].is_empty() && keys.iter().all(|k| *k == keys[0]),
        "{keys:?}"
    );
    assert_eq!(attempt_headers(&server).await, ["1/3", "2/3", "3/3"]);

    // Per call, too.
    let server = crate::support::server().await;
    mount(&server, BATCH, error(503, "UNAVAILABLE", "busy"), Some(1)).await;
    mount(&server, BATCH, results(&json!([effect(1)])), None).await;
    let client = client_with(&server, quick(3));
    client
        .batch()
        .statement("DELETE FROM t")
        .retry_writes(true)
        .idempotency_key("mine")
        .await
        .unwrap();
    assert_eq!(
        header_values(&server, "idempotency-key").await,
        ["mine", "mine"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_read_only_batch_is_a_read_retried_without_a_key() {
    let server = server().await;
    mount(&server, BATCH, error(503, "UNAVAILABLE", "busy"), Some(1)).await;
    mount(
        &server,
        BATCH,
        results(&json!([rows_body(&["n"], &json!([[3]]))])),
        None,
    )
    .await;
    let client = client_with(&server, quick(3));
    let tables = client
        .batch()
        .statement("SELECT count(*) AS n FROM t")
        .read_only(true)
        .await
        .unwrap();
    assert_eq!(tables[0].rows_as::<i64>().unwrap(), [3]);
    assert_eq!(header_values(&server, "idempotency-key").await, ["", ""]);
    let sent = bodies(&server).await;
    assert_eq!(sent[0].1["read_only"], true);

    let err = client
        .batch()
        .statement("SELECT 1")
        .read_only(true)
        .idempotency_key("k")
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Config { .. }), "{err:?}");
    assert_eq!(hits(&server).await, 2, "nothing more was sent");
}

#[tokio::test(start_paused = true)]
async fn the_error_names_the_failing_statement() {
    let server = server().await;
    let body = json!({"error": {
        "code": "CONSTRAINT_VIOLATION", "message": "CHECK constraint failed: balance >= 0",
        "constraint": "check", "statement": 1,
    }});
    mount(
        &server,
        BATCH,
        ResponseTemplate::new(409).set_body_json(body),
        None,
    )
    .await;
    let client = builder(&server).retry_writes(true).build().unwrap();
    let err = client
        .batch()
        .statement("UPDATE a SET balance = balance + 5 WHERE id = 2")
        .statement("UPDATE a SET balance = balance - 5 WHERE id = 1")
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::ConstraintViolation { .. }),
        "{err:?}"
    );
    assert_eq!(err.statement_index(), Some(1));
    assert_eq!(err.attempts(), 1, "final: not retried");
    assert!(
        err.to_string().contains("statement 1 of the batch"),
        "{err}"
    );

    mount(&server, "/api/v1/sql", error(400, "SQL_ERROR", "bad"), None).await;
    let err = client.execute("SELEC 1").await.unwrap_err();
    assert_eq!(err.statement_index(), None);
}

#[tokio::test(start_paused = true)]
async fn what_cannot_be_sent_fails_before_sending() {
    let server = server().await;
    let client = builder(&server)
        .batch_max_statements(2)
        .batch_max_bytes(200)
        .build()
        .unwrap();

    let err = client
        .batch()
        .bind(1)
        .statement("SELECT ?")
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::InvalidParameter { .. }),
        "{err:?}"
    );

    let err = client
        .batch()
        .statement("SELECT ?")
        .bind(1)
        .statement("SELECT ?")
        .bind(vec![1, 2])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.kind(),
            ErrorKind::InvalidParameter { index: Some(0), .. }
        ),
        "{err:?}"
    );
    assert_eq!(err.statement_index(), Some(1));

    let err = client
        .batch()
        .statement("SELECT 1")
        .statement("SELECT 2")
        .statement("SELECT 3")
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::PayloadTooLarge { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("batch_max_statements"), "{err}");
    let long = format!("SELECT '{}'", "x".repeat(200));
    let err = client.batch().statement(long).await.unwrap_err();
    assert!(err.to_string().contains("batch_max_bytes"), "{err}");

    assert!(
        client.batch().await.unwrap().is_empty(),
        "an empty batch sends nothing"
    );
    assert_eq!(hits(&server).await, 0);
}

#[derive(Serialize)]
struct Reading {
    id: i64,
    value: f64,
}

fn readings(n: i64) -> Vec<Reading> {
    (0..n)
        .map(|id| Reading {
            id,
            value: id as f64 / 2.0,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn an_atomic_insert_sends_its_statements_as_one_batch_under_the_call_key() {
    let server = server().await;
    mount(
        &server,
        BATCH,
        results(&json!([effect(2), effect(2), effect(1)])),
        None,
    )
    .await;
    let client = builder(&server).insert_max_params(4).build().unwrap();
    let inserted = client
        .insert("readings", &readings(5))
        .atomic(true)
        .idempotency_key("import-7")
        .await
        .unwrap();
    assert_eq!(inserted, 5);
    let sent = bodies(&server).await;
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, BATCH);
    let statements = sent[0].1["statements"].as_array().unwrap();
    assert_eq!(statements.len(), 3);
    assert_eq!(
        statements[0]["sql"],
        r#"INSERT INTO "readings" ("id", "value") VALUES (?, ?), (?, ?)"#
    );
    assert_eq!(statements[2]["params"], json!([4, 2.0]));
    assert_eq!(
        header_values(&server, "idempotency-key").await,
        ["import-7"]
    );

    // One statement is atomic already: it goes to the statement endpoint.
    mount(&server, "/api/v1/sql", ok_effect(1, Some(1)), None).await;
    assert_eq!(
        client
            .insert("readings", &readings(1))
            .atomic(true)
            .await
            .unwrap(),
        1
    );
    assert_eq!(bodies(&server).await[1].0, "/api/v1/sql");
}

#[tokio::test(start_paused = true)]
async fn an_atomic_insert_that_does_not_fit_a_batch_says_so_before_sending() {
    let server = server().await;
    let client = builder(&server)
        .insert_max_params(2)
        .batch_max_statements(3)
        .build()
        .unwrap();
    let err = client
        .insert("readings", &readings(4))
        .atomic(true)
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::PayloadTooLarge { .. }),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(message.contains("4 rows takes 4 statements"), "{message}");
    assert!(message.contains("without .atomic(true)"), "{message}");
    assert_eq!(
        (err.attempts(), err.status(), err.is_sent()),
        (0, None, false)
    );
    assert_eq!(hits(&server).await, 0);

    // A failed atomic insert names the statement and counts no rows as inserted.
    let body =
        json!({"error": {"code": "CONSTRAINT_VIOLATION", "message": "UNIQUE", "statement": 1}});
    mount(
        &server,
        BATCH,
        ResponseTemplate::new(409).set_body_json(body),
        None,
    )
    .await;
    let err = client
        .insert("readings", &readings(3))
        .atomic(true)
        .await
        .unwrap_err();
    assert_eq!(
        (err.statement_index(), err.rows_inserted()),
        (Some(1), None)
    );
}

#[tokio::test(start_paused = true)]
async fn a_result_count_other_than_the_statements_is_a_decode_error() {
    let server = server().await;
    mount(&server, BATCH, results(&json!([effect(1)])), None).await;
    let client = builder(&server).build().unwrap();
    let err = client
        .batch()
        .statement("SELECT 1")
        .statement("SELECT 2")
        .read_only(true)
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Decode { .. }), "{err:?}");
    assert_eq!(err.attempts(), 1);
}
