//! The wire format, apart from any engine or handler: decoding a `POST /api/v1/sql` body
//! ([`request`]) and a `POST /api/v1/batch` body ([`batch`]), the error table ([`error`]), and the
//! one writer of a statement's success body ([`result`]), which both engines feed cell by cell.
//!
//! Pure functions and types over bytes: nothing here knows HTTP routing, SQLite or PostgreSQL.
//! The protocol itself is documented in `docs/protocol.md`. What the server and its clients must
//! agree on (header names, the bookmark, the error table, isolation names, the bodies' types and
//! member names, the defaults) is the `sqlhttp_protocol` crate's (ADR 0048): this module adapts
//! it to the server (its decoders, its writer, axum's responses) and defines none of it again.

pub(crate) mod batch;
pub(crate) mod bookmark;
pub(crate) mod error;
pub(crate) mod request;
pub(crate) mod result;
pub(crate) mod transaction;
