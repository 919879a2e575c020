//! Turning what came back from one HTTP exchange into an [`ErrorKind`]: a non-success response (status,
//! headers and the protocol's `{"error": {"code", "message"}}` body) or a failure of the HTTP stack.
//! [`Failure`], one failed attempt as the exchange and the receivers report it, lives here beside the
//! mapping that builds it.
//!
//! It decides what a failure *is*, never whether to retry it (that is `retry::classify`). It knows
//! nothing of the transport: the transport uses this mapping, never the other way round.

use std::error::Error as _;
use std::time::SystemTime;

use sqlhttp_protocol::body::member;
use sqlhttp_protocol::{ErrorCode, header};

use crate::error::{BoxError, ConstraintKind, Error, ErrorKind};
use crate::retry::retry_after;

/// One failed attempt: what it was, whether the request may have reached the server, and the error
/// of the HTTP stack behind it.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) kind: ErrorKind,
    /// `false` only when nothing can have reached the server (the connection was never made).
    pub(crate) sent: bool,
    pub(crate) source: Option<BoxError>,
    /// For a batch: the statement the server's error names (its body's `statement` member).
    pub(crate) statement: Option<usize>,
    /// The server's `X-Request-Id`, when a response carried a sane one.
    pub(crate) request_id: Option<String>,
}

/// A failure known only by its kind (a response, a timeout) may have reached the server.
impl From<ErrorKind> for Failure {
    fn from(kind: ErrorKind) -> Self {
        Failure {
            kind,
            sent: true,
            source: None,
            statement: None,
            request_id: None,
        }
    }
}

/// An error met while taking a success body (a row that does not decode, an `error` member ending
/// the stream) fails the attempt with its kind, source, statement and request id.
impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        let statement = err.statement_index();
        let request_id = err.request_id().map(str::to_owned);
        let (kind, source) = err.into_parts();
        Failure {
            kind,
            sent: true,
            source,
            statement,
            request_id,
        }
    }
}

/// The members of an error body's `error` object ([`sqlhttp_protocol::body::ErrorObject`]), read
/// leniently: the body may be a gateway's or a later version's, so a member that is missing or
/// of another type costs that member, never the rest of the body. The names are the protocol
/// crate's.
struct ErrorMembers(serde_json::Map<String, serde_json::Value>);

impl ErrorMembers {
    /// The `error` object of a whole body, if it has one.
    fn of_body(body: &[u8]) -> Option<ErrorMembers> {
        match serde_json::from_slice::<serde_json::Value>(body).ok()? {
            serde_json::Value::Object(mut envelope) => {
                Self::of_value(envelope.remove(member::ERROR)?)
            }
            _ => None,
        }
    }

    /// An `error` object as it stands (the member that ends a streamed body).
    fn of_value(error: serde_json::Value) -> Option<ErrorMembers> {
        match error {
            serde_json::Value::Object(members) => Some(ErrorMembers(members)),
            _ => None,
        }
    }

    fn text(&mut self, name: &str) -> Option<String> {
        match self.0.remove(name)? {
            serde_json::Value::String(text) => Some(text),
            _ => None,
        }
    }
}

/// Maps a non-success response to the kind a caller branches on.
pub(crate) fn from_status(status: u16, headers: &http::HeaderMap, body: &[u8]) -> ErrorKind {
    let (code, message, constraint) = match ErrorMembers::of_body(body) {
        Some(mut error) => (
            error.text(member::CODE),
            error
                .text(member::MESSAGE)
                .unwrap_or_else(|| reason(status)),
            error.text(member::CONSTRAINT),
        ),
        None => (None, reason(status), None),
    };
    let wait = || retry_after::from_headers(headers, SystemTime::now());
    // A known code is taken only with the status the protocol's table gives it.
    let known = code
        .as_deref()
        .and_then(|code| code.parse::<ErrorCode>().ok())
        .filter(|known| known.status() == status);
    match (status, known) {
        (_, Some(ErrorCode::SqlError)) => ErrorKind::Sql {
            code: ErrorCode::SqlError.as_str().to_owned(),
            message,
        },
        (401, _) => ErrorKind::Unauthorized { message },
        (_, Some(ErrorCode::StatementNotAllowed)) => ErrorKind::StatementNotAllowed { message },
        (_, Some(ErrorCode::ReadOnly)) => ErrorKind::ReadOnly { message },
        (_, Some(lost @ (ErrorCode::TransactionExpired | ErrorCode::TransactionAborted))) => {
            ErrorKind::TransactionLost {
                code: lost.as_str().to_owned(),
                message,
            }
        }
        (_, Some(ErrorCode::TransactionFinished | ErrorCode::TransactionStepOutOfOrder)) => {
            ErrorKind::Http {
                status,
                code,
                message,
            }
        }
        (_, Some(ErrorCode::BookmarkAhead)) => ErrorKind::BookmarkAhead { message },
        (_, Some(ErrorCode::IdempotencyKeyInUse)) => ErrorKind::IdempotencyKeyInUse {
            retry_after: wait(),
            message,
        },
        (409, _) => ErrorKind::ConstraintViolation {
            constraint: constraint.as_deref().map(ConstraintKind::from_wire),
            message,
        },
        (413, _) => ErrorKind::PayloadTooLarge { message },
        (_, Some(ErrorCode::StatementTimeout)) => ErrorKind::StatementTimeout { message },
        (429, _) => ErrorKind::RateLimited {
            retry_after: wait(),
            message,
        },
        (_, Some(ErrorCode::OutcomeUnknown)) => ErrorKind::OutcomeUnknown {
            retry_after: wait(),
            message,
        },
        (503, _) => ErrorKind::Unavailable {
            retry_after: wait(),
            message,
        },
        _ => ErrorKind::Http {
            status,
            code,
            message,
        },
    }
}

/// Longest `X-Request-Id` the SDK keeps; a longer or stranger one is ignored.
const MAX_REQUEST_ID: usize = header::MAX_REQUEST_ID_BYTES;

/// The server's `X-Request-Id`, when it is one header of 1 to 128 visible ASCII characters (safe
/// to log and to show).
pub(crate) fn request_id(headers: &http::HeaderMap) -> Option<String> {
    let mut values = headers.get_all(header::REQUEST_ID).iter();
    let value = values.next()?;
    let bytes = value.as_bytes();
    let sane = values.next().is_none()
        && !bytes.is_empty()
        && bytes.len() <= MAX_REQUEST_ID
        && bytes.iter().all(|b| (0x21..=0x7e).contains(b));
    sane.then(|| String::from_utf8_lossy(bytes).into_owned())
}

/// Maps the `error` member that ends a streamed body (the status was `200` before the failure) to
/// the kind the same error would have as a response of its own: its code decides the status.
pub(crate) fn from_body_error(raw_error: &str) -> ErrorKind {
    let code = serde_json::from_str(raw_error)
        .ok()
        .and_then(ErrorMembers::of_value)
        .and_then(|mut error| error.text(member::CODE));
    // Each code's status is the protocol's; a code this version does not know is a server failure.
    let status = code
        .as_deref()
        .and_then(|code| code.parse::<ErrorCode>().ok())
        .map_or(500, ErrorCode::status);
    let envelope = format!("{{\"{}\":{raw_error}}}", member::ERROR);
    from_status(status, &http::HeaderMap::new(), envelope.as_bytes())
}

fn reason(status: u16) -> String {
    http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("unexpected status")
        .to_owned()
}

/// Maps a failure of the HTTP stack (no usable response) to a failure that keeps the error as its
/// source. A failure to connect (refused, DNS, TLS handshake, the connect timeout) sent nothing.
pub(crate) fn from_transport(err: reqwest::Error) -> Failure {
    // The server's origin names where the failure was (never the path, nor a query).
    let origin = err.url().map(|url| url.origin().ascii_serialization());
    let err = err.without_url();
    let message = describe(&err);
    let sent = !err.is_connect();
    let kind = if is_certificate_failure(&err) {
        ErrorKind::Tls { message }
    } else if is_plain_http_answer(&err) {
        // A TLS handshake answered in plain HTTP: the same URL fails the same way every time.
        ErrorKind::Tls {
            message: format!(
                "{message}; is the server at {} speaking HTTPS? (a plain-HTTP server needs an \
                 http:// URL)",
                origin.as_deref().unwrap_or("the base URL")
            ),
        }
    } else if err.is_timeout() {
        // The connect timeout, or a timeout configured on a caller-supplied reqwest client; the
        // attempt's own is applied around the exchange. The loop fills in how long it took.
        ErrorKind::Timeout {
            after: std::time::Duration::ZERO,
        }
    } else if err.is_builder() || err.is_redirect() {
        // A redirect policy on a caller-supplied client gave up: the same request will again.
        ErrorKind::Config { message }
    } else {
        ErrorKind::Connection {
            message: match origin {
                Some(origin) => format!("{origin}: {message}"),
                None => message,
            },
        }
    };
    Failure {
        kind,
        sent,
        source: Some(Box::new(err)),
        statement: None,
        request_id: None,
    }
}

/// The failure for a non-success response, with the batch statement its body names and the
/// server's request id, if any.
pub(crate) fn failure_from_status(status: u16, headers: &http::HeaderMap, body: &[u8]) -> Failure {
    let kind = from_status(status, headers, body);
    Failure {
        statement: statement_index(body),
        request_id: request_id(headers),
        ..kind.into()
    }
}

/// The zero-based index of the batch statement an error body names (`error.statement`).
fn statement_index(body: &[u8]) -> Option<usize> {
    ErrorMembers::of_body(body)?
        .0
        .get(member::STATEMENT)?
        .as_u64()
        .and_then(|index| usize::try_from(index).ok())
}

/// The error and its causes on one line, so "connection refused" is not hidden behind "error sending
/// request". The URL is left out: it is in the client's configuration already.
fn describe(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// A TLS certificate problem will not go away on retry. reqwest does not expose the TLS stack's error
/// types unless we depend on that stack directly, so the cause chain is inspected by its text.
/// Whether the TLS stack read a plain-HTTP answer where a handshake record belongs (rustls:
/// "received corrupt message of type InvalidContentType"; OpenSSL: "wrong version number").
fn is_plain_http_answer(err: &reqwest::Error) -> bool {
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if text.contains("InvalidContentType") || text.contains("wrong version number") {
            return true;
        }
        source = cause.source();
    }
    false
}

fn is_certificate_failure(err: &reqwest::Error) -> bool {
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string().to_ascii_lowercase();
        if text.contains("certificate") {
            return true;
        }
        source = cause.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn only_sane_request_ids_are_kept() {
        let with = |values: &[&[u8]]| {
            let mut headers = http::HeaderMap::new();
            for value in values {
                headers.append(
                    "x-request-id",
                    http::HeaderValue::from_bytes(value).unwrap(),
                );
            }
            request_id(&headers)
        };
        assert_eq!(with(&[b"abc-123"]).as_deref(), Some("abc-123"));
        assert!(with(&[&[b'a'; 128]]).is_some());
        assert_eq!(with(&[]), None);
        assert_eq!(with(&[&[b'a'; 129]]), None);
        assert_eq!(with(&[b""]), None);
        assert_eq!(with(&[b"two words"]), None);
        assert_eq!(with(&[b"caf\xc3\xa9"]), None);
        assert_eq!(with(&[b"a", b"b"]), None);
    }

    fn body(code: &str, message: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({"error": {"code": code, "message": message}}))
            .unwrap()
    }

    #[test]
    fn maps_protocol_errors() {
        let h = http::HeaderMap::new();
        assert_eq!(
            from_status(400, &h, &body("SQL_ERROR", "near \"SELEC\": syntax error")),
            ErrorKind::Sql {
                code: "SQL_ERROR".into(),
                message: "near \"SELEC\": syntax error".into()
            }
        );
        assert_eq!(
            from_status(400, &h, &body("BAD_REQUEST", "sql missing")),
            ErrorKind::Http {
                status: 400,
                code: Some("BAD_REQUEST".into()),
                message: "sql missing".into()
            }
        );
        assert_eq!(
            from_status(401, &h, &body("UNAUTHORIZED", "no")),
            ErrorKind::Unauthorized {
                message: "no".into()
            }
        );
        assert_eq!(
            from_status(409, &h, &body("CONSTRAINT_VIOLATION", "UNIQUE")),
            ErrorKind::ConstraintViolation {
                constraint: None,
                message: "UNIQUE".into()
            }
        );
        assert_eq!(
            from_status(409, &h, &body("IDEMPOTENCY_KEY_IN_USE", "busy")),
            ErrorKind::IdempotencyKeyInUse {
                retry_after: None,
                message: "busy".into()
            }
        );
        assert_eq!(
            from_status(
                403,
                &h,
                &body("STATEMENT_NOT_ALLOWED", "ATTACH is not allowed")
            ),
            ErrorKind::StatementNotAllowed {
                message: "ATTACH is not allowed".into()
            }
        );
        assert_eq!(
            from_status(403, &h, &body("READ_ONLY", "the statement writes")),
            ErrorKind::ReadOnly {
                message: "the statement writes".into()
            }
        );
        assert_eq!(
            from_status(
                422,
                &h,
                &body("STATEMENT_TIMEOUT", "interrupted after 30 s")
            ),
            ErrorKind::StatementTimeout {
                message: "interrupted after 30 s".into()
            }
        );
        for (status, code) in [
            (403, "ORIGIN_NOT_ALLOWED"),
            (408, "REQUEST_TIMEOUT"),
            (415, "UNSUPPORTED_MEDIA_TYPE"),
            (422, "IDEMPOTENCY_KEY_REUSED"),
            (431, "HEADERS_TOO_LARGE"),
        ] {
            assert_eq!(
                from_status(status, &h, &body(code, "no")),
                ErrorKind::Http {
                    status,
                    code: Some(code.into()),
                    message: "no".into()
                }
            );
        }
        assert_eq!(
            from_status(
                503,
                &h,
                &body("OUTCOME_UNKNOWN", "the COMMIT did not answer")
            ),
            ErrorKind::OutcomeUnknown {
                retry_after: None,
                message: "the COMMIT did not answer".into()
            }
        );
        assert_eq!(
            from_status(503, &h, &body("UNAVAILABLE", "busy")),
            ErrorKind::Unavailable {
                retry_after: None,
                message: "busy".into()
            }
        );
        assert_eq!(
            from_status(409, &h, &body("BOOKMARK_AHEAD", "past the primary")),
            ErrorKind::BookmarkAhead {
                message: "past the primary".into()
            }
        );
        assert_eq!(
            from_status(413, &h, &body("PAYLOAD_TOO_LARGE", "big")),
            ErrorKind::PayloadTooLarge {
                message: "big".into()
            }
        );
        assert_eq!(
            from_status(501, &h, b"<html>nope</html>"),
            ErrorKind::Http {
                status: 501,
                code: None,
                message: "Not Implemented".into()
            }
        );
    }

    #[test]
    fn reads_the_constraint_kind_and_keeps_unknown_ones() {
        let h = http::HeaderMap::new();
        let violation = |constraint: serde_json::Value| {
            let body = serde_json::json!({"error": {
                "code": "CONSTRAINT_VIOLATION",
                "message": "UNIQUE constraint failed: t.x",
                "constraint": constraint,
            }});
            match from_status(409, &h, &serde_json::to_vec(&body).unwrap()) {
                ErrorKind::ConstraintViolation { constraint, .. } => constraint,
                other => panic!("{other:?}"),
            }
        };
        for (wire, kind) in [
            ("unique", ConstraintKind::Unique),
            ("primary_key", ConstraintKind::PrimaryKey),
            ("foreign_key", ConstraintKind::ForeignKey),
            ("check", ConstraintKind::Check),
            ("not_null", ConstraintKind::NotNull),
            ("exclusion", ConstraintKind::Other("exclusion".into())),
        ] {
            assert_eq!(violation(wire.into()), Some(kind.clone()), "{wire}");
            assert_eq!(kind.as_str(), wire);
        }
        assert_eq!(violation(serde_json::Value::Null), None);
        // A member of the wrong type costs the kind, not the error.
        assert_eq!(
            from_status(
                409,
                &h,
                br#"{"error":{"code":"CONSTRAINT_VIOLATION","message":"m","constraint":7}}"#
            ),
            ErrorKind::ConstraintViolation {
                constraint: None,
                message: "m".into()
            }
        );
    }

    #[test]
    fn an_error_ending_a_streamed_body_maps_by_its_code() {
        assert_eq!(
            from_body_error(r#"{"code":"SQL_ERROR","message":"integer overflow"}"#),
            ErrorKind::Sql {
                code: "SQL_ERROR".into(),
                message: "integer overflow".into()
            }
        );
        assert!(matches!(
            from_body_error(r#"{"code":"STATEMENT_TIMEOUT","message":"m"}"#),
            ErrorKind::StatementTimeout { .. }
        ));
        assert!(matches!(
            from_body_error(r#"{"code":"UNAVAILABLE","message":"m"}"#),
            ErrorKind::Unavailable {
                retry_after: None,
                ..
            }
        ));
        assert!(matches!(
            from_body_error(r#"{"code":"OUTCOME_UNKNOWN","message":"m"}"#),
            ErrorKind::OutcomeUnknown { .. }
        ));
        assert!(matches!(
            from_body_error(r#"{"code":"BOOKMARK_AHEAD","message":"m"}"#),
            ErrorKind::BookmarkAhead { .. }
        ));
        assert!(matches!(
            from_body_error(r#"{"code":"INTERNAL","message":"m"}"#),
            ErrorKind::Http { status: 500, .. }
        ));
    }

    #[test]
    fn keeps_the_servers_wait() {
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("3"),
        );
        assert_eq!(
            from_status(429, &h, &body("RATE_LIMITED", "slow down")),
            ErrorKind::RateLimited {
                retry_after: Some(Duration::from_secs(3)),
                message: "slow down".into()
            }
        );
        assert_eq!(
            from_status(503, &h, b""),
            ErrorKind::Unavailable {
                retry_after: Some(Duration::from_secs(3)),
                message: "Service Unavailable".into()
            }
        );
        assert_eq!(
            from_status(409, &h, &body("IDEMPOTENCY_KEY_IN_USE", "running")),
            ErrorKind::IdempotencyKeyInUse {
                retry_after: Some(Duration::from_secs(3)),
                message: "running".into()
            }
        );
        h.insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("soon"),
        );
        assert_eq!(
            from_status(503, &h, b""),
            ErrorKind::Unavailable {
                retry_after: None,
                message: "Service Unavailable".into()
            }
        );
    }
}
