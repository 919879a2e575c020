//! The one place a PostgreSQL request's work runs in the server's transaction: opened, run
//! under the guard, run once more when a statement the driver had cached went stale (unless
//! its requester left), and ended (see `transaction` for what the open and the end send). A plain statement, a batch,
//! keyed work and a description all pass here; the flights (`read_flight`, `write_flight`),
//! which carry their own open and end in one message, and the server's own store records,
//! which run to their end whatever their requester does, do not.
//!
//! The work is a value of a trait ([`Work`], [`Run`]), not a closure: its future borrows the
//! lease it is lent, and only a signature that names that future `Send` lets the request's
//! future be sent between threads.
//!
//! Knows the lease and the transaction's shape; nothing about what the work sends or about
//! HTTP.

use std::future::Future;

use crate::engine::Access;
use crate::engine::interactive::Isolation;
use crate::engine::postgres::lease::Lease;
use crate::engine::postgres::transaction;
use crate::engine::postgres::transaction::SentEnd;
use crate::engine::postgres::{Inner, Job};
use crate::protocol::error::ApiError;

/// How [`in_transaction`] opens the transaction before the work runs.
#[derive(Debug, Clone, Copy)]
pub(super) enum Open {
    /// A statement's: its lock waits bounded as a client's statement's are.
    Statement,
    /// A batch's, at its isolation (`None`: the request's default); a write batch waits for
    /// locks as long as its statement timeout allows (see [`transaction::begin_batch`]).
    Batch(Option<Isolation>),
}

/// A request's work inside a transaction [`in_transaction`] opened: run once, or twice
/// when the first run met a stale statement (its transaction rolled back in between).
pub(super) trait Work {
    type Output;

    /// Runs the work on `lease`, whose transaction is open.
    fn run(&mut self, lease: &Lease)
    -> impl Future<Output = Result<Self::Output, ApiError>> + Send;
}

/// One run of a request's work that opens the transaction itself (a statement's `BEGIN` goes
/// out with it, see `exec::Around`), for [`ran_in_transaction`].
pub(super) trait Run {
    type Output;

    /// Opens the transaction on `lease`, runs the work in it and says what it did.
    fn run(&mut self, lease: &Lease) -> impl Future<Output = Ran<Self::Output>> + Send;
}

/// What one [`Run`] did.
pub(super) struct Ran<T> {
    /// The work's answer.
    pub(super) result: Result<T, ApiError>,
    /// The end the run sent behind its statement and waited for, when it did.
    pub(super) sent: Option<SentEnd>,
    /// Whether a failed run may run again: nothing of its answer left for its requester.
    pub(super) repeatable: bool,
}

/// Opens the transaction on `lease` as `open` says, runs `work` in it under the guard
/// (bounded as `statements` statements), and ends it (see [`ran_in_transaction`]).
/// The open is guarded too: on a replica that stops answering, it is what waits.
pub(super) async fn in_transaction<W: Work + Send>(
    inner: &Inner,
    job: &Job,
    lease: Lease,
    mode: Access,
    open: Open,
    statements: usize,
    work: W,
) -> Result<W::Output, ApiError> {
    let begin_first = BeginFirst {
        inner,
        job,
        mode,
        open,
        statements,
        work,
    };
    ran_in_transaction(inner, job, lease, mode, begin_first).await
}

/// Runs `run` on `lease` and ends its transaction: a write whose work succeeded commits,
/// anything else rolls back, and an end the run already sent is only read (see
/// [`transaction::end_or_ended`]). A run that failed because a cached statement went stale
/// (another server's start replaced what it reads, see `Lease::take_retry`), whose answer
/// did not start and whose requester is still there, is rolled back and forgotten, and runs
/// once more with every statement prepared afresh.
pub(super) async fn ran_in_transaction<R: Run>(
    inner: &Inner,
    job: &Job,
    mut lease: Lease,
    mode: Access,
    mut run: R,
) -> Result<R::Output, ApiError> {
    loop {
        let ran = run.run(&lease).await;
        // A requester that left is not run for again: its first run's cancel may have
        // been spent on a statement that failed as stale all the same.
        if ran.result.is_err() && ran.repeatable && !job.is_cancelled() && lease.take_retry() {
            lease = inner.again(job, lease).await?;
            continue;
        }
        return transaction::end_or_ended(inner, lease, mode, ran.result, ran.sent).await;
    }
}

/// A [`Work`] with the open [`in_transaction`] sends before it, under one guard.
struct BeginFirst<'a, W> {
    inner: &'a Inner,
    job: &'a Job,
    mode: Access,
    open: Open,
    statements: usize,
    work: W,
}

impl<W: Work + Send> Run for BeginFirst<'_, W> {
    type Output = W::Output;

    async fn run(&mut self, lease: &Lease) -> Ran<W::Output> {
        let BeginFirst {
            inner,
            job,
            mode,
            open,
            statements,
            work,
        } = self;
        let (inner, mode, open) = (*inner, *mode, *open);
        let result = inner
            .guarded(job, lease, *statements, async {
                match open {
                    Open::Statement => transaction::begin(inner, lease, mode).await?,
                    Open::Batch(isolation) => {
                        transaction::begin_batch(inner, lease, mode, isolation).await?
                    }
                }
                work.run(lease).await
            })
            .await;
        Ran {
            result,
            sent: None,
            repeatable: true,
        }
    }
}
