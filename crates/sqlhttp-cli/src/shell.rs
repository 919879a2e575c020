//! `sqlhttp shell`: an interactive shell on a terminal (line editing, history, multi-line
//! statements ended by `;`, meta commands), or, with stdin not a terminal, a script runner that
//! stops at the first error.
//!
//! Meta commands: `\d` or `.tables` (tables and views), `\d NAME` or `.schema NAME` (a table's
//! columns), `\timing`, `\format FORMAT`, `\q` or `.quit`, `\?` or `.help`. Knows the terminal
//! and the script format; statements run through `run`.

use std::io::{self, IsTerminal as _, Read as _, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;
use sqlhttp::Client;

use crate::args::Format;
use crate::output::format_elapsed;
use crate::run::{self, Ran};
use crate::script;

const HELP: &str = "\
Statements end with `;` and may span lines. Meta commands:
  \\d, .tables           list tables and views
  \\d NAME, .schema NAME  describe a table's columns
  \\timing               show the time each statement takes (on/off)
  \\format FORMAT        table, csv, json or ndjson
  \\q, .quit             leave (or Ctrl-D)";

const TABLES_SQL: &str = "SELECT name, type FROM sqlite_schema \
WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' \
AND name NOT LIKE '\\_sqlhttp\\_%' ESCAPE '\\' ORDER BY name";

const COLUMNS_SQL: &str = "SELECT name, type, \"notnull\" AS not_null, dflt_value AS \"default\", pk FROM pragma_table_info(?)";

/// The shell's state between statements.
struct Session<'c> {
    client: &'c Client,
    format: Format,
    timing: bool,
}

/// What a meta command asks for.
enum Meta {
    Quit,
    Continue,
}

impl Session<'_> {
    /// Runs one statement, printing its rows or its effect.
    async fn statement(&mut self, sql: &str, params: &[serde_json::Value]) -> anyhow::Result<()> {
        let started = Instant::now();
        let mut stdout = io::stdout().lock();
        match run::statement(self.client, sql, params, self.format, &mut stdout).await? {
            Ran::Changed(rows) => writeln!(stdout, "{rows} row{} affected", plural(rows))?,
            Ran::Rows(_) => {}
        }
        if self.timing {
            writeln!(stdout, "Time: {}", format_elapsed(started.elapsed()))?;
        }
        stdout.flush()?;
        Ok(())
    }

    /// Runs a meta command line (starting with `\` or `.`).
    async fn meta(&mut self, line: &str) -> anyhow::Result<Meta> {
        let mut words = line.split_whitespace();
        let command = words.next().unwrap_or_default();
        let argument = words.next();
        match (command, argument) {
            ("\\q" | ".quit" | ".exit", _) => return Ok(Meta::Quit),
            ("\\d" | ".tables", None) => self.statement(TABLES_SQL, &[]).await?,
            ("\\d" | ".schema", Some(table)) => {
                let table = table.trim_end_matches(';');
                self.statement(COLUMNS_SQL, &[table.into()]).await?;
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

/// Runs the shell: interactive on a terminal, a script otherwise.
pub(crate) async fn run(client: &Client, url: &str, format: Option<Format>) -> anyhow::Result<()> {
    let interactive = io::stdin().is_terminal();
    let default = if io::stdout().is_terminal() {
        Format::Table
    } else {
        Format::Csv
    };
    let mut session = Session {
        client,
        format: format.unwrap_or(default),
        timing: false,
    };
    if interactive {
        interactive_loop(&mut session, url).await
    } else {
        let mut script = String::new();
        io::stdin()
            .read_to_string(&mut script)
            .context("cannot read the script from stdin")?;
        run_script(&mut session, &script).await
    }
}

/// Runs `script` line by line (meta commands on their own lines), stopping at the first error.
async fn run_script(session: &mut Session<'_>, script: &str) -> anyhow::Result<()> {
    let mut buffer = String::new();
    for line in script.lines() {
        if buffer.trim().is_empty() && is_meta(line) {
            buffer.clear();
            if let Meta::Quit = session.meta(line.trim()).await? {
                return Ok(());
            }
            continue;
        }
        buffer.push_str(line);
        buffer.push('\n');
        let (statements, rest) = script::split(&buffer);
        for statement in statements {
            session.statement(&statement, &[]).await?;
        }
        buffer = rest;
    }
    let rest = buffer.trim();
    if !rest.is_empty() {
        session.statement(rest, &[]).await?;
    }
    Ok(())
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
        let prompt = if buffer.is_empty() {
            "sqlhttp> "
        } else {
            "     ...> "
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
                Err(e) => report(&e),
            }
            continue;
        }
        buffer.push_str(&line);
        buffer.push('\n');
        let (statements, rest) = script::split(&buffer);
        if !statements.is_empty() {
            let _ = editor.add_history_entry(buffer.trim_end());
        }
        for statement in statements {
            if let Err(e) = session.statement(&statement, &[]).await {
                report(&e);
            }
        }
        buffer = if rest.trim().is_empty() {
            String::new()
        } else {
            rest
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
