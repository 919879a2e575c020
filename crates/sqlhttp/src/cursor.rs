//! Rows as they arrive: [`RowStream`], the typed stream [`Query::fetch`](crate::Query::fetch)
//! returns, and the two receivers the transport fills while a call may still be retried —
//! [`Collect`] (every row, for `fetch_all`, `query_table` and `execute`) and [`First`] (a stream's
//! first row, for `fetch`, `fetch_one` and `fetch_optional`).
//!
//! Every one decodes through the same incremental [`Decoder`], so a buffered call and a stream
//! read rows alike, and take the bookmark a body names at its end alike: a receiver hands it to
//! the transport, a stream merges it into the client's session when it reaches the end. A stream
//! of a transaction's statement may hold a [`Reread`]: when its body is cut short, it asks for
//! the statement's stored result again and skips the rows it already gave (ADR 0047). This
//! module knows the transport's body and receiver seam; it does not know retry rules, HTTP, or
//! transactions.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::bookmark::{Bookmark, Session};
use crate::error::{AttemptFailure, Error, ErrorKind, Result};
use crate::response::Failure;
use crate::table::Column;
use crate::transport::{Body, Delivered, Receive, cancelled, with_timeout};
use crate::wire::envelope::{Decoder, Step};

/// Takes every row: served at the body's end.
pub(crate) struct Collect<T> {
    pub(crate) decoder: Decoder<'static, T>,
    pub(crate) rows: Vec<T>,
}

impl<T: DeserializeOwned> Collect<T> {
    pub(crate) fn new() -> Self {
        Self {
            decoder: Decoder::new(),
            rows: Vec::new(),
        }
    }
}

impl<T: DeserializeOwned + Send> Receive for Collect<T> {
    fn reset(&mut self) {
        self.decoder.reset();
        self.rows.clear();
    }

    fn take(&mut self, piece: Option<&[u8]>) -> Result<bool, Failure> {
        match piece {
            Some(piece) => self.decoder.push(piece),
            None => self.decoder.finish(),
        }
        match self.decoder.drain_into(&mut self.rows)? {
            Step::NeedMore => Ok(false),
            Step::End => Ok(true),
            Step::Row(()) => unreachable!("drain_into gives rows to the vector"),
        }
    }

    fn bookmark(&self) -> Option<Bookmark> {
        self.decoder.bookmark()
    }
}

impl Collect<Vec<crate::value::Value>> {
    /// The rows with their columns, effect and stats, once the body has been served by a call
    /// of `attempts` attempts.
    pub(crate) fn into_table(self, attempts: u32) -> crate::table::Table {
        let columns = self.decoder.columns().unwrap_or_default().to_vec();
        let effect = self.decoder.effect();
        crate::table::Table::new(
            columns,
            self.rows,
            effect.rows_affected.unwrap_or(0),
            effect.last_insert_id,
            crate::stats::Stats::from_wire(self.decoder.stats().as_ref(), attempts),
        )
    }
}

/// Takes the whole body as bytes (a batch's answer, decoded once complete): served at its end.
#[derive(Default)]
pub(crate) struct Whole(pub(crate) Vec<u8>);

impl Receive for Whole {
    fn reset(&mut self) {
        self.0.clear();
    }

    fn take(&mut self, piece: Option<&[u8]>) -> Result<bool, Failure> {
        match piece {
            Some(piece) => {
                self.0.extend_from_slice(piece);
                Ok(false)
            }
            None => Ok(true),
        }
    }
}

/// Takes the first row (or the end of a result without rows): served as soon as it is decoded.
pub(crate) struct First<T> {
    decoder: Decoder<'static, T>,
    first: Option<T>,
    ended: bool,
}

impl<T: DeserializeOwned> First<T> {
    pub(crate) fn new() -> Self {
        Self {
            decoder: Decoder::new(),
            first: None,
            ended: false,
        }
    }
}

/// Takes the first piece of a body read again, whatever it holds: the stream decodes it.
#[derive(Default)]
struct Stash(Vec<u8>);

impl Receive for Stash {
    fn reset(&mut self) {
        self.0.clear();
    }

    fn take(&mut self, piece: Option<&[u8]>) -> Result<bool, Failure> {
        if let Some(piece) = piece {
            self.0.extend_from_slice(piece);
        }
        Ok(true)
    }
}

/// Sends a statement whose result the server kept again, so a stream cut short can read the
/// rest of it: the answer goes to `receiver` as the first call's did.
pub(crate) trait Reread: Send + Sync {
    fn reread<'a>(
        &'a self,
        receiver: &'a mut dyn Receive,
    ) -> Pin<Box<dyn Future<Output = Result<Delivered>> + Send + 'a>>;
}

/// How many times one stream reads its result again before it gives up.
const MAX_REREADS: u32 = 3;

impl<T: DeserializeOwned + Send> Receive for First<T> {
    fn reset(&mut self) {
        self.decoder.reset();
        self.first = None;
        self.ended = false;
    }

    fn take(&mut self, piece: Option<&[u8]>) -> Result<bool, Failure> {
        match piece {
            Some(piece) => self.decoder.push(piece),
            None => self.decoder.finish(),
        }
        match self.decoder.next()? {
            Step::Row(row) => {
                self.first = Some(row);
                Ok(true)
            }
            Step::NeedMore => Ok(false),
            Step::End => {
                self.ended = true;
                Ok(true)
            }
        }
    }

    fn bookmark(&self) -> Option<Bookmark> {
        self.decoder.bookmark()
    }
}

/// How much of the body [`RowStream::close`] reads past the rows it was asked for before it gives
/// up on reusing the connection.
const DRAIN_LIMIT: usize = 64 * 1024;

type ReadFuture = Pin<Box<dyn Future<Output = (Body, Result<Option<Bytes>, Failure>)> + Send>>;

/// A stream's result read again: its first piece, and the rest of the body.
type RereadFuture = Pin<Box<dyn Future<Output = Result<(Vec<u8>, Delivered)>> + Send>>;

/// The rows of a query, decoded one at a time as the response body arrives, made by
/// [`Query::fetch`](crate::Query::fetch) (or by [`Execute::fetch`](crate::Execute::fetch) for
/// the rows a statement run for its effect returns).
///
/// Memory stays at one partial row and one piece of the body, whatever the result's size. Read it
/// with [`try_next`](Self::try_next), or as a [`Stream`](futures_core::Stream) of `Result<T>`.
/// A query was retried as a read until the first row arrived (an `execute` never is); after that
/// a failure ends the stream with an error and is never retried (rows would repeat). A body cut short, or one the
/// server ends with an error (a statement timeout, an engine error at row N), yields that error and
/// never a clean end. The call's `timeout` bounds each stall of the body, not the whole download.
/// Dropping the stream closes its connection, which stops the statement on the server.
///
/// In a [`Transaction`](crate::Transaction) the statement has run whole before its first row
/// arrives, and the server keeps its result: a body cut short (a lost connection, a stall) is
/// read again under the statement's number, past the rows already given, each row still given
/// once; once a later statement of the transaction has been sent, the stream ends with an error
/// instead (ADR 0047).
///
/// ```no_run
/// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
/// use serde::Deserialize;
///
/// #[derive(Deserialize)]
/// struct Event { id: i64, kind: String }
///
/// let mut events = client.query("SELECT id, kind FROM events ORDER BY id").fetch::<Event>().await?;
/// println!("{} columns", events.columns().len());
/// while let Some(event) = events.try_next().await? {
///     println!("{} {}", event.id, event.kind);
/// }
/// # Ok(())
/// # }
/// ```
#[must_use = "a stream does nothing unless it is read"]
pub struct RowStream<T> {
    state: State<T>,
}

/// The request that starts a stream: it resolves once the first row (or the end) has arrived.
type Starting<T> = Pin<Box<dyn Future<Output = Result<Box<Started<T>>>> + Send>>;

enum State<T> {
    /// The request has not answered yet (or not been polled).
    Starting(Starting<T>),
    Started(Box<Started<T>>),
    /// Starting failed; the error was handed over.
    Failed,
}

/// A stream whose request has answered: the body, decoded as it arrives.
struct Started<T> {
    decoder: Decoder<'static, T>,
    first: Option<T>,
    body: Option<Body>,
    reading: Option<ReadFuture>,
    stall: Option<Duration>,
    cancel: [Option<CancellationToken>; 2],
    attempts: u32,
    history: Vec<AttemptFailure>,
    /// The client's bookmark session, which takes the bookmark the body names at its end.
    session: Arc<Session>,
    /// Whether the call may write: a body it ends with `OUTCOME_UNKNOWN` leaves that unknown.
    may_write: bool,
    done: bool,
    /// The body ended, every row given, without an error.
    ended_cleanly: bool,
    /// The server's id for the request that answered (`X-Request-Id`).
    request_id: Option<Box<str>>,
    /// How to read the result again when the body is cut short (a transaction's statement).
    reread: Option<Arc<dyn Reread>>,
    rereads: u32,
    rereading: Option<RereadFuture>,
    /// Rows of a result read again to decode and drop: the ones the stream already gave.
    skip: usize,
}

// No field is ever pinned: the request and the read in flight are boxed, and `T`s are only moved
// in and out.
impl<T> Unpin for RowStream<T> {}

impl<T> fmt::Debug for RowStream<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("RowStream");
        match &self.state {
            State::Starting(_) => debug.field("started", &false),
            State::Started(started) => debug
                .field("rows", &started.decoder.rows_given())
                .field("done", &started.done),
            State::Failed => debug.field("failed", &true),
        }
        .finish_non_exhaustive()
    }
}

impl<T: DeserializeOwned + Send + 'static> RowStream<T> {
    /// A stream whose request `start` sends when the stream is first read or awaited.
    pub(crate) fn starting(
        start: impl Future<Output = Result<RowStream<T>>> + Send + 'static,
    ) -> Self {
        let start = async move {
            match start.await?.state {
                State::Started(started) => Ok(started),
                State::Starting(starting) => starting.await,
                State::Failed => Err(Error::new(ErrorKind::Cancelled)),
            }
        };
        RowStream {
            state: State::Starting(Box::pin(start)),
        }
    }
}

impl<T: DeserializeOwned + Send + 'static> std::future::IntoFuture for RowStream<T> {
    type Output = Result<RowStream<T>>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<RowStream<T>>> + Send>>;

    /// Sends the request and waits for its first row (or its end), so that
    /// [`columns`](RowStream::columns) are known; failures up to then are retried as the call's
    /// class allows and come back here.
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            match self.state {
                State::Starting(starting) => Ok(RowStream {
                    state: State::Started(starting.await?),
                }),
                state => Ok(RowStream { state }),
            }
        })
    }
}

impl<T: DeserializeOwned> RowStream<T> {
    pub(crate) fn new(first: First<T>, delivered: Delivered) -> Self {
        RowStream {
            state: State::Started(Box::new(Started::new(first, delivered))),
        }
    }

    /// Lets the stream read its result again through `reread` when its body is cut short.
    pub(crate) fn rereading(mut self, reread: Option<Box<dyn Reread>>) -> Self {
        if let State::Started(started) = &mut self.state {
            started.reread = reread.map(Arc::from);
        }
        self
    }

    /// The result's columns, with their declared types: known once the first row (or the end)
    /// has arrived, that is after the first [`try_next`](Self::try_next) or once the stream has
    /// been awaited; empty before.
    pub fn columns(&self) -> &[Column] {
        match &self.state {
            State::Started(started) => started.decoder.columns().unwrap_or_default(),
            State::Starting(_) | State::Failed => &[],
        }
    }

    /// How many rows the statement changed (the body's `rows_affected`), once the stream has
    /// ended cleanly (after [`try_next`](Self::try_next) gave `None`); `None` before, or when
    /// the result ended with an error. A read changes none: `Some(0)`.
    pub fn rows_affected(&self) -> Option<u64> {
        match &self.state {
            State::Started(started) => started.decoder.effect().rows_affected,
            State::Starting(_) | State::Failed => None,
        }
    }

    /// What the call cost, once the stream has ended cleanly (after [`try_next`](Self::try_next)
    /// gave `None`): the server's figures from the body's end (`None` each when the server does
    /// not report them) and the attempts the call took (a re-read of a transaction's cut stream
    /// included). `None` before the end, or when the result ended with an error.
    pub fn stats(&self) -> Option<crate::stats::Stats> {
        match &self.state {
            State::Started(started) if started.done && started.ended_cleanly => Some(
                crate::stats::Stats::from_wire(started.decoder.stats().as_ref(), started.attempts),
            ),
            _ => None,
        }
    }

    /// The server's id for the request that answered (its `X-Request-Id`, to find the call in
    /// the server's log), once the stream has started; `None` before, or when the server gave
    /// none.
    pub fn request_id(&self) -> Option<&str> {
        match &self.state {
            State::Started(started) => started.request_id.as_deref(),
            State::Starting(_) | State::Failed => None,
        }
    }

    /// The next row, or `None` after the last one. The first call sends the request if the stream
    /// was not awaited.
    ///
    /// # Errors
    ///
    /// Any failure of the call before the first row (retried first as the call's class allows);
    /// then [`ErrorKind::Decode`] naming the row and column when a row is not a `T`; the server's
    /// error when it ended the result with one (for instance [`ErrorKind::StatementTimeout`] or
    /// [`ErrorKind::Sql`]); [`ErrorKind::Connection`] when the body was cut short;
    /// [`ErrorKind::Timeout`] when no byte arrived for the call's `timeout`;
    /// [`ErrorKind::Cancelled`]. The stream ends after an error.
    pub async fn try_next(&mut self) -> Result<Option<T>> {
        std::future::poll_fn(|cx| self.poll_row(cx))
            .await
            .transpose()
    }

    /// Reads the rest of a small body so its connection can be reused, or drops it.
    pub(crate) async fn close(self) {
        if let State::Started(started) = self.state {
            started.close().await;
        }
    }

    /// Gives an error raised after the exchange the call's attempt count and history.
    pub(crate) fn attach(&self, err: Error) -> Error {
        match &self.state {
            State::Started(started) => started.attach(err),
            State::Starting(_) | State::Failed => err,
        }
    }

    fn poll_row(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<T>>> {
        loop {
            match &mut self.state {
                State::Started(started) => return started.poll_row(cx),
                State::Failed => return Poll::Ready(None),
                State::Starting(starting) => match starting.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(started)) => self.state = State::Started(started),
                    Poll::Ready(Err(err)) => {
                        self.state = State::Failed;
                        return Poll::Ready(Some(Err(err)));
                    }
                },
            }
        }
    }
}

impl<T: DeserializeOwned> Started<T> {
    fn new(first: First<T>, delivered: Delivered) -> Self {
        let First {
            decoder,
            first,
            ended,
        } = first;
        let Delivered {
            body,
            attempts,
            history,
            stall,
            cancel,
            session,
            may_write,
        } = delivered;
        Self {
            request_id: body.request_id().map(Box::from),
            decoder,
            first,
            body: (!ended).then_some(body),
            reading: None,
            stall,
            cancel,
            attempts,
            history,
            session,
            may_write,
            done: false,
            ended_cleanly: false,
            reread: None,
            rereads: 0,
            rereading: None,
            skip: 0,
        }
    }

    /// Reads the rest of a small body so its connection can be reused, or drops it.
    /// The rest is decoded as it is read (and dropped), so that a bookmark the body names at its
    /// end is taken.
    async fn close(mut self) {
        let Some(mut body) = self.body.take() else {
            return;
        };
        let mut read = 0;
        while read <= DRAIN_LIMIT {
            match with_timeout(self.stall, body.chunk()).await {
                Ok(Some(piece)) => {
                    read += piece.len();
                    self.decoder.push(&piece);
                    if !self.skip_rows() {
                        return;
                    }
                }
                Ok(None) => {
                    self.decoder.finish();
                    self.skip_rows();
                    return;
                }
                Err(_) => return,
            }
        }
    }

    /// Decodes and drops the rows the bytes read so far hold; at the body's end, takes its
    /// bookmark. `false` once nothing more can be read (the end, or a body that is not a result).
    fn skip_rows(&mut self) -> bool {
        loop {
            match self.decoder.next() {
                Ok(Step::Row(_)) => {}
                Ok(Step::NeedMore) => return true,
                Ok(Step::End) => {
                    if let Some(bookmark) = self.decoder.bookmark() {
                        self.session.observe(bookmark);
                    }
                    return false;
                }
                Err(_) => return false,
            }
        }
    }

    /// Gives an error raised after the exchange the call's attempt count and history.
    fn attach(&self, err: Error) -> Error {
        err.with_attempts(self.attempts, self.history.clone())
            .with_sent(true, false)
    }

    fn fail(&mut self, err: Error) -> Poll<Option<Result<T>>> {
        self.done = true;
        self.body = None;
        self.reading = None;
        // A write that streamed its rows and then could not learn whether it committed.
        let outcome_unknown =
            self.may_write && matches!(err.kind(), ErrorKind::OutcomeUnknown { .. });
        let err = err
            .with_attempts(self.attempts, self.history.clone())
            .with_sent(true, outcome_unknown);
        Poll::Ready(Some(Err(err)))
    }

    fn poll_row(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<T>>> {
        if let Some(rereading) = self.rereading.as_mut() {
            match rereading.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok((piece, delivered))) => {
                    self.rereading = None;
                    // The result from its start: the rows already given are decoded again and
                    // dropped (the server sends the one result it kept, byte for byte). A re-read
                    // cut while it was still skipping decoded fewer rows than were given: the
                    // count to skip never shrinks.
                    self.skip = self.skip.max(self.decoder.rows_given());
                    self.decoder = Decoder::new();
                    self.decoder.push(&piece);
                    self.request_id = delivered.body.request_id().map(Box::from);
                    self.body = Some(delivered.body);
                    self.attempts += delivered.attempts;
                    self.history.extend(delivered.history);
                }
                Poll::Ready(Err(err)) => {
                    self.rereading = None;
                    return self.fail(err);
                }
            }
        }
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(first)));
        }
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            match self.decoder.next() {
                Ok(Step::Row(_)) if self.decoder.rows_given() <= self.skip => continue,
                Ok(Step::Row(row)) => return Poll::Ready(Some(Ok(row))),
                Ok(Step::End) if self.decoder.rows_given() < self.skip => {
                    let given = self.skip;
                    return self.fail(Error::new(ErrorKind::Decode {
                        row: None,
                        column: None,
                        message: format!(
                            "the statement's result read again after a lost answer has {} rows, \
                             fewer than the {given} already given",
                            self.decoder.rows_given()
                        ),
                    }));
                }
                Ok(Step::End) => {
                    self.done = true;
                    self.ended_cleanly = true;
                    self.body = None;
                    // A write that committed after its headers were sent names its bookmark
                    // here, at the end of the body.
                    if let Some(bookmark) = self.decoder.bookmark() {
                        self.session.observe(bookmark);
                    }
                    return Poll::Ready(None);
                }
                Ok(Step::NeedMore) => {}
                Err(err) => return self.fail(err),
            }
            if self.reading.is_none() {
                let Some(mut body) = self.body.take() else {
                    // The body ended: the decoder was told, so it cannot need more.
                    self.decoder.finish();
                    continue;
                };
                let stall = self.stall;
                let [call, client] = self.cancel.clone();
                self.reading = Some(Box::pin(async move {
                    let read = tokio::select! {
                        biased;
                        () = cancelled(call.as_ref(), client.as_ref()) => Err(Failure::from(ErrorKind::Cancelled)),
                        read = with_timeout(stall, body.chunk()) => read,
                    };
                    (body, read)
                }));
            }
            let Some(reading) = self.reading.as_mut() else {
                continue;
            };
            let (body, read) = match reading.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(done) => done,
            };
            self.reading = None;
            match read {
                Ok(Some(piece)) => {
                    self.body = Some(body);
                    self.decoder.push(&piece);
                }
                Ok(None) => self.decoder.finish(),
                Err(failure) => {
                    let Failure { kind, source, .. } = failure;
                    let err = Error::new(kind).with_boxed_source(source);
                    if let Some(reread) = self.reread.clone()
                        && self.rereads < MAX_REREADS
                        && (err.is_connection() || err.is_timeout())
                    {
                        // The result is kept whole on the server: read it again, past the
                        // rows already given.
                        self.rereads += 1;
                        tracing::info!(rows = self.decoder.rows_given(), error = %err, "a streamed statement's answer was cut short; reading its stored result again");
                        self.rereading = Some(Box::pin(async move {
                            let mut stash = Stash::default();
                            let delivered = reread.reread(&mut stash).await?;
                            Ok((stash.0, delivered))
                        }));
                        return self.poll_row(cx);
                    }
                    return self.fail(err);
                }
            }
        }
    }
}

impl<T: DeserializeOwned> futures_core::Stream for RowStream<T> {
    type Item = Result<T>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<T>>> {
        self.get_mut().poll_row(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    /// A stream whose first row was handed over: a later stall past `timeout` ends it with a
    /// timeout error (no retry: the transport is done with it), and then it ends.
    #[tokio::test(start_paused = true)]
    async fn a_stall_after_the_first_row_ends_the_stream_with_a_timeout() {
        let mut first = First::<i64>::new();
        let head = br#"{"columns":[{"name":"n","type":""}],"rows":[[1],"#;
        assert!(
            first.take(Some(head)).unwrap(),
            "the first row serves the call"
        );
        let delivered = Delivered {
            body: Body::scripted([
                (ms(900), Bytes::from_static(b"[2],")),
                (ms(5_000), Bytes::from_static(b"[3]],\"rows_affected\":0}")),
            ]),
            attempts: 1,
            history: Vec::new(),
            stall: Some(ms(1_000)),
            cancel: [None, None],
            session: Arc::default(),
            may_write: false,
        };
        let mut rows = RowStream::new(first, delivered);
        assert_eq!(rows.columns()[0].name(), "n");
        assert_eq!(rows.try_next().await.unwrap(), Some(1));
        let started = tokio::time::Instant::now();
        assert_eq!(rows.try_next().await.unwrap(), Some(2));
        let err = rows.try_next().await.unwrap_err();
        assert!(err.is_timeout(), "{err:?}");
        assert_eq!(err.attempts(), 1);
        assert_eq!(started.elapsed(), ms(1_900));
        assert_eq!(rows.try_next().await.unwrap(), None);
    }

    /// A streamed write names its bookmark at the end of its body: the session takes it when the
    /// stream reaches the end, not before.
    #[tokio::test(start_paused = true)]
    async fn a_stream_takes_the_bookmark_its_body_ends_with() {
        let mut first = First::<i64>::new();
        assert!(
            first
                .take(Some(br#"{"columns":[{"name":"n","type":""}],"rows":[[1]"#))
                .unwrap()
        );
        let session = Arc::new(Session::new(Some("0000000000000010".parse().unwrap())));
        let delivered = Delivered {
            body: Body::scripted([
                (ms(10), Bytes::from_static(b",[2]],\"rows_affected\":2,")),
                (
                    ms(10),
                    Bytes::from_static(b"\"last_insert_id\":2,\"bookmark\":\"00000000016b3a28\"}"),
                ),
            ]),
            attempts: 1,
            history: Vec::new(),
            stall: None,
            cancel: [None, None],
            session: Arc::clone(&session),
            may_write: true,
        };
        let mut rows = RowStream::new(first, delivered);
        assert_eq!(rows.try_next().await.unwrap(), Some(1));
        assert_eq!(rows.try_next().await.unwrap(), Some(2));
        assert_eq!(
            session.get().map(|b| b.to_string()).as_deref(),
            Some("0000000000000010"),
            "not before the end"
        );
        assert_eq!(rows.try_next().await.unwrap(), None);
        assert_eq!(
            session.get().map(|b| b.to_string()).as_deref(),
            Some("00000000016b3a28")
        );
    }

    /// A streamed write that cannot learn whether it committed says so.
    #[tokio::test(start_paused = true)]
    async fn a_streamed_write_ending_on_outcome_unknown_says_so() {
        for may_write in [true, false] {
            let mut first = First::<i64>::new();
            assert!(
                first
                    .take(Some(br#"{"columns":[{"name":"n","type":""}],"rows":[[1]"#))
                    .unwrap()
            );
            let delivered = Delivered {
                body: Body::scripted([(
                    ms(10),
                    Bytes::from_static(
                        b"],\"error\":{\"code\":\"OUTCOME_UNKNOWN\",\"message\":\"m\"}}",
                    ),
                )]),
                attempts: 1,
                history: Vec::new(),
                stall: None,
                cancel: [None, None],
                session: Arc::default(),
                may_write,
            };
            let mut rows = RowStream::new(first, delivered);
            assert_eq!(rows.try_next().await.unwrap(), Some(1));
            let err = rows.try_next().await.unwrap_err();
            assert!(
                matches!(err.kind(), ErrorKind::OutcomeUnknown { .. }),
                "{err:?}"
            );
            assert_eq!(err.is_outcome_unknown(), may_write, "{err:?}");
        }
    }

    /// A body that trickles in slowly but steadily streams to its end.
    #[tokio::test(start_paused = true)]
    async fn a_slow_steady_stream_is_not_cut() {
        let mut first = First::<i64>::new();
        assert!(
            first
                .take(Some(br#"{"columns":[{"name":"n","type":""}],"rows":[[0]"#))
                .unwrap()
        );
        let pieces = (1..=20)
            .map(|n| (ms(900), Bytes::from(format!(",[{n}]"))))
            .chain([(ms(900), Bytes::from_static(b"],\"rows_affected\":0}"))]);
        let delivered = Delivered {
            body: Body::scripted(pieces),
            attempts: 1,
            history: Vec::new(),
            stall: Some(ms(1_000)),
            cancel: [None, None],
            session: Arc::default(),
            may_write: false,
        };
        let mut rows = RowStream::new(first, delivered);
        let mut got = Vec::new();
        while let Some(n) = rows.try_next().await.unwrap() {
            got.push(n);
        }
        assert_eq!(got, (0..=20).collect::<Vec<i64>>());
    }
}
