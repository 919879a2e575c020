//! The SDK's behaviour through its public API against a scripted HTTP server (wiremock): the request's
//! exact shape, the mapping of every status and error code, decoding, and the retry rules.
//!
//! Time-dependent tests run on tokio's paused clock, with the per-attempt timeout off and no connection
//! pooling, so that the only timers are the SDK's own. A paused clock jumps to the next timer whenever the
//! runtime waits on a socket, so these tests never race a timer against a response they expect; the
//! loop's timing (max_elapsed, cancelling mid-backoff, dropping the call) is tested on a scripted
//! exchange in `src/transport/tests.rs`.

mod batches;
mod bookmarks;
mod calls;
mod cancel;
mod errors;
mod retries;
mod scalars;
mod shape;
mod streams;
mod support;
mod transactions;
mod tx_surface;
