//! [`Watch`]: the bounds of an HTTP/2 connection that hyper does not keep (no header timeout,
//! and a stream a client stalls by flow control while the socket moves): the idle close and the
//! cut of a response that waits on its client, over a service and body wrapper that report to it.
//!
//! Knows hyper's service and body traits; nothing about what the requests are.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use std::sync::Arc;

use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};

use crate::http::streams::{ConnectionPermits, StreamSlot};

/// What an HTTP/2 connection's requests are doing: how many run (from the call until the
/// response body is dropped), since when none has, and which responses wait on their client (a
/// head or a frame handed to hyper that hyper has not asked to follow, for lack of flow-control
/// window: hyper polls a body only when its stream has room to send).
#[derive(Debug)]
pub(super) struct Watch {
    pub(super) state: std::sync::Mutex<WatchState>,
}

#[derive(Debug)]
pub(super) struct WatchState {
    pub(super) running: usize,
    pub(super) idle_since: tokio::time::Instant,
    pub(super) next: u64,
    /// Since when each waiting response has waited, and whether it holds a shared permit.
    pub(super) waiting: std::collections::HashMap<u64, (tokio::time::Instant, bool)>,
}

impl Watch {
    pub(super) fn new() -> Watch {
        Watch {
            state: std::sync::Mutex::new(WatchState {
                running: 0,
                idle_since: tokio::time::Instant::now(),
                next: 0,
                waiting: std::collections::HashMap::new(),
            }),
        }
    }

    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, WatchState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A request begins, its permit to be kept in `slot`; it ends when the guard drops.
    pub(super) fn begin(self: &Arc<Watch>, slot: StreamSlot) -> Running {
        let mut state = self.state();
        state.running += 1;
        state.next += 1;
        Running {
            watch: Arc::clone(self),
            id: state.next,
            slot,
        }
    }

    /// How long no request has run (zero while one does).
    pub(super) fn idle_for(&self) -> Duration {
        let state = self.state();
        if state.running == 0 {
            state.idle_since.elapsed()
        } else {
            Duration::ZERO
        }
    }

    /// Whether a response (one holding a shared permit, if `shared`) has waited on its client
    /// for `timeout`.
    pub(super) fn stalled(&self, timeout: Duration, shared: bool) -> bool {
        self.state()
            .waiting
            .values()
            .any(|&(since, holds_shared)| (holds_shared || !shared) && since.elapsed() >= timeout)
    }
}

/// One running HTTP/2 request (see [`Watch`]), with its stream permit's slot.
#[derive(Debug)]
pub(super) struct Running {
    pub(super) watch: Arc<Watch>,
    pub(super) id: u64,
    pub(super) slot: StreamSlot,
}

impl Running {
    pub(super) fn waits(&self, waiting: bool) {
        let shared = waiting && self.slot.is_shared();
        let mut state = self.watch.state();
        if waiting {
            state
                .waiting
                .insert(self.id, (tokio::time::Instant::now(), shared));
        } else {
            state.waiting.remove(&self.id);
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.slot.release();
        let mut state = self.watch.state();
        state.waiting.remove(&self.id);
        state.running -= 1;
        if state.running == 0 {
            state.idle_since = tokio::time::Instant::now();
        }
    }
}

/// The app's service on an HTTP/2 connection, its requests counted by a [`Watch`], each
/// given a [`StreamSlot`] for the stream permit the app takes once it knows the request's
/// credential (`http::streams`), held until the response body is dropped.
#[derive(Debug, Clone)]
pub(super) struct Watched<S> {
    pub(super) inner: S,
    pub(super) watch: Arc<Watch>,
    pub(super) permits: Arc<ConnectionPermits>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> hyper::service::Service<http::Request<Incoming>> for Watched<S>
where
    S: hyper::service::Service<
            http::Request<Incoming>,
            Response = http::Response<axum::body::Body>,
        >,
    S::Future: Send + 'static,
{
    type Response = http::Response<WatchedBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn call(&self, mut request: http::Request<Incoming>) -> Self::Future {
        let slot = StreamSlot::new(&self.permits);
        request.extensions_mut().insert(slot.clone());
        let running = self.watch.begin(slot);
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            // The head is ready: until hyper asks for the body (a client that gives the stream
            // no window never lets it), the response waits on its client.
            running.waits(true);
            Ok(response.map(|inner| WatchedBody { inner, running }))
        })
    }
}

/// A response body that tells its [`Watch`] when it waits on the client.
#[derive(Debug)]
pub(super) struct WatchedBody {
    pub(super) inner: axum::body::Body,
    pub(super) running: Running,
}

impl HttpBody for WatchedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        // Asked for more: the client took what came before.
        self.running.waits(false);
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        // The last frame too: hyper holds it until the stream has window, and a client that
        // never opens one would hold it (a small answer is one frame) and the connection with
        // it. Sent, the body is dropped, which ends the wait.
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && frame.is_data()
        {
            self.running.waits(true);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
