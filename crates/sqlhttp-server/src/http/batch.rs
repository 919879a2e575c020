//! The `POST /api/v1/batch` handler: authenticates, requires a JSON body, validates the
//! Idempotency-Key, reads the body within the batch size limit, decodes the statements, passes
//! each through the sandbox's text check, and hands the batch to the engine (keyed write
//! batches exactly once).
//!
//! Knows HTTP and the protocol; it does not know SQLite (only the engine's async handle) nor how
//! a batch's transaction is run.

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use crate::api_error::ApiError;
use crate::batch_request::BatchRequest;
use crate::budget::Held;
use crate::engine::{Outcome, check_text};
use crate::http::{Admitted, admitted_body, claim, outcome_response};
use crate::state::AppState;

/// The batch endpoint's path.
pub(crate) const BATCH_PATH: &str = "/api/v1/batch";

pub(crate) async fn batch(State(state): State<AppState>, request: Request) -> Response {
    match run_batch(&state, request).await {
        Ok((outcome, held)) => outcome_response(outcome, held),
        Err(err) => err.into_response(),
    }
}

async fn run_batch(state: &AppState, request: Request) -> Result<(Outcome, Held), ApiError> {
    let shared = &state.inner;
    // `_held`: the body's share of the server's budget, until the request is answered.
    let (Admitted { credential, key }, bytes, _held) =
        admitted_body(state, request, shared.max_batch_bytes).await?;
    let mut batch = BatchRequest::parse(&bytes, shared.limits.max_batch_statements)?;
    if !credential.may_write() {
        // A read credential's batch runs as a read-only one: its reads see one snapshot, and a
        // statement that may write is refused with `403 READ_ONLY` and its index.
        batch.read_only = true;
    }
    for (index, statement) in batch.statements.iter().enumerate() {
        check_text(&statement.sql, &shared.limits).map_err(|e| e.at_statement(index))?;
    }
    tracing::debug!(
        statements = batch.statements.len(),
        read_only = batch.read_only,
        "batch"
    );

    // A read-only batch writes nothing, so there is nothing to apply once: its key is ignored.
    let Some((ttl, key)) = key.filter(|_| !batch.read_only) else {
        return shared.engine.batch(batch).await;
    };
    let guard = claim(state, &key)?;
    let request_hash = batch_hash(&bytes);
    shared
        .engine
        .batch_with_key(ttl, key, request_hash, batch, guard)
        .await
}

/// A batch's identity under its key: the path and the body, so the same bytes sent to
/// `/api/v1/sql` under the same key are a different request (`422`), not a replay.
fn batch_hash(body: &[u8]) -> [u8; 32] {
    Sha256::new()
        .chain_update(BATCH_PATH)
        .chain_update(b"\n")
        .chain_update(body)
        .finalize()
        .into()
}
