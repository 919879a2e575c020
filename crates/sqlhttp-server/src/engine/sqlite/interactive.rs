//! Interactive transactions on SQLite: a [`Session`] is one connection of its own, opened for
//! the transaction on a thread of its own, holding its transaction across requests. A write
//! transaction begins with `BEGIN IMMEDIATE`, so it holds SQLite's one write lock from its
//! open to its end, with the engine's write permit (see `SqliteEngine::begin`): plain writes
//! and the next write transaction's open wait for the permit instead of failing at SQLite's busy
//! limit. A read-only transaction is a reader's `BEGIN` whose snapshot is taken at its open, and
//! never takes the write lock.
//!
//! Each statement runs through `exec::execute` (the sandbox, the result limit, the statement
//! timeout of a job of its own) inside a savepoint, so a statement that fails leaves the
//! transaction as it was before it; one that ends the transaction (`OR ROLLBACK`) aborts it.
//! The commit stores the transaction's outcome record in `main._sqlhttp_idempotency` in the same
//! transaction (see `keyed`), so a crash leaves it committed and recorded, or neither.
//!
//! The thread enlists in the engine's `Sessions` and publishes each step there, so the
//! watchdog gives up a step that does not stop (its requester answered at once, the
//! transaction aborted, nothing committed) and ends a transaction the engine may not keep (a
//! write one idle past `--transaction-write-idle`, a read-only one pinning an overgrown
//! write-ahead log, any while the log is past its hard bound (ADR 0046), all at close): the thread rolls it back, and [`Session::must_end`] tells the
//! registry, which answers it as expired (ADR 0042).
//!
//! Runs on its own engine thread; knows nothing about HTTP, tokens or the registry (see
//! `crate::transactions`).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, oneshot};

use crate::config::Limits;
use crate::engine::interactive::{CommitError, Interactive, Record, StepError, TxOptions, fenced};
use crate::engine::sqlite::connection::{Conn, Role, Target};
use crate::engine::sqlite::control::{Hooks, JobControl};
use crate::engine::sqlite::errors::map_engine_error;
use crate::engine::sqlite::exec::{self, Ran};
use crate::engine::sqlite::sessions::{Ended, Enlisted, Sessions, Watched};
use crate::engine::sqlite::{keyed, transaction};
use crate::engine::{Access, shutting_down};
use crate::protocol::error::{ApiError, ErrorCode};
use crate::protocol::request::SqlRequest;

/// Stack size of a transaction's thread, as the engine's other threads (SQLite recurses).
const STACK_BYTES: usize = 16 * 1024 * 1024;

/// Each statement's savepoint: a client cannot name it (savepoints are transaction control,
/// refused by the sandbox).
const STEP: &str = "_sqlhttp_step";

/// What the session's thread is asked to do.
enum Command {
    /// A statement, with the permit it runs under (kept until it ends, given up or not).
    Step(
        SqlRequest,
        oneshot::Sender<Result<Vec<u8>, StepError>>,
        OwnedSemaphorePermit,
    ),
    Commit(Option<Record>, oneshot::Sender<Result<(), CommitError>>),
    Rollback(oneshot::Sender<()>),
    /// Look at whether the engine ended the transaction, or the session was dropped: roll back
    /// and end unless a commit or a rollback came first.
    End,
}

/// One open SQLite transaction on its own connection and thread. Dropped without a commit,
/// its thread rolls the transaction back and closes the connection.
#[derive(Debug)]
pub(crate) struct Session {
    commands: mpsc::Sender<Command>,
    watched: Arc<Watched>,
    sessions: Arc<Sessions>,
    statement_timeout: Duration,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Command::Step(..) => "Step",
            Command::Commit(..) => "Commit",
            Command::Rollback(_) => "Rollback",
            Command::End => "End",
        })
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // The thread may be waiting for a command: it rolls back now (after a commit or a
        // rollback it has ended, and this goes nowhere).
        let _ = self.commands.send(Command::End);
    }
}

impl Session {
    /// Opens a connection to `target` on a thread of its own and begins the transaction there:
    /// `BEGIN IMMEDIATE` (waiting at most the busy limit for the write lock, then `503`) for a
    /// write, a `BEGIN` and a first read (the snapshot) for a read-only one. The thread enlists
    /// in `sessions`, holding `writer` (the engine's write permit) for a write transaction.
    pub(crate) async fn open(
        target: &Target,
        limits: Limits,
        sessions: &Arc<Sessions>,
        options: TxOptions,
        writer: Option<OwnedSemaphorePermit>,
    ) -> Result<Session, ApiError> {
        let access = options.access();
        let (commands, receiver) = mpsc::channel::<Command>();
        let (opened, begun) = oneshot::channel::<Result<Arc<Watched>, ApiError>>();
        let target = target.clone();
        let thread_sessions = Arc::clone(sessions);
        let wake = commands.clone();
        std::thread::Builder::new()
            .name("sqlhttpd-transaction".to_owned())
            .stack_size(STACK_BYTES)
            .spawn(move || {
                let hooks = Arc::new(Hooks::new(thread_sessions.closing_flag()));
                let role = match access {
                    Access::ReadOnly => Role::Reader,
                    Access::ReadWrite => Role::Writer,
                };
                let conn = match open_conn(&target, role, limits, hooks, access) {
                    Ok(conn) => conn,
                    Err(err) => {
                        let _ = opened.send(Err(err));
                        return;
                    }
                };
                let wake = Mutex::new(wake);
                let mut enlisted = thread_sessions.enlist(
                    access,
                    conn.conn.get_interrupt_handle(),
                    Box::new(move || {
                        let _ = wake
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .send(Command::End);
                    }),
                    writer,
                );
                if opened.send(Ok(Arc::clone(enlisted.watched()))).is_err() {
                    transaction::rollback(&conn.conn);
                    return;
                }
                serve(&conn, access, &receiver, &mut enlisted);
                // The connection closes before the write permit is released (`enlisted`).
                drop(conn);
                drop(enlisted);
            })
            .map_err(|e| {
                tracing::error!(error = %e, "cannot start a transaction's thread");
                ApiError::unavailable("the server cannot open a transaction now; retry later")
            })?;
        let watched = begun.await.map_err(|_| ApiError::internal())??;
        Ok(Session {
            commands,
            watched,
            sessions: Arc::clone(sessions),
            statement_timeout: limits.statement_timeout,
        })
    }

    /// Whether the engine ended the transaction (rolled back: see `sessions`): the registry
    /// answers it as expired.
    pub(crate) fn must_end(&self) -> bool {
        self.watched.ended().is_some()
    }

    /// The answer for a request to a transaction the engine ended, or whose thread is gone.
    fn gone(&self) -> ApiError {
        match self.watched.ended() {
            Some(why) => ended(why),
            None => lost(),
        }
    }

    /// Runs one statement in the transaction, once one of the engine's statement permits for
    /// transactions is free (at most the statement timeout, else `503`, not run).
    pub(crate) async fn step(&mut self, request: SqlRequest) -> Result<Vec<u8>, StepError> {
        let permit = tokio::time::timeout(
            self.statement_timeout,
            Arc::clone(self.sessions.statements()).acquire_owned(),
        )
        .await;
        let permit = match permit {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => return Err(StepError::Aborted(shutting_down())),
            Err(_) => {
                return Err(StepError::Statement(ApiError::unavailable(
                    "the server is busy: as many statements of transactions run as it allows \
                     (some may be statements that did not stop in time); this one was not run, \
                     retry later",
                )));
            }
        };
        if self.must_end() {
            return Err(StepError::Aborted(self.gone()));
        }
        let (reply, answer) = oneshot::channel();
        if self
            .commands
            .send(Command::Step(request, reply, permit))
            .is_err()
        {
            return Err(StepError::Aborted(self.gone()));
        }
        match answer.await {
            Ok(ran) => ran,
            Err(_) => Err(StepError::Aborted(self.gone())),
        }
    }

    /// Commits, with `record` stored in the same transaction.
    pub(crate) async fn commit(self, record: Option<Record>) -> Result<(), CommitError> {
        let (reply, answer) = oneshot::channel();
        if self.must_end() || self.commands.send(Command::Commit(record, reply)).is_err() {
            return Err(CommitError::RolledBack(self.gone()));
        }
        // The thread answers once it has committed or rolled back; a thread that is gone
        // without an answer had not committed (its connection rolled back as it closed).
        match answer.await {
            Ok(committed) => committed,
            Err(_) => Err(CommitError::RolledBack(self.gone())),
        }
    }

    /// Rolls back and closes the session.
    pub(crate) async fn rollback(self) {
        let (reply, answer) = oneshot::channel();
        if self.commands.send(Command::Rollback(reply)).is_ok() {
            let _ = answer.await;
        }
    }
}

/// The answer for a transaction the engine ended.
fn ended(why: Ended) -> ApiError {
    match why {
        Ended::Closing => shutting_down(),
        Ended::WriteIdle => ApiError::new(
            ErrorCode::TransactionExpired,
            "the transaction held the database's one write lock without running a statement \
             for longer than this server allows (--transaction-write-idle), and was rolled \
             back; nothing of it was committed",
        ),
        Ended::Wal => ApiError::new(
            ErrorCode::TransactionExpired,
            "the read-only transaction's snapshot kept the write-ahead log from being \
             truncated past its bound, and was ended; nothing of it was committed",
        ),
        Ended::WalFull => ApiError::new(
            ErrorCode::TransactionExpired,
            "the database's write-ahead log passed its hard bound while this write transaction \
             held the write lock (no checkpoint can truncate the log meanwhile), so it was \
             rolled back; nothing of it was committed",
        ),
    }
}

/// The answer for a step the watchdog gave up (its statement did not stop in time): the
/// transaction is rolled back with it.
fn given_up(stopped: ApiError) -> ApiError {
    if stopped.code == ErrorCode::Unavailable {
        return stopped;
    }
    ApiError::new(
        ErrorCode::TransactionAborted,
        format!(
            "{} It did not stop in time, so the transaction was rolled back and nothing of it \
             was committed.",
            stopped.message
        ),
    )
}

/// The answer for a transaction whose thread is gone (a panic, the engine closing).
fn lost() -> ApiError {
    ApiError::new(
        ErrorCode::TransactionAborted,
        "the transaction's connection was lost; it was rolled back and nothing of it was \
         committed",
    )
}

fn open_conn(
    target: &Target,
    role: Role,
    limits: Limits,
    hooks: Arc<Hooks>,
    access: Access,
) -> Result<Conn, ApiError> {
    let conn = Conn::open(target, role, limits, hooks).map_err(map_engine_error)?;
    if role == Role::Writer {
        conn.conn
            .execute_batch(exec::ROWID_PROBE_DDL)
            .map_err(map_engine_error)?;
    }
    transaction::begin(&conn.conn, access).map_err(|err| {
        if err.code == ErrorCode::Unavailable {
            ApiError::unavailable(
                "the database is busy: another transaction holds the write lock; retry later",
            )
        } else {
            err
        }
    })?;
    if access == Access::ReadOnly {
        // The snapshot is taken now, not at the first statement.
        transaction::within(&conn.conn, || {
            conn.conn
                .query_row("SELECT count(*) FROM main.sqlite_schema", [], |row| {
                    row.get::<_, i64>(0)
                })
                .map(drop)
        })?;
    }
    Ok(conn)
}

/// The thread's loop: one command at a time until the transaction ends, the engine ends it,
/// or the session is dropped (then it rolls back).
fn serve(conn: &Conn, access: Access, commands: &mpsc::Receiver<Command>, enlisted: &mut Enlisted) {
    let watched = Arc::clone(enlisted.watched());
    while let Ok(command) = commands.recv() {
        if watched.ended().is_some() {
            // The engine ended the transaction before this command ran: it answers nothing
            // (its sender, dropped, tells the requester why through the session).
            break;
        }
        match command {
            // The log past its hard bound: a write transaction's statement does not run, and
            // the transaction ends (its requester is answered expired through the session).
            Command::Step(..) if access == Access::ReadWrite && enlisted.wal_full() => break,
            Command::Step(request, reply, _permit) => {
                let reply = Arc::new(Mutex::new(Some(reply)));
                let given_up_reply = Arc::clone(&reply);
                let answer = Box::new(move |err: ApiError| {
                    if let Some(reply) = take(&given_up_reply) {
                        let _ = reply.send(Err(StepError::Aborted(given_up(err))));
                    }
                });
                let Some(ran) =
                    guarded(conn, &watched, answer, |conn| step(conn, &request, access))
                else {
                    enlisted.given_up();
                    break;
                };
                let ended = matches!(ran, Err(StepError::Aborted(_)));
                if let Some(reply) = take(&reply) {
                    let _ = reply.send(ran);
                }
                if ended {
                    break;
                }
            }
            Command::Commit(record, reply) => {
                watched.busy();
                let reply = Arc::new(Mutex::new(Some(reply)));
                let given_up_reply = Arc::clone(&reply);
                let answer = Box::new(move |err: ApiError| {
                    if let Some(reply) = take(&given_up_reply) {
                        let _ = reply.send(Err(CommitError::RolledBack(given_up(err))));
                    }
                });
                match guarded(conn, &watched, answer, |conn| commit(conn, record.as_ref())) {
                    Some(committed) => {
                        if let Some(reply) = take(&reply) {
                            let _ = reply.send(committed);
                        }
                    }
                    None => enlisted.given_up(),
                }
                break;
            }
            Command::Rollback(reply) => {
                watched.busy();
                transaction::rollback(&conn.conn);
                let _ = reply.send(());
                return;
            }
            Command::End => break,
        }
    }
    transaction::rollback(&conn.conn);
}

/// Takes a reply shared by the thread and the watchdog: whoever takes it answers.
fn take<T>(reply: &Mutex<Option<T>>) -> Option<T> {
    reply.lock().unwrap_or_else(PoisonError::into_inner).take()
}

/// Runs `work` as one job of the connection (its statement timeout, the engine's close), a
/// panic contained to it, published to the watchdog (`answer` answers its requester if it is
/// given up). `None` if it was given up: the requester has had its answer, and the
/// transaction must roll back and end.
fn guarded<T, E: From<ApiError>>(
    conn: &Conn,
    watched: &Watched,
    answer: crate::engine::sqlite::worker::Answer,
    work: impl FnOnce(&Conn) -> Result<T, E>,
) -> Option<Result<T, E>> {
    let job = Arc::new(JobControl::default());
    job.start(conn.limits.statement_timeout);
    conn.hooks.begin_job(Arc::clone(&job));
    watched.start(Arc::clone(&job), answer);
    let outcome = match catch_unwind(AssertUnwindSafe(|| work(conn))) {
        Ok(outcome) => outcome,
        Err(panic) => {
            tracing::error!(
                panic = crate::panic_message(panic.as_ref()),
                "panic in a transaction's engine code"
            );
            Err(E::from(ApiError::internal()))
        }
    };
    let answered = job.finish();
    conn.hooks.end_job();
    let mine = watched.stop();
    (answered && mine).then_some(outcome)
}

/// The engine contract's calls, answered by the inherent ones above (SQLite learns no log
/// position: its commit answers none).
impl Interactive for Session {
    fn must_end(&self) -> bool {
        Session::must_end(self)
    }

    async fn step(&mut self, request: SqlRequest) -> Result<Vec<u8>, StepError> {
        Session::step(self, request).await
    }

    async fn commit(
        self,
        record: Option<Record>,
    ) -> Result<Option<crate::protocol::bookmark::Bookmark>, CommitError> {
        Session::commit(self, record).await.map(|()| None)
    }

    async fn rollback(self) {
        Session::rollback(self).await;
    }
}

impl From<ApiError> for StepError {
    fn from(err: ApiError) -> StepError {
        StepError::Aborted(err)
    }
}

impl From<ApiError> for CommitError {
    fn from(err: ApiError) -> CommitError {
        CommitError::RolledBack(err)
    }
}

/// One statement inside its savepoint: kept on success, undone on failure (the transaction
/// goes on), or the transaction aborted when the statement ended it or the engine stops.
fn step(conn: &Conn, request: &SqlRequest, access: Access) -> Result<Vec<u8>, StepError> {
    let db = &conn.conn;
    if db.is_autocommit() {
        return Err(StepError::Aborted(lost()));
    }
    db.execute_batch(&format!("SAVEPOINT {STEP}"))
        .map_err(|e| StepError::Aborted(map_engine_error(e)))?;
    let ran = exec::execute(conn, request, access).and_then(|ran| match ran {
        Ran::Done(body) => Ok(body),
        Ran::NeedsWriter => Err(ApiError::new(
            ErrorCode::ReadOnly,
            "this transaction is read-only and the statement may write; nothing was written",
        )),
    });
    if db.is_autocommit() {
        // The statement's own conflict resolution (`OR ROLLBACK`) ended the transaction.
        let why = match ran {
            Err(err) => err.message,
            Ok(_) => "a statement ended the transaction".to_owned(),
        };
        return Err(StepError::Aborted(ApiError::new(
            ErrorCode::TransactionAborted,
            format!("the transaction was rolled back and nothing of it was committed: {why}"),
        )));
    }
    match ran {
        Ok(body) => {
            db.execute_batch(&format!("RELEASE {STEP}"))
                .map_err(|e| StepError::Aborted(map_engine_error(e)))?;
            Ok(body)
        }
        Err(err) => {
            db.execute_batch(&format!("ROLLBACK TO {STEP}; RELEASE {STEP}"))
                .map_err(|e| StepError::Aborted(map_engine_error(e)))?;
            let err = if err.interrupted {
                match conn.hooks.interrupted_error() {
                    // The engine is closing: the transaction goes with it.
                    stopped if stopped.code == ErrorCode::Unavailable => {
                        return Err(StepError::Aborted(shutting_down()));
                    }
                    stopped => stopped,
                }
            } else {
                err
            };
            Err(StepError::Statement(err))
        }
    }
}

/// Stores `record` and commits; any failure rolls back.
fn commit(conn: &Conn, record: Option<&Record>) -> Result<(), CommitError> {
    let db = &conn.conn;
    if db.is_autocommit() {
        return Err(CommitError::RolledBack(lost()));
    }
    if let Some(record) = record {
        let claimed = transaction::within(db, || {
            keyed::claim(db, &record.key, &record.request_hash, 200, &record.body)
        })?;
        // Another server answered for this transaction first ("nothing committed") and left
        // its tombstone under the key: it must stay true.
        if claimed.request_hash != record.request_hash {
            transaction::rollback(db);
            return Err(CommitError::RolledBack(fenced()));
        }
    }
    transaction::commit(db).map_err(CommitError::RolledBack)
}
