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
/// listed ones, answering real preflights only. tower-http's layer answers every `OPTIONS` as a
/// preflight, `200` with an empty body, on any path: that broke the protocol's promise of a
/// JSON `404` or `405` (found by Schemathesis, ADR 0030). One layer, not a `from_fn` refusal
/// over the CORS layer: each layer clones the stack beneath it per request (ADR 0057).
///
/// Only a request from a listed origin goes through tower-http's layer (ADR 0073). Any other
/// that is served carries no `Origin` (one that does is refused first), and all the layer adds
/// to its answer is `Vary` and `Access-Control-Expose-Headers`, whoever the server lists: the
/// policy adds those two itself, and holds no CORS layer at all when no origin is listed (the
/// default), so a request neither runs nor clones one.
pub(crate) fn policy(origins: Vec<String>) -> Policy {
    let cors = cors_layer(&origins);
    Policy {
        added: Arc::new(Added::of(&cors)),
        cors: (!origins.is_empty()).then_some(cors),
        origins: Origins::new(origins),
    }
}

/// The browser policy's layer (see [`policy`]).
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    cors: Option<CorsLayer>,
    origins: Origins,
    added: Arc<Added>,
}

impl<S: Clone> Layer<S> for Policy {
    type Service = PolicyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PolicyService {
            cors: self.cors.as_ref().map(|cors| cors.layer(inner.clone())),
            plain: inner,
            origins: self.origins.clone(),
            added: Arc::clone(&self.added),
        }
    }
}

/// The service of [`Policy`]: the refusal of unlisted origins, the CORS-wrapped routes for
/// listed ones, and the routes themselves for the rest.
#[derive(Debug, Clone)]
pub(crate) struct PolicyService<S> {
    /// The routes under tower-http's CORS layer, when the operator listed origins.
    cors: Option<Cors<S>>,
    plain: S,
    origins: Origins,
    added: Arc<Added>,
}

/// What the CORS layer adds to the answer to a request without `Origin` (no preflight), as it
/// adds them: `Vary` appended to any the route set, `Access-Control-Expose-Headers` replacing
/// any. Learnt from the layer itself, so the two cannot disagree (tower-http derives `Vary`
/// from the layer's settings); a test holds the policy's answers to the layer's.
#[derive(Debug, Default)]
struct Added {
    vary: Option<HeaderValue>,
    expose: Option<HeaderValue>,
}

impl Added {
    /// Asks `cors` once, with a route that answers at once: its answer to a request without
    /// `Origin` is then ready at its first poll (no origin to await), so no runtime is needed.
    /// An answer not ready would leave nothing added, which the test would show.
    fn of(cors: &CorsLayer) -> Added {
        let mut probe = cors.layer(tower::service_fn(|_: Request| {
            std::future::ready(Ok::<_, Infallible>(
                Response::new(axum::body::Body::empty()),
            ))
        }));
        let mut context = Context::from_waker(std::task::Waker::noop());
        if !matches!(probe.poll_ready(&mut context), Poll::Ready(Ok(()))) {
            return Added::default();
        }
        let answer = probe.call(Request::new(axum::body::Body::empty()));
        match std::pin::pin!(answer).poll(&mut context) {
            Poll::Ready(Ok(response)) => Added {
                vary: response.headers().get(header::VARY).cloned(),
                expose: response
                    .headers()
                    .get(header::ACCESS_CONTROL_EXPOSE_HEADERS)
                    .cloned(),
            },
            Poll::Ready(Err(never)) => match never {},
            Poll::Pending => Added::default(),
        }
    }

    fn apply(&self, response: &mut Response) {
        let headers = response.headers_mut();
        if let Some(vary) = &self.vary {
            headers.append(header::VARY, vary.clone());
        }
        if let Some(expose) = &self.expose {
            headers.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, expose.clone());
        }
    }
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
            return Box::pin(self.plain.clone().oneshot(request));
        }
        match &self.cors {
            // A listed origin (any other was refused above).
            Some(cors) if request.headers().contains_key(header::ORIGIN) => {
                Box::pin(cors.clone().oneshot(request))
            }
            _ => {
                let added = Arc::clone(&self.added);
                let answer = self.plain.clone().oneshot(request);
                Box::pin(async move {
                    let mut response = answer.await?;
                    added.apply(&mut response);
                    Ok(response)
                })
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A route that sets a `Vary` of its own (the compression layer's) and an exposed-headers
    /// value of its own, to show which the policy appends to and which it replaces.
    fn route() -> impl Service<
        Request,
        Response = Response,
        Error = Infallible,
        Future = impl Future<Output = Result<Response, Infallible>> + Send + 'static,
    > + Clone
    + Send
    + 'static {
        tower::service_fn(|_: Request| async {
            let mut response = Response::new(axum::body::Body::empty());
            let headers = response.headers_mut();
            headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
            headers.insert(
                header::ACCESS_CONTROL_EXPOSE_HEADERS,
                HeaderValue::from_static("x-route"),
            );
            Ok(response)
        })
    }

    async fn headers_of<S>(service: S, request: Request) -> axum::http::HeaderMap
    where
        S: Service<Request, Response = Response, Error = Infallible>,
    {
        service.oneshot(request).await.unwrap().headers().clone()
    }

    #[tokio::test]
    async fn an_answer_without_origin_carries_what_the_cors_layer_would_add() {
        for origins in [vec![], vec!["https://app.example".to_owned()]] {
            let plain = || Request::post("/api/v1/sql").body(axum::body::Body::empty());
            let ours = headers_of(policy(origins.clone()).layer(route()), plain().unwrap()).await;
            let theirs = headers_of(cors_layer(&origins).layer(route()), plain().unwrap()).await;
            assert_eq!(ours, theirs, "origins {origins:?}");
            assert!(ours.contains_key(header::ACCESS_CONTROL_EXPOSE_HEADERS));
        }
    }

    #[tokio::test]
    async fn with_no_origin_listed_every_origin_is_refused() {
        let request = Request::post("/api/v1/sql")
            .header(header::ORIGIN, "https://app.example")
            .body(axum::body::Body::empty())
            .unwrap();
        let response = policy(vec![])
            .layer(route())
            .oneshot(request)
            .await
            .unwrap();
        assert_eq!(response.status(), axum::http::StatusCode::FORBIDDEN);
    }

    #[tokio::test]
    async fn a_listed_origin_is_answered_by_the_cors_layer() {
        let origins = vec!["https://app.example".to_owned()];
        let listed = || {
            Request::post("/api/v1/sql")
                .header(header::ORIGIN, "https://app.example")
                .body(axum::body::Body::empty())
                .unwrap()
        };
        let ours = headers_of(policy(origins.clone()).layer(route()), listed()).await;
        let theirs = headers_of(cors_layer(&origins).layer(route()), listed()).await;
        assert_eq!(ours, theirs);
        assert_eq!(
            ours[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "https://app.example"
        );
    }
}
