//! The browser policy: a request that carries an `Origin` the operator did not list is refused
//! with `403 ORIGIN_NOT_ALLOWED`, so a web page cannot post SQL to a server on a developer's
//! machine; listed origins get CORS answers (preflight, exposed headers).
//!
//! Knows request headers and tower-http's CORS layer; nothing about SQL or the engine.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::api_error::{ApiError, ErrorCode};
use crate::http::{ATTEMPT, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};

/// How long a browser may cache a preflight answer.
const PREFLIGHT_MAX_AGE: Duration = Duration::from_secs(600);

/// The origins allowed to call the server from a browser.
#[derive(Debug, Clone)]
pub(crate) struct Origins(Arc<Vec<String>>);

impl Origins {
    pub(crate) fn new(origins: Vec<String>) -> Origins {
        Origins(Arc::new(origins))
    }

    fn allows(&self, origin: &HeaderValue) -> bool {
        self.0
            .iter()
            .any(|allowed| allowed.as_bytes().eq_ignore_ascii_case(origin.as_bytes()))
    }
}

/// Refuses a request whose `Origin` is not listed; requests without one (every non-browser
/// client) pass.
pub(crate) async fn refuse_unlisted_origins(
    State(origins): State<Origins>,
    request: Request,
    next: Next,
) -> Response {
    match request.headers().get(header::ORIGIN) {
        Some(origin) if !origins.allows(origin) => ApiError::new(
            ErrorCode::OriginNotAllowed,
            "requests from this browser origin are not allowed; the server's operator can \
             list it with --allow-origin",
        )
        .into_response(),
        _ => next.run(request).await,
    }
}

/// The CORS layer for the listed origins (none: the layer adds nothing).
pub(crate) fn cors(origins: &[String]) -> CorsLayer {
    let listed: Vec<HeaderValue> = origins
        .iter()
        .filter_map(|origin| HeaderValue::from_str(origin).ok())
        .collect();
    CorsLayer::new()
        .allow_origin(AllowOrigin::list(listed))
        .allow_methods([Method::POST, Method::GET])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            IDEMPOTENCY_KEY,
            ATTEMPT,
        ])
        .expose_headers([
            IDEMPOTENT_REPLAYED,
            header::RETRY_AFTER,
            HeaderName::from_static("x-request-id"),
        ])
        .max_age(PREFLIGHT_MAX_AGE)
}
