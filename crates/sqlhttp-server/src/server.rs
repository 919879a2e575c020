//! [`Server`] (a bound listener plus an opened engine) and [`ServerHandle`] (a server running
//! in a task): the accept loop (a connection cap, hyper's HTTP/1.1 with a header-read and idle
//! timeout, hyper's own error answers given JSON bodies) and bounded graceful shutdown: stop
//! accepting, give open connections a short grace, cut them, then close the database.
//!
//! Each connection's requests carry the client's address (`ConnectInfo`), for rate limiting
//! and logs. [`Server::bind`] refuses to serve without a token on an address other than
//! loopback unless the configuration allows anonymous access.
//!
//! Knows sockets, the runtime and the app factory; nothing about SQL.

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use std::sync::Arc;

use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Sleep;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::TaskTracker;
use tower_http::add_extension::AddExtension;

use crate::api_error::ApiError;
use crate::config::{Config, HttpLimits};
use crate::error::ServerError;
use crate::http::app;
use crate::http::hyper_errors::{JsonErrors, raw_response};
use crate::state::AppState;

/// How long open connections may finish their requests after shutdown is signalled.
const GRACE: Duration = Duration::from_secs(2);
/// How long cut connections get to notice before serving is abandoned.
const CUT_WAIT: Duration = Duration::from_millis(500);
/// How long a connection refused by the cap may take to receive its `503`.
const REFUSAL_WRITE: Duration = Duration::from_secs(1);
/// Pause after an accept error such as running out of file descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// A bound listener and an opened database, ready to serve.
///
/// ```
/// use sqlhttp_server::{Config, Server};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let config = Config { listen: "127.0.0.1:0".parse().unwrap(), ..Config::default() };
/// let server = Server::bind(config).await.unwrap();
/// let handle = server.spawn();
/// assert!(handle.url().starts_with("http://127.0.0.1:"));
/// handle.shutdown().await;
/// # });
/// ```
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    local_addr: SocketAddr,
    state: AppState,
    http: HttpLimits,
}

impl Server {
    /// Opens the database (off the async worker threads) and binds `config.listen`
    /// (port 0 picks a free port).
    ///
    /// # Errors
    ///
    /// [`ServerError::AnonymousOnPublicAddress`] when no token is configured, the address is
    /// not loopback and [`Config::allow_anonymous`] is off; otherwise the database's or the
    /// listener's failure.
    pub async fn bind(config: Config) -> Result<Server, ServerError> {
        let listen = config.listen;
        if config.tokens.is_empty()
            && config.read_tokens.is_empty()
            && !config.allow_anonymous
            && !listen.ip().is_loopback()
        {
            return Err(ServerError::AnonymousOnPublicAddress { addr: listen });
        }
        let http = config.http.clone();
        let state = tokio::task::spawn_blocking(move || AppState::new(&config))
            .await
            .map_err(|e| ServerError::EngineThread(io::Error::other(e)))??;
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| ServerError::Bind {
                addr: listen,
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: listen,
            source,
        })?;
        Ok(Server {
            listener,
            local_addr,
            state,
            http,
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves until `shutdown` completes, then shuts down gracefully: the listener closes at
    /// once, open connections finish their current request (idle ones close) within about two
    /// seconds and are then cut, and the database connections are closed before this returns.
    pub async fn serve_until<F>(self, shutdown: F) -> io::Result<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let Server {
            listener,
            local_addr,
            state,
            http,
        } = self;
        let router = app(state.clone());
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(http.header_timeout)
            .keep_alive(true);
        let slots = Arc::new(Semaphore::new(http.max_connections.max(1)));
        let stop = CancellationToken::new();
        let cut = CancellationToken::new();
        let connections = TaskTracker::new();
        tracing::info!(%local_addr, "serving");

        tokio::pin!(shutdown);
        loop {
            let (stream, peer) = tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                },
            };
            let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                tracing::warn!(%peer, max = http.max_connections, "connection cap reached; refusing");
                connections.spawn(refuse(stream));
                continue;
            };
            let _ = stream.set_nodelay(true);
            let (builder, router, stop, cut) =
                (builder.clone(), router.clone(), stop.clone(), cut.clone());
            let (header_timeout, send_timeout) = (http.header_timeout, http.send_timeout);
            connections.spawn(async move {
                let _slot = slot;
                let opened = tokio::select! {
                    opened = opening(&stream, header_timeout) => opened,
                    // Shutting down: a connection that has not sent its first bytes is closed.
                    () = stop.cancelled() => Opening::Nothing,
                };
                match opened {
                    Opening::Http1 => {}
                    Opening::Http2 => return refuse_http2(stream).await,
                    Opening::Nothing => return,
                }
                let io = TokioIo::new(JsonErrors::new(CuttableStream {
                    inner: stream,
                    cut: Box::pin(cut.cancelled_owned()),
                    is_cut: false,
                    send_timeout,
                    stalled: None,
                    slow_since: None,
                }));
                let service = AddExtension::new(router, ConnectInfo(peer));
                let connection = builder.serve_connection(io, TowerToHyperService::new(service));
                tokio::pin!(connection);
                let mut stopping = false;
                loop {
                    tokio::select! {
                        result = connection.as_mut() => {
                            if let Err(e) = result {
                                tracing::debug!(%peer, error = %e, "connection ended with an error");
                            }
                            break;
                        }
                        () = stop.cancelled(), if !stopping => {
                            stopping = true;
                            connection.as_mut().graceful_shutdown();
                        }
                    }
                }
            });
        }

        tracing::info!("shutting down");
        drop(listener);
        stop.cancel();
        connections.close();
        if tokio::time::timeout(GRACE, connections.wait())
            .await
            .is_err()
        {
            tracing::warn!("connections still open after the grace period; cutting them");
            cut.cancel();
            let _ = tokio::time::timeout(CUT_WAIT, connections.wait()).await;
        }
        // Cut whatever is left, then close the database.
        cut.cancel();
        state.close().await;
        tracing::info!("stopped");
        Ok(())
    }

    /// Serves on the current tokio runtime in a task; shut it down through the handle.
    pub fn spawn(self) -> ServerHandle {
        let local_addr = self.local_addr;
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(self.serve_until(async move {
            // Either an explicit stop or the handle being dropped.
            let _ = stop_rx.await;
        }));
        ServerHandle {
            local_addr,
            stop: Some(stop_tx),
            task: Some(task),
        }
    }
}

/// A running [`Server`]. Dropping it signals shutdown without waiting; call
/// [`shutdown`](ServerHandle::shutdown) to wait until the port and the database are released.
#[derive(Debug)]
pub struct ServerHandle {
    local_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<io::Result<()>>>,
}

impl ServerHandle {
    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The server's base URL, such as `http://127.0.0.1:8080` (a wildcard listen address is
    /// shown as the loopback address of its family).
    pub fn url(&self) -> String {
        let ip = match self.local_addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        format!("http://{}", SocketAddr::new(ip, self.local_addr.port()))
    }

    /// Shuts down gracefully and returns once the listener is closed and the database
    /// connection is dropped (bounded: open connections are cut after about two seconds).
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "server stopped with an error"),
                Err(e) => tracing::error!(error = %e, "server task failed"),
            }
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// How a connection's first bytes open it.
enum Opening {
    /// Anything but the HTTP/2 preface: hyper's HTTP/1.1 reads it.
    Http1,
    /// `PRI * HTTP/2.0`: HTTP/2 with prior knowledge.
    Http2,
    /// Nothing within the header timeout, or the client closed.
    Nothing,
}

/// The first bytes of every HTTP/2 connection (RFC 9113, 3.4); no HTTP/1.1 method starts so.
const HTTP2_PREFACE_START: &[u8] = b"PRI ";

/// Looks at a connection's first bytes without taking them.
async fn opening(stream: &TcpStream, header_timeout: Duration) -> Opening {
    let peek = async {
        let mut first = [0_u8; HTTP2_PREFACE_START.len()];
        let mut pause = Duration::from_millis(5);
        loop {
            let n = stream.peek(&mut first).await.unwrap_or(0);
            if n == 0 {
                return Opening::Nothing;
            }
            if !HTTP2_PREFACE_START.starts_with(&first[..n]) {
                return Opening::Http1;
            }
            if n == first.len() {
                return Opening::Http2;
            }
            // A prefix of the preface so far: wait for more (peek answers at once again), less
            // often the longer it takes, so a client sending a byte at a time costs little.
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    };
    tokio::time::timeout(header_timeout, peek)
        .await
        .unwrap_or(Opening::Nothing)
}

/// Answers HTTP/2 with prior knowledge as RFC 9113 asks of a server that wants HTTP/1.1: its
/// (empty) SETTINGS, then GOAWAY with `HTTP_1_1_REQUIRED`, the protocol's JSON error as the
/// frame's debug data, and closes.
async fn refuse_http2(stream: TcpStream) {
    const SETTINGS: u8 = 0x4;
    const GOAWAY: u8 = 0x7;
    const HTTP_1_1_REQUIRED: u32 = 0xd;
    let body = ApiError::bad_request(
        "this server speaks HTTP/1.1: send the request over HTTP/1.1 (HTTP/2 with prior \
         knowledge is not served)",
    )
    .body();
    let mut frames = vec![0, 0, 0, SETTINGS, 0, 0, 0, 0, 0];
    let length = u32::try_from(8 + body.len()).unwrap_or(0);
    frames.extend_from_slice(&length.to_be_bytes()[1..]);
    frames.extend_from_slice(&[GOAWAY, 0, 0, 0, 0, 0]);
    frames.extend_from_slice(&0_u32.to_be_bytes()); // the last stream processed: none
    frames.extend_from_slice(&HTTP_1_1_REQUIRED.to_be_bytes());
    frames.extend_from_slice(&body);
    send_and_close(stream, &frames).await;
}

/// Answers a connection over the cap with `503 UNAVAILABLE` and closes it.
async fn refuse(stream: TcpStream) {
    let response = raw_response(&ApiError::unavailable(
        "the server has reached its connection limit; retry later",
    ));
    send_and_close(stream, &response).await;
}

/// Writes `response`, closes the write half and reads what the client still sends, within a
/// short bound.
async fn send_and_close(mut stream: TcpStream, response: &[u8]) {
    let _ = tokio::time::timeout(REFUSAL_WRITE, async {
        stream.write_all(response).await?;
        stream.shutdown().await?;
        // Read what the client sent before closing: closing with unread input resets the
        // connection, and the client could lose the answer.
        let mut sink = [0_u8; 1024];
        while stream.read(&mut sink).await? > 0 {}
        io::Result::Ok(())
    })
    .await;
}

/// A connection that fails every read and write once the server's cut token is cancelled, or
/// once a write has made no progress for the send timeout (the client reads nothing), so the
/// HTTP connection task ends and the response it was sending is dropped.
struct CuttableStream {
    inner: TcpStream,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
    is_cut: bool,
    send_timeout: Duration,
    /// Running while a write waits for the client to take bytes.
    stalled: Option<Pin<Box<Sleep>>>,
    /// Since when writes have been waiting on the client, with what it took meanwhile: a
    /// client that takes less than [`MIN_SEND_BYTES`] per send timeout while the server waits
    /// on it is cut too (a trickle would otherwise hold its answer, and its share of the
    /// server's budget, for hours).
    slow_since: Option<(tokio::time::Instant, usize)>,
}

/// What a client must take per send timeout while the server's writes wait on it.
const MIN_SEND_BYTES: usize = 64 * 1024;

impl CuttableStream {
    /// Passes a write's poll through, timing how long it makes no progress.
    fn timed<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(Pin<&mut TcpStream>, &mut Context<'_>) -> Poll<io::Result<T>>,
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
    fn took(&mut self, written: &Poll<io::Result<usize>>) {
        if let (Poll::Ready(Ok(n)), Some((_, taken))) = (written, &mut self.slow_since) {
            *taken += n;
        }
    }

    fn check_cut(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
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

impl AsyncRead for CuttableStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check_cut(cx)?;
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for CuttableStream {
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
