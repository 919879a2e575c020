//! What can go wrong on a connection: PostgreSQL's own errors ([`DbError`], the connection still
//! usable once its `ReadyForQuery` is read) and the connection's failures ([`Error`]'s other
//! variants, after which the connection is in doubt and must be dropped).
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
    /// is read lossily, an unknown one is skipped.
    pub(crate) fn parse(body: &ErrorResponseBody) -> io::Result<DbError> {
        let mut error = DbError::default();
        let mut fields = body.fields();
        while let Some(field) = fields.next()? {
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

/// A connection's failure: the connection is in doubt after any of them, but for the refusals
/// [`Error::Db`] names ([`crate::Connection::is_in_doubt`] says).
#[derive(Debug)]
pub enum Error {
    /// PostgreSQL answered an error that ended the session (`FATAL`, `PANIC`), or refused the
    /// login; the connection is in doubt. Or it refused a statement that
    /// [`crate::Connection::describe`] prepared, or one of a flight that
    /// [`crate::Answers::finish`] read: then the flight was read to its end and the connection
    /// is not in doubt. A statement's ordinary error in a flight read answer by answer is
    /// [`crate::Answer::Error`] instead.
    Db(Box<DbError>),
    /// A message declared more bytes than the connection takes ([`crate::Limits`]); nothing of
    /// its body was read.
    TooLarge {
        /// The message's type byte (`D` for a `DataRow`).
        tag: u8,
        /// The length its header declared, itself included.
        declared: usize,
        /// The most the connection takes.
        limit: usize,
    },
    /// The backend sent what the protocol does not allow at that point.
    Protocol(String),
    /// The server asked for an authentication method this connection does not speak, or for a
    /// password none was given for.
    Authentication(String),
    /// The socket failed or closed.
    Io(io::Error),
}

impl Error {
    /// The SQLSTATE code of a database error, `None` for a connection's failure.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Db(e) => Some(&e.code),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Db(e) => e.fmt(f),
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
            Error::Db(e) => Some(&**e),
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        Error::Io(e)
    }
}
