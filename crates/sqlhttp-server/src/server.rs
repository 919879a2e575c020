//! [`Server`] (a bound listener plus an opened engine) and [`ServerHandle`] (a server running
//! in a task): the accept loop (a connection cap, hyper's HTTP/1.1 with a header-read and idle
//! timeout, hyper's own error answers given JSON bodies) and bounded graceful shutdown: stop
//! accepting, give open connections a short grace, cut them, then close the database.
//!
//! With [`Config::tls`] every connection is TLS first (the handshake bounded by the header
//! timeout, the configuration `tls`'s, reloadable), then HTTP/2 when ALPN chose `h2`, else
//! HTTP/1.1 as above. An HTTP/2 connection keeps the same bounds by other means (hyper's HTTP/2
//! has no header timeout, and a client can stall one stream by flow control while the socket
//! moves): [`Watch`] closes it once no request has run for the header timeout, and cuts it once
//! a response has waited on its client for the send timeout (for about a second, when the response
//! holds one of the server's shared stream permits and they run short: `http::streams`, whose
//! permits each stream takes once its credential is known).
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
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Sleep;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::TaskTracker;
use tower_http::add_extension::AddExtension;

use crate::config::{Config, HttpLimits};
use crate::error::ServerError;
use crate::http::app;
use crate::http::hyper_errors::{JsonErrors, raw_response};
use crate::http::streams::{ConnectionPermits, PRESSED_STALL, StreamPermits, StreamSlot};
use crate::protocol::error::ApiError;
use crate::state::AppState;
use crate::tls::{H2, TlsReloader};

/// How long open connections may finish their requests after shutdown is signalled.
const GRACE: Duration = Duration::from_secs(2);
/// How long cut connections get to notice before serving is abandoned.
const CUT_WAIT: Duration = Duration::from_millis(500);
/// How long a connection refused by the cap may take to receive its `503`.
const REFUSAL_WRITE: Duration = Duration::from_secs(1);
/// Pause after an accept error such as running out of file descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Requests one HTTP/2 connection may run at once.
const H2_STREAMS: u32 = 128;
/// Largest request head an HTTP/2 client may send (HPACK-decoded).
const H2_HEADER_LIST: u32 = 64 * 1024;

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
    tls: Option<TlsReloader>,
}

impl Server {
    /// Opens the database (off the async worker threads) and binds `config.listen`
    /// (port 0 picks a free port).
    ///
    /// # Errors
    ///
    /// [`ServerError::AnonymousOnPublicAddress`] when no token is configured, the address is
    /// not loopback and [`Config::allow_anonymous`] is off; [`ServerError::TlsFile`] when
    /// [`Config::tls`]'s files do not load; otherwise the database's or the listener's failure.
    pub async fn bind(config: Config) -> Result<Server, ServerError> {
        let listen = config.listen;
        if config.tokens.is_empty()
            && config.read_tokens.is_empty()
            && !config.allow_anonymous
            && !listen.ip().is_loopback()
        {
            return Err(ServerError::AnonymousOnPublicAddress { addr: listen });
        }
        let tls = config.tls.as_ref().map(TlsReloader::load).transpose()?;
        if tls.is_none() && !listen.ip().is_loopback() {
            tracing::warn!(
                %listen,
                "serving plain HTTP on an address other than loopback: bearer tokens and data \
                 travel in clear; give --tls-cert and --tls-key, or put a TLS proxy in front \
                 (docs/deploy.md)"
            );
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
            tls,
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Whether the server speaks HTTPS ([`Config::tls`]).
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The handle that re-reads the TLS files (`None` without [`Config::tls`]); it stays valid
    /// while the server serves.
    pub fn tls_reloader(&self) -> Option<TlsReloader> {
        self.tls.clone()
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
            tls,
        } = self;
        let router = app(state.clone());
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(http.header_timeout)
            .keep_alive(true);
        let mut h2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        h2.timer(TokioTimer::new())
            .max_concurrent_streams(H2_STREAMS)
            .max_header_list_size(H2_HEADER_LIST);
        let slots = Arc::new(Semaphore::new(http.max_connections.max(1)));
        // HTTP/2 streams beyond each connection's first (which its slot pays for, as an
        // HTTP/1.1 connection's one response): as many as the server takes connections, an
        // eighth of them at most to one credential or anonymous address (ADR 0044).
        let stream_permits = StreamPermits::new(http.max_connections);
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
                connections.spawn(refuse(stream, tls.clone()));
                continue;
            };
            let _ = stream.set_nodelay(true);
            let conn = Conn {
                peer,
                service: TowerToHyperService::new(AddExtension::new(
                    router.clone(),
                    ConnectInfo(peer),
                )),
                stop: stop.clone(),
                cut: cut.clone(),
                header_timeout: http.header_timeout,
                send_timeout: http.send_timeout,
                stream_permits: Arc::clone(&stream_permits),
            };
            let (builder, h2, tls) = (builder.clone(), h2.clone(), tls.clone());
            connections.spawn(async move {
                let _slot = slot;
                let Some(tls) = tls else {
                    let opened = tokio::select! {
                        opened = opening(&stream, conn.header_timeout) => opened,
                        // Shutting down: a connection that has not sent its first bytes is closed.
                        () = conn.stop.cancelled() => Opening::Nothing,
                    };
                    match opened {
                        Opening::Http1 => conn.http1(&builder, stream).await,
                        Opening::Http2 => refuse_http2(stream).await,
                        Opening::Nothing => {}
                    }
                    return;
                };
                // The handshake is bounded as a request head is.
                let handshake =
                    tokio::time::timeout(conn.header_timeout, tls.acceptor().accept(stream));
                let stream = tokio::select! {
                    accepted = handshake => match accepted {
                        Ok(Ok(stream)) => stream,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake not done within the header timeout");
                            return;
                        }
                    },
                    () = conn.stop.cancelled() => return,
                };
                if stream.get_ref().1.alpn_protocol() == Some(H2) {
                    conn.http2(&h2, stream).await;
                } else {
                    conn.http1(&builder, stream).await;
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
        let tls = self.tls.is_some();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(self.serve_until(async move {
            // Either an explicit stop or the handle being dropped.
            let _ = stop_rx.await;
        }));
        ServerHandle {
            local_addr,
            tls,
            stop: Some(stop_tx),
            task: Some(task),
        }
    }
}

/// What serving one connection needs.
struct Conn {
    peer: SocketAddr,
    service: TowerToHyperService<AddExtension<axum::Router, ConnectInfo<SocketAddr>>>,
    stop: CancellationToken,
    cut: CancellationToken,
    header_timeout: Duration,
    send_timeout: Duration,
    /// HTTP/2 stream permits shared server-wide (see `serve_until`).
    stream_permits: Arc<StreamPermits>,
}

impl Conn {
    fn cuttable<S>(&self, inner: S) -> CuttableStream<S> {
        CuttableStream {
            inner,
            cut: Box::pin(self.cut.clone().cancelled_owned()),
            is_cut: false,
            send_timeout: self.send_timeout,
            stalled: None,
            slow_since: None,
        }
    }

    /// Serves HTTP/1.1 on `stream` (plain or TLS) until the client is done, or gracefully
    /// once the server stops.
    async fn http1<S>(self, builder: &hyper::server::conn::http1::Builder, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let io = TokioIo::new(JsonErrors::new(self.cuttable(stream)));
        let connection = builder.serve_connection(io, self.service);
        tokio::pin!(connection);
        let mut stopping = false;
        loop {
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(peer = %self.peer, error = %e, "connection ended with an error");
                    }
                    break;
                }
                () = self.stop.cancelled(), if !stopping => {
                    stopping = true;
                    connection.as_mut().graceful_shutdown();
                }
            }
        }
    }

    /// Serves HTTP/2 on a TLS `stream`: closed gracefully once idle for the header timeout (or
    /// when the server stops), cut once a response waited on its client for the send timeout,
    /// or once a graceful close takes longer than that.
    async fn http2<S>(self, builder: &hyper::server::conn::http2::Builder<TokioExecutor>, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let watch = Arc::new(Watch::new());
        let io = TokioIo::new(self.cuttable(stream));
        let service = Watched {
            inner: self.service.clone(),
            watch: Arc::clone(&watch),
            permits: self.stream_permits.connection(),
        };
        let connection = builder.serve_connection(io, service);
        tokio::pin!(connection);
        let every = (self.header_timeout.min(self.send_timeout) / 4)
            .clamp(Duration::from_millis(10), PRESSED_STALL / 4);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut closing: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(peer = %self.peer, error = %e, "connection ended with an error");
                    }
                    break;
                }
                () = self.stop.cancelled(), if closing.is_none() => {
                    closing = Some(tokio::time::Instant::now());
                    connection.as_mut().graceful_shutdown();
                }
                _ = tick.tick() => {
                    if watch.stalled(self.send_timeout, false) {
                        tracing::debug!(peer = %self.peer, "an HTTP/2 client took nothing of a response for the send timeout; closing");
                        break;
                    }
                    // Shared permits are short: a response holding one that its client does
                    // not take gives it back sooner.
                    if self.stream_permits.pressed_within(self.send_timeout)
                        && watch.stalled(PRESSED_STALL.min(self.send_timeout), true)
                    {
                        tracing::info!(peer = %self.peer, "an HTTP/2 client took nothing of a response holding a shared stream permit while they ran short; closing");
                        break;
                    }
                    match closing {
                        None if watch.idle_for() >= self.header_timeout => {
                            closing = Some(tokio::time::Instant::now());
                            connection.as_mut().graceful_shutdown();
                        }
                        Some(since) if since.elapsed() >= self.send_timeout => break,
                        _ => {}
                    }
                }
            }
        }
    }
}

/// What an HTTP/2 connection's requests are doing: how many run (from the call until the
/// response body is dropped), since when none has, and which responses wait on their client (a
/// head or a frame handed to hyper that hyper has not asked to follow, for lack of flow-control
/// window: hyper polls a body only when its stream has room to send).
#[derive(Debug)]
struct Watch {
    state: std::sync::Mutex<WatchState>,
}

#[derive(Debug)]
struct WatchState {
    running: usize,
    idle_since: tokio::time::Instant,
    next: u64,
    /// Since when each waiting response has waited, and whether it holds a shared permit.
    waiting: std::collections::HashMap<u64, (tokio::time::Instant, bool)>,
}

impl Watch {
    fn new() -> Watch {
        Watch {
            state: std::sync::Mutex::new(WatchState {
                running: 0,
                idle_since: tokio::time::Instant::now(),
                next: 0,
                waiting: std::collections::HashMap::new(),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, WatchState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A request begins, its permit to be kept in `slot`; it ends when the guard drops.
    fn begin(self: &Arc<Watch>, slot: StreamSlot) -> Running {
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
    fn idle_for(&self) -> Duration {
        let state = self.state();
        if state.running == 0 {
            state.idle_since.elapsed()
        } else {
            Duration::ZERO
        }
    }

    /// Whether a response (one holding a shared permit, if `shared`) has waited on its client
    /// for `timeout`.
    fn stalled(&self, timeout: Duration, shared: bool) -> bool {
        self.state()
            .waiting
            .values()
            .any(|&(since, holds_shared)| (holds_shared || !shared) && since.elapsed() >= timeout)
    }
}

/// One running HTTP/2 request (see [`Watch`]), with its stream permit's slot.
#[derive(Debug)]
struct Running {
    watch: Arc<Watch>,
    id: u64,
    slot: StreamSlot,
}

impl Running {
    fn waits(&self, waiting: bool) {
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
struct Watched<S> {
    inner: S,
    watch: Arc<Watch>,
    permits: Arc<ConnectionPermits>,
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
struct WatchedBody {
    inner: axum::body::Body,
    running: Running,
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

/// A running [`Server`]. Dropping it signals shutdown without waiting; call
/// [`shutdown`](ServerHandle::shutdown) to wait until the port and the database are released.
#[derive(Debug)]
pub struct ServerHandle {
    local_addr: SocketAddr,
    tls: bool,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<io::Result<()>>>,
}

impl ServerHandle {
    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The server's base URL, such as `http://127.0.0.1:8080` (`https://` with
    /// [`Config::tls`]; a wildcard listen address is shown as the loopback address of its
    /// family).
    pub fn url(&self) -> String {
        let ip = match self.local_addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", SocketAddr::new(ip, self.local_addr.port()))
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
    const HTTP_1_1_REQUIRED: u32 = 0xd;
    let error = ApiError::bad_request(
        "this server speaks HTTP/1.1: send the request over HTTP/1.1 (HTTP/2 with prior \
         knowledge is not served)",
    );
    send_and_close(stream, &goaway(HTTP_1_1_REQUIRED, &error)).await;
}

/// An HTTP/2 server's (empty) SETTINGS, then GOAWAY with `code` and `error`'s JSON body as the
/// frame's debug data.
fn goaway(code: u32, error: &ApiError) -> Vec<u8> {
    const SETTINGS: u8 = 0x4;
    const GOAWAY: u8 = 0x7;
    let body = error.body();
    let mut frames = vec![0, 0, 0, SETTINGS, 0, 0, 0, 0, 0];
    let length = u32::try_from(8 + body.len()).unwrap_or(0);
    frames.extend_from_slice(&length.to_be_bytes()[1..]);
    frames.extend_from_slice(&[GOAWAY, 0, 0, 0, 0, 0]);
    frames.extend_from_slice(&0_u32.to_be_bytes()); // the last stream processed: none
    frames.extend_from_slice(&code.to_be_bytes());
    frames.extend_from_slice(&body);
    frames
}

/// Answers a connection over the cap with `503 UNAVAILABLE` and closes it; over TLS after a
/// handshake (within the same short bound), and to an HTTP/2 client as GOAWAY
/// (`REFUSED_STREAM`: nothing ran, so it may retry).
async fn refuse(stream: TcpStream, tls: Option<TlsReloader>) {
    const REFUSED_STREAM: u32 = 0x7;
    let error = ApiError::unavailable("the server has reached its connection limit; retry later");
    let Some(tls) = tls else {
        return send_and_close(stream, &raw_response(&error)).await;
    };
    if let Ok(Ok(stream)) = tokio::time::timeout(REFUSAL_WRITE, tls.acceptor().accept(stream)).await
    {
        let answer = if stream.get_ref().1.alpn_protocol() == Some(H2) {
            goaway(REFUSED_STREAM, &error)
        } else {
            raw_response(&error)
        };
        send_and_close(stream, &answer).await;
    }
}

/// Writes `response`, closes the write half and reads what the client still sends, within a
/// short bound.
async fn send_and_close<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, response: &[u8]) {
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
struct CuttableStream<S> {
    inner: S,
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

impl<S: Unpin> CuttableStream<S> {
    /// Passes a write's poll through, timing how long it makes no progress.
    fn timed<T>(
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
