//! The command line: every `sqlhttpd` flag with its environment variable and default
//! ([`Cli`]), and [`Cli::into_config`], which turns them into the library's [`Config`].
//!
//! Flags and their combination only; the values' parsers live in [`super::values`], and
//! nothing here starts a server.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use sqlhttp_server::{
    Config, Database, HttpLimits, Limits, PostgresUrl, RateLimit, ReadReplicas, TlsFiles,
    TransactionLimits,
};

use super::values::{
    gather_replicas, gather_tokens, parse_advertise_url, parse_database, parse_duration_or_zero,
    parse_otlp_endpoint, parse_positive_duration, parse_replica, parse_token,
};

/// Environment variable with comma-separated tokens, used when no `--token` is given.
const TOKENS_ENV: &str = "SQLHTTPD_TOKENS";
/// Environment variable with comma-separated read-only tokens, used when no `--read-token` is
/// given.
const READ_TOKENS_ENV: &str = "SQLHTTPD_READ_TOKENS";

/// sqlhttpd: the reference server for the sqlhttp wire protocol, on embedded SQLite.
///
/// Every flag can also be set through the environment variable named in its help.
#[derive(Debug, Parser)]
#[command(name = "sqlhttpd", version, about)]
pub(crate) struct Cli {
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

    /// Request bodies and whole results held at once across all requests, in bytes; past it
    /// 503. On PostgreSQL each request that builds a whole result (a keyed write, a batch) holds
    /// 64 KiB of it while it has a connection: keep it well above `--pool-size` x 64 KiB plus
    /// one result and one body.
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

    /// Where this process's peers (the other sqlhttpd processes on the same database) reach it
    /// (http://HOST:PORT): they forward requests for the interactive transactions it holds.
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

    /// Connections to PostgreSQL (default: four per CPU, at least 8, at most 32); PostgreSQL only.
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
    pub(crate) otlp_endpoint: Option<String>,
}

impl Cli {
    /// The [`Config`] these flags (and the environment variables they fall back on) describe.
    ///
    /// # Errors
    /// A message for the operator when flags contradict each other or a token file or
    /// variable cannot be read.
    pub(crate) fn into_config(self) -> Result<Config, String> {
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

#[cfg(test)]
mod tests {
    use super::super::values::split_tokens;
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
