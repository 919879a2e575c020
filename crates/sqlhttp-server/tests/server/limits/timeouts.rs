//! The statement timeout and shutdown, on both engines (see [`crate::engines`]): a statement
//! that runs past the timeout answers `422 STATEMENT_TIMEOUT` naming the limit, and the server
//! answers on; a shutdown stops the statements still running and ends. The timeout mid-stream is
//! `sql/streaming.rs`; what a client's function does to PostgreSQL's own guard is `limits/pg_timeouts.rs`.

use std::time::Duration;

use serde_json::json;

use crate::common::{http_client, ok, serve, sql};
use crate::engines::{Engine, engine_app, on_both_engines};

on_both_engines!(
    a_statement_past_the_timeout_answers_422_naming_it,
    shutdown_stops_running_statements_and_ends,
);

/// A statement that runs until it is stopped, and answers no row before: a count of an endless
/// recursive query on SQLite, a sleep on PostgreSQL.
fn runs_long(engine: Engine, seconds: u32) -> String {
    engine.pick(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
            .to_owned(),
        format!("SELECT pg_sleep({seconds})"),
    )
}

async fn a_statement_past_the_timeout_answers_422_naming_it(engine: Engine) {
    let router = engine_app!(engine, |config| {
        config.limits.statement_timeout = Duration::from_millis(300);
    });
    let slow = sql(&router, &runs_long(engine, 5), json!([])).await;
    assert_eq!(slow.status, 422);
    assert_eq!(slow.code(), "STATEMENT_TIMEOUT");
    assert!(
        slow.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("300 ms")
    );
    ok(&router, "SELECT 1", json!([])).await;
}

async fn shutdown_stops_running_statements_and_ends(engine: Engine) {
    let Some(config) = engine.config().await else {
        return;
    };
    let handle = serve(config).await;
    let endpoint = format!("{}/api/v1/sql", handle.url());
    let body = json!({ "sql": runs_long(engine, 30) }).to_string();
    let slow = tokio::spawn(async move {
        http_client()
            .post(endpoint)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map(|response| response.status().as_u16())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::time::timeout(Duration::from_secs(10), handle.shutdown())
        .await
        .expect("shutdown ends well before the statement would have");
    // The request was answered 503, or its connection cut; never left hanging.
    if let Ok(status) = slow.await.unwrap() {
        assert_eq!(status, 503);
    }
}
