//! `sqlhttpd`, the reference server for the sqlhttp wire protocol v1, on an embedded SQLite
//! engine or a PostgreSQL database (see `docs/protocol.md` for the protocol).
//!
//! This crate root only wires the modules together and re-exports the public API:
//! [`Config`] and [`Database`] (configuration), [`Server`] and [`ServerHandle`] (running it),
//! [`app`] and [`AppState`] (the HTTP app, for in-process use) and [`ServerError`].
//!
//! ```no_run
//! use sqlhttp_server::{Config, Server};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config = Config {
//!     database: "sqlite:app.db".parse()?,
//!     tokens: vec!["s3cret".to_owned()],
//!     ..Config::default()
//! };
//! let server = Server::bind(config).await?;
//! println!("listening on http://{}", server.local_addr());
//! server.serve_until(async { tokio::signal::ctrl_c().await.unwrap() }).await?;
//! # Ok(())
//! # }
//! ```
//!
//! The PostgreSQL engine is behind the default-on `postgres` feature; without it the server
//! serves SQLite only.

// Without `postgres`, what only the PostgreSQL engine calls (the async chunk sender, reading
// dollar quotes, the URL's parts) is built but unused: the SQLite-only build stays warning-free.
#![cfg_attr(not(feature = "postgres"), allow(dead_code))]

mod budget;
mod config;
mod engine;
mod error;
mod hex;
mod http;
mod protocol;
mod secrets;
mod server;
mod state;
mod timing;
mod tls;
mod transactions;

pub use config::{
    Config, DEFAULT_CLIENT_ROLE, DEFAULT_IDEMPOTENCY_TTL, DEFAULT_LISTEN, DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_BUFFERED_BYTES, Database, HttpLimits, Limits, PostgresUrl,
    RateLimit, ReadReplicas, TlsFiles, TransactionLimits, parse_duration,
};
pub use error::ServerError;
pub use http::app;
pub use secrets::{parse_token_file, read_token_file};
pub use server::{Server, ServerHandle};
pub use state::AppState;
pub use tls::TlsReloader;

/// The text of a panic payload, for logs.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string panic payload")
}
