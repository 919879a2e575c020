//! Server configuration: [`Config`], the [`Database`] URL form, the duration syntax of
//! `--idempotency-ttl` and the per-credential [`RateLimit`].
//!
//! Plain data and parsing only; this module knows nothing about HTTP, the engine or the runtime.

use std::net::{Ipv4Addr, SocketAddr};
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::error::ServerError;

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

/// The engine's limits, with their defaults in [`Limits::default`]. Every statement passes them,
/// whatever the engine (see `docs/adr/0012-statement-sandbox.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long one statement may run before it is interrupted (`422 STATEMENT_TIMEOUT`).
    /// Default 30 s.
    pub statement_timeout: Duration,
    /// Longest accepted SQL text, in bytes (`413 PAYLOAD_TOO_LARGE`). Default 256 KiB.
    pub max_sql_bytes: usize,
    /// Largest string or blob the engine will hold, whether bound or computed. Default 4 MiB
    /// (its base64 fits the default body limit).
    pub max_value_bytes: usize,
    /// Largest success body the server will build whole for one statement: a keyed write's
    /// outcome, stored for replay (`422 RESULT_TOO_LARGE` past it). Other results stream and are
    /// not limited (see `docs/adr/0016-streamed-results.md`). Default 16 MiB.
    pub max_result_bytes: usize,
    /// Statements that may wait for a connection before the server answers `503 UNAVAILABLE`
    /// (per pool: the writer's and the readers'). Default 128.
    pub queue_depth: usize,
    /// Reader connections that run read-only statements beside the one writer; 0 runs
    /// everything on the writer. Default 4. SQLite only: PostgreSQL's pool is `pool_size`.
    pub read_connections: usize,
    /// Connections to PostgreSQL in the engine's pool; each request holds one while it runs
    /// (0 is taken as 1). Default [`Limits::default_pool_size`]. Not used on SQLite.
    pub pool_size: usize,
    /// Most statements in one atomic batch (`413 PAYLOAD_TOO_LARGE` past it). Default 100.
    pub max_batch_statements: usize,
    /// Memory all of SQLite's connections in the process may use at once: page caches, sorts,
    /// `DISTINCT` and temporary tables (held in memory, never spilled to files), values being
    /// computed. Past it a statement fails with `503 UNAVAILABLE` and its work is rolled back.
    /// SQLite's limit is one per process and only ever goes down: the lowest value any engine
    /// in the process started with holds for all of them (and for the embedding application's
    /// own SQLite connections). Default 512 MiB. Not used on PostgreSQL.
    pub max_engine_memory: usize,
    /// How long an interactive write transaction may hold SQLite's one writer without running
    /// a statement; past it the engine rolls it back and later requests for it get
    /// `410 TRANSACTION_EXPIRED`, and writes queued behind it go on (see
    /// `docs/adr/0042-sqlite-transactions-bounded-like-statements.md`). Default 2 s. Not used on
    /// PostgreSQL.
    pub transaction_write_idle: Duration,
    /// The write-ahead log's hard bound, in bytes: past it writes wait (then `503`, not run)
    /// and read-only transactions end until a checkpoint truncates the log, which is tried
    /// once it passes a quarter of this (see `docs/adr/0046-a-hard-bound-on-the-write-ahead-log.md`).
    /// Default 256 MiB. Not used on PostgreSQL.
    pub max_wal_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            statement_timeout: Duration::from_secs(30),
            max_sql_bytes: 256 * 1024,
            max_value_bytes: 4 * 1024 * 1024,
            max_result_bytes: 16 * 1024 * 1024,
            queue_depth: 128,
            read_connections: 4,
            pool_size: Limits::default_pool_size(),
            max_batch_statements: sqlhttp_protocol::defaults::MAX_BATCH_STATEMENTS,
            max_engine_memory: 512 * 1024 * 1024,
            transaction_write_idle: Duration::from_secs(2),
            max_wal_bytes: 256 * 1024 * 1024,
        }
    }
}

impl Limits {
    /// The PostgreSQL pool's default size, sized for the machine: twice its CPUs (one
    /// connection waiting on the network while another runs), at least 4 and at most 32. On
    /// this project's 2-core machines that is 4; 16 connections served no faster there
    /// (`benches/gateway.rs`), since PostgreSQL shares the same cores.
    pub fn default_pool_size() -> usize {
        std::thread::available_parallelism()
            .map_or(2, std::num::NonZeroUsize::get)
            .saturating_mul(2)
            .clamp(4, 32)
    }
}

/// What interactive transactions may hold (see `docs/adr/0036-interactive-transactions.md`),
/// with defaults in [`TransactionLimits::default`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransactionLimits {
    /// Transactions open at once; past it opening one answers `503 UNAVAILABLE` with
    /// `Retry-After`. 0 switches interactive transactions off. Default 16. On PostgreSQL each
    /// open transaction holds one connection of the pool, and at most `pool_size - 1` are held
    /// so (an open past them waits at most the statement timeout).
    pub max_open: usize,
    /// How long a transaction may wait for its client's next request; past it the server rolls
    /// it back, and later requests get `410 TRANSACTION_EXPIRED`. Default 10 s.
    pub idle_timeout: Duration,
    /// How long a transaction may stay open in all, however busy. Default 60 s.
    pub max_lifetime: Duration,
}

impl Default for TransactionLimits {
    fn default() -> Self {
        TransactionLimits {
            max_open: 16,
            idle_timeout: Duration::from_secs(10),
            max_lifetime: Duration::from_secs(60),
        }
    }
}

/// PostgreSQL streaming replicas that serve verified reads (see
/// `docs/adr/0039-read-replicas-and-bookmarks.md`), with defaults in [`ReadReplicas::default`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadReplicas {
    /// Each replica's URL: its host, port, database and TLS settings (the server logs in there
    /// as its client role, whose password replicates from the primary; the URL's own role
    /// watches the replica's health and lag). Default: none, every request goes to the primary.
    pub urls: Vec<PostgresUrl>,
    /// A replica further behind the primary than this is skipped. Default 5 s.
    pub max_lag: Duration,
    /// How long a read that carries a bookmark waits for a replica to replay that far before
    /// the primary serves it instead. Default 100 ms.
    pub wait: Duration,
}

impl Default for ReadReplicas {
    fn default() -> Self {
        ReadReplicas {
            urls: Vec::new(),
            max_lag: Duration::from_secs(5),
            wait: Duration::from_millis(100),
        }
    }
}

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
    /// Where the other replicas on the same database reach this one (`http://HOST:PORT`): a
    /// request for an interactive transaction this server holds that reaches another replica
    /// is forwarded here. `None` (the default): not forwarded (the other replica answers `410
    /// TRANSACTION_EXPIRED`).
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

/// Which database the server serves.
///
/// Parsed from a URL: `sqlite::memory:` for a private in-memory database, `sqlite:PATH` or
/// `sqlite://PATH` for a file (created when missing), `postgres://USER[:PASSWORD]@HOST[:PORT]/DB`
/// (or `postgresql://`, with libpq's query parameters) for a PostgreSQL database.
///
/// ```
/// use std::path::PathBuf;
/// use sqlhttp_server::Database;
///
/// assert_eq!("sqlite::memory:".parse::<Database>().unwrap(), Database::Memory);
/// assert_eq!(
///     "sqlite://data/app.db".parse::<Database>().unwrap(),
///     Database::File(PathBuf::from("data/app.db"))
/// );
/// assert!(matches!(
///     "postgres://app@db.internal:5432/app".parse::<Database>().unwrap(),
///     Database::Postgres(_)
/// ));
/// assert!("mysql://localhost".parse::<Database>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Database {
    /// An in-memory database that lives as long as the server.
    #[default]
    Memory,
    /// A database file at this path.
    File(PathBuf),
    /// A PostgreSQL database (see `docs/adr/0018-postgresql-engine.md`).
    Postgres(PostgresUrl),
}

/// The login role client statements run as on PostgreSQL, unless configured otherwise.
pub const DEFAULT_CLIENT_ROLE: &str = "sqlhttp_client";

/// A PostgreSQL connection URL, and the role client statements log in as
/// ([`DEFAULT_CLIENT_ROLE`] unless [`PostgresUrl::with_client_role`] says otherwise). `Debug`
/// and `Display` never print the password.
///
/// The URL's own role prepares the database at start (it creates the client role and the
/// server's store); client statements never run as it. See `docs/adr/0020-postgresql-client-login.md`.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresUrl {
    url: String,
    /// `url` without the TLS parameters the server reads itself (`sslmode`, `sslrootcert`),
    /// which tokio-postgres does not know in full.
    driver: String,
    ssl: PgSsl,
    client_role: String,
}

/// libpq's `sslmode`: whether the server's connections to PostgreSQL use TLS, and what they
/// check (see `docs/adr/0033-tls-both-ways.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    /// Never TLS.
    Disable,
    /// TLS when PostgreSQL offers it, else plain (libpq's default, and the server's).
    Prefer,
    /// TLS or nothing; the certificate is not checked (unless `sslrootcert` names a file).
    Require,
    /// TLS, the certificate signed by a trusted CA.
    VerifyCa,
    /// TLS, the certificate signed by a trusted CA and issued for the URL's host.
    VerifyFull,
}

/// libpq's `sslrootcert`: the CAs a certificate is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RootCert {
    /// `sslrootcert=system`: the built-in roots (Mozilla's, compiled in); forces `verify-full`.
    System,
    /// A PEM file of CA certificates.
    File(PathBuf),
}

/// The TLS parameters of a PostgreSQL URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PgSsl {
    pub(crate) mode: SslMode,
    /// `None`: not given (the built-in roots, for `verify-ca` and `verify-full` only).
    pub(crate) root_cert: Option<RootCert>,
}

impl PgSsl {
    /// Takes `sslmode` and `sslrootcert` out of `url`'s query string: the URL left for the
    /// driver, and the settings, with libpq's rules (`sslrootcert=system` means `verify-full`
    /// and refuses a weaker mode).
    fn split(url: &str) -> Result<(String, PgSsl), String> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut mode = None;
        let mut root_cert = None;
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match percent_decode(key)?.as_str() {
                "sslmode" => {
                    mode = Some(match percent_decode(value)?.as_str() {
                        "disable" => SslMode::Disable,
                        "prefer" => SslMode::Prefer,
                        "require" => SslMode::Require,
                        "verify-ca" => SslMode::VerifyCa,
                        "verify-full" => SslMode::VerifyFull,
                        "allow" => {
                            return Err(
                                "sslmode=allow is not supported: use prefer or disable".to_owned()
                            );
                        }
                        other => {
                            return Err(format!(
                                "sslmode={other} is not one of disable, prefer, require, \
                                 verify-ca, verify-full"
                            ));
                        }
                    });
                }
                "sslrootcert" => {
                    root_cert = Some(match percent_decode(value)?.as_str() {
                        "" => return Err("sslrootcert is empty".to_owned()),
                        "system" => RootCert::System,
                        path => RootCert::File(PathBuf::from(path)),
                    });
                }
                "sslnegotiation" if percent_decode(value)? == "direct" => {
                    return Err("sslnegotiation=direct is not supported: leave it out (the \
                                server asks PostgreSQL for TLS first, as libpq does by default)"
                        .to_owned());
                }
                "channel_binding" if percent_decode(value)? == "require" => {
                    return Err(
                        "channel_binding=require is not supported (the server's TLS \
                                does not bind SCRAM to the channel): leave it out, and use \
                                sslmode=verify-full"
                            .to_owned(),
                    );
                }
                _ => kept.push(pair),
            }
        }
        let mode = match (mode, &root_cert) {
            (None, Some(RootCert::System)) | (Some(SslMode::VerifyFull), _) => SslMode::VerifyFull,
            (Some(weaker), Some(RootCert::System)) => {
                return Err(format!(
                    "sslrootcert=system takes sslmode=verify-full (libpq's rule: anyone can get a \
                     publicly trusted certificate for a name they control), not {}",
                    weaker.name()
                ));
            }
            (Some(mode), _) => mode,
            (None, _) => SslMode::Prefer,
        };
        let driver = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        Ok((driver, PgSsl { mode, root_cert }))
    }
}

impl SslMode {
    /// The mode as the URL spells it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// A URL query's `%XX` escapes decoded (`+` stays itself, as libpq reads it).
fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let byte = text
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or_else(|| format!("invalid percent-encoding in {text:?}"))?;
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{text:?} is not UTF-8 once decoded"))
}

impl PostgresUrl {
    /// The URL with its password, for the driver only (without the TLS parameters: see
    /// [`PostgresUrl::ssl`]).
    pub(crate) fn secret(&self) -> &str {
        &self.driver
    }

    /// The URL's TLS settings (`sslmode`, `sslrootcert`).
    pub(crate) fn ssl(&self) -> &PgSsl {
        &self.ssl
    }

    /// The role client statements log in as.
    pub fn client_role(&self) -> &str {
        &self.client_role
    }

    /// Client statements log in as `role`: a plain identifier (lowercase ASCII letters, digits
    /// and `_`, not starting with a digit, at most 63 bytes), so it needs no quoting; not one of
    /// PostgreSQL's reserved `pg_*` names, nor `_sqlhttp` (the server's schema, which would come
    /// first in the role's search path).
    ///
    /// ```
    /// use sqlhttp_server::Database;
    ///
    /// let Database::Postgres(url) = "postgres://admin@db/app".parse().unwrap() else {
    ///     unreachable!()
    /// };
    /// assert_eq!(url.client_role(), "sqlhttp_client");
    /// assert_eq!(url.clone().with_client_role("app_client").unwrap().client_role(), "app_client");
    /// assert!(url.clone().with_client_role("Robert'); DROP").is_err());
    /// assert!(url.with_client_role("pg_monitor").is_err());
    /// ```
    ///
    /// # Errors
    /// [`ServerError::InvalidClientRole`] when `role` is not such an identifier.
    pub fn with_client_role(mut self, role: &str) -> Result<PostgresUrl, ServerError> {
        let plain = !role.is_empty()
            && role.len() <= 63
            && !role.starts_with(|c: char| c.is_ascii_digit())
            && role
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            && !role.starts_with("pg_")
            && role != "_sqlhttp";
        if !plain {
            return Err(ServerError::InvalidClientRole {
                role: role.to_owned(),
            });
        }
        self.client_role = role.to_owned();
        Ok(self)
    }
}

impl std::fmt::Display for PostgresUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `scheme://user:password@host` → `scheme://user:***@host`.
        let (scheme, rest) = self
            .url
            .split_once("://")
            .unwrap_or(("postgres", &self.url));
        match rest.split_once('@') {
            Some((userinfo, host)) if userinfo.contains(':') => {
                let user = userinfo.split(':').next().unwrap_or_default();
                write!(f, "{scheme}://{user}:***@{host}")
            }
            _ => write!(f, "{scheme}://{rest}"),
        }
    }
}

impl std::fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PostgresUrl")
            .field(&self.to_string())
            .finish()
    }
}

/// Why a PostgreSQL URL is refused by a server built without the `postgres` feature.
#[cfg_attr(feature = "postgres", allow(dead_code))]
pub(crate) const NO_POSTGRES: &str = "this sqlhttpd was built without PostgreSQL support: build \
it with the default `postgres` feature (`cargo build -p sqlhttp-server`)";

impl FromStr for Database {
    type Err = ServerError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        let invalid = |reason: &str| ServerError::InvalidDatabaseUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let mut parsed = PostgresUrl {
                url: url.to_owned(),
                driver: url.to_owned(),
                ssl: PgSsl {
                    mode: SslMode::Prefer,
                    root_cert: None,
                },
                client_role: DEFAULT_CLIENT_ROLE.to_owned(),
            };
            let (driver, ssl) =
                PgSsl::split(url).map_err(|reason| ServerError::InvalidDatabaseUrl {
                    url: parsed.to_string(),
                    reason,
                })?;
            (parsed.driver, parsed.ssl) = (driver, ssl);
            #[cfg(not(feature = "postgres"))]
            return Err(ServerError::InvalidDatabaseUrl {
                url: parsed.to_string(),
                reason: NO_POSTGRES.to_owned(),
            });
            #[cfg(feature = "postgres")]
            return match parsed.driver.parse::<tokio_postgres::Config>() {
                Ok(_) => Ok(Database::Postgres(parsed)),
                // The driver's message never quotes the password.
                Err(e) => Err(ServerError::InvalidDatabaseUrl {
                    url: parsed.to_string(),
                    reason: e.to_string(),
                }),
            };
        }
        let rest = url.strip_prefix("sqlite:").ok_or_else(|| {
            invalid(
                "expected `sqlite::memory:`, `sqlite:PATH`, `sqlite://PATH` or \
                 `postgres://USER@HOST:PORT/DB`",
            )
        })?;
        let path = rest.strip_prefix("//").unwrap_or(rest);
        match path {
            "" => Err(invalid("the path is empty")),
            ":memory:" => Ok(Database::Memory),
            path => Ok(Database::File(PathBuf::from(path))),
        }
    }
}

/// Parses a duration as accepted by `--idempotency-ttl`: a positive integer followed by an
/// optional unit, `ms`, `s` (the default), `m`, `h` or `d`.
///
/// ```
/// use std::time::Duration;
/// use sqlhttp_server::parse_duration;
///
/// assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
/// assert_eq!(parse_duration("15m").unwrap(), Duration::from_secs(900));
/// assert_eq!(parse_duration("24h").unwrap(), Duration::from_secs(86_400));
/// assert!(parse_duration("0s").is_err());
/// assert!(parse_duration("soon").is_err());
/// ```
pub fn parse_duration(input: &str) -> Result<Duration, ServerError> {
    let invalid = |reason: &str| ServerError::InvalidDuration {
        input: input.to_owned(),
        reason: reason.to_owned(),
    };
    let trimmed = input.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    if digits.is_empty() {
        return Err(invalid("expected a number followed by ms, s, m, h or d"));
    }
    let value: u64 = digits
        .parse()
        .map_err(|_| invalid("the number is too large"))?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(invalid("unknown unit; use ms, s, m, h or d")),
    };
    let millis = value
        .checked_mul(millis_per_unit)
        .ok_or_else(|| invalid("the duration is too large"))?;
    if millis == 0 {
        return Err(invalid("the duration must be positive"));
    }
    Ok(Duration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_urls() {
        assert_eq!(
            Database::from_str("sqlite::memory:").unwrap(),
            Database::Memory
        );
        assert_eq!(
            Database::from_str("sqlite://:memory:").unwrap(),
            Database::Memory
        );
        assert_eq!(
            Database::from_str("sqlite:app.db").unwrap(),
            Database::File(PathBuf::from("app.db"))
        );
        assert_eq!(
            Database::from_str("sqlite:///var/lib/app.db").unwrap(),
            Database::File(PathBuf::from("/var/lib/app.db"))
        );
        for bad in [
            "",
            "sqlite:",
            "sqlite://",
            "app.db",
            "mysql://x",
            "postgres://x:1:2:3/",
            "SQLITE:app.db",
        ] {
            let err = Database::from_str(bad).unwrap_err();
            assert!(
                matches!(err, ServerError::InvalidDatabaseUrl { .. }),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn postgres_urls_hide_their_password() {
        let Database::Postgres(url) =
            Database::from_str("postgresql://app:s3cret@db:5432/app?sslmode=disable").unwrap()
        else {
            panic!("a PostgreSQL URL")
        };
        assert_eq!(
            url.to_string(),
            "postgresql://app:***@db:5432/app?sslmode=disable"
        );
        assert!(!format!("{url:?}").contains("s3cret"));
        assert!(url.secret().contains("s3cret"));
        let plain = Database::from_str("postgres://postgres@127.0.0.1:5432/postgres").unwrap();
        assert!(format!("{plain:?}").contains("postgres@127.0.0.1:5432"));
    }

    fn ssl_of(url: &str) -> Result<PgSsl, ServerError> {
        match Database::from_str(url)? {
            Database::Postgres(url) => Ok(url.ssl().clone()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn sslmode_and_sslrootcert_follow_libpq() {
        let base = "postgres://app:pw@db.example:5432/app";
        let ssl = ssl_of(base).unwrap();
        assert_eq!((ssl.mode, ssl.root_cert), (SslMode::Prefer, None));
        for (mode, expected) in [
            ("disable", SslMode::Disable),
            ("prefer", SslMode::Prefer),
            ("require", SslMode::Require),
            ("verify-ca", SslMode::VerifyCa),
            ("verify-full", SslMode::VerifyFull),
        ] {
            assert_eq!(
                ssl_of(&format!("{base}?sslmode={mode}")).unwrap().mode,
                expected
            );
        }
        // A file, percent-decoded; the other parameters stay the driver's.
        let Database::Postgres(url) = Database::from_str(&format!(
            "{base}?application_name=x&sslmode=verify-ca&sslrootcert=%2Fetc%2Fca.pem&connect_timeout=3"
        ))
        .unwrap() else {
            panic!("PostgreSQL")
        };
        assert_eq!(
            url.ssl().root_cert,
            Some(RootCert::File(PathBuf::from("/etc/ca.pem")))
        );
        assert_eq!(
            url.secret(),
            format!("{base}?application_name=x&connect_timeout=3")
        );
        assert!(url.to_string().contains("sslmode=verify-ca"), "{url}");
        // `system` means verify-full and refuses weaker modes, as libpq 16 does.
        let system = ssl_of(&format!("{base}?sslrootcert=system")).unwrap();
        assert_eq!(
            (system.mode, system.root_cert),
            (SslMode::VerifyFull, Some(RootCert::System))
        );
        for weak in ["require", "verify-ca", "prefer", "disable"] {
            let e = ssl_of(&format!("{base}?sslmode={weak}&sslrootcert=system")).unwrap_err();
            assert!(e.to_string().contains("verify-full"), "{e}");
        }
        for (bad, says) in [
            ("sslmode=allow", "use prefer or disable"),
            ("sslmode=verify", "not one of"),
            ("sslrootcert=", "empty"),
            ("sslnegotiation=direct", "not supported"),
            ("channel_binding=require", "not supported"),
            ("sslmode=%zz", "percent-encoding"),
        ] {
            let e = ssl_of(&format!("{base}?{bad}")).unwrap_err();
            assert!(
                matches!(e, ServerError::InvalidDatabaseUrl { .. }) && e.to_string().contains(says),
                "{bad}: {e}"
            );
            assert!(!e.to_string().contains(":pw@"), "{e}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2d").unwrap(), Duration::from_secs(172_800));
        assert_eq!(parse_duration(" 5 ").unwrap(), Duration::from_secs(5));
        for bad in ["", "s", "-1s", "1.5h", "10x", "0", "99999999999999999999d"] {
            assert!(
                matches!(
                    parse_duration(bad),
                    Err(ServerError::InvalidDuration { .. })
                ),
                "{bad}"
            );
        }
    }

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
        assert!((4..=32).contains(&pool) && pool % 2 == 0, "{pool}");
        assert_eq!(config.limits.max_batch_statements, 100);
        assert_eq!(config.max_batch_bytes, 8 * 1_048_576);
        assert_eq!(config.http.header_timeout, Duration::from_secs(30));
        assert!(config.http.allow_origins.is_empty());
    }
}
