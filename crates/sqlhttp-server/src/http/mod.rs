//! The HTTP surface: [`app`] (routes, fallbacks, layers) and the `POST /api/v1/sql` handler,
//! which authenticates, validates the Idempotency-Key, reads the body within the limit,
//! decodes it and hands the statement to the engine.
//!
//! Knows HTTP and the protocol; it does not know SQLite (only the engine's async handle).

pub(crate) mod auth;
mod body;
mod middleware;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use sha2::{Digest, Sha256};
use tower_http::catch_panic::CatchPanicLayer;

use crate::api_error::{ApiError, ErrorCode, json_response};
use crate::engine::Outcome;
use crate::request::{SqlRequest, is_transaction_control};
use crate::state::AppState;

/// The SQL endpoint's path.
pub(crate) const SQL_PATH: &str = "/api/v1/sql";
pub(crate) const ATTEMPT: HeaderName = HeaderName::from_static("sqlhttp-attempt");
pub(crate) const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
pub(crate) const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Longest accepted Idempotency-Key.
const MAX_KEY_LEN: usize = 255;

/// Builds the HTTP app over `state`: `POST /api/v1/sql`, `GET /healthz`, JSON 404/405
/// bodies, panic-to-500 conversion and one log line per request.
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
    Router::new()
        .route(SQL_PATH, post(sql).fallback(sql_method_not_allowed))
        .route(
            "/healthz",
            get(healthz).fallback(healthz_method_not_allowed),
        )
        .fallback(not_found)
        .with_state(state)
        .layer(CatchPanicLayer::custom(middleware::panic_response))
        .layer(axum::middleware::from_fn(middleware::log_requests))
}

async fn healthz() -> &'static str {
    "ok"
}

async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such resource")
}

async fn sql_method_not_allowed() -> ApiError {
    ApiError::method_not_allowed("POST")
}

async fn healthz_method_not_allowed() -> ApiError {
    ApiError::method_not_allowed("GET, HEAD")
}

async fn sql(State(state): State<AppState>, request: Request) -> Response {
    match run_sql(&state, request).await {
        Ok(outcome) => outcome_response(outcome),
        Err(err) => err.into_response(),
    }
}

async fn run_sql(state: &AppState, request: Request) -> Result<Outcome, ApiError> {
    let shared = &state.inner;
    let (parts, body) = request.into_parts();
    shared.tokens.authorize(&parts.headers)?;
    let key = match shared.idempotency_ttl {
        Some(ttl) => idempotency_key(&parts.headers)?.map(|key| (ttl, key)),
        None => None,
    };
    let bytes = body::read_limited(body, &parts.headers, shared.max_body_bytes).await?;
    let request = SqlRequest::parse(&bytes)?;
    tracing::debug!(sql = %request.sql, "statement");

    let Some((ttl, key)) = key else {
        return shared.engine.execute(request).await;
    };
    if is_transaction_control(&request.sql) {
        return Err(ApiError::bad_request(
            "transaction-control statements (BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE, END) \
             cannot carry an Idempotency-Key",
        ));
    }
    let guard = shared.claim(&key).ok_or_else(|| {
        ApiError::new(
            ErrorCode::IdempotencyKeyInUse,
            "a request with this Idempotency-Key is still running; retry later",
        )
    })?;
    let request_hash: [u8; 32] = Sha256::digest(&bytes).into();
    shared
        .engine
        .execute_with_key(ttl, key, request_hash, request, guard)
        .await
}

/// The request's Idempotency-Key: 1 to 255 visible ASCII characters, at most one header.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let invalid = || {
        ApiError::bad_request(format!(
            "Idempotency-Key must be one header of 1 to {MAX_KEY_LEN} visible ASCII characters"
        ))
    };
    let bytes = value.as_bytes();
    if values.next().is_some()
        || bytes.is_empty()
        || bytes.len() > MAX_KEY_LEN
        || !bytes.iter().all(|b| (0x21..=0x7e).contains(b))
    {
        return Err(invalid());
    }
    // Visible ASCII is valid UTF-8.
    Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
}

fn outcome_response(outcome: Outcome) -> Response {
    let status = StatusCode::from_u16(outcome.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = json_response(status, outcome.body);
    if outcome.replayed {
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
            .layer(axum::middleware::from_fn(middleware::log_requests));
        let response = router
            .oneshot(Request::get("/boom").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert_eq!(
            text,
            r#"{"error":{"code":"INTERNAL","message":"internal server error"}}"#
        );
    }

    #[test]
    fn idempotency_key_syntax() {
        let with = |values: &[&[u8]]| {
            let mut headers = HeaderMap::new();
            for value in values {
                headers.append(IDEMPOTENCY_KEY, HeaderValue::from_bytes(value).unwrap());
            }
            idempotency_key(&headers)
        };
        assert_eq!(with(&[]).unwrap(), None);
        assert_eq!(with(&[b"abc-123"]).unwrap().as_deref(), Some("abc-123"));
        assert!(with(&[&[b'k'; 255]]).unwrap().is_some());
        assert!(with(&[&[b'k'; 256]]).is_err());
        assert!(with(&[b""]).is_err());
        assert!(with(&[b"has space"]).is_err());
        assert!(with(&[b"tab\there"]).is_err());
        assert!(with(&[b"caf\xc3\xa9"]).is_err());
        assert!(with(&[b"a", b"b"]).is_err());
    }
}
