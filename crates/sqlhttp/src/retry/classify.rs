//! Which failures are retried: a pure function of the operation's class, the client's `retry_writes`
//! setting and the failure's kind (status *and* protocol error code).
//!
//! It knows nothing of timing or budgets; the loop in `transport` asks it one question per failure.

use sqlhttp_protocol::RetryClass;

use crate::error::ErrorKind;

/// The class of an operation, declared by the `Client` method the caller chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpClass {
    /// `ping`, `query`, `query_table`, a read-only batch: safe to send twice.
    Read,
    /// `insert`, a write batch: retried only under `retry_writes`, with one idempotency key for every
    /// attempt.
    Write,
    /// `execute`: arbitrary statements, never retried.
    Execute,
    /// A step of an interactive transaction (open, a statement, commit, rollback): sequenced by
    /// the server, so safe to send twice; retried as the policy allows, with one idempotency key
    /// for every attempt.
    Step,
}

impl OpClass {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            OpClass::Read => "read",
            OpClass::Write => "write",
            OpClass::Execute => "execute",
            OpClass::Step => "transaction",
        }
    }
}

/// Whether the same request could succeed later: connection failures, attempt timeouts, and every
/// code the protocol's table classes [`RetryClass::Transient`] (`408`, `429`, `500`, `503`
/// `OUTCOME_UNKNOWN` included: a re-sent COMMIT reads the commit record, a re-sent keyed write its
/// stored outcome; and a `409 IDEMPOTENCY_KEY_IN_USE`: only writes carry a key, so only writes
/// meet it); a response without a code this version knows, by its status: `408`, `429` and every
/// `5xx` except `501`.
///
/// `409 BOOKMARK_AHEAD` is not: the same request, with the same bookmark, is refused again. The
/// loop sends it once more without the bookmark (see `transport`), whatever this says.
pub(crate) fn is_transient(kind: &ErrorKind) -> bool {
    match kind {
        ErrorKind::Connection { .. }
        | ErrorKind::Timeout { .. }
        | ErrorKind::RateLimited { .. }
        | ErrorKind::Unavailable { .. }
        | ErrorKind::OutcomeUnknown { .. }
        | ErrorKind::IdempotencyKeyInUse { .. } => true,
        ErrorKind::Http { status, .. } => match kind.protocol_code() {
            Some(code) => code.retry_class() == RetryClass::Transient,
            // 501 Not Implemented will not change on a retry (matched before the 5xx range).
            None => matches!(*status, 408 | 429 | 500 | 502..=599),
        },
        ErrorKind::Sql { .. }
        | ErrorKind::Unauthorized { .. }
        | ErrorKind::ConstraintViolation { .. }
        | ErrorKind::StatementNotAllowed { .. }
        | ErrorKind::ReadOnly { .. }
        | ErrorKind::StatementTimeout { .. }
        | ErrorKind::PayloadTooLarge { .. }
        | ErrorKind::Tls { .. }
        | ErrorKind::Decode { .. }
        | ErrorKind::RowNotFound
        | ErrorKind::InvalidParameter { .. }
        | ErrorKind::Config { .. }
        | ErrorKind::TransactionLost { .. }
        | ErrorKind::BookmarkAhead { .. }
        // The client's own rate held it back: the call's time is out, nothing was sent.
        | ErrorKind::ClientRateLimited { .. }
        | ErrorKind::Cancelled => false,
    }
}

/// Whether an operation of `class` that failed with `kind` may be attempted again.
pub(crate) fn should_retry(class: OpClass, retry_writes: bool, kind: &ErrorKind) -> bool {
    let class_allows = match class {
        OpClass::Read | OpClass::Step => true,
        OpClass::Write => retry_writes,
        OpClass::Execute => false,
    };
    class_allows && is_transient(kind)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Each of the protocol's codes, answered with its status, is transient exactly when the
    /// protocol's table says so, and the kind it maps to keeps the code and the status.
    #[test]
    fn every_protocol_code_is_classed_as_the_table_says() {
        use sqlhttp_protocol::ErrorCode;
        for &code in ErrorCode::ALL {
            let body = format!(r#"{{"error":{{"code":"{code}","message":"m"}}}}"#);
            let kind = crate::response::from_status(
                code.status(),
                &http::HeaderMap::new(),
                body.as_bytes(),
            );
            assert_eq!(
                is_transient(&kind),
                code.retry_class() == RetryClass::Transient,
                "{code}: {kind:?}"
            );
            assert_eq!(kind.response_status(), Some(code.status()), "{code}");
            assert_eq!(kind.wire_code(), Some(code.as_str()), "{code}");
            assert_eq!(kind.protocol_code(), Some(code), "{code}");
        }
    }

    fn http(status: u16, code: Option<&str>) -> ErrorKind {
        ErrorKind::Http {
            status,
            code: code.map(str::to_owned),
            message: String::new(),
        }
    }

    /// Every row: (failure, retried as a read, retried as a write under retry_writes).
    /// Writes without `retry_writes` and `execute` are never retried; checked for every row below.
    fn table() -> Vec<(ErrorKind, bool, bool)> {
        let msg = String::new;
        vec![
            (
                ErrorKind::Connection {
                    message: "refused".into(),
                },
                true,
                true,
            ),
            (
                ErrorKind::Connection {
                    message: "reset".into(),
                },
                true,
                true,
            ),
            (
                ErrorKind::Timeout {
                    after: Duration::from_secs(1),
                },
                true,
                true,
            ),
            (http(408, None), true, true),
            (
                ErrorKind::RateLimited {
                    retry_after: Some(Duration::from_secs(2)),
                    message: msg(),
                },
                true,
                true,
            ),
            (
                ErrorKind::RateLimited {
                    retry_after: None,
                    message: msg(),
                },
                true,
                true,
            ),
            (http(500, Some("INTERNAL")), true, true),
            (http(502, None), true, true),
            (
                ErrorKind::Unavailable {
                    retry_after: None,
                    message: msg(),
                },
                true,
                true,
            ),
            (http(504, None), true, true),
            // The server cannot tell whether it took effect: a step is re-sent (a COMMIT reads
            // the commit record), a keyed write under retry_writes too; never an execute.
            (
                ErrorKind::OutcomeUnknown {
                    retry_after: None,
                    message: msg(),
                },
                true,
                true,
            ),
            // Nothing ran, but the same bookmark is refused again: the loop re-sends without it.
            (ErrorKind::BookmarkAhead { message: msg() }, false, false),
            (http(507, None), true, true),
            (http(599, None), true, true),
            (http(501, None), false, false),
            (
                ErrorKind::IdempotencyKeyInUse {
                    retry_after: Some(Duration::from_secs(1)),
                    message: msg(),
                },
                true,
                true,
            ),
            (
                ErrorKind::IdempotencyKeyInUse {
                    retry_after: None,
                    message: msg(),
                },
                true,
                true,
            ),
            (
                ErrorKind::ConstraintViolation {
                    constraint: None,
                    message: msg(),
                },
                false,
                false,
            ),
            (
                ErrorKind::ConstraintViolation {
                    constraint: Some(crate::ConstraintKind::Unique),
                    message: msg(),
                },
                false,
                false,
            ),
            (
                ErrorKind::StatementNotAllowed { message: msg() },
                false,
                false,
            ),
            (ErrorKind::ReadOnly { message: msg() }, false, false),
            (ErrorKind::StatementTimeout { message: msg() }, false, false),
            (http(403, Some("ORIGIN_NOT_ALLOWED")), false, false),
            (http(408, Some("REQUEST_TIMEOUT")), true, true),
            (http(415, Some("UNSUPPORTED_MEDIA_TYPE")), false, false),
            (http(431, Some("HEADERS_TOO_LARGE")), false, false),
            (http(409, Some("CONSTRAINT_VIOLATION")), false, false),
            (http(409, None), false, false),
            (
                ErrorKind::Sql {
                    code: "SQL_ERROR".into(),
                    message: msg(),
                },
                false,
                false,
            ),
            (http(400, Some("BAD_REQUEST")), false, false),
            (ErrorKind::Unauthorized { message: msg() }, false, false),
            (http(403, None), false, false),
            (http(404, Some("NOT_FOUND")), false, false),
            (http(405, Some("METHOD_NOT_ALLOWED")), false, false),
            (ErrorKind::PayloadTooLarge { message: msg() }, false, false),
            (http(422, Some("IDEMPOTENCY_KEY_REUSED")), false, false),
            (http(418, None), false, false),
            (http(302, None), false, false),
            (
                ErrorKind::Tls {
                    message: "bad certificate".into(),
                },
                false,
                false,
            ),
            (
                ErrorKind::Decode {
                    row: Some(1),
                    column: None,
                    message: msg(),
                },
                false,
                false,
            ),
            (ErrorKind::RowNotFound, false, false),
            (
                ErrorKind::InvalidParameter {
                    index: Some(0),
                    message: msg(),
                },
                false,
                false,
            ),
            (ErrorKind::Config { message: msg() }, false, false),
            (ErrorKind::Cancelled, false, false),
        ]
    }

    #[test]
    fn classification_table() {
        for (kind, read, write) in table() {
            assert_eq!(
                should_retry(OpClass::Read, false, &kind),
                read,
                "read: {kind:?}"
            );
            assert_eq!(
                should_retry(OpClass::Read, true, &kind),
                read,
                "read, retry_writes: {kind:?}"
            );
            assert_eq!(
                should_retry(OpClass::Write, true, &kind),
                write,
                "write, retry_writes: {kind:?}"
            );
            assert!(
                !should_retry(OpClass::Write, false, &kind),
                "write without opt-in: {kind:?}"
            );
            assert!(
                !should_retry(OpClass::Execute, true, &kind),
                "execute: {kind:?}"
            );
            assert!(
                !should_retry(OpClass::Execute, false, &kind),
                "execute: {kind:?}"
            );
            // A transaction's step is sequenced by the server: retried as a read is, with or
            // without retry_writes.
            for retry_writes in [false, true] {
                assert_eq!(
                    should_retry(OpClass::Step, retry_writes, &kind),
                    read,
                    "step: {kind:?}"
                );
            }
        }
    }

    #[test]
    fn a_lost_transaction_is_not_retried_as_a_step() {
        let lost = ErrorKind::TransactionLost {
            code: "TRANSACTION_EXPIRED".into(),
            message: String::new(),
        };
        assert!(!is_transient(&lost));
        assert!(!should_retry(OpClass::Step, true, &lost));
    }

    #[test]
    fn is_transient_matches_the_read_column() {
        for (kind, read, _) in table() {
            assert_eq!(is_transient(&kind), read, "{kind:?}");
        }
    }

    #[test]
    fn every_5xx_but_501_is_transient() {
        for status in 500..=599 {
            assert_eq!(is_transient(&http(status, None)), status != 501, "{status}");
        }
    }

    #[test]
    fn no_4xx_but_408_429_and_key_in_use_is_transient() {
        for status in 400..=499 {
            let transient = is_transient(&http(status, None));
            assert_eq!(transient, status == 408 || status == 429, "{status}");
        }
    }
}
