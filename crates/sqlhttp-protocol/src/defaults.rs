//! The reference server's documented defaults that a client sizes its requests by. A server may
//! be run with other limits (its flags); a client that knows them configures them. These are the
//! values `sqlhttpd` starts with and `docs/protocol.md` states.

/// The largest request body (`--max-body-bytes`): 6 MiB, so one value of the default 4 MiB
/// `--max-value-bytes`, sent as base64, fits with room for the rest of the body.
pub const MAX_BODY_BYTES: usize = 6 * 1_048_576;

/// The largest batch request body (`--max-batch-bytes`): 8 MiB.
pub const MAX_BATCH_BYTES: usize = 8 * 1_048_576;

/// The most statements in one batch (`--max-batch-statements`): 100.
pub const MAX_BATCH_STATEMENTS: usize = 100;

/// How long the server keeps an idempotency key's outcome (`--idempotency-ttl`): 24 hours, in
/// seconds.
pub const IDEMPOTENCY_TTL_SECS: u64 = 24 * 60 * 60;
