//! [`CuttableStream`]: a connection's stream that fails every read and write once the server
//! cuts it (shutdown past its grace) or once its client stops taking bytes for the send timeout.
//!
//! Knows tokio's I/O traits and the cancellation token; nothing about HTTP.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;
use tokio_util::sync::WaitForCancellationFutureOwned;

/// A connection that fails every read and write once the server's cut token is cancelled, or
/// once a write has made no progress for the send timeout (the client reads nothing), so the
/// HTTP connection task ends and the response it was sending is dropped.
pub(super) struct CuttableStream<S> {
    pub(super) inner: S,
    pub(super) cut: Pin<Box<WaitForCancellationFutureOwned>>,
    pub(super) is_cut: bool,
    pub(super) send_timeout: Duration,
    /// Running while a write waits for the client to take bytes.
    pub(super) stalled: Option<Pin<Box<Sleep>>>,
    /// Since when writes have been waiting on the client, with what it took meanwhile: a
    /// client that takes less than [`MIN_SEND_BYTES`] per send timeout while the server waits
    /// on it is cut too (a trickle would otherwise hold its answer, and its share of the
    /// server's budget, for hours).
    pub(super) slow_since: Option<(tokio::time::Instant, usize)>,
}

/// What a client must take per send timeout while the server's writes wait on it.
pub(super) const MIN_SEND_BYTES: usize = 64 * 1024;

impl<S: Unpin> CuttableStream<S> {
    /// Passes a write's poll through, timing how long it makes no progress.
    pub(super) fn timed<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(Pin<&mut S>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match poll(Pin::new(&mut self.inner), cx) {
            Poll::Ready(result) => {
                self.stalled = None;
                Poll::Ready(result)
            }
            Poll::Pending => {
                let timeout = self.send_timeout;
                let now = tokio::time::Instant::now();
                let (since, taken) = *self.slow_since.get_or_insert((now, 0));
                if now.duration_since(since) >= timeout {
                    if taken < MIN_SEND_BYTES {
                        tracing::debug!(taken, "the client takes too little; closing");
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "the client read too little for the send timeout",
                        )));
                    }
                    self.slow_since = Some((now, 0));
                }
                let stalled = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if stalled.as_mut().poll(cx).is_ready() {
                    tracing::debug!("the client took nothing for the send timeout; closing");
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client read nothing for the send timeout",
                    )));
                }
                Poll::Pending
            }
        }
    }

    /// Counts what the client took while the server waits on it.
    pub(super) fn took(&mut self, written: &Poll<io::Result<usize>>) {
        if let (Poll::Ready(Ok(n)), Some((_, taken))) = (written, &mut self.slow_since) {
            *taken += n;
        }
    }

    pub(super) fn check_cut(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if !self.is_cut && self.cut.as_mut().poll(cx).is_ready() {
            self.is_cut = true;
        }
        if self.is_cut {
            Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the server is shutting down",
            ))
        } else {
            Ok(())
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for CuttableStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check_cut(cx)?;
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for CuttableStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check_cut(cx)?;
        let written = self.timed(cx, |inner, cx| inner.poll_write(cx, buf));
        self.took(&written);
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check_cut(cx)?;
        let flushed = self.timed(cx, |inner, cx| inner.poll_flush(cx));
        if let Poll::Ready(Ok(())) = flushed {
            // Everything is written: the server no longer waits on the client.
            self.slow_since = None;
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check_cut(cx)?;
        let written = self.timed(cx, |inner, cx| inner.poll_write_vectored(cx, bufs));
        self.took(&written);
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
