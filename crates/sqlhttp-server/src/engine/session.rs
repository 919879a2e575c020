//! [`Session`]: the one SQLite connection of the process, opened and configured, plus the
//! bookkeeping that travels with it (when expired idempotency keys were last purged).
//!
//! Lives on the engine thread. Knows SQLite and the idempotency table's schema; knows nothing
//! about HTTP or the async runtime.

use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::config::Database;
use crate::engine::exec::ROWID_PROBE_DDL;
use crate::engine::idempotency;

/// How long the engine waits for another process's lock before answering 503.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_millis(250);

/// The engine's connection and its per-process state.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) conn: Connection,
    pub(crate) last_purge: Option<Instant>,
}

impl Session {
    /// Opens and configures the database; creates the idempotency table when the feature is on.
    pub(crate) fn open(
        database: &Database,
        idempotency_ttl: Option<Duration>,
    ) -> rusqlite::Result<Session> {
        let conn = match database {
            Database::Memory => Connection::open_in_memory()?,
            Database::File(path) => Connection::open(path)?,
        };
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.execute_batch("PRAGMA foreign_keys = ON")?;
        conn.execute_batch(ROWID_PROBE_DDL)?;
        let mut session = Session {
            conn,
            last_purge: None,
        };
        if let Some(ttl) = idempotency_ttl {
            idempotency::create_table(&session.conn)?;
            idempotency::purge_expired(&session.conn, ttl)?;
            session.last_purge = Some(Instant::now());
        }
        Ok(session)
    }

    /// Restores a usable state after engine code panicked: a transaction the job opened is
    /// rolled back, so later requests do not run inside it.
    pub(crate) fn recover_after_panic(&mut self, was_autocommit: bool) {
        if was_autocommit
            && !self.conn.is_autocommit()
            && let Err(e) = self.conn.execute_batch("ROLLBACK")
        {
            tracing::error!(error = %e, "cannot roll back after a panic in engine code");
        }
    }
}
