//! Describing one client statement on SQLite (`POST /api/v1/describe/statement`): it is
//! compiled exactly as `exec` compiles a statement it runs, under the sandbox (the authorizer
//! runs at prepare, so a describe is refused whatever running would be refused for reading),
//! and never stepped. Its parameters are counted (SQLite infers no types), its columns carry
//! the declared type of the table column each comes from, and `NOT NULL` where that table
//! column has it (or is a rowid alias) and the text allows trusting it
//! (`engine::describe::nullability_knowable`).
//!
//! Runs on an engine thread with a borrowed connection; knows nothing about HTTP or pooling.

use rusqlite::Statement;

use crate::engine::describe::{Described, DescribedColumn, nullability_knowable};
use crate::engine::sqlite::connection::Conn;
use crate::engine::sqlite::errors::map_engine_error;
use crate::engine::sqlite::exec::{Sandboxed, client_error, prepare_one, schema_moved};
use crate::engine::sqlite::sandbox;
use crate::protocol::error::ApiError;

/// Compiles `sql` as the client's statement and says what it takes and gives; nothing runs.
pub(crate) fn describe(conn: &Conn, sql: &str) -> Result<Described, ApiError> {
    sandbox::check_new_names(sql)?;
    conn.refresh_schema().map_err(map_engine_error)?;
    let sandboxed = Sandboxed::on(conn);
    let stmt = match prepare_one(conn, sql) {
        // DDL committed since the refresh above: compile again against the new schema.
        Err(_) if schema_moved(conn) => prepare_one(conn, sql)?,
        prepared => prepared?,
    };
    if sandbox::reads_rank() {
        match sandbox::refuse_rank_constraint(&conn.conn, sql, stmt.is_explain() != 0) {
            Ok(()) => {}
            Err(sandbox::RankError::Refused) => {
                return Err(ApiError::not_allowed(sandbox::RANK_REFUSED));
            }
            Err(sandbox::RankError::Engine(e)) => return Err(client_error(conn, e)),
        }
    }
    // What follows reads the schema, not the client's tables: outside the sandbox.
    drop(sandboxed);
    let knowable = nullability_knowable(sql);
    let columns = (0..stmt.column_count())
        .map(|index| column(&stmt, index, knowable))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Described {
        params: vec![None; stmt.parameter_count()],
        columns,
        may_write: !stmt.readonly(),
    })
}

/// Column `index` of `stmt`: its name, its declared type, and `NOT NULL` when known.
fn column(stmt: &Statement<'_>, index: usize, knowable: bool) -> Result<DescribedColumn, ApiError> {
    let name = stmt
        .column_name(index)
        .map_err(map_engine_error)?
        .to_owned();
    let metadata = stmt.column_metadata(index).map_err(map_engine_error)?;
    let Some((_, _, _, declared, _, not_null, primary_key, _)) = metadata else {
        // An expression: no table column, no declared type.
        return Ok(DescribedColumn {
            name,
            type_name: None,
            nullable: None,
        });
    };
    let declared = declared.map(|text| text.to_string_lossy().into_owned());
    // A rowid table's `INTEGER PRIMARY KEY` is its rowid, never NULL; in a `WITHOUT ROWID`
    // table every primary-key column is `NOT NULL` already.
    let rowid_alias = primary_key
        && declared
            .as_deref()
            .is_some_and(|t| t.eq_ignore_ascii_case("INTEGER"));
    Ok(DescribedColumn {
        name,
        type_name: declared.filter(|t| !t.is_empty()),
        nullable: (knowable && (not_null || rowid_alias)).then_some(false),
    })
}
