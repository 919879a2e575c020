//! Running one statement and printing what it gave: rows in the chosen format, or how many rows
//! it changed. One function serves the client and an open transaction alike (the SDK's
//! `Executor`): every statement is first sent as `query(..).fetch()`, a read (on the client one
//! the server verifies, retried until its first row arrives; then rows are written as they come,
//! in bounded memory). One the server refuses as a read before running it (`READ_ONLY`) goes
//! through `execute(..).fetch()`: on the client sent once, never retried, streamed the same way.
//! In a transaction every statement is a step the server makes safe to retry, and a `query` runs
//! whatever it is. The CLI never guesses from the text whether a statement writes.
//!
//! Knows the SDK's calls and the output writers; nothing about flags or the shell.

use std::io::Write;
use std::time::Instant;

use serde_json::Value as Param;
use sqlhttp::{ErrorKind, Execute, Executor, Query, RowStream, Value};

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

/// Runs `sql` on `db` (the client, or the open transaction) and prints its rows to `out` in
/// `format`: first as a read (streamed); a statement the server refuses as a read (`READ_ONLY`,
/// before it ran: nothing was written) is then sent for its effect, streamed too.
pub(crate) async fn statement(
    db: impl Executor<'_>,
    sql: &str,
    params: &[Param],
    format: Format,
    out: &mut dyn Write,
) -> anyhow::Result<Ran> {
    let started = Instant::now();
    let read = params.iter().fold(db.query(sql), Query::bind::<&Param>);
    let rows = match read.fetch::<Vec<Value>>().await {
        Ok(rows) => rows,
        Err(err) if matches!(err.kind(), ErrorKind::ReadOnly { .. }) => {
            let write = params.iter().fold(db.execute(sql), Execute::bind::<&Param>);
            write.fetch::<Vec<Value>>().await?
        }
        Err(err) => return Err(err.into()),
    };
    print_rows(rows, format, out, started).await
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
