//! The protocol's header names, in lower case (HTTP/2 sends them so; HTTP/1 compares them without
//! case), and the values some of them take. Headers of HTTP itself (`Retry-After`, `Allow`,
//! `WWW-Authenticate`) are `http`'s; headers only the server's own processes exchange are the
//! server's.

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

/// Every header name above, for tests and documents that list them.
pub const ALL: [&str; 7] = [
    BOOKMARK,
    CONSISTENCY,
    SERVED_BY,
    ATTEMPT,
    IDEMPOTENCY_KEY,
    IDEMPOTENT_REPLAYED,
    REQUEST_ID,
];
