//! [`Server`] (a bound listener plus an opened engine) and [`ServerHandle`] (a server running
//! in a task), with bounded graceful shutdown: stop accepting, give open connections a short
//! grace, cut them, then close the database.
//!
//! Knows sockets, the runtime and the app factory; nothing about SQL or the protocol's bodies.

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::config::Config;
use crate::error::ServerError;
use crate::http::app;
use crate::state::AppState;

/// How long open connections may finish their requests after shutdown is signalled.
const GRACE: Duration = Duration::from_secs(2);
/// How long cut connections get to notice before serving is abandoned.
const CUT_WAIT: Duration = Duration::from_millis(500);

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
}

impl Server {
    /// Opens the database (off the async worker threads) and binds `config.listen`
    /// (port 0 picks a free port).
    pub async fn bind(config: Config) -> Result<Server, ServerError> {
        let listen = config.listen;
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
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves until `shutdown` completes, then shuts down gracefully: the listener closes at
    /// once, open connections get about two seconds to finish and are then cut, and the
    /// database connection is closed before this returns.
    pub async fn serve_until<F>(self, shutdown: F) -> io::Result<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let Server {
            listener,
            local_addr,
            state,
        } = self;
        let cut = CancellationToken::new();
        let listener = CuttableListener {
            inner: listener,
            cut: cut.clone(),
        };
        let (signalled_tx, signalled_rx) = oneshot::channel::<()>();
        let serving = axum::serve(listener, app(state.clone()))
            .with_graceful_shutdown(async move {
                shutdown.await;
                let _ = signalled_tx.send(());
            })
            .into_future();
        tokio::pin!(serving);
        tracing::info!(%local_addr, "serving");

        let result = tokio::select! {
            result = &mut serving => result,
            _ = signalled_rx => {
                tracing::info!("shutting down");
                match tokio::time::timeout(GRACE, &mut serving).await {
                    Ok(result) => result,
                    Err(_) => {
                        tracing::warn!("connections still open after the grace period; cutting them");
                        cut.cancel();
                        tokio::time::timeout(CUT_WAIT, &mut serving)
                            .await
                            .unwrap_or(Ok(()))
                    }
                }
            }
        };
        // Cut whatever is left, then close the database.
        cut.cancel();
        state.close().await;
        tracing::info!("stopped");
        result
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

/// A TCP listener whose connections can all be cut at once.
struct CuttableListener {
    inner: TcpListener,
    cut: CancellationToken,
}

impl axum::serve::Listener for CuttableListener {
    type Io = CuttableStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (stream, addr) = axum::serve::Listener::accept(&mut self.inner).await;
        let stream = CuttableStream {
            inner: stream,
            cut: Box::pin(self.cut.clone().cancelled_owned()),
            is_cut: false,
        };
        (stream, addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection that fails every read and write once its listener's token is cancelled, so
/// the HTTP connection task ends.
struct CuttableStream {
    inner: TcpStream,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
    is_cut: bool,
}

impl CuttableStream {
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
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check_cut(cx)?;
        Pin::new(&mut self.inner).poll_flush(cx)
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
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
