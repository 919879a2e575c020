//! [`Conn`]: one configured SQLite connection of the engine (the writer or a reader) with its
//! hooks, and [`Target`], where the engine's connections point: the served file, or, for
//! `sqlite::memory:`, a throwaway file in a private temporary directory that is removed when
//! the last connection closes (so reads run beside writes exactly as on a file; see ADR 0013).
//!
//! Opening sets everything the server owns about a connection: the sandbox's limits and
//! authorizer, the progress handler (statement timeout, cancellation, shutdown), the busy
//! handler, the commit hook (a given-up job never commits), WAL journaling and durable commits for files, `query_only` for readers. Lives on
//! engine threads; knows nothing about HTTP, requests or pooling.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::hooks::Authorization;
use rusqlite::{Connection, OpenFlags};

use crate::config::{Database, Limits};
use crate::engine::keyed::PurgeClock;
use crate::engine::sqlite::control::Hooks;
use crate::engine::sqlite::sandbox;
use crate::engine::sqlite::statement_cache::StatementCache;
use crate::engine::sqlite::wal;

/// How long a statement waits for another process's lock before answering 503 (the engine's
/// own connections never wait for each other in WAL mode, but for checkpoints).
pub(crate) const BUSY_LIMIT: Duration = Duration::from_millis(250);

/// The least time between two checkpoints [`Conn::bound_wal`] tries. A try that readers hold up
/// costs nothing (it does not wait for them), so it comes back soon: the engine ends read-only
/// transactions that pin the log (see `sessions`), and plain reads end within their timeout.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);

/// SQLite virtual-machine steps between two checks of the job's deadline and cancellation.
const PROGRESS_EVERY: i32 = 1_000;

/// Whether a connection may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Writer,
    Reader,
}

/// Where every connection of one engine points.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// The served database file.
    File(PathBuf),
    /// A throwaway database in a private temporary directory, removed when the last clone of
    /// this target is dropped (every connection holds one).
    Scratch(Arc<tempfile::TempDir>),
}

impl Target {
    pub(crate) fn new(database: &Database) -> std::io::Result<Target> {
        match database {
            Database::File(path) => Ok(Target::File(path.clone())),
            Database::Memory => tempfile::Builder::new()
                .prefix("sqlhttpd-")
                .tempdir()
                .map(|dir| Target::Scratch(Arc::new(dir))),
            Database::Postgres(_) => Err(std::io::Error::other(
                "a PostgreSQL database is served by the PostgreSQL engine",
            )),
        }
    }

    fn path(&self) -> PathBuf {
        match self {
            Target::File(path) => path.clone(),
            Target::Scratch(dir) => dir.path().join("scratch.db"),
        }
    }

    /// The database's write-ahead log file.
    pub(crate) fn wal_path(&self) -> PathBuf {
        let mut wal = self.path().into_os_string();
        wal.push("-wal");
        PathBuf::from(wal)
    }

    /// Removes a throwaway database's directory now, though given-up connections may still hold
    /// its files (on Unix they go on with files nobody can reach; the directory's own removal,
    /// when the last of them closes, then finds nothing). A served file is left alone.
    pub(crate) fn discard(&self) {
        if let Target::Scratch(dir) = self
            && let Err(e) = std::fs::remove_dir_all(dir.path())
        {
            tracing::warn!(error = %e, "cannot remove the throwaway database");
        }
    }

    /// Whether committed data must survive a crash (a scratch database dies with the server).
    fn is_durable(&self) -> bool {
        matches!(self, Target::File(_))
    }
}

fn path_str(path: &Path) -> rusqlite::Result<&str> {
    path.to_str()
        .ok_or_else(|| rusqlite::Error::InvalidPath(path.to_owned()))
}

/// One engine connection and its per-connection state.
#[derive(Debug)]
pub(crate) struct Conn {
    // Declared first, dropped first: the connection closes before its target's directory
    // can be removed.
    pub(crate) conn: Connection,
    pub(crate) hooks: Arc<Hooks>,
    pub(crate) limits: Limits,
    /// When expired idempotency keys were last purged (writer only).
    pub(crate) purges: PurgeClock,
    /// The writer's write-ahead log file, watched by [`Conn::bound_wal`]; `None` on readers.
    wal: Option<PathBuf>,
    /// When [`Conn::bound_wal`] last tried a checkpoint.
    last_checkpoint: Cell<Option<Instant>>,
    /// The schema version (SQLite's schema cookie) this connection's compiled schema is at
    /// least as new as; `None` before the first check.
    schema_seen: Cell<Option<i64>>,
    /// The client statements kept compiled; dropped when the schema moves.
    pub(crate) statements: StatementCache,
    /// Whether this connection may write (a reader's transactions read committed data only).
    role: Role,
    _target: Target,
}

impl Conn {
    /// Opens and configures a connection to `target`.
    pub(crate) fn open(
        target: &Target,
        role: Role,
        limits: Limits,
        hooks: Arc<Hooks>,
    ) -> rusqlite::Result<Conn> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let path = target.path();
        let mut conn = Connection::open_with_flags(path_str(&path)?, flags)?;
        StatementCache::size(&conn);
        sandbox::configure(&conn, &limits)?;
        crate::engine::sqlite::functions::register(&conn, &hooks)?;
        match role {
            Role::Writer => {
                // Readers never block the writer nor each other.
                conn.pragma_update(None, "journal_mode", "WAL")?;
                // A checkpoint that resets the log truncates it to this (see `bound_wal`).
                let threshold = wal::threshold(limits.max_wal_bytes);
                conn.pragma_update(
                    None,
                    "journal_size_limit",
                    i64::try_from(threshold).unwrap_or(i64::MAX),
                )?;
            }
            Role::Reader => conn.execute_batch("PRAGMA query_only = ON")?,
        }
        // An acknowledged commit survives a crash; a scratch database does not outlive the
        // process, so it skips the fsyncs.
        conn.execute_batch(if target.is_durable() {
            "PRAGMA synchronous = FULL"
        } else {
            "PRAGMA synchronous = OFF"
        })?;
        // Sorts, DISTINCT and temporary tables stay in memory, under the engine's memory limit
        // (`PRAGMA hard_heap_limit`, set at start), instead of spilling to files without bound.
        conn.execute_batch("PRAGMA temp_store = MEMORY")?;

        let progress = Arc::clone(&hooks);
        conn.progress_handler(PROGRESS_EVERY, Some(move || progress.must_stop()))?;
        let busy = Arc::clone(&hooks);
        let mut waiting_since = Instant::now();
        conn.busy_handler(Some(move |count: i32| {
            if count == 0 {
                waiting_since = Instant::now();
            }
            if busy.must_stop() || busy.is_impatient() || waiting_since.elapsed() >= BUSY_LIMIT {
                return false;
            }
            let pause = Duration::from_millis(u64::from(count.clamp(1, 10).unsigned_abs()));
            std::thread::sleep(pause);
            true
        }))?;
        let authorizer = Arc::clone(&hooks);
        conn.authorizer(Some(move |context: rusqlite::hooks::AuthContext<'_>| {
            if !authorizer.is_sandboxed() {
                return Authorization::Allow;
            }
            match sandbox::authorize(&context) {
                Ok(()) => Authorization::Allow,
                Err(reason) => {
                    authorizer.record_denial(reason);
                    Authorization::Deny
                }
            }
        }))?;
        // The one place every commit passes, the server's transactions and a client write's own
        // alike: a job the watchdog gave up rolls back here instead (ADR 0032).
        let commit = Arc::clone(&hooks);
        conn.commit_hook(Some(move || !commit.commit_allowed()))?;
        Ok(Conn {
            conn,
            hooks,
            limits,
            purges: PurgeClock::default(),
            wal: (role == Role::Writer).then(|| target.wal_path()),
            last_checkpoint: Cell::new(None),
            schema_seen: Cell::new(None),
            statements: StatementCache::default(),
            role,
            _target: target.clone(),
        })
    }

    /// Brings the connection's compiled schema up to the database's, before a client
    /// statement is compiled: a connection compiles against the schema it read last, and learns
    /// of another connection's DDL only when a statement it runs checks the schema version, which
    /// is after compiling (so a stale compile gives errors and column lists of the old schema).
    /// Returns whether the schema had moved since the last check; when it had, the client
    /// statements kept compiled are dropped (the authorizer sees their next compile). Call it
    /// outside the sandbox.
    ///
    /// The version is read first and recorded only after the reload, so what is recorded is
    /// never newer than what was loaded: a change committed in between is seen next time. A
    /// version read inside the writer's transaction is not recorded (it may be the
    /// transaction's own, uncommitted).
    pub(crate) fn refresh_schema(&self) -> rusqlite::Result<bool> {
        let version: i64 = self
            .conn
            .prepare_cached("PRAGMA schema_version")?
            .query_row([], |row| row.get(0))?;
        if self.schema_seen.get() == Some(version) {
            return Ok(false);
        }
        // Any read of the schema table checks the version it was compiled at, and a stale
        // connection then reloads its schema (SQLITE_SCHEMA, handled inside SQLite).
        self.conn
            .prepare_cached("SELECT 1 FROM main.sqlite_schema LIMIT 1")?
            .exists([])?;
        self.statements.forget(&self.conn);
        // Inside the writer's transaction the version read may be the transaction's own,
        // uncommitted: if it rolls back, another process's change can bring the database to
        // that same number with another schema. Nothing is recorded then, so the first check
        // after the transaction reloads and forgets again. (A reader's transaction reads a
        // committed snapshot: a version no newer than the database's, seen moving next time.)
        let uncommitted = self.role == Role::Writer && !self.conn.is_autocommit();
        self.schema_seen.set((!uncommitted).then_some(version));
        Ok(true)
    }

    /// After a job on the writer: when the write-ahead log has grown past its truncate
    /// threshold (a quarter of `--max-wal-bytes`: pages of large writes, kept or rolled back),
    /// checkpoints it and truncates it, so the file does not keep what writes left in it for as
    /// long as the server runs. A checkpoint that readers hold up is tried again after the next
    /// job, or the watchdog's nudge (ADR 0046).
    pub(crate) fn bound_wal(&self) {
        let Some(wal) = &self.wal else { return };
        let size = std::fs::metadata(wal).map_or(0, |meta| meta.len());
        if size <= wal::threshold(self.limits.max_wal_bytes) {
            return;
        }
        // While readers hold it up, try at most once every `CHECKPOINT_EVERY`, not after every
        // write (each try copies what it can, and does not wait for the readers).
        if self
            .last_checkpoint
            .get()
            .is_some_and(|at| at.elapsed() < CHECKPOINT_EVERY)
        {
            return;
        }
        self.truncate_wal();
    }

    /// Tries a `TRUNCATE` checkpoint now, without waiting for readers; whether it truncated
    /// the log.
    pub(crate) fn truncate_wal(&self) -> bool {
        self.last_checkpoint.set(Some(Instant::now()));
        let checkpoint = self.hooks.without_waiting(|| {
            self.conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
                    row.get::<_, i64>(0)
                })
        });
        match checkpoint {
            Ok(0) => {
                tracing::debug!("truncated the write-ahead log");
                true
            }
            Ok(_) => {
                tracing::debug!("readers held up the checkpoint; later");
                false
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot checkpoint the write-ahead log");
                false
            }
        }
    }

    /// Ends a transaction a job left open (after a panic, or anything unforeseen), so no
    /// state crosses from one request to the next.
    pub(crate) fn end_stray_transaction(&self) {
        if !self.conn.is_autocommit() {
            tracing::error!("a job left a transaction open; rolling it back");
            if let Err(e) = self.conn.execute_batch("ROLLBACK") {
                tracing::error!(error = %e, "cannot roll back a stray transaction");
            }
        }
    }
}
