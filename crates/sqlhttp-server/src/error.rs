//! [`ServerError`]: why a server could not be configured, started or opened.
//!
//! Start-up errors only; per-request failures are the wire protocol's error bodies and live in
//! `protocol::error`. This module knows nothing about HTTP.

use std::net::SocketAddr;
use std::path::PathBuf;

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
    /// The PostgreSQL client role (`--client-role`) is not a plain identifier.
    #[error(
        "invalid client role `{role}`: use lowercase ASCII letters, digits and `_`, not starting \
         with a digit or `pg_`, at most 63 bytes, other than `_sqlhttp`"
    )]
    InvalidClientRole {
        /// The role as given.
        role: String,
    },
    /// The PostgreSQL database could not be reached or prepared for use.
    #[error("cannot use database {database}: {reason}")]
    Postgres {
        /// The database URL, without its password.
        database: String,
        /// What went wrong, and what the operator can do about it.
        reason: String,
    },
    /// A TLS certificate, key or client CA file (`--tls-cert`, `--tls-key`, `--tls-client-ca`)
    /// could not be read or used.
    #[error("cannot use TLS file {}: {reason}", path.display())]
    TlsFile {
        /// The file as given.
        path: PathBuf,
        /// What is wrong with it, and what to do.
        reason: String,
    },
    /// The engine thread could not be started.
    #[error("cannot start the engine thread: {0}")]
    EngineThread(#[source] std::io::Error),
    /// A token file could not be read or holds no token. The message never quotes the file.
    #[error("cannot use token file {}: {reason}", path.display())]
    TokenFile {
        /// The file as given.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The same token is configured both with full access and as a read-only token.
    #[error(
        "a token is configured both with full access and as a read-only token (read#{read_index}); \
         give each credential one role"
    )]
    ConflictingTokens {
        /// The read-only token's position among the read tokens, from 1.
        read_index: usize,
    },
    /// No token is configured and the listen address is not loopback: anyone who can reach it
    /// could read and write the database.
    #[error(
        "refusing to serve without a token on {addr}, which is not a loopback address: \
         configure a token (--token, --token-file, --read-token) or pass --allow-anonymous"
    )]
    AnonymousOnPublicAddress {
        /// The listen address.
        addr: SocketAddr,
    },
    /// `--max-buffered-bytes` cannot hold one request's body together with its whole result,
    /// so every keyed request and batch would be refused.
    #[error(
        "--max-buffered-bytes ({budget} bytes) must hold one request's body and its whole result \
         together: at least {needs} bytes (--max-result-bytes plus the larger of \
         --max-body-bytes and --max-batch-bytes)"
    )]
    BufferBudgetTooSmall {
        /// The configured budget.
        budget: usize,
        /// The least budget the other limits need.
        needs: usize,
    },
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
            crate::Database::Postgres(url) => url.to_string(),
        };
        ServerError::OpenDatabase { database, source }
    }
}
