//! `sqlhttp shell`: an interactive shell on a terminal (line editing, history, multi-line
//! statements ended by `;`, meta commands), or, with stdin not a terminal, a script runner that
//! stops at the first error.
//!
//! Meta commands: `\d` or `.tables` (tables and views), `\d NAME` or `.schema NAME` (a table's
//! columns, from the server's describe call: the same on every engine), `\i FILE` or `.read FILE`
//! (run a script), `\timing`, `\format FORMAT`, `\q` or `.quit`, `\?` or `.help`.
//!
//! `BEGIN`, `COMMIT` and `ROLLBACK` (see `tx_control`) drive one of the server's interactive
//! transactions: the statements between them run in it, and the prompt says so (`sqlhttp*> `, as
//! psql marks one). A script stops at its first error and rolls back the transaction it opened;
//! a script or a shell that ends with a transaction open rolls it back and says so. Knows the
//! terminal and the script format; statements run through `run`.

use std::io::{self, IsTerminal as _, Read as _, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context as _;
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;
use sqlhttp::{Client, Transaction, Value};

use crate::args::Format;
use crate::output::{self, format_elapsed};
use crate::run::{self, Ran};
use crate::tx_control::{self, TxCommand};
use sqlhttp::script;

const HELP: &str = "\
Statements end with `;` and may span lines. Meta commands:
  \\d, .tables           list tables and views
  \\d NAME, .schema NAME  describe a table's columns
  \\i FILE, .read FILE   run the statements of a file (stops at its first error)
  \\timing               show the time each statement takes, and the server's (on/off)
  \\format FORMAT        table, csv, json or ndjson
  \\q, .quit             leave (or Ctrl-D)
BEGIN [READ ONLY] [ISOLATION LEVEL ...], COMMIT and ROLLBACK run the statements between them in
one transaction of the server's (the prompt shows `*` while one is open).";

/// The shell's state between statements.
struct Session<'c> {
    client: &'c Client,
    format: Format,
    timing: bool,
    /// `--verbose`: each statement's request id, attempts and server figures on stderr.
    verbose: bool,
    /// The script files being run, outermost first (`\i` inside `\i`).
    including: Vec<PathBuf>,
    /// The transaction `BEGIN` opened, until `COMMIT` or `ROLLBACK`.
    transaction: Option<Transaction>,
}

/// How deep `\i` may nest.
const MAX_INCLUDE_DEPTH: usize = 16;

/// What a meta command asks for.
enum Meta {
    Quit,
    Continue,
    /// Run the script in this file.
    Include(PathBuf),
}

impl Session<'_> {
    /// Runs one statement, printing its rows or its effect: a transaction command drives the
    /// session's transaction; any other statement runs in it when one is open.
    async fn statement(&mut self, sql: &str, params: &[serde_json::Value]) -> anyhow::Result<()> {
        let started = Instant::now();
        if let Some(command) = tx_control::parse(sql).map_err(anyhow::Error::msg)? {
            return self.transaction_command(command).await;
        }
        let mut stdout = io::stdout().lock();
        let (ran, call) = match &self.transaction {
            Some(tx) => {
                match run::statement(tx, sql, params, self.format, &mut stdout).await {
                    Err(e)
                        if e.downcast_ref::<sqlhttp::Error>()
                            .is_some_and(sqlhttp::Error::is_transaction_lost) =>
                    {
                        // The server rolled it back: nothing of it was committed.
                        self.transaction = None;
                        return Err(e.context(
                            "the transaction was lost and rolled back: nothing of it was committed",
                        ));
                    }
                    ran => ran?,
                }
            }
            None => run::statement(self.client, sql, params, self.format, &mut stdout).await?,
        };
        match ran {
            Ran::Changed(rows) => writeln!(stdout, "{rows} row{} affected", plural(rows))?,
            Ran::Rows(_) => {}
        }
        if self.timing {
            // The round trip as the shell saw it, and the engine's time on the server.
            let elapsed = format_elapsed(started.elapsed());
            match call.server_time() {
                Some(server) => writeln!(stdout, "Time: {elapsed} (server: {server})")?,
                None => writeln!(stdout, "Time: {elapsed}")?,
            }
        }
        stdout.flush()?;
        if self.verbose {
            eprintln!("-- {}", call.describe());
        }
        Ok(())
    }

    /// `BEGIN`, `COMMIT` or `ROLLBACK`.
    async fn transaction_command(&mut self, command: TxCommand) -> anyhow::Result<()> {
        match command {
            TxCommand::Begin(options) => {
                if self.transaction.is_some() {
                    anyhow::bail!("a transaction is already open: COMMIT or ROLLBACK it first");
                }
                let mut open = self
                    .client
                    .transaction()
                    .read_only(options.read_only)
                    .deferrable(options.deferrable);
                if let Some(isolation) = options.isolation {
                    open = open.isolation(isolation);
                }
                self.transaction = Some(open.await?);
                println!("BEGIN");
            }
            TxCommand::Commit => {
                let Some(tx) = self.transaction.take() else {
                    anyhow::bail!("no transaction is open: COMMIT has nothing to commit");
                };
                tx.commit().await?;
                println!("COMMIT");
            }
            TxCommand::Rollback => {
                let Some(tx) = self.transaction.take() else {
                    anyhow::bail!("no transaction is open: ROLLBACK has nothing to roll back");
                };
                tx.rollback().await?;
                println!("ROLLBACK");
            }
        }
        Ok(())
    }

    /// Rolls back a transaction left open (the script failed or ended, the shell is leaving),
    /// saying so on stderr.
    async fn roll_back_open(&mut self, why: &str) {
        if let Some(tx) = self.transaction.take() {
            match tx.rollback().await {
                Ok(()) => eprintln!("{why}: the open transaction was rolled back"),
                Err(e) => eprintln!(
                    "{why}: the open transaction could not be rolled back ({e}); the server \
                     rolls it back when it expires"
                ),
            }
        }
    }

    /// Writes a result the shell made itself, in the session's format.
    fn print(&self, columns: &[&str], rows: &[Vec<Value>]) -> anyhow::Result<()> {
        let started = Instant::now();
        let mut stdout = io::stdout().lock();
        let names: Vec<String> = columns.iter().map(|c| (*c).to_owned()).collect();
        let mut writer = output::writer(self.format, &mut stdout);
        writer.start(&names)?;
        for row in rows {
            writer.row(row)?;
        }
        writer.finish(rows.len() as u64, started.elapsed())?;
        Ok(())
    }

    /// Runs a meta command line (starting with `\` or `.`).
    async fn meta(&mut self, line: &str) -> anyhow::Result<Meta> {
        let mut words = line.split_whitespace();
        let command = words.next().unwrap_or_default();
        let argument = words.next();
        match (command, argument) {
            ("\\q" | ".quit" | ".exit", _) => return Ok(Meta::Quit),
            ("\\d" | ".tables", None) => {
                let rows: Vec<Vec<Value>> = self
                    .client
                    .tables()
                    .await?
                    .into_iter()
                    .map(|table| {
                        let kind = if table.is_view { "view" } else { "table" };
                        vec![Value::Text(table.name), Value::Text(kind.to_owned())]
                    })
                    .collect();
                self.print(&["name", "type"], &rows)?;
            }
            ("\\d" | ".schema", Some(table)) => {
                let table = table.trim_end_matches(';');
                let Some(columns) = self.client.describe(table).await? else {
                    anyhow::bail!("no such table or view: {table}");
                };
                let yes_no = |flag: bool| Value::Text(if flag { "yes" } else { "no" }.to_owned());
                let rows: Vec<Vec<Value>> = columns
                    .into_iter()
                    .map(|column| {
                        vec![
                            Value::Text(column.name),
                            Value::Text(column.declared_type),
                            yes_no(column.nullable),
                            column.default.map_or(Value::Null, Value::Text),
                            yes_no(column.primary_key),
                        ]
                    })
                    .collect();
                self.print(
                    &["column", "type", "nullable", "default", "primary key"],
                    &rows,
                )?;
            }
            ("\\i" | ".read", Some(file)) => {
                return Ok(Meta::Include(PathBuf::from(file.trim_end_matches(';'))));
            }
            ("\\timing" | ".timer", _) => {
                self.timing = match argument {
                    Some("on") => true,
                    Some("off") => false,
                    _ => !self.timing,
                };
                println!("Timing is {}.", if self.timing { "on" } else { "off" });
            }
            ("\\format" | ".mode", Some(name)) => {
                use clap::ValueEnum as _;
                self.format = Format::from_str(name, true).map_err(|_| {
                    anyhow::anyhow!("unknown format `{name}`: table, csv, json or ndjson")
                })?;
            }
            ("\\?" | ".help" | "\\help", _) => println!("{HELP}"),
            _ => anyhow::bail!("unknown command `{line}`; \\? lists them"),
        }
        Ok(Meta::Continue)
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn is_meta(line: &str) -> bool {
    let line = line.trim_start();
    line.starts_with('\\') || (line.starts_with('.') && line[1..].starts_with(char::is_alphabetic))
}

/// Where the shell keeps its history: `SQLHTTP_HISTORY`, else the user's data directory.
fn history_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SQLHTTP_HISTORY") {
        return Some(PathBuf::from(path));
    }
    directories::ProjectDirs::from("", "", "sqlhttp").map(|dirs| dirs.data_dir().join("history"))
}

/// Runs the shell: the script in `file` when one is given; else interactive on a terminal, a
/// script from stdin otherwise.
pub(crate) async fn run(
    client: &Client,
    url: &str,
    format: Option<Format>,
    file: Option<&Path>,
    verbose: bool,
) -> anyhow::Result<()> {
    let interactive = file.is_none() && io::stdin().is_terminal();
    let default = if io::stdout().is_terminal() {
        Format::Table
    } else {
        Format::Csv
    };
    let mut session = Session {
        client,
        format: format.unwrap_or(default),
        timing: false,
        verbose,
        including: Vec::new(),
        transaction: None,
    };
    let ran = if let Some(file) = file {
        include(&mut session, file).await
    } else if interactive {
        interactive_loop(&mut session, url).await
    } else {
        let mut script = String::new();
        io::stdin()
            .read_to_string(&mut script)
            .context("cannot read the script from stdin")?;
        run_script(&mut session, &script).await
    };
    let why = match &ran {
        Ok(()) if interactive => "leaving the shell",
        Ok(()) => "the script ended inside a transaction",
        Err(_) => "the script stopped at an error",
    };
    session.roll_back_open(why).await;
    ran
}

/// Runs the script in `file`, naming the file in its errors.
/// A file that includes itself, directly or through others, is refused, and so is nesting
/// deeper than [`MAX_INCLUDE_DEPTH`].
async fn include(session: &mut Session<'_>, file: &Path) -> anyhow::Result<()> {
    let script = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read the script {}", file.display()))?;
    let canonical = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_owned());
    if session.including.contains(&canonical) {
        anyhow::bail!("{} includes itself", file.display());
    }
    if session.including.len() >= MAX_INCLUDE_DEPTH {
        anyhow::bail!("scripts nest deeper than {MAX_INCLUDE_DEPTH} files");
    }
    session.including.push(canonical);
    let ran = Box::pin(run_script(session, &script)).await;
    session.including.pop();
    ran.with_context(|| format!("in {}", file.display()))
}

/// Runs `script` line by line (meta commands on their own lines), stopping at the first error,
/// which names the statement's line and its beginning.
async fn run_script(session: &mut Session<'_>, script: &str) -> anyhow::Result<()> {
    let mut buffer = String::new();
    let mut buffer_line = 1;
    let mut last_line = 0;
    for (index, line) in script.lines().enumerate() {
        let number = index + 1;
        last_line = number;
        if buffer.trim().is_empty() && is_meta(line) {
            buffer.clear();
            let meta = session
                .meta(line.trim())
                .await
                .with_context(|| at_line(number, line))?;
            match meta {
                Meta::Quit => return Ok(()),
                Meta::Continue => {}
                Meta::Include(file) => include(session, &file)
                    .await
                    .with_context(|| at_line(number, line))?,
            }
            continue;
        }
        if buffer.is_empty() {
            buffer_line = number;
        }
        buffer.push_str(line);
        buffer.push('\n');
        let split = script::split(&buffer);
        for statement in &split.statements {
            session
                .statement(&statement.sql, &[])
                .await
                .with_context(|| at_line(buffer_line + statement.line - 1, &statement.sql))?;
        }
        if split.rest_is_statement() || split.rest_is_open {
            buffer_line += split.rest_line - 1;
            buffer = split.rest.to_owned();
        } else {
            buffer.clear();
        }
    }
    if let Some(last) = script::split(&buffer).last_statement() {
        // An unclosed quote or comment is sent as it is: the server names what is wrong.
        let (sql, line) = match last {
            Ok(statement) => (statement.sql, statement.line),
            Err(line) => (buffer.trim().to_owned(), line),
        };
        session
            .statement(&sql, &[])
            .await
            .with_context(|| at_line((buffer_line + line - 1).min(last_line), &sql))?;
    }
    Ok(())
}

/// `statement at line N: BEGINNING...`, for a script's error.
fn at_line(line: usize, text: &str) -> String {
    const SHOWN: usize = 60;
    let first = text.trim().lines().next().unwrap_or_default();
    let mut shown: String = first.chars().take(SHOWN).collect();
    if shown.len() < first.len() || text.trim().lines().nth(1).is_some() {
        shown.push_str(" ...");
    }
    format!("statement at line {line}: {shown}")
}

async fn interactive_loop(session: &mut Session<'_>, url: &str) -> anyhow::Result<()> {
    let mut editor = DefaultEditor::new().context("cannot open the terminal")?;
    let history = history_path();
    if let Some(path) = &history {
        let _ = editor.load_history(path);
    }
    println!(
        "sqlhttp {} connected to {}. \\? for help, \\q to leave.",
        env!("CARGO_PKG_VERSION"),
        url
    );
    let mut buffer = String::new();
    loop {
        let prompt = match (buffer.is_empty(), session.transaction.is_some()) {
            (true, false) => "sqlhttp> ",
            (true, true) => "sqlhttp*> ",
            (false, false) => "     ...> ",
            (false, true) => "     ..*> ",
        };
        let line = match editor.readline(prompt) {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => {
                buffer.clear();
                continue;
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e).context("cannot read from the terminal"),
        };
        if buffer.is_empty() && is_meta(&line) {
            let _ = editor.add_history_entry(line.as_str());
            match session.meta(line.trim()).await {
                Ok(Meta::Quit) => break,
                Ok(Meta::Continue) => {}
                Ok(Meta::Include(file)) => {
                    if let Err(e) = include(session, &file).await {
                        report(&e);
                    }
                }
                Err(e) => report(&e),
            }
            continue;
        }
        buffer.push_str(&line);
        buffer.push('\n');
        let split = script::split(&buffer);
        if !split.statements.is_empty() {
            let _ = editor.add_history_entry(buffer.trim_end());
        }
        for statement in &split.statements {
            if let Err(e) = session.statement(&statement.sql, &[]).await {
                report(&e);
            }
        }
        buffer = if split.rest_is_statement() || split.rest_is_open {
            split.rest.to_owned()
        } else {
            String::new()
        };
    }
    if let Some(path) = &history {
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let _ = editor.save_history(path);
    }
    Ok(())
}

/// An error in the interactive shell is shown and the shell goes on.
fn report(error: &anyhow::Error) {
    let _ = crate::exit::report(error);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_lines() {
        assert!(is_meta("\\d"));
        assert!(is_meta("  .tables"));
        assert!(!is_meta(".5"));
        assert!(!is_meta("SELECT 1"));
    }
}
