//! [`Server`] (a bound listener plus an opened engine) and [`ServerHandle`] (a server running
//! in a task): the accept loop (a connection cap, hyper's HTTP/1.1 with a header-read and idle
//! timeout, hyper's own error answers given JSON bodies) and bounded graceful shutdown: stop
//! accepting, give open connections a short grace, cut them, then close the database.
//!
//! With [`Config::tls`] every connection is TLS first (the handshake bounded by the header
//! timeout, the configuration `tls`'s, reloadable), then HTTP/2 when ALPN chose `h2`, else
//! HTTP/1.1 as above. An HTTP/2 connection keeps the same bounds by other means (hyper's HTTP/2
//! has no header timeout, and a client can stall one stream by flow control while the socket
//! moves): [`Watch`](watch::Watch) closes it once no request has run for the header timeout, and cuts it once
//! a response has waited on its client for the send timeout (for about a second, when the response
//! holds one of the server's shared stream permits and they run short: `http::streams`, whose
//! permits each stream takes once its credential is known).
//!
//! Each connection's requests carry the client's address (`ConnectInfo`), for rate limiting
//! and logs. [`Server::bind`] refuses to serve without a token on an address other than
//! loopback unless the configuration allows anonymous access.
//!
//! This file is the listener's lifecycle (bind, the accept loop, shutdown); one connection's
//! serving is `connection`'s, HTTP/2's own bounds `watch`'s, and the stream the server can cut
//! `cuttable`'s.
//!
//! Knows sockets, the runtime and the app factory; nothing about SQL.

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use std::sync::Arc;

use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower_http::add_extension::AddExtension;

use crate::config::{Config, HttpLimits};
use crate::error::ServerError;
use crate::http::app;
use crate::http::streams::StreamPermits;
use crate::state::AppState;
use crate::tls::{H2, TlsReloader};

mod connection;
mod cuttable;
mod watch;

use connection::{Conn, Opening, opening, refuse, refuse_http2};

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
