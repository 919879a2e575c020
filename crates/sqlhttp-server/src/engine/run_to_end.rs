//! [`RunToEnd`]: a job's work polled on its requester's own task, and moved to a task of its own
//! only when it must outlive that task: the requester went away before the work finished (its
//! future was dropped), or the work's body streams past the handler's return. Either way the
//! work runs to its end, as a task spawned for every job did (a transaction is ended, a write's
//! outcome recorded, whoever waits), without a spawn, a cross-thread wake-up and memory freed on
//! another worker's arena per request (ADR 0070).
//!
//! A work that panics while polled here is answered as [`Panicked`] (as a spawned task's panic
//! was a `JoinError`), and dropped, never polled again; one dropped while something else
//! unwinds (a sibling future panicked) still runs to its end. Outside a runtime (the server
//! shutting down) an unfinished work is dropped: what it held ends as the engine's `Drop`s end
//! it (a lent session is closed, not pooled). Knows nothing about SQL, HTTP or either engine.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The work panicked while it was polled on its requester's task (the panic hook logged it, as
/// any other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Panicked;

/// `work`, run where it is awaited until it ends or [`RunToEnd::detach`] moves it to a task of
/// its own; dropped unfinished, it goes on as a task of its own.
pub(crate) struct RunToEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    work: Option<Pin<Box<F>>>,
}

impl<F> RunToEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    /// Wraps `work`, boxed once: it moves to a task of its own without another copy.
    pub(crate) fn new(work: F) -> RunToEnd<F> {
        RunToEnd {
            work: Some(Box::pin(work)),
        }
    }

    /// Moves what is left of the work to a task of its own, whose answer nobody waits for (the
    /// work delivers it itself, as a streamed body's producer does).
    pub(crate) fn detach(mut self) {
        if let Some(work) = self.work.take() {
            spawn(work);
        }
    }
}

impl<F> Future for RunToEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = Result<F::Output, Panicked>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(work) = self.work.as_mut() else {
            panic!("RunToEnd polled after it ended");
        };
        // Unwind safety: a work that panicked is dropped here, never polled or used again.
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(cx)));
        let out = match polled {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(out)) => Ok(out),
            Err(_) => Err(Panicked),
        };
        self.work = None;
        Poll::Ready(out)
    }
}

impl<F> Drop for RunToEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        if let Some(work) = self.work.take() {
            spawn(work);
        }
    }
}

/// Spawns `work` on the current runtime; without one (it is shutting down) drops it.
fn spawn<F>(work: Pin<Box<F>>)
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        drop(runtime.spawn(work));
    }
}

impl<F> std::fmt::Debug for RunToEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunToEnd")
            .field("running", &self.work.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use tokio::sync::Notify;

    use super::*;

    /// A work that waits for `go`, then marks `ended`.
    fn gated(go: &Arc<Notify>, ended: &Arc<AtomicBool>) -> impl Future<Output = u8> + 'static {
        let (go, ended) = (Arc::clone(go), Arc::clone(ended));
        async move {
            go.notified().await;
            ended.store(true, Ordering::Release);
            7
        }
    }

    #[tokio::test]
    async fn awaited_it_runs_on_the_awaiting_task_and_answers() {
        let (go, ended) = (Arc::new(Notify::new()), Arc::new(AtomicBool::new(false)));
        go.notify_one();
        assert_eq!(RunToEnd::new(gated(&go, &ended)).await, Ok(7));
        assert!(ended.load(Ordering::Acquire));
    }

    #[tokio::test]
    async fn dropped_unfinished_it_runs_to_its_end_as_a_task_of_its_own() {
        let (go, ended) = (Arc::new(Notify::new()), Arc::new(AtomicBool::new(false)));
        let mut work = RunToEnd::new(gated(&go, &ended));
        // Polled once, left waiting: the requester goes away.
        assert!(futures_poll_once(&mut work).is_pending());
        drop(work);
        go.notify_one();
        assert!(
            ran_to_its_end(&ended).await,
            "the dropped work never ran to its end"
        );
    }

    #[tokio::test]
    async fn detached_it_runs_to_its_end() {
        let (go, ended) = (Arc::new(Notify::new()), Arc::new(AtomicBool::new(false)));
        RunToEnd::new(gated(&go, &ended)).detach();
        go.notify_one();
        assert!(
            ran_to_its_end(&ended).await,
            "the detached work never ran to its end"
        );
    }

    #[tokio::test]
    async fn a_work_that_panicked_is_answered_as_such_and_not_polled_again() {
        let polls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&polls);
        let work = RunToEnd::new(std::future::poll_fn(move |_| -> Poll<()> {
            counted.fetch_add(1, Ordering::AcqRel);
            panic!("the work's bug");
        }));
        assert_eq!(work.await, Err(Panicked));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            polls.load(Ordering::Acquire),
            1,
            "polled once, then dropped"
        );
    }

    #[tokio::test]
    async fn dropped_while_something_else_unwinds_it_still_runs_to_its_end() {
        let (go, ended) = (Arc::new(Notify::new()), Arc::new(AtomicBool::new(false)));
        let mut work = RunToEnd::new(gated(&go, &ended));
        assert!(futures_poll_once(&mut work).is_pending());
        let sibling = std::panic::catch_unwind(AssertUnwindSafe(move || {
            let _work = work;
            panic!("a sibling's bug");
        }));
        assert!(sibling.is_err());
        go.notify_one();
        assert!(
            ran_to_its_end(&ended).await,
            "the work dropped by another's panic never ran to its end"
        );
    }

    /// Whether `ended` is marked within a hundred turns of the runtime.
    async fn ran_to_its_end(ended: &AtomicBool) -> bool {
        for _ in 0..100 {
            if ended.load(Ordering::Acquire) {
                return true;
            }
            tokio::task::yield_now().await;
        }
        false
    }

    /// Polls `work` once with a waker that does nothing.
    fn futures_poll_once<F: Future + Unpin>(work: &mut F) -> Poll<F::Output> {
        Pin::new(work).poll(&mut Context::from_waker(std::task::Waker::noop()))
    }
}
