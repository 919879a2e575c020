//! The PostgreSQL engine: client statements on a pool of tokio-postgres connections
//! (deadpool-postgres) logged in as the client role (`sqlhttp_client` by default), every
//! request in a transaction of the server's own. Each connection's session state (settings,
//! temporary tables, advisory locks) is reset before it serves another request.
//!
//! - [`PgEngine`] is the async handle: `execute_streamed` (the body streams once it outgrows a
//!   chunk, as on SQLite), `execute_read_only` (`BEGIN READ ONLY`, streamed too), `execute_with_key` (exactly once, see `store`), `batch` and
//!   `batch_with_key` (one transaction; a read-only batch is `READ ONLY, REPEATABLE READ`, so its
//!   statements see one snapshot), `ready` and `close`.
//! - Each transaction sets `statement_timeout` to `--statement-timeout`; a request whose
//!   requester goes away has its statement cancelled and its connection discarded.
//! - The transaction that commits is checked to be the one the server opened
//!   (`transaction_timestamp()` taken at BEGIN and checked again in COMMIT's own message),
//!   whatever the text checks saw; the guard savepoint carries a random name per request (ADR
//!   0027). Reads end with ROLLBACK. Each request takes three round trips: BEGIN, the statement
//!   (prepared once per connection and cached: `run::prepare`), and its end with the session's
//!   reset (ADR 0034).
//! - The pool's connections run over `wire`'s stream, which fails a connection as soon as
//!   PostgreSQL declares a row or cell past the server's limits (ADR 0028), before it arrives.
//! - `placeholders` rewrites `?` into `$n`, `sqlstate` maps PostgreSQL's errors onto the
//!   protocol's table, `types` maps values both ways, `sandbox` adds PostgreSQL's text rules to
//!   the common ones, `setup` prepares the database at start, `run` writes a statement's body.
//!
//! Knows nothing about HTTP. See `docs/adr/0018-postgresql-engine.md`.

pub(crate) mod catalog;
mod placeholders;
mod run;
mod sandbox;
mod session;
mod setup;
mod sqlstate;
mod store;
mod tag;
mod tls;
mod types;
mod wire;

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use deadpool_postgres::{
    Hook, HookError, Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::{CancelToken, Client};

use crate::api_error::{ApiError, ErrorCode};
use crate::batch_request::BatchRequest;
use crate::budget::{Budget, Held};
use crate::config::{Limits, PostgresUrl};
use crate::engine::batch_body::{BatchBody, writes_in_read_only_batch};
use crate::engine::job::{Cancel, CancelOnDrop};
use crate::engine::stream::{self, ChunkSender};
use crate::engine::{Buffering, Outcome, Reply, exec};
use crate::error::ServerError;
use crate::request::SqlRequest;

use run::Sink;

/// How long opening a new connection may take.
const CONNECT_WITHIN: Duration = Duration::from_secs(5);

/// How long cancelled work may take to stop before it is abandoned (its connection is then
/// rolled back by its owner, or discarded).
const STOP_WITHIN: Duration = Duration::from_secs(1);

/// The savepoint every request's transaction opens first and releases last is named this and
/// a random suffix drawn for each request, so a client cannot re-create it (ADR 0027).
const GUARD_PREFIX: &str = "_sqlhttp_guard_";

/// What [`Inner::begin`] saw of the transaction it opened, checked again before COMMIT.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Opened {
    /// `transaction_timestamp()` as seconds since the epoch (PostgreSQL's `numeric` text,
    /// exact to the microsecond): a transaction a client's statements began after ending the
    /// server's has another. Checked by `_sqlhttp.check_transaction` in the COMMIT's message.
    at: String,
}

/// Expired idempotency keys are purged at most this often.
const PURGE_INTERVAL: Duration = Duration::from_secs(60);

/// Keyed work: one statement or a batch's statements.
#[derive(Debug, Clone, Copy)]
enum Work<'a> {
    Statement(&'a SqlRequest),
    Batch(&'a [SqlRequest]),
}

/// What a transaction may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `READ WRITE`, `READ COMMITTED`.
    Write,
    /// `READ ONLY`, `REPEATABLE READ`: one snapshot for the whole transaction.
    Read,
}

/// Handle to the PostgreSQL engine. Each request's transaction runs as a task of its own, so a
/// requester that goes away interrupts the running statement (PostgreSQL cancels it) but never
/// leaves a transaction half-done: what committed stays, what did not is rolled back.
#[derive(Debug)]
pub(crate) struct PgEngine {
    inner: Arc<Inner>,
    buffering: Buffering,
}

/// What the tasks share.
struct Inner {
    pool: Pool,
    /// One permit per pooled connection plus `--queue-depth`: past it requests answer 503.
    admission: Arc<Semaphore>,
    limits: Limits,
    closing: Arc<AtomicBool>,
    /// Wakes every guarded job when the engine closes.
    shutdown: tokio::sync::Notify,
    in_flight: Arc<Mutex<HashMap<u64, CancelToken>>>,
    next_lease: AtomicU64,
    last_purge: Mutex<Option<Instant>>,
    /// What the store's functions ask for (see `store`).
    store_key: String,
    /// How to log in beside the pool (see [`terminate`]).
    reaper: Arc<wire::Target>,
    /// The owner's side of the client role: puts its password and defaults back.
    keeper: Arc<setup::RoleKeeper>,
    /// What the pool's connections were cut for (see `wire`).
    cuts: Arc<wire::Cuts>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgEngine")
            .field("connections", &self.pool.status().size)
            .finish_non_exhaustive()
    }
}

/// A pooled connection held by one request. Dropped before [`Lease::release`] (the requester
/// went away mid-transaction), its statement is cancelled and the connection is discarded, so
/// PostgreSQL rolls the transaction back.
struct Lease {
    object: Option<Object>,
    id: u64,
    cancel: CancelToken,
    in_flight: Arc<Mutex<HashMap<u64, CancelToken>>>,
    clean: bool,
    /// A cancel request was sent to the session. PostgreSQL may deliver it after the statement
    /// it was meant for has ended, to the next one the session runs, so the connection never
    /// serves another request (it is closed, not returned to the pool).
    cancel_sent: AtomicBool,
    /// The session's backend process, once the transaction began (0 before).
    backend: AtomicI32,
    /// This request's guard savepoint (see [`GUARD_PREFIX`]).
    guard: String,
    /// The transaction the server opened, once it did.
    opened: Mutex<Option<Opened>>,
    /// Prepare every statement afresh, past the connection's cache (see `run::prepare`): the
    /// second run of a request whose cached statement went stale.
    fresh: AtomicBool,
    /// A cached statement failed as a stale one does (see `run::prepare`): the request runs
    /// once more, in a new transaction, with every statement prepared afresh.
    stale: AtomicBool,
    /// How to log in beside the pool, to end a session the server gave up on (and where to
    /// send a cancel request).
    reaper: Arc<wire::Target>,
    /// What the connections were cut for (see `wire`).
    cuts: Arc<wire::Cuts>,
    _permit: OwnedSemaphorePermit,
}

impl Lease {
    /// Cancels the statement the session runs now; the session is not reused after.
    async fn cancel_statement(&self) {
        self.cancel_sent.store(true, Ordering::Release);
        wire::cancel(&self.cancel, &self.reaper).await;
    }

    /// What the session's connection was cut for, if `wire` cut it (asked once).
    fn cut(&self) -> Option<wire::Cut> {
        match self.backend.load(Ordering::Acquire) {
            0 => None,
            pid => self.cuts.take(pid),
        }
    }

    /// Closes the session when the lease ends instead of pooling it: its driver's read buffer
    /// grew to hold a large row, and would keep that size for the connection's life.
    fn retire(&self) {
        self.cancel_sent.store(true, Ordering::Release);
    }

    fn client(&self) -> &Client {
        // The object is taken only in drop.
        self.object
            .as_ref()
            .map(|object| &***object)
            .expect("a live lease")
    }

    /// The connection's prepared statements, by text (see `run::prepare`).
    fn cache(&self) -> &deadpool_postgres::StatementCache {
        &self.wrapper().statement_cache
    }

    /// The connection with its cache of prepared statements.
    fn wrapper(&self) -> &deadpool_postgres::ClientWrapper {
        // The object is taken only in drop.
        self.object.as_deref().expect("a live lease")
    }

    /// Whether a request that failed on this lease is to run once more: a cached statement
    /// went stale (DDL changed what it reads) on its first run, before anything was sent. The
    /// transaction it ran in has rolled back, so nothing of that run was kept; the second run
    /// prepares every statement afresh, as the server did before it cached any.
    fn take_retry(&self) -> bool {
        self.stale.swap(false, Ordering::AcqRel) && !self.fresh.swap(true, Ordering::AcqRel)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
        if self.clean {
            if self.cancel_sent.load(Ordering::Acquire)
                && let Some(object) = self.object.take()
            {
                // Closing the connection ends its (idle) session; a late cancel then lands
                // nowhere.
                drop(Object::take(object));
            }
            return;
        }
        if let Some(object) = self.object.take() {
            let client = Object::take(object);
            let cancel = self.cancel.clone();
            let backend = self.backend.load(Ordering::Acquire);
            let reaper = Arc::clone(&self.reaper);
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    wire::cancel(&cancel, &reaper).await;
                    drop(client);
                    // A function can catch the cancel and go on (holding its locks and a
                    // connection slot); its backend cannot catch being terminated.
                    if backend != 0 {
                        terminate(&reaper, backend).await;
                    }
                });
            }
        }
    }
}

/// Ends the session of backend `pid` from a connection of its own (the client role may end its
/// own sessions), and waits (briefly) until it is gone.
async fn terminate(target: &wire::Target, pid: i32) {
    let ended = async {
        let (client, driver) = wire::connect(target).await?;
        client
            .query_one("SELECT pg_catalog.pg_terminate_backend($1)", &[&pid])
            .await?;
        drop(client);
        let _ = driver.await;
        Ok::<(), tokio_postgres::Error>(())
    };
    match tokio::time::timeout(CONNECT_WITHIN, ended).await {
        Ok(Ok(())) => tracing::debug!(pid, "ended a session the server gave up on"),
        Ok(Err(e)) => tracing::warn!(pid, error = %e, "cannot end a session the server gave up on"),
        Err(_) => tracing::warn!(pid, "cannot end a session the server gave up on: no answer"),
    }
}

impl PgEngine {
    /// Prepares the database (the client role, its schema rights, the server's store) and
    /// builds the pool of client-role connections; they open on first use.
    pub(crate) fn start(
        url: &PostgresUrl,
        idempotency_ttl: Option<Duration>,
        limits: Limits,
        budget: Budget,
    ) -> Result<PgEngine, ServerError> {
        let failed = |reason: String| ServerError::Postgres {
            database: url.to_string(),
            reason,
        };
        let prepared = setup::prepare(url)?;
        let reaper = Arc::new(wire::Target {
            config: prepared.client.clone(),
            tls: Arc::clone(&prepared.tls),
        });
        let keeper = Arc::clone(&prepared.keeper);
        let cuts = Arc::new(wire::Cuts::default());
        let manager = Manager::from_connect(
            prepared.client,
            wire::BoundedConnect {
                bounds: wire::Bounds::new(limits.max_value_bytes, limits.max_result_bytes),
                cuts: Arc::clone(&cuts),
                tls: Arc::clone(&prepared.tls),
            },
            ManagerConfig {
                // A client's function may change its session (settings, temporary tables that
                // would shadow the next client's): reset it before the next request.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let connections = limits.read_connections + 1;
        let pool = Pool::builder(manager)
            .max_size(connections)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(limits.statement_timeout))
            .create_timeout(Some(CONNECT_WITHIN))
            .recycle_timeout(Some(CONNECT_WITHIN))
            .post_create(Hook::async_fn(move |client, _| {
                let keeper = Arc::clone(&keeper);
                Box::pin(async move {
                    session::check_new(client, &keeper)
                        .await
                        .map_err(|why| HookError::Message(why.into()))
                })
            }))
            .build()
            .map_err(|e| failed(e.to_string()))?;
        let engine = Inner {
            pool,
            admission: Arc::new(Semaphore::new(connections + limits.queue_depth)),
            limits,
            closing: Arc::new(AtomicBool::new(false)),
            shutdown: tokio::sync::Notify::new(),
            in_flight: Arc::default(),
            next_lease: AtomicU64::new(0),
            // The first keyed request purges.
            last_purge: Mutex::new(None),
            store_key: prepared.store_key,
            reaper,
            keeper: prepared.keeper,
            cuts,
        };
        if idempotency_ttl.is_none() {
            *engine
                .last_purge
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        }
        Ok(PgEngine {
            inner: Arc::new(engine),
            buffering: Buffering::new(budget, &limits),
        })
    }

    /// Runs `work` as a task of its own and waits for it. Dropping the returned future (the
    /// requester went away) cancels the statement the task is running; the task then rolls
    /// back, unless its statement had already finished, in which case it commits.
    async fn spawn<T, F, Fut>(&self, work: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Inner>, Arc<Job>) -> Fut,
        Fut: std::future::Future<Output = Result<T, ApiError>> + Send + 'static,
    {
        let job = Arc::new(Job::default());
        let task = tokio::spawn(work(Arc::clone(&self.inner), Arc::clone(&job)));
        let cancel = CancelOnDrop::new(job);
        let result = task.await;
        cancel.disarm();
        result.unwrap_or_else(|e| {
            tracing::error!(error = %e, "a PostgreSQL job panicked");
            Err(ApiError::internal())
        })
    }

    /// Runs one request without an Idempotency-Key in a read-write transaction, streaming a
    /// success body larger than one chunk while the rows arrive (see `engine::stream`): the
    /// transaction commits before the body's last bytes are sent, and a failure after the first
    /// chunk ends the body with its error.
    pub(crate) async fn execute_streamed(&self, request: SqlRequest) -> Result<Reply, ApiError> {
        self.streamed(request, Mode::Write).await
    }

    /// Runs one request for a credential that may only read, streamed like
    /// [`PgEngine::execute_streamed`], in a `READ ONLY` transaction: a statement that writes is
    /// refused by PostgreSQL (`403 READ_ONLY`; nothing was written).
    pub(crate) async fn execute_read_only(&self, request: SqlRequest) -> Result<Reply, ApiError> {
        sandbox::check_read_only_text(&request.sql)?;
        self.streamed(request, Mode::Read).await
    }

    async fn streamed(&self, request: SqlRequest, mode: Mode) -> Result<Reply, ApiError> {
        let job = Arc::new(Job::default());
        let (sender, mut receiver) = stream::channel(stream::QUEUE_CHUNKS);
        let inner = Arc::clone(&self.inner);
        let task_job = Arc::clone(&job);
        let task =
            tokio::spawn(async move { inner.stream(&task_job, &request, mode, sender).await });
        let cancel = CancelOnDrop::new(job);
        match receiver.start().await {
            stream::Start::Streaming => {
                // The body now owns the job: dropping it (the client left) cancels the statement.
                receiver.hold(cancel);
                Ok(Reply::Stream(receiver))
            }
            stream::Start::Nothing => {
                let ran = task.await;
                cancel.disarm();
                match ran {
                    Ok(Ok(Some(body))) => Ok(Reply::Whole(Outcome::fresh(body))),
                    Ok(Ok(None)) => Err(ApiError::internal()),
                    Ok(Err(err)) => Err(err),
                    Err(e) => {
                        tracing::error!(error = %e, "a PostgreSQL job panicked");
                        Err(ApiError::internal())
                    }
                }
            }
        }
    }

    /// Runs one keyed request exactly once (see `store`). `guard` is held until the engine is
    /// done with the key, whether or not the requester still waits.
    pub(crate) async fn execute_with_key<G: Send + 'static>(
        &self,
        ttl: Duration,
        key: String,
        request_hash: [u8; 32],
        request: SqlRequest,
        guard: G,
    ) -> Result<(Outcome, Held), ApiError> {
        let buffering = self.buffering.clone();
        self.spawn(|inner, job| async move {
            let _guard = guard;
            let mut held = buffering.start()?;
            // Boxed: the keyed transaction's future is large.
            let outcome =
                Box::pin(inner.with_key(&job, ttl, &key, &request_hash, Work::Statement(&request)))
                    .await?;
            Buffering::keep(&mut held, outcome.body.len());
            Ok((outcome, held))
        })
        .await
    }

    /// Runs a batch without an Idempotency-Key in one transaction.
    pub(crate) async fn batch(&self, batch: BatchRequest) -> Result<(Outcome, Held), ApiError> {
        if batch.read_only {
            for (index, statement) in batch.statements.iter().enumerate() {
                sandbox::check_read_only_text(&statement.sql).map_err(|e| e.at_statement(index))?;
            }
        }
        let buffering = self.buffering.clone();
        self.spawn(|inner, job| async move {
            let mut held = buffering.start()?;
            let body = inner.batch(&job, &batch).await?;
            Buffering::keep(&mut held, body.len());
            Ok((Outcome::fresh(body), held))
        })
        .await
    }

    /// Runs a keyed write batch exactly once (see `store`). `guard` is held until the engine
    /// is done with the key, whether or not the requester still waits.
    pub(crate) async fn batch_with_key<G: Send + 'static>(
        &self,
        ttl: Duration,
        key: String,
        request_hash: [u8; 32],
        batch: BatchRequest,
        guard: G,
    ) -> Result<(Outcome, Held), ApiError> {
        let buffering = self.buffering.clone();
        self.spawn(|inner, job| async move {
            let _guard = guard;
            let mut held = buffering.start()?;
            let outcome = Box::pin(inner.with_key(
                &job,
                ttl,
                &key,
                &request_hash,
                Work::Batch(&batch.statements),
            ))
            .await?;
            Buffering::keep(&mut held, outcome.body.len());
            Ok((outcome, held))
        })
        .await
    }

    /// Whether a connection answers a trivial statement.
    pub(crate) async fn ready(&self) -> Result<(), ApiError> {
        self.spawn(|inner, job| async move { inner.ready(&job).await })
            .await
    }

    /// Requests waiting for a connection now.
    pub(crate) fn waiting(&self) -> usize {
        self.inner.pool.status().waiting
    }

    /// Closes the pool: statements still running are cancelled (their requests answer 503),
    /// and this returns once every request has let go of its connection. Later requests
    /// answer 503.
    pub(crate) async fn close(&self) {
        self.inner.close().await;
    }
}

/// One request's job: whether its requester went away. The task that holds the connection
/// cancels its own statement (see [`Inner::guarded`]), so a cancel request can never reach a
/// connection that already serves another request.
#[derive(Default)]
struct Job {
    cancelled: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Job {
    fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }
}

impl Cancel for Job {
    fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        self.notify.notify_one();
    }
}

impl Inner {
    fn timeout_ms(&self) -> u128 {
        self.limits.statement_timeout.as_millis()
    }

    /// The protocol error for a PostgreSQL failure; once closing, a cancelled or lost
    /// statement is the shutdown's 503.
    fn map(&self, err: tokio_postgres::Error) -> ApiError {
        let mapped = sqlstate::map_error(&err, self.timeout_ms());
        if self.closing.load(Ordering::Acquire)
            && matches!(
                mapped.code,
                ErrorCode::StatementTimeout | ErrorCode::Unavailable
            )
        {
            return shutting_down();
        }
        mapped
    }

    /// A connection for one request, or 503 when the server is closing, the queue is full or
    /// the database cannot be reached.
    async fn lease(&self, job: &Job) -> Result<Lease, ApiError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(shutting_down());
        }
        if job.is_cancelled() {
            // Nobody waits for the answer any more.
            return Err(ApiError::interrupted());
        }
        let permit = Arc::clone(&self.admission)
            .try_acquire_owned()
            .map_err(|_| {
                ApiError::unavailable(
                    "the database is busy: too many statements are waiting; retry later",
                )
            })?;
        // A client's function may have changed the client role (its defaults, its password):
        // once the owner has put it back, one more login is clean (see `session`).
        let object = match self.pool.get().await {
            Err(e) if session::worth_retrying(&self.keeper, &e).await => self.pool.get().await,
            got => got,
        };
        let object = object.map_err(|e| {
            use deadpool_postgres::PoolError as E;
            match e {
                E::Timeout(_) => ApiError::unavailable(
                    "the database is busy: no connection came free in time; retry later",
                ),
                E::Closed => shutting_down(),
                other => {
                    tracing::warn!(error = %other, "cannot get a database connection");
                    ApiError::unavailable("the database cannot be reached; retry later")
                }
            }
        })?;
        let id = self.next_lease.fetch_add(1, Ordering::Relaxed);
        let cancel = object.cancel_token();
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, cancel.clone());
        Ok(Lease {
            object: Some(object),
            id,
            cancel,
            in_flight: Arc::clone(&self.in_flight),
            clean: false,
            cancel_sent: AtomicBool::new(false),
            backend: AtomicI32::new(0),
            guard: format!("{GUARD_PREFIX}{:016x}", rand::random::<u64>()),
            opened: Mutex::new(None),
            fresh: AtomicBool::new(false),
            stale: AtomicBool::new(false),
            reaper: Arc::clone(&self.reaper),
            cuts: Arc::clone(&self.cuts),
            _permit: permit,
        })
    }

    /// Runs `work` on `lease`; should the requester go away meanwhile, cancels the statement
    /// running on the lease's connection (PostgreSQL answers it with `57014`) and lets `work`
    /// finish with that error, so the transaction is still ended by its owner.
    ///
    /// The same happens when the engine closes; work that is not in a statement then (a
    /// streamed body waiting for its client to read) gets [`STOP_WITHIN`] and is abandoned.
    ///
    /// And when `work` (of `statements` statements) outlives `--statement-timeout` per
    /// statement and a grace of [`STOP_WITHIN`]: PostgreSQL's own `statement_timeout` normally
    /// fires first, but a client's function can lower its guard (`set_config` through dynamic
    /// SQL), and the pool must not be held past the limit anyway.
    async fn guarded<T>(
        &self,
        job: &Job,
        lease: &Lease,
        statements: usize,
        work: impl Future<Output = Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        let mut work = pin!(work);
        let shutdown = self.shutdown.notified();
        let mut shutdown = pin!(shutdown);
        shutdown.as_mut().enable();
        let per_statement = self.limits.statement_timeout;
        let backstop = per_statement
            .saturating_mul(u32::try_from(statements.max(1)).unwrap_or(u32::MAX))
            .saturating_add(STOP_WITHIN);
        let mut overran = false;
        if !self.closing.load(Ordering::Acquire) {
            tokio::select! {
                out = &mut work => return out,
                () = job.notify.notified() => {}
                () = &mut shutdown => {}
                () = tokio::time::sleep(backstop) => overran = true,
            }
        }
        lease.cancel_statement().await;
        let overran_error = || {
            ApiError::new(
                ErrorCode::StatementTimeout,
                format!(
                    "the request ran longer than this server's limit of {} ms per statement \
                     (--statement-timeout) and was cancelled; nothing it did was kept",
                    per_statement.as_millis()
                ),
            )
        };
        match tokio::time::timeout(STOP_WITHIN, work).await {
            Ok(Err(_)) if overran => Err(overran_error()),
            Ok(out) => out,
            Err(_) if self.closing.load(Ordering::Acquire) => Err(shutting_down()),
            Err(_) if overran => Err(overran_error()),
            Err(_) => Err(ApiError::interrupted()),
        }
    }

    /// Opens the server's transaction on `lease` (its mode and statement timeout), in one
    /// message: `BEGIN` first, so a failure anywhere in it leaves no statement of the message
    /// run outside the transaction. The session was reset when its last request ended (see
    /// [`Inner::end`]) or when it logged in (`session::check_new`). A write opens the guard
    /// savepoint, released just before COMMIT; a read ends with ROLLBACK, which cannot keep
    /// anything, and needs neither the guard nor the check of [`Opened`].
    async fn begin(&self, lease: &Lease, mode: Mode) -> Result<(), ApiError> {
        let begin = match mode {
            Mode::Write => format!(
                "BEGIN READ WRITE, ISOLATION LEVEL READ COMMITTED; \
                 SET LOCAL statement_timeout = {}; SAVEPOINT {}; {OPENED}",
                self.timeout_ms(),
                lease.guard
            ),
            Mode::Read => format!(
                "BEGIN READ ONLY, ISOLATION LEVEL REPEATABLE READ; \
                 SET LOCAL statement_timeout = {}; {OPENED}",
                self.timeout_ms()
            ),
        };
        let answer = lease
            .client()
            .simple_query(&begin)
            .await
            .map_err(|e| self.map(e))?;
        let opened = answer.iter().find_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some((
                row.get(0).and_then(|pid| pid.parse::<i32>().ok()),
                row.get(1).map(str::to_owned),
            )),
            _ => None,
        });
        let Some((Some(pid), Some(at))) = opened else {
            tracing::error!("BEGIN's answer did not name the session and the transaction");
            return Err(ApiError::internal());
        };
        // The text goes back into the COMMIT's message as a literal: digits and a point only.
        if at.is_empty() || !at.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            tracing::error!(at, "BEGIN's transaction start is not a number");
            return Err(ApiError::internal());
        }
        lease.backend.store(pid, Ordering::Release);
        *lease.opened.lock().unwrap_or_else(PoisonError::into_inner) = Some(Opened { at });
        Ok(())
    }

    /// Ends the transaction: a write that succeeded commits (with the statement timeout set
    /// again, which a client's function may have lowered, for the work COMMIT runs: deferred
    /// triggers, cursors held past it), after checking in the same message that the
    /// transaction is still the one [`Inner::begin`] opened (the guard savepoint's release,
    /// and `_sqlhttp.check_transaction`: a client's statements may have ended it and begun
    /// another, `;COMMIT; BEGIN` had the text checks missed them, which must not commit in its
    /// place: ADR 0027). Anything else rolls back: a failure, and every read (it wrote
    /// nothing; a ROLLBACK cannot keep a replaced transaction either). The session's reset
    /// ([`session::RESET`]) goes in the same round trip, after the transaction ended, so the
    /// session goes back to the pool clean. The lease goes back to the pool unless the
    /// connection is in doubt; past `--statement-timeout` and [`STOP_WITHIN`], the end is
    /// abandoned and the connection discarded (its transaction rolls back).
    async fn end<T>(
        &self,
        mut lease: Lease,
        mode: Mode,
        result: Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let client = lease.client();
        let commits = result.is_ok() && mode == Mode::Write;
        let opened = lease
            .opened
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let ending = async {
            let end = match (&opened, commits) {
                // Deferred constraints and triggers run here, under the timeout; session
                // advisory locks a client took end with its request (the reset's unlock).
                (Some(opened), true) => format!(
                    "SET LOCAL statement_timeout = {}; SET CONSTRAINTS ALL IMMEDIATE; \
                     RELEASE SAVEPOINT {}; \
                     SELECT _sqlhttp.check_transaction('{}'::pg_catalog.numeric); COMMIT",
                    self.timeout_ms(),
                    lease.guard,
                    opened.at
                ),
                (None, true) => return Err(Ending::Tampered(tampered())),
                (_, false) => "ROLLBACK".to_owned(),
            };
            // One write: the reset runs once the transaction ended, whatever its end did.
            let (ended, reset) = tokio::join!(
                client.batch_execute(&end),
                client.batch_execute(session::RESET)
            );
            match ended {
                Err(e) if commits => {
                    // Whatever transaction the session is in now is not to be kept.
                    let _ = client.batch_execute("ROLLBACK").await;
                    if e.code()
                        .is_some_and(|code| code.code() == TAMPERED_SQLSTATE)
                    {
                        return Err(Ending::Tampered(tampered()));
                    }
                    Err(Ending::Postgres(e))
                }
                Err(e) => Err(Ending::Postgres(e)),
                // Ended as asked, but the session is not clean: not pooled again.
                Ok(()) => reset.map_err(Ending::Reset),
            }
        };
        // A rollback is quick unless the session is stuck in work that ignores cancels: then
        // it is not waited for (the session is ended, which rolls back).
        let within = match &result {
            Ok(_) => self.limits.statement_timeout.saturating_add(STOP_WITHIN),
            Err(_) => STOP_WITHIN,
        };
        let Ok(ended) = tokio::time::timeout(within, ending).await else {
            if let Err(err) = result {
                return Err(err);
            }
            // Dropping the unclean lease cancels the statement and ends the session. COMMIT may
            // have completed meanwhile: the outcome is not known, and the answer says so (a
            // keyed retry replays it, or runs it if it was not kept).
            return Err(ApiError::unavailable(format!(
                "the transaction did not finish ending within this server's limit of {} ms \
                 (--statement-timeout); whether it was kept is unknown: retry with the same \
                 Idempotency-Key, or check",
                self.timeout_ms()
            )));
        };
        match ended {
            Ok(()) => {
                lease.clean = true;
                result
            }
            Err(Ending::Reset(e)) => {
                // The transaction ended as asked; the session is closed, not pooled.
                tracing::warn!(error = %e, "cannot reset a session; closing it");
                lease.retire();
                lease.clean = true;
                result
            }
            // The statement's own error explains more than the failed rollback.
            Err(_) if result.is_err() => result,
            // The session is not reused (the lease is unclean): its state is the client's.
            Err(Ending::Tampered(err)) => Err(err),
            Err(Ending::Postgres(e)) => Err(self.map(e)),
        }
    }

    /// Runs one statement in its own transaction, sending its body through `sender` once it
    /// outgrows a chunk. Returns the whole body when nothing was sent, `None` when the body went
    /// through the channel (to its end, or to an error written into it).
    async fn stream(
        &self,
        job: &Job,
        request: &SqlRequest,
        mode: Mode,
        sender: ChunkSender,
    ) -> Result<Option<Vec<u8>>, ApiError> {
        let mut lease = self.lease(job).await?;
        let mut out = Vec::with_capacity(stream::CHUNK_BYTES + 1024);
        let must_stop = || job.is_cancelled();
        let mut sink = Sink::Stream(run::Chunks::new(&sender, &must_stop));
        let map = |e| self.map(e);
        loop {
            // BEGIN goes out with the statement (see `run::write_result`).
            let opening: run::Opening<'_> = Box::pin(self.begin(&lease, mode));
            let written = self
                .guarded(
                    job,
                    &lease,
                    1,
                    run::write_result(
                        &lease,
                        request,
                        &self.limits,
                        &mut out,
                        &mut sink,
                        &map,
                        Some(opening),
                    ),
                )
                .await;
            let started = matches!(&sink, Sink::Stream(chunks) if chunks.started());
            if !started && written.is_err() && lease.take_retry() {
                // Nothing was sent: the first run is rolled back, and forgotten.
                lease = self.again(lease).await?;
                out.clear();
                continue;
            }
            break self
                .finish(lease, mode, written, started, out, sender)
                .await;
        }
    }

    /// Ends a streamed statement's transaction (see [`Inner::stream`]).
    async fn finish(
        &self,
        lease: Lease,
        mode: Mode,
        written: Result<(), ApiError>,
        started: bool,
        mut out: Vec<u8>,
        sender: ChunkSender,
    ) -> Result<Option<Vec<u8>>, ApiError> {
        if !started {
            return self.end(lease, mode, written.map(|()| Some(out))).await;
        }
        let ended = self.end(lease, mode, written).await;
        if let Err(err) = ended {
            if sender.is_gone() {
                // Nobody reads the body any more.
                return Err(err);
            }
            tracing::debug!(code = err.code.as_str(), "statement failed mid-stream");
            // `out` ends after a whole row: close the rows and say why the body ends here.
            exec::write_error_tail(&mut out, &err);
        }
        sender.finish(Bytes::from(out));
        Ok(None)
    }

    /// Runs a batch without an Idempotency-Key in one transaction.
    async fn batch(&self, job: &Job, batch: &BatchRequest) -> Result<Vec<u8>, ApiError> {
        let mode = if batch.read_only {
            Mode::Read
        } else {
            Mode::Write
        };
        let mut lease = self.lease(job).await?;
        loop {
            if let Err(err) = self.begin(&lease, mode).await {
                return self.end(lease, mode, Err(err)).await;
            }
            let ran = self
                .guarded(
                    job,
                    &lease,
                    batch.statements.len(),
                    self.run_statements(&lease, &batch.statements),
                )
                .await;
            if ran.is_err() && lease.take_retry() {
                lease = self.again(lease).await?;
                continue;
            }
            break self.end(lease, mode, ran).await;
        }
    }

    async fn with_key(
        &self,
        job: &Job,
        ttl: Duration,
        key: &str,
        request_hash: &[u8],
        work: Work<'_>,
    ) -> Result<Outcome, ApiError> {
        self.purge_if_due(job, ttl).await;
        let mut lease = self.lease(job).await?;
        loop {
            if let Err(err) = self.begin(&lease, Mode::Write).await {
                return self.end(lease, Mode::Write, Err(err)).await;
            }
            let outcome = self
                .keyed_once(job, &lease, ttl, key, request_hash, work)
                .await;
            if outcome.is_err() && lease.take_retry() {
                lease = self.again(lease).await?;
                continue;
            }
            break self.end(lease, Mode::Write, outcome).await;
        }
    }

    /// Rolls back a run of a request that is to run once more on `lease` (see
    /// [`Lease::take_retry`]), and resets the session its statements may have changed, in one
    /// round trip; a connection that cannot is discarded.
    async fn again(&self, lease: Lease) -> Result<Lease, ApiError> {
        let client = lease.client();
        let undone = tokio::time::timeout(STOP_WITHIN, async {
            let (rolled_back, reset) = tokio::join!(
                client.batch_execute("ROLLBACK"),
                client.batch_execute(session::RESET)
            );
            rolled_back.and(reset)
        })
        .await;
        match undone {
            Ok(Ok(())) => Ok(lease),
            Ok(Err(e)) => Err(self.map(e)),
            Err(_) => Err(ApiError::interrupted()),
        }
    }

    /// One run of keyed work in the transaction open on `lease` (see [`Inner::with_key`]).
    async fn keyed_once(
        &self,
        job: &Job,
        lease: &Lease,
        ttl: Duration,
        key: &str,
        request_hash: &[u8],
        work: Work<'_>,
    ) -> Result<Outcome, ApiError> {
        let map = |e| self.map(e);
        let run = async {
            match work {
                Work::Statement(request) => {
                    let mut out = Vec::with_capacity(256);
                    let mut sink = Sink::Buffered {
                        limit: self.limits.max_result_bytes,
                    };
                    let limits = &self.limits;
                    run::write_result(lease, request, limits, &mut out, &mut sink, &map, None)
                        .await?;
                    Ok(out)
                }
                Work::Batch(statements) => self.run_statements(lease, statements).await,
            }
        };
        self.guarded(
            job,
            lease,
            match work {
                Work::Statement(_) => 1,
                Work::Batch(statements) => statements.len(),
            },
            // Boxed: the keyed work's future is large.
            Box::pin(store::run_with_key(
                lease.wrapper(),
                &self.store_key,
                ttl,
                key,
                request_hash,
                run,
                &map,
            )),
        )
        .await
    }

    /// Runs the statements in order inside the open transaction and answers
    /// `{"results": [...]}`; the first failure stops the batch and names its statement.
    async fn run_statements(
        &self,
        lease: &Lease,
        statements: &[SqlRequest],
    ) -> Result<Vec<u8>, ApiError> {
        let limit = self.limits.max_result_bytes;
        let map = |e| self.map(e);
        let mut answer = BatchBody::new(limit, statements.len());
        for (index, statement) in statements.iter().enumerate() {
            let mut body = Vec::with_capacity(256);
            let mut sink = Sink::Buffered { limit };
            let limits = &self.limits;
            run::write_result(lease, statement, limits, &mut body, &mut sink, &map, None)
                .await
                .map_err(|err| match err.code {
                    ErrorCode::ReadOnly => writes_in_read_only_batch(index),
                    _ => err.at_statement(index),
                })?;
            answer.push(index, &body)?;
        }
        Ok(answer.finish())
    }

    /// Deletes expired idempotency keys, at most once a [`PURGE_INTERVAL`].
    async fn purge_if_due(&self, job: &Job, ttl: Duration) {
        {
            let mut last = self
                .last_purge
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|at| at.elapsed() < PURGE_INTERVAL) {
                return;
            }
            *last = Some(Instant::now());
        }
        let Ok(lease) = self.lease(job).await else {
            return;
        };
        // In a transaction of its own: a pooled session defaults to read-only (see
        // `session::RESET`); a session whose purge failed is not pooled again.
        let client = lease.client();
        let begin = format!(
            "BEGIN READ WRITE, ISOLATION LEVEL READ COMMITTED; SET LOCAL statement_timeout = {}",
            self.timeout_ms()
        );
        let purged = async {
            client.batch_execute(&begin).await?;
            let purged = store::purge_expired(client, &self.store_key, ttl).await?;
            client.batch_execute("COMMIT").await?;
            Ok::<_, tokio_postgres::Error>(purged)
        }
        .await;
        let mut lease = lease;
        match purged {
            Ok(purged) => {
                if purged > 0 {
                    tracing::debug!(purged, "purged expired idempotency keys");
                }
                lease.clean = true;
            }
            Err(e) => tracing::warn!(error = %e, "cannot purge expired idempotency keys"),
        }
    }

    /// Whether a connection answers a trivial statement.
    async fn ready(&self, job: &Job) -> Result<(), ApiError> {
        let mut lease = self.lease(job).await?;
        lease
            .client()
            .query_one("SELECT 1", &[])
            .await
            .map_err(|e| self.map(e))?;
        lease.clean = true;
        Ok(())
    }

    async fn close(&self) {
        self.closing.store(true, Ordering::Release);
        self.shutdown.notify_waiters();
        self.pool.close();
        loop {
            let tokens: Vec<CancelToken> = self
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
                .cloned()
                .collect();
            if tokens.is_empty() {
                break;
            }
            for token in tokens {
                wire::cancel(&token, &self.reaper).await;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// Why a transaction did not end as asked.
#[derive(Debug)]
enum Ending {
    Postgres(tokio_postgres::Error),
    /// It was not the server's transaction any more (see [`Inner::end`]).
    Tampered(ApiError),
    /// The transaction ended as asked, but the session's reset after it failed.
    Reset(tokio_postgres::Error),
}

/// What `BEGIN`'s message reads last: the session's backend (see [`Lease::backend`]) and the
/// transaction's start (see [`Opened`]).
const OPENED: &str = "SELECT pg_catalog.pg_backend_pid(), \
EXTRACT(EPOCH FROM pg_catalog.transaction_timestamp())::pg_catalog.text";

/// The SQLSTATE `_sqlhttp.check_transaction` raises (see `setup`) for a transaction that is
/// not the one the server opened.
const TAMPERED_SQLSTATE: &str = "SQLHT";

/// The answer for a request whose statements ended or replaced the server's transaction.
fn tampered() -> ApiError {
    tracing::warn!("a request ended or changed the server's transaction; rolled back");
    ApiError::bad_request(format!(
        "the request's statements ended or replaced the server's transaction: it was rolled \
         back and nothing was kept. {}",
        crate::engine::sandbox::TRANSACTION_HINT
    ))
}

fn shutting_down() -> ApiError {
    ApiError::unavailable("the server is shutting down; retry on another replica or later")
}
