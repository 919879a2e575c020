//! `POST /api/v1/describe`: what a client can see of the schema, the same on every engine.
//! `{}` lists the tables and views (`name`, `type`); `{"table": "books"}` gives that table's
//! columns (`name`, `type`, `nullable`, `default`, `primary_key`; no rows when there is no such
//! table). Each answers as a query does (`columns` and `rows`), from the engine's catalog query
//! run as a verified read: a read token may describe, and the sandbox reads the catalog query
//! as it reads a client's.
//!
//! `POST /api/v1/describe/statement` (`{"sql": "..."}`) describes one statement without running
//! it: its parameters, result columns and whether it may write (ADR 0055). Its text passes the
//! shared sandbox checks at admission, as a statement's does; the engine prepares it under its
//! own sandbox and the client's privileges, and refuses a statement that may write to a
//! credential that may only read (`403 READ_ONLY`).
//!
//! Knows the route, its body and how a describe becomes a read; the SQL is each engine's own
//! (`engine::sqlite::catalog`, `engine::postgres::catalog`). Admission is `admit`'s, as for every
//! API call.

use axum::extract::State;
use axum::response::Response;
use serde::Deserialize;

use axum::http::StatusCode;
use sqlhttp_protocol::body::{
    ColumnDescription, DescribeStatementRequest, ParamDescription, StatementDescription,
};

use crate::engine::sandbox::check_text;
use crate::engine::{Access, Engine as _};
use crate::http::admit::{Admissible, Admitted, has_text};
use crate::protocol::bookmark::ReadAt;
use crate::protocol::error::{ApiError, json_response};
use crate::protocol::request::{Param, SqlRequest, object};
use crate::state::{AppState, Shared};

/// The path of the describe call.
pub(crate) const DESCRIBE_PATH: &str = sqlhttp_protocol::path::DESCRIBE;

/// Table names longer than this are refused before the engine is asked.
const MAX_NAME_BYTES: usize = 1024;

/// The body: which table, or none for the list.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Describe {
    table: Option<String>,
}

impl Admissible for Describe {
    const READS_AT: bool = true;

    fn limit(shared: &Shared) -> usize {
        shared.max_body_bytes
    }

    /// Any credential may describe: it is a read.
    fn admit(bytes: &[u8], _: &Shared, _: Access) -> Result<Self, ApiError> {
        let asked: Describe = serde_json::from_slice(bytes).map_err(|err| {
            ApiError::bad_request(format!(
                "a describe body is {{}} or {{\"table\": \"NAME\"}}: {err}"
            ))
        })?;
        object(
            bytes,
            "a describe body is {} or {\"table\": \"NAME\"}, a JSON object",
        )?;
        Ok(asked)
    }
}

/// The path of the statement describe call.
pub(crate) const DESCRIBE_STATEMENT_PATH: &str = sqlhttp_protocol::path::DESCRIBE_STATEMENT;

/// The statement describe body, with the credential's access.
#[derive(Debug)]
pub(crate) struct DescribeStatement {
    sql: String,
    access: Access,
}

impl Admissible for DescribeStatement {
    fn limit(shared: &Shared) -> usize {
        shared.max_body_bytes
    }

    /// Any credential may describe; one that may only read, only statements that cannot write.
    fn admit(bytes: &[u8], shared: &Shared, access: Access) -> Result<Self, ApiError> {
        object(
            bytes,
            "a statement describe body is {\"sql\": \"...\"}, a JSON object",
        )?;
        let asked: DescribeStatementRequest = serde_json::from_slice(bytes).map_err(|err| {
            ApiError::bad_request(format!(
                "a statement describe body is {{\"sql\": \"...\"}}: {err}"
            ))
        })?;
        has_text(&asked.sql)?;
        check_text(&asked.sql, &shared.limits)?;
        Ok(DescribeStatement {
            sql: asked.sql,
            access,
        })
    }
}

/// Answers a statement describe call: the statement's description, nothing run.
pub(crate) async fn describe_statement(
    State(state): State<AppState>,
    admitted: Admitted<DescribeStatement>,
) -> Result<Response, ApiError> {
    let DescribeStatement { sql, access } = admitted.body;
    let described = state.inner.engine.describe_statement(sql, access).await?;
    let body = StatementDescription {
        params: described
            .params
            .into_iter()
            .map(|type_name| ParamDescription { type_name })
            .collect(),
        columns: described
            .columns
            .into_iter()
            .map(|column| ColumnDescription {
                name: column.name,
                type_name: column.type_name,
                nullable: column.nullable,
            })
            .collect(),
        may_write: described.may_write,
    };
    let bytes = serde_json::to_vec(&body).map_err(|_| ApiError::internal())?;
    Ok(json_response(StatusCode::OK, bytes))
}

/// Answers a describe call.
pub(crate) async fn describe(
    State(state): State<AppState>,
    admitted: Admitted<Describe>,
) -> Result<Response, ApiError> {
    // A describe is a read like any other: a bookmark keeps it as fresh as the client's last
    // write (a table it just created), wherever it is served.
    run(&state, admitted.body, admitted.at).await
}

/// A key, if any, has nothing to apply once: a describe only reads.
async fn run(state: &AppState, asked: Describe, at: ReadAt) -> Result<Response, ApiError> {
    let shared = &state.inner;
    let catalog = shared.engine.catalog();
    let (sql, params) = match asked.table {
        None => (catalog.tables, Vec::new()),
        Some(name) if name.is_empty() || name.len() > MAX_NAME_BYTES || name.contains('\0') => {
            return Err(ApiError::bad_request(format!(
                "a table name is 1 to {MAX_NAME_BYTES} bytes, without NUL"
            )));
        }
        Some(name) => (catalog.columns, vec![Param::Text(name)]),
    };
    let request = SqlRequest {
        sql: sql.to_owned(),
        params,
        read_only: true,
    };
    let reply = shared.engine.execute(request, Access::ReadOnly, at).await?;
    Ok(super::reply_response(reply, crate::budget::Held::default()))
}
