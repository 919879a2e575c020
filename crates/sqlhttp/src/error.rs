//! The error a caller branches on: [`Error`] wraps one [`ErrorKind`] with what the retry loop learned on
//! the way (how many attempts were made, what each one met, whether the retry budget ran dry).
//!
//! This module knows the shape of failures, not how they are produced: mapping HTTP responses lives in
//! `response`, deciding what is retried lives in `retry::classify`.

use std::fmt;
use std::time::Duration;

use sqlhttp_protocol::{Constraint, ErrorCode};

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
    /// A unique, primary key, check, not-null or foreign key constraint refused the write
    /// (`409 CONSTRAINT_VIOLATION`).
    #[error("{} violation: {message}", constraint.as_ref().map_or("constraint", ConstraintKind::describe))]
    ConstraintViolation {
        /// Which kind of constraint, when the server said (its error body's `constraint` member);
        /// `None` when it did not. The SDK never guesses it from the message.
        constraint: Option<ConstraintKind>,
        /// The engine's explanation.
        message: String,
    },
    /// The server's sandbox refused the statement (`403 STATEMENT_NOT_ALLOWED`): `ATTACH`, a `PRAGMA`
    /// that writes, access to the server's own tables, ... Final: the same statement is refused again.
    #[error("statement not allowed: {message}")]
    StatementNotAllowed {
        /// The server's explanation.
        message: String,
    },
    /// The statement writes, but the call may only read (`403 READ_ONLY`): a read-only credential or
    /// a read-only batch. Final: nothing was written.
    #[error("read-only: {message}")]
    ReadOnly {
        /// The server's explanation.
        message: String,
    },
    /// The server's statement timeout interrupted the statement (`422 STATEMENT_TIMEOUT`); its effects
    /// were rolled back. Final: run it again only if you expect it to be faster (or the limit larger).
    #[error("statement timed out on the server: {message}")]
    StatementTimeout {
        /// The server's explanation.
        message: String,
    },
    /// Another request with the same idempotency key is still running on the server
    /// (`409 IDEMPOTENCY_KEY_IN_USE`): typically an earlier attempt of the same write that this client
    /// gave up on. Retried (writes only) after the server's `Retry-After`. When it is the last failure,
    /// the write's outcome is unknown: see [`Error::is_outcome_unknown`].
    #[error("idempotency key in use{}: {message}", fmt_wait(*retry_after))]
    IdempotencyKeyInUse {
        /// The wait the server asked for (`Retry-After`), when it gave a valid one.
        retry_after: Option<Duration>,
        /// The server's explanation.
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
    /// The server could not learn whether the write or the COMMIT took effect
    /// (`503 OUTCOME_UNKNOWN`): the database did not answer it in time, say. Unlike
    /// [`Unavailable`](Self::Unavailable) ("busy, nothing ran"), it may have been applied, so a call
    /// that ends on it has [`Error::is_outcome_unknown`] set. Transient: a transaction's steps are
    /// retried (a re-sent COMMIT reads the commit record), and so are keyed writes under
    /// [`retry_writes`](crate::ClientBuilder::retry_writes) (the key applies them at most once);
    /// `execute` never is.
    #[error("outcome unknown{}: {message}", fmt_wait(*retry_after))]
    OutcomeUnknown {
        /// The wait the server asked for (`Retry-After`) before asking again, when it gave a
        /// valid one.
        retry_after: Option<Duration>,
        /// The server's explanation.
        message: String,
    },
    /// The request's bookmark is past anything the server's primary has written
    /// (`409 BOOKMARK_AHEAD`): a bookmark from another cluster, or from before a failover to a
    /// primary whose log is behind. Nothing ran. The SDK drops the session's bookmark on it (as
    /// [`Client::reset_bookmark`](crate::Client::reset_bookmark) does) and sends a read, a write
    /// or a transaction's step again without it; an `execute` returns this error, and its next
    /// call goes out without the bookmark.
    #[error("bookmark ahead of the server: {message}")]
    BookmarkAhead {
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
    /// The client's own adaptive send rate
    /// ([`ClientBuilder::adaptive_rate`](crate::ClientBuilder::adaptive_rate)), lowered after the
    /// server throttled, would hold this attempt back past the call's `max_elapsed`, or longer
    /// than its policy's `max_backoff`: it was not sent. [`Error::retry_state`] says what the rate is now. After an earlier failed attempt the
    /// call ends on that failure instead, with [`Error::retry_state`] set.
    #[error("held back by the client's adaptive send rate: the next send was {wait:?} away")]
    ClientRateLimited {
        /// How long the attempt would have waited for its turn.
        wait: Duration,
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
    #[error("invalid parameter{}: {message}", index.map(|i| format!(" ?{}", i + 1)).unwrap_or_default())]
    InvalidParameter {
        /// The zero-based position of the parameter, when one parameter is at fault: `0` is the
        /// first bound, which the message names `?1`, as SQL does.
        index: Option<usize>,
        /// What is wrong with it.
        message: String,
    },
    /// The client or a call was configured with values that cannot work (reported by `build()`, or by a
    /// call before it sends anything: a per-call retry policy or idempotency key that cannot work).
    #[error("invalid configuration: {message}")]
    Config {
        /// What is wrong.
        message: String,
    },
    /// The caller cancelled the call (through a `CancellationToken`).
    #[error("cancelled")]
    Cancelled,
    /// An interactive transaction cannot go on, and **nothing of it was committed**: the server
    /// rolled it back because it was idle or open too long, or its server restarted
    /// (`410 TRANSACTION_EXPIRED`), or it failed to serialize, deadlocked or lost its database
    /// connection (`409 TRANSACTION_ABORTED`); or a COMMIT whose answer was lost was found
    /// `rolled_back`, `expired` or `aborted` when the SDK asked the server how it ended; or the SDK
    /// ended it itself because one of its statements has an unknown outcome (that statement's call
    /// failed with [`Error::is_outcome_unknown`]; the SDK rolled the transaction back and never
    /// sends its COMMIT: every later step fails with this, [`Error::is_sent`] `false`). Run the
    /// whole transaction again: [`Client::transact`](crate::Client::transact) does.
    #[error("transaction lost ({code}): {message}")]
    TransactionLost {
        /// The protocol's error code, `TRANSACTION_EXPIRED` or `TRANSACTION_ABORTED` (also for a
        /// transaction the SDK ended itself, or found rolled back).
        code: String,
        /// The server's explanation, or the SDK's.
        message: String,
    },
}

impl ErrorKind {
    /// The HTTP status a kind stands for, when it comes from a response.
    pub(crate) fn response_status(&self) -> Option<u16> {
        match self {
            ErrorKind::Http { status, .. } => Some(*status),
            // A kind that stands for one code has that code's status (the protocol's table).
            kind => kind.protocol_code().map(ErrorCode::status),
        }
    }

    /// The protocol's code a kind stands for, when it comes from a response with one.
    pub(crate) fn protocol_code(&self) -> Option<ErrorCode> {
        Some(match self {
            ErrorKind::Sql { .. } => ErrorCode::SqlError,
            ErrorKind::Unauthorized { .. } => ErrorCode::Unauthorized,
            ErrorKind::ConstraintViolation { .. } => ErrorCode::ConstraintViolation,
            ErrorKind::StatementNotAllowed { .. } => ErrorCode::StatementNotAllowed,
            ErrorKind::ReadOnly { .. } => ErrorCode::ReadOnly,
            ErrorKind::StatementTimeout { .. } => ErrorCode::StatementTimeout,
            ErrorKind::IdempotencyKeyInUse { .. } => ErrorCode::IdempotencyKeyInUse,
            ErrorKind::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
            ErrorKind::RateLimited { .. } => ErrorCode::RateLimited,
            ErrorKind::Unavailable { .. } => ErrorCode::Unavailable,
            ErrorKind::OutcomeUnknown { .. } => ErrorCode::OutcomeUnknown,
            ErrorKind::BookmarkAhead { .. } => ErrorCode::BookmarkAhead,
            // A transaction the SDK ended itself carries the code it stands for.
            ErrorKind::TransactionLost { code, .. } => {
                return code.parse().ok().or(Some(ErrorCode::TransactionAborted));
            }
            ErrorKind::Http { code, .. } => return code.as_deref()?.parse().ok(),
            _ => return None,
        })
    }
}

/// The kind of constraint behind a [`ErrorKind::ConstraintViolation`], as the server reports it in its
/// error body's `constraint` member (`unique`, `primary_key`, `foreign_key`, `check`, `not_null`).
///
/// New kinds may be added in minor releases, so keep a wildcard arm; a value this version does not know
/// comes back as [`Other`](Self::Other) with the server's text.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConstraintKind {
    /// A `UNIQUE` constraint or unique index.
    Unique,
    /// A `PRIMARY KEY`.
    PrimaryKey,
    /// A `FOREIGN KEY` reference.
    ForeignKey,
    /// A `CHECK` constraint.
    Check,
    /// A `NOT NULL` column.
    NotNull,
    /// A kind this version of the SDK does not know, as the server named it.
    Other(String),
}

impl ConstraintKind {
    /// Reads the protocol's name of a constraint kind.
    pub(crate) fn from_wire(name: &str) -> Self {
        match Constraint::from_name(name) {
            Some(Constraint::Unique) => ConstraintKind::Unique,
            Some(Constraint::PrimaryKey) => ConstraintKind::PrimaryKey,
            Some(Constraint::ForeignKey) => ConstraintKind::ForeignKey,
            Some(Constraint::Check) => ConstraintKind::Check,
            Some(Constraint::NotNull) => ConstraintKind::NotNull,
            // `exclusion` (PostgreSQL's) and kinds this version does not know.
            _ => ConstraintKind::Other(name.to_owned()),
        }
    }

    /// The protocol's name of the kind (`unique`, `primary_key`, ...).
    pub fn as_str(&self) -> &str {
        match self {
            ConstraintKind::Unique => Constraint::Unique.as_str(),
            ConstraintKind::PrimaryKey => Constraint::PrimaryKey.as_str(),
            ConstraintKind::ForeignKey => Constraint::ForeignKey.as_str(),
            ConstraintKind::Check => Constraint::Check.as_str(),
            ConstraintKind::NotNull => Constraint::NotNull.as_str(),
            ConstraintKind::Other(name) => name,
        }
    }

    /// A human name for messages.
    fn describe(&self) -> &str {
        match self {
            ConstraintKind::Unique => "unique constraint",
            ConstraintKind::PrimaryKey => "primary key",
            ConstraintKind::ForeignKey => "foreign key",
            ConstraintKind::Check => "check constraint",
            ConstraintKind::NotNull => "not-null constraint",
            ConstraintKind::Other(_) => "constraint",
        }
    }
}

impl fmt::Display for ConstraintKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ErrorKind {
    /// The protocol's error code a kind stands for, when it comes from a response.
    pub(crate) fn wire_code(&self) -> Option<&str> {
        match self {
            // As the server sent them (a code this version does not know included).
            ErrorKind::Sql { code, .. } | ErrorKind::TransactionLost { code, .. } => Some(code),
            ErrorKind::Http { code, .. } => code.as_deref(),
            kind => kind.protocol_code().map(ErrorCode::as_str),
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
    /// The server's `X-Request-Id` for this attempt, when its response carried a sane one: quote
    /// it to the server's operator to find the attempt in the server's log.
    pub request_id: Option<String>,
}

/// The boxed cause of an error: the HTTP stack's or the JSON parser's own error.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

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
///     _ if err.is_outcome_unknown() => {
///         // The write may have been applied. Re-sending it with the same key applies it at most once.
///         println!("unknown outcome; key {:?}", err.idempotency_key());
///     }
///     _ if err.is_retryable() => println!("transient, gave up after {} attempts", err.attempts()),
///     _ => println!("final: {err}"),
/// }
/// # }
/// ```
///
/// [`std::error::Error::source`] returns the underlying cause when there is one: the
/// [`reqwest::Error`] of a failed exchange. A decode failure has no source: the JSON parser's own
/// error quotes the offending cell. Neither `Display` nor `Debug` of this type, nor anything in its
/// `source()` chain, prints a bound value or a cell.
pub struct Error {
    inner: Box<Inner>,
}

struct Inner {
    kind: ErrorKind,
    attempts: u32,
    history: Vec<AttemptFailure>,
    budget_exhausted: bool,
    retry_state: Option<crate::RetryState>,
    rows_inserted: Option<u64>,
    sent: bool,
    outcome_unknown: bool,
    idempotency_key: Option<String>,
    statement_index: Option<usize>,
    request_id: Option<String>,
    source: Option<BoxError>,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind) -> Self {
        Self {
            inner: Box::new(Inner {
                kind,
                attempts: 0,
                history: Vec::new(),
                budget_exhausted: false,
                retry_state: None,
                rows_inserted: None,
                sent: false,
                outcome_unknown: false,
                idempotency_key: None,
                statement_index: None,
                request_id: None,
                source: None,
            }),
        }
    }

    pub(crate) fn config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Config {
            message: message.into(),
        })
    }

    /// A decode failure of the JSON parser, its message stripped of values and of the position in
    /// the body. The parser's error is not kept as the source: it quotes what it read.
    #[allow(
        clippy::needless_pass_by_value,
        reason = "the adapter of `.map_err(Error::decode)`, which hands the error over by value"
    )]
    pub(crate) fn decode(err: serde_json::Error) -> Self {
        Self::new(ErrorKind::Decode {
            row: None,
            column: None,
            message: crate::wire::decode::redact(&crate::wire::decode::without_position(&err)),
        })
    }

    pub(crate) fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.inner.source = Some(source.into());
        self
    }

    pub(crate) fn with_boxed_source(mut self, source: Option<BoxError>) -> Self {
        self.inner.source = source;
        self
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

    /// The client's retry state when its budget or its adaptive rate refused this call.
    pub(crate) fn with_retry_state(mut self, state: crate::RetryState) -> Self {
        self.inner.retry_state = Some(state);
        self
    }

    pub(crate) fn with_rows_inserted(mut self, rows: u64) -> Self {
        self.inner.rows_inserted = Some(rows);
        self
    }

    pub(crate) fn with_sent(mut self, sent: bool, outcome_unknown: bool) -> Self {
        self.inner.sent = sent;
        self.inner.outcome_unknown = outcome_unknown;
        self
    }

    /// Marks a call whose effect may have happened (a COMMIT still unknown after asking).
    pub(crate) fn with_outcome_unknown(mut self) -> Self {
        self.inner.outcome_unknown = true;
        self
    }

    pub(crate) fn with_idempotency_key(mut self, key: Option<String>) -> Self {
        self.inner.idempotency_key = key;
        self
    }

    pub(crate) fn with_statement_index(mut self, index: Option<usize>) -> Self {
        self.inner.statement_index = index;
        self
    }

    pub(crate) fn with_request_id(mut self, request_id: Option<String>) -> Self {
        self.inner.request_id = request_id;
        self
    }

    /// The kind and the source, for a failure carried on as an attempt's.
    pub(crate) fn into_parts(self) -> (ErrorKind, Option<BoxError>) {
        let inner = *self.inner;
        (inner.kind, inner.source)
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

    /// The client's retry budget and adaptive send rate as they were when one of them refused this
    /// call (its budget could not pay for a retry: [`is_budget_exhausted`](Self::is_budget_exhausted);
    /// or its rate would have held an attempt past `max_elapsed`:
    /// [`ErrorKind::ClientRateLimited`], or a failure whose retry it held back). `None` when
    /// neither refused it.
    pub fn retry_state(&self) -> Option<crate::RetryState> {
        self.inner.retry_state
    }

    /// For a bulk insert that was split into several statements: how many rows earlier statements were
    /// confirmed to have committed before this failure. `None` when none had. A lower bound: after a
    /// timeout or a lost connection, the failed statement itself may have committed too.
    pub fn rows_inserted(&self) -> Option<u64> {
        self.inner.rows_inserted
    }

    /// Whether the request may have reached the server, on any attempt of the call.
    ///
    /// `false` when nothing left the client: the call failed before sending (a parameter, a setting,
    /// a cancelled token), or every attempt failed to connect (connection refused, DNS failure, a TLS
    /// handshake failure, the connect timeout). `true` as soon as an attempt may have been written to
    /// a connection: a response of any status, a timeout or a connection lost after connecting, a
    /// cancellation mid-attempt. For a bulk insert it speaks of the statement that failed;
    /// [`rows_inserted`](Self::rows_inserted) counts the earlier ones.
    pub fn is_sent(&self) -> bool {
        self.inner.sent
    }

    /// For writes (`insert`, `execute`, a write batch) and a transaction's steps: whether the
    /// statement (or the COMMIT) may have been applied although the call failed. True when an
    /// attempt was sent and no answer settled it: it timed out, its connection was lost after
    /// sending, it was cancelled mid-flight, a gateway answered `502`/`504`, or the server reported
    /// it still running (`409 IDEMPOTENCY_KEY_IN_USE`), and no later attempt got a final answer;
    /// and always when the call ends on the server's own [`ErrorKind::OutcomeUnknown`], whatever
    /// earlier attempts met. Always `false` for reads.
    ///
    /// For a write, re-send it with the same key ([`idempotency_key`](Self::idempotency_key)): a server
    /// that honours keys applies it at most once. For `execute`, check before running it again. For
    /// a transaction's statement, the SDK has rolled the transaction back (nothing of it will be
    /// committed). For a COMMIT, the SDK has already asked the server how the transaction ended for
    /// as long as the retry policy allows ([`Transaction::commit`](crate::Transaction::commit)).
    pub fn is_outcome_unknown(&self) -> bool {
        self.inner.outcome_unknown
    }

    /// The idempotency key of a write that failed after it was sent: the key given with
    /// [`Insert::idempotency_key`](crate::Insert::idempotency_key), or the one the SDK made for the call.
    /// Re-sending the same rows with `.idempotency_key(key)` (from any process, within the server's key
    /// lifetime) is then applied at most once: statements that committed are replayed, not run again.
    /// `None` for reads, `execute`, and writes that never reached the server.
    pub fn idempotency_key(&self) -> Option<&str> {
        self.inner.idempotency_key.as_deref()
    }

    /// For a batch ([`Client::batch`](crate::Client::batch), or an
    /// [`atomic`](crate::Insert::atomic) insert): the zero-based position of the statement that
    /// failed, when the failure belongs to one (the server names it in its error body, or the SDK
    /// found a parameter it cannot bind). Nothing of the batch was applied. `None` for a failure of
    /// the whole batch (a connection, a timeout, a limit) and for single-statement calls.
    pub fn statement_index(&self) -> Option<usize> {
        self.inner.statement_index
    }

    /// The server's `X-Request-Id` for the last attempt, when that attempt got a response
    /// carrying a sane one (1 to 128 visible ASCII characters). The server logs every request
    /// under its id, so this is what to quote to its operator; each attempt's id is in
    /// [`history`](Self::history). `None` when the last attempt got no response (a timeout, a lost
    /// connection) or the server sends no ids.
    ///
    /// ```
    /// # async fn run(client: sqlhttp::Client) {
    /// if let Err(err) = client.execute("DELETE FROM audit").await {
    ///     eprintln!("failed: {err} (request id {})", err.request_id().unwrap_or("none"));
    /// }
    /// # }
    /// ```
    pub fn request_id(&self) -> Option<&str> {
        self.inner.request_id.as_deref()
    }

    /// The kind of constraint a [`ErrorKind::ConstraintViolation`] names, when the server said.
    pub fn constraint(&self) -> Option<&ConstraintKind> {
        match &self.inner.kind {
            ErrorKind::ConstraintViolation { constraint, .. } => constraint.as_ref(),
            _ => None,
        }
    }

    /// The HTTP status of the response that failed, when there was one.
    pub fn status(&self) -> Option<u16> {
        match &self.inner.kind {
            // An insert row over the body limit is found before anything is sent; a transaction
            // the SDK ended itself fails its later steps before they are sent.
            ErrorKind::PayloadTooLarge { .. } | ErrorKind::TransactionLost { .. }
                if self.inner.attempts == 0 =>
            {
                None
            }
            kind => kind.response_status(),
        }
    }

    /// The protocol's error code (`SQL_ERROR`, `CONSTRAINT_VIOLATION`, `OUTCOME_UNKNOWN`,
    /// `BOOKMARK_AHEAD`, ...), when the server sent one.
    pub fn code(&self) -> Option<&str> {
        match &self.inner.kind {
            // As for `status`: found before anything was sent.
            ErrorKind::PayloadTooLarge { .. } | ErrorKind::TransactionLost { .. }
                if self.inner.attempts == 0 =>
            {
                None
            }
            kind => kind.wire_code(),
        }
    }

    /// The wait the server asked for with `Retry-After` (on `429`, `503` and
    /// `409 IDEMPOTENCY_KEY_IN_USE`), uncapped.
    pub fn retry_after(&self) -> Option<Duration> {
        match &self.inner.kind {
            ErrorKind::RateLimited { retry_after, .. }
            | ErrorKind::Unavailable { retry_after, .. }
            | ErrorKind::OutcomeUnknown { retry_after, .. }
            | ErrorKind::IdempotencyKeyInUse { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Whether the failure is transient: the same request could succeed later (connection failures,
    /// timeouts, 408, 429, 5xx except 501, a key still in use). Says nothing of whether the call's class
    /// allowed a retry.
    pub fn is_retryable(&self) -> bool {
        crate::retry::classify::is_transient(&self.inner.kind)
    }

    /// Whether the attempt ran out of time on the client (the attempt's timeout or the connect
    /// timeout). A statement the *server* interrupted is [`ErrorKind::StatementTimeout`].
    pub fn is_timeout(&self) -> bool {
        matches!(self.inner.kind, ErrorKind::Timeout { .. })
    }

    /// Whether the connection failed (refused, reset, closed early).
    pub fn is_connection(&self) -> bool {
        matches!(self.inner.kind, ErrorKind::Connection { .. })
    }

    /// Whether an interactive transaction was lost before it committed
    /// ([`ErrorKind::TransactionLost`]): nothing of it was committed, and it may be run again.
    pub fn is_transaction_lost(&self) -> bool {
        matches!(self.inner.kind, ErrorKind::TransactionLost { .. })
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
            .field("attempts", &self.inner.attempts)
            .field("sent", &self.inner.sent);
        if self.inner.outcome_unknown {
            d.field("outcome_unknown", &true);
        }
        if let Some(key) = &self.inner.idempotency_key {
            d.field("idempotency_key", key);
        }
        if let Some(id) = &self.inner.request_id {
            d.field("request_id", id);
        }
        if self.inner.budget_exhausted {
            d.field("budget_exhausted", &true);
        }
        if let Some(state) = &self.inner.retry_state {
            d.field("retry_state", state);
        }
        if let Some(rows) = self.inner.rows_inserted {
            d.field("rows_inserted", &rows);
        }
        if let Some(index) = self.inner.statement_index {
            d.field("statement_index", &index);
        }
        if !self.inner.history.is_empty() {
            d.field("history", &self.inner.history);
        }
        // The source's own Debug could quote a cell (a JSON parser's message): only say it is there.
        if self.inner.source.is_some() {
            d.field("source", &format_args!("Some(..)"));
        }
        d.finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner.kind, f)?;
        if let Some(index) = self.inner.statement_index {
            write!(
                f,
                " (statement {index} of the batch; nothing of the batch was applied)"
            )?;
        }
        if self.inner.attempts > 1 {
            write!(f, " (after {} attempts)", self.inner.attempts)?;
        }
        if self.inner.budget_exhausted {
            f.write_str(" (retry budget exhausted)")?;
        }
        if let Some(rows) = self.inner.rows_inserted {
            write!(f, " ({rows} rows were inserted before the failure)")?;
        }
        if self.inner.outcome_unknown {
            match &self.inner.idempotency_key {
                Some(key) => write!(
                    f,
                    " (outcome unknown: the write may have been applied; re-send it with idempotency key {key} to apply it at most once)"
                )?,
                None => f.write_str(" (outcome unknown: the statement may have been applied)")?,
            }
        }
        Ok(())
    }
}

/// The source is the HTTP stack's or the JSON parser's error behind the kind, when there is one.
impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner
            .source
            .as_deref()
            .map(|source| source as &(dyn std::error::Error + 'static))
    }
}
