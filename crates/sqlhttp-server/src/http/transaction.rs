//! The interactive-transaction endpoints, `POST /api/v1/transaction/{open, statement, commit,
//! rollback, outcome}`: each takes an admitted body (see `admit`: credential, JSON, body limit,
//! a statement's text checks) and hands it to the registry (`engine::transactions`), with the
//! credential as the transaction's owner. The token travels in the body (`"transaction"`), so
//! every path is fixed. A read credential may open only read-only transactions.
//!
//! Knows HTTP and the protocol; nothing about either engine or how the registry keeps
//! transactions. See `docs/protocol.md`, "Interactive transactions".

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::budget::Held;
use crate::engine::Outcome;
use crate::engine::interactive::{Isolation, TxOptions};
use crate::engine::sandbox::check_text;
use crate::http::admit::{Admissible, Admitted};
use crate::http::credentials::Credential;
use crate::http::outcome_response;
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

/// A transaction's owner: the credential's label (never the token itself).
fn owner(credential: &Credential) -> String {
    credential.label.to_string()
}

fn respond(result: Result<Outcome, ApiError>) -> Response {
    match result {
        Ok(outcome) => outcome_response(outcome, Held::default()),
        Err(err) => err.into_response(),
    }
}

pub(crate) async fn open(
    State(state): State<AppState>,
    admitted: Admitted<OpenRequest>,
) -> Response {
    let shared = &state.inner;
    let key = admitted.key.map(|(_, key)| key);
    let OpenRequest(options) = admitted.body;
    respond(
        shared
            .transactions
            .open(&shared.engine, &owner(&admitted.credential), key, options)
            .await,
    )
}

pub(crate) async fn statement(
    State(state): State<AppState>,
    admitted: Admitted<StepRequest>,
) -> Response {
    let shared = &state.inner;
    let StepRequest {
        token,
        seq,
        request,
    } = admitted.body;
    tracing::debug!(sql = %request.sql, seq, "transaction statement");
    respond(
        shared
            .transactions
            .step(
                &shared.engine,
                &owner(&admitted.credential),
                &token,
                seq,
                request,
            )
            .await,
    )
}

pub(crate) async fn commit(State(state): State<AppState>, admitted: Admitted<Named>) -> Response {
    let shared = &state.inner;
    respond(
        shared
            .transactions
            .commit(
                &shared.engine,
                &owner(&admitted.credential),
                &admitted.body.0,
            )
            .await,
    )
}

pub(crate) async fn rollback(State(state): State<AppState>, admitted: Admitted<Named>) -> Response {
    let shared = &state.inner;
    respond(
        shared
            .transactions
            .rollback(
                &shared.engine,
                &owner(&admitted.credential),
                &admitted.body.0,
            )
            .await,
    )
}

pub(crate) async fn outcome(State(state): State<AppState>, admitted: Admitted<Named>) -> Response {
    let shared = &state.inner;
    respond(
        shared
            .transactions
            .outcome(
                &shared.engine,
                &owner(&admitted.credential),
                &admitted.body.0,
            )
            .await,
    )
}
