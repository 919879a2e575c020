//! Where a request's time in the server went: the wait for an engine's turn (a connection, the
//! writer) and the engine's own time, measured by the engines and read by the HTTP layer for
//! `Server-Timing` (see `docs/protocol.md`, "Tracing and stats"), and the `queue` and `engine`
//! spans of a request's trace.
//!
//! The HTTP layer runs each request inside [`Timing::scope`]; an engine carries the request's
//! timing and span to the thread or task that does its work with [`Carried`], which ends the
//! `queue` span and opens the `engine` span when the work starts. Work outside a request (the
//! server's own jobs) carries nothing and costs a task-local lookup.
//!
//! Knows `tracing` and clocks; nothing about HTTP, SQL or either engine.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::task::futures::TaskLocalFuture;
use tracing::Instrument as _;

tokio::task_local! {
    static CURRENT: Timing;
}

#[derive(Debug, Default)]
struct Figures {
    queue: Duration,
    db: Duration,
    /// Engine work under way: how many, and since when the first began.
    running: u32,
    since: Option<Instant>,
}

/// One request's queue and engine time, shared by the HTTP layer and the engine's work.
#[derive(Debug, Clone, Default)]
pub(crate) struct Timing(Arc<Mutex<Figures>>);

impl Timing {
    /// The timing of the request this task serves, if it serves one.
    pub(crate) fn current() -> Option<Timing> {
        CURRENT.try_with(Timing::clone).ok()
    }

    /// Runs `work` as the request this timing measures.
    pub(crate) fn scope<F: Future>(self, work: F) -> TaskLocalFuture<Timing, F> {
        CURRENT.scope(self, work)
    }

    /// `work`, run as the current request's (if any; else as nobody's) wherever it is
    /// spawned.
    pub(crate) fn carry<F: Future>(work: F) -> TaskLocalFuture<Timing, F> {
        Timing::current().unwrap_or_default().scope(work)
    }

    /// `work` measured as the wait for the engine's turn, under a `queue` span for `pool`.
    pub(crate) async fn queue<F: Future>(pool: &'static str, work: F) -> F::Output {
        let waiting = Instant::now();
        let out = work.instrument(tracing::info_span!("queue", pool)).await;
        if let Some(timing) = Timing::current() {
            timing.queued(waiting.elapsed());
        }
        out
    }

    /// `work` measured as engine time from now, under an `engine` span for `pool`. Boxed
    /// before anything wraps it: an engine's work is a large future, which each wrapper would
    /// otherwise copy whole (ADR 0073).
    pub(crate) fn engine<F: Future>(
        pool: &'static str,
        work: F,
    ) -> impl Future<Output = F::Output> {
        let in_engine = Timing::current().map(|timing| timing.in_engine());
        let work = Box::pin(work).instrument(tracing::info_span!("engine", pool));
        async move {
            let _in_engine = in_engine;
            work.await
        }
    }

    fn lock(&self) -> MutexGuard<'_, Figures> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a wait for the engine's turn.
    pub(crate) fn queued(&self, waited: Duration) {
        self.lock().queue += waited;
    }

    /// Engine work begins; it ends when the guard is dropped.
    pub(crate) fn in_engine(&self) -> InEngine {
        let mut figures = self.lock();
        if figures.running == 0 {
            figures.since = Some(Instant::now());
        }
        figures.running += 1;
        InEngine(self.clone())
    }

    /// The wait for the engine's turn and the engine's time so far (work still under way
    /// counts until now).
    pub(crate) fn figures(&self) -> (Duration, Duration) {
        let figures = self.lock();
        let running = figures
            .since
            .map_or(Duration::ZERO, |since| since.elapsed());
        (figures.queue, figures.db + running)
    }
}

/// Engine work under way for a request (see [`Timing::in_engine`]).
#[derive(Debug)]
pub(crate) struct InEngine(Timing);

impl Drop for InEngine {
    fn drop(&mut self) {
        let mut figures = self.0.lock();
        figures.running = figures.running.saturating_sub(1);
        if figures.running == 0
            && let Some(since) = figures.since.take()
        {
            figures.db += since.elapsed();
        }
    }
}

/// A request's timing and span, taken where its engine work is queued to where it runs (a
/// worker thread, a task of its own): the time between is the request's wait for its turn,
/// under a `queue` span.
#[derive(Debug)]
pub(crate) struct Carried {
    timing: Option<Timing>,
    parent: tracing::Span,
    queued: Instant,
    queue: tracing::Span,
}

impl Carried {
    /// Takes the current request's timing and span as its work is queued for `pool`.
    pub(crate) fn here(pool: &'static str) -> Carried {
        let parent = tracing::Span::current();
        let queue = tracing::info_span!(parent: &parent, "queue", pool);
        Carried {
            timing: Timing::current(),
            parent,
            queued: Instant::now(),
            queue,
        }
    }

    /// The work starts: ends the wait and opens the `engine` span (child of the request's),
    /// entered on this thread until the returned guard is dropped.
    pub(crate) fn start(self, pool: &'static str) -> Running {
        let Carried {
            timing,
            parent,
            queued,
            queue,
        } = self;
        drop(queue);
        let in_engine = timing.map(|timing| {
            timing.queued(queued.elapsed());
            timing.in_engine()
        });
        let span = tracing::info_span!(parent: &parent, "engine", pool);
        Running {
            _in_engine: in_engine,
            _span: span.entered(),
        }
    }
}

/// Engine work under way on this thread (see [`Carried::start`]).
#[derive(Debug)]
pub(crate) struct Running {
    _in_engine: Option<InEngine>,
    _span: tracing::span::EnteredSpan,
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test]
    async fn a_wait_and_engine_work_are_measured_and_running_work_counts_until_now() {
        let timing = Timing::default();
        timing
            .clone()
            .scope(async {
                let carried = Carried::here("test");
                std::thread::sleep(2 * MS);
                let running = carried.start("test");
                std::thread::sleep(3 * MS);
                let (queue, db) = Timing::current().unwrap().figures();
                assert!(queue >= 2 * MS && db >= 3 * MS, "{queue:?} {db:?}");
                drop(running);
            })
            .await;
        let (queue, db) = timing.figures();
        assert!(queue >= 2 * MS && db >= 3 * MS, "{queue:?} {db:?}");
        std::thread::sleep(2 * MS);
        assert_eq!(timing.figures().1, db, "ended work stops counting");
        assert!(
            Timing::current().is_none(),
            "outside a request there is none"
        );
    }
}
