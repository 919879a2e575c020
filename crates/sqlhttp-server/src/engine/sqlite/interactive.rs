//! Interactive transactions on SQLite: a [`Session`] is one connection of its own, opened for
//! the transaction on a thread of its own, holding its transaction across requests. A write
//! transaction begins with `BEGIN IMMEDIATE`, so it holds SQLite's one write lock from its
//! open to its end: the engine's writer waits for it at most the busy limit
//! (`connection::BUSY_LIMIT`), then answers `503`; the next write transaction's open waits for
//! the engine's permit (which the session holds) instead. A read-only transaction is a
//! reader's `BEGIN` whose snapshot is taken at its open, and never takes the write lock.
//!
//! Each statement runs through `exec::execute` (the sandbox, the result limit, the statement
//! timeout of a job of its own) inside a savepoint, so a statement that fails leaves the
//! transaction as it was before it; one that ends the transaction (`OR ROLLBACK`) aborts it.
//! The commit stores the transaction's outcome record in `main._sqlhttp_idempotency` in the same
//! transaction (see `keyed`), so a crash leaves it committed and recorded, or neither.
//!
//! Runs on its own engine thread; knows nothing about HTTP, tokens or the registry (see
//! `engine::transactions`).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;

use tokio::sync::{OwnedSemaphorePermit, oneshot};

use crate::config::Limits;
use crate::engine::interactive::{CommitError, Record, StepError, TxOptions, fenced};
use crate::engine::sqlite::connection::{Conn, Role, Target};
use crate::engine::sqlite::control::{Hooks, JobControl};
use crate::engine::sqlite::errors::map_engine_error;
use crate::engine::sqlite::exec::{self, Ran};
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
    Step(SqlRequest, oneshot::Sender<Result<Vec<u8>, StepError>>),
    Commit(Option<Record>, oneshot::Sender<Result<(), CommitError>>),
    Rollback(oneshot::Sender<()>),
}

/// One open SQLite transaction on its own connection and thread. Dropped without a commit,
/// its thread rolls the transaction back and closes the connection.
#[derive(Debug)]
pub(crate) struct Session {
    commands: mpsc::Sender<Command>,
    /// The engine's one interactive write transaction, for a write transaction.
    _writer: Option<OwnedSemaphorePermit>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Command::Step(..) => "Step",
            Command::Commit(..) => "Commit",
            Command::Rollback(_) => "Rollback",
        })
    }
}

impl Session {
    /// Opens a connection to `target` on a thread of its own and begins the transaction there:
    /// `BEGIN IMMEDIATE` (waiting at most the busy limit for the write lock, then `503`) for a
    /// write, a `BEGIN` and a first read (the snapshot) for a read-only one.
    pub(crate) async fn open(
        target: &Target,
        limits: Limits,
        closing: Arc<AtomicBool>,
        options: TxOptions,
        writer: Option<OwnedSemaphorePermit>,
    ) -> Result<Session, ApiError> {
        let access = options.access();
        let (commands, receiver) = mpsc::channel::<Command>();
        let (opened, begun) = oneshot::channel::<Result<(), ApiError>>();
        let target = target.clone();
        std::thread::Builder::new()
            .name("sqlhttpd-transaction".to_owned())
            .stack_size(STACK_BYTES)
            .spawn(move || {
                let hooks = Arc::new(Hooks::new(closing));
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
                if opened.send(Ok(())).is_err() {
                    transaction::rollback(&conn.conn);
                    return;
                }
                serve(&conn, access, &receiver);
            })
            .map_err(|e| {
                tracing::error!(error = %e, "cannot start a transaction's thread");
                ApiError::unavailable("the server cannot open a transaction now; retry later")
            })?;
        begun.await.map_err(|_| ApiError::internal())??;
        Ok(Session {
            commands,
            _writer: writer,
        })
    }

    /// Runs one statement in the transaction.
    pub(crate) async fn step(&mut self, request: SqlRequest) -> Result<Vec<u8>, StepError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Step(request, reply))
            .map_err(|_| StepError::Aborted(lost()))?;
        answer.await.map_err(|_| StepError::Aborted(lost()))?
    }

    /// Commits, with `record` stored in the same transaction.
    pub(crate) async fn commit(self, record: Option<Record>) -> Result<(), CommitError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Commit(record, reply))
            .map_err(|_| CommitError::RolledBack(lost()))?;
        // The thread answers once it has committed or rolled back; a thread that is gone
        // without an answer had not committed (its connection rolled back as it closed).
        answer.await.map_err(|_| CommitError::RolledBack(lost()))?
    }

    /// Rolls back and closes the session.
    pub(crate) async fn rollback(self) {
        let (reply, answer) = oneshot::channel();
        if self.commands.send(Command::Rollback(reply)).is_ok() {
            let _ = answer.await;
        }
    }
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

/// The thread's loop: one command at a time until the transaction ends or the session is
/// dropped (then it rolls back).
fn serve(conn: &Conn, access: Access, commands: &mpsc::Receiver<Command>) {
    while let Ok(command) = commands.recv() {
        match command {
            Command::Step(request, reply) => {
                let ran = guarded(conn, |conn| step(conn, &request, access));
                let ended = matches!(ran, Err(StepError::Aborted(_)));
                let _ = reply.send(ran);
                if ended {
                    transaction::rollback(&conn.conn);
                    return;
                }
            }
            Command::Commit(record, reply) => {
                let committed = guarded(conn, |conn| commit(conn, record.as_ref()));
                let _ = reply.send(committed);
                return;
            }
            Command::Rollback(reply) => {
                transaction::rollback(&conn.conn);
                let _ = reply.send(());
                return;
            }
        }
    }
    transaction::rollback(&conn.conn);
}

/// Runs `work` as one job of the connection (its statement timeout, the engine's close), a
/// panic contained to it.
fn guarded<T, E: From<ApiError>>(
    conn: &Conn,
    work: impl FnOnce(&Conn) -> Result<T, E>,
) -> Result<T, E> {
    let job = Arc::new(JobControl::default());
    job.start(conn.limits.statement_timeout);
    conn.hooks.begin_job(Arc::clone(&job));
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
    job.finish();
    conn.hooks.end_job();
    outcome
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
