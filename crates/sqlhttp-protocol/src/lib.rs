//! What the sqlhttp server (`sqlhttpd`) and its clients must agree on, written once: the wire
//! protocol v1's header names ([`header`]), endpoint paths ([`path`]), the [`Bookmark`] and its
//! text, the error-code table with each code's HTTP status and retry class ([`ErrorCode`]),
//! isolation level names ([`Isolation`]), the request and response bodies as typed serde
//! definitions with their member names ([`body`]), and the server's documented defaults
//! ([`defaults`]). `docs/protocol.md` is the prose, `docs/openapi.yaml` the machine-readable
//! contract; a test holds that document to this crate.
//!
//! What must **not** live here: an HTTP client or server, I/O of any kind, an engine, retry
//! timing, or anything one side alone decides. Its dependencies are `serde` and `serde_json`
//! (the body types hold JSON values) and nothing else, so both sides can depend on it cheaply.
//!
//! A change to this crate is a change to the protocol: both sides and the document move with
//! it, and it is versioned as such (ADR 0048).
//!
//! ```
//! use sqlhttp_protocol::{Bookmark, ErrorCode, RetryClass, header};
//!
//! let bookmark: Bookmark = "000000000169a3f8".parse()?;
//! assert_eq!(bookmark.to_string(), "000000000169a3f8");
//! assert_eq!(header::BOOKMARK, "sqlhttp-bookmark");
//!
//! let code: ErrorCode = "OUTCOME_UNKNOWN".parse().unwrap();
//! assert_eq!(code.status(), 503);
//! assert_eq!(code.retry_class(), RetryClass::Transient);
//! # Ok::<(), sqlhttp_protocol::ParseBookmarkError>(())
//! ```

#![forbid(unsafe_code)]

pub mod body;
mod bookmark;
pub mod defaults;
mod error;
pub mod header;
mod isolation;
pub mod path;

pub use bookmark::{BOOKMARK_DIGITS, Bookmark, ParseBookmarkError};
pub use error::{Constraint, ErrorCode, RetryClass, UnknownErrorCode};
pub use isolation::{Isolation, UnknownIsolation};
