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
//! lock, the lookup and the work's savepoint go out in one write (ADR 0034). What a stored
//! outcome means and what a run leaves to store are the shared rule's (`engine::keyed`).
//! [`with_key`] runs keyed work (a statement or a batch, [`Work`]) in a transaction of
//! its own, purging expired keys first when that is due. Knows SQL and the protocol's error
//! codes; nothing about HTTP.

use std::future::Future;
use std::time::Duration;

use tokio_postgres::Client;

use crate::engine::keyed::{self as rule, Decision, Stored, expired_before, now_millis};
use crate::engine::postgres::batch;
use crate::engine::postgres::in_transaction::{self, Open};
use crate::engine::postgres::lease::Lease;
use crate::engine::postgres::{Inner, Job, exec};
use crate::engine::stream::Sink;
use crate::engine::{Access, Keyed, Outcome};
use crate::protocol::batch::BatchRequest;
use crate::protocol::error::ApiError;
use crate::protocol::request::SqlRequest;

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

CREATE OR REPLACE FUNCTION _sqlhttp.claim(
    p_store_key text, p_key text, p_request_hash bytea, p_status integer, p_body bytea,
    p_created_at bigint
) RETURNS TABLE (request_hash bytea, status integer, body bytea, created_at bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    claimed text;
BEGIN
    PERFORM _sqlhttp.authorize(p_store_key);
    -- Only a claim that lost reads the row: a serializable COMMIT's claim that wins takes no
    -- read (predicate) locks on the store, so concurrent commits do not fail each other.
    INSERT INTO _sqlhttp.idempotency AS i (key, request_hash, status, body, created_at)
        VALUES (p_key, p_request_hash, p_status, p_body, p_created_at)
        ON CONFLICT (key) DO NOTHING
        RETURNING i.key INTO claimed;
    IF claimed IS NOT NULL THEN
        RETURN QUERY SELECT p_request_hash, p_status, p_body, p_created_at;
    ELSE
        RETURN QUERY SELECT i.request_hash, i.status, i.body, i.created_at
            FROM _sqlhttp.idempotency AS i WHERE i.key = p_key;
    END IF;
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
    _sqlhttp.record(text, text, bytea, integer, bytea, bigint),
    _sqlhttp.claim(text, text, bytea, integer, bytea, bigint), _sqlhttp.purge(text, bigint)
    FROM PUBLIC;";

/// The three functions the client role may call.
const CLIENT_FUNCTIONS: &str = "_sqlhttp.lookup(text, text), \
_sqlhttp.record(text, text, bytea, integer, bytea, bigint), \
_sqlhttp.claim(text, text, bytea, integer, bytea, bigint), _sqlhttp.purge(text, bigint)";

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

/// Stores the peer secret (`engine::keyed::PEER_SECRET_KEY`: 256 random bits, never expiring)
/// unless one is there: the first server to prepare the database draws it, every other keeps
/// it. Written by the owner, like the other secrets; read back through `lookup`.
pub(crate) async fn create_peer_secret(owner: &Client) -> Result<(), tokio_postgres::Error> {
    let secret: [u8; 32] = rand::random();
    owner
        .execute(
            "INSERT INTO _sqlhttp.idempotency (key, request_hash, status, body, created_at) \
             VALUES ($1, $2, 200, $3, $4) ON CONFLICT (key) DO NOTHING",
            &[
                &rule::PEER_SECRET_KEY,
                &&rule::peer_secret_hash()[..],
                &&secret[..],
                &rule::NEVER_EXPIRES,
            ],
        )
        .await
        .map(drop)
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

/// Deletes outcomes older than `ttl`; returns how many were deleted.
pub(crate) async fn purge_expired(
    client: &Client,
    store_key: &str,
    ttl: Duration,
) -> Result<i64, tokio_postgres::Error> {
    Ok(client
        .query_one(
            "SELECT _sqlhttp.purge($1, $2)",
            &[&store_key, &expired_before(ttl)],
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
async fn run_with_key<F>(
    lease: &Lease,
    store_key: &str,
    keyed: &Keyed,
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
    let (key, request_hash) = (keyed.key.as_str(), &keyed.request_hash[..]);
    // Every name schema-qualified, types too: the temp schema comes first for types, and a
    // client's function may have moved the search path (ADR 0023).
    // The store's statements are prepared once per connection (see `run::prepare`); a failure
    // of one empties the connection's cache, so a statement that went stale (another
    // replica's start replaced a function of the store) is prepared afresh next time.
    let client = lease.wrapper();
    let map = |e| {
        lease.forget_driver_statements();
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
        return Err(rule::in_use());
    }
    let stored = stored.map(|row| Stored {
        request_hash: row.get(0),
        status: u16::try_from(row.get::<_, i32>(1)).unwrap_or(500),
        body: row.get(2),
        created_at: row.get(3),
        position: None,
    });
    // An expired outcome is replaced by the new one's record (an upsert).
    if let Decision::Replay(outcome) = rule::decide(stored, request_hash, keyed.ttl)? {
        return Ok(outcome);
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
    let settled = match rule::settle(settled.await)? {
        settled @ rule::Settled::Succeeded(_) => settled,
        refused @ rule::Settled::Refused(..) => {
            // Undo whatever part of the work ran (the statements of a batch before the one
            // that failed); the savepoint also ends the failed statement's aborted state.
            client
                .batch_execute(&format!("ROLLBACK TO SAVEPOINT {savepoint}"))
                .await
                .map_err(map)?;
            refused
        }
    };
    let (status, body) = settled.into_parts();
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
        position: None,
    })
}

/// Keyed work in the transaction open on a lease (see [`with_key`]).
struct KeyedRun<'a> {
    inner: &'a Inner,
    keyed: &'a Keyed,
    work: Work<'a>,
}

impl in_transaction::Work for KeyedRun<'_> {
    type Output = Outcome;

    async fn run(&mut self, lease: &Lease) -> Result<Outcome, ApiError> {
        keyed_once(self.inner, lease, self.keyed, self.work).await
    }
}

/// Keyed work: one statement or a batch's statements.
#[derive(Debug, Clone, Copy)]
pub(super) enum Work<'a> {
    Statement(&'a SqlRequest),
    Batch(&'a BatchRequest),
}

/// Runs keyed work exactly once in a transaction of its own (run again, prepared afresh,
/// when a cached statement went stale: see `in_transaction::in_transaction`).
pub(super) async fn with_key(
    inner: &Inner,
    job: &Job,
    keyed: &Keyed,
    work: Work<'_>,
) -> Result<Outcome, ApiError> {
    purge_if_due(inner, job, keyed.ttl).await;
    let lease = inner.lease(job).await?;
    let (open, statements) = match work {
        Work::Statement(_) => (Open::Statement, 1),
        Work::Batch(batch) => (Open::Batch(batch.isolation), batch.statements.len()),
    };
    in_transaction::in_transaction(
        inner,
        job,
        lease,
        Access::ReadWrite,
        open,
        statements,
        KeyedRun { inner, keyed, work },
    )
    .await
}

/// One run of keyed work in the transaction open on `lease` (see [`with_key`]).
async fn keyed_once(
    inner: &Inner,
    lease: &Lease,
    keyed: &Keyed,
    work: Work<'_>,
) -> Result<Outcome, ApiError> {
    let map = |e| inner.map(&e);
    let run = async {
        match work {
            Work::Statement(request) => {
                let mut out = Vec::with_capacity(256);
                let mut sink = Sink::Buffered {
                    limit: inner.limits.max_result_bytes,
                };
                let limits = &inner.limits;
                exec::write_result(
                    lease,
                    request,
                    limits,
                    &mut out,
                    &mut sink,
                    &map,
                    exec::Around::default(),
                )
                .await?;
                Ok(out)
            }
            Work::Batch(batch) => batch::run_statements(inner, lease, &batch.statements).await,
        }
    };
    // Boxed: the keyed work's future is large.
    Box::pin(run_with_key(lease, &inner.store_key, keyed, run, &map)).await
}

/// Deletes expired idempotency keys, at most once a `PURGE_INTERVAL`.
async fn purge_if_due(inner: &Inner, job: &Job, ttl: Duration) {
    if !inner.purges.due() {
        return;
    }
    let Ok(lease) = inner.lease(job).await else {
        return;
    };
    // In a transaction of its own: a pooled session defaults to read-only (see
    // `session::RESET`); a session whose purge failed is not pooled again.
    let client = lease.client();
    let begin = format!(
        "BEGIN READ WRITE, ISOLATION LEVEL READ COMMITTED; SET LOCAL statement_timeout = {}",
        inner.timeout_ms()
    );
    let purged = async {
        client.batch_execute(&begin).await?;
        let purged = purge_expired(client, &inner.store_key, ttl).await?;
        client.batch_execute("COMMIT").await?;
        Ok::<_, tokio_postgres::Error>(purged)
    }
    .await;
    let mut lease = lease;
    match purged {
        Ok(purged) => {
            if purged > 0 {
                tracing::debug!(purged, "purged expired idempotency keys");
            }
            lease.clean = true;
        }
        Err(e) => tracing::warn!(error = %e, "cannot purge expired idempotency keys"),
    }
}
