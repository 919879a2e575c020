//! The protocol's header names, in lower case (HTTP/2 sends them so; HTTP/1 compares them without
//! case), and the values some of them take. Headers of HTTP itself (`Retry-After`, `Allow`,
//! `WWW-Authenticate`) are `http`'s; W3C Trace Context's and `Server-Timing` are named here
//! because both sides use them; headers only the server's own processes exchange are the server's.

/// `Sqlhttp-Bookmark`: on a response, the position its answer is consistent with; on a request,
/// the least position the answer must be consistent with (a [`Bookmark`](crate::Bookmark)'s text).
pub const BOOKMARK: &str = "sqlhttp-bookmark";

/// `Sqlhttp-Consistency`: on a request, where its read may run:
/// [`CONSISTENCY_SESSION`] (the default) or [`CONSISTENCY_PRIMARY`].
pub const CONSISTENCY: &str = "sqlhttp-consistency";

/// The [`CONSISTENCY`] value that asks for the primary.
pub const CONSISTENCY_PRIMARY: &str = "primary";

/// The [`CONSISTENCY`] value of the default: any replica far enough along, else the primary.
pub const CONSISTENCY_SESSION: &str = "session";

/// `Sqlhttp-Served-By`: with [`BOOKMARK`] on a response, which node served the answer:
/// [`SERVED_BY_PRIMARY`] or [`SERVED_BY_REPLICA`].
pub const SERVED_BY: &str = "sqlhttp-served-by";

/// The [`SERVED_BY`] value of an answer the primary served.
pub const SERVED_BY_PRIMARY: &str = "primary";

/// The [`SERVED_BY`] value of an answer a read replica served.
pub const SERVED_BY_REPLICA: &str = "replica";

/// `Sqlhttp-Attempt`: `N/M`, attempt N of at most M; logged by the server so retries show.
pub const ATTEMPT: &str = "sqlhttp-attempt";

/// `Idempotency-Key`: one key on every attempt of one write, which the server applies at most once.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// `Idempotent-Replayed`: `true` on a response that is a stored outcome of an earlier request
/// with the same [`IDEMPOTENCY_KEY`].
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// `X-Request-Id`: the id the server logged the request under (the client's, when it sent a
/// sane one).
pub const REQUEST_ID: &str = "x-request-id";

/// The longest `X-Request-Id` either side keeps, in bytes.
pub const MAX_REQUEST_ID_BYTES: usize = 128;

/// `traceparent` (W3C Trace Context): on a request, the caller's trace and span the server's
/// spans continue. A malformed one is ignored, never refused.
pub const TRACEPARENT: &str = "traceparent";

/// `tracestate` (W3C Trace Context): vendor state that travels with [`TRACEPARENT`].
pub const TRACESTATE: &str = "tracestate";

/// The longest [`TRACEPARENT`] or [`TRACESTATE`] value the server reads, in bytes; a longer one
/// is ignored before it is parsed (the W3C limit for `tracestate` is 512 bytes of members).
pub const MAX_TRACE_HEADER_BYTES: usize = 1024;

/// `Server-Timing`: on every success response, what the request cost the server, in the
/// browser's format: `queue;dur=0.120, db;dur=1.305, total;dur=1.611` (milliseconds), with the
/// metric names [`SERVER_TIMING_QUEUE`], [`SERVER_TIMING_DB`] and [`SERVER_TIMING_TOTAL`].
pub const SERVER_TIMING: &str = "server-timing";

/// The [`SERVER_TIMING`] metric of the wait for an engine's turn (a connection, the writer).
pub const SERVER_TIMING_QUEUE: &str = "queue";

/// The [`SERVER_TIMING`] metric of the engine's time for the statement(s).
pub const SERVER_TIMING_DB: &str = "db";

/// The [`SERVER_TIMING`] metric of the whole request until its head was sent.
pub const SERVER_TIMING_TOTAL: &str = "total";

/// `Sqlhttp-Engine`: on every response, the engine behind the server:
/// [`ENGINE_SQLITE`] or [`ENGINE_POSTGRESQL`] (OpenTelemetry's `db.system.name` values).
pub const ENGINE: &str = "sqlhttp-engine";

/// The [`ENGINE`] value of a SQLite server.
pub const ENGINE_SQLITE: &str = "sqlite";

/// The [`ENGINE`] value of a PostgreSQL server.
pub const ENGINE_POSTGRESQL: &str = "postgresql";

/// Every header name above, for tests and documents that list them.
pub const ALL: [&str; 11] = [
    BOOKMARK,
    CONSISTENCY,
    SERVED_BY,
    ATTEMPT,
    IDEMPOTENCY_KEY,
    IDEMPOTENT_REPLAYED,
    REQUEST_ID,
    TRACEPARENT,
    TRACESTATE,
    SERVER_TIMING,
    ENGINE,
];
