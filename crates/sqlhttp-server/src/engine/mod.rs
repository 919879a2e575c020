//! The engine contract: what the HTTP layer asks of a database, answered the same way by each
//! engine, and the pieces both engines share.
//!
//! A request reaches an engine through the [`Engine`] trait once admission (`http::admit`) has
//! checked its credential, its body and its text ([`sandbox::check_text`], once):
//! - [`Engine::execute`]: one statement without an Idempotency-Key. [`Access::ReadWrite`] runs
//!   any statement (SQLite first tries a reader and moves a write to the writer);
//!   [`Access::ReadOnly`] runs only one that cannot write, else `403 READ_ONLY` with nothing run
//!   (a read-only credential, or `"read_only": true`). A success body larger than one chunk
//!   streams while the statement runs ([`Reply::Stream`], cut by [`stream::Sink`]).
//! - [`Engine::execute_keyed`] and [`Engine::batch_keyed`]: exactly once under a [`Keyed`]
//!   value (the key, the request's hash, the TTL and the in-flight claim): the decision (replay,
//!   refuse, run) and the settling of an outcome are [`keyed`]'s, the storing each engine's own
//!   `keyed` module's, in the same transaction as the work.
//! - [`Engine::batch`]: several statements in one transaction of the server's own, answered by
//!   [`batch_body::BatchBody`].
//! - [`Engine::begin`]: an interactive transaction, one connection held across requests
//!   ([`Session`], each engine's [`interactive::Interactive`]); the registry of open
//!   transactions, their sequenced statements and exactly-once commits is the transaction
//!   layer's (`crate::transactions`), and [`Engine::recorded`] reads a commit's record back
//!   after a restart.
//! - [`Engine::ready`], [`Engine::queue_depths`], [`Engine::given_up`], [`Engine::close`]: for
//!   `/readyz`, `/metrics` and shutdown ([`shutting_down`] is the one answer a closed engine
//!   gives).
//!
//! Each statement's success body is written by `protocol::result`'s writer, fed one cell at a time in
//! the engine's own type mapping, so both engines answer the same bytes for the same values.
//! What comes next fits here: an interactive transaction is a *session* holding one of an
//! engine's connections across requests, with its own calls beside these; a *read route* (a
//! replica) is where an engine may send what it runs under [`Access::ReadOnly`].
//!
//! Each engine lives in a sibling module with the same file names for the same roles
//! (`exec.rs`, `batch.rs`, `keyed.rs`, `errors.rs`, `sandbox.rs`, `transaction.rs`): `sqlite`
//! (embedded, the default) and `postgres` (behind the default-on `postgres` feature);
//! [`Backend`] chooses one by the database URL and dispatches. This module knows nothing about HTTP. See `docs/adr/0035-engine-contract.md`.

mod backend;
pub(crate) mod batch_body;
pub(crate) mod describe;
pub(crate) mod interactive;
pub(crate) mod job;
pub(crate) mod keyed;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "postgres")]
pub(crate) mod run_to_end;
pub(crate) mod sandbox;
mod session;
pub(crate) mod sql_text;
mod sqlite;
pub(crate) mod stream;

use std::future::Future;
use std::time::Duration;

use crate::budget::{Budget, Held};
use crate::config::Limits;
use crate::protocol::batch::BatchRequest;
use crate::protocol::bookmark::{Position, ReadAt};
use crate::protocol::error::ApiError;
use crate::protocol::request::SqlRequest;

pub(crate) use backend::Backend;
pub(crate) use session::Session;
pub(crate) use stream::ChunkReceiver;

/// The calls the HTTP layer makes of an engine. Every call answers in the protocol's terms
/// (an [`Outcome`], a [`Reply`], an [`ApiError`] with its code); none knows HTTP.
pub(crate) trait Engine: Send + Sync + std::fmt::Debug {
    /// The engine's catalog queries, in the protocol's engine-neutral shape.
    fn catalog(&self) -> Catalog;

    /// Runs one statement without an Idempotency-Key, as `access` allows; a large success body
    /// streams. A read ([`Access::ReadOnly`]) is consistent with at least `at` (an engine
    /// with read replicas may serve it from one that far).
    async fn execute(
        &self,
        request: SqlRequest,
        access: Access,
        at: ReadAt,
    ) -> Result<Reply, ApiError>;

    /// Runs one keyed statement exactly once. Its whole answer comes with its share of the
    /// server's budget, to hold until the answer is sent.
    async fn execute_keyed(
        &self,
        keyed: Keyed,
        request: SqlRequest,
    ) -> Result<(Outcome, Held), ApiError>;

    /// Runs a batch without an Idempotency-Key in one transaction (a read-only batch's
    /// statements see one snapshot), a read-only one consistent with at least `at`.
    async fn batch(&self, batch: BatchRequest, at: ReadAt) -> Result<(Outcome, Held), ApiError>;

    /// Runs a keyed write batch exactly once.
    async fn batch_keyed(
        &self,
        keyed: Keyed,
        batch: BatchRequest,
    ) -> Result<(Outcome, Held), ApiError>;

    /// Describes one statement without running it: its parameters, its result columns and
    /// whether it may write, found by preparing it under the sandbox and the client's
    /// privileges, so a describe is refused what running the statement would be refused for
    /// reading. Under [`Access::ReadOnly`] a statement that may write is refused
    /// (`403 READ_ONLY`). Served by the primary (or the one database): a schema just changed
    /// is described as it now is.
    async fn describe_statement(
        &self,
        sql: String,
        access: Access,
    ) -> Result<describe::Described, ApiError>;

    /// Opens an interactive transaction: one of the engine's connections, held until the
    /// returned session commits, rolls back or is dropped (which rolls back). A read-only one
    /// whose snapshot is the whole transaction's may be served by a read replica as far as
    /// `at` asks.
    async fn begin(
        &self,
        options: interactive::TxOptions,
        at: ReadAt,
    ) -> Result<Self::Session, ApiError>;

    /// The engine's open transaction, as [`Engine::begin`] answers it: each engine's own
    /// session; [`Backend`]'s is the [`Session`] that dispatches to either.
    type Session: interactive::Interactive;

    /// The outcome stored under `key` in the engine's idempotency store (an interactive
    /// transaction's commit record, looked up after its server lost it).
    async fn recorded(&self, key: String) -> Result<Option<keyed::Stored>, ApiError>;

    /// Stores `body` under `key` (identified by `request_hash`) in the idempotency store, in a
    /// transaction of its own: where this process is reached, for its peers (the other
    /// sqlhttpd processes on the database) to forward to.
    async fn store_record(
        &self,
        key: String,
        request_hash: [u8; 32],
        body: Vec<u8>,
    ) -> Result<(), ApiError>;

    /// Refuses a request whose bookmark (`at`) is past everything the database has written
    /// (`409 BOOKMARK_AHEAD`), before anything of it runs. [`Engine::execute`],
    /// [`Engine::batch`] and [`Engine::begin`] check their own; a keyed request, which does
    /// not hand its bookmark on, is checked with this. An engine without log positions (SQLite)
    /// satisfies every bookmark.
    async fn check_bookmark(&self, at: ReadAt) -> Result<(), ApiError> {
        let _ = at;
        Ok(())
    }

    /// Stores a record (`status`, `body`, identified by `request_hash`) under `key` unless one
    /// is there, in a transaction of its own, and answers what is stored under `key` then: the
    /// first claim wins, and a COMMIT that stores its record with a claim fails on another's.
    async fn claim_record(
        &self,
        key: String,
        request_hash: [u8; 32],
        status: u16,
        body: Vec<u8>,
    ) -> Result<keyed::Stored, ApiError>;

    /// Whether the engine answers a trivial statement.
    async fn ready(&self) -> Result<(), ApiError>;

    /// Requests waiting for a connection now, per pool.
    fn queue_depths(&self) -> Vec<(&'static str, usize)>;

    /// Connections given up because their statement did not stop in time.
    fn given_up(&self) -> GivenUp;

    /// The read replicas' state and the reads routed so far, for the metrics (none when the
    /// engine has no replicas).
    fn replicas(&self) -> ReplicaReport {
        ReplicaReport::default()
    }

    /// Closes the engine: running statements are interrupted, later requests answer 503.
    async fn close(&self);
}

/// What a statement may do where it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Only a statement that cannot write runs (a read-only transaction's snapshot on
    /// PostgreSQL; a reader, or the writer under `query_only`, on SQLite).
    ReadOnly,
    /// Any statement runs.
    ReadWrite,
}

/// A keyed request: run exactly once under `key` for `ttl`, identified by `request_hash`.
pub(crate) struct Keyed {
    /// How long the outcome is kept for replay.
    pub(crate) ttl: Duration,
    /// The Idempotency-Key.
    pub(crate) key: String,
    /// The request's identity under its key: a different request with the same key is `422`.
    pub(crate) request_hash: [u8; 32],
    /// The HTTP layer's in-flight claim on the key, held until the engine is done with it
    /// (the value is moved into the engine's job and dropped with it), whether or not the
    /// requester still waits.
    #[expect(
        dead_code,
        reason = "held for its Drop only: the claim ends with the engine's job"
    )]
    pub(crate) claim: Box<dyn Send + Sync>,
}

impl std::fmt::Debug for Keyed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyed")
            .field("ttl", &self.ttl)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// What a statement produced: a status and JSON body, fresh or replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
    pub(crate) replayed: bool,
    /// Where the answer stands (`Sqlhttp-Bookmark`), when the engine knows.
    pub(crate) position: Option<Position>,
}

impl Outcome {
    /// A `200` the engine just produced.
    pub(crate) fn fresh(body: Vec<u8>) -> Outcome {
        Outcome {
            status: 200,
            body,
            replayed: false,
            position: None,
        }
    }

    /// The outcome, standing at `position` when it is known.
    pub(crate) fn at(mut self, position: Option<Position>) -> Outcome {
        if position.is_some() {
            self.position = position;
        }
        self
    }
}

/// A statement's answer: whole (an error, a small result, a replayed outcome), or a success
/// body that streams while the engine steps the statement.
#[derive(Debug)]
pub(crate) enum Reply {
    /// The whole outcome.
    Whole(Outcome),
    /// A `200` whose body is still being written; dropping it stops the statement. Its position
    /// is known before its first byte.
    Stream(ChunkReceiver, Option<Position>),
}

/// An engine's catalog queries: its tables and views, and one table's columns (the name bound
/// as the one parameter), in the protocol's engine-neutral shape.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Catalog {
    pub(crate) tables: &'static str,
    pub(crate) columns: &'static str,
}

/// One read replica's state, for the metrics.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ReplicaState {
    /// Whether it answers, replays the primary's log, and serves reads.
    pub(crate) healthy: bool,
    /// How far behind the primary it was when last asked, in seconds.
    pub(crate) lag_seconds: f64,
}

/// The read replicas' state, and reads counted by who served them and why.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ReplicaReport {
    pub(crate) replicas: Vec<ReplicaState>,
    /// `(served_by, reason, count)`.
    pub(crate) reads: Vec<(&'static str, &'static str, u64)>,
}

/// Given-up connections, for the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct GivenUp {
    /// Given-up connections whose statement still runs on its own thread.
    pub(crate) running: usize,
    /// Connections given up since the server started.
    pub(crate) total: u64,
}

/// How an engine job that builds a whole result (a keyed outcome, a batch's results) takes its
/// share of the server's [`Budget`]: a little ([`SLACK`]) when it gets its connection (nothing
/// while it waits for one), refused with `503` before anything runs when even that is spent;
/// then the share grows with the result while
/// it is built ([`grow`], [`grow_to`]: after each row, each statement of a batch, and the
/// outcome a keyed job is about to store), always [`SLACK`] ahead of it. A result that cannot
/// grow fails the job with `503` *before* its work commits (nothing of it is kept, nothing is
/// stored under its key: a retry runs it again). Once the job is done, the share is what its
/// answer takes, held until the answer has been sent; an answer whose work committed is held
/// whatever the budget says (it is within the share grown for it, bar framing past the slack),
/// so a committed write is never reported failed. (Before issue 36 a job reserved the whole of
/// `--max-result-bytes` when it started, so 16 concurrent keyed writes of one row took a
/// 256 MiB budget.)
#[derive(Debug, Clone)]
pub(crate) struct Buffering {
    budget: Budget,
}

/// How far a buffered job's share stays ahead of its result: what it reserves when it starts,
/// and room for the framing written after the last row is checked.
pub(crate) const SLACK: usize = 64 * 1024;

/// A running buffered job's share, grown as its result grows (see [`Buffering`]).
#[derive(Debug)]
pub(crate) struct Growing {
    budget: Budget,
    held: std::sync::Mutex<Held>,
    /// The bytes of a batch's answer already built, before the statement being written.
    base: std::sync::atomic::AtomicUsize,
}

impl Growing {
    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Grows the share to cover a result of `total` bytes (and the slack; at most the whole
    /// budget). Refused at 0 bytes (the job got its connection), nothing of the job ran.
    fn cover(&self, total: usize) -> Result<(), ApiError> {
        let want = total
            .saturating_add(SLACK)
            .min(self.budget.bytes().max(total));
        self.budget
            .cover(&mut self.held(), want)
            .map_err(|refused| {
                if total == 0 {
                    return refused;
                }
                ApiError::unavailable(format!(
                    "the server is holding as many request bodies and results as it allows at \
                     once ({} bytes, --max-buffered-bytes), and this request's result outgrew \
                     its share at {total} bytes: it was stopped and rolled back, nothing of it \
                     was kept or stored; retry later",
                    self.budget.bytes()
                ))
            })
    }

    fn take(self) -> Held {
        self.held
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

tokio::task_local! {
    /// The share of the buffered job this task runs (PostgreSQL's jobs are tasks).
    static TASK_SHARE: std::sync::Arc<Growing>;
}

thread_local! {
    /// The share of the buffered job this thread runs (SQLite's jobs run on engine threads).
    static THREAD_SHARE: std::cell::RefCell<Option<std::sync::Arc<Growing>>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` on the share of the buffered job running here, if any.
fn on_share<T>(f: impl FnOnce(&Growing) -> T) -> Option<T> {
    if let Ok(share) = TASK_SHARE.try_with(std::sync::Arc::clone) {
        return Some(f(&share));
    }
    THREAD_SHARE
        .with(|share| share.borrow().clone())
        .map(|share| f(&share))
}

/// Grows the running buffered job's share to cover `len` bytes of the statement being written
/// (after what its batch already built); `503` when the budget cannot. Nothing outside a
/// buffered job (a streamed result, an interactive transaction's statement).
pub(crate) fn grow(len: usize) -> Result<(), ApiError> {
    on_share(|share| {
        let base = share.base.load(std::sync::atomic::Ordering::Relaxed);
        share.cover(base.saturating_add(len))
    })
    .unwrap_or(Ok(()))
}

/// Grows the running buffered job's share to cover a whole result of `total` bytes; with
/// `base`, statements written from now on come after those bytes (a batch's answer so far).
pub(crate) fn grow_to(total: usize, base: bool) -> Result<(), ApiError> {
    on_share(|share| {
        if base {
            share
                .base
                .store(total, std::sync::atomic::Ordering::Relaxed);
        }
        share.cover(total)
    })
    .unwrap_or(Ok(()))
}

/// Clears the thread's share when a job on an engine thread ends, however it ends.
struct ThreadScope;

impl Drop for ThreadScope {
    fn drop(&mut self) {
        THREAD_SHARE.with(|share| share.borrow_mut().take());
    }
}

impl Buffering {
    /// Shares of `budget`.
    pub(crate) fn new(budget: Budget, _limits: &Limits) -> Buffering {
        Buffering { budget }
    }

    /// The share for a job that starts now: nothing yet. It takes the slack when the job gets
    /// its connection (the first [`grow`], `503` with nothing run when the budget is spent), so
    /// jobs waiting for a connection hold nothing.
    pub(crate) fn start(&self) -> std::sync::Arc<Growing> {
        std::sync::Arc::new(Growing {
            budget: self.budget.clone(),
            held: std::sync::Mutex::new(Held::default()),
            base: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Runs `work` (a task's future) with `share` as its job's, to grow as its result grows.
    pub(crate) async fn scope<T>(
        share: std::sync::Arc<Growing>,
        work: impl Future<Output = T>,
    ) -> T {
        TASK_SHARE.scope(share, work).await
    }

    /// Runs `job` (on an engine thread) with `share` as its job's.
    pub(crate) fn scope_blocking<T>(share: std::sync::Arc<Growing>, job: impl FnOnce() -> T) -> T {
        THREAD_SHARE.with(|current| *current.borrow_mut() = Some(share));
        let _scope = ThreadScope;
        job()
    }

    /// `outcome` with what its body needs of `share` (the rest given back), to hold until its
    /// answer is sent. A replayed outcome (nothing ran) that the budget cannot hold is `503`;
    /// a fresh one is held whatever the budget says: its work has committed.
    pub(crate) fn kept(
        share: std::sync::Arc<Growing>,
        outcome: Outcome,
    ) -> Result<(Outcome, Held), ApiError> {
        let share = std::sync::Arc::try_unwrap(share).unwrap_or_else(|share| Growing {
            // Not reached: the job's scope ended with the job. Hand its share over anyway.
            budget: share.budget.clone(),
            held: std::sync::Mutex::new(std::mem::take(&mut *share.held())),
            base: std::sync::atomic::AtomicUsize::new(0),
        });
        let budget = share.budget.clone();
        let mut held = share.take();
        Budget::shrink(&mut held, outcome.body.len());
        match budget.cover(&mut held, outcome.body.len()) {
            Ok(()) => {}
            Err(err) if outcome.replayed => return Err(err),
            Err(_) => tracing::debug!(
                bytes = outcome.body.len(),
                "a committed answer outgrew its share's slack; it is sent all the same"
            ),
        }
        Ok((outcome, held))
    }
}

/// The answer of an engine that is closing (or closed), the same from both engines: a peer
/// (another sqlhttpd process on the database), or this one once restarted, can take the
/// request.
pub(crate) fn shutting_down() -> ApiError {
    ApiError::outage(SHUTTING_DOWN)
}

/// What [`shutting_down`] says, also the HTTP layer's answer for a request that arrives while
/// the server drains.
pub(crate) const SHUTTING_DOWN: &str =
    "the server is shutting down; retry on another server or later";
