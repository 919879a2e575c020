//! What an HTTP client may cost and how it is admitted: connection limits and allowed origins
//! ([`HttpLimits`]), the per-credential [`RateLimit`] and the HTTPS files ([`TlsFiles`]); the
//! `--*-timeout`, `--max-connections`, `--allow-origin`, `--rate-*` and `--tls-*` flag groups.
//!
//! Plain data; nothing here knows about the listener, TLS handshakes or the engine.

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

/// Connection-level protection against slow and hostile HTTP clients, with defaults in
/// [`HttpLimits::default`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpLimits {
    /// Time a connection has to send a complete request head, and the longest a kept-alive
    /// connection may sit idle. Default 30 s.
    pub header_timeout: Duration,
    /// Time a request has to send its whole body (`408 REQUEST_TIMEOUT`). Default 30 s.
    pub body_timeout: Duration,
    /// Longest a response may make no progress (the client reads nothing of it, so the socket
    /// takes no byte); past it the connection is closed and a statement still streaming stops.
    /// While the server waits on it, a client must also take at least 64 KiB per send timeout.
    /// Default 30 s.
    pub send_timeout: Duration,
    /// Open connections at most; past it new connections get `503 UNAVAILABLE` and are closed.
    /// Default 1024.
    pub max_connections: usize,
    /// Browser origins allowed to call the SQL endpoint (CORS). A request with any other
    /// `Origin` is refused with `403 ORIGIN_NOT_ALLOWED`. Default: none.
    pub allow_origins: Vec<String>,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
            send_timeout: Duration::from_secs(30),
            max_connections: 1024,
            allow_origins: Vec::new(),
        }
    }
}

/// A token bucket per credential (per client address for anonymous requests): `per_second`
/// requests a second on average, up to `burst` at once. Past it a request is answered
/// `429 RATE_LIMITED` with `Retry-After` (see `docs/adr/0017-operating-sqlhttpd.md`).
///
/// ```
/// use std::num::NonZeroU32;
/// use sqlhttp_server::RateLimit;
///
/// let limit = RateLimit::per_second(NonZeroU32::new(50).unwrap());
/// assert_eq!(limit.burst.get(), 50);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Requests a second each credential may make on average.
    pub per_second: NonZeroU32,
    /// Requests a credential may make at once after a quiet spell (the bucket's size).
    pub burst: NonZeroU32,
}

impl RateLimit {
    /// `per_second` requests a second, with a burst of as many.
    pub fn per_second(per_second: NonZeroU32) -> RateLimit {
        RateLimit {
            per_second,
            burst: per_second,
        }
    }
}

/// HTTPS for clients: PEM files the server reads at start and again on
/// [`TlsReloader::reload`](crate::TlsReloader::reload) (`sqlhttpd` does it on `SIGHUP`). See
/// `docs/adr/0033-tls-both-ways.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, the server's own certificate first.
    pub cert: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA certificates that sign client certificates: when set, every client must present one
    /// (mutual TLS). Default: none.
    pub client_ca: Option<PathBuf>,
}
