//! Exactly-once requests on PostgreSQL: the `_sqlhttp_idempotency` table, and running keyed
//! work so that its effects and its stored outcome commit in ONE transaction.
//!
//! The key is locked for the transaction (`pg_try_advisory_xact_lock`), so replicas sharing the
//! database run one request per key: another one sent meanwhile answers `409
//! IDEMPOTENCY_KEY_IN_USE` (retry later), and once the first commits, the key replays. Only the login role
//! reaches the table: the keyed work runs as `sqlhttp_client`, inside a savepoint, and the role
//! is reset before the outcome is stored. Knows SQL and the protocol's error codes; nothing about
//! HTTP or what the work is (the caller passes it as a future).

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_postgres::Client;

use crate::api_error::{ApiError, ErrorCode};
use crate::engine::Outcome;

/// The outcome table: the login role owns it, nobody else has any privilege on it.
pub(crate) const TABLE_DDL: &str = "\
CREATE TABLE IF NOT EXISTS _sqlhttp_idempotency (
    key text PRIMARY KEY,
    request_hash bytea NOT NULL,
    status integer NOT NULL,
    body bytea NOT NULL,
    created_at bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS _sqlhttp_idempotency_created_at
    ON _sqlhttp_idempotency (created_at);
REVOKE ALL ON _sqlhttp_idempotency FROM PUBLIC;";

const SAVEPOINT: &str = "_sqlhttp_work";

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Deletes outcomes older than `ttl`; returns how many were deleted.
pub(crate) async fn purge_expired(
    client: &Client,
    ttl: Duration,
) -> Result<u64, tokio_postgres::Error> {
    client
        .execute(
            "DELETE FROM _sqlhttp_idempotency WHERE created_at <= $1",
            &[&now_millis().saturating_sub(millis(ttl))],
        )
        .await
}

/// Runs keyed work exactly once inside the transaction the caller opened (as the login role,
/// with its statement timeout set): replays a stored outcome for the same request, refuses a
/// different request with 422, or runs `work` and stores its 2xx / final 4xx outcome with its
/// effects. 5xx outcomes are not stored; the caller rolls back on `Err` and commits on `Ok`.
pub(crate) async fn run_with_key<F>(
    client: &Client,
    ttl: Duration,
    key: &str,
    request_hash: &[u8],
    work: F,
    map: &(dyn Fn(tokio_postgres::Error) -> ApiError + Sync),
) -> Result<Outcome, ApiError>
where
    F: Future<Output = Result<Vec<u8>, ApiError>>,
{
    // One runner per key across replicas: another replica running the same key answers as
    // this one's in-flight registry does (409, retry later), then replays.
    let locked: bool = client
        .query_one(
            "SELECT pg_try_advisory_xact_lock(hashtextextended($1, 1397836872))",
            &[&key],
        )
        .await
        .map_err(map)?
        .get(0);
    if !locked {
        return Err(ApiError::new(
            ErrorCode::IdempotencyKeyInUse,
            "a request with this Idempotency-Key is still running; retry later",
        ));
    }
    let stored = client
        .query_opt(
            "SELECT request_hash, status, body, created_at FROM _sqlhttp_idempotency WHERE key = $1",
            &[&key],
        )
        .await
        .map_err(map)?;
    if let Some(row) = stored {
        let created_at: i64 = row.get(3);
        if now_millis().saturating_sub(created_at) < millis(ttl) {
            let hash: Vec<u8> = row.get(0);
            return if hash == request_hash {
                let status: i32 = row.get(1);
                Ok(Outcome {
                    status: u16::try_from(status).unwrap_or(500),
                    body: row.get(2),
                    replayed: true,
                })
            } else {
                Err(ApiError::new(
                    ErrorCode::IdempotencyKeyReused,
                    "this Idempotency-Key was already used with a different request body",
                ))
            };
        }
    }

    client
        .batch_execute(&format!(
            "SAVEPOINT {SAVEPOINT}; SET LOCAL ROLE {}",
            super::setup::CLIENT_ROLE
        ))
        .await
        .map_err(map)?;
    let (status, body) = match work.await {
        Ok(body) => (200u16, body),
        Err(err) if err.code.is_stored_outcome() => {
            // Undo whatever part of the work ran (the statements of a batch before the one
            // that failed); the savepoint also ends the failed statement's aborted state.
            client
                .batch_execute(&format!("ROLLBACK TO SAVEPOINT {SAVEPOINT}"))
                .await
                .map_err(map)?;
            (err.code.status().as_u16(), err.body())
        }
        Err(err) => return Err(err),
    };
    client.batch_execute("RESET ROLE").await.map_err(map)?;
    client
        .execute(
            "INSERT INTO _sqlhttp_idempotency (key, request_hash, status, body, created_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (key) DO UPDATE SET \
             request_hash = EXCLUDED.request_hash, status = EXCLUDED.status, \
             body = EXCLUDED.body, created_at = EXCLUDED.created_at",
            &[
                &key,
                &request_hash,
                &i32::from(status),
                &body,
                &now_millis(),
            ],
        )
        .await
        .map_err(map)?;
    Ok(Outcome {
        status,
        body,
        replayed: false,
    })
}
