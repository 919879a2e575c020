//! The `sqlhttpd` binary: command-line flags, logging to stderr (and spans over OTLP when
//! asked), the `listening on` line on stdout, shutdown on Ctrl-C / SIGTERM, and the TLS files
//! read again on SIGHUP.
//!
//! Everything else lives in the `sqlhttp_server` library; this file only parses flags and
//! drives a [`Server`].

use std::io::{IsTerminal as _, Write as _};
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use sqlhttp_server::{
    Config, Database, HttpLimits, Limits, PostgresUrl, RateLimit, ReadReplicas, Server, TlsFiles,
    TlsReloader, TransactionLimits, parse_duration, read_token_file,
};

/// Environment variable with comma-separated tokens, used when no `--token` is given.
const TOKENS_ENV: &str = "SQLHTTPD_TOKENS";
/// Environment variable with comma-separated read-only tokens, used when no `--read-token` is
/// given.
const READ_TOKENS_ENV: &str = "SQLHTTPD_READ_TOKENS";
/// Environment variable with the read replicas' URLs (separated by spaces or commas), used when
/// no `--read-replica` is given.
const READ_REPLICAS_ENV: &str = "SQLHTTPD_READ_REPLICAS";

/// sqlhttpd: the reference server for the sqlhttp wire protocol, on embedded SQLite.
///
/// Every flag can also be set through the environment variable named in its help.
#[derive(Debug, Parser)]
#[command(name = "sqlhttpd", version, about)]
struct Cli {
    /// Address to listen on (port 0 picks a free port).
    #[arg(
        long,
        env = "SQLHTTPD_LISTEN",
        value_name = "ADDR",
        default_value = "127.0.0.1:8080"
    )]
    listen: SocketAddr,

    /// Database URL: `sqlite::memory:` (a throwaway database, removed on exit), `sqlite:PATH`,
    /// `sqlite://PATH`, or `postgres://USER[:PASSWORD]@HOST[:PORT]/DB` for PostgreSQL.
    #[arg(long, env = "SQLHTTPD_DATABASE", value_name = "URL", default_value = "sqlite::memory:", value_parser = parse_database)]
    database: Database,

    /// PostgreSQL only: the role client statements log in as (default `sqlhttp_client`),
    /// created by the server when missing. The --database role only prepares the database; give
    /// each database on one PostgreSQL cluster a client role of its own.
    #[arg(long, env = "SQLHTTPD_CLIENT_ROLE", value_name = "ROLE")]
    client_role: Option<String>,

    /// Accepted bearer token (repeatable). Without any, the comma-separated tokens of
    /// SQLHTTPD_TOKENS are used; with none at all the SQL endpoint is open. Surrounding
    /// whitespace is trimmed (a header cannot carry it); an empty token is refused.
    #[arg(long = "token", value_name = "TOKEN", value_parser = parse_token)]
    tokens: Vec<String>,

    /// A file of accepted bearer tokens, one per line (`#` comments and blank lines allowed),
    /// added to the others; keeps tokens off the command line and out of the environment.
    #[arg(long = "token-file", env = "SQLHTTPD_TOKEN_FILE", value_name = "PATH")]
    token_files: Vec<PathBuf>,

    /// Accepted bearer token that may only read (repeatable): a statement that may write is
    /// refused with 403 READ_ONLY. Without any, the comma-separated tokens of
    /// SQLHTTPD_READ_TOKENS are used.
    #[arg(long = "read-token", value_name = "TOKEN", value_parser = parse_token)]
    read_tokens: Vec<String>,

    /// A file of read-only bearer tokens, in the form of --token-file.
    #[arg(
        long = "read-token-file",
        env = "SQLHTTPD_READ_TOKEN_FILE",
        value_name = "PATH"
    )]
    read_token_files: Vec<PathBuf>,

    /// Serve without any token on an address other than loopback (otherwise refused: anyone
    /// who can reach the address could read and write the database).
    #[arg(long, env = "SQLHTTPD_ALLOW_ANONYMOUS")]
    allow_anonymous: bool,

    /// Requests a second each credential may make (each client address, without a token);
    /// more are answered 429 RATE_LIMITED with Retry-After. Unlimited by default.
    #[arg(long, env = "SQLHTTPD_RATE_LIMIT", value_name = "N")]
    rate_limit: Option<NonZeroU32>,

    /// Requests a credential may make at once after a quiet spell (default: the rate limit).
    #[arg(
        long,
        env = "SQLHTTPD_RATE_BURST",
        value_name = "N",
        requires = "rate_limit"
    )]
    rate_burst: Option<NonZeroU32>,

    /// Largest accepted request body, in bytes.
    #[arg(long, env = "SQLHTTPD_MAX_BODY_BYTES", value_name = "N", default_value_t = sqlhttp_server::DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,

    /// Request bodies held at once across all requests, in bytes; past it 503.
    #[arg(long, env = "SQLHTTPD_MAX_BUFFERED_BYTES", value_name = "N", default_value_t = sqlhttp_server::DEFAULT_MAX_BUFFERED_BYTES)]
    max_buffered_bytes: usize,

    /// Largest accepted atomic batch body (POST /api/v1/batch), in bytes.
    #[arg(long, env = "SQLHTTPD_MAX_BATCH_BYTES", value_name = "N", default_value_t = sqlhttp_server::DEFAULT_MAX_BATCH_BYTES)]
    max_batch_bytes: usize,

    /// Memory SQLite may use at once for every connection together (sorts, DISTINCT and
    /// temporary tables are held in memory); past it a statement answers 503. SQLite only.
    #[arg(long, env = "SQLHTTPD_MAX_ENGINE_MEMORY", value_name = "N", default_value_t = Limits::default().max_engine_memory)]
    max_engine_memory: usize,

    /// Most statements in one atomic batch.
    #[arg(long, env = "SQLHTTPD_MAX_BATCH_STATEMENTS", value_name = "N", default_value_t = Limits::default().max_batch_statements)]
    max_batch_statements: usize,

    /// How long Idempotency-Key outcomes are kept: seconds, or a number with ms, s, m, h or d.
    #[arg(long, env = "SQLHTTPD_IDEMPOTENCY_TTL", value_name = "DURATION", default_value = "24h", value_parser = parse_positive_duration)]
    idempotency_ttl: Duration,

    /// Ignore Idempotency-Key headers.
    #[arg(long, env = "SQLHTTPD_NO_IDEMPOTENCY")]
    no_idempotency: bool,

    /// Where the other replicas on the same database reach this one (http://HOST:PORT): they
    /// forward requests for the interactive transactions it holds.
    #[arg(long, env = "SQLHTTPD_ADVERTISE_URL", value_name = "URL", value_parser = parse_advertise_url)]
    advertise_url: Option<String>,

    /// A streaming replica of the PostgreSQL --database (repeatable; or SQLHTTPD_READ_REPLICAS,
    /// URLs separated by spaces or commas): verified reads go to a healthy one.
    #[arg(long = "read-replica", value_name = "URL", value_parser = parse_replica)]
    read_replicas: Vec<PostgresUrl>,

    /// A replica further behind the primary than this serves no reads.
    #[arg(long, env = "SQLHTTPD_MAX_REPLICA_LAG", value_name = "DURATION", default_value = "5s", value_parser = parse_positive_duration)]
    max_replica_lag: Duration,

    /// How long a read carrying a bookmark waits for a replica that far before the primary
    /// serves it.
    #[arg(long, env = "SQLHTTPD_REPLICA_WAIT", value_name = "DURATION", default_value = "100ms", value_parser = parse_duration_or_zero)]
    replica_wait: Duration,

    /// Interactive transactions open at once (503 past it); 0 switches them off.
    #[arg(long, env = "SQLHTTPD_MAX_TRANSACTIONS", value_name = "N", default_value_t = TransactionLimits::default().max_open)]
    max_transactions: usize,

    /// How long an interactive transaction may wait for its client before it is rolled back.
    #[arg(long, env = "SQLHTTPD_TRANSACTION_IDLE_TIMEOUT", value_name = "DURATION", default_value = "10s", value_parser = parse_positive_duration)]
    transaction_idle_timeout: Duration,

    /// How long an interactive transaction may stay open in all before it is rolled back.
    #[arg(long, env = "SQLHTTPD_TRANSACTION_MAX_LIFETIME", value_name = "DURATION", default_value = "60s", value_parser = parse_positive_duration)]
    transaction_max_lifetime: Duration,

    /// How long an interactive write transaction may hold SQLite's one writer without running a
    /// statement before it is rolled back (SQLite only).
    #[arg(long, env = "SQLHTTPD_TRANSACTION_WRITE_IDLE", value_name = "DURATION", default_value = "2s", value_parser = parse_positive_duration)]
    transaction_write_idle: Duration,

    /// The write-ahead log's hard bound in bytes: past it writes wait, then answer 503, until a
    /// checkpoint truncates the log (tried past a quarter of it). SQLite only.
    #[arg(long, env = "SQLHTTPD_MAX_WAL_BYTES", value_name = "N", default_value_t = Limits::default().max_wal_bytes)]
    max_wal_bytes: u64,

    /// How long one statement may run before it is interrupted (422 STATEMENT_TIMEOUT).
    #[arg(long, env = "SQLHTTPD_STATEMENT_TIMEOUT", value_name = "DURATION", default_value = "30s", value_parser = parse_positive_duration)]
    statement_timeout: Duration,

    /// Longest accepted SQL text, in bytes.
    #[arg(long, env = "SQLHTTPD_MAX_SQL_BYTES", value_name = "N", default_value_t = Limits::default().max_sql_bytes)]
    max_sql_bytes: usize,

    /// Largest string or blob the engine holds, bound or computed, in bytes.
    #[arg(long, env = "SQLHTTPD_MAX_VALUE_BYTES", value_name = "N", default_value_t = Limits::default().max_value_bytes)]
    max_value_bytes: usize,

    /// Largest success body built whole, in bytes: a keyed write's outcome, stored for replay
    /// (422 RESULT_TOO_LARGE past it). Other results stream and are not limited.
    #[arg(long, env = "SQLHTTPD_MAX_RESULT_BYTES", value_name = "N", default_value_t = Limits::default().max_result_bytes)]
    max_result_bytes: usize,

    /// Statements that may wait for a connection (per pool) before the server answers 503.
    #[arg(long, env = "SQLHTTPD_QUEUE_DEPTH", value_name = "N", default_value_t = Limits::default().queue_depth)]
    queue_depth: usize,

    /// Reader connections beside the one writer (0 runs everything on the writer); SQLite only.
    #[arg(long, env = "SQLHTTPD_READ_CONNECTIONS", value_name = "N", default_value_t = Limits::default().read_connections)]
    read_connections: usize,

    /// Connections to PostgreSQL (default: twice the CPUs, at least 4, at most 32); PostgreSQL only.
    #[arg(long, env = "SQLHTTPD_POOL_SIZE", value_name = "N", default_value_t = Limits::default_pool_size())]
    pool_size: usize,

    /// Time a connection has to send a request head; also the longest idle keep-alive.
    #[arg(long, env = "SQLHTTPD_HEADER_TIMEOUT", value_name = "DURATION", default_value = "30s", value_parser = parse_positive_duration)]
    header_timeout: Duration,

    /// Time a request has to send its whole body (408 REQUEST_TIMEOUT).
    #[arg(long, env = "SQLHTTPD_BODY_TIMEOUT", value_name = "DURATION", default_value = "30s", value_parser = parse_positive_duration)]
    body_timeout: Duration,

    /// Longest a response may make no progress (its client reads nothing), and the time in
    /// which a client the server waits on must take at least 64 KiB; then the connection is
    /// closed and its statement stops.
    #[arg(long, env = "SQLHTTPD_SEND_TIMEOUT", value_name = "DURATION", default_value = "30s", value_parser = parse_positive_duration)]
    send_timeout: Duration,

    /// Open connections at most; more are answered 503 and closed.
    #[arg(long, env = "SQLHTTPD_MAX_CONNECTIONS", value_name = "N", default_value_t = HttpLimits::default().max_connections)]
    max_connections: usize,

    /// A browser origin allowed to call the server, such as `https://app.example.com`
    /// (repeatable, or comma-separated in the variable). Requests from any other origin are
    /// refused with 403; by default no browser origin is allowed.
    #[arg(
        long = "allow-origin",
        env = "SQLHTTPD_ALLOW_ORIGINS",
        value_name = "ORIGIN",
        value_delimiter = ','
    )]
    allow_origins: Vec<String>,

    /// Serve HTTPS (HTTP/1.1, and HTTP/2 by ALPN) with this PEM certificate chain (the
    /// server's certificate first); needs --tls-key. Read again on SIGHUP: new connections get
    /// the new certificate, open ones keep theirs.
    #[arg(
        long,
        env = "SQLHTTPD_TLS_CERT",
        value_name = "PATH",
        requires = "tls_key"
    )]
    tls_cert: Option<PathBuf>,

    /// The PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1).
    #[arg(
        long,
        env = "SQLHTTPD_TLS_KEY",
        value_name = "PATH",
        requires = "tls_cert"
    )]
    tls_key: Option<PathBuf>,

    /// Require a client certificate signed by one of this PEM file's CAs (mutual TLS); needs
    /// --tls-cert.
    #[arg(
        long,
        env = "SQLHTTPD_TLS_CLIENT_CA",
        value_name = "PATH",
        requires = "tls_cert"
    )]
    tls_client_ca: Option<PathBuf>,

    /// Export the server's spans (each request's, continuing its caller's W3C trace) over
    /// OTLP/HTTP (protobuf, plain HTTP) to this collector's base URL, e.g. http://127.0.0.1:4318
    /// (`/v1/traces` is appended). Without it, the standard OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
    /// OTEL_EXPORTER_OTLP_ENDPOINT turns the export on; other OTEL_EXPORTER_OTLP_* and OTEL_BSP_*
    /// variables apply. Off by default: no exporter, no cost.
    #[arg(long, value_name = "URL", value_parser = parse_otlp_endpoint)]
    otlp_endpoint: Option<String>,
}

fn parse_otlp_endpoint(url: &str) -> Result<String, String> {
    match url.parse::<axum::http::Uri>() {
        // Plain HTTP: the binary carries no TLS client for this (a collector agent beside it
        // takes the spans on to a TLS endpoint).
        Ok(uri) if uri.scheme_str() == Some("http") && uri.host().is_some() => {
            Ok(format!("{}/v1/traces", url.trim_end_matches('/')))
        }
        _ => Err(format!(
            "{url:?} is not an http:// URL (for a TLS collector, send to an agent beside sqlhttpd)"
        )),
    }
}

/// Where spans are exported, when they are: the flag's URL, or the standard environment's.
fn otlp_target(flag: Option<String>) -> Option<Option<String>> {
    if flag.is_some() {
        return Some(flag);
    }
    let set = |name: &str| std::env::var_os(name).is_some_and(|value| !value.is_empty());
    (set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") || set("OTEL_EXPORTER_OTLP_ENDPOINT"))
        .then_some(None)
}

fn parse_database(url: &str) -> Result<Database, String> {
    url.parse()
        .map_err(|e: sqlhttp_server::ServerError| e.to_string())
}

fn parse_replica(url: &str) -> Result<PostgresUrl, String> {
    match parse_database(url.trim())? {
        Database::Postgres(url) => Ok(url),
        _ => Err("a read replica is a postgres:// URL".to_owned()),
    }
}

fn parse_duration_or_zero(input: &str) -> Result<Duration, String> {
    if input.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    parse_positive_duration(input)
}

/// The replicas of the flags, or else of `SQLHTTPD_READ_REPLICAS`.
fn gather_replicas(flags: Vec<PostgresUrl>) -> Result<Vec<PostgresUrl>, String> {
    if !flags.is_empty() {
        return Ok(flags);
    }
    std::env::var(READ_REPLICAS_ENV)
        .unwrap_or_default()
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|url| !url.is_empty())
        .map(|url| parse_replica(url).map_err(|e| format!("{READ_REPLICAS_ENV}: {e}")))
        .collect()
}

fn parse_token(token: &str) -> Result<String, String> {
    let token = token.trim();
    if token.is_empty() {
        Err("a token must not be empty (omit --token for an open server)".to_owned())
    } else {
        Ok(token.to_owned())
    }
}

fn parse_advertise_url(input: &str) -> Result<String, String> {
    let url = input.trim().trim_end_matches('/');
    match url.parse::<http::Uri>() {
        Ok(uri)
            if uri.scheme_str() == Some("http")
                && uri.authority().is_some()
                && uri.path() == "/" =>
        {
            Ok(url.to_owned())
        }
        _ => Err(
            "an http://HOST:PORT URL (replicas forward over plain HTTP, inside the network)"
                .to_owned(),
        ),
    }
}

fn parse_positive_duration(input: &str) -> Result<Duration, String> {
    parse_duration(input).map_err(|e| e.to_string())
}

/// The tokens of the flags (or else of the environment variable `env`), then of the files.
fn gather_tokens(flags: Vec<String>, env: &str, files: &[PathBuf]) -> Result<Vec<String>, String> {
    let mut tokens = if flags.is_empty() {
        std::env::var(env)
            .map(|list| split_tokens(&list))
            .unwrap_or_default()
    } else {
        flags
    };
    tokens.retain(|t| !t.is_empty());
    for file in files {
        tokens.extend(read_token_file(file).map_err(|e| e.to_string())?);
    }
    Ok(tokens)
}

impl Cli {
    fn into_config(self) -> Result<Config, String> {
        let tokens = gather_tokens(self.tokens, TOKENS_ENV, &self.token_files)?;
        let read_tokens = gather_tokens(self.read_tokens, READ_TOKENS_ENV, &self.read_token_files)?;
        let rate_limit = self.rate_limit.map(|per_second| RateLimit {
            per_second,
            burst: self.rate_burst.unwrap_or(per_second),
        });
        let database = match (self.database, self.client_role) {
            (Database::Postgres(url), Some(role)) => {
                Database::Postgres(url.with_client_role(&role).map_err(|e| e.to_string())?)
            }
            (_, Some(_)) => {
                return Err("--client-role is for a PostgreSQL --database".to_owned());
            }
            (database, None) => database,
        };
        let mut replicas = gather_replicas(self.read_replicas)?;
        match &database {
            Database::Postgres(primary) => {
                for replica in &mut replicas {
                    *replica = replica
                        .clone()
                        .with_client_role(primary.client_role())
                        .map_err(|e| e.to_string())?;
                }
            }
            _ if !replicas.is_empty() => {
                return Err("--read-replica is for a PostgreSQL --database".to_owned());
            }
            _ => {}
        }
        let tls = match (self.tls_cert, self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert,
                key,
                client_ca: self.tls_client_ca,
            }),
            _ => None,
        };
        Ok(Config {
            tls,
            listen: self.listen,
            database,
            tokens,
            read_tokens,
            allow_anonymous: self.allow_anonymous,
            rate_limit,
            max_body_bytes: self.max_body_bytes,
            max_batch_bytes: self.max_batch_bytes,
            max_buffered_bytes: self.max_buffered_bytes,
            idempotency_ttl: (!self.no_idempotency).then_some(self.idempotency_ttl),
            limits: Limits {
                statement_timeout: self.statement_timeout,
                max_sql_bytes: self.max_sql_bytes,
                max_value_bytes: self.max_value_bytes,
                max_result_bytes: self.max_result_bytes,
                queue_depth: self.queue_depth,
                read_connections: self.read_connections,
                pool_size: self.pool_size,
                max_batch_statements: self.max_batch_statements,
                max_engine_memory: self.max_engine_memory,
                transaction_write_idle: self.transaction_write_idle,
                max_wal_bytes: self.max_wal_bytes,
            },
            advertise_url: self.advertise_url,
            read_replicas: ReadReplicas {
                urls: replicas,
                max_lag: self.max_replica_lag,
                wait: self.replica_wait,
            },
            transactions: TransactionLimits {
                max_open: self.max_transactions,
                idle_timeout: self.transaction_idle_timeout,
                max_lifetime: self.transaction_max_lifetime,
            },
            http: HttpLimits {
                header_timeout: self.header_timeout,
                body_timeout: self.body_timeout,
                send_timeout: self.send_timeout,
                max_connections: self.max_connections,
                allow_origins: self
                    .allow_origins
                    .into_iter()
                    .map(|origin| origin.trim().to_owned())
                    .filter(|origin| !origin.is_empty())
                    .collect(),
            },
        })
    }
}

fn split_tokens(list: &str) -> Vec<String> {
    list.split(',').map(|t| t.trim().to_owned()).collect()
}

/// Logs to stderr as `RUST_LOG` says (default `info`); with `otlp` (an endpoint, or `None` for
/// the standard environment's), also exports the spans at `info` and above over OTLP/HTTP in
/// batches from a thread of their own. Returns the provider to flush at exit.
fn init_logging(
    otlp: Option<Option<String>>,
) -> Result<Option<opentelemetry_sdk::trace::SdkTracerProvider>, String> {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig as _;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;

    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(filter);
    let provider = match otlp {
        None => None,
        Some(endpoint) => {
            let mut exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
            if let Some(endpoint) = endpoint {
                exporter = exporter.with_endpoint(endpoint);
            }
            let exporter = exporter
                .build()
                .map_err(|e| format!("cannot export spans over OTLP: {e}"))?;
            let resource = opentelemetry_sdk::Resource::builder()
                .with_service_name("sqlhttpd")
                .build();
            Some(
                opentelemetry_sdk::trace::SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(resource)
                    .build(),
            )
        }
    };
    let spans = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("sqlhttpd"))
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO)
    });
    tracing_subscriber::registry().with(log).with(spans).init();
    Ok(provider)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

/// How long a SIGHUP's reading of the TLS files may take before it is abandoned.
#[cfg(unix)]
const RELOAD_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Reads the TLS files again on every SIGHUP, for as long as the server runs: on a thread of its
/// own, abandoned after [`RELOAD_WITHIN`] (a stuck mount must stall neither the async workers
/// nor shutdown).
#[cfg(unix)]
fn reload_on_hangup(reloader: TlsReloader) -> Result<(), String> {
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| format!("cannot listen for SIGHUP: {e}"))?;
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match reloader.reload_within(RELOAD_WITHIN).await {
                Ok(()) => tracing::info!("SIGHUP: TLS files read again; new connections use them"),
                Err(e) => tracing::error!(
                    error = %e,
                    "SIGHUP: the TLS files do not load; keeping the ones in use"
                ),
            }
        }
    });
    Ok(())
}

#[cfg(not(unix))]
fn reload_on_hangup(_: TlsReloader) -> Result<(), String> {
    Ok(())
}

async fn run(config: Config) -> Result<(), String> {
    let server = Server::bind(config).await.map_err(|e| e.to_string())?;
    if let Some(reloader) = server.tls_reloader() {
        reload_on_hangup(reloader)?;
    }
    let scheme = if server.is_tls() { "https" } else { "http" };
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on {scheme}://{}", server.local_addr())
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("cannot write to stdout: {e}"))?;
    drop(stdout);
    server
        .serve_until(shutdown_signal())
        .await
        .map_err(|e| format!("server error: {e}"))
}

fn main() -> ExitCode {
    let mut cli = Cli::parse();
    let spans = match init_logging(otlp_target(cli.otlp_endpoint.take())) {
        Ok(spans) => spans,
        Err(message) => {
            eprintln!("sqlhttpd: {message}");
            return ExitCode::FAILURE;
        }
    };
    let code = run_main(cli);
    // The spans still in the exporter's batch go out before the process ends.
    if let Some(spans) = spans {
        let _ = spans.shutdown();
    }
    code
}

fn run_main(cli: Cli) -> ExitCode {
    let config = match cli.into_config() {
        Ok(config) => config,
        Err(message) => {
            eprintln!("sqlhttpd: {message}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("sqlhttpd: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("sqlhttpd: {message}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_build_the_config() {
        let cli = Cli::try_parse_from([
            "sqlhttpd",
            "--listen",
            "127.0.0.1:0",
            "--database",
            "sqlite:x.db",
            "--token",
            "a,b",
            "--token",
            "c",
            "--max-body-bytes",
            "10",
            "--idempotency-ttl",
            "15m",
            "--statement-timeout",
            "2s",
            "--read-connections",
            "0",
            "--pool-size",
            "9",
            "--allow-origin",
            "https://a.example",
            "--allow-origin",
            "http://localhost:3000",
            "--max-connections",
            "7",
            "--max-batch-bytes",
            "4096",
            "--max-batch-statements",
            "3",
        ])
        .unwrap();
        let config = cli.into_config().unwrap();
        assert_eq!(config.listen.port(), 0);
        assert_eq!(config.database, "sqlite:x.db".parse().unwrap());
        assert_eq!(config.tokens, ["a,b", "c"]);
        assert_eq!(config.max_body_bytes, 10);
        assert_eq!(config.idempotency_ttl, Some(Duration::from_secs(900)));
        assert_eq!(config.limits.statement_timeout, Duration::from_secs(2));
        assert_eq!(config.limits.read_connections, 0);
        assert_eq!(config.limits.pool_size, 9);
        assert_eq!(config.http.max_connections, 7);
        assert_eq!(config.max_batch_bytes, 4096);
        assert_eq!(config.limits.max_batch_statements, 3);
        assert_eq!(
            config.http.allow_origins,
            ["https://a.example", "http://localhost:3000"]
        );
    }

    #[test]
    fn defaults_are_the_library_defaults() {
        let config = Cli::try_parse_from(["sqlhttpd"])
            .unwrap()
            .into_config()
            .unwrap();
        assert_eq!(config.limits, Limits::default());
        assert_eq!(config.http, HttpLimits::default());
        assert_eq!(config.max_batch_bytes, Config::default().max_batch_bytes);
        assert_eq!(config.rate_limit, None);
        assert!(!config.allow_anonymous);
    }

    #[test]
    fn switches_and_bad_values() {
        let cli = Cli::try_parse_from(["sqlhttpd", "--no-idempotency"]).unwrap();
        assert_eq!(cli.into_config().unwrap().idempotency_ttl, None);
        assert!(Cli::try_parse_from(["sqlhttpd", "--database", "mysql://x"]).is_err());
        assert!(Cli::try_parse_from(["sqlhttpd", "--idempotency-ttl", "soon"]).is_err());
        assert!(Cli::try_parse_from(["sqlhttpd", "--listen", "nowhere"]).is_err());
        assert!(Cli::try_parse_from(["sqlhttpd", "--token", ""]).is_err());
        assert!(Cli::try_parse_from(["sqlhttpd", "--token", "  "]).is_err());
        assert!(Cli::try_parse_from(["sqlhttpd", "--rate-limit", "0"]).is_err());
        assert!(Cli::try_parse_from(["sqlhttpd", "--rate-burst", "5"]).is_err());
        assert!(Cli::try_parse_from(["sqlhttpd", "--read-token", ""]).is_err());
    }

    #[test]
    fn the_client_role_is_postgres_only_and_a_plain_identifier() {
        let config = |args: &[&str]| {
            Cli::try_parse_from(["sqlhttpd"].iter().chain(args))
                .unwrap()
                .into_config()
        };
        let postgres = ["--database", "postgres://admin@db/app"];
        let Database::Postgres(url) = config(&postgres).unwrap().database else {
            panic!("a PostgreSQL database");
        };
        assert_eq!(url.client_role(), sqlhttp_server::DEFAULT_CLIENT_ROLE);
        let Database::Postgres(url) =
            config(&[&postgres[..], &["--client-role", "app_client"]].concat())
                .unwrap()
                .database
        else {
            panic!("a PostgreSQL database");
        };
        assert_eq!(url.client_role(), "app_client");
        for bad in [
            "App",
            "1st",
            "",
            "a-b",
            "x\"; drop role y",
            "pg_monitor",
            "_sqlhttp",
        ] {
            assert!(
                config(&[&postgres[..], &["--client-role", bad]].concat()).is_err(),
                "{bad}"
            );
        }
        assert!(config(&["--client-role", "app_client"]).is_err());
    }

    #[test]
    fn roles_files_and_rate_limits() {
        let dir = tempfile::tempdir().unwrap();
        let full = dir.path().join("full");
        let read = dir.path().join("read");
        std::fs::write(
            &full,
            "# ops
from-file
",
        )
        .unwrap();
        std::fs::write(
            &read,
            "viewer-1

viewer-2
",
        )
        .unwrap();
        let cli = Cli::try_parse_from([
            "sqlhttpd",
            "--token",
            "flag",
            "--token-file",
            full.to_str().unwrap(),
            "--read-token",
            "dash",
            "--read-token-file",
            read.to_str().unwrap(),
            "--allow-anonymous",
            "--rate-limit",
            "20",
        ])
        .unwrap();
        let config = cli.into_config().unwrap();
        assert_eq!(config.tokens, ["flag", "from-file"]);
        assert_eq!(config.read_tokens, ["dash", "viewer-1", "viewer-2"]);
        assert!(config.allow_anonymous);
        let limit = config.rate_limit.unwrap();
        assert_eq!((limit.per_second.get(), limit.burst.get()), (20, 20));

        let cli =
            Cli::try_parse_from(["sqlhttpd", "--rate-limit", "5", "--rate-burst", "50"]).unwrap();
        let limit = cli.into_config().unwrap().rate_limit.unwrap();
        assert_eq!((limit.per_second.get(), limit.burst.get()), (5, 50));

        let missing = dir.path().join("missing");
        let cli =
            Cli::try_parse_from(["sqlhttpd", "--token-file", missing.to_str().unwrap()]).unwrap();
        assert!(cli.into_config().unwrap_err().contains("missing"));
    }

    #[test]
    fn tls_flags_come_together() {
        let config = Cli::try_parse_from([
            "sqlhttpd",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "--tls-client-ca",
            "ca.pem",
        ])
        .unwrap()
        .into_config()
        .unwrap();
        assert_eq!(
            config.tls,
            Some(TlsFiles {
                cert: "c.pem".into(),
                key: "k.pem".into(),
                client_ca: Some("ca.pem".into()),
            })
        );
        assert_eq!(
            Cli::try_parse_from(["sqlhttpd"])
                .unwrap()
                .into_config()
                .unwrap()
                .tls,
            None
        );
        assert!(Cli::try_parse_from(["sqlhttpd", "--tls-cert", "c.pem"]).is_err());
        assert!(Cli::try_parse_from(["sqlhttpd", "--tls-key", "k.pem"]).is_err());
        assert!(Cli::try_parse_from(["sqlhttpd", "--tls-client-ca", "ca.pem"]).is_err());
    }

    #[test]
    fn flag_tokens_are_trimmed() {
        let cli = Cli::try_parse_from(["sqlhttpd", "--token", " padded\t"]).unwrap();
        assert_eq!(cli.into_config().unwrap().tokens, ["padded"]);
    }

    #[test]
    fn env_tokens_are_comma_separated() {
        assert_eq!(split_tokens("a, b,,c"), ["a", "b", "", "c"]);
    }
}
