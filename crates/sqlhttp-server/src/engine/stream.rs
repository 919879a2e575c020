//! Streaming one statement's success body while the engine steps it, for both engines:
//! [`channel`] (a bounded queue of body chunks from an engine to the HTTP body) and the [`Sink`]
//! a row writer hands its output to after each row, which keeps it whole or cuts it into chunks
//! ([`Chunks`]) and sends them on (see `docs/adr/0016-streamed-results.md`).
//!
//! The SQLite engine's thread blocks while the queue is full (the PostgreSQL engine's task
//! waits with [`ChunkSender::send_async`] instead), so a request holds one small buffer and a
//! few chunks whatever the result's size; it stops when the HTTP body is dropped (the client went
//! away), when its statement timeout passes, or when the engine closes. Knows the chunking and
//! the job's stop condition; nothing about SQL, either engine, or HTTP beyond being a `Stream`
//! of byte chunks.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::protocol::error::ApiError;
use crate::protocol::result;

/// A chunk is handed to the HTTP body once the rows written reach this many bytes.
pub(crate) const CHUNK_BYTES: usize = 32 * 1024;

/// A body is first written into this much: most answers (a point read, a write's count) fit,
/// and a larger one grows to a chunk. Not a chunk's worth up front: glibc's allocator sorts
/// every request of 1 KiB and more into its large bins, first merging all its freed small
/// blocks (`malloc_consolidate`), so a 33 KiB buffer per request cost the SQLite gateway bench a
/// tenth of its time in `malloc` and `free` (ADR 0062).
const FIRST_BODY_BYTES: usize = 512;

/// An empty body buffer of [`FIRST_BODY_BYTES`].
pub(crate) fn body_buffer() -> Vec<u8> {
    Vec::with_capacity(FIRST_BODY_BYTES)
}

/// Rows written but not yet handed over are sent after this long, so that a slow statement's
/// first rows reach the client without waiting for a whole chunk.
pub(crate) const FLUSH_AFTER: Duration = Duration::from_millis(50);

/// Chunks that may wait in the queue for the client to take them.
pub(crate) const QUEUE_CHUNKS: usize = 4;

/// Bytes that may wait in the queue once a send returns: a chunk of rows larger than a chunk
/// (one row can be `--max-result-bytes`) is queued, and its sender then waits until the client
/// has taken all but this much. Chunks of rows under a chunk each never reach it.
const QUEUE_BYTES: usize = QUEUE_CHUNKS * 2 * CHUNK_BYTES;

/// A queued chunk larger than this is handed to the HTTP body [`CHUNK_BYTES`] at a time, each
/// piece a copy, so that what the body has taken (hyper holds a piece until the client's flow
/// control lets it out) never keeps the large chunk's memory alive.
const SPLIT_ABOVE: usize = 2 * CHUNK_BYTES;

/// How often a producer blocked on a full queue checks whether its job must stop.
const STOP_CHECK: Duration = Duration::from_millis(20);

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<Bytes>,
    /// The producer handed over the body's last byte.
    finished: bool,
    /// The producer is gone (finished or not).
    sender_gone: bool,
    /// The HTTP body was dropped: the client went away.
    receiver_gone: bool,
    waker: Option<Waker>,
    /// An async producer waiting for room in the queue (see [`ChunkSender::send_async`]).
    room_waker: Option<Waker>,
    /// A blocking producer waits on [`Shared::room`] (see [`ChunkSender::send`]): only then is
    /// it notified. A condition variable's notification is a system call whether anyone waits
    /// or not, and every PostgreSQL request's body paid one for nothing (ADR 0065).
    blocked: bool,
    /// A chunk was ever queued: the body streams.
    sent_any: bool,
    /// The job was given up ([`Abandon`]): the producer's later chunks and end are dropped.
    abandoned: bool,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    room: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tells the producer there is room (or nothing more to wait for) once `state`'s lock is
    /// given up: a blocking producer through the condition variable, only when it waits (see
    /// [`State::blocked`]), an async one through its waker; `also` is woken with them.
    fn room_made(&self, mut state: MutexGuard<'_, State>, also: Option<Waker>) {
        let room_waker = state.room_waker.take();
        let blocked = state.blocked;
        drop(state);
        if blocked {
            self.room.notify_all();
        }
        also.into_iter().chain(room_waker).for_each(Waker::wake);
    }
}

impl State {
    /// Whether the client has taken enough of the queue for a send to return.
    fn taken(&self) -> bool {
        self.queue.iter().map(Bytes::len).sum::<usize>() <= QUEUE_BYTES
    }

    /// The job stopped while its client had not taken a large chunk: the rest is dropped rather
    /// than held for a client that may never take it, and the body is cut (it ends inside a
    /// row, so no error member can follow; the client sees the body fail).
    fn cut_untaken(&mut self) {
        self.queue.clear();
        self.abandoned = true;
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }
}

/// A bounded queue of body chunks: the engine thread sends, the HTTP body receives.
pub(crate) fn channel(capacity: usize) -> (ChunkSender, ChunkReceiver) {
    let shared = Arc::new(Shared::default());
    (
        ChunkSender {
            shared: Arc::clone(&shared),
            capacity: capacity.max(1),
        },
        ChunkReceiver {
            shared,
            guard: None,
            failed: false,
        },
    )
}

/// Why a chunk could not be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendError {
    /// The receiver is gone: nobody will read the rest of the body.
    Gone,
    /// The job must stop (its timeout passed, its requester left, the engine is closing).
    Stopped,
}

/// The engine thread's end. Dropping it without [`ChunkSender::finish`] cuts the body: the
/// client sees it end without its closing bytes, never as a whole result.
#[derive(Debug)]
pub(crate) struct ChunkSender {
    shared: Arc<Shared>,
    capacity: usize,
}

impl ChunkSender {
    /// Queues `chunk`, waiting while the queue is full, then while it holds more than
    /// [`QUEUE_BYTES`] (a large row: the job, and its statement timeout, lasts until the client
    /// has taken it, as for a long result); `must_stop` is asked every few milliseconds while
    /// waiting. Told to stop before the client took a large chunk, the body is cut.
    pub(crate) fn send(&self, chunk: Bytes, must_stop: impl Fn() -> bool) -> Result<(), SendError> {
        let mut state = self.shared.lock();
        let mut chunk = Some(chunk);
        loop {
            if state.receiver_gone || state.abandoned {
                return Err(SendError::Gone);
            }
            if chunk.is_some() && state.queue.len() < self.capacity {
                if let Some(chunk) = chunk.take() {
                    state.queue.push_back(chunk);
                }
                state.sent_any = true;
                if let Some(waker) = state.waker.take() {
                    waker.wake();
                }
            }
            if chunk.is_none() && state.taken() {
                return Ok(());
            }
            if must_stop() {
                if chunk.is_none() {
                    state.cut_untaken();
                }
                return Err(SendError::Stopped);
            }
            state.blocked = true;
            state = self
                .shared
                .room
                .wait_timeout(state, STOP_CHECK)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            state.blocked = false;
        }
    }

    /// Queues `chunk` as [`ChunkSender::send`] does, for a producer on the async runtime (the
    /// PostgreSQL engine): it waits for room without blocking a thread. `must_stop` is asked
    /// whenever it is woken without room.
    pub(crate) async fn send_async(
        &self,
        chunk: Bytes,
        must_stop: impl Fn() -> bool,
    ) -> Result<(), SendError> {
        let mut chunk = Some(chunk);
        std::future::poll_fn(|cx| {
            let mut state = self.shared.lock();
            if state.receiver_gone || state.abandoned {
                return Poll::Ready(Err(SendError::Gone));
            }
            if chunk.is_some() && state.queue.len() < self.capacity {
                if let Some(chunk) = chunk.take() {
                    state.queue.push_back(chunk);
                    state.sent_any = true;
                }
                if let Some(waker) = state.waker.take() {
                    waker.wake();
                }
            }
            if chunk.is_none() && state.taken() {
                return Poll::Ready(Ok(()));
            }
            if must_stop() {
                if chunk.is_none() {
                    state.cut_untaken();
                }
                return Poll::Ready(Err(SendError::Stopped));
            }
            state.room_waker = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Queues the body's last bytes, past the queue's bound if need be (they are small: the
    /// statement's effect or its error), and ends the body cleanly.
    pub(crate) fn finish(self, last: Bytes) {
        let mut state = self.shared.lock();
        if state.abandoned {
            // The body already ended with the give-up's error.
            return;
        }
        if !last.is_empty() {
            state.queue.push_back(last);
        }
        state.finished = true;
        // Drop wakes the receiver.
    }

    /// Whether the receiver is gone (or the job was given up: nobody reads on).
    pub(crate) fn is_gone(&self) -> bool {
        let state = self.shared.lock();
        state.receiver_gone || state.abandoned
    }

    /// A handle that ends the body for a job given up while its statement still runs.
    pub(crate) fn abandon_handle(&self) -> Abandon {
        Abandon {
            shared: Arc::clone(&self.shared),
        }
    }
}

/// Ends a body whose producer is stuck: see [`Abandon::abandon`].
#[derive(Debug)]
pub(crate) struct Abandon {
    shared: Arc<Shared>,
}

impl Abandon {
    /// The job was given up with `err`: a body that streams ends at once with `err` as its
    /// `"error"` member (every chunk ends after a whole row, so the tail closes the rows), one
    /// that has not started never does (its requester is answered `err` instead); whatever the
    /// producer sends later is dropped. Does nothing to a body that has ended.
    pub(crate) fn abandon(&self, err: &ApiError) {
        let mut state = self.shared.lock();
        if state.finished || state.receiver_gone || state.abandoned {
            return;
        }
        state.abandoned = true;
        if state.sent_any {
            let mut tail = Vec::new();
            result::error_tail(&mut tail, err);
            state.queue.push_back(Bytes::from(tail));
            state.finished = true;
        } else {
            state.sender_gone = true;
        }
        let waker = state.waker.take();
        self.shared.room_made(state, waker);
    }
}

impl Drop for ChunkSender {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.sender_gone = true;
        if let Some(waker) = state.waker.take() {
            waker.wake();
        }
    }
}

/// What the first look at a body found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// At least one chunk is queued: the body streams.
    Streaming,
    /// The producer ended without sending anything: its job returned the whole outcome.
    Nothing,
}

/// The HTTP body's end: a `Stream` of chunks that fails if the producer stops without finishing.
pub(crate) struct ChunkReceiver {
    shared: Arc<Shared>,
    /// Dropped with the body: cancels the job when the client goes away.
    guard: Option<Box<dyn Send + Sync>>,
    failed: bool,
}

impl std::fmt::Debug for ChunkReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkReceiver").finish_non_exhaustive()
    }
}

impl ChunkReceiver {
    /// Waits until the producer has queued a chunk or has ended without one.
    pub(crate) async fn start(&mut self) -> Start {
        std::future::poll_fn(|cx| {
            let mut state = self.shared.lock();
            if !state.queue.is_empty() {
                Poll::Ready(Start::Streaming)
            } else if state.sender_gone {
                Poll::Ready(Start::Nothing)
            } else {
                state.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }

    /// Keeps `guard` until the body is dropped.
    pub(crate) fn hold(&mut self, guard: impl Send + Sync + 'static) {
        self.guard = Some(Box::new(guard));
    }
}

impl Drop for ChunkReceiver {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.receiver_gone = true;
        state.queue.clear();
        self.shared.room_made(state, None);
    }
}

/// The body was cut: the producer stopped before the body's end (a panic, a lost job).
fn cut() -> std::io::Error {
    std::io::Error::other("the result stream ended before its last byte")
}

impl futures_core::Stream for ChunkReceiver {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.failed {
            return Poll::Ready(None);
        }
        let mut state = this.shared.lock();
        let piece = match state.queue.front_mut() {
            Some(large) if large.len() > SPLIT_ABOVE => {
                let piece = Bytes::copy_from_slice(&large[..CHUNK_BYTES]);
                bytes::Buf::advance(large, CHUNK_BYTES);
                if large.len() <= QUEUE_BYTES && large.len() + CHUNK_BYTES > QUEUE_BYTES {
                    // The rest just became small enough to wait (its sender goes on now): free
                    // the large chunk's memory.
                    *large = Bytes::copy_from_slice(large);
                }
                Some(piece)
            }
            _ => state.queue.pop_front(),
        };
        if let Some(chunk) = piece {
            this.shared.room_made(state, None);
            return Poll::Ready(Some(Ok(chunk)));
        }
        if state.finished {
            return Poll::Ready(None);
        }
        if state.sender_gone {
            drop(state);
            this.failed = true;
            return Poll::Ready(Some(Err(cut())));
        }
        state.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// Where a row writer hands its output after each row: kept whole up to a limit, or cut into
/// chunks and sent on while the statement runs. The SQLite engine calls it from an engine
/// thread ([`Sink::after_row_blocking`]), the PostgreSQL engine from a task ([`Sink::after_row`]).
pub(crate) enum Sink<'a> {
    /// Keeps the whole body, up to `--max-result-bytes`, growing the buffered job's share of
    /// the server's budget as it grows (`engine::grow`).
    Buffered {
        /// The largest body kept.
        limit: usize,
    },
    /// Sends the body on in chunks as it grows.
    Stream(Chunks<'a>),
}

impl Sink<'_> {
    /// After row number `rows` (from 1) was written (`out` ends after a whole row), on an
    /// engine thread: a chunk that is due is sent, blocking while the queue is full.
    pub(crate) fn after_row_blocking(
        &mut self,
        out: &mut Vec<u8>,
        rows: u64,
    ) -> Result<(), ApiError> {
        match self {
            Sink::Buffered { limit } => {
                result::within_buffered_limit(out.len(), *limit, rows)?;
                crate::engine::grow(out.len())
            }
            Sink::Stream(chunks) => match chunks.due(out, rows) {
                Some(chunk) => chunks
                    .sender
                    .send(chunk, chunks.must_stop)
                    // Gone or told to stop: either way the statement stops, and the engine (or
                    // the streamed error tail) says why.
                    .map_err(|_: SendError| ApiError::interrupted()),
                None => Ok(()),
            },
        }
    }

    /// [`Sink::after_row_blocking`] for a task: waits for room in the queue without blocking
    /// a thread.
    pub(crate) async fn after_row(&mut self, out: &mut Vec<u8>, rows: u64) -> Result<(), ApiError> {
        match self {
            Sink::Buffered { limit } => {
                result::within_buffered_limit(out.len(), *limit, rows)?;
                crate::engine::grow(out.len())
            }
            Sink::Stream(chunks) => match chunks.due(out, rows) {
                Some(chunk) => chunks
                    .sender
                    .send_async(chunk, chunks.must_stop)
                    .await
                    .map_err(|_: SendError| ApiError::interrupted()),
                None => Ok(()),
            },
        }
    }

    /// Whether a chunk was sent (the response has started): a failure from now on is written
    /// into the body.
    pub(crate) fn started(&self) -> bool {
        matches!(self, Sink::Stream(chunks) if chunks.started)
    }
}

/// The chunk cutter: hands the rows written so far to the HTTP body once they reach
/// [`CHUNK_BYTES`], or once [`FLUSH_AFTER`] has passed (so a slow statement's first rows reach
/// the client without waiting for a whole chunk).
pub(crate) struct Chunks<'a> {
    sender: &'a ChunkSender,
    must_stop: &'a (dyn Fn() -> bool + Sync),
    started: bool,
    last_flush: Instant,
}

impl<'a> Chunks<'a> {
    /// Sends through `sender`; `must_stop` says when the job must stop (its requester went
    /// away, its deadline passed, the engine closes).
    pub(crate) fn new(sender: &'a ChunkSender, must_stop: &'a (dyn Fn() -> bool + Sync)) -> Self {
        Chunks {
            sender,
            must_stop,
            started: false,
            last_flush: Instant::now(),
        }
    }

    /// The chunk to send after row `rows`, taken out of `out`, when one is due.
    fn due(&mut self, out: &mut Vec<u8>, rows: u64) -> Option<Bytes> {
        // The clock is read every 64 rows: cheap, and often enough for a slow statement.
        if out.len() >= CHUNK_BYTES
            || (rows.is_multiple_of(64) && self.last_flush.elapsed() >= FLUSH_AFTER)
        {
            self.started = true;
            self.last_flush = Instant::now();
            return Some(Bytes::from(std::mem::replace(
                out,
                Vec::with_capacity(CHUNK_BYTES + 1024),
            )));
        }
        None
    }
}

#[cfg(test)]
mod tests;
