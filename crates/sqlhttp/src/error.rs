//! The error a caller branches on: [`Error`] wraps one [`ErrorKind`] with what the retry loop learned on
//! the way (how many attempts were made, what each one met, whether the retry budget ran dry).
//!
//! This module knows the shape of failures, not how they are produced: mapping HTTP responses lives in
//! `response`, deciding what is retried lives in `retry::classify`.

use std::fmt;
use std::time::Duration;

/// The result type of every fallible call in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, in a form a caller can `match` on.
///
/// The variants follow the wire protocol's error codes where the server gave one. New variants may be
/// added in minor releases, so keep a wildcard arm.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The engine rejected the statement (syntax, unknown table, wrong parameter count): `400 SQL_ERROR`.
    #[error("SQL rejected ({code}): {message}")]
    Sql {
        /// The protocol's error code, `SQL_ERROR`.
        code: String,
        /// The engine's explanation.
        message: String,
    },
    /// The server refused the credentials (`401`): the bearer token is missing or wrong.
    #[error("unauthorized: {message}")]
    Unauthorized {
        /// The server's explanation.
        message: String,
    },
    /// A unique, primary key, check, not-null or foreign key constraint refused the write (`409`).
    #[error("constraint violation: {message}")]
    ConstraintViolation {
        /// The engine's explanation.
        message: String,
    },
    /// The request body was over the server's limit (`413`), or an insert row alone is over
    /// the configured body limit (detected before anything was sent).
    #[error("payload too large: {message}")]
    PayloadTooLarge {
        /// What was too large.
        message: String,
    },
    /// The server asked the client to slow down (`429`).
    #[error("rate limited{}: {message}", fmt_wait(*retry_after))]
    RateLimited {
        /// The wait the server asked for (`Retry-After`), when it gave a valid one. Not capped: a queued
        /// job may release itself for this long.
        retry_after: Option<Duration>,
        /// The server's explanation.
        message: String,
    },
    /// The server or its engine is temporarily unavailable (`503`).
    #[error("service unavailable{}: {message}", fmt_wait(*retry_after))]
    Unavailable {
        /// The wait the server asked for (`Retry-After`), when it gave a valid one.
        retry_after: Option<Duration>,
        /// The server's explanation.
        message: String,
    },
    /// Any other non-success status.
    #[error("HTTP {status}{}: {message}", code.as_deref().map(|c| format!(" {c}")).unwrap_or_default())]
    Http {
        /// The HTTP status code.
        status: u16,
        /// The protocol's error code, when the body carried one.
        code: Option<String>,
        /// The server's explanation, or a placeholder when the body was not a protocol error.
        message: String,
    },
    /// One attempt took longer than its budget (the per-attempt `timeout`, or what was left of
    /// `max_elapsed`).
    #[error("timed out after {after:?}")]
    Timeout {
        /// The budget the attempt had.
        after: Duration,
    },
    /// The connection failed: refused, reset, or closed before a complete response arrived.
    #[error("connection failed: {message}")]
    Connection {
        /// What the network stack reported.
        message: String,
    },
    /// The TLS handshake failed on the server's certificate; retrying cannot help.
    #[error("TLS failure: {message}")]
    Tls {
        /// What the TLS stack reported.
        message: String,
    },
    /// A complete response did not decode into the requested type.
    #[error("decode failed{}{}: {message}",
        row.map(|r| format!(" at row {r}")).unwrap_or_default(),
        column.as_deref().map(|c| format!(", column `{c}`")).unwrap_or_default())]
    Decode {
        /// The zero-based row being decoded, when the failure was in a row.
        row: Option<usize>,
        /// The column being decoded, when known.
        column: Option<String>,
        /// What was found and what was expected.
        message: String,
    },
    /// `fetch_one` found no row.
    #[error("the query returned no rows")]
    RowNotFound,
    /// A bound parameter or an insert row cannot be sent (not a scalar, rows of different shapes, ...).
    /// Nothing was sent.
    #[error("invalid parameter{}: {message}", index.map(|i| format!(" {i}")).unwrap_or_default())]
    InvalidParameter {
        /// The zero-based position of the parameter, when one parameter is at fault.
        index: Option<usize>,
        /// What is wrong with it.
        message: String,
    },
    /// The client was configured with values that cannot work (reported by `build()`).
    #[error("invalid configuration: {message}")]
    Config {
        /// What is wrong.
        message: String,
    },
    /// The caller cancelled the call (through a `CancellationToken`).
    #[error("cancelled")]
    Cancelled,
}

impl ErrorKind {
    /// The HTTP status a kind stands for, when it comes from a response.
    pub(crate) fn response_status(&self) -> Option<u16> {
        match self {
            ErrorKind::Sql { .. } => Some(400),
            ErrorKind::Unauthorized { .. } => Some(401),
            ErrorKind::ConstraintViolation { .. } => Some(409),
            ErrorKind::PayloadTooLarge { .. } => Some(413),
            ErrorKind::RateLimited { .. } => Some(429),
            ErrorKind::Unavailable { .. } => Some(503),
            ErrorKind::Http { status, .. } => Some(*status),
            _ => None,
        }
    }
}

fn fmt_wait(wait: Option<Duration>) -> String {
    wait.map(|w| format!(" (retry after {w:?})"))
        .unwrap_or_default()
}

/// One failed attempt of a call, as recorded in [`Error::history`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AttemptFailure {
    /// The attempt's number, from 1.
    pub attempt: u32,
    /// A short description of the failure: an HTTP status with its code, or the error's kind.
    pub failure: String,
    /// The HTTP status, when the attempt got a response.
    pub status: Option<u16>,
    /// The delay slept before the next attempt, or `None` when this attempt was the last.
    pub retry_delay: Option<Duration>,
}

/// The error returned by every fallible call: an [`ErrorKind`] plus what the retry loop learned.
///
/// Branch with [`Error::kind`]; ask the common questions with the accessors:
///
/// ```
/// # fn handle(err: sqlhttp::Error) {
/// use sqlhttp::ErrorKind;
/// match err.kind() {
///     ErrorKind::RateLimited { retry_after, .. } => println!("come back in {retry_after:?}"),
///     ErrorKind::Sql { message, .. } => println!("fix the SQL: {message}"),
///     _ if err.is_retryable() => println!("transient, gave up after {} attempts", err.attempts()),
///     _ => println!("final: {err}"),
/// }
/// # }
/// ```
pub struct Error {
    inner: Box<Inner>,
}

struct Inner {
    kind: ErrorKind,
    attempts: u32,
    history: Vec<AttemptFailure>,
    budget_exhausted: bool,
    rows_inserted: Option<u64>,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind) -> Self {
        Self {
            inner: Box::new(Inner {
                kind,
                attempts: 0,
                history: Vec::new(),
                budget_exhausted: false,
                rows_inserted: None,
            }),
        }
    }

    pub(crate) fn config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Config {
            message: message.into(),
        })
    }

    pub(crate) fn decode(message: impl fmt::Display) -> Self {
        Self::new(ErrorKind::Decode {
            row: None,
            column: None,
            message: message.to_string(),
        })
    }

    pub(crate) fn with_attempts(mut self, attempts: u32, history: Vec<AttemptFailure>) -> Self {
        self.inner.attempts = attempts;
        self.inner.history = history;
        self
    }

    pub(crate) fn with_budget_exhausted(mut self) -> Self {
        self.inner.budget_exhausted = true;
        self
    }

    pub(crate) fn with_rows_inserted(mut self, rows: u64) -> Self {
        self.inner.rows_inserted = Some(rows);
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.inner.kind
    }

    /// Consumes the error, returning what went wrong.
    pub fn into_kind(self) -> ErrorKind {
        self.inner.kind
    }

    /// How many attempts were made: 0 when the call failed before sending anything (bad parameters,
    /// cancelled before the first attempt), 1 when it was not retried.
    pub fn attempts(&self) -> u32 {
        self.inner.attempts
    }

    /// Every failed attempt in order, each with the delay slept after it (`None` on the last). When the
    /// call failed, the last entry is this error, except after a cancellation between attempts: then
    /// the last entry is the attempt before, with the delay the cancellation cut short. Errors raised
    /// after a successful exchange (decoding, [`ErrorKind::RowNotFound`]) carry the call's history too.
    pub fn history(&self) -> &[AttemptFailure] {
        &self.inner.history
    }

    /// Whether the client-wide retry budget was empty when this failure could have been retried.
    pub fn is_budget_exhausted(&self) -> bool {
        self.inner.budget_exhausted
    }

    /// For a bulk insert that was split into several statements: how many rows earlier statements were
    /// confirmed to have committed before this failure. `None` when none had. A lower bound: after a
    /// timeout or a lost connection, the failed statement itself may have committed too.
    pub fn rows_inserted(&self) -> Option<u64> {
        self.inner.rows_inserted
    }

    /// The HTTP status of the response that failed, when there was one.
    pub fn status(&self) -> Option<u16> {
        match &self.inner.kind {
            // An insert row over the body limit is found before anything is sent.
            ErrorKind::PayloadTooLarge { .. } if self.inner.attempts == 0 => None,
            kind => kind.response_status(),
        }
    }

    /// The protocol's error code (`SQL_ERROR`, `CONSTRAINT_VIOLATION`, ...), when the server sent one.
    pub fn code(&self) -> Option<&str> {
        match &self.inner.kind {
            ErrorKind::Sql { code, .. } => Some(code),
            ErrorKind::Http { code, .. } => code.as_deref(),
            ErrorKind::Unauthorized { .. } => Some("UNAUTHORIZED"),
            ErrorKind::ConstraintViolation { .. } => Some("CONSTRAINT_VIOLATION"),
            ErrorKind::RateLimited { .. } => Some("RATE_LIMITED"),
            ErrorKind::Unavailable { .. } => Some("UNAVAILABLE"),
            ErrorKind::PayloadTooLarge { .. } if self.inner.attempts > 0 => {
                Some("PAYLOAD_TOO_LARGE")
            }
            _ => None,
        }
    }

    /// The wait the server asked for with `Retry-After` (on `429` and `503`), uncapped.
    pub fn retry_after(&self) -> Option<Duration> {
        match &self.inner.kind {
            ErrorKind::RateLimited { retry_after, .. }
            | ErrorKind::Unavailable { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Whether the failure is transient: the same request could succeed later (connection failures,
    /// timeouts, 408, 429, 5xx except 501). Says nothing of whether the call's class allowed a retry.
    pub fn is_retryable(&self) -> bool {
        crate::retry::classify::is_transient(&self.inner.kind)
    }

    /// Whether the attempt ran out of time.
    pub fn is_timeout(&self) -> bool {
        matches!(self.inner.kind, ErrorKind::Timeout { .. })
    }

    /// Whether the connection failed (refused, reset, closed early).
    pub fn is_connection(&self) -> bool {
        matches!(self.inner.kind, ErrorKind::Connection { .. })
    }
}

impl From<ErrorKind> for Error {
    fn from(kind: ErrorKind) -> Self {
        Self::new(kind)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.inner.kind)
            .field("attempts", &self.inner.attempts);
        if self.inner.budget_exhausted {
            d.field("budget_exhausted", &true);
        }
        if let Some(rows) = self.inner.rows_inserted {
            d.field("rows_inserted", &rows);
        }
        if !self.inner.history.is_empty() {
            d.field("history", &self.inner.history);
        }
        d.finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner.kind, f)?;
        if self.inner.attempts > 1 {
            write!(f, " (after {} attempts)", self.inner.attempts)?;
        }
        if self.inner.budget_exhausted {
            f.write_str(" (retry budget exhausted)")?;
        }
        if let Some(rows) = self.inner.rows_inserted {
            write!(f, " ({rows} rows were inserted before the failure)")?;
        }
        Ok(())
    }
}

/// The kind's message is already this error's own, so it is not repeated as a source.
impl std::error::Error for Error {}
