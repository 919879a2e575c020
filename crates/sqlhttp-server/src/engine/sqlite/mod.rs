//! The SQLite engine: one writer connection and a pool of reader connections to the served
//! SQLite database, each owned by a dedicated thread, so blocking engine work never runs on the
//! async runtime's worker threads.
//!
//! [`SqliteEngine`] is the async-side handle, implementing the engine contract (`engine::Engine`). A statement without an Idempotency-Key is first
//! compiled on a reader: if it cannot write it runs there, in parallel with other reads and
//! with the writer (WAL, for files and for the throwaway `sqlite::memory:` database alike);
//! otherwise it goes to the writer. Keyed statements go straight to the writer, inside the server's own transaction.
//! Every request is its own transaction: clients cannot open one (see `sandbox`). Each job has
//! a statement timeout and is cancelled when its requester goes away; queues are bounded.
//! Atomic batches (`batch`) run several statements in one transaction of the server's own.
//! A watchdog thread gives up a connection whose statement has not stopped a margin after it
//! had to (ADR 0032; see `worker`), and holds the write-ahead log under its bounds: writes and
//! read-only transactions' opens wait while it is past them (ADR 0046; see `wal`).
//! This module knows nothing about HTTP. See `docs/adr/0013-concurrency-and-transactions.md`.

mod batch;
mod catalog;
mod connection;
mod control;
mod describe;
mod errors;
mod exec;
mod functions;
pub(crate) mod interactive;
mod keyed;
mod sandbox;
mod sessions;
mod stream;
mod transaction;
mod wal;
mod worker;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::budget::{Budget, Held};
use crate::config::{Database, Limits};
use crate::engine::interactive::{TxOptions, sqlite_serializable_only};
use crate::engine::job::CancelOnDrop;
use crate::engine::keyed::Stored;
use crate::engine::stream as chunks;
use crate::engine::{Access, Buffering, Catalog, Engine, GivenUp, Keyed, Outcome, Reply};
use crate::error::ServerError;
use crate::protocol::batch::BatchRequest;
use crate::protocol::bookmark::ReadAt;
use crate::protocol::error::{ApiError, ErrorCode};
use crate::protocol::request::SqlRequest;
use crate::timing::Timing;

use connection::{Conn, Role, Target};
use control::{Hooks, JobControl};
use exec::Ran;
use sessions::Sessions;
use wal::{Level, WalBound};
use worker::{Opener, Pool, Strays};

/// `PRAGMA query_only` on a connection for as long as it lives (a panic included).
struct QueryOnly<'a>(&'a Conn);

impl<'a> QueryOnly<'a> {
    fn on(conn: &'a Conn) -> Result<QueryOnly<'a>, ApiError> {
        conn.conn
            .execute_batch("PRAGMA query_only = ON")
            .map_err(errors::map_engine_error)?;
        Ok(QueryOnly(conn))
    }
}

impl Drop for QueryOnly<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.conn.execute_batch("PRAGMA query_only = OFF") {
            tracing::error!(error = %e, "cannot switch query_only off on the writer");
        }
    }
}

/// How often `close` interrupts statements that keep engine threads from exiting.
const INTERRUPT_EVERY: Duration = Duration::from_millis(25);

/// How long a statement may go on after it had to stop (its deadline, its client's leaving, the
/// engine's close) before its connection is given up (ADR 0032): ample for any statement SQLite
/// can interrupt to stop and roll back.
pub(crate) const GIVE_UP_AFTER: Duration = Duration::from_secs(1);

/// How often the watchdog looks for statements to give up.
const WATCH_EVERY: Duration = Duration::from_millis(100);

/// Handle to the engine's threads.
#[derive(Debug)]
pub(crate) struct SqliteEngine {
    writer: Arc<Pool>,
    readers: Option<Arc<Pool>>,
    closing: Arc<AtomicBool>,
    /// When `close` began.
    closing_since: Arc<OnceLock<Instant>>,
    strays: Arc<Strays>,
    /// Kept to remove a throwaway database that given-up connections still hold at close.
    target: Target,
    buffering: Buffering,
    limits: Limits,
    /// Turns at SQLite's one writer: a write transaction holds every permit (one at a time), a
    /// plain write one while it runs. The semaphore is fair, so writes and write transactions
    /// take their turns in the order they came, and each waits at most the statement timeout
    /// (ADR 0042).
    writes: Arc<tokio::sync::Semaphore>,
    /// The interactive transactions' threads, watched by the watchdog (see `sessions`).
    sessions: Arc<Sessions>,
    /// The write-ahead log's bounds, the gate of writes and read-only opens (see `wal`).
    wal: Arc<WalBound>,
}

/// The permits of [`SqliteEngine::writes`]: more than plain writes can ever wait at once (each
/// holds an HTTP request).
const WRITE_SHARES: u32 = 1 << 20;

/// What one pool made of a streamed request.
enum Streamed {
    Reply(Reply),
    NeedsWriter,
}

impl SqliteEngine {
    /// Opens the writer (creating the server's tables) and the readers on the calling thread,
    /// then hands each connection to its own thread.
    pub(crate) fn start(
        database: &Database,
        idempotency_ttl: Option<Duration>,
        limits: Limits,
        budget: Budget,
    ) -> Result<SqliteEngine, ServerError> {
        let open_error = |e| ServerError::open_database(database, e);
        let closing = Arc::new(AtomicBool::new(false));
        let target = Target::new(database).map_err(ServerError::EngineThread)?;
        let hooks = || Arc::new(Hooks::new(Arc::clone(&closing)));
        let writer = Conn::open(&target, Role::Writer, limits, hooks()).map_err(open_error)?;
        // One limit for the whole process (SQLite's allocator is shared by every connection).
        writer
            .conn
            .pragma_update(
                None,
                "hard_heap_limit",
                i64::try_from(limits.max_engine_memory).unwrap_or(i64::MAX),
            )
            .map_err(open_error)?;
        writer
            .conn
            .execute_batch(exec::ROWID_PROBE_DDL)
            .map_err(open_error)?;
        // The table exists even with idempotency off, so no client can claim its name.
        keyed::create_table(&writer.conn).map_err(open_error)?;
        keyed::create_peer_secret(&writer.conn).map_err(open_error)?;
        if let Some(ttl) = idempotency_ttl {
            keyed::purge_expired(&writer.conn, ttl).map_err(open_error)?;
            writer.purges.purged_now();
        }
        let readers = (0..limits.read_connections)
            .map(|_| Conn::open(&target, Role::Reader, limits, hooks()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(open_error)?;

        let opener = |role: Role| -> Opener {
            let (target, closing) = (target.clone(), Arc::clone(&closing));
            Arc::new(move || {
                let hooks = Arc::new(Hooks::new(Arc::clone(&closing)));
                let conn = Conn::open(&target, role, limits, hooks)?;
                if role == Role::Writer {
                    conn.conn.execute_batch(exec::ROWID_PROBE_DDL)?;
                }
                Ok(conn)
            })
        };
        // As many stray threads as there are readers (one with none): the process then runs at
        // most `2 × read_connections + 1` engine threads (ADR 0032).
        let strays = Arc::new(Strays::new(limits.read_connections.max(1)));
        let pool = |name, connections, role| {
            Pool::start(
                name,
                connections,
                limits.queue_depth,
                opener(role),
                Arc::clone(&strays),
                GIVE_UP_AFTER,
            )
            .map(Arc::new)
            .map_err(ServerError::EngineThread)
        };
        let writer = pool("writer", vec![writer], Role::Writer)?;
        let readers = if readers.is_empty() {
            None
        } else {
            Some(pool("reader", readers, Role::Reader)?)
        };
        let closing_since = Arc::new(OnceLock::new());
        let watched: Vec<Weak<Pool>> = std::iter::once(&writer)
            .chain(&readers)
            .map(Arc::downgrade)
            .collect();
        // As many statements of transactions run at once, stuck ones included, as strays may.
        let wal = Arc::new(WalBound::new(target.wal_path(), limits.max_wal_bytes));
        let sessions = Arc::new(Sessions::new(
            Arc::clone(&strays),
            GIVE_UP_AFTER,
            limits.transaction_write_idle,
            Arc::clone(&wal),
            limits.read_connections.max(1),
        ));
        let watch_closing = Arc::clone(&closing_since);
        let watch_sessions = Arc::downgrade(&sessions);
        let nudge = Nudge::new(Arc::downgrade(&writer));
        std::thread::Builder::new()
            .name("sqlhttpd-watchdog".to_owned())
            .spawn(move || watchdog(&watched, &watch_sessions, &watch_closing, &nudge))
            .map_err(ServerError::EngineThread)?;
        Ok(SqliteEngine {
            writer,
            readers,
            closing,
            closing_since,
            strays,
            target,
            buffering: Buffering::new(budget, &limits),
            limits,
            writes: Arc::new(tokio::sync::Semaphore::new(WRITE_SHARES as usize)),
            sessions,
            wal,
        })
    }

    /// The write-ahead log's size at the watchdog's last look, for the metrics.
    pub(crate) fn wal_bytes(&self) -> u64 {
        self.wal.bytes()
    }

    /// A write's turn at the writer ([`SqliteEngine::record_turn`]) once the write-ahead log is
    /// under its hard bound: both waits together at most the statement timeout, then `503`
    /// (nothing ran). The writer's thread looks at the log once more right before the write
    /// runs ([`admit`]).
    async fn write_turn(&self, shares: u32) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        let started = Instant::now();
        let turn = self.record_turn(shares).await?;
        self.below_hard_bound(started).await?;
        Ok(turn)
    }

    /// Waits for the write-ahead log to fall below its hard bound, within what is left of the
    /// statement timeout of a write that began waiting at `started`; then `503`.
    async fn below_hard_bound(&self, started: Instant) -> Result<(), ApiError> {
        let left = self
            .limits
            .statement_timeout
            .saturating_sub(started.elapsed());
        self.wal.below(Level::PastHard, left).await
    }

    /// A keyed request's turn at the writer: as [`SqliteEngine::write_turn`], except that one
    /// answered from what is stored under its key (a re-send whose first attempt committed and
    /// whose answer was lost) does not wait for the write-ahead log: it writes nothing, and its
    /// client is owed the stored answer, not a `503` that leaves its outcome unknown.
    async fn keyed_turn(
        &self,
        keyed: &Keyed,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        let started = Instant::now();
        let turn = self.record_turn(1).await?;
        if self.wal.look() < Level::PastHard {
            return Ok(turn);
        }
        let (key, request_hash, ttl) = (keyed.key.clone(), keyed.request_hash, keyed.ttl);
        let answered = Self::run(&self.writer, move |writer| {
            Ok(keyed::answered_from_store(
                &writer.conn,
                &key,
                &request_hash,
                ttl,
            ))
        })
        .await?;
        if !answered {
            self.below_hard_bound(started).await?;
        }
        Ok(turn)
    }

    /// Waits for a turn at the writer (`shares` of [`SqliteEngine::writes`]: one for a plain
    /// write, all for a write transaction) at most the statement timeout, then `503`. The
    /// server's own records (a few hundred bytes each) take it without waiting for the
    /// write-ahead log's bound: a shutdown's `peers::leave` must not wait for readers.
    async fn record_turn(
        &self,
        shares: u32,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        let waited = Timing::queue(
            "writer turn",
            tokio::time::timeout(
                self.limits.statement_timeout,
                Arc::clone(&self.writes).acquire_many_owned(shares),
            ),
        )
        .await;
        match waited {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) => Err(crate::engine::shutting_down()),
            Err(_) => Err(ApiError::unavailable(
                "the database is busy: a transaction held the write lock for longer than this \
                 server's statement timeout; retry later",
            )),
        }
    }

    /// The server is about to roll back its open transactions and close: their statements
    /// stop now (one that does not is given up a margin later), so the rollback never waits
    /// for one. The engine's own pools go on until [`Engine::close`].
    pub(crate) fn stop_transactions(&self) {
        self.sessions.close();
    }

    /// Runs `job` on one of `pool`'s connections; dropping the returned future cancels it.
    async fn run<T, F>(pool: &Pool, job: F) -> Result<T, ApiError>
    where
        F: FnOnce(&mut Conn) -> Result<T, ApiError> + Send + 'static,
        T: Send + 'static,
    {
        Self::run_controlled(pool, Arc::new(JobControl::default()), job).await
    }

    /// [`SqliteEngine::run`] with the job's control made by the caller.
    async fn run_controlled<T, F>(
        pool: &Pool,
        control: Arc<JobControl>,
        job: F,
    ) -> Result<T, ApiError>
    where
        F: FnOnce(&mut Conn) -> Result<T, ApiError> + Send + 'static,
        T: Send + 'static,
    {
        let cancel = CancelOnDrop::new(Arc::clone(&control));
        let result = pool.run(&control, job).await;
        cancel.disarm();
        result
    }

    /// [`SqliteEngine::run`] for a job that builds a whole outcome: it takes a little of the
    /// server's budget when it starts on its connection and grows it as its result grows (see
    /// [`Buffering`]), then keeps what the outcome needs, to hold until the answer is sent.
    async fn run_buffered<F>(&self, pool: &Pool, job: F) -> Result<(Outcome, Held), ApiError>
    where
        F: FnOnce(&mut Conn) -> Result<Outcome, ApiError> + Send + 'static,
    {
        let buffering = self.buffering.clone();
        Self::run(pool, move |conn| {
            let share = buffering.start();
            let outcome = Buffering::scope_blocking(Arc::clone(&share), || {
                // The share starts now that the job has its connection.
                crate::engine::grow(0)?;
                job(conn)
            })?;
            Buffering::kept(share, outcome)
        })
        .await
    }

    /// Runs one request without an Idempotency-Key: on a reader when the statement cannot
    /// write, else on the writer; the whole body is built before it is returned (within
    /// `--max-result-bytes`). For the engine's own tests: the HTTP handler streams instead
    /// ([`SqliteEngine::execute_streamed`]).
    #[cfg(test)]
    pub(crate) async fn execute_buffered(&self, request: SqlRequest) -> Result<Outcome, ApiError> {
        let request = Arc::new(request);
        if let Some(readers) = &self.readers {
            let read = Arc::clone(&request);
            let ran = Self::run(readers, move |conn| {
                exec::execute(conn, &read, Access::ReadOnly)
            })
            .await?;
            if let exec::Ran::Done(body) = ran {
                return Ok(Outcome::fresh(body));
            }
        }
        let ran = Self::run(&self.writer, move |conn| {
            exec::execute(conn, &request, Access::ReadWrite)
        })
        .await?;
        match ran {
            exec::Ran::Done(body) => Ok(Outcome::fresh(body)),
            exec::Ran::NeedsWriter => Err(ApiError::internal()),
        }
    }

    /// Runs one request for a credential that may only read: on a reader, or on the writer
    /// under `PRAGMA query_only` when there are no readers, and only if the statement cannot
    /// write (`403 READ_ONLY` otherwise; nothing ran). Never the writer's write path, whatever
    /// the request carries. A large result streams, as [`SqliteEngine::execute_streamed`]'s does.
    async fn execute_read_only(&self, request: SqlRequest) -> Result<Reply, ApiError> {
        let request = Arc::new(request);
        let streamed = match &self.readers {
            Some(readers) => {
                Self::run_streamed(readers, request, Access::ReadOnly, false, None).await?
            }
            None => Self::run_streamed(&self.writer, request, Access::ReadOnly, true, None).await?,
        };
        match streamed {
            Streamed::Reply(reply) => Ok(reply),
            Streamed::NeedsWriter => Err(ApiError::new(
                ErrorCode::ReadOnly,
                "this request may only read (a read-only credential, or `read_only`), and the \
                 statement may write; nothing was written",
            )),
        }
    }

    /// Runs one request without an Idempotency-Key as `SqliteEngine::execute_buffered` does, but streams a
    /// success body larger than one chunk while the statement runs (see `stream`): the job keeps
    /// its connection until the body is done or dropped.
    async fn execute_streamed(&self, request: SqlRequest) -> Result<Reply, ApiError> {
        let request = Arc::new(request);
        if let Some(readers) = &self.readers {
            match Self::run_streamed(readers, Arc::clone(&request), Access::ReadOnly, false, None)
                .await?
            {
                Streamed::Reply(reply) => return Ok(reply),
                Streamed::NeedsWriter => {}
            }
        }
        let _turn = self.write_turn(1).await?;
        let wal = Some(Arc::clone(&self.wal));
        match Self::run_streamed(&self.writer, request, Access::ReadWrite, false, wal).await? {
            Streamed::Reply(reply) => Ok(reply),
            Streamed::NeedsWriter => Err(ApiError::internal()),
        }
    }

    /// Runs one request on `pool`, streaming a large success body; `query_only` keeps the
    /// connection from writing for the whole job (a read credential on the writer); a write
    /// passes `wal`, looked at on the writer's thread before it runs ([`admit`]).
    async fn run_streamed(
        pool: &Pool,
        request: Arc<SqlRequest>,
        access: Access,
        query_only: bool,
        wal: Option<Arc<WalBound>>,
    ) -> Result<Streamed, ApiError> {
        let control = Arc::new(JobControl::default());
        let cancel = CancelOnDrop::new(Arc::clone(&control));
        let (sender, mut receiver) = chunks::channel(chunks::QUEUE_CHUNKS);
        let abandon = sender.abandon_handle();
        let result = pool.start_job(
            &control,
            move |conn| {
                if let Some(wal) = &wal {
                    admit(conn, wal)?;
                }
                let _query_only = if query_only {
                    Some(QueryOnly::on(conn)?)
                } else {
                    None
                };
                stream::execute(conn, &request, access, sender)
            },
            // A body that streams already ends with the error; one that does not, never starts.
            move |err| abandon.abandon(err),
        )?;
        match receiver.start().await {
            chunks::Start::Streaming => {
                // The body now owns the job: dropping it (the client left) cancels the statement.
                receiver.hold(cancel);
                Ok(Streamed::Reply(Reply::Stream(receiver, None)))
            }
            chunks::Start::Nothing => {
                let ran = result.await;
                cancel.disarm();
                match ran? {
                    Ran::Done(stream::Streamed::Whole(body)) => {
                        Ok(Streamed::Reply(Reply::Whole(Outcome::fresh(body))))
                    }
                    Ran::NeedsWriter => Ok(Streamed::NeedsWriter),
                    Ran::Done(stream::Streamed::Sent) => Err(ApiError::internal()),
                }
            }
        }
    }
}

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
    /// that did not stop within [`GIVE_UP_AFTER`], given up (its thread is left to end on its
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

/// [`admit`] for a keyed request: one answered from its key's store runs no write.
fn admit_keyed(conn: &Conn, wal: &WalBound, keyed: &Keyed) -> Result<(), ApiError> {
    if wal.past_hard()
        && keyed::answered_from_store(&conn.conn, &keyed.key, &keyed.request_hash, keyed.ttl)
    {
        return Ok(());
    }
    admit(conn, wal)
}

/// Right before a write runs on the writer's thread: while the write-ahead log is past its
/// hard bound, a checkpoint is tried now, and the write is refused (`503`, nothing of it run)
/// unless it truncated the log (ADR 0046).
fn admit(conn: &Conn, wal: &WalBound) -> Result<(), ApiError> {
    if wal.past_hard() && !conn.truncate_wal() {
        return Err(wal.refusal(Level::PastHard));
    }
    Ok(())
}

/// The watchdog's nudge to the writer: while the write-ahead log is past its truncate
/// threshold and no write comes (they wait for it to fall), an empty job on the writer, after
/// which it tries its checkpoint as after any job (`Conn::bound_wal`).
struct Nudge {
    writer: Weak<Pool>,
    pending: Arc<AtomicBool>,
}

impl Nudge {
    fn new(writer: Weak<Pool>) -> Nudge {
        Nudge {
            writer,
            pending: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Queues the empty job unless one waits already or writes are queued.
    fn nudge(&self) {
        let Some(writer) = self.writer.upgrade() else {
            return;
        };
        if writer.waiting() > 0 || self.pending.swap(true, Ordering::AcqRel) {
            return;
        }
        let pending = Arc::clone(&self.pending);
        let done = Arc::clone(&self.pending);
        let queued = writer.start_job(
            &Arc::new(JobControl::default()),
            move |_| {
                pending.store(false, Ordering::Release);
                Ok(())
            },
            move |_| done.store(false, Ordering::Release),
        );
        // Nobody waits for its answer: the checkpoint after it is the point.
        if queued.is_err() {
            self.pending.store(false, Ordering::Release);
        }
    }
}

/// The watchdog's loop: every [`WATCH_EVERY`], each pool gives up what is overdue and replaces
/// it, and so do the interactive transactions' threads (see `sessions`), which also look at the
/// write-ahead log (the writer is nudged to checkpoint it while it is past its threshold). Ends
/// when the engine is gone, or closed and settled.
fn watchdog(
    pools: &[Weak<Pool>],
    sessions: &Weak<Sessions>,
    closing_since: &OnceLock<Instant>,
    nudge: &Nudge,
) {
    loop {
        std::thread::sleep(WATCH_EVERY);
        let now = Instant::now();
        let mut open = false;
        for pool in pools.iter().filter_map(Weak::upgrade) {
            pool.watch(now, closing_since.get().copied());
            open |= closing_since.get().is_none() || !pool.settled();
        }
        if let Some(sessions) = sessions.upgrade() {
            sessions.watch(now);
            open |= closing_since.get().is_none() || !sessions.settled();
            if closing_since.get().is_none() && sessions.wal().level() > Level::Under {
                nudge.nudge();
            }
        }
        if !open {
            return;
        }
    }
}

/// A batch may ask for `serializable` only: every SQLite transaction is (one writer at a time,
/// and a reader's snapshot is its transaction's).
fn serializable_only(batch: &BatchRequest) -> Result<(), ApiError> {
    match batch.isolation {
        Some(isolation) => crate::engine::interactive::sqlite_serializable_only(isolation),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine_with(limits: Limits) -> SqliteEngine {
        SqliteEngine::start(&Database::Memory, None, limits, Budget::new(1 << 30)).unwrap()
    }

    fn engine() -> SqliteEngine {
        engine_with(Limits::default())
    }

    fn statement(sql: &str) -> SqlRequest {
        SqlRequest {
            sql: sql.into(),
            params: vec![],
            read_only: false,
        }
    }

    const ENDLESS: &str =
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";

    #[tokio::test]
    async fn a_panicking_job_is_a_500_and_the_engine_lives_on() {
        let engine = engine();
        let err = SqliteEngine::run(&engine.writer, |conn| -> Result<(), ApiError> {
            conn.conn.execute_batch("BEGIN").unwrap();
            panic!("boom")
        })
        .await
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::Internal);
        assert_eq!(err.message, crate::protocol::error::INTERNAL_MESSAGE);
        let autocommit = SqliteEngine::run(&engine.writer, |conn| Ok(conn.conn.is_autocommit()))
            .await
            .unwrap();
        assert!(
            autocommit,
            "the panicking job's transaction was rolled back"
        );
        let ok = engine
            .execute_buffered(statement("SELECT 1"))
            .await
            .unwrap();
        assert_eq!(ok.status, 200);
    }

    /// Waits (a bounded while) until nothing but the test holds `control`.
    async fn released(control: &Arc<JobControl>) -> bool {
        for _ in 0..200 {
            if Arc::strong_count(control) == 1 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        false
    }

    #[tokio::test]
    async fn nothing_of_a_finished_job_outlives_it() {
        let engine = engine();
        for outcome in [Ok(()), Err(ApiError::internal())] {
            let control = Arc::new(JobControl::default());
            let result =
                SqliteEngine::run_controlled(&engine.writer, Arc::clone(&control), move |_| {
                    outcome
                })
                .await;
            drop(result);
            assert!(released(&control).await, "the job's control leaked");
            assert!(!control.is_cancelled(), "a finished job is not cancelled");
        }
    }

    #[tokio::test]
    async fn close_interrupts_a_running_statement_and_later_jobs_get_503() {
        let engine = engine();
        let endless = engine.execute_buffered(statement(ENDLESS));
        let (endless, ()) = tokio::join!(endless, async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            engine.close().await;
        });
        assert_eq!(endless.unwrap_err().code, ErrorCode::Unavailable);
        let after = engine
            .execute_buffered(statement("SELECT 1"))
            .await
            .unwrap_err();
        assert_eq!(after.code, ErrorCode::Unavailable);
    }

    #[tokio::test]
    async fn a_runaway_statement_times_out_and_the_engine_serves_on() {
        let engine = engine_with(Limits {
            statement_timeout: Duration::from_millis(100),
            ..Limits::default()
        });
        let err = engine
            .execute_buffered(statement(ENDLESS))
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::StatementTimeout);
        assert!(err.message.contains("100 ms"), "{}", err.message);
        engine
            .execute_buffered(statement("SELECT 1"))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_dropped_request_stops_its_statement() {
        let engine = engine_with(Limits {
            read_connections: 1,
            ..Limits::default()
        });
        let abandoned = tokio::time::timeout(
            Duration::from_millis(50),
            engine.execute_buffered(statement(ENDLESS)),
        )
        .await;
        assert!(
            abandoned.is_err(),
            "the endless statement was still running"
        );
        // The only reader is free again well within the statement timeout.
        let quick = tokio::time::timeout(
            Duration::from_secs(5),
            engine.execute_buffered(statement("SELECT 1")),
        )
        .await
        .expect("the reader was released");
        assert_eq!(quick.unwrap().status, 200);
    }

    #[tokio::test]
    async fn a_full_queue_answers_503_at_once() {
        let engine = engine_with(Limits {
            read_connections: 1,
            queue_depth: 1,
            statement_timeout: Duration::from_millis(500),
            ..Limits::default()
        });
        let running = engine.execute_buffered(statement(ENDLESS));
        let queued = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            engine.execute_buffered(statement(ENDLESS)).await
        };
        let refused = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            engine.execute_buffered(statement("SELECT 1")).await
        };
        let (running, queued, refused) = tokio::join!(running, queued, refused);
        assert_eq!(running.unwrap_err().code, ErrorCode::StatementTimeout);
        assert_eq!(queued.unwrap_err().code, ErrorCode::StatementTimeout);
        let refused = refused.unwrap_err();
        assert_eq!(refused.code, ErrorCode::Unavailable);
        assert!(refused.message.contains("busy"), "{}", refused.message);
    }

    #[tokio::test]
    async fn read_only_requests_never_write_with_or_without_readers() {
        for read_connections in [0, 2] {
            let engine = engine_with(Limits {
                read_connections,
                ..Limits::default()
            });
            engine
                .execute_buffered(statement("CREATE TABLE t (x)"))
                .await
                .unwrap();
            for sql in [
                "INSERT INTO t VALUES (1)",
                "CREATE TABLE u (x)",
                "DROP TABLE t",
                "INSERT INTO t VALUES (1) RETURNING x",
            ] {
                let err = engine.execute_read_only(statement(sql)).await.unwrap_err();
                assert_eq!(err.code, ErrorCode::ReadOnly, "{sql}");
            }
            let count = engine
                .execute_read_only(statement("SELECT count(*) FROM t"))
                .await
                .unwrap();
            let Reply::Whole(count) = count else {
                panic!("a one-row result is answered whole")
            };
            assert!(String::from_utf8_lossy(&count.body).contains("[[0]]"));
            // The writer still writes for everyone else.
            engine
                .execute_buffered(statement("INSERT INTO t VALUES (2)"))
                .await
                .unwrap();
            assert_eq!(engine.queue_depths()[0], ("writer", 0));
            assert_eq!(
                engine.queue_depths().len(),
                1 + usize::from(read_connections > 0)
            );
        }
    }

    #[tokio::test]
    async fn reads_run_beside_a_long_read() {
        let engine = engine_with(Limits {
            read_connections: 2,
            statement_timeout: Duration::from_secs(2),
            ..Limits::default()
        });
        let long = engine.execute_buffered(statement(ENDLESS));
        let quick = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let started = std::time::Instant::now();
            engine
                .execute_buffered(statement("SELECT 1"))
                .await
                .unwrap();
            engine
                .execute_buffered(statement("CREATE TABLE t (x)"))
                .await
                .unwrap();
            engine
                .execute_buffered(statement("INSERT INTO t VALUES (1)"))
                .await
                .unwrap();
            let count = engine
                .execute_buffered(statement("SELECT count(*) FROM t"))
                .await
                .unwrap();
            (started.elapsed(), count)
        };
        let (long, (elapsed, count)) = tokio::join!(long, quick);
        assert_eq!(long.unwrap_err().code, ErrorCode::StatementTimeout);
        assert!(
            elapsed < Duration::from_secs(1),
            "quick work waited {elapsed:?}"
        );
        assert!(String::from_utf8_lossy(&count.body).contains("[[1]]"));
    }
}
