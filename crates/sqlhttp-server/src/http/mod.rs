//! The HTTP surface: [`app`] (routes, fallbacks, layers), the probes, and the
//! `POST /api/v1/sql` handler, which takes an admitted statement (see `admit`: credential, JSON,
//! Idempotency-Key, body, text checks) and hands it to the engine through the engine contract
//! (read-only for a read credential, exactly once under a key). `POST /api/v1/batch` (atomic
//! batches) lives in `batch`, `POST /api/v1/describe` in `describe`, and the interactive
//! transactions' `POST /api/v1/transaction/...` in `transaction`.
//!
//! Knows HTTP and the protocol; it does not know either engine (only `engine::Engine`).

mod admit;
pub(crate) mod auth;
mod batch;
mod body;
mod browser;
mod compression;
pub(crate) mod credentials;
mod describe;
mod gate;
pub(crate) mod hyper_errors;
pub(crate) mod metrics;
mod middleware;
mod openapi;
pub(crate) mod peers;
pub(crate) mod rate_limit;
pub(crate) mod request_id;
mod rows;
pub(crate) mod streams;
mod trace;
mod transaction;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use tower_http::catch_panic::CatchPanicLayer;

use crate::budget::Held;
use crate::engine::{Access, Engine as _, Keyed, Outcome, Reply};
use crate::protocol::bookmark::{
    BOOKMARK_HEADER, CONSISTENCY_HEADER, Position, ReadAt, SERVED_BY_HEADER,
};
use crate::protocol::error::{ApiError, ErrorCode, json_response};
use crate::protocol::request::SqlRequest;
use crate::state::AppState;

use admit::Admitted;

/// The SQL endpoint's path.
pub(crate) const SQL_PATH: &str = sqlhttp_protocol::path::SQL;
pub(crate) const ATTEMPT: HeaderName = HeaderName::from_static(sqlhttp_protocol::header::ATTEMPT);
pub(crate) const IDEMPOTENCY_KEY: HeaderName =
    HeaderName::from_static(sqlhttp_protocol::header::IDEMPOTENCY_KEY);
pub(crate) const IDEMPOTENT_REPLAYED: HeaderName =
    HeaderName::from_static(sqlhttp_protocol::header::IDEMPOTENT_REPLAYED);

/// How long `/readyz` waits for the engine to answer a trivial statement.
const READY_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

/// Builds the HTTP app over `state`: `POST /api/v1/sql`, `/api/v1/batch` and
/// `/api/v1/describe`, `GET /api/v1/openapi.json` (the protocol's document), `GET /healthz`
/// (liveness), `GET /readyz` (the engine answers), `GET /metrics` (Prometheus), JSON 404/405
/// bodies, authentication and rate limiting of `/api/` paths, the browser policy (origins, CORS),
/// panic-to-500 conversion, and a request id and one log line per request.
///
/// ```
/// use sqlhttp_server::{AppState, Config, app};
/// use tower::ServiceExt as _;
///
/// # tokio_test_block_on(async {
/// let router = app(AppState::new(&Config::default()).unwrap());
/// let response = router
///     .oneshot(
///         axum::http::Request::post("/api/v1/sql")
///             .header("content-type", "application/json")
///             .body(axum::body::Body::from(r#"{"sql": "SELECT 1 AS one"}"#))
///             .unwrap(),
///     )
///     .await
///     .unwrap();
/// assert_eq!(response.status(), 200);
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Runtime::new().unwrap().block_on(f)
/// # }
/// ```
pub fn app(state: AppState) -> Router {
    let origins = state.inner.allow_origins.clone();
    let routes = ROUTES
        .iter()
        .fold(Router::new(), |router, &(path, serve)| {
            router.route(path, serve())
        })
        .fallback(not_found)
        .with_state(state.clone());
    // The layers wrap the router once, outermost first, rather than each route (what
    // `Router::layer` does): there, each layer boxed the stack beneath it per route and every
    // `from_fn` layer cloned that whole boxed stack on every request, about 40 % of a point
    // read's instructions (ADR 0057). Nothing in them depends on the route but the metrics'
    // endpoint label, which `endpoint` gives from the path.
    let layers = tower::ServiceBuilder::new()
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::log_requests,
        ))
        .layer(CatchPanicLayer::custom(middleware::panic_response))
        .layer(browser::policy(origins))
        // The caller, its HTTP/2 stream permit and its Accept-Encoding, as one layer.
        .layer(axum::middleware::from_fn_with_state(state, gate::gate))
        .layer(compression::layer());
    Router::new().fallback_service(layers.service(routes))
}

const HEALTHZ_PATH: &str = "/healthz";
const READYZ_PATH: &str = "/readyz";
const METRICS_PATH: &str = "/metrics";

/// What serves one route: its handler per method, and the answer to any other method.
type Serve = fn() -> MethodRouter<AppState>;

/// Every route [`app`] serves, with what serves it: the one list [`app`] builds its router from
/// and [`endpoint`] names a request's route by, so the two cannot disagree.
const ROUTES: [(&str, Serve); 13] = [
    (SQL_PATH, || post(sql).fallback(sql_method_not_allowed)),
    (batch::BATCH_PATH, || {
        post(batch::batch).fallback(sql_method_not_allowed)
    }),
    (describe::DESCRIBE_PATH, || {
        post(describe::describe).fallback(sql_method_not_allowed)
    }),
    (describe::DESCRIBE_STATEMENT_PATH, || {
        post(describe::describe_statement).fallback(sql_method_not_allowed)
    }),
    (transaction::OPEN_PATH, || {
        post(transaction::open).fallback(sql_method_not_allowed)
    }),
    (transaction::STATEMENT_PATH, || {
        post(transaction::statement).fallback(sql_method_not_allowed)
    }),
    (transaction::COMMIT_PATH, || {
        post(transaction::commit).fallback(sql_method_not_allowed)
    }),
    (transaction::ROLLBACK_PATH, || {
        post(transaction::rollback).fallback(sql_method_not_allowed)
    }),
    (transaction::OUTCOME_PATH, || {
        post(transaction::outcome).fallback(sql_method_not_allowed)
    }),
    (openapi::OPENAPI_PATH, || {
        get(openapi::openapi).fallback(probe_method_not_allowed)
    }),
    (HEALTHZ_PATH, || {
        get(healthz).fallback(probe_method_not_allowed)
    }),
    (READYZ_PATH, || {
        get(readyz).fallback(probe_method_not_allowed)
    }),
    (METRICS_PATH, || {
        get(metrics::metrics).fallback(metrics::method_not_allowed)
    }),
];

/// The route `path` is served by (its pattern, for the metrics' endpoint label), or `None` when
/// no route matches it (the JSON 404). Every route is a fixed path, so the pattern is the path.
pub(crate) fn endpoint(path: &str) -> Option<&'static str> {
    ROUTES
        .iter()
        .map(|&(route, _)| route)
        .find(|route| *route == path)
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(state): State<AppState>) -> Response {
    match tokio::time::timeout(READY_WITHIN, state.inner.engine.ready()).await {
        Ok(Ok(())) => "ready".into_response(),
        Ok(Err(err)) => ApiError::unavailable(format!("the engine is not ready: {}", err.message))
            .into_response(),
        Err(_) => ApiError::unavailable(format!(
            "the engine did not answer a trivial statement within {} ms",
            READY_WITHIN.as_millis()
        ))
        .into_response(),
    }
}

async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such resource")
}

async fn sql_method_not_allowed() -> ApiError {
    ApiError::method_not_allowed("POST")
}

async fn probe_method_not_allowed() -> ApiError {
    ApiError::method_not_allowed("GET, HEAD")
}

async fn sql(
    State(state): State<AppState>,
    admitted: Admitted<SqlRequest>,
) -> Result<Response, ApiError> {
    let (reply, held) = run_sql(&state, admitted).await?;
    Ok(reply_response(reply, held))
}

/// The response for an engine's reply: a whole outcome with its share of the budget, or a
/// stream.
pub(crate) fn reply_response(reply: Reply, held: Held) -> Response {
    match reply {
        Reply::Whole(outcome) => outcome_response(outcome, held),
        Reply::Stream(body, position) => streamed_response(body, position),
    }
}

/// Where a request's read may run: its `Sqlhttp-Bookmark` and `Sqlhttp-Consistency` headers
/// (`400 BAD_REQUEST` when either is malformed or repeated).
pub(crate) fn read_at(headers: &HeaderMap) -> Result<ReadAt, ApiError> {
    let one = |name: &str| {
        let mut values = headers.get_all(name).iter();
        let first = values.next();
        if values.next().is_some() {
            return Err(ApiError::bad_request(format!(
                "the {name} header is given twice"
            )));
        }
        first
            .map(|value| {
                value.to_str().map_err(|_| {
                    ApiError::bad_request(format!("the {name} header is not visible ASCII"))
                })
            })
            .transpose()
    };
    ReadAt::parse(one(BOOKMARK_HEADER)?, one(CONSISTENCY_HEADER)?)
}

/// Says where an answer stands: its bookmark and who served it.
pub(crate) fn add_position(headers: &mut HeaderMap, position: Option<Position>) {
    let Some(position) = position else {
        return;
    };
    if let Ok(value) = HeaderValue::from_str(&position.bookmark.to_string()) {
        headers.insert(BOOKMARK_HEADER, value);
    }
    headers.insert(
        SERVED_BY_HEADER,
        HeaderValue::from_static(position.served_by.as_str()),
    );
}

/// Runs one admitted statement; a whole answer comes with its share of the server's budget
/// (nothing for a small fresh result, whose job held none).
async fn run_sql(
    state: &AppState,
    admitted: Admitted<SqlRequest>,
) -> Result<(Reply, Held), ApiError> {
    let shared = &state.inner;
    let reads_only = admitted.reads_only(admitted.body.read_only);
    // `_held`: the body's share of the server's budget, until the request is answered.
    let Admitted {
        at,
        key,
        body: request,
        bytes,
        held: _held,
        ..
    } = admitted;
    tracing::debug!(sql = %request.sql, "statement");

    if reads_only {
        // A statement that cannot write has nothing to apply once: the key is not used, and the
        // writer is never asked.
        let asked = request.read_only;
        return shared
            .engine
            .execute(request, Access::ReadOnly, at)
            .await
            .map(|reply| (reply, Held::default()))
            .map_err(|err| {
                if asked && err.code == ErrorCode::ReadOnly {
                    err.with_hint(READ_ONLY_HINT)
                } else {
                    err
                }
            });
    }
    let Some((ttl, key)) = key else {
        let reply = shared
            .engine
            .execute(request, Access::ReadWrite, at)
            .await?;
        return Ok((reply, Held::default()));
    };
    // A keyed write does not hand its bookmark to the engine: it is checked here, before the
    // key is claimed.
    shared.engine.check_bookmark(at).await?;
    let claim = admit::claim(state, &key)?;
    let keyed = Keyed {
        ttl,
        key,
        request_hash: admit::identity(SQL_PATH, &bytes),
        claim: Box::new(claim),
    };
    shared
        .engine
        .execute_keyed(keyed, request)
        .await
        .map(|(outcome, held)| (Reply::Whole(outcome), held))
}

/// What a client that marked a write `read_only` is told to do instead.
const READ_ONLY_HINT: &str = "the request was sent with \"read_only\": true; send a statement \
     that writes without it (with the sqlhttp SDK: `execute`, `insert` or a write batch, not \
     `query`)";

/// A `200` whose JSON body streams from the engine (chunked); see ADR 0016.
fn streamed_response(body: crate::engine::ChunkReceiver, position: Option<Position>) -> Response {
    let mut response = Response::builder()
        .status(StatusCode::OK)
        .header(
            axum::http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )
        .body(axum::body::Body::from_stream(body))
        .unwrap_or_else(|_| ApiError::internal().into_response());
    add_position(response.headers_mut(), position);
    response
}

/// The response for a whole outcome; `held` (its share of the server's budget) is given back
/// once the body has been sent or dropped.
fn outcome_response(outcome: Outcome, held: Held) -> Response {
    whole_response(
        outcome.status,
        outcome.body.into(),
        outcome.replayed,
        outcome.position,
        held,
    )
}

/// The response for a whole answer whose `body` may be shared with other answers (a
/// transaction's stored result and its replays): `held`, its shares of the server's budget,
/// is given back once the body has been sent or dropped.
pub(crate) fn whole_response(
    status: u16,
    body: axum::body::Bytes,
    replayed: bool,
    position: Option<Position>,
    held: Held,
) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    // Rows are counted for the request's log line only: not when nobody would read it.
    let counted = (status == StatusCode::OK
        && tracing::enabled!(target: "sqlhttp_server::http::middleware", tracing::Level::INFO))
    .then(|| rows::count(&body))
    .flatten();
    let mut response = json_response(status, Vec::new());
    *response.body_mut() = axum::body::Body::new(body::Holding::new(body, held));
    if let Some(count) = counted {
        response.extensions_mut().insert(rows::Rows(count));
    }
    add_position(response.headers_mut(), position);
    if replayed {
        response
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use tower::ServiceExt as _;

    #[tokio::test]
    async fn every_listed_endpoint_is_a_route() {
        let router = app(AppState::new(&crate::Config::default()).unwrap());
        let listed = ROUTES.iter().map(|&(path, _)| path);
        for path in listed.chain(["/api/v1/nowhere"]) {
            let response = router
                .clone()
                .oneshot(
                    axum::extract::Request::post(path)
                        .body(Body::empty())
                        .unwrap(),
                )
                .await
                .unwrap();
            // A listed path is routed (its answer may refuse the empty body or the method);
            // an unlisted one is the JSON 404, labelled `unmatched`.
            assert_eq!(
                response.status() == StatusCode::NOT_FOUND,
                endpoint(path).is_none(),
                "{path}"
            );
        }
    }

    #[tokio::test]
    async fn a_panicking_handler_becomes_a_json_500() {
        let router: Router = Router::new()
            .route(
                "/boom",
                get(|| async {
                    if true {
                        panic!("secret detail");
                    }
                    "unreachable"
                }),
            )
            .layer(CatchPanicLayer::custom(middleware::panic_response))
            .layer(axum::middleware::from_fn_with_state(
                AppState::new(&crate::Config::default()).unwrap(),
                middleware::log_requests,
            ));
        let response = router
            .oneshot(
                axum::extract::Request::get("/boom")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(response.headers().contains_key("x-request-id"));
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert_eq!(
            text,
            r#"{"error":{"code":"INTERNAL","message":"internal server error"}}"#
        );
    }
}
