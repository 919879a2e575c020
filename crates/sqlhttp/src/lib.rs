//! A typed client for databases that speak SQL over HTTP (`POST /api/v1/sql`, protocol v1).
//!
//! * [`Client::query`] decodes rows straight from the response bytes into any `T: Deserialize`;
//!   [`Client::query_table`] returns columns with their types and dynamically typed rows;
//!   [`Client::execute`] runs a statement for its effect; [`Client::insert`] writes typed rows in bulk;
//!   [`Client::batch`] runs several statements in one transaction, all or nothing;
//!   [`Client::transaction`] opens an interactive one (read, decide, write), every step safe to
//!   retry, and [`Client::transact`] runs a closure in one, again when it is lost before it commits.
//! * [`Query::fetch`] streams rows of any number as they arrive ([`RowStream`]); every call decodes the
//!   body incrementally, and a result the server ends with an error is never taken for a whole one.
//! * Parameters are always bound (`.bind(value)`), never spliced into SQL; a BLOB is a [`Blob`] (or any
//!   value serialized as bytes) and comes back as one.
//! * Features: `rustls` (default) or `native-tls` for HTTPS; `gzip` and `zstd` ask for compressed
//!   responses (off by default: they pay across a network, not on loopback); `migrate` (default)
//!   for [`migrate`]; `test-util` for the in-process server of the `simulation` module (tokio's and
//!   clickhouse-rs's name for test-only items).
//! * Every call goes through one transport that retries exactly what is safe: reads by default, writes
//!   only under [`ClientBuilder::retry_writes`] (with an idempotency key), `execute` never. It honours
//!   `Retry-After`, stops at once when the caller cancels, and shares a retry budget across clones so a
//!   fleet cannot turn an outage into a retry storm. The rules are in the [`retry`] module.
//! * Read-your-writes behind read replicas: a client and its clones keep the greatest [`Bookmark`]
//!   the server answered with (in its `Sqlhttp-Bookmark` header, or at the end of a body that
//!   streamed) and send it on every request; [`Client::bookmark`] hands it to another process, a
//!   read's [`Consistency`] may ask for any replica or the primary instead, and
//!   [`Client::reset_bookmark`] starts afresh after a failover or a move to another cluster.
//! * An outcome the client cannot know is reported as such ([`Error::is_outcome_unknown`]): an
//!   interactive transaction whose statement has one is rolled back, never committed, and a COMMIT
//!   whose answer was lost is settled by asking the server how the transaction ended.
//! * One statement surface: a [`Transaction`] hands out the client's own builders ([`Query`],
//!   [`TableQuery`], [`Execute`], [`Insert`]), and [`Executor`] (for `&Client` and
//!   `&Transaction`) lets a function written once run on either.
//!
//! # What awaiting a builder means
//!
//! **Awaiting a builder runs it and gives the one thing it is for, the same on a [`Client`] and in
//! a [`Transaction`]**: [`TableQuery`] a [`Table`], [`Execute`] an [`ExecResult`] (rows affected,
//! last insert id), [`Insert`] the rows inserted, [`Batch`] one [`Table`] per statement,
//! [`TransactionBuilder`] the [`Transaction`], a [`RowStream`] itself once its first row has
//! arrived. A [`Query`] is not awaited: its finishing call says how its rows are decoded
//! (`fetch_all`, `fetch_one`, `fetch_optional`, or `fetch` to stream); so does an [`Execute`]'s
//! when its `RETURNING` rows are wanted. Nothing is sent before that.
//!
//! ```no_run
//! # async fn run() -> sqlhttp::Result<()> {
//! use serde::{Deserialize, Serialize};
//! use sqlhttp::Client;
//!
//! #[derive(Serialize, Deserialize)]
//! struct Book { id: i64, title: String, year: Option<i64> }
//!
//! let client = Client::builder("http://127.0.0.1:8080").bearer_token("secret").build()?;
//! client.execute("CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT NOT NULL, year INTEGER)").await?;
//! client.insert("books", &[Book { id: 1, title: "Dune".into(), year: Some(1965) }]).await?;
//! let old: Vec<Book> = client.query("SELECT * FROM books WHERE year < ?").bind(1970).fetch_all().await?;
//! let count: i64 = client.query("SELECT count(*) FROM books").fetch_one().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Other crates' types in this API
//!
//! A few types of other crates appear in this crate's API, each because it is the one a caller
//! already has or builds. **A breaking release of one of these crates that changes the type is a
//! breaking release of this one** (its major version, or its minor one while it is `0.x`), so an
//! upgrade of reqwest from 0.13 to 0.14 is a new major version of `sqlhttp`; a patch release of
//! theirs changes nothing here.
//!
//! | type | from | where | why |
//! |---|---|---|---|
//! | [`Proxy`] (re-exported) | reqwest 0.13 | [`ClientBuilder::proxy`] | the SDK's HTTP client is reqwest's: its proxy settings, not a copy of them |
//! | [`Certificate`], [`Identity`] (re-exported; `rustls` or `native-tls`) | reqwest 0.13 | [`ClientBuilder::add_root_certificate`], [`ClientBuilder::identity`] | parsed by the TLS stack that uses them, from PEM or DER |
//! | `reqwest::Client` (not re-exported: bring your own) | reqwest 0.13 | [`ClientBuilder::http_client`] | a client of yours, with its own connector (`sqlhttp-testkit`'s fault injection) |
//! | `reqwest::Error` | reqwest 0.13 | the [`source`](std::error::Error::source) of an [`Error`] from a failed exchange | the cause as reqwest saw it; downcast it only to log more |
//! | [`CancellationToken`] (re-exported) | tokio-util 0.7 | [`ClientBuilder::cancel_on`], every builder's `cancel_on` | tokio's shared cancellation signal: one token stops many calls, and a child token one client |
//! | `futures_core::Stream` (a trait) | futures-core 0.3 | implemented by [`RowStream`] | the stream trait every async stream combinator takes |
//! | `serde::Serialize`, `serde::Deserialize` (traits) | serde 1 | bounds of `bind`, `fetch_*`, `insert`; implemented by [`Value`], [`Blob`], [`Bookmark`] | rows are your own serde types |
//! | `serde_json::Value`, `serde_json::Error` | serde_json 1 | [`Value::Json`] and [`Value::as_json`]; the error of deserializing from a [`Value`] | a JSON cell (a PostgreSQL `json` or array) is the JSON value every Rust program already reads |
//! | [`Bookmark`], [`ParseBookmarkError`], [`Isolation`] (re-exported) | sqlhttp-protocol 0.1 | throughout | the one definition the server and the SDK share (this workspace's crate, released with this one) |
//! | `http::Request<bytes::Bytes>`, `http::Response<bytes::Bytes>` (`test-util`) | http 1, bytes 1 | `simulation::Request`, `simulation::Response` | the request the client would have sent, as the `http` crate every Rust HTTP stack shares |
//!
//! The SQL splitter the CLI uses (`sqlhttp::script`) and the body decoder the benches call
//! (`sqlhttp::decode`) are public paths only so those crates of this workspace can reach them:
//! they are `#[doc(hidden)]`, not part of the API, and may change in any release.

// docs.rs builds with `--cfg docsrs` on nightly (Cargo.toml's `[package.metadata.docs.rs]`): there
// the items of optional features carry their feature's badge.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod batch;
mod bookmark;
mod client;
mod cursor;
mod describe;
mod error;
mod executor;
mod insert;
pub mod macros;
#[cfg(feature = "migrate")]
#[cfg_attr(docsrs, doc(cfg(feature = "migrate")))]
pub mod migrate;
mod options;
mod response;
pub mod retry;
// Not part of the API (`#[doc(hidden)]`, may change in any release): the SQL script splitter
// the `sqlhttp` CLI and `sqlhttp-testkit` share (ADR 0049).
#[doc(hidden)]
pub mod script;
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod simulation;
mod statement;
mod stats;
mod table;
mod transaction;
mod transport;
mod value;
mod wire;

pub use batch::{Batch, BatchReport};
pub use bookmark::{Bookmark, Consistency, ParseBookmarkError};
pub use client::{Client, ClientBuilder};
pub use cursor::RowStream;
pub use describe::{ColumnInfo, ParamInfo, StatementColumn, StatementInfo, TableInfo};
pub use error::{AttemptFailure, ConstraintKind, Error, ErrorKind, Result};
pub use executor::Executor;
pub use insert::{Insert, InsertReport};
/// A proxy for [`ClientBuilder::proxy`] (reqwest's type: see "Other crates' types in this API").
pub use reqwest::Proxy;
/// A certificate authority and a client identity for [`ClientBuilder::add_root_certificate`] and
/// [`ClientBuilder::identity`] (reqwest's types: see "Other crates' types in this API").
#[cfg(any(feature = "rustls", feature = "native-tls"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "rustls", feature = "native-tls"))))]
pub use reqwest::{Certificate, Identity};
pub use retry::{Jitter, RetryBudget, RetryPolicy, RetryState};
/// Checked queries (ADR 0055): SQL, parameters and row types checked at compile time against
/// the statement's description, from the application's `.sqlhttp/` cache (`sqlhttp prepare`).
#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use sqlhttp_macros::{execute, query, query_as, query_scalar};
pub use statement::{Execute, Query, ResponseFuture, TableQuery};
pub use stats::{ServedBy, Stats};
pub use table::{Column, ExecResult, Row, Table};
/// Stops calls when cancelled: [`ClientBuilder::cancel_on`] and every builder's `cancel_on`
/// (tokio-util's type: see "Other crates' types in this API").
pub use tokio_util::sync::CancellationToken;
pub use transaction::{Isolation, Transaction, TransactionBuilder};
pub use transport::hedge::{HedgeDelay, HedgePolicy};
pub use value::Value;
pub use wire::blob::Blob;
// Not part of the API (`#[doc(hidden)]`, may change in any release): the body decoder, for the
// decode benchmark (ADR 0049).
#[doc(hidden)]
pub use wire::decode;

/// The README's examples compile (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// Compile-time promises: the client is cheap to share across tasks, and errors can cross threads.
#[allow(dead_code)]
fn _assert_impls() {
    fn send_sync<T: Send + Sync>() {}
    fn clone<T: Clone>() {}
    send_sync::<Client>();
    clone::<Client>();
    send_sync::<Error>();
    send_sync::<Query>();
    send_sync::<ClientBuilder>();
    fn send<T: Send>() {}
    send::<ResponseFuture<'static, u64>>();
    send::<Insert<'static, u8>>();
    send_sync::<Batch>();
    send_sync::<Bookmark>();
    send::<RowStream<u8>>();
    send_sync::<Transaction>();
    fn stream<S: futures_core::Stream<Item = Result<u8>> + Unpin>() {}
    stream::<RowStream<u8>>();
}
