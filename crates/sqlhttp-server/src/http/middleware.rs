//! Cross-cutting HTTP layers: the request id, the request's span (continuing its caller's trace,
//! see `trace`) and the one structured log line per request in it (which also feeds the
//! metrics), `Server-Timing` and `Sqlhttp-Engine`, and the panic-to-500 conversion.
//!
//! Knows request/response metadata only: never bodies, SQL parameters or tokens. The log line's
//! `credential` is a label (`token#1`, `read#2`, `anonymous`), never a token.

use std::any::Any;
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use axum::body::{Body, HttpBody as _};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::Instrument as _;

use crate::http::credentials::Label;
use crate::http::metrics::Observation;
use crate::http::request_id::{RequestId, X_REQUEST_ID};
use crate::http::rows::Rows;
use crate::http::trace;
use crate::http::{ATTEMPT, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use crate::protocol::error::{ApiError, ErrorCode};
use crate::state::AppState;
use crate::timing::Timing;

/// Longest `Sqlhttp-Attempt` value copied into the log.
const MAX_LOGGED_ATTEMPT: usize = 32;

/// What the request's log line says of the request itself, copied before the request is
/// handed on.
struct Seen {
    method: Method,
    path: String,
    client: Option<IpAddr>,
    /// `Sqlhttp-Attempt`, at most [`MAX_LOGGED_ATTEMPT`] characters of it, or `-`.
    attempt: String,
    /// Whether it carried an Idempotency-Key.
    keyed: bool,
}

impl Seen {
    fn of(request: &Request) -> Seen {
        let headers = request.headers();
        Seen {
            method: request.method().clone(),
            path: request.uri().path().to_owned(),
            client: request
                .extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .map(|info| info.0.ip()),
            attempt: headers
                .get(ATTEMPT)
                .and_then(|v| v.to_str().ok())
                .map_or_else(
                    || "-".to_owned(),
                    |v| v.chars().take(MAX_LOGGED_ATTEMPT).collect(),
                ),
            keyed: headers.contains_key(IDEMPOTENCY_KEY),
        }
    }
}

/// Gives the request its id (kept in its extensions, a span and the response's `X-Request-Id`)
/// and its span (`request`, a child of the caller's when it sent W3C Trace Context), and logs
/// one line at info in that span when it is answered: id, method, path, client address,
/// credential label, `Sqlhttp-Attempt`, status, duration, rows, response bytes, whether an
/// Idempotency-Key was sent and replayed, the trace and span ids. Counts the request in the
/// metrics. A success of `/api/` says what it cost in `Server-Timing`; every answer names its
/// engine in `Sqlhttp-Engine`.
pub(crate) async fn log_requests(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let id = RequestId::from_client_or_new(request.headers());
    request.extensions_mut().insert(id.clone());
    let endpoint = super::endpoint(request.uri().path());
    let api = request
        .uri()
        .path()
        .starts_with(sqlhttp_protocol::path::API_PREFIX);
    let span = tracing::info_span!("request", id = id.as_str());
    // Before the span is first entered: OpenTelemetry starts its span there, after which it
    // takes no parent.
    let caller = trace::continue_trace(&span, request.headers());
    // What only the log line reads is copied out of the request only when the line is on (at
    // `warn` a read pays nothing for it), asked in the span the line is written in, so a
    // filter scoped to the span (`[request]=info`) answers for both alike.
    let seen = span
        .in_scope(|| tracing::enabled!(tracing::Level::INFO))
        .then(|| Seen::of(&request));
    let timing = Timing::default();
    let mut response = timing
        .clone()
        .scope(next.run(request))
        .instrument(span.clone())
        .await;
    let elapsed = started.elapsed();
    let headers = response.headers_mut();
    headers.insert(X_REQUEST_ID, id.header_value());
    headers.insert(trace::ENGINE, trace::engine(&state.inner.engine));
    if api && response.status().is_success() {
        let (queue, db) = timing.figures();
        let value = trace::server_timing(queue, db, elapsed);
        response.headers_mut().insert(trace::SERVER_TIMING, value);
    }
    if !span.is_disabled() {
        response = response.map(|body| Body::new(trace::Traced::new(body, &span)));
    }

    let status = response.status().as_u16();
    let replayed = response.headers().contains_key(IDEMPOTENT_REPLAYED);
    let code = response.extensions().get::<ErrorCode>().copied();
    state.inner.metrics.observe(Observation {
        endpoint,
        status,
        elapsed,
        replayed,
        statement_timeout: code == Some(ErrorCode::StatementTimeout),
    });
    let Some(seen) = seen else {
        return response;
    };
    let credential = response.extensions().get::<Label>().copied();
    let rows = response.extensions().get::<Rows>().map(|rows| rows.0);
    let bytes = response.body().size_hint().exact();
    let ids = trace::ids(&span, caller.as_ref());
    let _in_request = span.enter();
    tracing::info!(
        request_id = id.as_str(),
        method = %seen.method,
        // Quoted (and escaped): the path and the attempt header are the client's words.
        path = ?seen.path,
        client = seen.client.map(tracing::field::display),
        credential = %credential.map_or_else(|| "-".to_owned(), |label| label.to_string()),
        attempt = ?seen.attempt,
        status,
        code = code.map(ErrorCode::as_str),
        // Whole microseconds: a float's digits (0.6394350000000001) say nothing more.
        duration_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
        rows,
        bytes,
        idempotency_key = seen.keyed,
        replayed,
        trace_id = ids.as_ref().map(|(trace, _)| trace.as_str()),
        span_id = ids.as_ref().map(|(_, span)| span.as_str()),
        "request"
    );
    response
}

/// The response for a panic anywhere in request handling: `500 INTERNAL`, details only in the
/// server log.
#[allow(
    clippy::needless_pass_by_value,
    reason = "tower-http's `CatchPanicLayer::custom` hands the panic over by value"
)]
pub(crate) fn panic_response(panic: Box<dyn Any + Send + 'static>) -> Response<Body> {
    tracing::error!(
        panic = crate::panic_message(panic.as_ref()),
        "panic while handling a request"
    );
    ApiError::internal().into_response()
}
