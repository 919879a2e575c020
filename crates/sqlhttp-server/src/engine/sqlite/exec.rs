//! Running one client statement on SQLite and feeding its rows, cell by cell in SQLite's type
//! mapping, to the shared result writer (`protocol::result`), within the sandbox: [`write_result`],
//! which hands its output to a `Sink` after each row (`stream` sends it on in chunks), and
//! [`execute`], the buffered entry point within the result-size limit.
//!
//! Runs on an engine thread with a borrowed connection. Knows nothing about HTTP, pooling or
//! idempotency: the caller decides what surrounds the statement.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use rusqlite::fallible_iterator::FallibleIterator as _;
use rusqlite::types::{ToSql, ToSqlOutput, ValueRef};
use rusqlite::{Batch, CachedStatement, Connection, Statement};

use crate::engine::Access;
use crate::engine::sql_text::{may_change_rows, may_insert};
use crate::engine::sqlite::connection::Conn;
use crate::engine::sqlite::errors::map_engine_error;
use crate::engine::sqlite::sandbox;
use crate::engine::stream::Sink;
use crate::protocol::bookmark::ServedBy;
use crate::protocol::error::{ApiError, ErrorCode};
use crate::protocol::request::{Param, SqlRequest};
use crate::protocol::result::{self, Cost, RowWriter};

/// `last_insert_rowid()` is set to this before a statement that may insert, so "inserted
/// nothing" can be told apart from "inserted a row whose rowid equals the previous one".
const NO_ROWID: i64 = i64::MIN;

/// A temp table whose only purpose is to set `last_insert_rowid()` to [`NO_ROWID`]; the
/// sandbox keeps clients away from it.
pub(crate) const ROWID_PROBE_DDL: &str =
    "CREATE TEMP TABLE IF NOT EXISTS _sqlhttp_rowid_probe (x INTEGER)";
const ROWID_PROBE_RESET: &str = "INSERT OR REPLACE INTO temp._sqlhttp_rowid_probe (rowid, x) VALUES (-9223372036854775808, NULL)";

impl ToSql for Param {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Param::Null => ValueRef::Null,
            Param::Integer(i) => ValueRef::Integer(*i),
            Param::Real(f) => ValueRef::Real(*f),
            Param::Text(s) => ValueRef::Text(s.as_bytes()),
            Param::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

/// What running a statement where it was sent gave.
#[derive(Debug)]
pub(crate) enum Ran<T> {
    /// It ran: what it produced.
    Done(T),
    /// Under [`Access::ReadOnly`], the statement may write: nothing ran; run it on the writer
    /// (or refuse it).
    NeedsWriter,
}

/// Marks the statements compiled while it lives as the client's (sandboxed).
pub(super) struct Sandboxed<'a>(&'a Conn);

impl<'a> Sandboxed<'a> {
    pub(super) fn on(conn: &'a Conn) -> Sandboxed<'a> {
        conn.hooks.set_sandboxed(true);
        Sandboxed(conn)
    }
}

impl Drop for Sandboxed<'_> {
    fn drop(&mut self) {
        self.0.hooks.set_sandboxed(false);
    }
}

/// A client statement that changes a schema (or inserts into an FTS5 table, which may configure
/// it) runs inside a savepoint of the server's, and is kept only if what it did passes the
/// sandbox (`sandbox::SchemaRows`): no temporary object, nothing new or changed in the server's
/// namespace, no full-text table's `rank` setting changed, however the statement was spelled.
/// Dropped before [`SchemaChange::finish`] (the statement failed), it undoes the statement.
/// Runs its own statements outside the sandbox.
struct SchemaChange<'a> {
    conn: &'a Conn,
    before: sandbox::SchemaRows,
    /// The FTS5 tables the statement inserts into, whose `rank` setting is compared.
    fts5: Vec<String>,
    /// The savepoint opened the transaction (the statement runs on its own, not in a batch or a
    /// keyed request): releasing it commits.
    outermost: bool,
    open: bool,
}

const SCHEMA_SAVEPOINT: &str = "_sqlhttp_schema_change";

impl<'a> SchemaChange<'a> {
    fn begin(conn: &'a Conn, fts5: Vec<String>) -> Result<SchemaChange<'a>, ApiError> {
        let outermost = conn.conn.is_autocommit();
        conn.conn
            .execute_batch(&format!("SAVEPOINT {SCHEMA_SAVEPOINT}"))
            .map_err(map_engine_error)?;
        let mut change = SchemaChange {
            conn,
            before: sandbox::SchemaRows::default(),
            fts5,
            outermost,
            open: true,
        };
        change.before =
            sandbox::SchemaRows::read(&conn.conn, &change.fts5).map_err(map_engine_error)?;
        Ok(change)
    }

    /// Keeps the statement's effects, or undoes them and says why they were refused.
    fn finish(mut self) -> Result<(), ApiError> {
        self.open = false;
        let db = &self.conn.conn;
        if db.is_autocommit() {
            // Only a rollback ends the transaction under the savepoint: nothing was kept, and
            // the statement did not do what it said.
            tracing::error!("a statement that changes the schema ended its transaction");
            return Err(ApiError::internal());
        }
        let refusal = match sandbox::SchemaRows::read(db, &self.fts5) {
            Ok(after) => {
                if self.before.rank_changed(&after) {
                    // FTS5 applied the setting to its in-memory table before it was stored;
                    // undoing the write does not undo that.
                    self.conn.hooks.poison();
                }
                self.before.refusal(&after)
            }
            Err(e) => {
                self.undo();
                return Err(map_engine_error(e));
            }
        };
        if let Some(reason) = refusal {
            self.undo();
            return Err(ApiError::not_allowed(reason));
        }
        db.execute_batch(&format!("RELEASE {SCHEMA_SAVEPOINT}"))
            .map_err(|e| {
                // The outermost release commits, and a commit may fail (a lock held by another
                // process): the transaction is still open.
                self.undo();
                map_engine_error(e)
            })
    }

    fn undo(&self) {
        let db = &self.conn.conn;
        if db.is_autocommit() {
            return;
        }
        let undo = if self.outermost {
            "ROLLBACK".to_owned()
        } else {
            format!("ROLLBACK TO {SCHEMA_SAVEPOINT}; RELEASE {SCHEMA_SAVEPOINT}")
        };
        if let Err(e) = db.execute_batch(&undo) {
            tracing::error!(error = %e, "cannot undo a statement that changed the schema");
        }
    }
}

impl Drop for SchemaChange<'_> {
    fn drop(&mut self) {
        if self.open {
            self.conn.hooks.set_sandboxed(false);
            self.undo();
        }
    }
}

/// A write that runs on its own (not inside the server's transaction of a batch or a keyed
/// request) runs inside a savepoint that opens the transaction, released (committed) only once
/// its whole result is written. Without it SQLite commits an autocommit statement when it is
/// reset, so a write stopped after its first step (its client left mid-stream, or the statement
/// timeout struck while a streamed body waited for the client) was kept behind an error that said
/// it was not. Dropped before [`OwnTransaction::commit`], it rolls the statement back.
struct OwnTransaction<'a> {
    conn: &'a Conn,
    open: bool,
}

const STATEMENT_SAVEPOINT: &str = "_sqlhttp_statement";

impl<'a> OwnTransaction<'a> {
    /// Opens the transaction when the connection is in none; `None` inside the server's own.
    fn begin(conn: &'a Conn) -> Result<Option<OwnTransaction<'a>>, ApiError> {
        if !conn.conn.is_autocommit() {
            return Ok(None);
        }
        conn.conn
            .prepare_cached(&format!("SAVEPOINT {STATEMENT_SAVEPOINT}"))
            .and_then(|mut begin| begin.execute([]))
            .map_err(map_engine_error)?;
        Ok(Some(OwnTransaction { conn, open: true }))
    }

    /// Commits what the statement did.
    fn commit(mut self) -> Result<(), ApiError> {
        self.open = false;
        let released = self
            .conn
            .conn
            .prepare_cached(&format!("RELEASE {STATEMENT_SAVEPOINT}"))
            .and_then(|mut release| release.execute([]));
        released.map(drop).map_err(|e| {
            // A commit that fails leaves the transaction open: nothing was kept.
            self.rollback();
            map_engine_error(e)
        })
    }

    fn rollback(&self) {
        if !self.conn.conn.is_autocommit()
            && let Err(e) = self.conn.conn.execute_batch("ROLLBACK")
        {
            tracing::error!(error = %e, "cannot roll back a statement's own transaction");
        }
    }
}

impl Drop for OwnTransaction<'_> {
    fn drop(&mut self) {
        if self.open {
            self.conn.hooks.set_sandboxed(false);
            self.rollback();
        }
    }
}

/// The protocol error for an engine failure on a client statement, with the sandbox's reason
/// when the sandbox refused it.
pub(super) fn client_error(conn: &Conn, err: rusqlite::Error) -> ApiError {
    // The authorizer's refusal surfaces as SQLITE_AUTH, or as a plain error for a function.
    if let Some(reason) = conn.hooks.take_denial() {
        return ApiError::not_allowed(reason);
    }
    let mut mapped = map_engine_error(err);
    if mapped.code == ErrorCode::SqlError && mapped.message.contains("too big") {
        mapped.message = format!(
            "{}: this server holds strings and blobs of at most {} bytes (--max-value-bytes)",
            mapped.message, conn.limits.max_value_bytes
        );
    }
    mapped
}

/// Compiles exactly one statement: a text with none or with several is refused. The check is
/// iterative (at most two statements are compiled, whatever the text holds).
pub(super) fn prepare_one<'c>(conn: &'c Conn, sql: &str) -> Result<Statement<'c>, ApiError> {
    sandbox::begin_statement();
    let mut batch = Batch::new(&conn.conn, sql);
    let Some(statement) = batch.next().map_err(|e| client_error(conn, e))? else {
        return Err(map_engine_error(rusqlite::Error::Empty));
    };
    match batch.next() {
        Ok(None) => Ok(statement),
        Ok(Some(_)) | Err(_) => Err(map_engine_error(rusqlite::Error::MultipleStatement)),
    }
}

/// A client statement compiled for this run, or kept compiled from an earlier one
/// (`statement_cache`).
enum Compiled<'c> {
    Fresh(Statement<'c>),
    Kept(CachedStatement<'c>),
}

impl<'c> std::ops::Deref for Compiled<'c> {
    type Target = Statement<'c>;

    fn deref(&self) -> &Statement<'c> {
        match self {
            Compiled::Fresh(stmt) => stmt,
            Compiled::Kept(stmt) => stmt,
        }
    }
}

impl std::ops::DerefMut for Compiled<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match self {
            Compiled::Fresh(stmt) => stmt,
            Compiled::Kept(stmt) => stmt,
        }
    }
}

/// Compiles the client's `sql` under the sandbox, or takes the connection's compiled copy of a
/// text it keeps (one read-only statement that `sandbox::may_be_kept`; see `statement_cache`).
fn compile<'c>(conn: &'c Conn, sql: &str) -> Result<Compiled<'c>, ApiError> {
    if !conn.statements.holds(sql) {
        return prepare_one(conn, sql).map(Compiled::Fresh);
    }
    sandbox::begin_statement();
    conn.conn
        .prepare_cached(sql)
        .map(Compiled::Kept)
        .map_err(|e| client_error(conn, e))
}

/// Runs the request's statement and returns its whole JSON success body, refused past
/// `--max-result-bytes`. Keyed writes use it: their outcome is stored for replay.
pub(crate) fn execute(
    conn: &Conn,
    request: &SqlRequest,
    access: Access,
) -> Result<Ran<Vec<u8>>, ApiError> {
    let mut out = Vec::with_capacity(256);
    let mut sink = Sink::Buffered {
        limit: conn.limits.max_result_bytes,
    };
    match write_result(conn, request, access, &mut out, &mut sink)? {
        Ran::Done(()) => Ok(Ran::Done(out)),
        Ran::NeedsWriter => Ok(Ran::NeedsWriter),
    }
}

/// Runs the request's statement, writing its success body into `out` and handing it to `sink`
/// after each row. On an error `out` ends after a whole row (or before the first), so a caller
/// that streamed part of it can close the body with `result::error_tail`. The text checks both
/// engines share ran at admission (`engine::sandbox::check_text`); SQLite's own run here.
pub(crate) fn write_result(
    conn: &Conn,
    request: &SqlRequest,
    access: Access,
    out: &mut Vec<u8>,
    sink: &mut Sink<'_>,
) -> Result<Ran<()>, ApiError> {
    let mut cost = Cost::now(ServedBy::Primary);
    sandbox::check_new_names(&request.sql)?;
    conn.refresh_schema().map_err(map_engine_error)?;
    // Declared before the statement: on an early return it is undone after the statement is
    // finalized and the sandbox is off.
    let mut schema_change = None;
    let mut own_transaction = None;
    let sandboxed = Sandboxed::on(conn);
    let mut stmt = match compile(conn, &request.sql) {
        // DDL committed since the refresh above: compile again against the new schema, so the
        // error (or the success) is the new schema's.
        Err(_) if schema_moved(conn) => compile(conn, &request.sql)?,
        prepared => prepared?,
    };
    if sandbox::reads_rank() {
        match sandbox::refuse_rank_constraint(&conn.conn, &request.sql, stmt.is_explain() != 0) {
            Ok(()) => {}
            Err(sandbox::RankError::Refused) => {
                return Err(ApiError::not_allowed(sandbox::RANK_REFUSED));
            }
            Err(sandbox::RankError::Engine(e)) => return Err(client_error(conn, e)),
        }
    }
    let writes = !stmt.readonly();
    if writes && access == Access::ReadOnly {
        return Ok(Ran::NeedsWriter);
    }
    if !writes && matches!(stmt, Compiled::Fresh(_)) && sandbox::may_be_kept() {
        conn.statements.keep(&conn.conn, &request.sql, &stmt);
    }
    let expected = stmt.parameter_count();
    if expected != request.params.len() {
        return Err(ApiError::sql(format!(
            "wrong number of parameters: the statement takes {expected}, the request gave {}",
            request.params.len()
        )));
    }
    for (index, param) in request.params.iter().enumerate() {
        stmt.raw_bind_parameter(index + 1, param)
            .map_err(|e| client_error(conn, e))?;
    }
    let fts5 = if writes {
        conn.hooks.set_sandboxed(false);
        let found = sandbox::fts5_inserted(&conn.conn);
        conn.hooks.set_sandboxed(true);
        found.map_err(map_engine_error)?
    } else {
        Vec::new()
    };
    if writes && (sandbox::changes_schema() || !fts5.is_empty()) {
        conn.hooks.set_sandboxed(false);
        let began = SchemaChange::begin(conn, fts5);
        conn.hooks.set_sandboxed(true);
        schema_change = Some(began?);
    } else if writes {
        conn.hooks.set_sandboxed(false);
        let began = OwnTransaction::begin(conn);
        conn.hooks.set_sandboxed(true);
        own_transaction = began?;
    }
    let tracks_rowid = writes && may_insert(&request.sql);
    if tracks_rowid {
        conn.hooks.set_sandboxed(false);
        reset_last_insert_rowid(&conn.conn)?;
        conn.hooks.set_sandboxed(true);
    }
    let changes_before = conn.conn.total_changes();
    // A kept statement's counter is its own across runs (and a run that failed mid-scan left
    // it set): zero it, so `rows_read` is this run's.
    stmt.reset_status(rusqlite::StatementStatus::FullscanStep);

    // The columns are read after the first step: a statement compiled before another
    // connection's DDL is compiled again inside that step, and only then has its real columns.
    let mut width = 0;
    let mut rows = stmt.raw_query();
    let mut writer = RowWriter::new(conn.limits.max_result_bytes);
    while let Some(row) = rows.next().map_err(|e| client_error(conn, e))? {
        if writer.rows() == 0 {
            width = write_header(out, row.as_ref());
        }
        writer.begin(out);
        for index in 0..width {
            writer.cell(out, index);
            match row.get_ref(index) {
                Ok(value) => write_value(out, value),
                Err(e) => {
                    writer.discard(out);
                    return Err(map_engine_error(e));
                }
            }
            writer.check(out)?;
        }
        let count = writer.end(out);
        sink.after_row_blocking(out, count)?;
    }
    drop(rows);
    if writer.rows() == 0 {
        write_header(out, &stmt);
    }
    // Rows read: the full scans' steps, and at least the rows returned (an index lookup
    // steps no full scan).
    let scanned = stmt.get_status(rusqlite::StatementStatus::FullscanStep);
    cost.rows_read = Some(writer.rows().max(u64::try_from(scanned).unwrap_or(0)));
    drop(stmt);
    drop(sandboxed);
    if let Some(change) = schema_change.take() {
        change.finish()?;
    }
    if let Some(own) = own_transaction.take() {
        // Committed before the body's end is written: a success is never sent for a write that
        // was not kept.
        own.commit()?;
    }

    let db = &conn.conn;
    let rows_affected =
        if !writes || !may_change_rows(&request.sql) || db.total_changes() == changes_before {
            0
        } else {
            db.changes()
        };
    let last_insert_id = if tracks_rowid {
        Some(db.last_insert_rowid()).filter(|id| *id != NO_ROWID)
    } else {
        None
    };
    result::end(out, rows_affected, last_insert_id, cost);
    Ok(Ran::Done(()))
}

/// Whether the schema moved under a statement that failed to compile (the check runs outside
/// the sandbox, which is on again after it). A check that fails leaves the statement's own error
/// to be answered.
pub(super) fn schema_moved(conn: &Conn) -> bool {
    conn.hooks.set_sandboxed(false);
    let moved = conn.refresh_schema().unwrap_or(false);
    conn.hooks.set_sandboxed(true);
    moved
}

/// Writes `{"columns":[...],"rows":[` for `stmt` and returns its number of columns.
fn write_header(out: &mut Vec<u8>, stmt: &Statement<'_>) -> usize {
    result::header_open(out);
    for (index, column) in stmt.columns().enumerate() {
        result::header_column(out, index, column.name(), column.decl_type().unwrap_or(""));
    }
    result::header_close(out);
    stmt.column_count()
}

fn reset_last_insert_rowid(conn: &Connection) -> Result<(), ApiError> {
    conn.prepare_cached(ROWID_PROBE_RESET)
        .and_then(|mut reset| reset.execute([]))
        .map(drop)
        .map_err(map_engine_error)
}

fn write_value(out: &mut Vec<u8>, value: ValueRef<'_>) {
    match value {
        ValueRef::Integer(i) => result::integer(out, i),
        ValueRef::Real(f) if f.is_finite() => {
            let _ = serde_json::to_writer(&mut *out, &f);
        }
        // JSON has no NaN or infinity: a REAL that is not finite is written as null.
        ValueRef::Null | ValueRef::Real(_) => out.extend_from_slice(b"null"),
        ValueRef::Text(bytes) => match std::str::from_utf8(bytes) {
            Ok(s) => result::string(out, s),
            Err(_) => result::string(out, &String::from_utf8_lossy(bytes)),
        },
        ValueRef::Blob(bytes) => {
            out.extend_from_slice(b"{\"base64\":\"");
            let start = out.len();
            out.resize(
                start + base64::encoded_len(bytes.len(), true).unwrap_or(0),
                0,
            );
            let written = STANDARD.encode_slice(bytes, &mut out[start..]).unwrap_or(0);
            out.truncate(start + written);
            out.extend_from_slice(b"\"}");
        }
    }
}

#[cfg(test)]
mod tests;
