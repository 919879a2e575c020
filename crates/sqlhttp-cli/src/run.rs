//! Running one statement and printing what it gave: rows in the chosen format, or how many rows
//! it changed. Every statement is first sent through the SDK's `query(..).fetch()`, a read the
//! server verifies (retried until its first row arrives; then rows are written as they come, in
//! bounded memory). One the server refuses as a read before running it (`READ_ONLY`) goes through
//! `execute(..).fetch()`: sent once, never retried, streamed the same way. The CLI never guesses
//! from the text whether a statement writes.
//!
//! Knows the SDK's calls and the output writers; nothing about flags or the shell.

use std::io::Write;
use std::time::Instant;

use serde_json::Value as Param;
use sqlhttp::{Client, ErrorKind, RowStream, Transaction, Value};

use crate::args::Format;
use crate::output;
use crate::progress::Progress;

/// What a statement gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ran {
    /// Rows were printed.
    Rows(u64),
    /// No result set: the statement changed this many rows.
    Changed(u64),
}

/// Runs `sql` and prints its rows to `out` in `format`: first as a read the server verifies
/// (streamed, retried until its first row); a statement the server refuses as a read
/// (`READ_ONLY`, before it ran: nothing was written) is then sent once for its effect, streamed
/// too, never retried.
pub(crate) async fn statement(
    client: &Client,
    sql: &str,
    params: &[Param],
    format: Format,
    out: &mut dyn Write,
) -> anyhow::Result<Ran> {
    let started = Instant::now();
    let mut query = client.query(sql);
    for param in params {
        query = query.bind(param);
    }
    let rows = match query.fetch::<Vec<Value>>().await {
        Ok(rows) => rows,
        Err(err) if matches!(err.kind(), ErrorKind::ReadOnly { .. }) => {
            let mut execute = client.execute(sql);
            for param in params {
                execute = execute.bind(param);
            }
            execute.fetch::<Vec<Value>>().await?
        }
        Err(err) => return Err(err.into()),
    };
    print_rows(rows, format, out, started).await
}

/// Runs `sql` in the open transaction `tx` and prints what it gave, as [`statement`] does. Its
/// answer comes whole (the server keeps each step's answer, to send it again to a retry), and
/// every step of a transaction is safe to retry, so it needs no read first.
pub(crate) async fn in_transaction(
    tx: &Transaction,
    sql: &str,
    params: &[Param],
    format: Format,
    out: &mut dyn Write,
) -> anyhow::Result<Ran> {
    let started = Instant::now();
    let mut statement = tx.execute(sql);
    for param in params {
        statement = statement.bind(param);
    }
    let table = statement.await?;
    if table.columns().is_empty() {
        return Ok(Ran::Changed(table.rows_affected()));
    }
    let columns: Vec<String> = table
        .columns()
        .iter()
        .map(|c| c.name().to_owned())
        .collect();
    let rows: Vec<Vec<Value>> = table.rows_as()?;
    let mut writer = output::writer(format, out);
    writer.start(&columns)?;
    for row in &rows {
        writer.row(row)?;
    }
    writer.finish(rows.len() as u64, started.elapsed())?;
    Ok(Ran::Rows(rows.len() as u64))
}

/// Writes a result's rows as they arrive; a result without columns is a count of changed rows.
async fn print_rows(
    mut rows: RowStream<Vec<Value>>,
    format: Format,
    out: &mut dyn Write,
    started: Instant,
) -> anyhow::Result<Ran> {
    let columns: Vec<String> = rows.columns().iter().map(|c| c.name().to_owned()).collect();
    if columns.is_empty() {
        while rows.try_next().await?.is_some() {}
        return Ok(Ran::Changed(rows.rows_affected().unwrap_or(0)));
    }
    let progress = Progress::new("exported");
    let mut writer = output::writer(format, out);
    writer.start(&columns)?;
    let mut count = 0_u64;
    while let Some(row) = rows.try_next().await? {
        writer.row(&row)?;
        count += 1;
        if count.is_multiple_of(65_536) {
            progress.rows(count, started.elapsed());
        }
    }
    progress.finish();
    writer.finish(count, started.elapsed())?;
    Ok(Ran::Rows(count))
}
