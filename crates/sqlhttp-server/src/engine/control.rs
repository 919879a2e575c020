//! Stopping statements: [`JobControl`] (one request's deadline and cancellation, shared by the
//! requester and the worker running it) and [`Hooks`] (the per-connection state SQLite's
//! progress, busy and authorizer callbacks read).
//!
//! Knows atomics, clocks and SQLite's callback contracts; nothing about HTTP or SQL text.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::api_error::{ApiError, ErrorCode};
use crate::engine::job::Cancel;

/// Why a statement was told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopReason {
    /// It ran past the statement timeout.
    Deadline,
    /// Its requester went away (the client disconnected).
    Cancelled,
    /// The engine is closing.
    Closing,
}

const NOT_STOPPED: u8 = 0;

impl StopReason {
    fn to_u8(self) -> u8 {
        match self {
            StopReason::Deadline => 1,
            StopReason::Cancelled => 2,
            StopReason::Closing => 3,
        }
    }

    fn from_u8(value: u8) -> Option<StopReason> {
        match value {
            1 => Some(StopReason::Deadline),
            2 => Some(StopReason::Cancelled),
            3 => Some(StopReason::Closing),
            _ => None,
        }
    }
}

/// One job's stop conditions.
#[derive(Debug, Default)]
pub(crate) struct JobControl {
    cancelled: AtomicBool,
    deadline: OnceLock<(Instant, Duration)>,
    stopped: AtomicU8,
}

impl JobControl {
    /// Marks the job as abandoned by its requester: a queued job is skipped, a running one is
    /// interrupted at its next progress check.
    pub(crate) fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    /// Starts the statement clock (once; later calls keep the first deadline).
    pub(crate) fn start(&self, timeout: Duration) {
        let _ = self.deadline.set((Instant::now() + timeout, timeout));
    }

    /// Whether the job must stop now, recording why the first time it must.
    fn must_stop(&self, closing: bool) -> bool {
        let reason = if closing {
            Some(StopReason::Closing)
        } else if self.is_cancelled() {
            Some(StopReason::Cancelled)
        } else if self
            .deadline
            .get()
            .is_some_and(|(at, _)| Instant::now() >= *at)
        {
            Some(StopReason::Deadline)
        } else {
            None
        };
        if let Some(reason) = reason {
            let _ = self.stopped.compare_exchange(
                NOT_STOPPED,
                reason.to_u8(),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        reason.is_some()
    }

    /// Why the job was stopped, if it was.
    pub(crate) fn stop_reason(&self) -> Option<StopReason> {
        StopReason::from_u8(self.stopped.load(Ordering::Acquire))
    }

    /// The protocol error for a statement the engine interrupted.
    pub(crate) fn interrupted_error(&self) -> ApiError {
        match self.stop_reason() {
            Some(StopReason::Deadline) => {
                let timeout = self.deadline.get().map(|(_, t)| *t).unwrap_or_default();
                ApiError::new(
                    ErrorCode::StatementTimeout,
                    format!(
                        "the statement ran longer than this server's statement timeout of {} ms \
                         and was stopped; nothing it wrote was kept",
                        timeout.as_millis()
                    ),
                )
            }
            Some(StopReason::Cancelled) => {
                ApiError::unavailable("the request was cancelled by its client")
            }
            Some(StopReason::Closing) | None => {
                ApiError::unavailable("the statement was interrupted: the server is shutting down")
            }
        }
    }
}

impl Cancel for JobControl {
    fn cancel(&self) {
        JobControl::cancel(self);
    }
}

/// Per-connection state read by SQLite's callbacks: the job now running, whether the
/// statement being compiled is a client's (and so sandboxed), and the sandbox's last refusal.
#[derive(Debug)]
pub(crate) struct Hooks {
    closing: Arc<AtomicBool>,
    job: Mutex<Option<Arc<JobControl>>>,
    sandboxed: AtomicBool,
    denial: Mutex<Option<String>>,
}

impl Hooks {
    pub(crate) fn new(closing: Arc<AtomicBool>) -> Hooks {
        Hooks {
            closing,
            job: Mutex::new(None),
            sandboxed: AtomicBool::new(false),
            denial: Mutex::new(None),
        }
    }

    /// Installs the job whose statements run on this connection until [`Hooks::end_job`].
    pub(crate) fn begin_job(&self, job: Arc<JobControl>) {
        *self.job.lock().unwrap_or_else(PoisonError::into_inner) = Some(job);
    }

    pub(crate) fn end_job(&self) {
        *self.job.lock().unwrap_or_else(PoisonError::into_inner) = None;
        self.set_sandboxed(false);
    }

    /// The progress handler's question: stop the running statement now?
    pub(crate) fn must_stop(&self) -> bool {
        let closing = self.closing.load(Ordering::Acquire);
        match &*self.job.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(job) => job.must_stop(closing),
            None => closing,
        }
    }

    /// Why the running job's statement was stopped, as the protocol error to report (for a body
    /// that is already streaming, where the worker cannot replace the error afterwards).
    pub(crate) fn interrupted_error(&self) -> ApiError {
        match &*self.job.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(job) => job.interrupted_error(),
            None => ApiError::unavailable("the statement was interrupted"),
        }
    }

    /// Whether statements compiled from now on are a client's.
    pub(crate) fn set_sandboxed(&self, on: bool) {
        self.sandboxed.store(on, Ordering::Release);
        if on {
            self.denial
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
        }
    }

    pub(crate) fn is_sandboxed(&self) -> bool {
        self.sandboxed.load(Ordering::Acquire)
    }

    pub(crate) fn record_denial(&self, reason: String) {
        *self.denial.lock().unwrap_or_else(PoisonError::into_inner) = Some(reason);
    }

    /// The sandbox's reason for the last refusal, if any.
    pub(crate) fn take_denial(&self) -> Option<String> {
        self.denial
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_reason_sticks() {
        let job = JobControl::default();
        job.start(Duration::ZERO);
        assert!(job.must_stop(false));
        job.cancel();
        assert!(job.must_stop(true));
        assert_eq!(job.stop_reason(), Some(StopReason::Deadline));
        assert_eq!(job.interrupted_error().code, ErrorCode::StatementTimeout);
    }

    #[test]
    fn cancellation_and_closing_are_unavailable() {
        let job = JobControl::default();
        job.start(Duration::from_secs(60));
        assert!(!job.must_stop(false));
        job.cancel();
        assert!(job.must_stop(false));
        assert_eq!(job.stop_reason(), Some(StopReason::Cancelled));
        assert_eq!(job.interrupted_error().code, ErrorCode::Unavailable);

        let hooks = Hooks::new(Arc::new(AtomicBool::new(true)));
        assert!(
            hooks.must_stop(),
            "a closing engine stops even without a job"
        );
    }
}
