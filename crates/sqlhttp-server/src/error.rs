//! [`ServerError`]: why a server could not be configured, started or opened.
//!
//! Start-up errors only; per-request failures are the wire protocol's error bodies and live in
//! `api_error`. This module knows nothing about HTTP.

use std::net::SocketAddr;

/// A failure to configure or start a server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The database URL is not one of the accepted forms.
    #[error("invalid database URL `{url}`: {reason}")]
    InvalidDatabaseUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A duration (such as `--idempotency-ttl`) could not be parsed.
    #[error("invalid duration `{input}`: {reason}")]
    InvalidDuration {
        /// The text as given.
        input: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The database could not be opened or prepared for use.
    #[error("cannot open database {database}: {source}")]
    OpenDatabase {
        /// The database, as `:memory:` or its path.
        database: String,
        /// The engine's error.
        #[source]
        source: rusqlite::Error,
    },
    /// The engine thread could not be started.
    #[error("cannot start the engine thread: {0}")]
    EngineThread(#[source] std::io::Error),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address that was asked for.
        addr: SocketAddr,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

impl ServerError {
    pub(crate) fn open_database(database: &crate::Database, source: rusqlite::Error) -> Self {
        let database = match database {
            crate::Database::Memory => ":memory:".to_owned(),
            crate::Database::File(path) => path.display().to_string(),
        };
        ServerError::OpenDatabase { database, source }
    }
}
