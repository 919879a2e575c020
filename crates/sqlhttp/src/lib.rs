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
//!   responses (off by default: they pay across a network, not on loopback).
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

// docs.rs builds with `--cfg docsrs` on nightly (Cargo.toml's `[package.metadata.docs.rs]`): there
// the items of optional features carry their feature's badge.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod batch;
mod bookmark;
mod client;
mod cursor;
mod describe;
mod error;
mod insert;
#[cfg(feature = "migrate")]
#[cfg_attr(docsrs, doc(cfg(feature = "migrate")))]
pub mod migrate;
mod options;
mod response;
pub mod retry;
pub mod script;
#[cfg(feature = "simulation")]
#[cfg_attr(docsrs, doc(cfg(feature = "simulation")))]
pub mod simulation;
mod statement;
mod table;
mod transaction;
mod transport;
mod value;
mod wire;

pub use batch::{Batch, BatchReport};
pub use bookmark::{Bookmark, Consistency, ParseBookmarkError};
pub use client::{Client, ClientBuilder};
pub use cursor::RowStream;
pub use describe::{ColumnInfo, TableInfo};
pub use error::{AttemptFailure, ConstraintKind, Error, ErrorKind, Result};
pub use insert::{Insert, InsertReport};
/// A proxy for [`ClientBuilder::proxy`] (reqwest's type).
pub use reqwest::Proxy;
/// A certificate authority and a client identity for [`ClientBuilder::add_root_certificate`] and
/// [`ClientBuilder::identity`] (reqwest's types).
#[cfg(any(feature = "rustls", feature = "native-tls"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "rustls", feature = "native-tls"))))]
pub use reqwest::{Certificate, Identity};
pub use retry::{Jitter, RetryBudget, RetryPolicy};
pub use statement::{Execute, Query, ResponseFuture, TableQuery};
pub use table::{Column, ExecResult, Row, Table};
pub use tokio_util::sync::CancellationToken;
pub use transaction::{Isolation, Transaction, TransactionBuilder, TxStatement};
pub use value::Value;
pub use wire::blob::Blob;
pub use wire::decode;

/// The README's examples compile (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
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
    fn stream<S: futures_core::Stream<Item = Result<u8>> + Unpin>() {}
    stream::<RowStream<u8>>();
}
