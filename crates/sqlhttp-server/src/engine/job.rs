//! [`CancelOnDrop`]: the guard that cancels a job when whoever waits for it goes away (the
//! requester's future is dropped, or a streamed body is dropped mid-way), and is disarmed
//! explicitly when the job's answer arrived, so no cancellation races a finished job.
//!
//! Both engines use it over their own job type through [`Cancel`]. Disarming drops the guard's
//! reference to the job: nothing of a request outlives it (`std::mem::forget` on a guard leaked
//! that reference once per request). Knows nothing about SQL, HTTP or either engine.

use std::sync::Arc;

/// A job that can be told to stop.
pub(crate) trait Cancel: Send + Sync + 'static {
    /// Tells the job that nobody waits for it any more.
    fn cancel(&self);
}

/// Cancels its job when dropped, unless [`CancelOnDrop::disarm`]ed first.
pub(crate) struct CancelOnDrop<J: Cancel> {
    job: Option<Arc<J>>,
}

impl<J: Cancel> CancelOnDrop<J> {
    /// Guards `job`.
    pub(crate) fn new(job: Arc<J>) -> CancelOnDrop<J> {
        CancelOnDrop { job: Some(job) }
    }

    /// The answer arrived: let go of the job without cancelling it.
    pub(crate) fn disarm(mut self) {
        self.job = None;
    }
}

impl<J: Cancel> Drop for CancelOnDrop<J> {
    fn drop(&mut self) {
        if let Some(job) = self.job.take() {
            job.cancel();
        }
    }
}

impl<J: Cancel> std::fmt::Debug for CancelOnDrop<J> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelOnDrop")
            .field("armed", &self.job.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[derive(Default)]
    struct Flag(AtomicBool);

    impl Cancel for Flag {
        fn cancel(&self) {
            self.0.store(true, Ordering::Release);
        }
    }

    #[test]
    fn dropping_an_armed_guard_cancels_and_releases_the_job() {
        let job = Arc::new(Flag::default());
        drop(CancelOnDrop::new(Arc::clone(&job)));
        assert!(job.0.load(Ordering::Acquire));
        assert_eq!(Arc::strong_count(&job), 1, "the guard let go of the job");
    }

    #[test]
    fn a_disarmed_guard_releases_the_job_without_cancelling() {
        let job = Arc::new(Flag::default());
        CancelOnDrop::new(Arc::clone(&job)).disarm();
        assert!(!job.0.load(Ordering::Acquire));
        assert_eq!(
            Arc::strong_count(&job),
            1,
            "nothing of the request outlives it"
        );
    }
}
