//! Exactly-once requests on PostgreSQL: the server's schema `_sqlhttp` (the idempotency table,
//! the server's secrets, and the functions that reach them), and running keyed work so that
//! its effects and its stored outcome commit in ONE transaction.
//!
//! Client statements log in as the client role (see `setup`), so the store cannot be a table
//! of that role's: it belongs to the `--database` role, and the client role may only call three
//! `SECURITY DEFINER` functions (`lookup`, `record`, `purge`), each of which first checks the
//! store key, a secret the server reads at start and binds as a parameter. A client can see
//! neither the table nor the key, so it can neither read, forge nor forget an outcome, not even
//! from a function of its own.
//!
//! The key is locked for the transaction (`pg_try_advisory_xact_lock`), so replicas sharing the
//! database run one request per key: another one sent meanwhile answers `409
//! IDEMPOTENCY_KEY_IN_USE` (retry later), and once the first commits, the key replays. The
//! lock, the lookup and the work's savepoint go out in one write (ADR 0034). Knows
//! SQL and the protocol's error codes; nothing about HTTP or what the work is (the caller
//! passes it as a future).

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_postgres::ClientWrapper;
use tokio_postgres::Client;

use crate::api_error::{ApiError, ErrorCode};
use crate::engine::Outcome;

/// The server's schema, created (or brought up to date) by the `--database` role at start.
/// Every object is that role's; PUBLIC has no right on any of them.
const SCHEMA_DDL: &str = "\
CREATE SCHEMA IF NOT EXISTS _sqlhttp;
REVOKE ALL ON SCHEMA _sqlhttp FROM PUBLIC;
CREATE TABLE IF NOT EXISTS _sqlhttp.secrets (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    client_password text NOT NULL,
    store_key text NOT NULL
);
CREATE TABLE IF NOT EXISTS _sqlhttp.idempotency (
    key text PRIMARY KEY,
    request_hash bytea NOT NULL,
    status integer NOT NULL,
    body bytea NOT NULL,
    created_at bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS idempotency_created_at ON _sqlhttp.idempotency (created_at);
REVOKE ALL ON ALL TABLES IN SCHEMA _sqlhttp FROM PUBLIC;

CREATE OR REPLACE FUNCTION _sqlhttp.authorize(p_store_key text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_store_key IS NULL
        OR p_store_key IS DISTINCT FROM (SELECT s.store_key FROM _sqlhttp.secrets AS s) THEN
        RAISE EXCEPTION 'only the server may use its store' USING ERRCODE = '42501';
    END IF;
END $$;

CREATE OR REPLACE FUNCTION _sqlhttp.lookup(p_store_key text, p_key text)
RETURNS TABLE (request_hash bytea, status integer, body bytea, created_at bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM _sqlhttp.authorize(p_store_key);
    RETURN QUERY SELECT i.request_hash, i.status, i.body, i.created_at
        FROM _sqlhttp.idempotency AS i WHERE i.key = p_key;
END $$;

CREATE OR REPLACE FUNCTION _sqlhttp.record(
    p_store_key text, p_key text, p_request_hash bytea, p_status integer, p_body bytea,
    p_created_at bigint
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM _sqlhttp.authorize(p_store_key);
    INSERT INTO _sqlhttp.idempotency AS i (key, request_hash, status, body, created_at)
        VALUES (p_key, p_request_hash, p_status, p_body, p_created_at)
        ON CONFLICT (key) DO UPDATE SET request_hash = EXCLUDED.request_hash,
            status = EXCLUDED.status, body = EXCLUDED.body, created_at = EXCLUDED.created_at;
END $$;

CREATE OR REPLACE FUNCTION _sqlhttp.purge(p_store_key text, p_before bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    purged bigint;
BEGIN
    PERFORM _sqlhttp.authorize(p_store_key);
    DELETE FROM _sqlhttp.idempotency AS i WHERE i.created_at <= p_before;
    GET DIAGNOSTICS purged = ROW_COUNT;
    RETURN purged;
END $$;

REVOKE ALL ON FUNCTION _sqlhttp.authorize(text), _sqlhttp.lookup(text, text),
    _sqlhttp.record(text, text, bytea, integer, bytea, bigint), _sqlhttp.purge(text, bigint)
    FROM PUBLIC;";

/// The three functions the client role may call.
const CLIENT_FUNCTIONS: &str = "_sqlhttp.lookup(text, text), \
_sqlhttp.record(text, text, bytea, integer, bytea, bigint), _sqlhttp.purge(text, bigint)";

/// The keyed work's savepoint is named this and a random suffix drawn for each request, so a
/// client cannot re-create it (ADR 0027).
const SAVEPOINT_PREFIX: &str = "_sqlhttp_work_";

/// Creates the schema, or brings its functions up to date; refuses a schema `_sqlhttp` that
/// another role owns (its objects would not be the server's).
pub(crate) async fn create(owner: &Client) -> Result<(), tokio_postgres::Error> {
    owner.batch_execute(SCHEMA_DDL).await?;
    owner
        .batch_execute(
            "DO $$ BEGIN
                IF (SELECT nspowner FROM pg_namespace WHERE nspname = '_sqlhttp')
                    <> (SELECT oid FROM pg_roles WHERE rolname = current_user) THEN
                    RAISE EXCEPTION 'the schema _sqlhttp belongs to another role'
                        USING ERRCODE = '42501';
                END IF;
            END $$",
        )
        .await
}

/// This database's secrets, drawn at random the first time: the client role's password and
/// the store key.
pub(crate) async fn secrets(owner: &Client) -> Result<(String, String), tokio_postgres::Error> {
    let fresh = || {
        let bits: [u8; 32] = rand::random();
        bits.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    owner
        .execute(
            "INSERT INTO _sqlhttp.secrets (client_password, store_key) VALUES ($1, $2) \
             ON CONFLICT (only_row) DO NOTHING",
            &[&fresh(), &fresh()],
        )
        .await?;
    let row = owner
        .query_one(
            "SELECT client_password, store_key FROM _sqlhttp.secrets",
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// Lets `role` (a plain identifier) call the store's functions, and nothing else of the schema.
pub(crate) async fn grant(owner: &Client, role: &str) -> Result<(), tokio_postgres::Error> {
    owner
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA _sqlhttp TO {role}; \
             GRANT EXECUTE ON FUNCTION {CLIENT_FUNCTIONS} TO {role}"
        ))
        .await
}

/// The advisory-lock seed derived from the store key: the same on every replica, unknown to
/// clients.
fn lock_seed(store_key: &str) -> i64 {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(format!("advisory-lock-seed:{store_key}"));
    let mut seed = [0_u8; 8];
    seed.copy_from_slice(&digest[..8]);
    i64::from_le_bytes(seed)
}

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
    store_key: &str,
    ttl: Duration,
) -> Result<i64, tokio_postgres::Error> {
    Ok(client
        .query_one(
            "SELECT _sqlhttp.purge($1, $2)",
            &[&store_key, &now_millis().saturating_sub(millis(ttl))],
        )
        .await?
        .get(0))
}

/// Runs keyed work exactly once inside the transaction the caller opened (with its statement
/// timeout set): replays a stored outcome for the same request, refuses a
/// different request with 422, or runs `work` and stores its 2xx / final 4xx outcome with its
/// effects. 5xx outcomes are not stored; the caller rolls back on `Err` and commits on `Ok`,
/// once it checked that the transaction is still its own: a recorded outcome commits only with
/// the transaction the caller opened, so a request that ended it stores nothing.
pub(crate) async fn run_with_key<F>(
    client: &ClientWrapper,
    store_key: &str,
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
    // Seeded with the store key, so a client cannot compute the lock of another's key (and
    // hold it to keep that key's requests out).
    // Every name schema-qualified, types too: the temp schema comes first for types, and a
    // client's function may have moved the search path (ADR 0023).
    // The store's statements are prepared once per connection (see `run::prepare`); a failure
    // of one empties the connection's cache, so a statement that went stale (another
    // replica's start replaced a function of the store) is prepared afresh next time.
    let map = |e| {
        client.statement_cache.clear();
        map(e)
    };
    let lock = client
        .prepare_cached(
            "SELECT pg_catalog.pg_try_advisory_xact_lock(\
             pg_catalog.hashtextextended($1::pg_catalog.text, $2::pg_catalog.int8))",
        )
        .await
        .map_err(map)?;
    let lookup = client
        .prepare_cached(
            "SELECT request_hash, status, body, created_at FROM _sqlhttp.lookup($1, $2)",
        )
        .await
        .map_err(map)?;
    let savepoint = format!("{SAVEPOINT_PREFIX}{:016x}", rand::random::<u64>());
    let open_savepoint = format!("SAVEPOINT {savepoint}");
    // The lock, the lookup and the work's savepoint go out in one write and run in that order:
    // the lookup reads what was committed once the lock was taken, and when the lock was not
    // taken (or the key replays) its answer and the savepoint are dropped with the transaction
    // the caller then ends.
    let seed = lock_seed(store_key);
    let lock_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&key, &seed];
    let lookup_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&store_key, &key];
    let (locked, stored, ()) = tokio::try_join!(
        client.query_one(&lock, &lock_params),
        client.query_opt(&lookup, &lookup_params),
        client.batch_execute(&open_savepoint),
    )
    .map_err(&map)?;
    let locked: bool = locked.get(0);
    if !locked {
        return Err(ApiError::new(
            ErrorCode::IdempotencyKeyInUse,
            "a request with this Idempotency-Key is still running; retry later",
        ));
    }
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

    // Deferred constraints and triggers are part of the work: their failure is its outcome,
    // stored and replayed like any other, not a failed COMMIT after the outcome was recorded.
    let settled = async {
        let body = work.await?;
        client
            .batch_execute("SET CONSTRAINTS ALL IMMEDIATE")
            .await
            .map_err(map)?;
        Ok::<_, ApiError>(body)
    };
    let (status, body) = match settled.await {
        Ok(body) => (200u16, body),
        Err(err) if err.code.is_stored_outcome() => {
            // Undo whatever part of the work ran (the statements of a batch before the one
            // that failed); the savepoint also ends the failed statement's aborted state.
            client
                .batch_execute(&format!("ROLLBACK TO SAVEPOINT {savepoint}"))
                .await
                .map_err(map)?;
            (err.code.status().as_u16(), err.body())
        }
        Err(err) => return Err(err),
    };
    let record = client
        .prepare_cached("SELECT _sqlhttp.record($1, $2, $3, $4, $5, $6)")
        .await
        .map_err(map)?;
    client
        .execute(
            &record,
            &[
                &store_key,
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
