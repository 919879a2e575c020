//! `POST /api/v1/describe`: what a client can see of the schema, the same on every engine.
//! `{}` lists the tables and views (`name`, `type`); `{"table": "books"}` gives that table's
//! columns (`name`, `type`, `nullable`, `default`, `primary_key`; no rows when there is no such
//! table). Each answers as a query does (`columns` and `rows`), from the engine's catalog query
//! run as a verified read: a read token may describe, and the sandbox reads the catalog query
//! as it reads a client's.
//!
//! Knows the route, its body and how a describe becomes a read; the SQL is each engine's own
//! (`engine::sqlite::catalog`, `engine::postgres::catalog`). Admission is `admit`'s, as for every
//! API call.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::engine::{Access, Engine as _};
use crate::http::admit::{Admissible, Admitted};
use crate::http::credentials::Credential;
use crate::protocol::bookmark::ReadAt;
use crate::protocol::error::ApiError;
use crate::protocol::request::{Param, SqlRequest};
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
    fn limit(shared: &Shared) -> usize {
        shared.max_body_bytes
    }

    /// Any credential may describe: it is a read.
    fn admit(bytes: &[u8], _: &Shared, _: &Credential) -> Result<Self, ApiError> {
        let asked: Describe = serde_json::from_slice(bytes).map_err(|err| {
            ApiError::bad_request(format!(
                "a describe body is {{}} or {{\"table\": \"NAME\"}}: {err}"
            ))
        })?;
        // serde also reads a struct from an array (`["books"]`); the body is an object.
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(ApiError::bad_request(
                "a describe body is {} or {\"table\": \"NAME\"}, a JSON object",
            ));
        }
        Ok(asked)
    }
}

/// Answers a describe call.
pub(crate) async fn describe(
    State(state): State<AppState>,
    headers: HeaderMap,
    admitted: Admitted<Describe>,
) -> Response {
    // A describe is a read like any other: a bookmark keeps it as fresh as the client's last
    // write (a table it just created), wherever it is served.
    let at = match super::read_at(&headers) {
        Ok(at) => at,
        Err(err) => return err.into_response(),
    };
    match run(&state, admitted.body, at).await {
        Ok(response) => response,
        Err(err) => err.into_response(),
    }
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
