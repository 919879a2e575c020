//! The browser policy: a request that carries an `Origin` the operator did not list is refused
//! with `403 ORIGIN_NOT_ALLOWED`, so a web page cannot post SQL to a server on a developer's
//! machine; listed origins get CORS answers (preflight, exposed headers). Only a real preflight
//! (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) is answered by the CORS layer;
//! any other `OPTIONS` is routed as every other method is (`404`, or `405` with `Allow`).
//!
//! Knows request headers and tower-http's CORS layer; nothing about SQL or the engine.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::Request;
use axum::http::{HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use tower::{Layer, Service, ServiceExt as _};
use tower_http::cors::{AllowOrigin, Cors, CorsLayer};

use crate::http::{ATTEMPT, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use crate::protocol::error::{ApiError, ErrorCode};

/// How long a browser may cache a preflight answer.
const PREFLIGHT_MAX_AGE: Duration = Duration::from_secs(600);

/// The origins allowed to call the server from a browser.
#[derive(Debug, Clone)]
struct Origins(Arc<Vec<String>>);

impl Origins {
    fn new(origins: Vec<String>) -> Origins {
        Origins(Arc::new(origins))
    }

    fn allows(&self, origin: &HeaderValue) -> bool {
        self.0
            .iter()
            .any(|allowed| allowed.as_bytes().eq_ignore_ascii_case(origin.as_bytes()))
    }
}

/// `403 ORIGIN_NOT_ALLOWED` for a request whose `Origin` the operator did not list (a request
/// without one is not a browser's cross-origin request, and passes).
fn refusal(origins: &Origins, request: &Request) -> Option<Response> {
    match request.headers().get(header::ORIGIN) {
        Some(origin) if !origins.allows(origin) => Some(
            ApiError::new(
                ErrorCode::OriginNotAllowed,
                "requests from this browser origin are not allowed; the server's operator can \
                 list it with --allow-origin",
            )
            .into_response(),
        ),
        _ => None,
    }
}

/// The browser policy as one layer: unlisted origins refused, then the CORS layer for the
/// listed ones (none: the layer adds nothing), answering real preflights only. tower-http's
/// layer answers every `OPTIONS` as a preflight, `200` with an empty body, on any path: that
/// broke the protocol's promise of a JSON `404` or `405` (found by Schemathesis, ADR 0030).
/// One layer, not a `from_fn` refusal over the CORS layer: each layer clones the stack beneath
/// it per request (ADR 0057).
pub(crate) fn policy(origins: Vec<String>) -> Policy {
    Policy {
        cors: cors_layer(&origins),
        origins: Origins::new(origins),
    }
}

/// The browser policy's layer (see [`policy`]).
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    cors: CorsLayer,
    origins: Origins,
}

impl<S: Clone> Layer<S> for Policy {
    type Service = PolicyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PolicyService {
            cors: self.cors.layer(inner.clone()),
            plain: inner,
            origins: self.origins.clone(),
        }
    }
}

/// The service of [`Policy`]: the refusal of unlisted origins, the CORS-wrapped routes, and
/// the routes themselves for an `OPTIONS` that is no preflight.
#[derive(Debug, Clone)]
pub(crate) struct PolicyService<S> {
    cors: Cors<S>,
    plain: S,
    origins: Origins,
}

/// Whether `request` is a CORS preflight (Fetch standard: `OPTIONS` with `Origin` and
/// `Access-Control-Request-Method`).
fn is_preflight(request: &Request) -> bool {
    request.method() == Method::OPTIONS
        && request.headers().contains_key(header::ORIGIN)
        && request
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
}

impl<S> Service<Request> for PolicyService<S>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each call readies its own clone (`oneshot`).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        if let Some(refused) = refusal(&self.origins, &request) {
            return Box::pin(std::future::ready(Ok(refused)));
        }
        if request.method() == Method::OPTIONS && !is_preflight(&request) {
            Box::pin(self.plain.clone().oneshot(request))
        } else {
            Box::pin(self.cors.clone().oneshot(request))
        }
    }
}

fn cors_layer(origins: &[String]) -> CorsLayer {
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
            crate::http::request_id::X_REQUEST_ID,
        ])
        .max_age(PREFLIGHT_MAX_AGE)
}
