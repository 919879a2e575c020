//! The wire protocol's error table: [`ErrorCode`] (code, status, extra headers) and [`ApiError`],
//! rendered as `{"error": {"code": "...", "message": "..."}}`.
//!
//! This module knows the protocol's error shapes only; it does not know which engine or handler
//! produced them.

use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// One row of the protocol's error table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorCode {
    BadRequest,
    SqlError,
    Unauthorized,
    NotFound,
    MethodNotAllowed,
    ConstraintViolation,
    IdempotencyKeyInUse,
    PayloadTooLarge,
    IdempotencyKeyReused,
    Internal,
    Unavailable,
    StatementNotAllowed,
    OriginNotAllowed,
    UnsupportedMediaType,
    RequestTimeout,
    UriTooLong,
    HeadersTooLarge,
    StatementTimeout,
    ResultTooLarge,
    ReadOnly,
    RateLimited,
    /// An interactive transaction was rolled back by the server (idle, too old, its server gone):
    /// final, nothing of it was committed.
    TransactionExpired,
    /// An interactive transaction cannot go on (a serialization failure, a deadlock, its
    /// connection lost): it was rolled back, nothing of it was committed; run it again.
    TransactionAborted,
    /// A transaction's statement carries a sequence number other than the next one (or the
    /// last one, which replays).
    TransactionStepOutOfOrder,
    /// The transaction has ended (committed, or rolled back by its client): nothing more runs in it.
    TransactionFinished,
    /// The server cannot know whether a write (or a COMMIT) took effect: the database did not
    /// answer it in time, or the process holding the transaction cannot be reached. Unlike
    /// `UNAVAILABLE` (nothing ran), a keyed write or a COMMIT sent again tells (or the
    /// transaction's outcome, asked for).
    OutcomeUnknown,
    /// The request's `Sqlhttp-Bookmark` is past everything the primary has written: a bookmark
    /// from another cluster, or from before a failover. Nothing ran; drop the bookmark.
    BookmarkAhead,
}

/// Which constraint refused a write, reported as `"constraint"` in a `409 CONSTRAINT_VIOLATION`
/// body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConstraintKind {
    Unique,
    PrimaryKey,
    ForeignKey,
    Check,
    NotNull,
    /// A PostgreSQL exclusion constraint.
    Exclusion,
}

impl ConstraintKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ConstraintKind::Unique => "unique",
            ConstraintKind::PrimaryKey => "primary_key",
            ConstraintKind::ForeignKey => "foreign_key",
            ConstraintKind::Check => "check",
            ConstraintKind::NotNull => "not_null",
            ConstraintKind::Exclusion => "exclusion",
        }
    }
}

impl ErrorCode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "BAD_REQUEST",
            ErrorCode::SqlError => "SQL_ERROR",
            ErrorCode::Unauthorized => "UNAUTHORIZED",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::MethodNotAllowed => "METHOD_NOT_ALLOWED",
            ErrorCode::ConstraintViolation => "CONSTRAINT_VIOLATION",
            ErrorCode::IdempotencyKeyInUse => "IDEMPOTENCY_KEY_IN_USE",
            ErrorCode::PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            ErrorCode::IdempotencyKeyReused => "IDEMPOTENCY_KEY_REUSED",
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::Unavailable => "UNAVAILABLE",
            ErrorCode::StatementNotAllowed => "STATEMENT_NOT_ALLOWED",
            ErrorCode::OriginNotAllowed => "ORIGIN_NOT_ALLOWED",
            ErrorCode::UnsupportedMediaType => "UNSUPPORTED_MEDIA_TYPE",
            ErrorCode::RequestTimeout => "REQUEST_TIMEOUT",
            ErrorCode::UriTooLong => "URI_TOO_LONG",
            ErrorCode::HeadersTooLarge => "HEADERS_TOO_LARGE",
            ErrorCode::StatementTimeout => "STATEMENT_TIMEOUT",
            ErrorCode::ResultTooLarge => "RESULT_TOO_LARGE",
            ErrorCode::ReadOnly => "READ_ONLY",
            ErrorCode::RateLimited => "RATE_LIMITED",
            ErrorCode::TransactionExpired => "TRANSACTION_EXPIRED",
            ErrorCode::TransactionAborted => "TRANSACTION_ABORTED",
            ErrorCode::TransactionStepOutOfOrder => "TRANSACTION_STEP_OUT_OF_ORDER",
            ErrorCode::TransactionFinished => "TRANSACTION_FINISHED",
            ErrorCode::OutcomeUnknown => "OUTCOME_UNKNOWN",
            ErrorCode::BookmarkAhead => "BOOKMARK_AHEAD",
        }
    }

    pub(crate) fn status(self) -> StatusCode {
        match self {
            ErrorCode::BadRequest | ErrorCode::SqlError => StatusCode::BAD_REQUEST,
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::ConstraintViolation
            | ErrorCode::IdempotencyKeyInUse
            | ErrorCode::TransactionAborted
            | ErrorCode::TransactionStepOutOfOrder
            | ErrorCode::TransactionFinished
            | ErrorCode::BookmarkAhead => StatusCode::CONFLICT,
            ErrorCode::TransactionExpired => StatusCode::GONE,
            ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::IdempotencyKeyReused
            | ErrorCode::StatementTimeout
            | ErrorCode::ResultTooLarge => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Unavailable | ErrorCode::OutcomeUnknown => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::StatementNotAllowed | ErrorCode::OriginNotAllowed | ErrorCode::ReadOnly => {
                StatusCode::FORBIDDEN
            }
            ErrorCode::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ErrorCode::UriTooLong => StatusCode::URI_TOO_LONG,
            ErrorCode::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ErrorCode::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    /// Whether an outcome with this code is final, so an idempotent request stores it: the
    /// statement's own verdict, which a retry of the same body would get again. A statement
    /// timeout or an oversized result depends on load and limits, so it is not stored.
    pub(crate) fn is_stored_outcome(self) -> bool {
        matches!(
            self,
            ErrorCode::SqlError | ErrorCode::ConstraintViolation | ErrorCode::StatementNotAllowed
        )
    }
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
    /// Value of the `Allow` header on a 405.
    allow: &'static str,
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
            allow: "POST",
        }
    }

    /// The same error, naming the batch statement it belongs to.
    pub(crate) fn at_statement(self, index: usize) -> Self {
        ApiError {
            statement: Some(index),
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

    pub(crate) fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unavailable, message)
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
        #[derive(Serialize)]
        struct Envelope<'a> {
            error: Inner<'a>,
        }
        #[derive(Serialize)]
        struct Inner<'a> {
            code: &'a str,
            message: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            constraint: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            statement: Option<usize>,
        }
        let envelope = Envelope {
            error: Inner {
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
        let mut response = json_response(self.code.status(), self.body());
        let headers = response.headers_mut();
        let extra: Option<(HeaderName, &'static str)> = match self.code {
            ErrorCode::Unauthorized => Some((header::WWW_AUTHENTICATE, "Bearer")),
            ErrorCode::MethodNotAllowed => Some((header::ALLOW, self.allow)),
            ErrorCode::IdempotencyKeyInUse
            | ErrorCode::Unavailable
            | ErrorCode::OutcomeUnknown
            | ErrorCode::RateLimited => Some((header::RETRY_AFTER, "1")),
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
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"error":{"code":"SQL_ERROR","message":"no such table: t"}}"#
        );
    }

    #[test]
    fn statuses_and_headers_follow_the_table() {
        let cases = [
            (ErrorCode::BadRequest, 400, None),
            (ErrorCode::SqlError, 400, None),
            (
                ErrorCode::Unauthorized,
                401,
                Some(("www-authenticate", "Bearer")),
            ),
            (ErrorCode::NotFound, 404, None),
            (ErrorCode::MethodNotAllowed, 405, Some(("allow", "POST"))),
            (ErrorCode::ConstraintViolation, 409, None),
            (
                ErrorCode::IdempotencyKeyInUse,
                409,
                Some(("retry-after", "1")),
            ),
            (ErrorCode::PayloadTooLarge, 413, None),
            (ErrorCode::IdempotencyKeyReused, 422, None),
            (ErrorCode::Internal, 500, None),
            (ErrorCode::Unavailable, 503, Some(("retry-after", "1"))),
            (ErrorCode::StatementNotAllowed, 403, None),
            (ErrorCode::OriginNotAllowed, 403, None),
            (ErrorCode::UnsupportedMediaType, 415, None),
            (ErrorCode::RequestTimeout, 408, None),
            (ErrorCode::UriTooLong, 414, None),
            (ErrorCode::HeadersTooLarge, 431, None),
            (ErrorCode::StatementTimeout, 422, None),
            (ErrorCode::ResultTooLarge, 422, None),
            (ErrorCode::ReadOnly, 403, None),
            (ErrorCode::RateLimited, 429, Some(("retry-after", "1"))),
            (ErrorCode::TransactionExpired, 410, None),
            (ErrorCode::TransactionAborted, 409, None),
            (ErrorCode::TransactionStepOutOfOrder, 409, None),
            (ErrorCode::TransactionFinished, 409, None),
            (ErrorCode::OutcomeUnknown, 503, Some(("retry-after", "1"))),
            (ErrorCode::BookmarkAhead, 409, None),
        ];
        for (code, status, header) in cases {
            let response = ApiError::new(code, "m").into_response();
            assert_eq!(response.status().as_u16(), status, "{code:?}");
            assert_eq!(
                response.headers()[header::CONTENT_TYPE],
                "application/json",
                "{code:?}"
            );
            if let Some((name, value)) = header {
                assert_eq!(response.headers()[name], value, "{code:?}");
            }
            assert_eq!(response.extensions().get::<ErrorCode>(), Some(&code));
        }
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
