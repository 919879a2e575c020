//! One accepted connection of the [`Server`](super::Server) served to its end: TLS first when
//! configured, then HTTP/1.1 or HTTP/2 (by ALPN, or by the preface for prior knowledge), under the
//! server's bounds; and the refusals sent on a connection past the cap, before anything is read.
//!
//! Knows sockets, hyper and TLS; nothing about the app's routes or SQL.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use std::sync::Arc;

use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tower_http::add_extension::AddExtension;

use crate::http::hyper_errors::{JsonErrors, raw_response};
use crate::http::streams::{PRESSED_STALL, StreamPermits};
use crate::protocol::error::ApiError;
use crate::tls::{H2, TlsReloader};

use super::REFUSAL_WRITE;
use super::cuttable::CuttableStream;
use super::watch::{Watch, Watched};

/// What serving one connection needs.
pub(super) struct Conn {
    pub(super) peer: SocketAddr,
    pub(super) service: TowerToHyperService<AddExtension<axum::Router, ConnectInfo<SocketAddr>>>,
    pub(super) stop: CancellationToken,
    pub(super) cut: CancellationToken,
    pub(super) header_timeout: Duration,
    pub(super) send_timeout: Duration,
    /// HTTP/2 stream permits shared server-wide (see `serve_until`).
    pub(super) stream_permits: Arc<StreamPermits>,
}

impl Conn {
    pub(super) fn cuttable<S>(&self, inner: S) -> CuttableStream<S> {
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
    pub(super) async fn http1<S>(self, builder: &hyper::server::conn::http1::Builder, stream: S)
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
    pub(super) async fn http2<S>(
        self,
        builder: &hyper::server::conn::http2::Builder<TokioExecutor>,
        stream: S,
    ) where
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

/// How a connection's first bytes open it.
pub(super) enum Opening {
    /// Anything but the HTTP/2 preface: hyper's HTTP/1.1 reads it.
    Http1,
    /// `PRI * HTTP/2.0`: HTTP/2 with prior knowledge.
    Http2,
    /// Nothing within the header timeout, or the client closed.
    Nothing,
}

/// The first bytes of every HTTP/2 connection (RFC 9113, 3.4); no HTTP/1.1 method starts so.
pub(super) const HTTP2_PREFACE_START: &[u8] = b"PRI ";

/// Looks at a connection's first bytes without taking them.
pub(super) async fn opening(stream: &TcpStream, header_timeout: Duration) -> Opening {
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
pub(super) async fn refuse_http2(stream: TcpStream) {
    const HTTP_1_1_REQUIRED: u32 = 0xd;
    let error = ApiError::bad_request(
        "this server speaks HTTP/1.1: send the request over HTTP/1.1 (HTTP/2 with prior \
         knowledge is not served)",
    );
    send_and_close(stream, &goaway(HTTP_1_1_REQUIRED, &error)).await;
}

/// An HTTP/2 server's (empty) SETTINGS, then GOAWAY with `code` and `error`'s JSON body as the
/// frame's debug data.
pub(super) fn goaway(code: u32, error: &ApiError) -> Vec<u8> {
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
pub(super) async fn refuse(stream: TcpStream, tls: Option<TlsReloader>) {
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
pub(super) async fn send_and_close<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    response: &[u8],
) {
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
