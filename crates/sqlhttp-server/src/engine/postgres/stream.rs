//! Streaming one PostgreSQL statement's success body while its rows arrive: the engine's
//! [`PostgresEngine::streamed`] runs the statement (on the requester's task until its body
//! streams, then as a task of its own: ADR 0070) through the row writer into the shared chunk
//! `Sink`, commits before the body's last bytes are written, and ends a body that failed after
//! its first chunk with the error (see `docs/adr/0016-streamed-results.md`). A streamed write's
//! body ends with its bookmark (issue 35): its headers went out before it committed, so they
//! could not name it. (A read's headers name its position, known from its `BEGIN`; its body is
//! unchanged.)
//!
//! Knows the request's transaction and the chunk channel; nothing about HTTP.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use tracing::Instrument as _;

use crate::engine::job::CancelOnDrop;
use crate::engine::postgres::in_transaction::{Ran, Run};
use crate::engine::postgres::lease::Lease;
use crate::engine::postgres::replicas::Route;
use crate::engine::postgres::transaction;
use crate::engine::postgres::{Inner, Job, PostgresEngine, exec, panicked, session};
use crate::engine::postgres::{in_transaction, read_flight, write_flight};
use crate::engine::run_to_end::RunToEnd;
use crate::engine::stream::{self, ChunkSender, Chunks, Sink};
use crate::engine::{Access, Outcome, Reply};
use crate::protocol::bookmark::{Bookmark, ServedBy};
use crate::protocol::error::ApiError;
use crate::protocol::request::SqlRequest;
use crate::protocol::result;

impl PostgresEngine {
    /// Runs `request` where `route` says; the reply says where it stands, known before its
    /// first byte (a read's position comes with its `BEGIN`; a write's with its COMMIT, so a
    /// write whose body streams before it committed has none there: its body's last member
    /// names it).
    pub(super) async fn streamed(
        &self,
        route: Route,
        request: SqlRequest,
        mode: Access,
    ) -> Result<Reply, ApiError> {
        let job = Arc::new(Job::requiring(route.min()));
        let served_by = route.served_by();
        let (sender, mut receiver) = stream::channel(stream::QUEUE_CHUNKS);
        let inner = Arc::clone(route.node());
        let task_job = Arc::clone(&job);
        // Run on the request's task until its body streams (then as a task of its own, the
        // body's producer) or its requester leaves (then to its end, cancelled): ADR 0070. Its
        // timing and span go with it. The statement's future, some kilobytes, is made on the
        // heap once, at its first poll: the wrappers move a pointer (ADR 0073).
        let mut work = RunToEnd::new(crate::timing::Timing::carry(
            async move { Box::pin(stream(&inner, &task_job, &request, mode, sender)).await }
                .instrument(tracing::Span::current()),
        ));
        // Declared after the work: dropped first, so the work goes on cancelled.
        let cancel = CancelOnDrop::new(Arc::clone(&job));
        let start = tokio::select! {
            biased;
            ran = &mut work => match ran.unwrap_or_else(panicked) {
                // Its whole body went through the channel within that poll.
                Ok(None) => stream::Start::Streaming,
                ran => {
                    cancel.disarm();
                    return whole(ran, &job, served_by);
                }
            },
            start = receiver.start() => start,
        };
        match start {
            stream::Start::Streaming => {
                work.detach();
                // The body now owns the job: dropping it (the client left) cancels the statement.
                let position = job.position_as(served_by);
                receiver.hold(cancel);
                Ok(Reply::Stream(receiver, position))
            }
            stream::Start::Nothing => {
                let ran = (&mut work).await.unwrap_or_else(panicked);
                cancel.disarm();
                whole(ran, &job, served_by)
            }
        }
    }
}

/// Runs one statement in its own transaction, sending its body through `sender` once it
/// outgrows a chunk. Returns the whole body when nothing was sent, `None` when the body went
/// through the channel (to its end, or to an error written into it).
async fn stream(
    inner: &Inner,
    job: &Job,
    request: &SqlRequest,
    mode: Access,
    sender: ChunkSender,
) -> Result<Option<Vec<u8>>, ApiError> {
    let mut lease = inner.lease(job).await?;
    let mut out = stream::body_buffer();
    let must_stop = || job.is_cancelled();
    let mut sink = Sink::Stream(Chunks::new(&sender, &must_stop));
    let mut cost = result::Cost::now(lease.served_by);
    if mode == Access::ReadWrite && !inner.node.is_replica() {
        cost.began = std::time::Instant::now();
        // Boxed here and below: each path's future is kilobytes, which would otherwise size
        // (and be copied with) every statement's future, a verified read's too (ADR 0073).
        let flown = Box::pin(write_flight::write_in_flights(
            inner, job, &lease, request, &mut out, &mut sink,
        ))
        .await;
        if let Some((written, left_clean)) = flown {
            lease.clean = left_clean;
            let started = sink.started();
            drop(lease);
            // A streamed write's body ends with its bookmark: its headers went out before
            // it committed.
            let position = match job.position.load(Ordering::Acquire) {
                0 => None,
                at => Some(Bookmark::from_position(at)),
            };
            return finish_flown(written, started, out, sender, cost, position);
        }
    }
    if mode == Access::ReadOnly && !inner.node.is_replica() {
        cost.began = std::time::Instant::now();
        let clean = std::sync::atomic::AtomicBool::new(false);
        // Two runs at most (a stale statement's second), each bounded as a statement.
        let flown = inner
            .guarded(job, &lease, 2, async {
                match read_flight::read_in_one_flight(inner, &lease, request, &mut out, &mut sink)
                    .await
                {
                    None => Ok(None),
                    Some((written, left_clean)) => {
                        clean.store(left_clean, Ordering::Release);
                        written.map(Some)
                    }
                }
            })
            .await;
        // Given up (its requester left, the server closes, the backstop), the session is
        // not pooled.
        lease.clean = clean.load(Ordering::Acquire);
        let written = match flown {
            // Nothing was sent: the driver runs it, below.
            Ok(None) => None,
            Ok(Some(rows_affected)) => Some(Ok(rows_affected)),
            Err(err) => Some(Err(err)),
        };
        if let Some(written) = written {
            let started = sink.started();
            drop(lease);
            return finish_flown(written, started, out, sender, cost, None);
        }
    }
    let run = Statement {
        inner,
        job,
        request,
        mode,
        out: &mut out,
        sink: &mut sink,
        cost: &mut cost,
    };
    let ended = Box::pin(in_transaction::ran_in_transaction(
        inner, job, lease, mode, run,
    ))
    .await;
    if !sink.started() {
        // Nothing was sent: the whole body is the answer, its position in the headers.
        let rows_affected = ended?;
        result::end(&mut out, rows_affected, None, cost);
        return Ok(Some(out));
    }
    // A read's headers named its position already; a write's body ends with its bookmark
    // (the position read after its COMMIT: at or past the commit).
    let position = match job.position.load(Ordering::Acquire) {
        0 => None,
        _ if mode == Access::ReadOnly => None,
        at => Some(Bookmark::from_position(at)),
    };
    end_streamed_body(ended, position, out, sender, cost)
}

/// One run of a statement whose `BEGIN` goes out with it (and a read's end behind it: one
/// round trip, see `exec::write_result`), its rows written into `out` and on through `sink`.
/// The body's end is written once the transaction ended (see [`stream()`]).
struct Statement<'a, 's> {
    inner: &'a Inner,
    job: &'a Job,
    request: &'a SqlRequest,
    mode: Access,
    out: &'a mut Vec<u8>,
    sink: &'a mut Sink<'s>,
    cost: &'a mut result::Cost,
}

impl Run for Statement<'_, '_> {
    type Output = u64;

    async fn run(&mut self, lease: &Lease) -> Ran<u64> {
        let (inner, mode) = (self.inner, self.mode);
        self.cost.began = std::time::Instant::now();
        // A second run's body starts afresh: nothing of the first was sent.
        self.out.clear();
        let opening: exec::Opening<'_> = Box::pin(transaction::begin(inner, lease, mode));
        let mut behind = (mode == Access::ReadOnly).then(|| {
            let client = lease.client();
            let end = session::after_read();
            exec::Behind::new(async move { client.batch_execute(&end).await })
        });
        let around = exec::Around {
            before: Some(opening),
            behind: behind.as_mut(),
        };
        let map = |e| inner.map(&e);
        let result = inner
            .guarded(
                self.job,
                lease,
                1,
                exec::write_rows(
                    lease,
                    self.request,
                    &inner.limits,
                    self.out,
                    self.sink,
                    &map,
                    around,
                ),
            )
            .await;
        let sent = transaction::sent_end(inner, result.is_ok(), behind).await;
        Ran {
            result,
            sent,
            // Once its body streams, its answer has started: a failure ends it.
            repeatable: !self.sink.started(),
        }
    }
}

/// Ends a body that started streaming, once its transaction ended: on success with the rows it
/// changed and `position` (a write's bookmark), on failure with the error, which no success
/// member precedes. `Err` when nobody reads the body any more.
fn end_streamed_body(
    ended: Result<u64, ApiError>,
    position: Option<Bookmark>,
    mut out: Vec<u8>,
    sender: ChunkSender,
    cost: result::Cost,
) -> Result<Option<Vec<u8>>, ApiError> {
    match ended {
        Ok(rows_affected) => result::end_at(&mut out, rows_affected, None, position, cost),
        Err(err) => {
            if sender.is_gone() {
                return Err(err);
            }
            tracing::debug!(code = err.code.as_str(), "statement failed mid-stream");
            // Close the rows and say why the body ends here.
            result::error_tail(&mut out, &err);
        }
    }
    sender.finish(Bytes::from(out));
    Ok(None)
}

/// The reply of a job whose body did not stream: the whole body, where its job stands.
fn whole(
    ran: Result<Option<Vec<u8>>, ApiError>,
    job: &Job,
    served_by: ServedBy,
) -> Result<Reply, ApiError> {
    match ran? {
        Some(body) => Ok(Reply::Whole(
            Outcome::fresh(body).at(job.position_as(served_by)),
        )),
        None => Err(ApiError::internal()),
    }
}

/// The body of a statement that ran in flights (see `read_flight`, `write_flight`): whole when
/// nothing was sent (`Some`), else ended in the channel with `position` (a write's bookmark; a
/// read's headers named its position already), or with the error when it failed after its
/// first chunk.
fn finish_flown(
    written: Result<u64, ApiError>,
    started: bool,
    mut out: Vec<u8>,
    sender: ChunkSender,
    cost: result::Cost,
    position: Option<Bookmark>,
) -> Result<Option<Vec<u8>>, ApiError> {
    if !started {
        let rows_affected = written?;
        result::end(&mut out, rows_affected, None, cost);
        return Ok(Some(out));
    }
    end_streamed_body(written, position, out, sender, cost)
}
