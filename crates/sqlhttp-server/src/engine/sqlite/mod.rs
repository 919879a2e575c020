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
mod contract;
mod control;
mod describe;
mod errors;
mod exec;
mod functions;
pub(crate) mod interactive;
mod keyed;
mod sandbox;
mod sessions;
mod statement_cache;
mod stream;
mod transaction;
mod wal;
mod worker;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::budget::{Budget, Held};
use crate::config::{Database, Limits};
use crate::engine::job::CancelOnDrop;
use crate::engine::stream as chunks;
use crate::engine::{Access, Buffering, Keyed, Outcome, Reply};
use crate::error::ServerError;
use crate::protocol::batch::BatchRequest;
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
    /// for one. The engine's own pools go on until [`Engine::close`](crate::engine::Engine::close).
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
mod tests;
