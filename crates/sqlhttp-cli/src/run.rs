//! Running one statement and printing what it gave: rows in the chosen format, or how many rows
//! it changed. One function serves the client and an open transaction alike (the SDK's
//! `Executor`): every statement is first sent as `query(..).fetch()`, a read (on the client one
//! the server verifies, retried until its first row arrives; then rows are written as they come,
//! in bounded memory). One the server refuses as a read before running it (`READ_ONLY`) goes
//! through `execute(..).fetch()`: on the client sent once, never retried, streamed the same way.
//! In a transaction every statement is a step the server makes safe to retry, and a `query` runs
//! whatever it is. The CLI never guesses from the text whether a statement writes.
//!
//! What the call cost comes back beside ([`Call`]): the server's request id and stats, and the
//! attempts, for `\timing` and `--verbose`.
//!
//! Knows the SDK's calls and the output writers; nothing about flags or the shell.

use std::io::Write;
use std::time::Instant;

use serde_json::Value as Param;
use sqlhttp::{ErrorKind, Execute, Executor, Query, RowStream, Stats, Value};

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

/// What the call that answered a statement cost, as the SDK reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Call {
    /// The server's id for the request that answered.
    pub(crate) request_id: Option<String>,
    /// The server's figures and the call's attempts, once the result ended cleanly.
    pub(crate) stats: Option<Stats>,
    /// A read the server refused as one (`READ_ONLY`) before it was sent for its effect.
    pub(crate) sent_again_as_write: bool,
}

impl Call {
    /// `Server: 1.305 ms`, when the server said.
    pub(crate) fn server_time(&self) -> Option<String> {
        let duration = self.stats?.duration?;
        Some(crate::output::format_elapsed(duration))
    }

    /// The `--verbose` line: `request 01J..., 2 attempts, server 1.3 ms, served by primary`
    /// (`call, ...` without a request id).
    pub(crate) fn describe(&self) -> String {
        let mut line = match &self.request_id {
            Some(id) => format!("request {id}"),
            None => "call".to_owned(),
        };
        if let Some(stats) = self.stats {
            let attempts = stats.total_attempts;
            line.push_str(&format!(
                ", {attempts} attempt{}",
                if attempts == 1 { "" } else { "s" }
            ));
        }
        if self.sent_again_as_write {
            line.push_str(" (refused as a read, then sent once as a write)");
        }
        if let Some(server) = self.server_time() {
            line.push_str(&format!(", server {server}"));
        }
        if let Some(stats) = self.stats {
            if let Some(read) = stats.rows_read {
                line.push_str(&format!(", {read} rows read"));
            }
            if let Some(written) = stats.rows_written {
                line.push_str(&format!(", {written} rows written"));
            }
            if let Some(served_by) = stats.served_by {
                line.push_str(&format!(", served by {}", served_by.as_str()));
            }
        }
        line
    }
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
) -> anyhow::Result<(Ran, Call)> {
    let started = Instant::now();
    let read = params.iter().fold(db.query(sql), Query::bind::<&Param>);
    let mut sent_again_as_write = false;
    let mut rows = match read.fetch::<Vec<Value>>().await {
        Ok(rows) => rows,
        Err(err) if matches!(err.kind(), ErrorKind::ReadOnly { .. }) => {
            sent_again_as_write = true;
            let write = params.iter().fold(db.execute(sql), Execute::bind::<&Param>);
            write.fetch::<Vec<Value>>().await?
        }
        Err(err) => return Err(err.into()),
    };
    let ran = print_rows(&mut rows, format, out, started).await?;
    let call = Call {
        request_id: rows.request_id().map(str::to_owned),
        stats: rows.stats(),
        sent_again_as_write,
    };
    Ok((ran, call))
}

/// Writes a result's rows as they arrive; a result without columns is a count of changed rows.
async fn print_rows(
    rows: &mut RowStream<Vec<Value>>,
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
