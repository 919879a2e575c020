//! Shared helpers: response bodies of protocol v1 and client builders suited to the tests.

use std::time::Duration;

use serde_json::{Value, json};
use sqlhttp::{Client, ClientBuilder, RetryPolicy};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// A mock server of this test's own. Pooled servers (`MockServer::start`) are reused across tests,
/// and a request a test abandoned mid-flight (a timeout on the paused clock) could land on the next
/// test's server and break its counts.
pub(crate) async fn server() -> MockServer {
    MockServer::builder().start().await
}

/// A success body with the given columns (all typed `""`) and rows.
pub(crate) fn rows_body(columns: &[&str], rows: &Value) -> Value {
    json!({
        "columns": columns.iter().map(|c| json!({"name": c, "type": ""})).collect::<Vec<_>>(),
        "rows": rows,
        "rows_affected": 0,
        "last_insert_id": null,
    })
}

/// A success response carrying rows.
pub(crate) fn ok_rows(columns: &[&str], rows: &Value) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(rows_body(columns, rows))
}

/// A success response for a statement without a result set.
pub(crate) fn ok_effect(rows_affected: u64, last_insert_id: Option<i64>) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "columns": [], "rows": [], "rows_affected": rows_affected, "last_insert_id": last_insert_id,
    }))
}

/// A protocol error response.
pub(crate) fn error(status: u16, code: &str, message: &str) -> ResponseTemplate {
    ResponseTemplate::new(status)
        .set_body_json(json!({"error": {"code": code, "message": message}}))
}

/// Mounts `response` for the next `times` requests to the endpoint (in mount order).
pub(crate) async fn respond_times(server: &MockServer, response: ResponseTemplate, times: u64) {
    Mock::given(method("POST"))
        .and(path("/api/v1/sql"))
        .respond_with(response)
        .up_to_n_times(times)
        .mount(server)
        .await;
}

/// Mounts `response` for every further request.
pub(crate) async fn respond_always(server: &MockServer, response: ResponseTemplate) {
    Mock::given(method("POST"))
        .and(path("/api/v1/sql"))
        .respond_with(response)
        .mount(server)
        .await;
}

/// A reqwest client without pooling, retries or redirects: no idle-connection timer runs beside the SDK's.
pub(crate) fn plain_http() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .retry(reqwest::retry::never())
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// A builder for `server`: seeded jitter, no per-attempt timeout, no pooling.
pub(crate) fn builder(server: &MockServer) -> ClientBuilder {
    Client::builder(server.uri())
        .http_client(plain_http())
        .timeout(None)
        .retry(RetryPolicy::new().with_jitter_seed(7))
}

/// A built client for `server` with the given retry policy (seeded).
pub(crate) fn client_with(server: &MockServer, policy: RetryPolicy) -> Client {
    builder(server)
        .retry(policy.with_jitter_seed(7))
        .build()
        .unwrap()
}

/// How many requests reached `server`.
pub(crate) async fn hits(server: &MockServer) -> usize {
    server.received_requests().await.unwrap().len()
}

/// The `Sqlhttp-Attempt` header of every request `server` received.
pub(crate) async fn attempt_headers(server: &MockServer) -> Vec<String> {
    header_values(server, "sqlhttp-attempt").await
}

/// The values of header `name` on every request `server` received (empty string when absent).
pub(crate) async fn header_values(server: &MockServer, name: &str) -> Vec<String> {
    server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| {
            r.headers
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default()
        })
        .collect()
}

/// A policy whose backoff never exceeds `max` (for fast real-time tests).
pub(crate) fn quick(max_attempts: u32) -> RetryPolicy {
    RetryPolicy::new()
        .with_max_attempts(max_attempts)
        .with_initial_backoff(Duration::from_millis(1))
        .with_max_backoff(Duration::from_millis(5))
}
