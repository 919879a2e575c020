//! The protocol's error table: every [`ErrorCode`] with its HTTP status, whether the server sends
//! `Retry-After: 1` with it, and its [`RetryClass`] (what a client may do about it); and the
//! [`Constraint`] names a `CONSTRAINT_VIOLATION` carries. The error body's shape is
//! [`body::ErrorBody`](crate::body::ErrorBody). Knows no HTTP types: statuses are numbers.

use std::fmt;
use std::str::FromStr;

/// What a client may do about a failure with a given code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryClass {
    /// The same request gets the same answer: do not send it again.
    Final,
    /// The same request may succeed later (after `Retry-After`, when the answer has one): nothing
    /// ran, or (`OUTCOME_UNKNOWN`, `IDEMPOTENCY_KEY_IN_USE`) a re-sent keyed write or transaction
    /// step is applied at most once.
    Transient,
    /// The request's bookmark is the fault (`BOOKMARK_AHEAD`): nothing ran; send it again without
    /// the bookmark.
    WithoutBookmark,
    /// The interactive transaction is gone and nothing of it committed (`TRANSACTION_EXPIRED`,
    /// `TRANSACTION_ABORTED`): run the whole transaction again.
    RerunTransaction,
}

macro_rules! codes {
    ($($(#[$doc:meta])* $variant:ident = $name:literal, $status:literal, $class:ident;)+) => {
        /// One row of the protocol's error table: the `code` of an error body.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($(#[$doc])* $variant,)+
        }

        impl ErrorCode {
            /// Every code, in the order of the protocol's table.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)+];

            /// The code as the error body carries it (`SQL_ERROR`, ...).
            #[must_use]
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $name,)+
                }
            }

            /// The HTTP status every response with this code has.
            #[must_use]
            pub const fn status(self) -> u16 {
                match self {
                    $(ErrorCode::$variant => $status,)+
                }
            }

            /// What a client may do about it.
            #[must_use]
            pub const fn retry_class(self) -> RetryClass {
                match self {
                    $(ErrorCode::$variant => RetryClass::$class,)+
                }
            }
        }
    };
}

codes! {
    /// The body or the request is not what the endpoint takes.
    BadRequest = "BAD_REQUEST", 400, Final;
    /// The engine rejected the statement.
    SqlError = "SQL_ERROR", 400, Final;
    /// The credentials are missing or wrong.
    Unauthorized = "UNAUTHORIZED", 401, Final;
    /// No such path.
    NotFound = "NOT_FOUND", 404, Final;
    /// The path takes another method (the answer carries `Allow`).
    MethodNotAllowed = "METHOD_NOT_ALLOWED", 405, Final;
    /// A constraint refused the write (the body may name it: [`Constraint`]).
    ConstraintViolation = "CONSTRAINT_VIOLATION", 409, Final;
    /// A request with the same idempotency key is still running.
    IdempotencyKeyInUse = "IDEMPOTENCY_KEY_IN_USE", 409, Transient;
    /// The body, the SQL text or the batch is over the server's limit.
    PayloadTooLarge = "PAYLOAD_TOO_LARGE", 413, Final;
    /// The idempotency key was used with another body.
    IdempotencyKeyReused = "IDEMPOTENCY_KEY_REUSED", 422, Final;
    /// Anything unexpected; the message reveals nothing.
    Internal = "INTERNAL", 500, Transient;
    /// Busy, locked, full or shutting down; nothing ran.
    Unavailable = "UNAVAILABLE", 503, Transient;
    /// The server's sandbox refused the statement.
    StatementNotAllowed = "STATEMENT_NOT_ALLOWED", 403, Final;
    /// The request's `Origin` is not one the server lists.
    OriginNotAllowed = "ORIGIN_NOT_ALLOWED", 403, Final;
    /// The body is not declared `application/json`.
    UnsupportedMediaType = "UNSUPPORTED_MEDIA_TYPE", 415, Final;
    /// The body did not arrive in time; nothing ran.
    RequestTimeout = "REQUEST_TIMEOUT", 408, Transient;
    /// The request target is too long.
    UriTooLong = "URI_TOO_LONG", 414, Final;
    /// The request's headers are too large or too many.
    HeadersTooLarge = "HEADERS_TOO_LARGE", 431, Final;
    /// The statement ran past the server's statement timeout; rolled back.
    StatementTimeout = "STATEMENT_TIMEOUT", 422, Final;
    /// A row, or a buffered result, is over the server's result limit; rolled back.
    ResultTooLarge = "RESULT_TOO_LARGE", 422, Final;
    /// The statement may write but the request may only read; nothing was written.
    ReadOnly = "READ_ONLY", 403, Final;
    /// Over the rate limit; nothing ran.
    RateLimited = "RATE_LIMITED", 429, Transient;
    /// An interactive transaction was rolled back by the server (idle, too old, its server gone):
    /// nothing of it was committed.
    TransactionExpired = "TRANSACTION_EXPIRED", 410, RerunTransaction;
    /// An interactive transaction cannot go on (a serialization failure, a deadlock, its
    /// connection lost): it was rolled back, nothing of it was committed; run it again.
    TransactionAborted = "TRANSACTION_ABORTED", 409, RerunTransaction;
    /// A transaction's statement carries a sequence number other than the next one (or the last
    /// one, which replays).
    TransactionStepOutOfOrder = "TRANSACTION_STEP_OUT_OF_ORDER", 409, Final;
    /// The transaction has ended (committed, or rolled back by its client).
    TransactionFinished = "TRANSACTION_FINISHED", 409, Final;
    /// The request's `Sqlhttp-Bookmark` is past everything the primary has written: nothing ran.
    BookmarkAhead = "BOOKMARK_AHEAD", 409, WithoutBookmark;
    /// The server cannot know whether a write (or a COMMIT) took effect; a keyed write or a COMMIT
    /// sent again tells.
    OutcomeUnknown = "OUTCOME_UNKNOWN", 503, Transient;
}

impl ErrorCode {
    /// Whether the server answers this code with `Retry-After: 1`.
    #[must_use]
    pub const fn sends_retry_after(self) -> bool {
        matches!(
            self,
            ErrorCode::IdempotencyKeyInUse
                | ErrorCode::Unavailable
                | ErrorCode::OutcomeUnknown
                | ErrorCode::RateLimited
        )
    }

    /// Whether an outcome with this code is final, so a request with an idempotency key stores it
    /// and replays it to the key's later attempts: the statement's own verdict, which a retry of
    /// the same body would get again. A statement timeout or an oversized result depends on load
    /// and limits, so it is not stored.
    #[must_use]
    pub const fn is_stored_outcome(self) -> bool {
        matches!(
            self,
            ErrorCode::SqlError | ErrorCode::ConstraintViolation | ErrorCode::StatementNotAllowed
        )
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `code` this version of the protocol does not know. Clients treat such an error by its
/// status alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownErrorCode;

impl fmt::Display for UnknownErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not an error code of the protocol")
    }
}

impl std::error::Error for UnknownErrorCode {}

impl FromStr for ErrorCode {
    type Err = UnknownErrorCode;

    fn from_str(code: &str) -> Result<Self, Self::Err> {
        ErrorCode::ALL
            .iter()
            .copied()
            .find(|known| known.as_str() == code)
            .ok_or(UnknownErrorCode)
    }
}

impl serde::Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for ErrorCode {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let code = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        code.parse().map_err(serde::de::Error::custom)
    }
}

/// Which constraint refused a write: the `constraint` member of a `CONSTRAINT_VIOLATION` error
/// body, when the engine says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Constraint {
    /// A `UNIQUE` constraint or unique index (`unique`).
    Unique,
    /// A `PRIMARY KEY` (`primary_key`).
    PrimaryKey,
    /// A `FOREIGN KEY` reference (`foreign_key`).
    ForeignKey,
    /// A `CHECK` constraint (`check`).
    Check,
    /// A `NOT NULL` column (`not_null`).
    NotNull,
    /// A PostgreSQL exclusion constraint (`exclusion`).
    Exclusion,
}

impl Constraint {
    /// Every kind, in the protocol's order.
    pub const ALL: [Constraint; 6] = [
        Constraint::Unique,
        Constraint::PrimaryKey,
        Constraint::ForeignKey,
        Constraint::Check,
        Constraint::NotNull,
        Constraint::Exclusion,
    ];

    /// The protocol's name (`unique`, `primary_key`, ...).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Constraint::Unique => "unique",
            Constraint::PrimaryKey => "primary_key",
            Constraint::ForeignKey => "foreign_key",
            Constraint::Check => "check",
            Constraint::NotNull => "not_null",
            Constraint::Exclusion => "exclusion",
        }
    }

    /// The kind of a protocol name; `None` for a name this version does not know.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Constraint> {
        Constraint::ALL
            .into_iter()
            .find(|kind| kind.as_str() == name)
    }
}

impl fmt::Display for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_parses_back_and_has_an_error_status() {
        assert_eq!(ErrorCode::ALL.len(), 27);
        for &code in ErrorCode::ALL {
            assert_eq!(code.as_str().parse::<ErrorCode>(), Ok(code));
            assert!((400..600).contains(&code.status()), "{code}");
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), code);
        }
        assert_eq!("NOPE".parse::<ErrorCode>(), Err(UnknownErrorCode));
    }

    #[test]
    fn the_retry_classes_follow_the_statuses() {
        for &code in ErrorCode::ALL {
            let class = code.retry_class();
            // A 5xx but 501, 408 and 429 are transient; a 4xx is not, but a key still in use.
            let by_status = matches!(code.status(), 408 | 429 | 500 | 502..=599);
            match class {
                RetryClass::Transient => assert!(
                    by_status || code == ErrorCode::IdempotencyKeyInUse,
                    "{code}"
                ),
                _ => assert!(!by_status, "{code}"),
            }
            if code.sends_retry_after() {
                assert_eq!(class, RetryClass::Transient, "{code}");
            }
            if code.is_stored_outcome() {
                assert_eq!(class, RetryClass::Final, "{code}");
            }
        }
    }

    #[test]
    fn constraint_names_round_trip() {
        for kind in Constraint::ALL {
            assert_eq!(Constraint::from_name(kind.as_str()), Some(kind));
        }
        assert_eq!(Constraint::from_name("other"), None);
    }
}
