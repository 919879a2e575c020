//! What can go wrong on a connection, and what each failure leaves of it: PostgreSQL's refusal
//! of a statement ([`Error::Db`], read to its `ReadyForQuery`: the connection is usable), an
//! error that ended the session ([`Error::Fatal`]), the caller's own input refused before
//! anything was sent ([`Error::Invalid`]: the connection is as it was), and the connection's
//! failures (the backend's protocol violations, the socket), after which it is in doubt and must
//! be dropped.
//!
//! Knows the backend's error fields; nothing about what the statements were for.

use std::fmt;
use std::io;

use fallible_iterator::FallibleIterator;
use postgres_protocol::message::backend::ErrorResponseBody;

/// An `ErrorResponse` (or a notice) as PostgreSQL sent it: its fields by their one-byte codes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DbError {
    /// `V`: the severity, never localized (`ERROR`, `FATAL`, `PANIC`).
    pub severity: String,
    /// `C`: the SQLSTATE code, five characters.
    pub code: String,
    /// `M`: the primary message.
    pub message: String,
    /// `D`: the detail, when any.
    pub detail: Option<String>,
    /// `H`: the hint, when any.
    pub hint: Option<String>,
    /// `P`: the position in the statement's text (1-based, in characters), when any.
    pub position: Option<u32>,
    /// `s`, `t`, `c`, `n`: the schema, table, column and constraint the error is about.
    pub schema: Option<String>,
    /// See [`DbError::schema`].
    pub table: Option<String>,
    /// See [`DbError::schema`].
    pub column: Option<String>,
    /// See [`DbError::schema`].
    pub constraint: Option<String>,
    /// `W`: the context the error arose in, innermost first (a PL/pgSQL function's line, a
    /// query a function ran), when any.
    pub where_: Option<String>,
    /// `R`: the routine in PostgreSQL's source that reported the error (`exec_stmt_raise` for
    /// PL/pgSQL's `RAISE`, which tells an error a client's code raised from PostgreSQL's own),
    /// when any.
    pub routine: Option<String>,
}

impl DbError {
    /// Whether the backend ends the session with this error (`FATAL`, `PANIC`): whatever the
    /// session was doing has an outcome its client cannot learn from it.
    pub fn ends_the_session(&self) -> bool {
        matches!(self.severity.as_str(), "FATAL" | "PANIC")
    }

    /// Reads the fields of an `ErrorResponse` or `NoticeResponse` body; a field that is not UTF-8
    /// is read lossily, an unknown one is skipped, a body that does not parse is the backend's
    /// protocol error.
    pub(crate) fn parse(body: &ErrorResponseBody) -> Result<DbError, Error> {
        let mut error = DbError::default();
        let mut fields = body.fields();
        while let Some(field) = fields.next().map_err(|e| Error::malformed(&e))? {
            let value = String::from_utf8_lossy(field.value_bytes()).into_owned();
            match field.type_() {
                b'V' => error.severity = value,
                b'S' if error.severity.is_empty() => error.severity = value,
                b'C' => error.code = value,
                b'M' => error.message = value,
                b'D' => error.detail = Some(value),
                b'H' => error.hint = Some(value),
                b'P' => error.position = value.parse().ok(),
                b's' => error.schema = Some(value),
                b't' => error.table = Some(value),
                b'c' => error.column = Some(value),
                b'n' => error.constraint = Some(value),
                b'W' => error.where_ = Some(value),
                b'R' => error.routine = Some(value),
                _ => {}
            }
        }
        Ok(error)
    }
}

impl fmt::Display for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.severity, self.code, self.message)
    }
}

impl std::error::Error for DbError {}

/// A failure, each variant saying what it leaves of the connection
/// ([`crate::Connection::is_in_doubt`] says it too).
#[derive(Debug)]
pub enum Error {
    /// PostgreSQL refused a statement, and its flight was read to its last `ReadyForQuery`: the
    /// refusal's outcome is known (the refused statement took no effect, the messages after it
    /// up to its `Sync` were skipped, and a transaction it was in is failed, an implicit one
    /// rolled back), and the connection is not in doubt. Returned by [`crate::Answers::finish`] and
    /// [`crate::Connection::describe`]; a flight read answer by answer hands such a refusal
    /// over as [`crate::Answer::Error`] instead.
    Db(Box<DbError>),
    /// PostgreSQL ended the session with this error (`FATAL`, `PANIC`: an administrator's
    /// shutdown, an idle session's timeout, a crash), or refused the login. The connection is
    /// in doubt and must be dropped, and what its flight had sent has an outcome unknown: a
    /// `COMMIT` may have committed.
    Fatal(Box<DbError>),
    /// The caller's own input could not be sent as asked (a NUL byte in a statement's text, a
    /// name or a login field, more than 65 535 parameters, a message past 2 GiB, a flight that
    /// does not end with its `Sync`, a flight on a connection in doubt): refused before
    /// anything of it was sent, so the connection is as it was (clean, if it was clean).
    /// Retried as it is, the same input fails the same way.
    Invalid(String),
    /// A message declared more bytes than the connection takes ([`crate::Limits`]): refused
    /// from its header, without waiting for the rest of its body (a read may already hold part
    /// of it). The connection is in doubt.
    TooLarge {
        /// The message's type byte (`D` for a `DataRow`).
        tag: u8,
        /// The length its header declared, itself included.
        declared: usize,
        /// The most the connection takes.
        limit: usize,
    },
    /// The backend sent what the protocol does not allow at that point, or a message that does
    /// not parse (an unknown type, a malformed body, text that is not UTF-8). The connection is
    /// in doubt.
    Protocol(String),
    /// The server asked for an authentication method this connection does not speak, or for a
    /// password none was given for; no connection was made.
    Authentication(String),
    /// The socket failed or closed. The connection is in doubt.
    Io(io::Error),
}

impl Error {
    /// The SQLSTATE code of PostgreSQL's error ([`Error::Db`], [`Error::Fatal`]), `None` for
    /// the others.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Db(e) | Error::Fatal(e) => Some(&e.code),
            _ => None,
        }
    }

    /// A backend message that does not parse: the backend's protocol violation.
    pub(crate) fn malformed(e: &io::Error) -> Error {
        Error::Protocol(format!("a malformed message: {e}"))
    }

    /// The caller's input a message could not be encoded from.
    pub(crate) fn unencodable(e: &io::Error) -> Error {
        Error::Invalid(format!("a message could not be encoded: {e}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Db(e) => e.fmt(f),
            Error::Fatal(e) => write!(f, "the session ended: {e}"),
            Error::Invalid(what) => write!(f, "refused before sending: {what}"),
            Error::TooLarge {
                tag,
                declared,
                limit,
            } => write!(
                f,
                "a message of type {:?} declared {declared} bytes, past the limit of {limit}",
                char::from(*tag)
            ),
            Error::Protocol(what) => write!(f, "protocol error: {what}"),
            Error::Authentication(what) => write!(f, "authentication failed: {what}"),
            Error::Io(e) => write!(f, "connection failed: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Db(e) | Error::Fatal(e) => Some(&**e),
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// The socket's failure ([`Error::Io`]); a message's parse or encoding failure is mapped
/// explicitly instead ([`Error::Protocol`], [`Error::Invalid`]).
impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        Error::Io(e)
    }
}
