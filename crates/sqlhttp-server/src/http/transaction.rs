//! The interactive-transaction endpoints, `POST /api/v1/transaction/{open, statement, commit,
//! rollback, outcome}`: each takes an admitted body (see `admit`: credential, JSON, body limit,
//! a statement's text checks) and hands it to the transaction layer (`crate::transactions`), with the
//! credential as the transaction's owner. The token travels in the body (`"transaction"`), so
//! every path is fixed. A read credential may open only read-only transactions.
//!
//! A request for a transaction another process holds (its token names that process, which
//! stored its `--advertise-url` in the shared database) is forwarded there once, signed, and
//! its proven answer passed back (see `peers`); a holder that is gone leaves the answer to this
//! process (the commit record: committed, or `410 TRANSACTION_EXPIRED`), one that is alive but
//! did not answer is `503` (`OUTCOME_UNKNOWN` for a COMMIT).
//!
//! Knows HTTP and the protocol; nothing about either engine or how the registry keeps
//! transactions. See `docs/protocol.md`, "Interactive transactions".

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::value::RawValue;
use sqlhttp_protocol::body::{TransactionNamed, TransactionOpenRequest};

use crate::budget::Held;
use crate::engine::Access;
use crate::engine::Outcome;
use crate::engine::interactive::TxOptions;
use crate::engine::sandbox::check_text;
use crate::http::admit::{Admissible, Admitted, refuse_write};
use crate::http::credentials::Credential;
use crate::http::outcome_response;
use crate::http::peers::{self, Forwarded};
use crate::protocol::error::ApiError;
use crate::protocol::request::{SqlRequest, exact_unsigned, object};
use crate::state::{AppState, Shared};
use crate::transactions::Answer;

/// Opens a transaction.
pub(crate) const OPEN_PATH: &str = sqlhttp_protocol::path::TRANSACTION_OPEN;
/// Runs one statement in a transaction.
pub(crate) const STATEMENT_PATH: &str = sqlhttp_protocol::path::TRANSACTION_STATEMENT;
/// Commits a transaction.
pub(crate) const COMMIT_PATH: &str = sqlhttp_protocol::path::TRANSACTION_COMMIT;
/// Rolls a transaction back.
pub(crate) const ROLLBACK_PATH: &str = sqlhttp_protocol::path::TRANSACTION_ROLLBACK;
/// Tells how a transaction stands.
pub(crate) const OUTCOME_PATH: &str = sqlhttp_protocol::path::TRANSACTION_OUTCOME;

/// Longest token accepted (the server's are 41 characters).
const MAX_TOKEN_LEN: usize = 128;

/// What a request for another process's transaction is answered when that process is alive
/// but did not answer (see `peers::Forwarded::Unknown`).
#[derive(Debug, Clone, Copy)]
enum Unanswered {
    /// A statement or a rollback: send it again (each step is safe to send again).
    Retry,
    /// A COMMIT: whether it committed is unknown (the holder may still commit it).
    Commit,
    /// The outcome: `"unknown"`.
    Outcome,
}

impl Unanswered {
    fn response(self) -> Response {
        match self {
            Unanswered::Retry => ApiError::unavailable(
                "the server that holds this transaction did not answer; send the request again \
                 (each step of a transaction is safe to send again)",
            )
            .into_response(),
            Unanswered::Commit => ApiError::outcome_unknown(
                "the server that holds this transaction did not answer, and it may still commit \
                 it: send the COMMIT again, or ask the transaction's outcome",
            )
            .into_response(),
            Unanswered::Outcome => outcome_response(
                Outcome::fresh(crate::protocol::transaction::outcome(
                    crate::protocol::transaction::Outcome::Unknown,
                )),
                Held::default(),
            ),
        }
    }
}

/// Answers `here` unless the request goes to the process that holds its transaction (see
/// `peers`): that one's answer, or, when it is alive but did not answer, `unanswered`'s.
#[allow(clippy::too_many_arguments)]
async fn forwarded_or(
    shared: &Shared,
    headers: &HeaderMap,
    credential: &Credential,
    token: &str,
    path: &str,
    bytes: axum::body::Bytes,
    unanswered: Unanswered,
    here: impl Future<Output = Result<Answer, ApiError>>,
) -> Response {
    let Some(holder) = shared.transactions.held_elsewhere(token) else {
        return respond(here.await);
    };
    match peers::forward(shared, headers, credential, holder, path, bytes).await {
        Forwarded::Answer(answer) => answer,
        Forwarded::Here => respond(here.await),
        Forwarded::Unknown => unanswered.response(),
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
    const READS_AT: bool = true;

    fn limit(shared: &Shared) -> usize {
        shared.max_body_bytes
    }

    fn admit(bytes: &[u8], _: &Shared, access: Access) -> Result<Self, ApiError> {
        object(bytes, "the body must be a JSON object")?;
        let wire: TransactionOpenRequest = serde_json::from_slice(bytes).map_err(|e| {
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
        if access == Access::ReadOnly && !options.read_only {
            return Err(refuse_write(
                "it may open read-only transactions only (\"read_only\": true)",
            ));
        }
        Ok(OpenRequest(options))
    }
}

impl Admissible for StepRequest {
    fn limit(shared: &Shared) -> usize {
        shared.max_body_bytes
    }

    fn admit(bytes: &[u8], shared: &Shared, _: Access) -> Result<Self, ApiError> {
        #[derive(Deserialize)]
        struct Wire {
            transaction: Option<String>,
            seq: Option<Box<RawValue>>,
        }
        let request = SqlRequest::parse(bytes)?;
        super::admit::has_text(&request.sql)?;
        let wire: Wire = serde_json::from_slice(bytes).map_err(|e| {
            ApiError::bad_request(format!(
                "`transaction` must be a string and `seq` a positive integer: {e}"
            ))
        })?;
        let token = token_of(wire.transaction)?;
        // At most 2^53 - 1, the largest integer every JSON reader holds exactly (the document's
        // bound). Any spelling of an integer is one (`3.0`), as JSON Schema reads it.
        const MAX_SEQ: u64 = (1 << 53) - 1;
        let seq = wire
            .seq
            .as_deref()
            .map(RawValue::get)
            .and_then(exact_unsigned);
        let seq = match seq {
            Some(seq) if seq > 0 && seq <= MAX_SEQ => seq,
            _ => {
                return Err(ApiError::bad_request(
                    "`seq` (the statement's number in the transaction, an integer from 1 to 2^53 - 1) is missing, not an integer, or out of range",
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

    fn admit(bytes: &[u8], _: &Shared, _: Access) -> Result<Self, ApiError> {
        object(bytes, "the body must be a JSON object")?;
        // `Option`: a missing token is refused by name (`token_of`).
        let wire: TransactionNamed<Option<String>> = serde_json::from_slice(bytes)
            .map_err(|e| ApiError::bad_request(format!("`transaction` must be a string: {e}")))?;
        token_of(wire.transaction).map(Named)
    }
}

/// A transaction's owner: the credential's identity, which does not move when other tokens
/// are added or revoked (never the token itself, never its position: see `Identity`).
fn owner(credential: &Credential) -> String {
    credential.identity.to_string()
}

/// The response for the registry's answer: its body (a stored result's is shared with its
/// replays, not copied) holds its shares of the server's budget until it has been sent.
fn respond(result: Result<Answer, ApiError>) -> Response {
    match result {
        Ok(answer) => crate::http::whole_response(
            answer.status,
            answer.body,
            answer.replayed,
            answer.position,
            answer.held,
        ),
        Err(err) => err.into_response(),
    }
}

pub(crate) async fn open(
    State(state): State<AppState>,
    admitted: Admitted<OpenRequest>,
) -> Response {
    let at = admitted.at;
    let shared = &state.inner;
    let key = admitted.key.map(|(_, key)| key);
    let OpenRequest(options) = admitted.body;
    crate::transactions::peers::advertise(&shared.peers, &shared.transactions).await;
    respond(
        shared
            .transactions
            .open(&owner(&admitted.credential), key, options, at)
            .await
            .map(Answer::from),
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
    let here = shared.transactions.step(&owner, &token, seq, request);
    forwarded_or(
        shared,
        &headers,
        &admitted.credential,
        &token,
        STATEMENT_PATH,
        admitted.bytes,
        Unanswered::Retry,
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
    // A process the others may soon take for dead commits nothing it holds (see `peers`).
    if shared.transactions.held_elsewhere(&token).is_none() && !shared.peers.fit_to_commit() {
        tracing::warn!(
            "this process's heartbeat is not being stored: its open transactions are rolled \
             back rather than committed"
        );
        shared.transactions.expire_all().await;
    }
    let here = shared.transactions.commit(&owner, &token);
    forwarded_or(
        shared,
        &headers,
        &admitted.credential,
        &token,
        COMMIT_PATH,
        admitted.bytes,
        Unanswered::Commit,
        here,
    )
    .await
}

pub(crate) async fn rollback(
    State(state): State<AppState>,
    headers: HeaderMap,
    admitted: Admitted<Named>,
) -> Response {
    let shared = &state.inner;
    let (owner, token) = (owner(&admitted.credential), admitted.body.0);
    let here = shared.transactions.rollback(&owner, &token);
    forwarded_or(
        shared,
        &headers,
        &admitted.credential,
        &token,
        ROLLBACK_PATH,
        admitted.bytes,
        Unanswered::Retry,
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
    let here = shared.transactions.outcome(&owner, &token);
    forwarded_or(
        shared,
        &headers,
        &admitted.credential,
        &token,
        OUTCOME_PATH,
        admitted.bytes,
        Unanswered::Outcome,
        here,
    )
    .await
}
