//! Running one client statement on PostgreSQL and feeding its rows, cell by cell in
//! PostgreSQL's type mapping (`types`), to the shared result writer (`protocol::result`), so its
//! body has the bytes the SQLite engine writes for the same values.
//!
//! Every cell is refused past `--max-value-bytes` (as PostgreSQL sends it, before it is written
//! as JSON), with the SQLite engine's `400 SQL_ERROR`, and a row whose JSON passes
//! `--max-result-bytes` with its `422 RESULT_TOO_LARGE`. A row is whole in memory twice at most:
//! as tokio-postgres received it, and as JSON until the sink takes it (see `docs/protocol.md`,
//! "Limits", and ADR 0028). A row or cell that would not have fitted is cut by `wire` before it
//! arrives; its connection's error is answered here as the checks below would have answered. `rows_affected` is the command tag's count for `INSERT`, `UPDATE`,
//! `DELETE` and `MERGE` only (see `tag`).
//!
//! Runs inside a transaction the caller opened, as the client role. Knows tokio-postgres and the
//! result writer; nothing about HTTP, pooling, transactions or idempotency.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::atomic::Ordering;
use std::task::Poll;

use futures_core::Stream as _;
use tokio_postgres::Statement;
use tokio_postgres::types::ToSql;

use crate::config::Limits;
use crate::engine::postgres::types::{self, Raw};
use crate::engine::postgres::{Lease, placeholders, sandbox, tag, wire};
use crate::engine::stream::Sink;
use crate::protocol::error::{ApiError, ErrorCode};
use crate::protocol::request::SqlRequest;
use crate::protocol::result::{self, Cost, RowWriter};

/// A session that received a row larger than this is closed after its request, not pooled:
/// tokio-postgres's read buffer keeps the size of the largest message it held (after one
/// 200 MB cell was sent the server stayed 382 MiB above idle with the session pooled, 191 MiB
/// with it closed: `benches/cells.rs`).
const RETIRE_AFTER_ROW_BYTES: usize = 1024 * 1024;

/// The refusal of a cell larger than `--max-value-bytes`, worded as the SQLite engine words
/// its own (`string or blob too big`).
pub(super) fn value_too_big(column: &str, row: u64, bytes: usize, limit: usize) -> ApiError {
    ApiError::sql(format!(
        "string or blob too big: column `{column}` of row {row} is {bytes} bytes: this server \
         holds strings and blobs of at most {limit} bytes (--max-value-bytes); select a part \
         of it (`substring({column} from 1 for {limit})`) or its length"
    ))
}

/// The answer for a connection `wire` cut while this statement (of `columns`, once prepared)
/// ran: what the row checks in [`write_result`] say of such a cell or row once it has arrived.
fn cut_answer(cut: wire::Cut, columns: &[tokio_postgres::Column], limits: &Limits) -> ApiError {
    match cut {
        wire::Cut::Cell { column, row, bytes } => {
            let fallback = format!("{}", column + 1);
            let name = columns.get(column).map_or(fallback.as_str(), |c| c.name());
            value_too_big(name, row, bytes, limits.max_value_bytes)
        }
        wire::Cut::Row { row, .. } => ApiError::row_too_large(limits.max_result_bytes, row),
        wire::Cut::Message { kind, bytes } => ApiError::new(
            ErrorCode::ResultTooLarge,
            format!(
                "PostgreSQL sent a message (type `{}`) of {bytes} bytes, more than this server \
                 takes for one (--max-result-bytes): a notice or error text that long is not \
                 carried",
                char::from(kind).escape_default()
            ),
        ),
    }
}

/// The server's `BEGIN` for a statement, handed to [`write_result`] to go out with it.
pub(crate) type Opening<'a> = Pin<Box<dyn Future<Output = Result<(), ApiError>> + Send + 'a>>;

/// Waits for `opening` when it is still out.
async fn opened(opening: &mut Option<Opening<'_>>) -> Result<(), ApiError> {
    match opening.take() {
        Some(begin) => begin.await,
        None => Ok(()),
    }
}

/// What is written in the same round trip as the statement: the server's `BEGIN` before it,
/// a read's end behind it. Both empty for a statement inside a transaction the caller runs
/// itself (a batch's, a keyed request's).
#[derive(Default)]
pub(crate) struct Around<'a, 'b> {
    /// Written first, and waited for with the statement's answer.
    pub(crate) before: Option<Opening<'a>>,
    /// Written behind the statement, and waited for by the caller.
    pub(crate) behind: Option<&'b mut Behind<'a>>,
}

/// What goes out behind the statement, written before any of the statement's answer is read
/// and waited for after it: a read's end with the session's reset (`session::after_read`),
/// so the read takes one round trip (ADR 0037). Written only once the statement's own messages
/// are, so it never runs before the statement; when the statement is not sent (a refusal
/// before it), it goes out when it is waited for.
pub(crate) struct Behind<'a> {
    message: Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send + 'a>>,
    /// Its answer, when the poll that wrote it already had one (the connection was gone).
    answered: Option<Result<(), tokio_postgres::Error>>,
}

impl<'a> Behind<'a> {
    /// Holds `message` unsent.
    pub(crate) fn new(
        message: impl Future<Output = Result<(), tokio_postgres::Error>> + Send + 'a,
    ) -> Behind<'a> {
        Behind {
            message: Box::pin(message),
            answered: None,
        }
    }

    /// Writes the message (tokio-postgres queues a request's messages on its first poll).
    async fn send(&mut self) {
        if self.answered.is_none()
            && let Poll::Ready(answer) =
                poll_fn(|cx| Poll::Ready(self.message.as_mut().poll(cx))).await
        {
            self.answered = Some(answer);
        }
    }

    /// Its answer, sending it first if it was not sent.
    pub(crate) async fn answer(mut self) -> Result<(), tokio_postgres::Error> {
        match self.answered.take() {
            Some(answer) => answer,
            None => self.message.await,
        }
    }
}

/// The most statements a connection keeps prepared: past it, its cache is emptied (the
/// statements are closed on the server), so a workload of ever new texts costs what it cost
/// before statements were cached, a Parse each, and memory stays bounded on both sides.
pub(crate) const CACHED_STATEMENTS: usize = 256;

/// `sql` prepared on the lease's connection, from its cache when it was prepared there before
/// (`true` with it: then it may have gone stale, see [`is_stale`]). A lease running a request
/// a second time prepares afresh, past the cache. A text its connection did not look up in its
/// last `aging::COLD_AFTER` requests is removed from the cache and closed (ADR 0068), as the
/// flights' cache does. The session reset never deallocates these
/// (they are the protocol's, not `PREPARE`'s: see `setup`'s `_sqlhttp.reset_session`).
async fn prepare(lease: &Lease, sql: &str) -> Result<(Statement, bool), tokio_postgres::Error> {
    let client = lease.client();
    if lease.fresh.load(Ordering::Acquire) {
        return Ok((client.prepare(sql).await?, false));
    }
    let cache = lease.cache();
    let before = cache.size();
    let statement = match cache.prepare(client, sql).await {
        Ok(statement) => statement,
        Err(e) => {
            // deadpool keeps an empty entry for a text whose Parse failed (its `size` does not
            // count it, so the bound below never empties it): every failing new text would
            // stay in the connection's cache for good.
            cache.remove(sql, &[]);
            return Err(e);
        }
    };
    let after = cache.size();
    if after > CACHED_STATEMENTS {
        lease.forget_driver_statements();
    } else {
        lease.looked_up_in_driver_cache(sql);
    }
    Ok((statement, after == before))
}

/// Whether executing a statement prepared earlier failed as one whose objects changed since
/// does: `0A000` (`cached plan must not change result type`: a column's type or a table's
/// columns changed), `26000` (the prepared statement is gone) and class `42` (its parameters'
/// types no longer fit, an operator or function it used is gone). Running such a request again
/// with a fresh Parse answers what the server answered before it cached statements. Not a
/// `0A000` a hot standby answers for being one ("cannot access temporary or unlogged relations
/// during recovery", see `replica_refuses`): a fresh Parse gets it again, and inside a
/// transaction held on the replica it would be answered `503` (retry) for ever.
fn is_stale(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|code| {
        let code = code.code();
        (code == "0A000" && !super::replica_refuses(e)) || code == "26000" || code.starts_with("42")
    })
}

/// Whether `e` says a statement the driver prepared is gone (`26000`): a client's function
/// deallocated it (the text checks refuse `DEALLOCATE`, not dynamic SQL in a function). The
/// client's own statement text cannot raise it: `EXECUTE` is refused before it is sent.
fn lost_driver_statement(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::INVALID_SQL_STATEMENT_NAME)
}

/// The answer when the request could not run again on another connection (see
/// `Lease::lose_statements`): nothing of it ran.
fn lost_statements() -> ApiError {
    ApiError::unavailable(
        "the database session lost the statements the server prepared on it (a function \
         deallocated them); the connection was closed and nothing of the request ran: retry",
    )
}

/// Runs the request's statement, writing its success body into `out` and handing it to `sink`
/// after each row. On an error `out` ends after a whole row (or before the first row), so a
/// caller that streamed part of it can close the body with the error. A cell larger than
/// `--max-value-bytes` is refused before any of it is written, and a row whose JSON is larger
/// than `--max-result-bytes` once it is, as on SQLite.
pub(crate) async fn write_result(
    lease: &Lease,
    request: &SqlRequest,
    limits: &Limits,
    out: &mut Vec<u8>,
    sink: &mut Sink<'_>,
    map: &(dyn Fn(tokio_postgres::Error) -> ApiError + Sync),
    around: Around<'_, '_>,
) -> Result<(), ApiError> {
    let cost = Cost::now(lease.served_by);
    let rows_affected = write_rows(lease, request, limits, out, sink, map, around).await?;
    // PostgreSQL has no rowid: `last_insert_id` is always null (use RETURNING).
    result::end(out, rows_affected, None, cost);
    Ok(())
}

/// [`write_result`] without the body's end: `out` ends after the last whole row, and the rows
/// the statement changed are returned, for a caller that closes the body itself once the
/// transaction ended (a streamed write's body ends with its commit's bookmark).
pub(crate) async fn write_rows(
    lease: &Lease,
    request: &SqlRequest,
    limits: &Limits,
    out: &mut Vec<u8>,
    sink: &mut Sink<'_>,
    map: &(dyn Fn(tokio_postgres::Error) -> ApiError + Sync),
    around: Around<'_, '_>,
) -> Result<u64, ApiError> {
    let Around {
        before: mut opening,
        behind,
    } = around;
    sandbox::check_text(&request.sql)?;
    let client = lease.client();
    let rewritten = placeholders::rewrite(&request.sql);
    rewritten.check_bound(request.params.len())?;
    let cut_or = |columns: &[tokio_postgres::Column], e| match lease.cut() {
        Some(cut) => cut_answer(cut, columns, limits),
        None => map(e),
    };
    // BEGIN's message goes first (this poll writes it); what follows is written behind it.
    if let Some(begin) = opening.as_mut()
        && let Poll::Ready(begun) = poll_fn(|cx| Poll::Ready(begin.as_mut().poll(cx))).await
    {
        opening = None;
        begun?;
    }
    // A cached statement is at hand at once. A Parse goes behind BEGIN's message, and both
    // answers are then awaited together: the driver hands a request its answers only as fast as
    // it takes them, so waiting on the Parse alone could leave BEGIN's stuck in front of it.
    let mut preparing = pin!(prepare(lease, &rewritten.sql));
    let prepared = match poll_fn(|cx| Poll::Ready(preparing.as_mut().poll(cx))).await {
        Poll::Ready(prepared) => prepared,
        Poll::Pending => match opening.take() {
            Some(begin) => {
                let (begun, prepared) = tokio::join!(begin, preparing);
                begun?;
                prepared
            }
            None => preparing.await,
        },
    };
    // Any failure from here is answered after BEGIN's own, which explains more (a Parse in a
    // transaction BEGIN's message aborted fails with `25P02`).
    let (statement, cached) = match prepared {
        Ok(prepared) => prepared,
        Err(e) => {
            opened(&mut opening).await?;
            if lost_driver_statement(&e) {
                lease.lose_statements();
                return Err(lost_statements());
            }
            return Err(cut_or(&[], e));
        }
    };
    let map = |e| cut_or(statement.columns(), e);
    // A cached statement that fails as a stale one does, before anything was written: the
    // request runs again, prepared afresh (see `Lease::take_retry`).
    let stale_or = |e: tokio_postgres::Error| {
        if lost_driver_statement(&e) {
            lease.lose_statements();
            return lost_statements();
        }
        if cached && is_stale(&e) {
            tracing::debug!(error = %e, "a cached statement went stale; running the request again");
            lease.stale.store(true, Ordering::Release);
            lease.forget_driver_statements();
            return ApiError::unavailable(
                "a prepared statement went stale (the schema changed) and the request could not \
                 run again; retry",
            );
        }
        map(e)
    };
    let expected = statement.params().len();
    if expected != request.params.len() {
        opened(&mut opening).await?;
        return Err(ApiError::sql(format!(
            "wrong number of parameters: the statement takes {expected}, the request gave {}",
            request.params.len()
        )));
    }
    if let Some(column) = statement
        .columns()
        .iter()
        .find(|column| !types::is_supported(column.type_()))
    {
        opened(&mut opening).await?;
        return Err(types::unsupported(column.name(), column.type_()));
    }
    let bound = match types::bind(&request.params, statement.params()) {
        // The parameters' types are the cached statement's, which DDL may have changed since
        // (a `bigint` column that is `text` now): a fresh Parse decides.
        Err(_) if cached => {
            opened(&mut opening).await?;
            lease.stale.store(true, Ordering::Release);
            lease.forget_driver_statements();
            return Err(ApiError::unavailable(
                "a prepared statement went stale (the schema changed); retry",
            ));
        }
        Err(err) => {
            opened(&mut opening).await?;
            return Err(err);
        }
        Ok(bound) => bound,
    };

    result::header(
        out,
        statement
            .columns()
            .iter()
            .map(|column| (column.name(), column.type_().name())),
    );

    // Pipelined with BEGIN's message when it is still out: one round trip for both. The
    // statement runs only inside the transaction: a failure anywhere in BEGIN's message after
    // BEGIN aborts the transaction (the statement then fails `25P02`), and outside one, should
    // BEGIN itself fail, the session's default is read-only (see `session::RESET`), so it
    // cannot write; its answer is dropped either way, for BEGIN's error.
    // What goes behind it (a read's end) is written once the statement's messages are: this
    // poll writes them.
    let mut query = pin!(client.query_raw(&statement, bound.iter().map(|b| b as &dyn ToSql)));
    let sent = poll_fn(|cx| Poll::Ready(query.as_mut().poll(cx))).await;
    if let Some(behind) = behind {
        behind.send().await;
    }
    let rows = match (sent, opening.take()) {
        (Poll::Ready(rows), None) => rows,
        (Poll::Ready(rows), Some(begin)) => {
            begin.await?;
            rows
        }
        (Poll::Pending, Some(begin)) => {
            let (begun, rows) = tokio::join!(begin, query);
            begun?;
            rows
        }
        (Poll::Pending, None) => query.await,
    }
    .map_err(stale_or)?;
    let mut rows = pin!(rows);
    let max_value_bytes = limits.max_value_bytes;
    let mut writer = RowWriter::new(limits.max_result_bytes);
    while let Some(row) = poll_fn(|cx| rows.as_mut().poll_next(cx)).await {
        let count = writer.rows();
        // A failure while the rows arrive is the statement's execution's, never a stale
        // statement's: PostgreSQL checks a cached plan against the schema at Bind, whose
        // failure `query_raw` itself answers (a second run would repeat what this one did
        // outside its transaction).
        let row = row.map_err(map)?;
        let sizes =
            (0..row.len()).map(|index| row.try_get::<_, Raw<'_>>(index).map_or(0, |raw| raw.len()));
        if sizes.clone().sum::<usize>() > RETIRE_AFTER_ROW_BYTES {
            lease.retire();
        }
        if let Some((index, bytes)) = sizes
            .enumerate()
            .find(|&(_, bytes)| bytes > max_value_bytes)
        {
            // The rest of the result is not waited for, and the session that holds a row this
            // large in its read buffer is closed, not pooled (see `Lease::cancel_statement`).
            lease.cancel_statement().await;
            let name = row.columns()[index].name();
            return Err(value_too_big(name, count + 1, bytes, max_value_bytes));
        }
        writer.begin(out);
        for (index, column) in row.columns().iter().enumerate() {
            writer.cell(out, index);
            let written = row
                .try_get::<_, Raw<'_>>(index)
                .map_err(|e| e.to_string())
                .and_then(|raw| {
                    types::write_cell(out, column.type_(), raw.0).map_err(|e| e.to_string())
                });
            if let Err(why) = written {
                writer.discard(out);
                tracing::error!(column = column.name(), error = %why, "cannot write a cell");
                // The rest of the result is not waited for: the caller's ROLLBACK would wait
                // behind it.
                lease.cancel_statement().await;
                return Err(ApiError::internal());
            }
            // One row is bounded too: its cells are written whole before any sink looks.
            if let Err(err) = writer.check(out) {
                lease.cancel_statement().await;
                return Err(err);
            }
        }
        let count = writer.end(out);
        if let Err(err) = sink.after_row(out, count).await {
            lease.cancel_statement().await;
            return Err(err);
        }
    }
    // The tag's count is rows returned for a SELECT (`WITH ... SELECT` included): only a
    // change's tag counts changes.
    Ok(if tag::counts_changed_rows(&request.sql) {
        rows.rows_affected().unwrap_or(0)
    } else {
        0
    })
}
