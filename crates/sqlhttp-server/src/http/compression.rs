//! Response compression: gzip or zstd when the client asks for it with `Accept-Encoding`,
//! streaming-compatible (a streamed result is compressed as it is written), skipping bodies too
//! small to gain from it.
//!
//! Knows HTTP content coding only; nothing about the engine or the protocol's bodies.

use tower_http::compression::predicate::SizeAbove;
use tower_http::compression::{CompressionLayer, CompressionLevel};

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
