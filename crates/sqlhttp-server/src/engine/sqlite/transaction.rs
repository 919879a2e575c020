//! The server's own transactions around client statements (keyed statements and batches):
//! opening, committing, and rolling back so that a failure never leaves one open.
//!
//! Runs on an engine thread with a borrowed connection. Knows SQLite's transaction statements
//! and the protocol's error mapping; nothing about HTTP, requests or idempotency. Clients cannot
//! open transactions of their own (see `sandbox`), so the connection is in autocommit when one
//! of these begins.

use rusqlite::Connection;

use crate::engine::Access;
use crate::engine::sqlite::errors::map_engine_error;
use crate::protocol::error::ApiError;

/// Opens a transaction of the server's own: under [`Access::ReadOnly`] a `BEGIN` whose reads
/// see one snapshot, taken at the first read (WAL); under [`Access::ReadWrite`] a `BEGIN
/// IMMEDIATE`, which takes the write lock at once.
pub(crate) fn begin(conn: &Connection, access: Access) -> Result<(), ApiError> {
    conn.execute_batch(match access {
        Access::ReadOnly => "BEGIN",
        Access::ReadWrite => "BEGIN IMMEDIATE",
    })
    .map_err(map_engine_error)
}

/// Commits; on failure rolls back, so nothing half-done stays open.
pub(crate) fn commit(conn: &Connection) -> Result<(), ApiError> {
    conn.execute_batch("COMMIT").map_err(|e| {
        rollback(conn);
        map_engine_error(e)
    })
}

/// Rolls back the open transaction, if any (a statement's `OR ROLLBACK` may have ended it).
pub(crate) fn rollback(conn: &Connection) {
    if conn.is_autocommit() {
        return;
    }
    if let Err(e) = conn.execute_batch("ROLLBACK") {
        tracing::error!(error = %e, "cannot roll back the server's transaction");
    }
}

/// Runs `body` inside the open transaction; on error rolls it back.
pub(crate) fn within<T>(
    conn: &Connection,
    body: impl FnOnce() -> rusqlite::Result<T>,
) -> Result<T, ApiError> {
    body().map_err(|e| {
        rollback(conn);
        map_engine_error(e)
    })
}
