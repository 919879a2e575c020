//! The command line: global connection flags and the subcommands, parsed by clap.
//!
//! Plain definitions and the small parsers they need (durations); nothing here talks to a server
//! or writes output.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// sqlhttp: a command-line client for databases that speak SQL over HTTP.
///
/// Reads (`query`, the shell's statements) go first as reads the server verifies and are retried
/// on transient failures; one the server says may write is sent once. `exec` is never retried.
#[derive(Debug, Parser)]
#[command(name = "sqlhttp", version, about, propagate_version = true)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) connection: Connection,

    /// After each statement, print to stderr the server's request id, the attempts the call
    /// took and the server's figures for it (its time, rows read and written, who served it).
    #[arg(long, short = 'v', global = true)]
    pub(crate) verbose: bool,

    #[command(subcommand)]
    pub(crate) command: Command,
}

/// How to reach the server.
#[derive(Debug, Args)]
pub(crate) struct Connection {
    /// The server's base URL.
    #[arg(
        long,
        env = "SQLHTTP_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub(crate) url: String,

    /// Bearer token.
    #[arg(
        long,
        env = "SQLHTTP_TOKEN",
        hide_env_values = true,
        global = true,
        conflicts_with = "token_file"
    )]
    pub(crate) token: Option<String>,

    /// A file whose first non-empty line is the bearer token.
    #[arg(long, value_name = "PATH", global = true)]
    pub(crate) token_file: Option<PathBuf>,

    /// Time limit of each attempt: seconds, or a number with ms, s, m or h.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, global = true)]
    pub(crate) timeout: Option<Duration>,

    /// Attempts in all for a retried call (1 turns retrying off).
    #[arg(long, value_name = "N", global = true, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) retries: Option<u32>,
}

/// Output formats of rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// An aligned table with a row count and the time taken (the default on a terminal).
    Table,
    /// A header line, then one line per row; NULL is an empty field, an empty string is `""`
    /// (the default when stdout is not a terminal). Lines end in LF, as shell tools expect.
    Csv,
    /// CSV with RFC 4180's CRLF line ends.
    CsvCrlf,
    /// A JSON array of objects.
    Json,
    /// One JSON object per line.
    Ndjson,
}

/// Input formats of `import`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ImportFormat {
    /// Comma-separated values with a header line naming the columns.
    Csv,
    /// One JSON object per line.
    Ndjson,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a statement and print its rows. It goes as a read the server verifies, retried on
    /// transient failures; one the server says may write (refused before it ran) is then sent
    /// once, like `exec`.
    Query {
        /// The SQL; read from stdin when absent.
        sql: Option<String>,
        #[command(flatten)]
        params: Params,
        /// Output format (`table` on a terminal, else `csv`).
        #[arg(long, short)]
        format: Option<Format>,
    },
    /// Run a statement for its effect and print the rows it changed. Never retried.
    Exec {
        /// The SQL.
        sql: String,
        #[command(flatten)]
        params: Params,
    },
    /// Run the statements of a file (or stdin) as one atomic batch: all of them commit, or none.
    /// Sent once; with --key, applied at most once under that key and retried.
    Batch {
        /// The file of statements, each ended by `;` (`-` for stdin).
        file: PathBuf,
        /// An idempotency key for the batch: re-running the same file with the same key applies
        /// it at most once (while the server remembers the key).
        #[arg(long, value_name = "KEY")]
        key: Option<String>,
        /// Output format of the rows statements return.
        #[arg(long, short)]
        format: Option<Format>,
    },
    /// Insert the rows of a CSV (with a header) or NDJSON file into a table, in chunks, exactly
    /// once: an interrupted import run again skips the chunks already written.
    Import {
        /// The table to insert into.
        table: String,
        /// The file to read (`-` for stdin).
        file: PathBuf,
        /// The file's format (by default from its extension: .ndjson/.jsonl, else CSV).
        #[arg(long)]
        format: Option<ImportFormat>,
        /// Rows per chunk.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
        chunk_rows: u64,
        /// The idempotency key prefix of this import. By default it is derived from the table's
        /// name, the chunk size and the file's bytes: "this import" is this file into this table,
        /// applied once while the server remembers the key (its idempotency TTL), even after the
        /// table was dropped and created again.
        #[arg(long, value_name = "KEY", conflicts_with = "again")]
        key: Option<String>,
        /// Import the file anew under a fresh key, even if it was imported before.
        #[arg(long)]
        again: bool,
    },
    /// An interactive shell on a terminal; with stdin not a terminal, run the script statement by
    /// statement and stop at the first error.
    Shell {
        /// Output format of rows.
        #[arg(long, short)]
        format: Option<Format>,
        /// Run the statements (and meta commands) of this file, stopping at the first error,
        /// instead of reading stdin.
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
    },
    /// Schema migrations: numbered SQL files (`NNNN_name.sql`, with `NNNN_name.down.sql` to
    /// revert), each applied as one atomic batch with its record, exactly once even when two
    /// deploys run at once.
    Migrate {
        /// The directory of migration files.
        #[arg(long, value_name = "DIR", default_value = "migrations", global = true)]
        source: PathBuf,
        /// The history table, in the application's database.
        #[arg(long, value_name = "NAME", default_value = sqlhttp::migrate::DEFAULT_TABLE, global = true)]
        table: String,
        #[command(subcommand)]
        action: MigrateAction,
    },
    /// Check that the server answers (and that the token is accepted).
    Ping,
    /// Fill the checked-query cache (`.sqlhttp/` beside each package's Cargo.toml) with the
    /// server's description of every `query!`, `query_as!`, `query_scalar!` and `execute!` the
    /// packages under DIR hold, and remove entries no statement uses. The server's URL and
    /// token may also come from a `.env` file in DIR.
    Prepare {
        /// The application's directory, or a workspace holding several.
        #[arg(default_value = ".")]
        dir: PathBuf,
        /// Change nothing: fail when a statement has no entry (its SQL changed without a
        /// refresh) or an entry no statement uses. Needs no server.
        #[arg(long)]
        check: bool,
        /// With --check, also ask the server and fail when an entry differs from its answer
        /// (the schema changed).
        #[arg(long, requires = "check")]
        server: bool,
    },
}

/// What `sqlhttp migrate` does.
#[derive(Debug, Subcommand)]
pub(crate) enum MigrateAction {
    /// Create the next migration file (its version one above the highest), empty but for a
    /// comment.
    Add {
        /// What it does, as a file name part (`add_isbn`).
        name: String,
        /// Create its down file too, for `migrate revert`.
        #[arg(long, short)]
        reversible: bool,
    },
    /// Apply the pending migrations, in version order.
    Run {
        /// Apply a pending migration whose version is below one already applied.
        #[arg(long)]
        allow_out_of_order: bool,
        /// Go on when the database has a migration applied that has no file here.
        #[arg(long)]
        ignore_missing: bool,
    },
    /// Show every migration: applied, pending, changed since applied, or applied without a file.
    Info,
    /// Revert the latest applied migration with its down file.
    Revert,
}

/// Bound parameters.
#[derive(Debug, Args)]
pub(crate) struct Params {
    /// A parameter, bound in order (repeatable): a JSON literal (`42`, `1.5`, `true`, `null`,
    /// `"quoted text"`), or else the text as given.
    #[arg(
        short = 'p',
        long = "param",
        value_name = "VALUE",
        allow_hyphen_values = true
    )]
    pub(crate) values: Vec<String>,
}

/// Parses `250ms`, `10s`, `10` (seconds), `5m`, `1h`.
pub(crate) fn parse_duration(input: &str) -> Result<Duration, String> {
    let trimmed = input.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("`{input}` is not a duration: use a number with ms, s, m or h"))?;
    let millis = match unit {
        "ms" => value,
        "" | "s" => value.saturating_mul(1_000),
        "m" => value.saturating_mul(60_000),
        "h" => value.saturating_mul(3_600_000),
        _ => return Err(format!("`{input}`: unknown unit; use ms, s, m or h")),
    };
    if millis == 0 {
        return Err("a timeout must be positive".to_owned());
    }
    Ok(Duration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("1d").is_err());
    }

    #[test]
    fn flags_parse() {
        let cli = Cli::try_parse_from([
            "sqlhttp",
            "--url",
            "http://h:1",
            "query",
            "SELECT ?",
            "-p",
            "-5",
            "-p",
            "x",
            "--format",
            "ndjson",
        ])
        .unwrap();
        assert_eq!(cli.connection.url, "http://h:1");
        match cli.command {
            Command::Query {
                sql,
                params,
                format,
            } => {
                assert_eq!(sql.as_deref(), Some("SELECT ?"));
                assert_eq!(params.values, ["-5", "x"]);
                assert_eq!(format, Some(Format::Ndjson));
            }
            other => panic!("{other:?}"),
        }
        assert!(Cli::try_parse_from(["sqlhttp", "frobnicate"]).is_err());
        assert!(Cli::try_parse_from(["sqlhttp", "--retries", "0", "ping"]).is_err());
    }
}
