//! The `POST /api/v1/batch` handler: takes an admitted batch (see `admit`: credential, JSON,
//! Idempotency-Key, body within the batch size limit, each statement's text checked; a read
//! credential's batch is read-only) and hands it to the engine, keyed write batches exactly once.
//!
//! Knows HTTP and the protocol; it does not know either engine (only `engine::Engine`) nor how
//! a batch's transaction is run.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use crate::budget::Held;
use crate::engine::{Engine as _, Keyed, Outcome};
use crate::http::admit::{self, Admitted};
use crate::http::{outcome_response, read_at};
use crate::protocol::batch::BatchRequest;
use crate::protocol::bookmark::ReadAt;
use crate::protocol::error::ApiError;
use crate::state::AppState;

/// The batch endpoint's path.
pub(crate) const BATCH_PATH: &str = sqlhttp_protocol::path::BATCH;

pub(crate) async fn batch(
    State(state): State<AppState>,
    headers: HeaderMap,
    admitted: Admitted<BatchRequest>,
) -> Response {
    let at = match read_at(&headers) {
        Ok(at) => at,
        Err(err) => return err.into_response(),
    };
    match run_batch(&state, admitted, at).await {
        Ok((outcome, held)) => outcome_response(outcome, held),
        Err(err) => err.into_response(),
    }
}

async fn run_batch(
    state: &AppState,
    admitted: Admitted<BatchRequest>,
    at: ReadAt,
) -> Result<(Outcome, Held), ApiError> {
    let shared = &state.inner;
    // `_held`: the body's share of the server's budget, until the request is answered.
    let Admitted {
        key,
        body: batch,
        bytes,
        held: _held,
        ..
    } = admitted;
    tracing::debug!(
        statements = batch.statements.len(),
        read_only = batch.read_only,
        "batch"
    );

    // A read-only batch writes nothing, so there is nothing to apply once: its key is ignored.
    let Some((ttl, key)) = key.filter(|_| !batch.read_only) else {
        return shared.engine.batch(batch, at).await;
    };
    // A keyed batch does not hand its bookmark to the engine: it is checked here, before the
    // key is claimed.
    shared.engine.check_bookmark(at).await?;
    let claim = admit::claim(state, &key)?;
    let keyed = Keyed {
        ttl,
        key,
        request_hash: batch_hash(&bytes),
        claim: Box::new(claim),
    };
    shared.engine.batch_keyed(keyed, batch).await
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
