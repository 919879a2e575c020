//! `sqlhttp batch`: the statements of a file (or stdin) sent as one atomic batch, committed
//! together or not at all, and each statement's result printed in order.
//!
//! Knows how a script becomes a batch and how its results are shown; splitting statements is
//! the SDK's `script`, sending them the SDK's client.

use std::io::{self, Read as _, Write};
use std::path::Path;
use std::time::Instant;

use anyhow::{Context as _, bail};
use sqlhttp::Client;

use crate::args::Format;
use crate::output;
use sqlhttp::script;

/// Reads the statements of `file` (`-` for stdin) and runs them as one batch. With `key`, the
/// batch is a write applied at most once under it and retried; without one it is sent once.
pub(crate) async fn run(
    client: &Client,
    file: &Path,
    key: Option<String>,
    format: Format,
) -> anyhow::Result<()> {
    let text = if file == Path::new("-") {
        let mut text = String::new();
        io::stdin()
            .read_to_string(&mut text)
            .context("cannot read the statements from stdin")?;
        text
    } else {
        std::fs::read_to_string(file)
            .with_context(|| format!("cannot read the statements of {}", file.display()))?
    };
    let statements = statements_of(&text);
    if statements.is_empty() {
        bail!(crate::exit::UsageError(format!(
            "no statements in {}",
            file.display()
        )));
    }
    let mut batch = client.batch();
    for statement in &statements {
        batch = batch.statement(statement.clone());
    }
    if let Some(key) = key {
        batch = batch.idempotency_key(key).retry_writes(true);
    }
    let started = Instant::now();
    let results = batch.await.map_err(|err| {
        // The SDK's message says which statement (from 0) and that nothing was applied; this
        // adds the statement's text and its place counted from 1, as a file's reader counts.
        let context = match err
            .statement_index()
            .and_then(|i| Some((i, statements.get(i)?)))
        {
            Some((index, statement)) => format!(
                "the batch's statement #{} ({})",
                index + 1,
                first_words(statement)
            ),
            None => "the batch".to_owned(),
        };
        anyhow::Error::new(err).context(context)
    })?;
    let elapsed = started.elapsed();
    let mut stdout = io::stdout().lock();
    for table in &results {
        if table.columns().is_empty() {
            let rows = table.rows_affected();
            writeln!(
                stdout,
                "{rows} row{} affected",
                if rows == 1 { "" } else { "s" }
            )?;
            continue;
        }
        let names: Vec<String> = table
            .columns()
            .iter()
            .map(|c| c.name().to_owned())
            .collect();
        let mut writer = output::writer(format, &mut stdout);
        writer.start(&names)?;
        for row in table.rows() {
            writer.row(row.values())?;
        }
        writer.finish(table.len() as u64, elapsed)?;
    }
    writeln!(
        stdout,
        "committed {} statement{} in one batch ({})",
        results.len(),
        if results.len() == 1 { "" } else { "s" },
        output::format_elapsed(elapsed)
    )?;
    stdout.flush()?;
    Ok(())
}

/// The complete statements of `text`, and a last one without its `;` (one that does not end, an
/// unclosed quote, is sent as it is: the server names what is wrong).
fn statements_of(text: &str) -> Vec<String> {
    let split = script::split(text);
    let last = match split.last_statement() {
        Some(Ok(statement)) => Some(statement.sql),
        Some(Err(_)) => Some(split.rest.trim().to_owned()),
        None => None,
    };
    split
        .statements
        .into_iter()
        .map(|statement| statement.sql)
        .chain(last)
        .collect()
}

/// A statement's first line, shortened, for an error message.
fn first_words(statement: &str) -> String {
    let first = statement.lines().next().unwrap_or_default();
    let shown: String = first.chars().take(60).collect();
    if shown.len() < statement.len() {
        format!("{shown} ...")
    } else {
        shown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_with_and_without_a_last_semicolon() {
        assert_eq!(
            statements_of("INSERT INTO t VALUES (1);\n\nUPDATE t SET x = 2;  \nDELETE FROM t"),
            [
                "INSERT INTO t VALUES (1)",
                "UPDATE t SET x = 2",
                "DELETE FROM t"
            ]
        );
        assert!(statements_of("  \n-- nothing\n").is_empty());
    }
}
