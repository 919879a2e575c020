//! The one layer between the browser policy and the routes (ADR 0073): what a request passes
//! once it reached the server, in this order: its caller found and its rate limit spent
//! (`credentials::authenticate`, or a peer's proof: `peers::serve`), its HTTP/2 stream permit
//! taken (`streams::admit_stream`), and an `Accept-Encoding` that admits nothing the server
//! sends refused (`compression::refuse_unacceptable`). Each refusal is answered before the route
//! runs anything.
//!
//! One layer, not three: an axum `from_fn` layer boxes the service beneath it and its future on
//! every request, so three layers cost a point read three of each.
//!
//! Knows the order of the checks; what each one checks is its own module's.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};

use crate::http::{compression, credentials, streams};
use crate::state::AppState;

/// The gate (see the module): the request's caller, its stream permit and its coding, then the
/// route.
pub(crate) async fn gate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    credentials::authenticate(&state, request, |request| admitted(request, next)).await
}

/// What a request whose caller is known passes before its route runs.
async fn admitted(request: Request, next: Next) -> Response {
    if let Err(refusal) = streams::admit_stream(&request) {
        return refusal.into_response();
    }
    if let Err(refusal) = compression::refuse_unacceptable(request.headers()).await {
        return refusal.into_response();
    }
    next.run(request).await
}
