//! Exactly-once requests: the `_sqlhttp_idempotency` table, replay of stored outcomes, and
//! running keyed work (one statement, or a whole batch) so that its effects and its stored
//! outcome commit in ONE transaction.
//!
//! Runs on the writer's engine thread. Knows SQLite and the protocol's error codes; knows
//! nothing about HTTP headers, what the keyed work is (the caller passes it as a closure), or the
//! in-memory in-flight registry (the caller guarantees one runner per key). The sandbox keeps
//! client statements away from the table, and every statement here names it in full
//! (`main._sqlhttp_idempotency`): an object of the same name elsewhere (a temp table, which
//! unqualified names find first) is never the store.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, params};

use crate::api_error::{ApiError, ErrorCode};
use crate::engine::Outcome;
use crate::engine::connection::Conn;
use crate::engine::errors::map_engine_error;
use crate::engine::exec::{self, Access, Ran};
use crate::engine::transaction::{Mode, begin, commit, rollback, within};
use crate::request::SqlRequest;

/// Expired keys are purged at most this often (and looked past on every lookup).
const PURGE_INTERVAL: Duration = Duration::from_secs(60);

const TABLE_DDL: &str = "\
CREATE TABLE IF NOT EXISTS main._sqlhttp_idempotency (
    key TEXT PRIMARY KEY NOT NULL,
    request_hash BLOB NOT NULL,
    status INTEGER NOT NULL,
    body BLOB NOT NULL,
    created_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS main._sqlhttp_idempotency_created_at
    ON _sqlhttp_idempotency (created_at);";

/// Creates the outcome table (and its expiry index) when missing.
pub(crate) fn create_table(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(TABLE_DDL)
}

/// Deletes outcomes older than `ttl`; returns how many were deleted.
pub(crate) fn purge_expired(conn: &Connection, ttl: Duration) -> rusqlite::Result<usize> {
    conn.prepare_cached("DELETE FROM main._sqlhttp_idempotency WHERE created_at <= ?1")?
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

fn lookup(conn: &Connection, key: &str) -> rusqlite::Result<Option<Stored>> {
    conn.prepare_cached(
        "SELECT request_hash, status, body, created_at FROM main._sqlhttp_idempotency \
         WHERE key = ?1",
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
        "INSERT OR REPLACE INTO main._sqlhttp_idempotency \
         (key, request_hash, status, body, created_at) \
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
        // The purge commits on its own, before the job's transaction: it is not the job's commit.
        match writer
            .hooks
            .housekeeping(|| purge_expired(&writer.conn, ttl))
        {
            Ok(0) => {}
            Ok(purged) => tracing::debug!(purged, "purged expired idempotency keys"),
            Err(e) => tracing::warn!(error = %e, "cannot purge expired idempotency keys"),
        }
    }
}

/// Runs one keyed statement exactly once (see [`run_with_key`]).
pub(crate) fn execute_with_key(
    writer: &mut Conn,
    ttl: Duration,
    key: &str,
    request_hash: &[u8],
    request: &SqlRequest,
) -> Result<Outcome, ApiError> {
    run_with_key(
        writer,
        ttl,
        key,
        request_hash,
        |writer| match exec::execute(writer, request, Access::ReadWrite)? {
            Ran::Body(body) => Ok(body),
            Ran::NeedsWriter => Err(ApiError::internal()),
        },
    )
}

/// Runs keyed work exactly once: replays a stored outcome for the same request, refuses a
/// different request with 422, or runs `work` inside the server's transaction and stores its
/// 2xx / final 4xx outcome in that same transaction. 5xx outcomes are rolled back and not stored.
///
/// `work` runs inside a savepoint of an open transaction and must neither commit nor roll it
/// back; when it fails with a stored outcome, whatever part of it ran is undone before the
/// outcome is stored.
pub(crate) fn run_with_key(
    writer: &mut Conn,
    ttl: Duration,
    key: &str,
    request_hash: &[u8],
    work: impl FnOnce(&Conn) -> Result<Vec<u8>, ApiError>,
) -> Result<Outcome, ApiError> {
    purge_if_due(writer, ttl);
    let writer = &*writer;
    let conn = &writer.conn;
    begin(conn, Mode::Write)?;

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
            conn.prepare_cached("DELETE FROM main._sqlhttp_idempotency WHERE key = ?1")?
                .execute([key])
        })
        .map(drop)?,
        None => {}
    }

    within(conn, || {
        conn.execute_batch(&format!("SAVEPOINT {STATEMENT}"))
    })?;
    let (status, body) = match work(writer) {
        Ok(body) => {
            within(conn, || conn.execute_batch(&format!("RELEASE {STATEMENT}")))?;
            (200, body)
        }
        Err(err) if err.code.is_stored_outcome() => {
            if !conn.is_autocommit() {
                // Undo whatever part of the work ran (e.g. a statement under OR FAIL, or the
                // statements of a batch before the one that failed).
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
        // A statement's own conflict resolution (OR ROLLBACK) ended the transaction; it
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::config::{Database, Limits};
    use crate::engine::connection::{Role, Target};
    use crate::engine::control::Hooks;

    fn writer() -> Conn {
        let hooks = Arc::new(Hooks::new(Arc::new(AtomicBool::new(false))));
        let target = Target::new(&Database::Memory).unwrap();
        let conn = Conn::open(&target, Role::Writer, Limits::default(), hooks).unwrap();
        conn.conn.execute_batch(exec::ROWID_PROBE_DDL).unwrap();
        create_table(&conn.conn).unwrap();
        conn.conn.execute_batch("CREATE TABLE t (v)").unwrap();
        conn
    }

    /// Whatever shadows the store's name (here a temp table, planted past the sandbox), the
    /// server's statements reach the store itself: a retry replays, a forged outcome is not one.
    #[test]
    fn the_store_is_named_in_full_so_nothing_can_shadow_it() {
        let mut writer = writer();
        let insert = SqlRequest {
            sql: "INSERT INTO t VALUES (1)".into(),
            params: vec![],
            read_only: false,
        };
        let ttl = Duration::from_secs(60);
        let first = execute_with_key(&mut writer, ttl, "k", b"hash", &insert).unwrap();
        assert!(!first.replayed);
        writer
            .conn
            .execute_batch(&format!(
                "CREATE TABLE temp._sqlhttp_idempotency (key, request_hash, status, body, \
                 created_at); INSERT INTO temp._sqlhttp_idempotency VALUES \
                 ('forged', CAST('hash' AS BLOB), 200, CAST('{{}}' AS BLOB), {})",
                now_millis()
            ))
            .unwrap();
        let retry = execute_with_key(&mut writer, ttl, "k", b"hash", &insert).unwrap();
        assert!(
            retry.replayed,
            "the applied write is replayed, not run again"
        );
        let forged = execute_with_key(&mut writer, ttl, "forged", b"hash", &insert).unwrap();
        assert!(!forged.replayed, "an outcome nobody stored is not replayed");
        let rows: i64 = writer
            .conn
            .query_row("SELECT count(*) FROM main.t", [], |row| row.get(0))
            .unwrap();
        assert_eq!(rows, 2);
        purge_expired(&writer.conn, Duration::ZERO).unwrap();
        let shadow: i64 = writer
            .conn
            .query_row(
                "SELECT count(*) FROM temp._sqlhttp_idempotency",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(shadow, 1, "the purge reached the store, not the shadow");
    }
}
