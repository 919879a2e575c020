//! Exactly-once requests on SQLite: the `_sqlhttp_idempotency` table, and running keyed work
//! (one statement, or a whole batch) so that its effects and its stored outcome commit in ONE
//! transaction. What a stored outcome means and what a run leaves to store are the shared rule's
//! (`engine::keyed`).
//!
//! Runs on the writer's engine thread. Knows SQLite and the protocol's error codes; knows
//! nothing about HTTP headers, what the keyed work is (the caller passes it as a closure), or the
//! in-memory in-flight registry (the caller guarantees one runner per key). The sandbox keeps
//! client statements away from the table, and every statement here names it in full
//! (`main._sqlhttp_idempotency`): an object of the same name elsewhere (a temp table, which
//! unqualified names find first) is never the store.

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use crate::engine::keyed::{self as rule, Decision, Stored, expired_before, now_millis};
use crate::engine::sqlite::connection::Conn;
use crate::engine::sqlite::errors::map_engine_error;
use crate::engine::sqlite::exec::{self, Ran};
use crate::engine::sqlite::transaction::{begin, commit, rollback, within};
use crate::engine::{Access, Keyed, Outcome};
use crate::protocol::error::ApiError;
use crate::protocol::request::SqlRequest;

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

/// Stores the peer secret (`engine::keyed::PEER_SECRET_KEY`: 256 random bits, never expiring)
/// unless one is there: the first server to open the database draws it, every other keeps it.
pub(crate) fn create_peer_secret(conn: &Connection) -> rusqlite::Result<()> {
    let secret: [u8; 32] = rand::random();
    conn.execute(
        "INSERT OR IGNORE INTO main._sqlhttp_idempotency \
         (key, request_hash, status, body, created_at) VALUES (?1, ?2, 200, ?3, ?4)",
        params![
            rule::PEER_SECRET_KEY,
            &rule::peer_secret_hash()[..],
            &secret[..],
            rule::NEVER_EXPIRES
        ],
    )?;
    Ok(())
}

/// Deletes outcomes older than `ttl`; returns how many were deleted.
pub(crate) fn purge_expired(conn: &Connection, ttl: Duration) -> rusqlite::Result<usize> {
    conn.prepare_cached("DELETE FROM main._sqlhttp_idempotency WHERE created_at <= ?1")?
        .execute([expired_before(ttl)])
}

const STATEMENT: &str = "_sqlhttp_statement";

pub(crate) fn lookup(conn: &Connection, key: &str) -> rusqlite::Result<Option<Stored>> {
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
            position: None,
        })
    })
    .optional()
}

/// Whether a keyed request (`key`, its `request_hash`) is answered from what is stored under its key (its outcome replayed, or a
/// different request refused) rather than run: such an answer writes nothing, so it need not
/// wait for the write-ahead log's bound (ADR 0046). Read outside any transaction, on the
/// writer: the run that follows looks again inside its own.
pub(crate) fn answered_from_store(
    conn: &Connection,
    key: &str,
    request_hash: &[u8],
    ttl: Duration,
) -> bool {
    match lookup(conn, key) {
        Ok(stored @ Some(_)) => matches!(
            rule::decide(stored, request_hash, ttl),
            Ok(Decision::Replay(_)) | Err(_)
        ),
        Ok(None) | Err(_) => false,
    }
}

/// Stores a `200` with `body` under `key` unless something is stored there already; what is
/// stored under `key` then, either way (a first claim wins: see `crate::transactions`' commit
/// records and their tombstones).
pub(crate) fn claim(
    conn: &Connection,
    key: &str,
    hash: &[u8],
    status: u16,
    body: &[u8],
) -> rusqlite::Result<Stored> {
    conn.prepare_cached(
        "INSERT OR IGNORE INTO main._sqlhttp_idempotency \
         (key, request_hash, status, body, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![key, hash, status, body, now_millis()])?;
    lookup(conn, key)?.ok_or(rusqlite::Error::QueryReturnedNoRows)
}

pub(crate) fn store(
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

fn purge_if_due(writer: &Conn, ttl: Duration) {
    if writer.purges.due() {
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
    writer: &Conn,
    keyed: &Keyed,
    request: &SqlRequest,
) -> Result<Outcome, ApiError> {
    run_with_key(writer, keyed, |writer| {
        match exec::execute(writer, request, Access::ReadWrite)? {
            Ran::Done(body) => Ok(body),
            Ran::NeedsWriter => Err(ApiError::internal()),
        }
    })
}

/// Runs keyed work exactly once: replays a stored outcome for the same request, refuses a
/// different request with 422, or runs `work` inside the server's transaction and stores its
/// 2xx / final 4xx outcome in that same transaction (`engine::keyed::settle`). Other failures
/// are rolled back and not stored.
///
/// `work` runs inside a savepoint of an open transaction and must neither commit nor roll it
/// back; when it fails with a stored outcome, whatever part of it ran is undone before the
/// outcome is stored.
pub(crate) fn run_with_key(
    writer: &Conn,
    keyed: &Keyed,
    work: impl FnOnce(&Conn) -> Result<Vec<u8>, ApiError>,
) -> Result<Outcome, ApiError> {
    let (key, request_hash) = (keyed.key.as_str(), &keyed.request_hash[..]);
    purge_if_due(writer, keyed.ttl);
    let conn = &writer.conn;
    begin(conn, Access::ReadWrite)?;

    let stored = within(conn, || lookup(conn, key))?;
    match rule::decide(stored, request_hash, keyed.ttl) {
        Ok(Decision::Replay(outcome)) => {
            commit(conn)?;
            return Ok(outcome);
        }
        Err(reused) => {
            commit(conn)?;
            return Err(reused);
        }
        Ok(Decision::Run { expired: true }) => within(conn, || {
            conn.prepare_cached("DELETE FROM main._sqlhttp_idempotency WHERE key = ?1")?
                .execute([key])
        })
        .map(drop)?,
        Ok(Decision::Run { expired: false }) => {}
    }

    within(conn, || {
        conn.execute_batch(&format!("SAVEPOINT {STATEMENT}"))
    })?;
    let ran = work(writer);
    let settled = match rule::settle(ran) {
        Ok(settled) => settled,
        Err(err) => {
            rollback(conn);
            return Err(err);
        }
    };
    match settled {
        rule::Settled::Succeeded(_) => {
            within(conn, || conn.execute_batch(&format!("RELEASE {STATEMENT}")))?;
        }
        rule::Settled::Refused(..) => {
            if !conn.is_autocommit() {
                // Undo whatever part of the work ran (e.g. a statement under OR FAIL, or the
                // statements of a batch before the one that failed).
                within(conn, || {
                    conn.execute_batch(&format!("ROLLBACK TO {STATEMENT}; RELEASE {STATEMENT}"))
                })?;
            }
        }
    }
    let (status, body) = settled.into_parts();

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
        position: None,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::config::{Database, Limits};
    use crate::engine::sqlite::connection::{Role, Target};
    use crate::engine::sqlite::control::Hooks;

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
        let writer = writer();
        let insert = SqlRequest {
            sql: "INSERT INTO t VALUES (1)".into(),
            params: vec![],
            read_only: false,
        };
        let keyed = |key: &str| Keyed {
            ttl: Duration::from_secs(60),
            key: key.to_owned(),
            request_hash: [7; 32],
            claim: Box::new(()),
        };
        let first = execute_with_key(&writer, &keyed("k"), &insert).unwrap();
        assert!(!first.replayed);
        writer
            .conn
            .execute_batch(&format!(
                "CREATE TABLE temp._sqlhttp_idempotency (key, request_hash, status, body, \
                 created_at); INSERT INTO temp._sqlhttp_idempotency VALUES \
                 ('forged', X'{}', 200, CAST('{{}}' AS BLOB), {})",
                "07".repeat(32),
                now_millis()
            ))
            .unwrap();
        let retry = execute_with_key(&writer, &keyed("k"), &insert).unwrap();
        assert!(
            retry.replayed,
            "the applied write is replayed, not run again"
        );
        let forged = execute_with_key(&writer, &keyed("forged"), &insert).unwrap();
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
