//! The limits of the engine and of interactive transactions ([`Limits`],
//! [`TransactionLimits`]), with their defaults: the `--statement-timeout`, `--max-*-bytes`,
//! `--queue-depth`, connection and `--transaction-*` flag groups.
//!
//! Plain data; nothing here knows about HTTP, the engines or how the limits are enforced.

use std::time::Duration;

/// The engine's limits, with their defaults in [`Limits::default`]. Every statement passes them,
/// whatever the engine (see `docs/adr/0012-statement-sandbox.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long one statement may run before it is interrupted (`422 STATEMENT_TIMEOUT`).
    /// Default 30 s.
    pub statement_timeout: Duration,
    /// Longest accepted SQL text, in bytes (`413 PAYLOAD_TOO_LARGE`). Default 256 KiB.
    pub max_sql_bytes: usize,
    /// Largest string or blob the engine will hold, whether bound or computed. Default 4 MiB
    /// (its base64 fits the default body limit).
    pub max_value_bytes: usize,
    /// Largest success body the server will build whole for one statement: a keyed write's
    /// outcome, stored for replay (`422 RESULT_TOO_LARGE` past it). Other results stream and are
    /// not limited (see `docs/adr/0016-streamed-results.md`). Default 16 MiB.
    pub max_result_bytes: usize,
    /// Statements that may wait for a connection before the server answers `503 UNAVAILABLE`
    /// (per pool: the writer's and the readers'). Default 128.
    pub queue_depth: usize,
    /// Reader connections that run read-only statements beside the one writer; 0 runs
    /// everything on the writer. Default 4. SQLite only: PostgreSQL's pool is `pool_size`.
    pub read_connections: usize,
    /// Connections to PostgreSQL in the engine's pool; each request holds one while it runs
    /// (0 is taken as 1). Default [`Limits::default_pool_size`]. Not used on SQLite.
    pub pool_size: usize,
    /// Most statements in one atomic batch (`413 PAYLOAD_TOO_LARGE` past it). Default 100.
    pub max_batch_statements: usize,
    /// Memory all of SQLite's connections in the process may use at once: page caches, sorts,
    /// `DISTINCT` and temporary tables (held in memory, never spilled to files), values being
    /// computed. Past it a statement fails with `503 UNAVAILABLE` and its work is rolled back.
    /// SQLite's limit is one per process and only ever goes down: the lowest value any engine
    /// in the process started with holds for all of them (and for the embedding application's
    /// own SQLite connections). Default 512 MiB. Not used on PostgreSQL.
    pub max_engine_memory: usize,
    /// How long an interactive write transaction may hold SQLite's one writer without running
    /// a statement; past it the engine rolls it back and later requests for it get
    /// `410 TRANSACTION_EXPIRED`, and writes queued behind it go on (see
    /// `docs/adr/0042-sqlite-transactions-bounded-like-statements.md`). Default 2 s. Not used on
    /// PostgreSQL.
    pub transaction_write_idle: Duration,
    /// The write-ahead log's hard bound, in bytes: past it writes wait (then `503`, not run)
    /// and read-only transactions end until a checkpoint truncates the log, which is tried
    /// once it passes a quarter of this (see `docs/adr/0046-a-hard-bound-on-the-write-ahead-log.md`).
    /// Default 256 MiB. Not used on PostgreSQL.
    pub max_wal_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            statement_timeout: Duration::from_secs(30),
            max_sql_bytes: 256 * 1024,
            max_value_bytes: 4 * 1024 * 1024,
            max_result_bytes: 16 * 1024 * 1024,
            queue_depth: 128,
            read_connections: 4,
            pool_size: Limits::default_pool_size(),
            max_batch_statements: sqlhttp_protocol::defaults::MAX_BATCH_STATEMENTS,
            max_engine_memory: 512 * 1024 * 1024,
            transaction_write_idle: Duration::from_secs(2),
            max_wal_bytes: 256 * 1024 * 1024,
        }
    }
}

impl Limits {
    /// The PostgreSQL pool's default size, sized for the machine: four connections per CPU
    /// (deadpool's own default), at least 8 and at most 32. Each request holds its connection
    /// for a round trip to PostgreSQL at least, and with too few the server's threads fall idle
    /// between answers and are woken again for each: on this project's 2-core machines, 8
    /// connections served verified reads with less CPU per read than 4 did
    /// (`benches/gateway.rs`, ADR 0065), where before flights (ADR 0061) more had served no
    /// faster. 16 measured about the same as 8 there; the smaller pool asks less of
    /// PostgreSQL's `max_connections` and of the transaction slots (`pool_size - 1`).
    pub fn default_pool_size() -> usize {
        std::thread::available_parallelism()
            .map_or(2, std::num::NonZeroUsize::get)
            .saturating_mul(4)
            .clamp(8, 32)
    }
}

/// What interactive transactions may hold (see `docs/adr/0036-interactive-transactions.md`),
/// with defaults in [`TransactionLimits::default`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransactionLimits {
    /// Transactions open at once; past it opening one answers `503 UNAVAILABLE` with
    /// `Retry-After`. 0 switches interactive transactions off. Default 16. On PostgreSQL each
    /// open transaction holds one connection of the pool, and at most `pool_size - 1` are held
    /// so (an open past them waits at most the statement timeout).
    pub max_open: usize,
    /// How long a transaction may wait for its client's next request; past it the server rolls
    /// it back, and later requests get `410 TRANSACTION_EXPIRED`. Default 10 s.
    pub idle_timeout: Duration,
    /// How long a transaction may stay open in all, however busy. Default 60 s.
    pub max_lifetime: Duration,
}

impl Default for TransactionLimits {
    fn default() -> Self {
        TransactionLimits {
            max_open: 16,
            idle_timeout: Duration::from_secs(10),
            max_lifetime: Duration::from_secs(60),
        }
    }
}
