//! [`Pool`]: connections each owned by a dedicated thread, fed from one bounded queue.
//!
//! Threads get a large stack (SQLite's parser and expression walkers recurse), a job that
//! panics is contained to its own request, a job whose requester went away is skipped, and a
//! full queue is refused at once (`503`) instead of growing without end. Each pool counts the
//! jobs waiting in its queue, for the metrics. Knows threads and channels; nothing about SQL or
//! HTTP.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};

use rusqlite::InterruptHandle;
use tokio::sync::oneshot;

use crate::api_error::ApiError;
use crate::engine::connection::Conn;
use crate::engine::control::JobControl;

/// Stack size of an engine thread: ample for SQLite's deepest recursion within its limits.
const ENGINE_STACK_BYTES: usize = 16 * 1024 * 1024;

/// A unit of work for one connection.
pub(crate) type Task = Box<dyn FnOnce(&mut Conn) + Send>;

/// Connections on their threads, sharing one bounded queue.
pub(crate) struct Pool {
    name: &'static str,
    queue: Mutex<Option<SyncSender<Task>>>,
    interrupts: Vec<InterruptHandle>,
    exits: Mutex<Vec<oneshot::Receiver<()>>>,
    /// Jobs in the queue, not yet taken by a connection.
    waiting: Arc<AtomicUsize>,
}

/// Counts one job as waiting until it is taken off the queue (or dropped unrun).
struct Waiting(Arc<AtomicUsize>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("name", &self.name)
            .field("connections", &self.interrupts.len())
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// Starts one thread per connection.
    pub(crate) fn start(
        name: &'static str,
        connections: Vec<Conn>,
        queue_depth: usize,
    ) -> std::io::Result<Pool> {
        let (sender, receiver) = mpsc::sync_channel::<Task>(queue_depth);
        let receiver = Arc::new(Mutex::new(receiver));
        let mut interrupts = Vec::with_capacity(connections.len());
        let mut exits = Vec::with_capacity(connections.len());
        for (index, conn) in connections.into_iter().enumerate() {
            interrupts.push(conn.conn.get_interrupt_handle());
            let (exited, exit) = oneshot::channel();
            exits.push(exit);
            let receiver = Arc::clone(&receiver);
            std::thread::Builder::new()
                .name(format!("sqlhttpd-{name}-{index}"))
                .stack_size(ENGINE_STACK_BYTES)
                .spawn(move || worker_main(conn, &receiver, exited))?;
        }
        Ok(Pool {
            name,
            queue: Mutex::new(Some(sender)),
            interrupts,
            exits: Mutex::new(exits),
            waiting: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The pool's name (`writer`, `reader`).
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// Jobs waiting in the queue for a connection now.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Runs `job` on one of the pool's connections under `control` and waits for its result.
    /// A panic becomes `500 INTERNAL`; an interrupted statement becomes the error for why it
    /// was stopped; a full queue or a closed pool answers `503 UNAVAILABLE` at once.
    pub(crate) async fn run<T, F>(&self, control: &Arc<JobControl>, job: F) -> Result<T, ApiError>
    where
        F: FnOnce(&mut Conn) -> Result<T, ApiError> + Send + 'static,
        T: Send + 'static,
    {
        self.start_job(control, job)?.await
    }

    /// Queues `job` as [`Pool::run`] does and returns at once; the future answers its result.
    pub(crate) fn start_job<T, F>(
        &self,
        control: &Arc<JobControl>,
        job: F,
    ) -> Result<impl Future<Output = Result<T, ApiError>> + Send + 'static, ApiError>
    where
        F: FnOnce(&mut Conn) -> Result<T, ApiError> + Send + 'static,
        T: Send + 'static,
    {
        let (reply, result) = oneshot::channel();
        let job_control = Arc::clone(control);
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let waiting = Waiting(Arc::clone(&self.waiting));
        let task: Task = Box::new(move |conn: &mut Conn| {
            drop(waiting);
            if job_control.is_cancelled() {
                return;
            }
            job_control.start(conn.limits.statement_timeout);
            conn.hooks.begin_job(Arc::clone(&job_control));
            let outcome = match catch_unwind(AssertUnwindSafe(|| job(conn))) {
                Ok(Err(err)) if err.interrupted => {
                    let stopped = job_control.interrupted_error();
                    // A batch says which of its statements was stopped.
                    Err(match err.statement {
                        Some(index) => stopped.at_statement(index),
                        None => stopped,
                    })
                }
                Ok(outcome) => outcome,
                Err(panic) => {
                    tracing::error!(
                        panic = crate::panic_message(panic.as_ref()),
                        "panic in engine code"
                    );
                    Err(ApiError::internal())
                }
            };
            conn.hooks.end_job();
            conn.end_stray_transaction();
            // The requester may have gone away; the work is done either way.
            let _ = reply.send(outcome);
            conn.bound_wal();
        });
        self.submit(task)?;
        Ok(async move { result.await.map_err(|_| shutting_down())? })
    }

    fn submit(&self, task: Task) -> Result<(), ApiError> {
        let queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(queue) = queue.as_ref() else {
            return Err(shutting_down());
        };
        match queue.try_send(task) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(ApiError::unavailable(format!(
                "the server is busy: {} statements are already waiting for the {} connections; \
                 retry later",
                self.name, self.name
            ))),
            Err(TrySendError::Disconnected(_)) => Err(shutting_down()),
        }
    }

    /// Stops taking work: queued tasks still drain (their statements are interrupted at once
    /// when the engine is closing), then each thread drops its connection.
    pub(crate) fn close_queue(&self) {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }

    /// Interrupts whatever statement runs on each connection now.
    pub(crate) fn interrupt_all(&self) {
        for handle in &self.interrupts {
            handle.interrupt();
        }
    }

    /// The exit signals of the pool's threads (taken once).
    pub(crate) fn take_exits(&self) -> Vec<oneshot::Receiver<()>> {
        std::mem::take(&mut *self.exits.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

pub(crate) fn shutting_down() -> ApiError {
    ApiError::unavailable("the server is shutting down")
}

fn worker_main(mut conn: Conn, queue: &Mutex<Receiver<Task>>, exited: oneshot::Sender<()>) {
    loop {
        let task = queue.lock().unwrap_or_else(PoisonError::into_inner).recv();
        let Ok(task) = task else { break };
        // `run` catches panics inside the job; this is the last line of defence.
        if catch_unwind(AssertUnwindSafe(|| task(&mut conn))).is_err() {
            tracing::error!("panic escaped an engine task");
            conn.hooks.end_job();
            conn.end_stray_transaction();
        }
    }
    drop(conn);
    let _ = exited.send(());
}
