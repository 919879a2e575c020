//! [`Backend`]: the engine serving the configured database, SQLite (embedded, the default) or
//! PostgreSQL, chosen by the database URL. Both implement [`Engine`]; this enum only
//! dispatches, every call through the one `dispatch!` below.
//!
//! Knows the two engines' handles; nothing about HTTP or SQL.

use std::time::Duration;

use crate::budget::{Budget, Held};
use crate::config::{Database, Limits, ReadReplicas};
use crate::engine::interactive::TxOptions;
use crate::engine::keyed::Stored;
#[cfg(feature = "postgres")]
use crate::engine::postgres::PostgresEngine;
use crate::engine::session::Session;
use crate::engine::sqlite::SqliteEngine;
use crate::engine::{Access, Catalog, Engine, GivenUp, Keyed, Outcome, ReplicaReport, Reply};
use crate::error::ServerError;
use crate::protocol::batch::BatchRequest;
use crate::protocol::bookmark::ReadAt;
use crate::protocol::error::ApiError;
use crate::protocol::request::SqlRequest;

/// The engine serving the configured database.
#[derive(Debug)]
pub(crate) enum Backend {
    /// The embedded SQLite engine (boxed: it is far larger than the PostgreSQL handle).
    Sqlite(Box<SqliteEngine>),
    /// A PostgreSQL database.
    #[cfg(feature = "postgres")]
    Postgres(PostgresEngine),
}

/// Runs `$call` on whichever engine `$backend` holds, bound as `$engine`.
macro_rules! dispatch {
    ($backend:expr, $engine:ident => $call:expr) => {
        match $backend {
            Backend::Sqlite($engine) => $call,
            #[cfg(feature = "postgres")]
            Backend::Postgres($engine) => $call,
        }
    };
}

impl Backend {
    /// Starts the engine for `database`, with its read `replicas` (PostgreSQL only).
    pub(crate) fn start(
        database: &Database,
        replicas: &ReadReplicas,
        idempotency_ttl: Option<Duration>,
        limits: Limits,
        budget: Budget,
    ) -> Result<Backend, ServerError> {
        match database {
            #[cfg(feature = "postgres")]
            Database::Postgres(url) => {
                PostgresEngine::start(url, replicas, idempotency_ttl, limits, budget)
                    .map(Backend::Postgres)
            }
            _ if !replicas.urls.is_empty() => Err(ServerError::InvalidDatabaseUrl {
                url: replicas.urls[0].to_string(),
                reason: "read replicas are for a PostgreSQL database".to_owned(),
            }),
            // Never parsed without the feature (see `Database::from_str`).
            #[cfg(not(feature = "postgres"))]
            Database::Postgres(url) => Err(ServerError::InvalidDatabaseUrl {
                url: url.to_string(),
                reason: crate::config::NO_POSTGRES.to_owned(),
            }),
            sqlite => SqliteEngine::start(sqlite, idempotency_ttl, limits, budget)
                .map(|engine| Backend::Sqlite(Box::new(engine))),
        }
    }

    /// The server is shutting down and about to roll back its open transactions: on SQLite,
    /// their statements stop now (one that does not is given up a second later, ADR 0042), so
    /// the rollback never waits for a running statement. On PostgreSQL, a running statement is
    /// cancelled and its transaction rolled back with its session (ADR 0043).
    pub(crate) fn stop_transactions(&self) {
        match self {
            Backend::Sqlite(engine) => engine.stop_transactions(),
            #[cfg(feature = "postgres")]
            Backend::Postgres(engine) => engine.stop_transactions(),
        }
    }

    /// The SQLite database's write-ahead log size at the engine's last look (ADR 0046).
    pub(crate) fn wal_bytes(&self) -> Option<u64> {
        match self {
            Backend::Sqlite(engine) => Some(engine.wal_bytes()),
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => None,
        }
    }
}

impl Engine for Backend {
    fn catalog(&self) -> Catalog {
        dispatch!(self, engine => engine.catalog())
    }

    async fn execute(
        &self,
        request: SqlRequest,
        access: Access,
        at: ReadAt,
    ) -> Result<Reply, ApiError> {
        dispatch!(self, engine => engine.execute(request, access, at).await)
    }

    async fn execute_keyed(
        &self,
        keyed: Keyed,
        request: SqlRequest,
    ) -> Result<(Outcome, Held), ApiError> {
        dispatch!(self, engine => engine.execute_keyed(keyed, request).await)
    }

    async fn batch(&self, batch: BatchRequest, at: ReadAt) -> Result<(Outcome, Held), ApiError> {
        dispatch!(self, engine => engine.batch(batch, at).await)
    }

    async fn batch_keyed(
        &self,
        keyed: Keyed,
        batch: BatchRequest,
    ) -> Result<(Outcome, Held), ApiError> {
        dispatch!(self, engine => engine.batch_keyed(keyed, batch).await)
    }

    async fn describe_statement(
        &self,
        sql: String,
        access: Access,
    ) -> Result<crate::engine::describe::Described, ApiError> {
        dispatch!(self, engine => engine.describe_statement(sql, access).await)
    }

    type Session = Session;

    async fn begin(&self, options: TxOptions, at: ReadAt) -> Result<Session, ApiError> {
        dispatch!(self, engine => engine.begin(options, at).await.map(Session::from))
    }

    async fn recorded(&self, key: String) -> Result<Option<Stored>, ApiError> {
        dispatch!(self, engine => engine.recorded(key).await)
    }

    async fn claim_record(
        &self,
        key: String,
        request_hash: [u8; 32],
        status: u16,
        body: Vec<u8>,
    ) -> Result<Stored, ApiError> {
        dispatch!(self, engine => engine.claim_record(key, request_hash, status, body).await)
    }

    async fn store_record(
        &self,
        key: String,
        request_hash: [u8; 32],
        body: Vec<u8>,
    ) -> Result<(), ApiError> {
        dispatch!(self, engine => engine.store_record(key, request_hash, body).await)
    }

    async fn check_bookmark(&self, at: ReadAt) -> Result<(), ApiError> {
        dispatch!(self, engine => engine.check_bookmark(at).await)
    }

    async fn ready(&self) -> Result<(), ApiError> {
        dispatch!(self, engine => engine.ready().await)
    }

    fn queue_depths(&self) -> Vec<(&'static str, usize)> {
        dispatch!(self, engine => engine.queue_depths())
    }

    fn given_up(&self) -> GivenUp {
        dispatch!(self, engine => engine.given_up())
    }

    fn replicas(&self) -> ReplicaReport {
        dispatch!(self, engine => engine.replicas())
    }

    async fn close(&self) {
        dispatch!(self, engine => engine.close().await);
    }
}
