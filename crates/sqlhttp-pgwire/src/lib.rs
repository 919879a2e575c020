//! sqlhttpd's PostgreSQL connection for the request path (ADR 0059): a session over a stream
//! the caller opened, which speaks the extended protocol in **flights** (every message of a
//! step written at once, ended by one `Sync`), reads each backend message once with its length
//! bounded before its body arrives, and hands rows over as the bytes they came in.
//!
//! Built on `postgres-protocol`, the message codec tokio-postgres is built on. It has no pool,
//! no statement cache, no types and no tasks of its own: the engine decides what a flight holds
//! and when a connection goes back to its pool ([`Connection::is_clean`]).
//!
//! - [`Connection`]: login (trust, cleartext, MD5, SCRAM-SHA-256) and the bounded reader,
//!   whose buffers go back to their usual size once a large row or parameter was carried, so a
//!   connection pooled for hours does not keep the largest message it saw
//!   ([`Connection::buffer_capacity`]);
//! - [`Flight`] and [`Answers`]: one step's messages out, its answers in;
//! - [`Connection::describe`]: a statement prepared and described in one flight, its
//!   parameters' types and its columns ([`Described`]), for a statement cache;
//! - [`Row`] and [`Cells`]: a row's cells walked as the bytes they came in, with no allocation
//!   (the row's framing is checked once, when it arrives); a statement's [`Tag`] likewise;
//! - [`cancel`]: a cancel request for a session's running statement;
//! - [`Error`]: each failure says what it leaves of the connection: a statement refused and
//!   read to its `ReadyForQuery` ([`Error::Db`], usable), a session PostgreSQL ended
//!   ([`Error::Fatal`], in doubt, a `COMMIT`'s outcome unknown), the caller's input refused
//!   before anything was sent ([`Error::Invalid`], as it was), the backend's protocol violation
//!   or the socket's failure (in doubt).
//!
//! Knows nothing about HTTP, requests or sqlhttpd's answers.

#![forbid(unsafe_code)]

mod cancel;
mod connection;
mod describe;
mod error;
mod flight;

pub use cancel::cancel;
pub use connection::{BackendKey, Connection, Limits, RowPast, Startup, TransactionStatus};
pub use describe::Described;
pub use error::{DbError, Error};
pub use flight::{Answer, Answers, Cells, Column, Columns, Flight, Format, Param, Row, Tag};
