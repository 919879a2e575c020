//! Response compression: gzip or zstd when the client asks for it with `Accept-Encoding`,
//! streaming-compatible (a streamed result is compressed as it is written), skipping bodies too
//! small to gain from it; and the refusal, before anything runs, of a request whose
//! `Accept-Encoding` admits no coding the server sends (the compression layer would turn the
//! handler's answer into a `406` after the work was done: a committed write reported as refused).
//!
//! Knows HTTP content coding only; nothing about the engine or the protocol's bodies.

use std::convert::Infallible;

use axum::http::{HeaderMap, StatusCode, header};
use tower::{Layer as _, ServiceExt as _};
use tower_http::compression::predicate::SizeAbove;
use tower_http::compression::{CompressionLayer, CompressionLevel};

use crate::protocol::error::ApiError;

/// Bodies of a known length below this are sent as they are: a point query's answer gains
/// nothing from compression and would pay its latency. A streamed body (length unknown) is
/// compressed.
pub(crate) const MIN_COMPRESSED_BYTES: u64 = 1024;

/// The compression layer: gzip and zstd at their fastest levels (rows are compressed as fast as
/// the engine writes them; a higher level costs more server time than it saves on the wire).
pub(crate) fn layer() -> CompressionLayer<SizeAbove> {
    CompressionLayer::new()
        .no_br()
        .no_deflate()
        .quality(CompressionLevel::Fastest)
        .compress_when(SizeAbove::new(MIN_COMPRESSED_BYTES))
}

/// Refuses `400 BAD_REQUEST`, before the request reaches a handler, a request whose
/// `Accept-Encoding` excludes every content coding the server sends (`identity;q=0` or `*;q=0`
/// with no acceptable gzip or zstd). The compression layer decides that only once the handler
/// has answered, and then replaces the answer's status with `406`: a write that committed would
/// be reported as refused. Which headers are refused is the compression layer's own decision
/// (asked of it with an empty answer), so the two cannot disagree.
pub(crate) async fn refuse_unacceptable(headers: &HeaderMap) -> Result<(), ApiError> {
    if may_exclude_identity(headers) && !acceptable(headers).await {
        return Err(ApiError::bad_request(
            "Accept-Encoding excludes every content coding this server sends (gzip, zstd, \
             identity); nothing ran",
        ));
    }
    Ok(())
}

/// Whether any `Accept-Encoding` value carries a zero weight: only then can identity be
/// excluded. The common case costs a scan of the header.
fn may_exclude_identity(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .any(|value| {
            value
                .as_bytes()
                .windows(3)
                .any(|w| w.eq_ignore_ascii_case(b"q=0"))
        })
}

/// Asks the compression layer itself whether it would find a coding for these headers.
async fn acceptable(headers: &HeaderMap) -> bool {
    let mut probe = axum::http::Request::new(());
    for value in headers.get_all(header::ACCEPT_ENCODING) {
        probe
            .headers_mut()
            .append(header::ACCEPT_ENCODING, value.clone());
    }
    let answer = tower::service_fn(|_: axum::http::Request<()>| async {
        Ok::<_, Infallible>(axum::http::Response::new(String::new()))
    });
    match layer().layer(answer).oneshot(probe).await {
        Ok(response) => response.status() != StatusCode::NOT_ACCEPTABLE,
        Err(never) => match never {},
    }
}
