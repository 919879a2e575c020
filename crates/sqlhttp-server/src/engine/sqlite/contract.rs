//! [`SqliteEngine`] as the engine contract (`engine::Engine`): each of the contract's calls
//! routed to the reader pool or the writer, keyed ones through the store; the engine's own
//! methods it calls are in `mod.rs`.
//!
//! Knows the engine contract and the SQLite engine's handle; nothing about HTTP.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::budget::Held;
use crate::engine::interactive::{TxOptions, sqlite_serializable_only};
use crate::engine::keyed::Stored;
use crate::engine::{Access, Catalog, Engine, GivenUp, Keyed, Outcome, Reply};
use crate::protocol::batch::BatchRequest;
use crate::protocol::bookmark::ReadAt;
use crate::protocol::error::ApiError;
use crate::protocol::request::SqlRequest;

use super::connection::Conn;
use super::wal::Level;
use super::worker::Pool;
use super::{
    INTERRUPT_EVERY, SqliteEngine, WRITE_SHARES, admit, admit_keyed, batch, catalog, describe,
    errors, interactive, keyed, serializable_only,
};

impl Engine for SqliteEngine {
    fn catalog(&self) -> Catalog {
        catalog::CATALOG
    }

    /// Runs one statement; a bookmark (`at`) is always satisfied here: one database, no
    /// replicas.
    async fn execute(
        &self,
        request: SqlRequest,
        access: Access,
        _at: ReadAt,
    ) -> Result<Reply, ApiError> {
        match access {
            Access::ReadOnly => self.execute_read_only(request).await,
            Access::ReadWrite => self.execute_streamed(request).await,
        }
    }

    /// Runs one keyed request exactly once on the writer (see `keyed`); the key's claim is
    /// held until the engine is done with it, whether or not the requester still waits.
    async fn execute_keyed(
        &self,
        keyed: Keyed,
        request: SqlRequest,
    ) -> Result<(Outcome, Held), ApiError> {
        let _turn = self.keyed_turn(&keyed).await?;
        let wal = Arc::clone(&self.wal);
        self.run_buffered(&self.writer, move |writer| {
            admit_keyed(writer, &wal, &keyed)?;
            keyed::execute_with_key(writer, &keyed, &request)
        })
        .await
    }

    /// Runs a batch in one transaction: a read-only one on a reader (on the writer when there
    /// are no readers), any other on the writer (see `batch`).
    async fn batch(&self, batch: BatchRequest, _at: ReadAt) -> Result<(Outcome, Held), ApiError> {
        serializable_only(&batch)?;
        let (pool, access) = if batch.read_only {
            (
                self.readers.as_ref().unwrap_or(&self.writer),
                Access::ReadOnly,
            )
        } else {
            (&self.writer, Access::ReadWrite)
        };
        let _turn = match access {
            Access::ReadWrite => Some(self.write_turn(1).await?),
            Access::ReadOnly => None,
        };
        let wal = (access == Access::ReadWrite).then(|| Arc::clone(&self.wal));
        self.run_buffered(pool, move |conn| {
            if let Some(wal) = &wal {
                admit(conn, wal)?;
            }
            batch::run(conn, &batch, access).map(Outcome::fresh)
        })
        .await
    }

    /// Runs a keyed write batch exactly once on the writer, its outcome stored in the batch's
    /// own transaction (see `keyed`).
    async fn batch_keyed(
        &self,
        keyed: Keyed,
        batch: BatchRequest,
    ) -> Result<(Outcome, Held), ApiError> {
        serializable_only(&batch)?;
        let _turn = self.keyed_turn(&keyed).await?;
        let wal = Arc::clone(&self.wal);
        self.run_buffered(&self.writer, move |writer| {
            admit_keyed(writer, &wal, &keyed)?;
            batch::run_keyed(writer, &keyed, &batch)
        })
        .await
    }

    /// Whether every pool answers a trivial statement.
    async fn ready(&self) -> Result<(), ApiError> {
        let probe = |conn: &mut Conn| {
            conn.conn
                .query_row("SELECT 1", [], |row| row.get::<_, i64>(0))
                .map(drop)
                .map_err(errors::map_engine_error)
        };
        Self::run(&self.writer, probe).await?;
        if let Some(readers) = &self.readers {
            Self::run(readers, probe).await?;
        }
        Ok(())
    }

    /// Jobs waiting for a connection now, per pool (`writer`, `reader`).
    fn queue_depths(&self) -> Vec<(&'static str, usize)> {
        std::iter::once(&self.writer)
            .chain(&self.readers)
            .map(|pool| (pool.name(), pool.waiting()))
            .collect()
    }

    /// Opens an interactive transaction on a connection and thread of its own (see
    /// `interactive`): serializable only, as every SQLite transaction is. A write transaction
    /// first waits for its turn at the writer (every share of [`SqliteEngine::writes`], in the
    /// order writes and opens came; at most the statement timeout) and holds it to its end.
    type Session = interactive::Session;

    async fn begin(
        &self,
        options: TxOptions,
        _at: ReadAt,
    ) -> Result<interactive::Session, ApiError> {
        sqlite_serializable_only(options.isolation)?;
        if self.closing.load(Ordering::Acquire) || self.sessions.is_closing() {
            return Err(crate::engine::shutting_down());
        }
        let writer = if options.read_only {
            // One opened past the truncate threshold would be ended a second later, and its
            // snapshot would keep the checkpoint from finding the log free (ADR 0046).
            self.wal
                .below(Level::PastThreshold, self.limits.statement_timeout)
                .await?;
            None
        } else {
            Some(self.write_turn(WRITE_SHARES).await?)
        };
        interactive::Session::open(&self.target, self.limits, &self.sessions, options, writer).await
    }

    /// Compiles the statement on a reader (on the writer when there are none; compiling never
    /// writes), under the sandbox, and steps nothing.
    async fn describe_statement(
        &self,
        sql: String,
        access: Access,
    ) -> Result<crate::engine::describe::Described, ApiError> {
        let pool = self.readers.as_ref().unwrap_or(&self.writer);
        let described = Self::run(pool, move |conn| describe::describe(conn, &sql)).await?;
        if described.may_write && access == Access::ReadOnly {
            return Err(crate::engine::describe::read_only_refusal());
        }
        Ok(described)
    }

    /// The outcome stored under `key`, read on a reader (the writer when there is none).
    async fn recorded(&self, key: String) -> Result<Option<Stored>, ApiError> {
        let pool = self.readers.as_ref().unwrap_or(&self.writer);
        Self::run(pool, move |conn| {
            keyed::lookup(&conn.conn, &key).map_err(errors::map_engine_error)
        })
        .await
    }

    /// Stores a record on the writer, in a transaction of its own.
    async fn store_record(
        &self,
        key: String,
        request_hash: [u8; 32],
        body: Vec<u8>,
    ) -> Result<(), ApiError> {
        let _turn = self.record_turn(1).await?;
        Self::run(&self.writer, move |conn| {
            keyed::store(&conn.conn, &key, &request_hash, 200, &body)
                .map_err(errors::map_engine_error)
        })
        .await
    }

    /// Claims a record on the writer (see `keyed::claim`).
    async fn claim_record(
        &self,
        key: String,
        request_hash: [u8; 32],
        status: u16,
        body: Vec<u8>,
    ) -> Result<Stored, ApiError> {
        let _turn = self.record_turn(1).await?;
        Self::run(&self.writer, move |conn| {
            keyed::claim(&conn.conn, &key, &request_hash, status, &body)
                .map_err(errors::map_engine_error)
        })
        .await
    }

    /// Given-up connections now and since the start.
    fn given_up(&self) -> GivenUp {
        GivenUp {
            running: self.strays.alive(),
            total: self.strays.total(),
        }
    }

    /// Closes the connections: statements running or queued are interrupted (their requests
    /// answer 503), and this returns once every connection has been dropped or, for a statement
    /// that did not stop within [`GIVE_UP_AFTER`](super::GIVE_UP_AFTER), given up (its thread is left to end on its
    /// own; a file database recovers what it had not committed on its next open). Later
    /// requests answer 503.
    async fn close(&self) {
        self.sessions.close();
        let since = *self.closing_since.get_or_init(Instant::now);
        self.closing.store(true, Ordering::Release);
        let pools: Vec<&Pool> = std::iter::once(&self.writer)
            .chain(&self.readers)
            .map(|pool| &**pool)
            .collect();
        for pool in &pools {
            pool.close_queue();
        }
        loop {
            let now = Instant::now();
            pools.iter().for_each(|pool| pool.watch(now, Some(since)));
            self.sessions.watch(now);
            if pools.iter().all(|pool| pool.settled()) && self.sessions.settled() {
                break;
            }
            pools.iter().for_each(|pool| pool.interrupt_all());
            tokio::time::sleep(INTERRUPT_EVERY).await;
        }
        if self.strays.alive() > 0 {
            // Given-up connections keep a throwaway database open; it is not left behind.
            self.target.discard();
        }
    }
}
