//! Turning what came back from one HTTP exchange into an [`ErrorKind`]: a non-success response (status,
//! headers and the protocol's `{"error": {"code", "message"}}` body) or a failure of the HTTP stack.
//!
//! It decides what a failure *is*, never whether to retry it (that is `retry::classify`).

use std::error::Error as _;
use std::time::SystemTime;

use serde::Deserialize;

use crate::error::ErrorKind;
use crate::retry::retry_after;

#[derive(Deserialize)]
struct ErrorEnvelope {
    error: ErrorBody,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// Maps a non-success response to the kind a caller branches on.
pub(crate) fn from_status(status: u16, headers: &http::HeaderMap, body: &[u8]) -> ErrorKind {
    let (code, message) = match serde_json::from_slice::<ErrorEnvelope>(body) {
        Ok(ErrorEnvelope { error }) => {
            (error.code, error.message.unwrap_or_else(|| reason(status)))
        }
        Err(_) => (None, reason(status)),
    };
    let wait = || retry_after::from_headers(headers, SystemTime::now());
    match status {
        400 if code.as_deref() == Some("SQL_ERROR") => ErrorKind::Sql {
            code: "SQL_ERROR".to_owned(),
            message,
        },
        401 => ErrorKind::Unauthorized { message },
        409 if code.as_deref() != Some(crate::retry::classify::IDEMPOTENCY_KEY_IN_USE) => {
            ErrorKind::ConstraintViolation { message }
        }
        413 => ErrorKind::PayloadTooLarge { message },
        429 => ErrorKind::RateLimited {
            retry_after: wait(),
            message,
        },
        503 => ErrorKind::Unavailable {
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

fn reason(status: u16) -> String {
    http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("unexpected status")
        .to_owned()
}

/// Maps a failure of the HTTP stack (no usable response) to a kind.
pub(crate) fn from_transport(err: reqwest::Error) -> ErrorKind {
    let err = err.without_url();
    let message = describe(&err);
    if is_certificate_failure(&err) {
        ErrorKind::Tls { message }
    } else if err.is_timeout() {
        // A timeout configured on a caller-supplied reqwest client; ours is applied around the attempt.
        ErrorKind::Timeout {
            after: std::time::Duration::ZERO,
        }
    } else if err.is_builder() || err.is_redirect() {
        // A redirect policy on a caller-supplied client gave up: the same request will again.
        ErrorKind::Config { message }
    } else {
        ErrorKind::Connection { message }
    }
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
                message: "UNIQUE".into()
            }
        );
        assert_eq!(
            from_status(409, &h, &body("IDEMPOTENCY_KEY_IN_USE", "busy")),
            ErrorKind::Http {
                status: 409,
                code: Some("IDEMPOTENCY_KEY_IN_USE".into()),
                message: "busy".into()
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
