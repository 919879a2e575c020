//! `sqlhttp`, the command-line client: `query`, `exec`, `batch`, `import`, `migrate`, `shell` and
//! `ping` against a server that speaks the sqlhttp protocol, built on the public `sqlhttp` SDK
//! only, so the SDK's retry rules apply as they do in code (reads retried, `exec` never).
//!
//! This file parses flags, runs one command on a single-threaded runtime and turns its outcome
//! into an exit code (see `exit`); each command lives in its own module.

mod args;
mod batch;
mod connect;
mod csv_input;
mod exit;
mod import;
mod migrate;
mod output;
mod params;
mod prepare;
mod progress;
mod run;
mod shell;
mod tx_control;

use std::io::{self, IsTerminal as _, Read as _, Write as _};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser as _;

use args::{Cli, Command, Format};
use exit::UsageError;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("sqlhttp: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => exit::report(&e),
    }
}

/// Output cut short by the reader (`sqlhttp query ... | head`) is not a failure.
fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

fn default_format() -> Format {
    if io::stdout().is_terminal() {
        Format::Table
    } else {
        Format::Csv
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if let Command::Prepare { dir, check, server } = &cli.command {
        return prepare::run(&cli.connection, dir, *check, *server).await;
    }
    let client = connect::client(&cli.connection)?;
    match cli.command {
        Command::Ping => {
            client.ping().await?;
            println!("ok: {} answers", cli.connection.url);
        }
        Command::Query {
            sql,
            params,
            format,
        } => {
            let sql = match sql {
                Some(sql) => sql,
                None => read_stdin_sql()?,
            };
            let params: Vec<_> = params.values.iter().map(|p| params::parse(p)).collect();
            let mut stdout = io::stdout().lock();
            let format = format.unwrap_or_else(default_format);
            let (ran, call) = run::statement(&client, &sql, &params, format, &mut stdout).await?;
            if let run::Ran::Changed(rows) = ran {
                writeln!(
                    stdout,
                    "{rows} row{} affected",
                    if rows == 1 { "" } else { "s" }
                )?;
            }
            if cli.verbose {
                stdout.flush()?;
                eprintln!("-- {}", call.describe());
            }
        }
        Command::Exec { sql, params } => {
            let mut execute = client.execute(sql);
            for param in &params.values {
                execute = execute.bind(params::parse(param));
            }
            let result = execute.await?;
            println!(
                "{} row{} affected",
                result.rows_affected,
                if result.rows_affected == 1 { "" } else { "s" }
            );
            if cli.verbose {
                let call = run::Call {
                    stats: Some(result.stats),
                    ..run::Call::default()
                };
                eprintln!("-- {}", call.describe());
            }
        }
        Command::Batch { file, key, format } => {
            batch::run(&client, &file, key, format.unwrap_or_else(default_format)).await?;
        }
        Command::Import {
            table,
            file,
            format,
            chunk_rows,
            key,
            again,
        } => {
            let started = std::time::Instant::now();
            let imported =
                import::run(&client, &table, &file, format, chunk_rows, key, again).await?;
            let elapsed = output::format_elapsed(started.elapsed());
            println!("{}", imported.summary(&table, &elapsed));
        }
        Command::Migrate {
            source,
            table,
            action,
        } => {
            migrate::run(&client, &source, &table, action).await?;
        }
        // Answered before the client is made, above.
        Command::Prepare { .. } => {}
        Command::Shell { format, file } => {
            shell::run(
                &client,
                &cli.connection.url,
                format,
                file.as_deref(),
                cli.verbose,
            )
            .await?;
        }
    }
    Ok(())
}

fn read_stdin_sql() -> anyhow::Result<String> {
    if io::stdin().is_terminal() {
        return Err(UsageError("give the SQL as an argument or on stdin".to_owned()).into());
    }
    let mut sql = String::new();
    io::stdin()
        .read_to_string(&mut sql)
        .context("cannot read the SQL from stdin")?;
    let sql = sql.trim().trim_end_matches(';').trim().to_owned();
    if sql.is_empty() {
        return Err(UsageError("no SQL on stdin".to_owned()).into());
    }
    Ok(sql)
}
