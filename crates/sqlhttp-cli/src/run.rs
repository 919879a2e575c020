//! Running one statement and printing what it gave: rows in the chosen format, or how many rows
//! it changed. A statement that only reads goes through the SDK's `query_table` (a read:
//! retried on transient failures); any other through `execute` (sent once, never retried).
//!
//! Knows the SDK's calls and the output writers; nothing about flags or the shell.

use std::io::Write;
use std::time::Instant;

use serde_json::Value;
use sqlhttp::{Client, Table};

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

/// Runs `sql` with `params` and returns its result: a read through `query_table`, anything else
/// through `execute(..).fetch_table()`.
pub(crate) async fn fetch(client: &Client, sql: &str, params: &[Value]) -> sqlhttp::Result<Table> {
    if script::is_read(sql) {
        let mut query = client.query_table(sql);
        for param in params {
            query = query.bind(param);
        }
        query.await
    } else {
        let mut execute = client.execute(sql);
        for param in params {
            execute = execute.bind(param);
        }
        execute.fetch_table().await
    }
}

/// Runs `sql` and prints its rows to `out` in `format`.
pub(crate) async fn statement(
    client: &Client,
    sql: &str,
    params: &[Value],
    format: Format,
    out: &mut dyn Write,
) -> anyhow::Result<Ran> {
    let started = Instant::now();
    let table = fetch(client, sql, params).await?;
    if table.columns().is_empty() {
        return Ok(Ran::Changed(table.rows_affected()));
    }
    let progress = Progress::new("exported");
    let columns: Vec<String> = table
        .columns()
        .iter()
        .map(|c| c.name().to_owned())
        .collect();
    let mut writer = output::writer(format, out);
    writer.start(&columns)?;
    let mut rows = 0_u64;
    for row in table.rows() {
        writer.row(row.values())?;
        rows += 1;
        if rows.is_multiple_of(65_536) {
            progress.rows(rows, started.elapsed());
        }
    }
    progress.finish();
    writer.finish(rows, started.elapsed())?;
    Ok(Ran::Rows(rows))
}
