//! The `sqlhttpd` binary: command-line flags, logging to stderr, the `listening on` line on
//! stdout, and shutdown on Ctrl-C / SIGTERM.
//!
//! Everything else lives in the `sqlhttp_server` library; this file only parses flags and
//! drives a [`Server`].

use std::io::{IsTerminal as _, Write as _};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use sqlhttp_server::{Config, Database, Server, parse_duration};

/// Environment variable with comma-separated tokens, used when no `--token` is given.
const TOKENS_ENV: &str = "SQLHTTPD_TOKENS";

/// sqlhttpd: the reference server for the sqlhttp wire protocol, on embedded SQLite.
#[derive(Debug, Parser)]
#[command(name = "sqlhttpd", version, about)]
struct Cli {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,

    /// Database URL: `sqlite::memory:`, `sqlite:PATH` or `sqlite://PATH`.
    #[arg(long, value_name = "URL", default_value = "sqlite::memory:", value_parser = parse_database)]
    database: Database,

    /// Accepted bearer token (repeatable). Without any, the comma-separated tokens of
    /// SQLHTTPD_TOKENS are used; with none at all the SQL endpoint is open. Surrounding
    /// whitespace is trimmed (a header cannot carry it); an empty token is refused.
    #[arg(long = "token", value_name = "TOKEN", value_parser = parse_token)]
    tokens: Vec<String>,

    /// Largest accepted request body, in bytes.
    #[arg(long, value_name = "N", default_value_t = sqlhttp_server::DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,

    /// How long Idempotency-Key outcomes are kept: seconds, or a number with ms, s, m, h or d.
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = parse_ttl)]
    idempotency_ttl: Duration,

    /// Ignore Idempotency-Key headers.
    #[arg(long)]
    no_idempotency: bool,
}

fn parse_database(url: &str) -> Result<Database, String> {
    url.parse()
        .map_err(|e: sqlhttp_server::ServerError| e.to_string())
}

fn parse_token(token: &str) -> Result<String, String> {
    let token = token.trim();
    if token.is_empty() {
        Err("a token must not be empty (omit --token for an open server)".to_owned())
    } else {
        Ok(token.to_owned())
    }
}

fn parse_ttl(input: &str) -> Result<Duration, String> {
    parse_duration(input).map_err(|e| e.to_string())
}

impl Cli {
    fn into_config(self) -> Config {
        let tokens = if self.tokens.is_empty() {
            std::env::var(TOKENS_ENV)
                .map(|list| split_tokens(&list))
                .unwrap_or_default()
        } else {
            self.tokens
        };
        Config {
            listen: self.listen,
            database: self.database,
            tokens: tokens.into_iter().filter(|t| !t.is_empty()).collect(),
            max_body_bytes: self.max_body_bytes,
            idempotency_ttl: (!self.no_idempotency).then_some(self.idempotency_ttl),
        }
    }
}

fn split_tokens(list: &str) -> Vec<String> {
    list.split(',').map(|t| t.trim().to_owned()).collect()
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
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

async fn run(config: Config) -> Result<(), String> {
    let server = Server::bind(config).await.map_err(|e| e.to_string())?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on http://{}", server.local_addr())
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("cannot write to stdout: {e}"))?;
    drop(stdout);
    server
        .serve_until(shutdown_signal())
        .await
        .map_err(|e| format!("server error: {e}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let config = cli.into_config();
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
        ])
        .unwrap();
        let config = cli.into_config();
        assert_eq!(config.listen.port(), 0);
        assert_eq!(config.database, "sqlite:x.db".parse().unwrap());
        assert_eq!(config.tokens, ["a,b", "c"]);
        assert_eq!(config.max_body_bytes, 10);
        assert_eq!(config.idempotency_ttl, Some(Duration::from_secs(900)));
    }

    #[test]
    fn switches_and_bad_values() {
        let cli = Cli::try_parse_from(["sqlhttpd", "--no-idempotency"]).unwrap();
        assert_eq!(cli.into_config().idempotency_ttl, None);
        assert!(Cli::try_parse_from(["sqlhttpd", "--database", "mysql://x"]).is_err());
        assert!(Cli::try_parse_from(["sqlhttpd", "--idempotency-ttl", "soon"]).is_err());
        assert!(Cli::try_parse_from(["sqlhttpd", "--listen", "nowhere"]).is_err());
        assert!(Cli::try_parse_from(["sqlhttpd", "--token", ""]).is_err());
        assert!(Cli::try_parse_from(["sqlhttpd", "--token", "  "]).is_err());
    }

    #[test]
    fn flag_tokens_are_trimmed() {
        let cli = Cli::try_parse_from(["sqlhttpd", "--token", " padded\t"]).unwrap();
        assert_eq!(cli.into_config().tokens, ["padded"]);
    }

    #[test]
    fn env_tokens_are_comma_separated() {
        assert_eq!(split_tokens("a, b,,c"), ["a", "b", "", "c"]);
    }
}
