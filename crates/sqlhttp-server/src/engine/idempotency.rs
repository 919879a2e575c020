//! Exactly-once statements: the `_sqlhttp_idempotency` table, replay of stored outcomes, and
//! running a keyed statement so that its effects and its stored outcome commit in ONE
//! transaction.
//!
//! Runs on the writer's engine thread. Knows SQLite and the protocol's error codes; knows
//! nothing about HTTP headers or the in-memory in-flight registry (the caller guarantees one
//! runner per key). The sandbox keeps client statements away from the table.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, params};

use crate::api_error::{ApiError, ErrorCode};
use crate::engine::Outcome;
use crate::engine::connection::Conn;
use crate::engine::errors::map_engine_error;
use crate::engine::exec::{self, Access, Ran};
use crate::request::SqlRequest;

/// Expired keys are purged at most this often (and looked past on every lookup).
const PURGE_INTERVAL: Duration = Duration::from_secs(60);

const TABLE_DDL: &str = "\
CREATE TABLE IF NOT EXISTS _sqlhttp_idempotency (
    key TEXT PRIMARY KEY NOT NULL,
    request_hash BLOB NOT NULL,
    status INTEGER NOT NULL,
    body BLOB NOT NULL,
    created_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS _sqlhttp_idempotency_created_at
    ON _sqlhttp_idempotency (created_at);";

/// Creates the outcome table (and its expiry index) when missing.
pub(crate) fn create_table(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(TABLE_DDL)
}

/// Deletes outcomes older than `ttl`; returns how many were deleted.
pub(crate) fn purge_expired(conn: &Connection, ttl: Duration) -> rusqlite::Result<usize> {
    conn.prepare_cached("DELETE FROM _sqlhttp_idempotency WHERE created_at <= ?1")?
        .execute([now_millis().saturating_sub(millis(ttl))])
}

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

struct Stored {
    request_hash: Vec<u8>,
    status: u16,
    body: Vec<u8>,
    created_at: i64,
}

const STATEMENT: &str = "_sqlhttp_statement";

/// Opens the server's own transaction around a keyed statement. Clients cannot hold one
/// open (the sandbox refuses transaction control), so the connection is always in autocommit
/// here.
fn begin(conn: &Connection) -> Result<(), ApiError> {
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(map_engine_error)
}

fn commit(conn: &Connection) -> Result<(), ApiError> {
    conn.execute_batch("COMMIT").map_err(|e| {
        rollback(conn);
        map_engine_error(e)
    })
}

fn rollback(conn: &Connection) {
    if conn.is_autocommit() {
        return;
    }
    if let Err(e) = conn.execute_batch("ROLLBACK") {
        tracing::error!(error = %e, "cannot roll back an idempotent statement's transaction");
    }
}

/// Runs `body` inside the open transaction; on error rolls it back.
fn within<T>(conn: &Connection, body: impl FnOnce() -> rusqlite::Result<T>) -> Result<T, ApiError> {
    body().map_err(|e| {
        rollback(conn);
        map_engine_error(e)
    })
}

fn lookup(conn: &Connection, key: &str) -> rusqlite::Result<Option<Stored>> {
    conn.prepare_cached(
        "SELECT request_hash, status, body, created_at FROM _sqlhttp_idempotency WHERE key = ?1",
    )?
    .query_row([key], |row| {
        Ok(Stored {
            request_hash: row.get(0)?,
            status: row.get(1)?,
            body: row.get(2)?,
            created_at: row.get(3)?,
        })
    })
    .optional()
}

fn store(
    conn: &Connection,
    key: &str,
    hash: &[u8],
    status: u16,
    body: &[u8],
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT OR REPLACE INTO _sqlhttp_idempotency (key, request_hash, status, body, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![key, hash, status, body, now_millis()])?;
    Ok(())
}

fn purge_if_due(writer: &mut Conn, ttl: Duration) {
    let due = writer
        .last_purge
        .is_none_or(|at| at.elapsed() >= PURGE_INTERVAL);
    if due {
        writer.last_purge = Some(Instant::now());
        match purge_expired(&writer.conn, ttl) {
            Ok(0) => {}
            Ok(purged) => tracing::debug!(purged, "purged expired idempotency keys"),
            Err(e) => tracing::warn!(error = %e, "cannot purge expired idempotency keys"),
        }
    }
}

/// Runs a keyed request exactly once: replays a stored outcome for the same body, refuses a
/// different body with 422, or runs the statement and stores its 2xx / final 4xx outcome in the
/// statement's own transaction. 5xx outcomes are rolled back and not stored.
pub(crate) fn execute_with_key(
    writer: &mut Conn,
    ttl: Duration,
    key: &str,
    request_hash: &[u8],
    request: &SqlRequest,
) -> Result<Outcome, ApiError> {
    purge_if_due(writer, ttl);
    let writer = &*writer;
    let conn = &writer.conn;
    begin(conn)?;

    match within(conn, || lookup(conn, key))? {
        Some(stored) if now_millis().saturating_sub(stored.created_at) < millis(ttl) => {
            commit(conn)?;
            return if stored.request_hash == request_hash {
                Ok(Outcome {
                    status: stored.status,
                    body: stored.body,
                    replayed: true,
                })
            } else {
                Err(ApiError::new(
                    ErrorCode::IdempotencyKeyReused,
                    "this Idempotency-Key was already used with a different request body",
                ))
            };
        }
        Some(_expired) => within(conn, || {
            conn.prepare_cached("DELETE FROM _sqlhttp_idempotency WHERE key = ?1")?
                .execute([key])
        })
        .map(drop)?,
        None => {}
    }

    within(conn, || {
        conn.execute_batch(&format!("SAVEPOINT {STATEMENT}"))
    })?;
    let (status, body) = match exec::execute(writer, request, Access::ReadWrite) {
        Ok(Ran::Body(body)) => {
            within(conn, || conn.execute_batch(&format!("RELEASE {STATEMENT}")))?;
            (200, body)
        }
        Ok(Ran::NeedsWriter) => {
            rollback(conn);
            return Err(ApiError::internal());
        }
        Err(err) if err.code.is_stored_outcome() => {
            if !conn.is_autocommit() {
                // Undo whatever part of the statement ran (e.g. under OR FAIL).
                within(conn, || {
                    conn.execute_batch(&format!("ROLLBACK TO {STATEMENT}; RELEASE {STATEMENT}"))
                })?;
            }
            (err.code.status().as_u16(), err.body())
        }
        Err(err) => {
            rollback(conn);
            return Err(err);
        }
    };

    if conn.is_autocommit() {
        // The statement's own conflict resolution (OR ROLLBACK) ended the transaction; it
        // left no effects, so the outcome is stored on its own.
        store(conn, key, request_hash, status, &body).map_err(map_engine_error)?;
    } else {
        within(conn, || store(conn, key, request_hash, status, &body))?;
        commit(conn)?;
    }
    Ok(Outcome {
        status,
        body,
        replayed: false,
    })
}
