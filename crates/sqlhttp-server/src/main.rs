//! The `sqlhttpd` binary's serve path: flags parsed, logging started, the server bound, the
//! `listening on` line written to stdout, and served until Ctrl-C / SIGTERM.
//!
//! Everything else lives in the `sqlhttp_server` library or in [`sqlhttpd`] (the flags, logging
//! and signals); this file only drives a [`Server`].

mod sqlhttpd;

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser;
use sqlhttp_server::{Config, Server};

use crate::sqlhttpd::flags::Cli;
use crate::sqlhttpd::logging::init_logging;
use crate::sqlhttpd::signals::{reload_on_hangup, shutdown_signal};
use crate::sqlhttpd::values::otlp_target;
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
