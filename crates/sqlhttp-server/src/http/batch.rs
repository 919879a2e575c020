//! The `POST /api/v1/batch` handler: takes an admitted batch (see `admit`: credential, JSON,
//! Idempotency-Key, body within the batch size limit, each statement's text checked; a read
//! credential's batch is read-only) and hands it to the engine, keyed write batches exactly once.
//!
//! Knows HTTP and the protocol; it does not know either engine (only `engine::Engine`) nor how
//! a batch's transaction is run.

use axum::extract::State;
use axum::response::Response;

use crate::budget::Held;
use crate::engine::{Engine as _, Keyed, Outcome};
use crate::http::admit::{self, Admitted};
use crate::http::outcome_response;
use crate::protocol::batch::BatchRequest;
use crate::protocol::error::ApiError;
use crate::state::AppState;

/// The batch endpoint's path.
pub(crate) const BATCH_PATH: &str = sqlhttp_protocol::path::BATCH;

pub(crate) async fn batch(
    State(state): State<AppState>,
    admitted: Admitted<BatchRequest>,
) -> Result<Response, ApiError> {
    let (outcome, held) = run_batch(&state, admitted).await?;
    Ok(outcome_response(outcome, held))
}

async fn run_batch(
    state: &AppState,
    admitted: Admitted<BatchRequest>,
) -> Result<(Outcome, Held), ApiError> {
    let shared = &state.inner;
    // `_held`: the body's share of the server's budget, until the request is answered.
    let Admitted {
        at,
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
        request_hash: admit::identity(BATCH_PATH, &bytes),
        claim: Box::new(claim),
    };
    shared.engine.batch_keyed(keyed, batch).await
}
