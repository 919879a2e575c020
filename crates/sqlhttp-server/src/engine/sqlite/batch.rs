//! Atomic batches: a [`BatchRequest`]'s statements run in order in ONE transaction of the
//! server's own, committed only if every statement succeeds, answered with one v1 result body
//! per statement (`{"results": [...]}`).
//!
//! A write batch runs on the writer (`BEGIN IMMEDIATE`), keyed ones through `keyed` so the
//! outcome commits with the effects. A read-only batch runs on a reader in a read transaction:
//! every statement sees one snapshot, and a statement that could write is refused
//! (`403 READ_ONLY`) before it runs. Every statement goes through `exec::execute`, so through the
//! sandbox and the result limit; the job's statement timeout and cancellation cover the whole
//! batch, checked between statements too. A batch with `foreign_keys: checked_at_commit` runs
//! with SQLite's foreign keys off (set outside the transaction, where SQLite takes it) and
//! checks every key before it commits. Knows nothing about HTTP.

use rusqlite::OptionalExtension as _;

use crate::engine::batch_body::BatchBody;
use crate::engine::sqlite::connection::Conn;
use crate::engine::sqlite::errors::map_engine_error;
use crate::engine::sqlite::exec::{self, Ran};
use crate::engine::sqlite::keyed;
use crate::engine::sqlite::transaction;
use crate::engine::{Access, Keyed, Outcome};
use crate::protocol::batch::{BatchRequest, ForeignKeys};
use crate::protocol::error::{ApiError, ConstraintKind, ErrorCode};
use crate::protocol::request::SqlRequest;

/// Runs `batch` in one transaction of `access` on `conn`, with its foreign keys as it asks.
pub(super) fn run(
    conn: &mut Conn,
    batch: &BatchRequest,
    access: Access,
) -> Result<Vec<u8>, ApiError> {
    with_foreign_keys(conn, batch.foreign_keys, |conn| {
        in_transaction(conn, access, &batch.statements, batch.foreign_keys)
    })
}

/// Runs the write batch exactly once on the writer (see `keyed::run_with_key`).
pub(super) fn run_keyed(
    writer: &mut Conn,
    keyed: &Keyed,
    batch: &BatchRequest,
) -> Result<Outcome, ApiError> {
    let foreign_keys = batch.foreign_keys;
    with_foreign_keys(writer, foreign_keys, |writer| {
        keyed::run_with_key(writer, keyed, |conn| {
            let body = run_statements(conn, &batch.statements, Access::ReadWrite)?;
            check_foreign_keys(conn, foreign_keys)?;
            Ok(body)
        })
    })
}

/// Runs the statements inside a transaction of `access`, committing only if all succeed (and,
/// with foreign keys checked at commit, every key holds).
fn in_transaction(
    conn: &mut Conn,
    access: Access,
    statements: &[SqlRequest],
    foreign_keys: ForeignKeys,
) -> Result<Vec<u8>, ApiError> {
    transaction::begin(&conn.conn, access)?;
    let ran = run_statements(conn, statements, access).and_then(|body| {
        check_foreign_keys(conn, foreign_keys)?;
        Ok(body)
    });
    match ran {
        Ok(body) => {
            transaction::commit(&conn.conn)?;
            Ok(body)
        }
        Err(err) => {
            transaction::rollback(&conn.conn);
            Err(err)
        }
    }
}

/// Runs `run` with foreign keys as `foreign_keys` says: for [`ForeignKeys::CheckedAtCommit`],
/// off while it runs (`run` checks them before it commits: [`check_foreign_keys`]) and on again
/// afterwards, whatever happened; a connection on which they cannot be put back on is replaced
/// after its job.
fn with_foreign_keys<T>(
    conn: &mut Conn,
    foreign_keys: ForeignKeys,
    run: impl FnOnce(&mut Conn) -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    if foreign_keys == ForeignKeys::Enforced {
        return run(conn);
    }
    // The server's own statement: not compiled as a client's, so the sandbox lets it be.
    conn.conn
        .execute_batch("PRAGMA foreign_keys = OFF")
        .map_err(map_engine_error)?;
    let result = run(conn);
    let restored = conn.conn.is_autocommit()
        && conn.conn.execute_batch("PRAGMA foreign_keys = ON").is_ok()
        && conn
            .conn
            .query_row("PRAGMA foreign_keys", [], |row| row.get::<_, i64>(0))
            .is_ok_and(|on| on == 1);
    if !restored {
        tracing::error!("cannot turn foreign keys back on after a batch; replacing the connection");
        conn.hooks.poison();
    }
    result
}

/// With foreign keys checked at commit, checks every key inside the open transaction: a row
/// that refers to a row its parent table does not have fails the batch (nothing of it is
/// applied).
fn check_foreign_keys(conn: &Conn, foreign_keys: ForeignKeys) -> Result<(), ApiError> {
    if foreign_keys == ForeignKeys::Enforced {
        return Ok(());
    }
    let violation = conn
        .conn
        .query_row("PRAGMA foreign_key_check", [], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, String>(2)?))
        })
        .optional()
        .map_err(map_engine_error)?;
    match violation {
        None => Ok(()),
        Some((table, parent)) => Err(ApiError::constraint(
            Some(ConstraintKind::ForeignKey),
            format!(
                "FOREIGN KEY constraint failed: a row of `{table}` refers to a row `{parent}` \
                 does not have, checked when the batch was to commit (foreign_keys: \
                 checked_at_commit); nothing of the batch was applied"
            ),
        )),
    }
}

/// Runs the statements in order inside the caller's open transaction and writes
/// `{"results": [...]}`; the first failure stops the batch and names its statement. The caller
/// rolls back on failure.
fn run_statements(
    conn: &Conn,
    statements: &[SqlRequest],
    access: Access,
) -> Result<Vec<u8>, ApiError> {
    let mut answer = BatchBody::new(conn.limits.max_result_bytes, statements.len());
    for (index, statement) in statements.iter().enumerate() {
        // A statement too short to reach the progress handler still stops a batch whose
        // deadline passed or whose client went away.
        if conn.hooks.must_stop() {
            return Err(ApiError::interrupted().at_statement(index));
        }
        let ran = exec::execute(conn, statement, access).and_then(|ran| match ran {
            Ran::Done(body) => Ok(body),
            Ran::NeedsWriter => Err(ApiError::new(
                ErrorCode::ReadOnly,
                "the statement may write",
            )),
        });
        if ran.is_ok() && conn.conn.is_autocommit() {
            // Transaction control is refused, so nothing a client sends can end the server's
            // transaction and succeed.
            tracing::error!(index, "a batch statement ended the batch's transaction");
            return Err(ApiError::internal().at_statement(index));
        }
        answer.push_result(index, ran)?;
    }
    Ok(answer.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Database, Limits};
    use std::time::Duration;

    use crate::engine::Engine as _;
    use crate::engine::sqlite::SqliteEngine;
    use crate::protocol::bookmark::ReadAt;
    use crate::protocol::request::Param;

    fn engine_with(limits: Limits) -> SqliteEngine {
        SqliteEngine::start(
            &Database::Memory,
            Some(Duration::from_secs(60)),
            limits,
            crate::budget::Budget::new(1 << 30),
        )
        .unwrap()
    }

    fn statement(sql: &str, params: Vec<Param>) -> SqlRequest {
        SqlRequest {
            sql: sql.into(),
            params,
            read_only: false,
        }
    }

    fn batch(read_only: bool, sqls: &[&str]) -> BatchRequest {
        BatchRequest {
            isolation: None,
            statements: sqls.iter().map(|sql| statement(sql, vec![])).collect(),
            read_only,
            foreign_keys: ForeignKeys::Enforced,
        }
    }

    async fn count(engine: &SqliteEngine) -> String {
        let body = engine
            .execute_buffered(statement("SELECT count(*) FROM t", vec![]))
            .await
            .unwrap()
            .body;
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        value["rows"][0][0].to_string()
    }

    #[tokio::test]
    async fn statements_run_in_order_and_commit_together() {
        let engine = engine_with(Limits::default());
        let ok = engine
            .batch(
                batch(
                    false,
                    &[
                        "CREATE TABLE t (x INTEGER PRIMARY KEY)",
                        "INSERT INTO t VALUES (1), (2)",
                        "SELECT count(*) AS n FROM t",
                    ],
                ),
                ReadAt::default(),
            )
            .await
            .unwrap()
            .0;
        let value: serde_json::Value = serde_json::from_slice(&ok.body).unwrap();
        assert_eq!(value["results"].as_array().unwrap().len(), 3);
        assert_eq!(value["results"][1]["rows_affected"], 2);
        assert_eq!(value["results"][2]["rows"], serde_json::json!([[2]]));
        assert_eq!(count(&engine).await, "2");
    }

    #[tokio::test]
    async fn a_failure_rolls_back_every_statement_and_names_itself() {
        let engine = engine_with(Limits::default());
        engine
            .execute_buffered(statement("CREATE TABLE t (x INTEGER PRIMARY KEY)", vec![]))
            .await
            .unwrap();
        let err = engine
            .batch(
                batch(
                    false,
                    &[
                        "INSERT INTO t VALUES (1)",
                        "INSERT INTO t VALUES (2)",
                        "INSERT OR ROLLBACK INTO t VALUES (1)",
                    ],
                ),
                ReadAt::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::ConstraintViolation);
        assert_eq!(err.statement, Some(2));
        assert_eq!(count(&engine).await, "0");
    }

    #[tokio::test]
    async fn a_read_only_batch_refuses_a_write_before_it_runs() {
        let engine = engine_with(Limits::default());
        engine
            .execute_buffered(statement("CREATE TABLE t (x)", vec![]))
            .await
            .unwrap();
        let err = engine
            .batch(
                batch(
                    true,
                    &["SELECT count(*) FROM t", "INSERT INTO t VALUES (1)"],
                ),
                ReadAt::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::ReadOnly);
        assert_eq!(err.statement, Some(1));
        assert_eq!(count(&engine).await, "0");
    }

    #[tokio::test]
    async fn the_statement_timeout_covers_the_whole_batch() {
        let engine = engine_with(Limits {
            statement_timeout: Duration::from_millis(200),
            ..Limits::default()
        });
        engine
            .execute_buffered(statement("CREATE TABLE t (x)", vec![]))
            .await
            .unwrap();
        // Each statement is short (well under the timeout); together they are not.
        let slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 20000) \
                    INSERT INTO t SELECT x FROM c";
        let many = vec![slow; 100];
        let started = std::time::Instant::now();
        let err = engine
            .batch(batch(false, &many), ReadAt::default())
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::StatementTimeout);
        assert!(err.statement.is_some_and(|i| i > 0), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(count(&engine).await, "0", "rolled back");
    }

    #[tokio::test]
    async fn results_together_are_bounded() {
        let engine = engine_with(Limits {
            max_result_bytes: 1_000,
            ..Limits::default()
        });
        let query = "SELECT zeroblob(100) AS b";
        let err = engine
            .batch(batch(true, &[query; 10]), ReadAt::default())
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::ResultTooLarge);
        assert!(err.statement.is_some_and(|i| i > 0 && i < 9), "{err:?}");
    }
}
