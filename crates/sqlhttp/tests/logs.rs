//! What the SDK logs: one span per call and one event per retry; the statement's text only at
//! debug level and only with `trace_query_text(true)` (the call span's `db.query.summary`, the
//! operation and its table, at info); parameters and the bearer token never.
//!
//! A binary of its own with a single test: tracing caches per-callsite interest process-wide, and
//! a callsite first reached by a test with no subscriber could stay disabled for one with a scoped
//! subscriber running beside it.

#[path = "wire/support.rs"]
#[allow(dead_code)]
mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde_json::json;
use tracing_subscriber::fmt::MakeWriter;

use support::*;

/// A log sink the test can read back.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

/// Runs a read that is retried once, with a token and a bound parameter, logging at `level`, the
/// statement's text opted in or not.
async fn logged_call(level: tracing::Level, query_text: bool) -> String {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .with_writer(captured.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = server().await;
    respond_times(&server, error(503, "UNAVAILABLE", "busy"), 1).await;
    respond_always(&server, ok_rows(&["n"], &json!([[1]]))).await;
    let client = builder(&server)
        .bearer_token("tok-do-not-log")
        .trace_query_text(query_text)
        .build()
        .unwrap();
    let rows: Vec<i64> = client
        .query("SELECT n FROM secrets_table WHERE v = ?")
        .bind("param-do-not-log")
        .fetch_all()
        .await
        .unwrap();
    assert_eq!(rows, vec![1]);
    captured.text()
}

/// Runs a `transact` whose first COMMIT is refused `TRANSACTION_ABORTED` (lost before it
/// committed), so it runs again, logging at debug.
async fn logged_transact() -> String {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, ResponseTemplate};
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(captured.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = server().await;
    let on = |route: &'static str, response: ResponseTemplate, times: Option<u64>| {
        let mock = Mock::given(method("POST"))
            .and(path(route))
            .respond_with(response);
        match times {
            Some(times) => mock.up_to_n_times(times),
            None => mock,
        }
    };
    on(
        "/api/v1/transaction/open",
        ResponseTemplate::new(200).set_body_json(json!({"transaction": "tx1"})),
        None,
    )
    .mount(&server)
    .await;
    on(
        "/api/v1/transaction/commit",
        error(409, "TRANSACTION_ABORTED", "could not serialize"),
        Some(1),
    )
    .mount(&server)
    .await;
    on(
        "/api/v1/transaction/commit",
        ResponseTemplate::new(200).set_body_json(json!({"outcome": "committed"})),
        None,
    )
    .mount(&server)
    .await;
    let client = builder(&server).build().unwrap();
    client.transact(|_tx| async { Ok(()) }).await.unwrap();
    captured.text()
}

#[tokio::test(start_paused = true)]
async fn one_span_per_call_one_event_per_retry_no_secrets() {
    let logs = logged_call(tracing::Level::INFO, false).await;
    let retry = logs
        .lines()
        .find(|line| line.contains("retrying"))
        .unwrap_or_else(|| panic!("no retry event in:\n{logs}"));
    assert!(retry.contains("sqlhttp.call"), "{retry}");
    assert!(retry.contains(r#"op="read""#), "{retry}");
    assert!(retry.contains("attempt=1"), "{retry}");
    assert!(retry.contains("reason=503"), "{retry}");
    assert!(retry.contains("delay_ms="), "{retry}");
    assert_eq!(logs.matches("retrying").count(), 1, "{logs}");

    // The span names the operation and its table by the database conventions; the statement's
    // text is not at info.
    assert!(
        retry.contains(r#"db.query.summary="SELECT secrets_table""#),
        "{retry}"
    );
    let info = logs;
    assert!(!info.contains("WHERE v"), "SQL text at info:\n{info}");
    assert!(!info.contains("db.query.text"), "SQL text at info:\n{info}");
    let trace = logged_call(tracing::Level::TRACE, true).await;
    assert!(
        trace.contains("SELECT n FROM secrets_table WHERE v = ?"),
        "SQL text at debug when opted in:\n{trace}"
    );
    let unopted = logged_call(tracing::Level::TRACE, false).await;
    assert!(
        !unopted.contains("WHERE v") && unopted.contains("sending statement"),
        "SQL text at debug without trace_query_text:\n{unopted}"
    );
    // A transaction's steps run in its span; `transact`'s second run is marked a re-run.
    let transact = logged_transact().await;
    let commits: Vec<&str> = transact
        .lines()
        .filter(|line| line.contains("sending statement") && line.contains(r#"otel.name="COMMIT""#))
        .collect();
    assert_eq!(commits.len(), 2, "{transact}");
    assert!(
        commits[0].contains("sqlhttp.transaction{") && commits[0].contains("run=1 rerun=false"),
        "{}",
        commits[0]
    );
    assert!(
        commits[1].contains("run=2 rerun=true") && commits[1].contains("sqlhttp.call{"),
        "{}",
        commits[1]
    );
    for logs in [&info, &trace, &unopted] {
        assert!(
            !logs.contains("param-do-not-log"),
            "a parameter was logged:\n{logs}"
        );
        assert!(
            !logs.contains("tok-do-not-log"),
            "the token was logged:\n{logs}"
        );
    }
}
