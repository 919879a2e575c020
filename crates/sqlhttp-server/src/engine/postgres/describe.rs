//! Describing one client statement on PostgreSQL (`POST /api/v1/describe/statement`) in a
//! `READ ONLY` transaction of the server's, as the client role, rolled back: the statement is
//! parsed (Parse and Describe: its parameters' and columns' types), and a statement PostgreSQL
//! can explain is then planned with `EXPLAIN` and NULL parameters, which checks the client
//! role's privileges on every table it names (PostgreSQL checks them when a plan starts, not at
//! Parse) without running it, so a describe is refused (`403`) wherever running would be. A
//! column read straight from a `NOT NULL` table column is `NOT NULL` (from `pg_attribute`).
//!
//! Knows tokio-postgres and the engine's transaction; nothing about HTTP.

use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use crate::engine::Access;
use crate::engine::describe::{Described, DescribedColumn, mentions_any, nullability_knowable};
use crate::engine::postgres::in_transaction;
use crate::engine::postgres::in_transaction::{Open, Work};
use crate::engine::postgres::lease::Lease;
use crate::engine::postgres::types::Bound;
use crate::engine::postgres::{Inner, Job, placeholders, sandbox};
use crate::engine::sql_text::{Dialect, statement};
use crate::protocol::error::{ApiError, ErrorCode};

/// Statements PostgreSQL's `EXPLAIN` takes, by first keyword (`""`: a parenthesized select).
const EXPLAINABLE: &[&str] = &[
    "SELECT", "VALUES", "TABLE", "WITH", "INSERT", "UPDATE", "DELETE", "MERGE", "",
];

/// The savepoint a `CREATE ... AS` is planned under, and the way back to it.
const SAVEPOINT: &str = "SAVEPOINT sqlhttp_describe";
const ROLLBACK_TO_SAVEPOINT: &str = "ROLLBACK TO SAVEPOINT sqlhttp_describe";

/// Prepares and runs `explain` (an `EXPLAIN`) with every parameter NULL: planned, never run.
async fn plan(lease: &Lease, explain: &str) -> Result<(), tokio_postgres::Error> {
    let client = lease.client();
    let explain = client.prepare(explain).await?;
    let nulls: Vec<Bound<'_>> = explain.params().iter().map(|_| Bound::Null).collect();
    let refs: Vec<&(dyn ToSql + Sync)> = nulls.iter().map(|n| n as &(dyn ToSql + Sync)).collect();
    client.query(&explain, &refs).await?;
    Ok(())
}

/// A statement that is not described, and why: refused as a statement the server does not take.
fn not_described(why: &str) -> ApiError {
    ApiError::new(ErrorCode::StatementNotAllowed, why)
}

/// Statements that only read, by first keyword, unless [`WRITING_WORDS`] say otherwise.
const READING: &[&str] = &["SELECT", "VALUES", "TABLE", "WITH", "SHOW", ""];

/// Words that make a reading statement one that may write (a data-modifying `WITH`,
/// `SELECT ... INTO`, row locks, sequences): any of them anywhere, literals aside.
const WRITING_WORDS: &[&str] = &[
    "INSERT", "UPDATE", "DELETE", "MERGE", "INTO", "SHARE", "NEXTVAL", "SETVAL",
];

/// Whether the statement may write, from its text: any statement but a reading one without
/// [`WRITING_WORDS`]. A function that writes is not seen: its statement is refused when it
/// runs in a `READ ONLY` transaction.
fn may_write(sql: &str) -> bool {
    let first = statement(sql, Dialect::Postgres)
        .map(|s| s.first)
        .unwrap_or_default();
    !READING.contains(&first.as_str()) || mentions_any(sql, WRITING_WORDS)
}

/// A description's statements, in the read-only transaction open on a lease.
struct Description<'a> {
    inner: &'a Inner,
    sql: &'a str,
    rewritten: &'a str,
    writes: bool,
}

impl Work for Description<'_> {
    type Output = Described;

    async fn run(&mut self, lease: &Lease) -> Result<Described, ApiError> {
        describe_on(self.inner, lease, self.sql, self.rewritten, self.writes).await
    }
}

/// Describes `sql` (see the module's doc), as `access` allows.
pub(super) async fn describe(
    inner: &Inner,
    job: &Job,
    sql: &str,
    access: Access,
) -> Result<Described, ApiError> {
    sandbox::check_text(sql)?;
    let writes = may_write(sql);
    if access == Access::ReadOnly {
        sandbox::check_read_only_text(sql)?;
        if writes {
            return Err(crate::engine::describe::read_only_refusal());
        }
    }
    let rewritten = placeholders::rewrite(sql);
    rewritten.check_bound(placeholders::MAX_PARAMS)?;
    let lease = inner.lease(job).await?;
    in_transaction::in_transaction(
        inner,
        job,
        lease,
        Access::ReadOnly,
        Open::Statement,
        3,
        Description {
            inner,
            sql,
            rewritten: &rewritten.sql,
            writes,
        },
    )
    .await
}

async fn describe_on(
    inner: &Inner,
    lease: &Lease,
    sql: &str,
    text: &str,
    may_write: bool,
) -> Result<Described, ApiError> {
    let client = lease.client();
    let map = |e: tokio_postgres::Error| inner.map(&e);
    let first = statement(sql, Dialect::Postgres)
        .map(|s| s.first)
        .unwrap_or_default();
    match first.as_str() {
        // An EXPLAIN ANALYZE would run its statement.
        "EXPLAIN" if mentions_any(sql, &["ANALYZE", "ANALYSE"]) => {
            return Err(not_described(
                "EXPLAIN ANALYZE runs its statement; it is not described",
            ));
        }
        // A procedure's privileges are checked only when it runs, and EXPLAIN does not take it.
        "CALL" => {
            return Err(not_described(
                "CALL is not described: PostgreSQL checks a procedure's privileges only when \
                 it runs",
            ));
        }
        _ => {}
    }
    let prepared = client.prepare(text).await.map_err(map)?;
    match first.as_str() {
        // Planned, never run: the plan's start checks the role's privileges on each table.
        word if EXPLAINABLE.contains(&word) => {
            plan(lease, &format!("EXPLAIN\n{text}"))
                .await
                .map_err(map)?;
        }
        // An EXPLAIN (without ANALYZE, refused above) is its own plan.
        "EXPLAIN" => plan(lease, text).await.map_err(map)?,
        // CREATE TABLE ... AS and CREATE MATERIALIZED VIEW ... AS read their query when they
        // run: planned under a savepoint, and a CREATE that EXPLAIN does not take (a syntax
        // error there) has no query to check.
        "CREATE" if mentions_any(sql, &["AS"]) => {
            client.batch_execute(SAVEPOINT).await.map_err(map)?;
            match plan(lease, &format!("EXPLAIN\n{text}")).await {
                Ok(()) => {}
                Err(e) if e.code() == Some(&SqlState::SYNTAX_ERROR) => {
                    client
                        .batch_execute(ROLLBACK_TO_SAVEPOINT)
                        .await
                        .map_err(map)?;
                }
                Err(e) => return Err(map(e)),
            }
        }
        _ => {}
    }
    let not_null = if nullability_knowable(sql) {
        not_null_columns(inner, lease, prepared.columns()).await?
    } else {
        Vec::new()
    };
    Ok(Described {
        params: prepared
            .params()
            .iter()
            .map(|ty| Some(ty.name().to_owned()))
            .collect(),
        columns: prepared
            .columns()
            .iter()
            .map(|column| DescribedColumn {
                name: column.name().to_owned(),
                type_name: Some(column.type_().name().to_owned()),
                nullable: column
                    .table_oid()
                    .zip(column.column_id())
                    .filter(|origin| not_null.contains(origin))
                    .map(|_| false),
            })
            .collect(),
        may_write,
    })
}

/// The `(table, column)` origins among `columns` that are `NOT NULL` table columns.
async fn not_null_columns(
    inner: &Inner,
    lease: &Lease,
    columns: &[tokio_postgres::Column],
) -> Result<Vec<(u32, i16)>, ApiError> {
    let origins: Vec<String> = columns
        .iter()
        .filter_map(|c| c.table_oid().zip(c.column_id()))
        .map(|(table, column)| format!("({table}::pg_catalog.oid, {column}::pg_catalog.int2)"))
        .collect();
    if origins.is_empty() {
        return Ok(Vec::new());
    }
    // Numbers only in the text: nothing of the client's.
    let query = format!(
        "SELECT a.attrelid, a.attnum FROM pg_catalog.pg_attribute a \
         WHERE a.attnotnull AND (a.attrelid, a.attnum) IN ({})",
        origins.join(", ")
    );
    let rows = lease
        .client()
        .query(&query, &[])
        .await
        .map_err(|e| inner.map(&e))?;
    Ok(rows
        .iter()
        .map(|row| (row.get::<_, u32>(0), row.get::<_, i16>(1)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_may_write() {
        for sql in [
            "SELECT 1",
            "  values (1)",
            "TABLE t",
            "SHOW search_path",
            "(SELECT 1)",
        ] {
            assert!(!may_write(sql), "{sql}");
        }
        for sql in [
            "INSERT INTO t VALUES (1)",
            "WITH x AS (DELETE FROM t RETURNING *) SELECT * FROM x",
            "SELECT * INTO t2 FROM t",
            "SELECT * FROM t FOR UPDATE",
            "SELECT nextval('s')",
            "CREATE TABLE t (x int)",
            "EXPLAIN ANALYZE DELETE FROM t",
        ] {
            assert!(may_write(sql), "{sql}");
        }
    }
}
