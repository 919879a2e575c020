//! The engine: one SQLite connection owned by a dedicated thread, fed jobs through a channel,
//! so blocking engine work never runs on the async runtime's worker threads and every request
//! of the process sees the same database.
//!
//! [`Engine`] is the async-side handle: `run` a job, `close` the connection. Panics in engine
//! code are caught per job and become `500 INTERNAL`. This module knows nothing about HTTP.

mod errors;
mod exec;
mod idempotency;
mod session;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, PoisonError, mpsc};
use std::time::Duration;

use rusqlite::InterruptHandle;
use tokio::sync::oneshot;

use crate::api_error::ApiError;
use crate::config::Database;
use crate::error::ServerError;
use crate::request::SqlRequest;

pub(crate) use session::Session;

/// What a statement produced: a status and JSON body, fresh or replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
    pub(crate) replayed: bool,
}

type Job = Box<dyn FnOnce(&mut Session) + Send>;

enum Command {
    Run(Job),
    Close,
}

/// Handle to the engine thread.
pub(crate) struct Engine {
    commands: mpsc::Sender<Command>,
    interrupt: InterruptHandle,
    exited: Mutex<Option<oneshot::Receiver<()>>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").finish_non_exhaustive()
    }
}

/// How often `close` interrupts a statement that keeps the engine thread from exiting.
const INTERRUPT_EVERY: Duration = Duration::from_millis(25);

fn shutting_down() -> ApiError {
    ApiError::unavailable("the server is shutting down")
}

impl Engine {
    /// Opens the database on the calling thread, then hands it to a new engine thread.
    pub(crate) fn start(
        database: &Database,
        idempotency_ttl: Option<Duration>,
    ) -> Result<Engine, ServerError> {
        let session = Session::open(database, idempotency_ttl)
            .map_err(|e| ServerError::open_database(database, e))?;
        let interrupt = session.conn.get_interrupt_handle();
        let (commands, inbox) = mpsc::channel();
        let (exited_tx, exited_rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("sqlhttpd-engine".to_owned())
            .spawn(move || engine_main(session, inbox, exited_tx))
            .map_err(ServerError::EngineThread)?;
        Ok(Engine {
            commands,
            interrupt,
            exited: Mutex::new(Some(exited_rx)),
        })
    }

    /// Runs `job` on the engine thread and waits for its result. A panic in `job` becomes
    /// `500 INTERNAL` (and a transaction it opened is rolled back); a closed engine answers
    /// `503 UNAVAILABLE`.
    pub(crate) async fn run<T, F>(&self, job: F) -> Result<T, ApiError>
    where
        F: FnOnce(&mut Session) -> Result<T, ApiError> + Send + 'static,
        T: Send + 'static,
    {
        let (reply, result) = oneshot::channel();
        let wrapped: Job = Box::new(move |session: &mut Session| {
            let was_autocommit = session.conn.is_autocommit();
            let outcome = match catch_unwind(AssertUnwindSafe(|| job(session))) {
                Ok(outcome) => outcome,
                Err(panic) => {
                    tracing::error!(
                        panic = crate::panic_message(panic.as_ref()),
                        "panic in engine code"
                    );
                    session.recover_after_panic(was_autocommit);
                    Err(ApiError::internal())
                }
            };
            // The requester may have gone away; the work is done either way.
            let _ = reply.send(outcome);
        });
        self.commands
            .send(Command::Run(wrapped))
            .map_err(|_| shutting_down())?;
        result.await.map_err(|_| shutting_down())?
    }

    /// Runs one request without an Idempotency-Key.
    pub(crate) async fn execute(&self, request: SqlRequest) -> Result<Outcome, ApiError> {
        self.run(move |session| {
            exec::execute(&session.conn, &request).map(|body| Outcome {
                status: 200,
                body,
                replayed: false,
            })
        })
        .await
    }

    /// Runs one keyed request exactly once (see `idempotency`). `guard` is held until the
    /// engine is done with the key, whether or not the requester still waits.
    pub(crate) async fn execute_with_key<G: Send + 'static>(
        &self,
        ttl: Duration,
        key: String,
        request_hash: [u8; 32],
        request: SqlRequest,
        guard: G,
    ) -> Result<Outcome, ApiError> {
        self.run(move |session| {
            let _guard = guard;
            idempotency::execute_with_key(session, ttl, &key, &request_hash, &request)
        })
        .await
    }

    /// Closes the connection: queued jobs run first, a statement still running is interrupted,
    /// and this returns once the connection has been dropped. Later jobs answer 503.
    pub(crate) async fn close(&self) {
        let exited = self
            .exited
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(mut exited) = exited else {
            return;
        };
        let _ = self.commands.send(Command::Close);
        loop {
            match tokio::time::timeout(INTERRUPT_EVERY, &mut exited).await {
                Ok(_) => return,
                Err(_) => self.interrupt.interrupt(),
            }
        }
    }
}

fn engine_main(mut session: Session, inbox: mpsc::Receiver<Command>, exited: oneshot::Sender<()>) {
    while let Ok(Command::Run(job)) = inbox.recv() {
        // `run` catches panics inside the job; this is the last line of defence.
        if catch_unwind(AssertUnwindSafe(|| job(&mut session))).is_err() {
            tracing::error!("panic escaped an engine job");
        }
    }
    drop(session);
    let _ = exited.send(());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api_error::ErrorCode;

    fn engine() -> Engine {
        Engine::start(&Database::Memory, None).unwrap()
    }

    fn select(sql: &str) -> SqlRequest {
        SqlRequest {
            sql: sql.into(),
            params: vec![],
        }
    }

    #[tokio::test]
    async fn a_panicking_job_is_a_500_and_the_engine_lives_on() {
        let engine = engine();
        let err = engine
            .run(|session| -> Result<(), ApiError> {
                session.conn.execute_batch("BEGIN").unwrap();
                panic!("boom")
            })
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Internal);
        assert_eq!(err.message, crate::api_error::INTERNAL_MESSAGE);
        let autocommit = engine
            .run(|session| Ok(session.conn.is_autocommit()))
            .await
            .unwrap();
        assert!(
            autocommit,
            "the panicking job's transaction was rolled back"
        );
        let ok = engine.execute(select("SELECT 1")).await.unwrap();
        assert_eq!(ok.status, 200);
    }

    #[tokio::test]
    async fn close_interrupts_a_running_statement_and_later_jobs_get_503() {
        let engine = engine();
        let endless = engine.execute(select(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
        ));
        let (endless, ()) = tokio::join!(endless, async {
            tokio::task::yield_now().await;
            engine.close().await;
        });
        assert_eq!(endless.unwrap_err().code, ErrorCode::Unavailable);
        let after = engine.execute(select("SELECT 1")).await.unwrap_err();
        assert_eq!(after.code, ErrorCode::Unavailable);
    }
}
