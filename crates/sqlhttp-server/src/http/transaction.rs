//! The interactive-transaction endpoints, `POST /api/v1/transaction/{open, statement, commit,
//! rollback, outcome}`: each takes an admitted body (see `admit`: credential, JSON, body limit,
//! a statement's text checks) and hands it to the registry (`engine::transactions`), with the
//! credential as the transaction's owner. The token travels in the body (`"transaction"`), so
//! every path is fixed. A read credential may open only read-only transactions.
//!
//! A request for a transaction another replica holds (its token names that replica, which
//! stored its `--advertise-url` in the shared database) is forwarded there once, marked
//! `Sqlhttp-Forwarded`, and its answer passed back; a holder that cannot be reached leaves the
//! answer to this replica (the commit record: committed, or `410 TRANSACTION_EXPIRED`).
//!
//! Knows HTTP and the protocol; nothing about either engine or how the registry keeps
//! transactions. See `docs/protocol.md`, "Interactive transactions".

use std::sync::OnceLock;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, Request, Uri, header};
use axum::response::{IntoResponse, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

use crate::budget::Held;
use crate::engine::Outcome;
use crate::engine::interactive::{Isolation, TxOptions};
use crate::engine::sandbox::check_text;
use crate::http::admit::{Admissible, Admitted};
use crate::http::credentials::Credential;
use crate::http::{ATTEMPT, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, outcome_response};
use crate::protocol::error::{ApiError, ErrorCode};
use crate::protocol::request::SqlRequest;
use crate::state::{AppState, Shared};

/// Opens a transaction.
pub(crate) const OPEN_PATH: &str = "/api/v1/transaction/open";
/// Runs one statement in a transaction.
pub(crate) const STATEMENT_PATH: &str = "/api/v1/transaction/statement";
/// Commits a transaction.
pub(crate) const COMMIT_PATH: &str = "/api/v1/transaction/commit";
/// Rolls a transaction back.
pub(crate) const ROLLBACK_PATH: &str = "/api/v1/transaction/rollback";
/// Tells how a transaction stands.
pub(crate) const OUTCOME_PATH: &str = "/api/v1/transaction/outcome";

/// Longest token accepted (the server's are 41 characters).
const MAX_TOKEN_LEN: usize = 128;

/// Marks a request one replica forwarded to the one holding its transaction: never forwarded
/// again.
const FORWARDED: HeaderName = HeaderName::from_static("sqlhttp-forwarded");

/// How long a forwarded request may take past the statement timeout.
const FORWARD_MARGIN: Duration = Duration::from_secs(5);

/// Why a request was not forwarded and is answered here.
enum NotForwarded {
    /// Not another replica's, or it was forwarded already.
    Here,
    /// The holder could not be reached (nothing was sent to it).
    Unreachable,
}

/// Forwards the request for `token` (its body `bytes`) to the replica that holds it, or says
/// why not.
async fn forward(
    shared: &Shared,
    headers: &HeaderMap,
    token: &str,
    path: &str,
    bytes: axum::body::Bytes,
) -> Result<Response, NotForwarded> {
    static CLIENT: OnceLock<Client<HttpConnector, Body>> = OnceLock::new();
    if headers.contains_key(FORWARDED) {
        return Err(NotForwarded::Here);
    }
    let Some(owner) = shared.transactions.owner_url(&shared.engine, token).await else {
        return Err(NotForwarded::Here);
    };
    let Ok(uri) = format!("{owner}{path}").parse::<Uri>() else {
        return Err(NotForwarded::Here);
    };
    let mut request = Request::post(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .header(FORWARDED, "1");
    for name in [header::AUTHORIZATION, IDEMPOTENCY_KEY, ATTEMPT] {
        if let Some(value) = headers.get(&name) {
            request = request.header(name, value);
        }
    }
    let Ok(request) = request.body(Body::from(bytes)) else {
        return Err(NotForwarded::Here);
    };
    let client = CLIENT.get_or_init(|| Client::builder(TokioExecutor::new()).build_http());
    let within = shared
        .limits
        .statement_timeout
        .saturating_add(FORWARD_MARGIN);
    let lost = || {
        ApiError::unavailable(
            "the replica that holds this transaction did not answer in full; send the request \
             again (each step of a transaction is safe to send again)",
        )
        .into_response()
    };
    let response = match tokio::time::timeout(within, client.request(request)).await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) if e.is_connect() => {
            tracing::debug!(owner, error = %e, "the replica holding a transaction is unreachable");
            return Err(NotForwarded::Unreachable);
        }
        Ok(Err(_)) | Err(_) => return Ok(lost()),
    };
    let (parts, body) = response.into_parts();
    let limit = shared.limits.max_result_bytes.saturating_add(64 * 1024);
    let Ok(Ok(body)) =
        tokio::time::timeout(within, axum::body::to_bytes(Body::new(body), limit)).await
    else {
        return Ok(lost());
    };
    let mut answer = Response::new(Body::from(body));
    *answer.status_mut() = parts.status;
    for name in [
        header::CONTENT_TYPE,
        IDEMPOTENT_REPLAYED,
        header::RETRY_AFTER,
    ] {
        if let Some(value) = parts.headers.get(&name) {
            answer.headers_mut().insert(name, value.clone());
        }
    }
    Ok(answer)
}

/// Answers `here` unless the request goes to the replica that holds its transaction.
async fn forwarded_or(
    shared: &Shared,
    headers: &HeaderMap,
    token: &str,
    path: &str,
    bytes: axum::body::Bytes,
    here: impl Future<Output = Result<Outcome, ApiError>>,
) -> Response {
    match forward(shared, headers, token, path, bytes).await {
        Ok(answer) => answer,
        Err(NotForwarded::Here | NotForwarded::Unreachable) => respond(here.await),
    }
}

/// An open's body.
#[derive(Debug)]
pub(crate) struct OpenRequest(TxOptions);

/// A statement's body: a `/api/v1/sql` body with the transaction and the statement's number.
#[derive(Debug)]
pub(crate) struct StepRequest {
    token: String,
    seq: u64,
    request: SqlRequest,
}

/// A commit's, rollback's or outcome's body: the transaction.
#[derive(Debug)]
pub(crate) struct Named(String);

fn object(bytes: &[u8]) -> Result<(), ApiError> {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    Ok(())
}

fn token_of(token: Option<String>) -> Result<String, ApiError> {
    match token {
        Some(token)
            if !token.is_empty()
                && token.len() <= MAX_TOKEN_LEN
                && token
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.') =>
        {
            Ok(token)
        }
        Some(_) => Err(ApiError::bad_request(format!(
            "`transaction` is not a token this server issues: 1 to {MAX_TOKEN_LEN} letters, \
             digits and dots"
        ))),
        None => Err(ApiError::bad_request(
            "`transaction` (the token the open answered) is missing",
        )),
    }
}

impl Admissible for OpenRequest {
    fn limit(shared: &Shared) -> usize {
        shared.max_body_bytes
    }

    fn admit(bytes: &[u8], _: &Shared, credential: &Credential) -> Result<Self, ApiError> {
        #[derive(Deserialize)]
        struct Wire {
            read_only: Option<bool>,
            isolation: Option<Isolation>,
            deferrable: Option<bool>,
        }
        object(bytes)?;
        let wire: Wire = serde_json::from_slice(bytes).map_err(|e| {
            ApiError::bad_request(format!(
                "the body must be {{\"read_only\": bool, \"isolation\": \"serializable\" | \
                 \"repeatable_read\" | \"read_committed\", \"deferrable\": bool}}, each \
                 optional: {e}"
            ))
        })?;
        let options = TxOptions {
            read_only: wire.read_only.unwrap_or(false),
            isolation: wire.isolation.unwrap_or_default(),
            deferrable: wire.deferrable.unwrap_or(false),
        };
        if !credential.may_write() && !options.read_only {
            return Err(ApiError::new(
                ErrorCode::ReadOnly,
                "this credential may only read: it may open read-only transactions only \
                 (\"read_only\": true)",
            ));
        }
        Ok(OpenRequest(options))
    }
}

impl Admissible for StepRequest {
    fn limit(shared: &Shared) -> usize {
        shared.max_body_bytes
    }

    fn admit(bytes: &[u8], shared: &Shared, _: &Credential) -> Result<Self, ApiError> {
        #[derive(Deserialize)]
        struct Wire {
            transaction: Option<String>,
            seq: Option<u64>,
        }
        let request = SqlRequest::parse(bytes)?;
        let wire: Wire = serde_json::from_slice(bytes).map_err(|e| {
            ApiError::bad_request(format!(
                "`transaction` must be a string and `seq` a positive integer: {e}"
            ))
        })?;
        let token = token_of(wire.transaction)?;
        let seq = match wire.seq {
            Some(seq) if seq > 0 => seq,
            _ => {
                return Err(ApiError::bad_request(
                    "`seq` (the statement's number in the transaction, from 1) is missing",
                ));
            }
        };
        check_text(&request.sql, &shared.limits)?;
        Ok(StepRequest {
            token,
            seq,
            request,
        })
    }
}

impl Admissible for Named {
    fn limit(shared: &Shared) -> usize {
        shared.max_body_bytes
    }

    fn admit(bytes: &[u8], _: &Shared, _: &Credential) -> Result<Self, ApiError> {
        #[derive(Deserialize)]
        struct Wire {
            transaction: Option<String>,
        }
        object(bytes)?;
        let wire: Wire = serde_json::from_slice(bytes)
            .map_err(|e| ApiError::bad_request(format!("`transaction` must be a string: {e}")))?;
        token_of(wire.transaction).map(Named)
    }
}

/// A transaction's owner: the credential's identity, which does not move when other tokens
/// are added or revoked (never the token itself, never its position: see `Identity`).
fn owner(credential: &Credential) -> String {
    credential.identity.to_string()
}

fn respond(result: Result<Outcome, ApiError>) -> Response {
    match result {
        Ok(outcome) => outcome_response(outcome, Held::default()),
        Err(err) => err.into_response(),
    }
}

pub(crate) async fn open(
    State(state): State<AppState>,
    headers: HeaderMap,
    admitted: Admitted<OpenRequest>,
) -> Response {
    let at = match crate::http::read_at(&headers) {
        Ok(at) => at,
        Err(err) => return err.into_response(),
    };
    let shared = &state.inner;
    let key = admitted.key.map(|(_, key)| key);
    let OpenRequest(options) = admitted.body;
    shared.transactions.advertise(&shared.engine).await;
    respond(
        shared
            .transactions
            .open(
                &shared.engine,
                &owner(&admitted.credential),
                key,
                options,
                at,
            )
            .await,
    )
}

pub(crate) async fn statement(
    State(state): State<AppState>,
    headers: HeaderMap,
    admitted: Admitted<StepRequest>,
) -> Response {
    let shared = &state.inner;
    let owner = owner(&admitted.credential);
    let StepRequest {
        token,
        seq,
        request,
    } = admitted.body;
    tracing::debug!(sql = %request.sql, seq, "transaction statement");
    let here = shared
        .transactions
        .step(&shared.engine, &owner, &token, seq, request);
    forwarded_or(
        shared,
        &headers,
        &token,
        STATEMENT_PATH,
        admitted.bytes,
        here,
    )
    .await
}

pub(crate) async fn commit(
    State(state): State<AppState>,
    headers: HeaderMap,
    admitted: Admitted<Named>,
) -> Response {
    let shared = &state.inner;
    let (owner, token) = (owner(&admitted.credential), admitted.body.0);
    let here = shared.transactions.commit(&shared.engine, &owner, &token);
    forwarded_or(shared, &headers, &token, COMMIT_PATH, admitted.bytes, here).await
}

pub(crate) async fn rollback(
    State(state): State<AppState>,
    headers: HeaderMap,
    admitted: Admitted<Named>,
) -> Response {
    let shared = &state.inner;
    let (owner, token) = (owner(&admitted.credential), admitted.body.0);
    let here = shared.transactions.rollback(&shared.engine, &owner, &token);
    forwarded_or(
        shared,
        &headers,
        &token,
        ROLLBACK_PATH,
        admitted.bytes,
        here,
    )
    .await
}

pub(crate) async fn outcome(
    State(state): State<AppState>,
    headers: HeaderMap,
    admitted: Admitted<Named>,
) -> Response {
    let shared = &state.inner;
    let (owner, token) = (owner(&admitted.credential), admitted.body.0);
    let here = shared.transactions.outcome(&shared.engine, &owner, &token);
    forwarded_or(shared, &headers, &token, OUTCOME_PATH, admitted.bytes, here).await
}
