//! Running one statement and printing what it gave: rows in the chosen format, or how many rows
//! it changed. A statement that only reads is streamed through the SDK's `query(..).fetch()` (a
//! read: retried until its first row arrives; then rows are written as they come, in bounded
//! memory); any other goes through `execute(..).fetch_table()` (sent once, never retried).
//!
//! Knows the SDK's calls and the output writers; nothing about flags or the shell.

use std::io::Write;
use std::time::Instant;

use serde_json::Value as Param;
use sqlhttp::{Client, Value};

use crate::args::Format;
use crate::output;
use crate::progress::Progress;
use crate::script;

/// What a statement gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ran {
    /// Rows were printed.
    Rows(u64),
    /// No result set: the statement changed this many rows.
    Changed(u64),
}

/// Runs `sql` and prints its rows to `out` in `format`.
pub(crate) async fn statement(
    client: &Client,
    sql: &str,
    params: &[Param],
    format: Format,
    out: &mut dyn Write,
) -> anyhow::Result<Ran> {
    let started = Instant::now();
    if !script::is_read(sql) {
        let mut execute = client.execute(sql);
        for param in params {
            execute = execute.bind(param);
        }
        let table = execute.fetch_table().await?;
        if table.columns().is_empty() {
            return Ok(Ran::Changed(table.rows_affected()));
        }
        let columns: Vec<String> = table
            .columns()
            .iter()
            .map(|c| c.name().to_owned())
            .collect();
        let mut writer = output::writer(format, out);
        writer.start(&columns)?;
        for row in table.rows() {
            writer.row(row.values())?;
        }
        writer.finish(table.len() as u64, started.elapsed())?;
        return Ok(Ran::Rows(table.len() as u64));
    }
    let mut query = client.query(sql);
    for param in params {
        query = query.bind(param);
    }
    let mut rows = query.fetch::<Vec<Value>>().await?;
    let columns: Vec<String> = rows.columns().iter().map(|c| c.name().to_owned()).collect();
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
