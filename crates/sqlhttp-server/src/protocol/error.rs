//! The server's protocol error, [`ApiError`]: a code of the protocol crate's table
//! ([`ErrorCode`], with its status and `Retry-After`) with a message, rendered as the protocol's
//! `ErrorBody` (`{"error": {"code": "...", "message": "..."}}`) and answered by axum.
//!
//! This module adapts the protocol's error shapes to axum and defines none of them; it does not
//! know which engine or handler produced an error.

use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sqlhttp_protocol::body::{ErrorBody, ErrorObject};

/// The error table ([`ErrorCode`]: code, status, `Retry-After`) and the constraint names are the
/// protocol crate's; the server's name for the constraint kind is kept.
pub(crate) use sqlhttp_protocol::{Constraint as ConstraintKind, ErrorCode};

/// The HTTP status of a code, as `http`'s type.
pub(crate) fn status_of(code: ErrorCode) -> StatusCode {
    // Every status in the table is a valid one (the protocol crate's tests hold it to 4xx/5xx).
    StatusCode::from_u16(code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// A protocol error: a code from the table and a human-readable message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub(crate) code: ErrorCode,
    pub(crate) message: String,
    /// The constraint that refused a write, on `CONSTRAINT_VIOLATION`.
    pub(crate) constraint: Option<ConstraintKind>,
    /// The engine interrupted the statement; the engine decides why (timeout, cancellation,
    /// shutdown) and replaces this error.
    pub(crate) interrupted: bool,
    /// In a batch: the zero-based index of the statement that failed, reported as `"statement"`.
    pub(crate) statement: Option<usize>,
    /// Where it ran could not serve it (a read replica down, behind, or refusing what only a
    /// primary runs), before any of its answer left: the engine may run it elsewhere. Set by
    /// the engine where the failure happened ([`ApiError::elsewhere`]); never rendered.
    pub(crate) elsewhere: bool,
    /// Value of the `Allow` header on a 405.
    allow: &'static str,
    /// Whether the answer carries `Retry-After: 1`: the code's rule
    /// ([`ErrorCode::sends_retry_after`]), except for an [`outage`](Self::outage), which has none.
    retry_after: bool,
}

/// The message of every `INTERNAL` error: details go to the server log, never to the client.
pub(crate) const INTERNAL_MESSAGE: &str = "internal server error";

impl ApiError {
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            constraint: None,
            interrupted: false,
            statement: None,
            elsewhere: false,
            allow: "POST",
            retry_after: code.sends_retry_after(),
        }
    }

    /// The same error, naming the batch statement it belongs to.
    pub(crate) fn at_statement(self, index: usize) -> Self {
        ApiError {
            statement: Some(index),
            ..self
        }
    }

    /// The same error, marked as the failure of where it ran, which another place may not
    /// share (see the field).
    pub(crate) fn elsewhere(self) -> Self {
        ApiError {
            elsewhere: true,
            ..self
        }
    }

    pub(crate) fn constraint(kind: Option<ConstraintKind>, message: impl Into<String>) -> Self {
        ApiError {
            constraint: kind,
            ..Self::new(ErrorCode::ConstraintViolation, message)
        }
    }

    /// The engine interrupted the statement; the engine replaces this with the reason.
    /// The same error with `hint` after its message (what the client should do instead).
    pub(crate) fn with_hint(mut self, hint: &str) -> Self {
        self.message = format!("{}; {hint}", self.message);
        self
    }

    /// A row whose JSON alone is larger than `limit` (`--max-result-bytes`), row `row` counted
    /// from 1: the same words on every engine.
    pub(crate) fn row_too_large(limit: usize, row: u64) -> Self {
        Self::new(
            ErrorCode::ResultTooLarge,
            format!(
                "row {row} is larger than this server's limit of {limit} bytes for one row \
                 (--max-result-bytes); select fewer or smaller columns"
            ),
        )
    }

    pub(crate) fn interrupted() -> Self {
        ApiError {
            interrupted: true,
            ..Self::unavailable("the statement was interrupted")
        }
    }

    pub(crate) fn not_allowed(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::StatementNotAllowed, message)
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::BadRequest, message)
    }

    pub(crate) fn sql(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::SqlError, message)
    }

    pub(crate) fn internal() -> Self {
        Self::new(ErrorCode::Internal, INTERNAL_MESSAGE)
    }

    /// `503 UNAVAILABLE` with `Retry-After: 1`: the server sheds load (a queue or a pool is
    /// full, a lock or a bound is held) and a retry soon is welcome. Clients read a `503` with
    /// `Retry-After` as a throttle (the SDK's cheaper retry, its adaptive rate's signal).
    pub(crate) fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unavailable, message)
    }

    /// `503 UNAVAILABLE` without `Retry-After`: an outage (the database lost or unreachable, the
    /// server or a replica going away), not load; a client retries it as a failure, not as a
    /// throttle.
    pub(crate) fn outage(message: impl Into<String>) -> Self {
        ApiError {
            retry_after: false,
            ..Self::unavailable(message)
        }
    }

    /// The server cannot know whether the write took effect (see [`ErrorCode::OutcomeUnknown`]).
    pub(crate) fn outcome_unknown(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::OutcomeUnknown, message)
    }

    pub(crate) fn method_not_allowed(allow: &'static str) -> Self {
        ApiError {
            allow,
            ..Self::new(
                ErrorCode::MethodNotAllowed,
                format!("method not allowed; this resource accepts {allow}"),
            )
        }
    }

    /// The JSON error body.
    pub(crate) fn body(&self) -> Vec<u8> {
        let envelope = ErrorBody {
            error: ErrorObject {
                code: self.code.as_str(),
                message: &self.message,
                constraint: self.constraint.map(ConstraintKind::as_str),
                statement: self.statement,
            },
        };
        // Serializing two strings into a Vec cannot fail.
        serde_json::to_vec(&envelope).unwrap_or_default()
    }
}

/// A JSON response with the given status and body bytes.
pub(crate) fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = json_response(status_of(self.code), self.body());
        let headers = response.headers_mut();
        let extra: Option<(HeaderName, &'static str)> = match self.code {
            ErrorCode::Unauthorized => Some((header::WWW_AUTHENTICATE, "Bearer")),
            ErrorCode::MethodNotAllowed => Some((header::ALLOW, self.allow)),
            _ if self.retry_after => Some((header::RETRY_AFTER, "1")),
            _ => None,
        };
        if let Some((name, value)) = extra {
            headers.insert(name, HeaderValue::from_static(value));
        }
        // For the request log and the metrics, which see responses, not errors.
        response.extensions_mut().insert(self.code);
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_the_protocol_shape() {
        let body = ApiError::sql("no such table: t").body();
        let typed: ErrorBody = serde_json::from_slice(&body).unwrap();
        assert_eq!(typed.error.code, ErrorCode::SqlError.as_str());
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"error":{"code":"SQL_ERROR","message":"no such table: t"}}"#
        );
    }

    #[test]
    fn statuses_and_headers_follow_the_table() {
        for &code in ErrorCode::ALL {
            let response = ApiError::new(code, "m").into_response();
            assert_eq!(response.status().as_u16(), code.status(), "{code:?}");
            assert_eq!(
                response.headers()[header::CONTENT_TYPE],
                "application/json",
                "{code:?}"
            );
            assert_eq!(
                response
                    .headers()
                    .get(header::RETRY_AFTER)
                    .map(|v| v.as_bytes()),
                code.sends_retry_after().then_some(&b"1"[..]),
                "{code:?}"
            );
            assert_eq!(response.extensions().get::<ErrorCode>(), Some(&code));
        }
        let outage = ApiError::outage("the database cannot be reached").into_response();
        assert_eq!(outage.status().as_u16(), 503);
        assert!(outage.headers().get(header::RETRY_AFTER).is_none());
        let response = ApiError::new(ErrorCode::Unauthorized, "m").into_response();
        assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
        let response = ApiError::method_not_allowed("POST").into_response();
        assert_eq!(response.headers()[header::ALLOW], "POST");
    }

    #[test]
    fn a_constraint_violation_names_its_kind() {
        let body = ApiError::constraint(
            Some(ConstraintKind::Unique),
            "UNIQUE constraint failed: t.x",
        )
        .body();
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"error":{"code":"CONSTRAINT_VIOLATION","message":"UNIQUE constraint failed: t.x","constraint":"unique"}}"#
        );
    }

    #[test]
    fn a_batch_error_names_its_statement() {
        let body = ApiError::constraint(Some(ConstraintKind::Check), "CHECK constraint failed")
            .at_statement(2)
            .body();
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"error":{"code":"CONSTRAINT_VIOLATION","message":"CHECK constraint failed","constraint":"check","statement":2}}"#
        );
    }

    #[test]
    fn only_statement_verdicts_are_stored() {
        assert!(ErrorCode::StatementNotAllowed.is_stored_outcome());
        assert!(!ErrorCode::StatementTimeout.is_stored_outcome());
        assert!(!ErrorCode::ResultTooLarge.is_stored_outcome());
        assert!(ErrorCode::SqlError.is_stored_outcome());
        assert!(ErrorCode::ConstraintViolation.is_stored_outcome());
        assert!(!ErrorCode::Unavailable.is_stored_outcome());
        assert!(!ErrorCode::OutcomeUnknown.is_stored_outcome());
        assert!(!ErrorCode::Internal.is_stored_outcome());
        assert!(!ErrorCode::BadRequest.is_stored_outcome());
    }
}
