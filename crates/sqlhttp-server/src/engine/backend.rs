//! [`Backend`]: the engine the HTTP layer talks to, SQLite (embedded, the default) or
//! PostgreSQL, chosen by the database URL. Both answer the same calls with the same protocol
//! outcomes; this enum only dispatches.
//!
//! Knows the two engines' async handles; nothing about HTTP or SQL.

use std::time::Duration;

use crate::api_error::ApiError;
use crate::batch_request::{BatchRequest, ForeignKeys};
use crate::budget::{Budget, Held};
use crate::config::{Database, Limits};
use crate::engine::postgres::PgEngine;
use crate::engine::{Engine, GivenUp, Outcome, Reply};
use crate::error::ServerError;
use crate::request::SqlRequest;

/// An engine's catalog queries: its tables and views, and one table's columns (the name bound
/// as the one parameter), in the protocol's engine-neutral shape.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Catalog {
    pub(crate) tables: &'static str,
    pub(crate) columns: &'static str,
}

/// The engine serving the configured database.
#[derive(Debug)]
pub(crate) enum Backend {
    /// The embedded SQLite engine (boxed: it is far larger than the PostgreSQL handle).
    Sqlite(Box<Engine>),
    /// A PostgreSQL database.
    Postgres(PgEngine),
}

impl Backend {
    /// Starts the engine for `database`.
    pub(crate) fn start(
        database: &Database,
        idempotency_ttl: Option<Duration>,
        limits: Limits,
        budget: Budget,
    ) -> Result<Backend, ServerError> {
        match database {
            Database::Postgres(url) => {
                PgEngine::start(url, idempotency_ttl, limits, budget).map(Backend::Postgres)
            }
            sqlite => Engine::start(sqlite, idempotency_ttl, limits, budget)
                .map(|engine| Backend::Sqlite(Box::new(engine))),
        }
    }

    /// The engine's catalog queries, tables then columns (see `engine::catalog`).
    pub(crate) fn catalog(&self) -> Catalog {
        match self {
            Backend::Sqlite(_) => Catalog {
                tables: crate::engine::catalog::TABLES,
                columns: crate::engine::catalog::COLUMNS,
            },
            Backend::Postgres(_) => Catalog {
                tables: crate::engine::postgres::catalog::TABLES,
                columns: crate::engine::postgres::catalog::COLUMNS,
            },
        }
    }

    /// Runs one request without an Idempotency-Key; a large success body streams.
    pub(crate) async fn execute_streamed(&self, request: SqlRequest) -> Result<Reply, ApiError> {
        match self {
            Backend::Sqlite(engine) => engine.execute_streamed(request).await,
            Backend::Postgres(engine) => engine.execute_streamed(request).await,
        }
    }

    /// Runs one request for a credential that may only read (`403 READ_ONLY` for a write).
    pub(crate) async fn execute_read_only(&self, request: SqlRequest) -> Result<Reply, ApiError> {
        match self {
            Backend::Sqlite(engine) => engine.execute_read_only(request).await,
            Backend::Postgres(engine) => engine.execute_read_only(request).await,
        }
    }

    /// Runs one keyed request exactly once; `guard` is held until the engine is done with it.
    /// Like the batches below, its whole answer comes with its share of the server's budget,
    /// to hold until the answer is sent.
    pub(crate) async fn execute_with_key<G: Send + 'static>(
        &self,
        ttl: Duration,
        key: String,
        request_hash: [u8; 32],
        request: SqlRequest,
        guard: G,
    ) -> Result<(Outcome, Held), ApiError> {
        match self {
            Backend::Sqlite(engine) => {
                engine
                    .execute_with_key(ttl, key, request_hash, request, guard)
                    .await
            }
            Backend::Postgres(engine) => {
                engine
                    .execute_with_key(ttl, key, request_hash, request, guard)
                    .await
            }
        }
    }

    /// Runs a batch without an Idempotency-Key in one transaction.
    pub(crate) async fn batch(&self, batch: BatchRequest) -> Result<(Outcome, Held), ApiError> {
        match self {
            Backend::Sqlite(engine) => engine.batch(batch).await,
            Backend::Postgres(engine) => {
                only_enforced(&batch)?;
                engine.batch(batch).await
            }
        }
    }

    /// Runs a keyed write batch exactly once.
    pub(crate) async fn batch_with_key<G: Send + 'static>(
        &self,
        ttl: Duration,
        key: String,
        request_hash: [u8; 32],
        batch: BatchRequest,
        guard: G,
    ) -> Result<(Outcome, Held), ApiError> {
        match self {
            Backend::Sqlite(engine) => {
                engine
                    .batch_with_key(ttl, key, request_hash, batch, guard)
                    .await
            }
            Backend::Postgres(engine) => {
                only_enforced(&batch)?;
                engine
                    .batch_with_key(ttl, key, request_hash, batch, guard)
                    .await
            }
        }
    }

    /// Whether the engine answers a trivial statement.
    pub(crate) async fn ready(&self) -> Result<(), ApiError> {
        match self {
            Backend::Sqlite(engine) => engine.ready().await,
            Backend::Postgres(engine) => engine.ready().await,
        }
    }

    /// Requests waiting for a connection now, per pool.
    pub(crate) fn queue_depths(&self) -> Vec<(&'static str, usize)> {
        match self {
            Backend::Sqlite(engine) => engine.queue_depths(),
            Backend::Postgres(engine) => vec![("postgres", engine.waiting())],
        }
    }

    /// Engine connections given up because their statement did not stop in time (SQLite; the
    /// PostgreSQL engine's server stops its statements itself).
    pub(crate) fn given_up(&self) -> GivenUp {
        match self {
            Backend::Sqlite(engine) => engine.given_up(),
            Backend::Postgres(_) => GivenUp::default(),
        }
    }

    /// Closes the engine: running statements are interrupted, later requests answer 503.
    pub(crate) async fn close(&self) {
        match self {
            Backend::Sqlite(engine) => engine.close().await,
            Backend::Postgres(engine) => engine.close().await,
        }
    }
}

/// PostgreSQL enforces foreign keys as declared: it alters tables in place, so no batch needs
/// them off (and `SET CONSTRAINTS` defers checks only, never `ON DELETE` actions).
fn only_enforced(batch: &BatchRequest) -> Result<(), ApiError> {
    match batch.foreign_keys {
        ForeignKeys::Enforced => Ok(()),
        ForeignKeys::CheckedAtCommit => Err(ApiError::bad_request(
            "`foreign_keys: checked_at_commit` is for SQLite, whose table rebuilds drop tables \
             that others refer to; PostgreSQL alters tables in place and enforces foreign keys \
             as declared: leave it out",
        )),
    }
}
