//! Server configuration: [`Config`], the plain data a [`Server`](crate::Server) is built from,
//! split by the `sqlhttpd` flag groups it mirrors: the engine's and interactive transactions'
//! limits ([`limits`]), what an HTTP client may cost and how it is admitted ([`http`]), the
//! database URL and its PostgreSQL standbys ([`database`], with the URL's TLS parameters in
//! [`postgres_tls`]) and the duration syntax of the flags ([`duration`]).
//!
//! Plain data and parsing only; nothing here knows about HTTP, the engine or the runtime.

mod database;
mod duration;
mod http;
mod limits;
mod postgres_tls;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

// Only a server built without PostgreSQL refuses its URLs with this.
#[cfg_attr(feature = "postgres", allow(unused_imports))]
pub(crate) use database::NO_POSTGRES;
pub use database::{DEFAULT_CLIENT_ROLE, Database, PostgresUrl, ReadReplicas};
pub use duration::parse_duration;
pub use http::{HttpLimits, RateLimit, TlsFiles};
pub use limits::{Limits, TransactionLimits};
// Read by the PostgreSQL engine's TLS connector only.
#[cfg_attr(not(feature = "postgres"), allow(unused_imports))]
pub(crate) use postgres_tls::{PgSsl, RootCert, SslMode};

/// Default listen address: `127.0.0.1:8080`.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 8080);

/// Default request body limit: 6 MiB, so one value of the default `--max-value-bytes` (4 MiB, sent
/// as 5.33 MiB of base64) fits in a request with its SQL.
pub const DEFAULT_MAX_BODY_BYTES: usize = sqlhttp_protocol::defaults::MAX_BODY_BYTES;

/// Default server-wide budget for request bodies held at once: 256 MiB (about 42 bodies of the
/// default limit; `503 UNAVAILABLE` with `Retry-After` past it).
pub const DEFAULT_MAX_BUFFERED_BYTES: usize = 256 * 1_048_576;

/// Default batch body limit: 8 MiB, so an atomic bulk insert of several full statements fits.
pub const DEFAULT_MAX_BATCH_BYTES: usize = sqlhttp_protocol::defaults::MAX_BATCH_BYTES;

/// Default idempotency-key lifetime: 24 hours.
pub const DEFAULT_IDEMPOTENCY_TTL: Duration =
    Duration::from_secs(sqlhttp_protocol::defaults::IDEMPOTENCY_TTL_SECS);

/// Everything a [`Server`](crate::Server) or an [`AppState`](crate::AppState) is built from.
///
/// ```
/// use sqlhttp_server::{Config, Database};
///
/// let config = Config {
///     listen: "127.0.0.1:0".parse().unwrap(),
///     database: "sqlite::memory:".parse().unwrap(),
///     tokens: vec!["s3cret".to_owned()],
///     ..Config::default()
/// };
/// assert_eq!(config.database, Database::Memory);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Address to listen on; port 0 picks a free port.
    pub listen: SocketAddr,
    /// The database every request runs against.
    pub database: Database,
    /// Accepted bearer tokens with full access; when this and `read_tokens` are both empty the
    /// SQL endpoint is open.
    pub tokens: Vec<String>,
    /// Accepted bearer tokens that may only read: a statement that may write is refused with
    /// `403 READ_ONLY`. Default: none.
    pub read_tokens: Vec<String>,
    /// Serve without any token on an address other than loopback. Without it
    /// [`Server::bind`](crate::Server::bind) refuses such a configuration. Default: `false`.
    pub allow_anonymous: bool,
    /// Requests each credential may make; `None` (the default) does not limit.
    pub rate_limit: Option<RateLimit>,
    /// Largest accepted request body, in bytes.
    pub max_body_bytes: usize,
    /// Largest accepted `POST /api/v1/batch` body, in bytes.
    pub max_batch_bytes: usize,
    /// Request bodies the server holds at once, in bytes, across all requests (a request holds
    /// its body from the first byte until it is answered); past it `503 UNAVAILABLE` with
    /// `Retry-After`, before anything runs.
    pub max_buffered_bytes: usize,
    /// How long an Idempotency-Key's outcome is kept; `None` switches idempotency off
    /// (the header is then ignored).
    pub idempotency_ttl: Option<Duration>,
    /// What one statement may cost: time, sizes, queueing, reader connections.
    pub limits: Limits,
    /// What one HTTP connection may cost: timeouts, the connection cap, allowed origins.
    pub http: HttpLimits,
    /// What interactive transactions may hold: how many, for how long.
    pub transactions: TransactionLimits,
    /// Where this server's peers (the other sqlhttpd processes on the same database) reach it
    /// (`http://HOST:PORT`): a request for an interactive transaction this server holds that
    /// reaches a peer is forwarded here. `None` (the default): not forwarded (the peer answers
    /// `410 TRANSACTION_EXPIRED`).
    pub advertise_url: Option<String>,
    /// Streaming replicas of a PostgreSQL `database` that serve verified reads; none by
    /// default. Refused with a SQLite database.
    pub read_replicas: ReadReplicas,
    /// Serve HTTPS (HTTP/1.1 and HTTP/2 by ALPN) with these files; `None` (the default) serves
    /// plain HTTP/1.1.
    pub tls: Option<TlsFiles>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: DEFAULT_LISTEN,
            database: Database::Memory,
            tokens: Vec::new(),
            read_tokens: Vec::new(),
            allow_anonymous: false,
            rate_limit: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
            max_buffered_bytes: DEFAULT_MAX_BUFFERED_BYTES,
            idempotency_ttl: Some(DEFAULT_IDEMPOTENCY_TTL),
            limits: Limits::default(),
            http: HttpLimits::default(),
            transactions: TransactionLimits::default(),
            advertise_url: None,
            read_replicas: ReadReplicas::default(),
            tls: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_documented_ones() {
        let config = Config::default();
        assert_eq!(config.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(config.database, Database::Memory);
        assert!(config.tokens.is_empty());
        assert!(config.read_tokens.is_empty());
        assert!(!config.allow_anonymous);
        assert_eq!(config.rate_limit, None);
        assert_eq!(config.max_body_bytes, 6 * 1_048_576);
        assert_eq!(config.max_buffered_bytes, 256 * 1_048_576);
        assert_eq!(config.limits.max_value_bytes, 4 * 1_048_576);
        assert_eq!(config.limits.max_engine_memory, 512 * 1_048_576);
        assert_eq!(config.http.send_timeout, Duration::from_secs(30));
        // A value of the largest size fits in a request with its SQL, as base64.
        assert!(config.limits.max_value_bytes.div_ceil(3) * 4 + 64 * 1024 <= config.max_body_bytes);
        assert_eq!(config.idempotency_ttl, Some(Duration::from_secs(86_400)));
        assert_eq!(config.limits.statement_timeout, Duration::from_secs(30));
        assert_eq!(config.limits.read_connections, 4);
        let pool = config.limits.pool_size;
        assert!((8..=32).contains(&pool) && pool % 4 == 0, "{pool}");
        assert_eq!(config.limits.max_batch_statements, 100);
        assert_eq!(config.max_batch_bytes, 8 * 1_048_576);
        assert_eq!(config.http.header_timeout, Duration::from_secs(30));
        assert!(config.http.allow_origins.is_empty());
    }
}
