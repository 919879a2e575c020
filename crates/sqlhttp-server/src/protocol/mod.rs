//! The wire format, apart from any engine or handler: decoding a `POST /api/v1/sql` body
//! ([`request`]) and a `POST /api/v1/batch` body ([`batch`]), the error table ([`error`]), and the
//! one writer of a statement's success body ([`result`]), which both engines feed cell by cell.
//!
//! Pure functions and types over bytes: nothing here knows HTTP routing, SQLite or PostgreSQL.
//! The protocol itself is documented in `docs/protocol.md`.

pub(crate) mod batch;
pub(crate) mod bookmark;
pub(crate) mod error;
pub(crate) mod request;
pub(crate) mod result;
