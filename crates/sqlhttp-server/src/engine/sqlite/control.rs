//! Stopping statements: [`JobControl`] (one request's deadline and cancellation, shared by the
//! requester and the worker running it, and its fate: finished, committing, or given up by the
//! watchdog) and [`Hooks`] (the per-connection state SQLite's progress, busy, commit and
//! authorizer callbacks read).
//!
//! The worker's commit and the watchdog's give-up are one decision (ADR 0032): both move the
//! job's fate away from `RUNNING` with one compare-and-swap, so exactly one of them happens. A
//! commit that wins is the job's answer; a give-up that wins turns the commit into a rollback.
//!
//! Knows atomics, clocks and SQLite's callback contracts; nothing about HTTP, SQL text or how
//! connections are pooled.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::engine::job::Cancel;
use crate::protocol::error::{ApiError, ErrorCode};

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

/// The job runs (or waits): both its commit and a give-up may still happen.
const RUNNING: u8 = 0;
/// The job's commit won: what it wrote is its answer, and it is never given up.
const COMMITTING: u8 = 1;
/// The job's worker has its outcome: it answers it.
const DONE: u8 = 2;
/// The watchdog gave the job up: its requester was answered, it never commits.
const GIVEN_UP: u8 = 3;

/// One job's stop conditions and fate.
#[derive(Debug, Default)]
pub(crate) struct JobControl {
    cancelled: AtomicBool,
    cancelled_at: OnceLock<Instant>,
    deadline: OnceLock<(Instant, Duration)>,
    stopped: AtomicU8,
    fate: AtomicU8,
}

impl JobControl {
    /// Marks the job as abandoned by its requester: a queued job is skipped, a running one is
    /// interrupted at its next progress check.
    pub(crate) fn cancel(&self) {
        let _ = self.cancelled_at.set(Instant::now());
        self.cancelled.store(true, Ordering::Release);
    }

    /// The commit's side of the decision: `true` if the job may commit (it has not been given
    /// up; from now on it never will be), `false` if it was given up and must roll back.
    pub(crate) fn claim_commit(&self) -> bool {
        match self
            .fate
            .compare_exchange(RUNNING, COMMITTING, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(fate) => fate != GIVEN_UP,
        }
    }

    /// The worker has the job's outcome: `true` if it is to be answered, `false` if the job was
    /// given up (its requester has had its answer).
    pub(crate) fn finish(&self) -> bool {
        self.fate
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |fate| {
                (fate != GIVEN_UP).then_some(DONE)
            })
            .is_ok()
    }

    /// The watchdog's side of the decision: `true` if the job is now given up (it had neither
    /// committed nor finished), `false` if its commit or its outcome came first.
    pub(crate) fn give_up(&self) -> bool {
        self.fate
            .compare_exchange(RUNNING, GIVEN_UP, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Whether the watchdog gave the job up.
    pub(crate) fn is_given_up(&self) -> bool {
        self.fate.load(Ordering::Acquire) == GIVEN_UP
    }

    /// Since when the job has had to stop, if it has: the earliest of its deadline, its
    /// cancellation and `closing_since` (when the engine began to close), none in the future.
    pub(crate) fn must_stop_since(
        &self,
        now: Instant,
        closing_since: Option<Instant>,
    ) -> Option<Instant> {
        let deadline = self.deadline.get().map(|(at, _)| *at);
        [deadline, self.cancelled_at.get().copied(), closing_since]
            .into_iter()
            .flatten()
            .filter(|at| *at <= now)
            .min()
    }

    /// Whether the job should be given up at `now`: it has had to stop for `margin` and more,
    /// and neither its commit nor its outcome has come.
    pub(crate) fn overdue(
        &self,
        now: Instant,
        closing_since: Option<Instant>,
        margin: Duration,
    ) -> bool {
        self.fate.load(Ordering::Acquire) == RUNNING
            && self
                .must_stop_since(now, closing_since)
                .is_some_and(|since| now.saturating_duration_since(since) >= margin)
    }

    /// Records why the job must stop (as the progress handler would), for a job given up before
    /// its statement looked.
    pub(crate) fn note_stop(&self, closing: bool) {
        self.must_stop(closing);
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
                ApiError::outage("the statement was interrupted: the server is shutting down")
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
    /// The server's own housekeeping commits now (see [`Hooks::housekeeping`]).
    housekeeping: AtomicBool,
    /// The connection must be replaced after its job (see [`Hooks::poison`]).
    poisoned: AtomicBool,
    /// Locks are not waited for now (see [`Hooks::without_waiting`]).
    impatient: AtomicBool,
}

impl Hooks {
    pub(crate) fn new(closing: Arc<AtomicBool>) -> Hooks {
        Hooks {
            closing,
            job: Mutex::new(None),
            sandboxed: AtomicBool::new(false),
            denial: Mutex::new(None),
            housekeeping: AtomicBool::new(false),
            poisoned: AtomicBool::new(false),
            impatient: AtomicBool::new(false),
        }
    }

    /// Runs `work` with the busy handler giving up at once: a checkpoint that readers hold up
    /// is tried again later rather than waited for.
    pub(crate) fn without_waiting<T>(&self, work: impl FnOnce() -> T) -> T {
        struct Off<'a>(&'a AtomicBool);
        impl Drop for Off<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        self.impatient.store(true, Ordering::Release);
        let _off = Off(&self.impatient);
        work()
    }

    /// Whether the busy handler gives up at once now.
    pub(crate) fn is_impatient(&self) -> bool {
        self.impatient.load(Ordering::Acquire)
    }

    /// Marks the connection as holding state a refused statement left outside the database (an
    /// FTS5 table object's in-memory `rank` setting, set before the statement was undone): its
    /// pool replaces it after the job.
    pub(crate) fn poison(&self) {
        self.poisoned.store(true, Ordering::Release);
    }

    /// Whether the connection must be replaced now (asked once).
    pub(crate) fn take_poisoned(&self) -> bool {
        self.poisoned.swap(false, Ordering::AcqRel)
    }

    /// Installs the job whose statements run on this connection until [`Hooks::end_job`].
    pub(crate) fn begin_job(&self, job: Arc<JobControl>) {
        *self.job.lock().unwrap_or_else(PoisonError::into_inner) = Some(job);
    }

    pub(crate) fn end_job(&self) {
        *self.job.lock().unwrap_or_else(PoisonError::into_inner) = None;
        self.set_sandboxed(false);
    }

    /// The commit hook's question: may the transaction commit? Inside a job, the commit's side
    /// of the decision against a give-up ([`JobControl::claim_commit`]); `false` turns the
    /// commit into a rollback. The server's own work outside a job, and its housekeeping inside
    /// one, always commit.
    pub(crate) fn commit_allowed(&self) -> bool {
        if self.housekeeping.load(Ordering::Acquire) {
            return true;
        }
        match &*self.job.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(job) => job.claim_commit(),
            None => true,
        }
    }

    /// Runs the server's own `work` (purging expired keys) whose commits are not the job's: they
    /// neither claim the job's commit (the job can still be given up after them) nor wait for it.
    pub(crate) fn housekeeping<T>(&self, work: impl FnOnce() -> T) -> T {
        struct Off<'a>(&'a AtomicBool);
        impl Drop for Off<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        self.housekeeping.store(true, Ordering::Release);
        let _off = Off(&self.housekeeping);
        work()
    }

    /// The progress handler's question: stop the running statement now?
    pub(crate) fn must_stop(&self) -> bool {
        let closing = self.closing.load(Ordering::Acquire);
        match &*self.job.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(job) => job.must_stop(closing) || job.is_given_up(),
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
    fn a_give_up_after_the_commit_claim_loses() {
        let job = JobControl::default();
        assert!(job.claim_commit());
        assert!(!job.give_up(), "the commit came first: it is the answer");
        assert!(job.claim_commit(), "a second commit of the same job");
        assert!(job.finish());
        assert!(!job.is_given_up());
    }

    #[test]
    fn a_commit_after_the_give_up_rolls_back() {
        let job = JobControl::default();
        assert!(job.give_up());
        assert!(!job.claim_commit(), "the give-up came first: no commit");
        assert!(!job.finish(), "the requester was answered by the give-up");
        assert!(job.is_given_up(), "it stays given up");
        assert!(!job.give_up(), "one give-up");
    }

    #[test]
    fn a_finished_job_is_not_given_up() {
        let job = JobControl::default();
        assert!(job.finish());
        assert!(!job.give_up());
        assert!(
            !job.overdue(
                Instant::now() + Duration::from_secs(99),
                None,
                Duration::ZERO
            ),
            "a finished job is never overdue"
        );
    }

    #[test]
    fn exactly_one_of_commit_and_give_up_wins_a_race() {
        for _ in 0..2_000 {
            let job = Arc::new(JobControl::default());
            let barrier = Arc::new(std::sync::Barrier::new(2));
            let (j, b) = (Arc::clone(&job), Arc::clone(&barrier));
            let watchdog = std::thread::spawn(move || {
                b.wait();
                j.give_up()
            });
            barrier.wait();
            let committed = job.claim_commit();
            let given_up = watchdog.join().unwrap();
            assert!(
                committed != given_up,
                "committed {committed}, given up {given_up}"
            );
            assert_eq!(job.finish(), committed);
        }
    }

    #[test]
    fn overdue_counts_the_margin_from_the_first_reason_to_stop() {
        let margin = Duration::from_secs(1);
        let job = JobControl::default();
        let started = Instant::now();
        job.start(Duration::from_secs(10));
        let deadline = started + Duration::from_secs(10);
        assert!(!job.overdue(started, None, margin), "within its time");
        assert!(!job.overdue(deadline + margin / 2, None, margin));
        assert!(job.overdue(deadline + margin * 2, None, margin));
        // Closing counts from when the engine began to close.
        let closing = started + Duration::from_secs(2);
        assert!(!job.overdue(closing + margin / 2, Some(closing), margin));
        assert!(job.overdue(closing + margin, Some(closing), margin));
        // A cancelled job counts from its cancellation.
        job.cancel();
        let cancelled = Instant::now();
        assert!(!job.overdue(cancelled, None, margin));
        assert!(job.overdue(cancelled + margin, None, margin));
        // A job that never started has no deadline: only the rest count.
        let queued = JobControl::default();
        assert!(!queued.overdue(started + Duration::from_secs(99), None, margin));
    }

    #[test]
    fn the_commit_hook_claims_only_for_the_job() {
        let hooks = Hooks::new(Arc::new(AtomicBool::new(false)));
        assert!(
            hooks.commit_allowed(),
            "the server's own work outside a job"
        );
        let job = Arc::new(JobControl::default());
        hooks.begin_job(Arc::clone(&job));
        assert!(hooks.housekeeping(|| hooks.commit_allowed()));
        assert!(job.give_up(), "housekeeping did not claim the job's commit");
        assert!(!hooks.commit_allowed(), "a given-up job never commits");
        assert!(hooks.housekeeping(|| hooks.commit_allowed()));
        assert!(hooks.must_stop(), "a given-up job's statement stops");
        hooks.end_job();
        let job = Arc::new(JobControl::default());
        hooks.begin_job(Arc::clone(&job));
        assert!(hooks.commit_allowed());
        assert!(!job.give_up(), "the job's commit came first");
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
