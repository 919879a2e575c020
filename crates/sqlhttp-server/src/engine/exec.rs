//! Running one statement and writing its success body straight from SQLite rows into JSON bytes
//! (`columns`, `rows`, `rows_affected`, `last_insert_id`, in that order).
//!
//! Runs on the engine thread with a borrowed connection. Knows nothing about HTTP, transactions
//! or idempotency: the caller decides what surrounds the statement.

use std::io::Write as _;

use rusqlite::Connection;
use rusqlite::types::{ToSql, ToSqlOutput, ValueRef};

use crate::api_error::ApiError;
use crate::engine::errors::map_engine_error;
use crate::request::{Param, SqlRequest, may_change_rows, may_insert};

/// `last_insert_rowid()` is set to this before a statement that may insert, so "inserted
/// nothing" can be told apart from "inserted a row whose rowid equals the previous one".
const NO_ROWID: i64 = i64::MIN;

/// A temp table whose only purpose is to set `last_insert_rowid()` to [`NO_ROWID`].
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
        }))
    }
}

/// Runs the request's statement and returns the JSON success body.
pub(crate) fn execute(conn: &Connection, request: &SqlRequest) -> Result<Vec<u8>, ApiError> {
    if request.sql.contains('\0') {
        // SQLite stops reading at a NUL: the text after it would be silently ignored.
        return Err(ApiError::sql("the SQL text contains a NUL character"));
    }
    let tracks_rowid = may_insert(&request.sql);
    if tracks_rowid {
        reset_last_insert_rowid(conn)?;
    }
    let changes_before = conn.total_changes();

    let mut stmt = conn.prepare(&request.sql).map_err(map_engine_error)?;
    let expected = stmt.parameter_count();
    if expected != request.params.len() {
        return Err(ApiError::sql(format!(
            "wrong number of parameters: the statement takes {expected}, the request gave {}",
            request.params.len()
        )));
    }
    for (index, param) in request.params.iter().enumerate() {
        stmt.raw_bind_parameter(index + 1, param)
            .map_err(map_engine_error)?;
    }

    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"{\"columns\":[");
    for (index, column) in stmt.columns().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"name\":");
        write_str(&mut out, column.name());
        out.extend_from_slice(b",\"type\":");
        write_str(&mut out, column.decl_type().unwrap_or(""));
        out.push(b'}');
    }
    out.extend_from_slice(b"],\"rows\":[");

    let width = stmt.column_count();
    let mut rows = stmt.raw_query();
    let mut first = true;
    while let Some(row) = rows.next().map_err(map_engine_error)? {
        if !first {
            out.push(b',');
        }
        first = false;
        out.push(b'[');
        for index in 0..width {
            if index > 0 {
                out.push(b',');
            }
            write_value(&mut out, row.get_ref(index).map_err(map_engine_error)?);
        }
        out.push(b']');
    }
    drop(rows);
    drop(stmt);

    let rows_affected = if !may_change_rows(&request.sql) || conn.total_changes() == changes_before
    {
        0
    } else {
        conn.changes()
    };
    let last_insert_id = if tracks_rowid {
        Some(conn.last_insert_rowid()).filter(|id| *id != NO_ROWID)
    } else {
        None
    };
    let _ = write!(
        out,
        "],\"rows_affected\":{rows_affected},\"last_insert_id\":"
    );
    match last_insert_id {
        Some(id) => {
            let _ = write!(out, "{id}");
        }
        None => out.extend_from_slice(b"null"),
    }
    out.push(b'}');
    Ok(out)
}

fn reset_last_insert_rowid(conn: &Connection) -> Result<(), ApiError> {
    let reset = || conn.prepare_cached(ROWID_PROBE_RESET)?.execute([]);
    if reset().is_err() {
        // The probe table was dropped by a client: recreate it and try once more.
        conn.execute_batch(ROWID_PROBE_DDL)
            .map_err(map_engine_error)?;
        reset().map_err(map_engine_error)?;
    }
    Ok(())
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

fn write_value(out: &mut Vec<u8>, value: ValueRef<'_>) {
    match value {
        ValueRef::Null => out.extend_from_slice(b"null"),
        ValueRef::Integer(i) => {
            let _ = write!(out, "{i}");
        }
        ValueRef::Real(f) if f.is_finite() => {
            let _ = serde_json::to_writer(&mut *out, &f);
        }
        ValueRef::Real(_) => out.extend_from_slice(b"null"),
        ValueRef::Text(bytes) => match std::str::from_utf8(bytes) {
            Ok(s) => write_str(out, s),
            Err(_) => write_str(out, &String::from_utf8_lossy(bytes)),
        },
        ValueRef::Blob(bytes) => {
            out.push(b'[');
            for (index, byte) in bytes.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                let _ = write!(out, "{byte}");
            }
            out.push(b']');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api_error::ErrorCode;

    fn conn() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(ROWID_PROBE_DDL).unwrap();
        conn
    }

    fn run(
        conn: &Connection,
        sql: &str,
        params: Vec<Param>,
    ) -> Result<serde_json::Value, ApiError> {
        let body = execute(
            conn,
            &SqlRequest {
                sql: sql.into(),
                params,
            },
        )?;
        Ok(serde_json::from_slice(&body).unwrap())
    }

    #[test]
    fn keys_come_in_protocol_order() {
        let body = execute(
            &conn(),
            &SqlRequest {
                sql: "SELECT 1 AS one".into(),
                params: vec![],
            },
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"columns":[{"name":"one","type":""}],"rows":[[1]],"rows_affected":0,"last_insert_id":null}"#
        );
    }

    #[test]
    fn values_map_to_json() {
        let value = run(
            &conn(),
            "SELECT ?, ?, ?, x'00ff10', NULL, 1e308 * 10, 'caf\u{e9}'",
            vec![
                Param::Integer(i64::MAX),
                Param::Real(0.25),
                Param::Text("a\"b".into()),
            ],
        )
        .unwrap();
        assert_eq!(
            value["rows"],
            serde_json::json!([[
                i64::MAX,
                0.25,
                "a\"b",
                [0, 255, 16],
                null,
                null,
                "caf\u{e9}"
            ]])
        );
    }

    #[test]
    fn rowid_tracking_distinguishes_no_insert_from_equal_rowids() {
        let conn = conn();
        conn.execute_batch("CREATE TABLE a (x); CREATE TABLE b (x UNIQUE)")
            .unwrap();
        let first = run(&conn, "INSERT INTO a VALUES (1)", vec![]).unwrap();
        assert_eq!(first["last_insert_id"], 1);
        let second = run(&conn, "INSERT INTO b VALUES (1)", vec![]).unwrap();
        assert_eq!(second["last_insert_id"], 1);
        let ignored = run(&conn, "INSERT OR IGNORE INTO b VALUES (1)", vec![]).unwrap();
        assert_eq!(ignored["last_insert_id"], serde_json::Value::Null);
        assert_eq!(ignored["rows_affected"], 0);
        let update = run(&conn, "UPDATE a SET x = 2", vec![]).unwrap();
        assert_eq!(update["rows_affected"], 1);
        assert_eq!(update["last_insert_id"], serde_json::Value::Null);
        let upsert = run(
            &conn,
            "INSERT INTO b VALUES (1) ON CONFLICT (x) DO UPDATE SET x = excluded.x",
            vec![],
        )
        .unwrap();
        assert_eq!(upsert["rows_affected"], 1);
        assert_eq!(upsert["last_insert_id"], serde_json::Value::Null);
        let ddl = run(&conn, "CREATE TABLE c (x)", vec![]).unwrap();
        assert_eq!(ddl["rows_affected"], 0);
    }

    #[test]
    fn ddl_reports_no_rows_affected_even_when_it_cascades() {
        let conn = conn();
        conn.execute_batch(
            "PRAGMA foreign_keys = ON;
             CREATE TABLE p (id INTEGER PRIMARY KEY);
             CREATE TABLE c (p INTEGER REFERENCES p(id) ON DELETE CASCADE);
             INSERT INTO p VALUES (1); INSERT INTO c VALUES (1);",
        )
        .unwrap();
        let dropped = run(&conn, "DROP TABLE p", vec![]).unwrap();
        assert_eq!(dropped["rows_affected"], 0);
    }

    #[test]
    fn a_nul_in_the_sql_text_is_refused() {
        let err = run(&conn(), "SELECT 1\0; DROP TABLE x", vec![]).unwrap_err();
        assert_eq!(err.code, ErrorCode::SqlError);
        assert!(err.message.contains("NUL"), "{}", err.message);
    }

    #[test]
    fn probe_table_is_recreated_when_dropped() {
        let conn = conn();
        conn.execute_batch("CREATE TABLE a (x); DROP TABLE temp._sqlhttp_rowid_probe")
            .unwrap();
        let inserted = run(&conn, "INSERT INTO a VALUES (1)", vec![]).unwrap();
        assert_eq!(inserted["last_insert_id"], 1);
    }

    #[test]
    fn parameter_count_is_checked() {
        let err = run(&conn(), "SELECT ?, ?", vec![Param::Null]).unwrap_err();
        assert_eq!(err.code, ErrorCode::SqlError);
        assert!(err.message.contains("takes 2"), "{}", err.message);
    }
}
