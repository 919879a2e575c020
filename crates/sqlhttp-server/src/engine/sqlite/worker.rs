//! [`Pool`]: connections each owned by a dedicated thread, fed from one bounded queue, and the
//! give-up of a connection whose statement does not stop (ADR 0032).
//!
//! Threads get a large stack (SQLite's parser and expression walkers recurse), a job that
//! panics is contained to its own request, a job whose requester went away is skipped, and a
//! full queue is refused at once (`503`) instead of growing without end. Each pool counts the
//! jobs waiting in its queue, for the metrics.
//!
//! SQLite asks its progress handler only when the virtual machine jumps, so one stretch of
//! straight-line work (a hundred JSON calls in one row, a long FTS phrase) runs past every clock.
//! [`Pool::watch`] (called by the engine's watchdog) gives such a job up once it has had to stop
//! (its deadline, its requester's cancellation, the engine's close) for the pool's margin: its
//! requester is answered at once, the connection leaves the pool, and a fresh one takes its
//! place while fewer than [`Strays`]' cap of given-up threads are still running; the given-up
//! thread finishes its statement on its own, never commits (the commit hook asks
//! `JobControl::claim_commit`), closes its connection and ends. Knows threads, channels and the
//! job's fate; nothing about SQL or HTTP.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rusqlite::InterruptHandle;
use tokio::sync::oneshot;

use crate::engine::shutting_down;
use crate::engine::sqlite::connection::Conn;
use crate::engine::sqlite::control::JobControl;
use crate::protocol::error::ApiError;
use crate::timing::Carried;

/// Stack size of an engine thread: ample for SQLite's deepest recursion within its limits.
const ENGINE_STACK_BYTES: usize = 16 * 1024 * 1024;

/// How long after a failed attempt to open a replacement connection the next one is made.
const REOPEN_AFTER: Duration = Duration::from_secs(1);

/// Opens a fresh connection for a pool (to replace a given-up one).
pub(crate) type Opener = Arc<dyn Fn() -> rusqlite::Result<Conn> + Send + Sync>;

/// Answers a job's requester with an error: the job was given up, or refused unrun.
pub(crate) type Answer = Box<dyn FnOnce(ApiError) + Send>;

/// A unit of work for one connection, with what to answer if it is given up or never runs.
pub(crate) struct Task {
    control: Arc<JobControl>,
    run: Box<dyn FnOnce(&mut Conn) + Send>,
    answer: Answer,
    waiting: Waiting,
}

/// Given-up connections whose threads still run, across the engine's pools, and their cap.
#[derive(Debug)]
pub(crate) struct Strays {
    alive: AtomicUsize,
    total: AtomicU64,
    cap: usize,
}

impl Strays {
    /// No stray yet; a given-up connection is replaced while at most `cap` strays run.
    pub(crate) fn new(cap: usize) -> Strays {
        Strays {
            alive: AtomicUsize::new(0),
            total: AtomicU64::new(0),
            cap,
        }
    }

    /// Given-up threads still running now.
    pub(crate) fn alive(&self) -> usize {
        self.alive.load(Ordering::Acquire)
    }

    /// Connections given up since the engine started.
    pub(crate) fn total(&self) -> u64 {
        self.total.load(Ordering::Acquire)
    }

    /// Counts `count` connections given up now, whose threads still run (outside a pool: an
    /// interactive transaction's; see `sessions`).
    pub(crate) fn given_up(&self, count: usize) {
        self.alive.fetch_add(count, Ordering::AcqRel);
        self.total
            .fetch_add(u64::try_from(count).unwrap_or(u64::MAX), Ordering::AcqRel);
    }

    /// A given-up connection's thread has ended.
    pub(crate) fn ended(&self) {
        self.alive.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One connection's place in the pool, shared by its thread and the watchdog.
struct Slot {
    interrupt: Mutex<InterruptHandle>,
    running: Mutex<Option<Running>>,
}

/// The job a connection runs now.
struct Running {
    control: Arc<JobControl>,
    answer: Answer,
}

/// The connections that take work.
#[derive(Default)]
struct Live {
    slots: Vec<Arc<Slot>>,
    /// Replacements being opened.
    opening: usize,
    /// Given-up connections not replaced yet (the stray cap, or an open that failed).
    missing: usize,
    /// No replacement is opened before this (an open failed).
    reopen_at: Option<Instant>,
}

/// What a pool's threads share with it.
struct Shared {
    name: &'static str,
    receiver: Mutex<Receiver<Task>>,
    live: Mutex<Live>,
    open: Opener,
    strays: Arc<Strays>,
    /// Threads started, for their names.
    started: AtomicUsize,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Connections on their threads, sharing one bounded queue.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    queue: Mutex<Option<SyncSender<Task>>>,
    /// Jobs in the queue, not yet taken by a connection.
    waiting: Arc<AtomicUsize>,
    /// How long a job may go on after it had to stop before its connection is given up.
    give_up_after: Duration,
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
            .field("name", &self.shared.name)
            .field("connections", &lock(&self.shared.live).slots.len())
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// Starts one thread per connection; `open` makes replacements for given-up connections,
    /// counted in `strays`, once a job has gone on for `give_up_after` past its time.
    pub(crate) fn start(
        name: &'static str,
        connections: Vec<Conn>,
        queue_depth: usize,
        open: Opener,
        strays: Arc<Strays>,
        give_up_after: Duration,
    ) -> std::io::Result<Pool> {
        let (sender, receiver) = mpsc::sync_channel::<Task>(queue_depth);
        let shared = Arc::new(Shared {
            name,
            receiver: Mutex::new(receiver),
            live: Mutex::new(Live::default()),
            open,
            strays,
            started: AtomicUsize::new(0),
        });
        for conn in connections {
            let slot = Shared::enlist(&shared, &conn);
            Shared::spawn(&shared, move |shared| worker_main(shared, &slot, conn))?;
        }
        Ok(Pool {
            shared,
            queue: Mutex::new(Some(sender)),
            waiting: Arc::new(AtomicUsize::new(0)),
            give_up_after,
        })
    }

    /// The pool's name (`writer`, `reader`).
    pub(crate) fn name(&self) -> &'static str {
        self.shared.name
    }

    /// Jobs waiting in the queue for a connection now.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Runs `job` on one of the pool's connections under `control` and waits for its result.
    /// A panic becomes `500 INTERNAL`; an interrupted statement becomes the error for why it
    /// was stopped; a full queue or a closed pool answers `503 UNAVAILABLE` at once; a job given
    /// up answers why it had to stop.
    pub(crate) async fn run<T, F>(&self, control: &Arc<JobControl>, job: F) -> Result<T, ApiError>
    where
        F: FnOnce(&mut Conn) -> Result<T, ApiError> + Send + 'static,
        T: Send + 'static,
    {
        self.start_job(control, job, |_| {})?.await
    }

    /// Queues `job` as [`Pool::run`] does and returns at once; the future answers its result.
    /// `on_give_up` runs (before the future answers) if the job is given up or refused unrun.
    pub(crate) fn start_job<T, F, G>(
        &self,
        control: &Arc<JobControl>,
        job: F,
        on_give_up: G,
    ) -> Result<impl Future<Output = Result<T, ApiError>> + Send + 'static + use<T, F, G>, ApiError>
    where
        F: FnOnce(&mut Conn) -> Result<T, ApiError> + Send + 'static,
        G: FnOnce(&ApiError) + Send + 'static,
        T: Send + 'static,
    {
        let (reply, result) = oneshot::channel::<Result<T, ApiError>>();
        // Whoever wins the job's fate answers: its worker, or the watchdog that gave it up.
        let reply = Arc::new(Mutex::new(Some(reply)));
        let given_up_reply = Arc::clone(&reply);
        let answer: Answer = Box::new(move |err: ApiError| {
            if let Some(reply) = lock(&given_up_reply).take() {
                on_give_up(&err);
                let _ = reply.send(Err(err));
            }
        });
        let job_control = Arc::clone(control);
        // The request's timing and span, to the worker's thread (`queue` until it starts).
        let carried = Carried::here(self.name());
        let pool = self.name();
        let run = Box::new(move |conn: &mut Conn| {
            let _running = carried.start(pool);
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
            let answered = job_control.finish();
            conn.hooks.end_job();
            conn.end_stray_transaction();
            if answered {
                // The requester may have gone away; the work is done either way.
                if let Some(reply) = lock(&reply).take() {
                    let _ = reply.send(outcome);
                }
                conn.bound_wal();
            }
        });
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let task = Task {
            control: Arc::clone(control),
            run,
            answer,
            waiting: Waiting(Arc::clone(&self.waiting)),
        };
        self.submit(task)?;
        Ok(async move { result.await.map_err(|_| shutting_down())? })
    }

    fn submit(&self, task: Task) -> Result<(), ApiError> {
        if self.shared.has_no_connection() {
            return Err(self.shared.no_connection());
        }
        let queue = lock(&self.queue);
        let Some(queue) = queue.as_ref() else {
            return Err(shutting_down());
        };
        match queue.try_send(task) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(ApiError::unavailable(format!(
                "the server is busy: {} statements are already waiting for the {} connections; \
                 retry later",
                self.name(),
                self.name()
            ))),
            Err(TrySendError::Disconnected(_)) => Err(shutting_down()),
        }
    }

    /// Stops taking work: queued tasks still drain (their statements are interrupted at once
    /// when the engine is closing), then each thread drops its connection.
    pub(crate) fn close_queue(&self) {
        lock(&self.queue).take();
    }

    /// Interrupts whatever statement runs on each connection of the pool now.
    pub(crate) fn interrupt_all(&self) {
        for slot in &lock(&self.shared.live).slots {
            lock(&slot.interrupt).interrupt();
        }
    }

    /// Whether every connection of the pool has closed or been given up (after
    /// [`Pool::close_queue`]).
    pub(crate) fn settled(&self) -> bool {
        let live = lock(&self.shared.live);
        live.slots.is_empty() && live.opening == 0
    }

    /// The watchdog's look at `now` (`closing_since`: when the engine began to close): gives up
    /// every job that has had to stop for the pool's margin and is still running (neither
    /// committed nor finished), answering its requester with why it had to stop; then, unless
    /// the engine is closing, replaces given-up connections while the stray cap allows, and
    /// refuses what waits in the queue when no connection is left to take it.
    pub(crate) fn watch(&self, now: Instant, closing_since: Option<Instant>) {
        let closing = closing_since.is_some();
        let mut given_up = Vec::new();
        {
            let mut live = lock(&self.shared.live);
            live.slots.retain(|slot| {
                let mut running = lock(&slot.running);
                let overdue = running.as_ref().is_some_and(|job| {
                    job.control.overdue(now, closing_since, self.give_up_after)
                        && job.control.give_up()
                });
                match running.take_if(|_| overdue) {
                    Some(job) => {
                        given_up.push((Arc::clone(slot), job));
                        false
                    }
                    None => true,
                }
            });
            live.missing += given_up.len();
            self.shared.strays.given_up(given_up.len());
        }
        for (slot, job) in given_up {
            // The statement stops at its next jump; the thread then rolls back and ends.
            lock(&slot.interrupt).interrupt();
            job.control.note_stop(closing);
            let err = job.control.interrupted_error();
            tracing::warn!(
                pool = self.name(),
                code = err.code.as_str(),
                margin_ms = u64::try_from(self.give_up_after.as_millis()).unwrap_or(u64::MAX),
                "a statement did not stop in time; its connection is given up and replaced"
            );
            (job.answer)(err);
        }
        if !closing {
            Shared::refill(&self.shared, now);
            self.refuse_queued();
        }
    }

    /// Answers every queued job `503` when no connection is left to run it (each is stuck, and
    /// the stray cap allows no replacement): they would wait for a stray to end.
    fn refuse_queued(&self) {
        if !self.shared.has_no_connection() {
            return;
        }
        // An idle connection holds the receiver while it waits; none is idle here.
        let Ok(receiver) = self.shared.receiver.try_lock() else {
            return;
        };
        let refused: Vec<Task> = receiver.try_iter().collect();
        drop(receiver);
        for task in refused {
            (task.answer)(self.shared.no_connection());
        }
    }
}

impl Shared {
    /// Adds `conn`'s slot to the connections that take work.
    fn enlist(shared: &Arc<Shared>, conn: &Conn) -> Arc<Slot> {
        let slot = Arc::new(Slot {
            interrupt: Mutex::new(conn.conn.get_interrupt_handle()),
            running: Mutex::new(None),
        });
        lock(&shared.live).slots.push(Arc::clone(&slot));
        slot
    }

    /// Starts a thread of the pool running `main`.
    fn spawn(
        shared: &Arc<Shared>,
        main: impl FnOnce(&Arc<Shared>) + Send + 'static,
    ) -> std::io::Result<()> {
        let index = shared.started.fetch_add(1, Ordering::Relaxed);
        let thread_shared = Arc::clone(shared);
        std::thread::Builder::new()
            .name(format!("sqlhttpd-{}-{index}", shared.name))
            .stack_size(ENGINE_STACK_BYTES)
            .spawn(move || main(&thread_shared))
            .map(drop)
    }

    /// Whether the pool has no connection to take work now, having given some up.
    fn has_no_connection(&self) -> bool {
        let live = lock(&self.live);
        live.slots.is_empty() && live.opening == 0 && live.missing > 0
    }

    fn no_connection(&self) -> ApiError {
        ApiError::unavailable(format!(
            "the server is busy: every {} connection is held by a statement that did not stop \
             in time; retry later",
            self.name
        ))
    }

    /// Opens replacements for given-up connections while at most the cap of strays run.
    fn refill(shared: &Arc<Shared>, now: Instant) {
        let mut live = lock(&shared.live);
        if live.reopen_at.is_some_and(|at| now < at) {
            return;
        }
        while live.missing > 0 && shared.strays.alive() <= shared.strays.cap {
            live.missing -= 1;
            live.opening += 1;
            let started = Shared::spawn(shared, |shared| match (shared.open)() {
                Ok(conn) => {
                    let slot = Shared::enlist(shared, &conn);
                    lock(&shared.live).opening -= 1;
                    worker_main(shared, &slot, conn);
                }
                Err(e) => {
                    tracing::error!(pool = shared.name, error = %e, "cannot open a replacement connection");
                    let mut live = lock(&shared.live);
                    live.opening -= 1;
                    live.missing += 1;
                    live.reopen_at = Some(Instant::now() + REOPEN_AFTER);
                }
            });
            if let Err(e) = started {
                tracing::error!(pool = shared.name, error = %e, "cannot start a replacement connection's thread");
                live.opening -= 1;
                live.missing += 1;
                live.reopen_at = Some(now + REOPEN_AFTER);
                return;
            }
        }
    }
}

/// Runs `task` on `conn` from `slot`; `true` if the job was given up while it ran.
fn run_task(slot: &Slot, conn: &mut Conn, task: Task) -> bool {
    let Task {
        control,
        run,
        answer,
        waiting,
    } = task;
    drop(waiting);
    if control.is_cancelled() {
        return false;
    }
    *lock(&slot.running) = Some(Running { control, answer });
    // `run` catches panics inside the job; this is the last line of defence.
    if catch_unwind(AssertUnwindSafe(|| run(conn))).is_err() {
        tracing::error!("panic escaped an engine task");
        conn.hooks.end_job();
        conn.end_stray_transaction();
    }
    match lock(&slot.running).take() {
        // Answers only if the job did not (a panic that escaped it).
        Some(job) => {
            (job.answer)(ApiError::internal());
            false
        }
        None => true,
    }
}

fn worker_main(shared: &Arc<Shared>, slot: &Arc<Slot>, mut conn: Conn) {
    loop {
        let task = lock(&shared.receiver).recv();
        let Ok(task) = task else { break };
        if run_task(slot, &mut conn, task) {
            // Given up: the watchdog took this connection out of the pool.
            drop(conn);
            shared.strays.ended();
            tracing::info!(
                pool = shared.name,
                "a given-up connection's statement ended; its connection is closed"
            );
            return;
        }
        if conn.hooks.take_poisoned() {
            match (shared.open)() {
                Ok(fresh) => {
                    *lock(&slot.interrupt) = fresh.conn.get_interrupt_handle();
                    drop(std::mem::replace(&mut conn, fresh));
                    tracing::debug!(
                        pool = shared.name,
                        "replaced a connection a refused statement left state on"
                    );
                }
                Err(e) => tracing::error!(
                    pool = shared.name,
                    error = %e,
                    "cannot replace a connection a refused statement left state on"
                ),
            }
        }
    }
    drop(conn);
    lock(&shared.live)
        .slots
        .retain(|live| !Arc::ptr_eq(live, slot));
}

#[cfg(test)]
mod tests;
