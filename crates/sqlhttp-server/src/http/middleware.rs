//! Cross-cutting HTTP layers: the per-request log line and the panic-to-500 conversion.
//!
//! Knows request/response metadata only: never bodies, SQL parameters or tokens.

use std::any::Any;
use std::time::Instant;

use axum::body::Body;
use axum::extract::Request;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::api_error::ApiError;
use crate::http::{ATTEMPT, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};

/// Longest `Sqlhttp-Attempt` value copied into the log.
const MAX_LOGGED_ATTEMPT: usize = 32;

fn attempt(headers: &HeaderMap) -> String {
    headers
        .get(ATTEMPT)
        .and_then(|v| v.to_str().ok())
        .map_or_else(
            || "-".to_owned(),
            |v| v.chars().take(MAX_LOGGED_ATTEMPT).collect(),
        )
}

/// Logs one line per request at info: method, path, status, latency, `Sqlhttp-Attempt`, and
/// whether an Idempotency-Key was sent and replayed.
pub(crate) async fn log_requests(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let attempt = attempt(request.headers());
    let keyed = request.headers().contains_key(IDEMPOTENCY_KEY);
    let response = next.run(request).await;
    let replayed = response.headers().contains_key(IDEMPOTENT_REPLAYED);
    tracing::info!(
        %method,
        %path,
        status = response.status().as_u16(),
        latency_ms = started.elapsed().as_secs_f64() * 1000.0,
        %attempt,
        idempotency_key = keyed,
        replayed,
        "request"
    );
    response
}

/// The response for a panic anywhere in request handling: `500 INTERNAL`, details only in the
/// server log.
pub(crate) fn panic_response(panic: Box<dyn Any + Send + 'static>) -> Response<Body> {
    tracing::error!(
        panic = crate::panic_message(panic.as_ref()),
        "panic while handling a request"
    );
    ApiError::internal().into_response()
}
